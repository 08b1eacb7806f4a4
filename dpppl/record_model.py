"""A compiled view of a PyMC model as N exchangeable records.

:class:`RecordModel` is what every mechanism works with.  It is built once per model and holds pure
JAX functions of an unconstrained parameter vector θ and a *batch* of records (a dict of arrays
with a leading record axis).  The record arrays are function inputs, never compiled-in constants,
so one compilation serves every fit, every batch and every simulated data set of the same shapes.

The functions come from the model's own PyTensor graph: the per-record log-likelihood is PyMC's
elementwise ``logp`` of the observed variables (plus per-record potentials); the log prior is
PyMC's ``logp`` of the free variables in the unconstrained space, transform Jacobians included.
"""

from __future__ import annotations

import functools
import operator
import weakref
from collections.abc import Callable, Hashable, Mapping
from dataclasses import dataclass
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
import pymc as pm
import pytensor.tensor as pt
from pymc.distributions.shape_utils import change_dist_size
from pymc.logprob.basic import transformed_conditional_logp
from pytensor.compile.sharedvalue import SharedVariable
from pytensor.graph.basic import Constant
from pytensor.graph.replace import clone_replace
from pytensor.graph.traversal import ancestors

from dpppl.errors import InvalidDataError, ModelNotSupportedError
from dpppl.jax_compile import jaxify
from dpppl.records import RecordStructure, find_records

Batch = Mapping[str, jax.Array]


@dataclass(frozen=True)
class ParameterBlock:
    """Where one free variable lives in the flat unconstrained vector θ."""

    name: str
    value_name: str
    shape: tuple[int, ...]
    start: int
    stop: int
    transform: str | None
    #: Coordinate values along each axis, when the model's dims label this value variable (a
    #: transform that changes the shape, like a simplex's, leaves it unlabelled).
    coords: tuple[tuple, ...] | None = None

    @property
    def size(self) -> int:
        return self.stop - self.start


@dataclass(frozen=True)
class ParameterSpace:
    """The flat unconstrained parameter vector θ and its blocks, in ``model.value_vars`` order."""

    blocks: tuple[ParameterBlock, ...]

    @property
    def size(self) -> int:
        return self.blocks[-1].stop if self.blocks else 0

    @classmethod
    def from_model(cls, model: pm.Model) -> ParameterSpace:
        point = model.initial_point()
        blocks, start = [], 0
        for rv in model.free_RVs:
            value = model.rvs_to_values[rv]
            shape = tuple(np.shape(point[value.name]))
            size = int(np.prod(shape, dtype=int))
            transform = model.rvs_to_transforms.get(rv)
            blocks.append(
                ParameterBlock(
                    name=rv.name,
                    value_name=value.name,
                    shape=shape,
                    start=start,
                    stop=start + size,
                    transform=type(transform).__name__ if transform is not None else None,
                    coords=_block_coords(model, rv.name, shape),
                )
            )
            start += size
        return cls(tuple(blocks))

    def unflatten(self, theta: jax.Array) -> list[jax.Array]:
        """Split θ into one array per value variable, shaped like the model's."""
        return [theta[b.start : b.stop].reshape(b.shape) for b in self.blocks]

    def flatten(self, values: Mapping[str, Any]) -> np.ndarray:
        """Concatenate unconstrained values, keyed by value-variable name, into θ."""
        parts = [np.asarray(values[b.value_name], dtype=float).reshape(-1) for b in self.blocks]
        return np.concatenate(parts) if parts else np.zeros(0)

    def labels(self) -> list[str]:
        """One readable label per coordinate of θ, e.g. ``sigma_log__``, ``w[age]`` (from the
        model's coords) or ``probs_simplex__[1]``."""
        labels = []
        for block in self.blocks:
            if block.shape == ():
                labels.append(block.value_name)
            else:
                axes = block.coords or tuple(range(n) for n in block.shape)
                for index in np.ndindex(block.shape):
                    names = (str(axis[i]) for axis, i in zip(axes, index, strict=True))
                    labels.append(f"{block.value_name}[{','.join(names)}]")
        return labels


def _block_coords(model: pm.Model, name: str, shape: tuple[int, ...]) -> tuple[tuple, ...] | None:
    dims = model.named_vars_to_dims.get(name)
    if not dims or len(dims) != len(shape):
        return None
    axes = tuple(tuple(model.coords.get(dim) or ()) for dim in dims)
    if any(len(axis) != n for axis, n in zip(axes, shape, strict=True)):
        return None
    return axes


def softplus_inverse(x: np.ndarray | float) -> np.ndarray:
    """The u with softplus(u) = x, for x > 0."""
    x = np.asarray(x, dtype=float)
    return x + np.log(-np.expm1(-x))


class RecordModel:
    """A PyMC model compiled to JAX as a function of θ and a batch of records.

    Use :func:`record_model` to get one: it is cached per model, so repeated fits, simulated data
    sets and TARP replicates reuse one compilation.

    Parameters
    ----------
    model
        The PyMC model.
    structure
        Its records, from :func:`dpppl.records.find_records`.

    Attributes
    ----------
    model
        The PyMC model.
    structure
        The records found in it (see :func:`dpppl.records.find_records`).
    parameters
        Layout of the unconstrained parameter vector θ.
    """

    def __init__(self, model: pm.Model, structure: RecordStructure):
        self.model = model
        self.structure = structure
        self.parameters = ParameterSpace.from_model(model)
        if self.parameters.size == 0:
            raise ModelNotSupportedError(
                "the model has no free parameter to infer; add a prior for what you want to learn"
            )
        self._cache: dict[Hashable, Any] = {}
        self._batch_inputs = {
            v.name: pt.tensor(
                name=f"{v.name}_batch", dtype=v.dtype, shape=(None, *v.trailing_shape)
            )
            for v in self.structure.variables
        }
        # One function per term, so that the probe can check each term's record axis.
        self._terms_fn = jaxify(
            self.model.value_vars + list(self._batch_inputs.values()), self._record_terms()
        )
        self._logprior_fn = jaxify(
            self.model.value_vars,
            [
                self.model.logp(
                    vars=self.model.free_RVs + list(self.structure.prior_potentials),
                    jacobian=True,
                )
            ],
        )
        self.constrained_names = self._constrained_names()
        self._constrain_fn = jaxify(
            self.model.value_vars,
            self.model.replace_rvs_by_values(
                [self.model[name] for name in self.constrained_names]
            ),
        )
        self._probe_record_axis()

    # -- construction -------------------------------------------------------------------------

    def batch_replacements(self, batch_size: pt.TensorVariable) -> dict:
        """Graph replacements that stand the symbolic batch inputs in for the model's record
        arrays and ``batch_size`` for the length of its record dimension.

        Apply them with ``clone_replace(..., rebuild_strict=False)``: numpy-backed arrays have N
        in their static shape, and only a rebuild lets a batch of another length through.
        """
        replacements = {
            v.variable: self._batch_inputs[v.name] for v in self.structure.variables
        }
        if self.structure.dim_length is not None:
            replacements[self.structure.dim_length] = batch_size.astype(
                self.structure.dim_length.dtype
            )
        return replacements

    def resized_observed(self, batch_size: pt.TensorVariable) -> list[pt.TensorVariable]:
        """The observed random variables with ``batch_size`` records instead of N, in
        ``structure.observed`` order (same distributions, parameters and random generators)."""
        resized = []
        for rv in self.structure.observed:
            # The observed variable's size is N (from the data or the dims); give it the batch's.
            ndim_batch = rv.type.ndim - getattr(rv.owner.op, "ndim_supp", 0)
            new_size = [batch_size] + [rv.shape[i] for i in range(1, ndim_batch)]
            resized.append(change_dist_size(rv, new_size=new_size, expand=False))
        return resized

    def _record_terms(self) -> list[pt.TensorVariable]:
        """Each observed variable's and record potential's log-density of a batch, summed over
        everything but the record axis: one entry per record when the model factorises."""
        model = self.model
        batch_size = next(iter(self._batch_inputs.values())).shape[0]
        replacements = self.batch_replacements(batch_size)
        rvs_to_values = {rv: model.rvs_to_values[rv] for rv in model.free_RVs}
        rvs_to_transforms = {rv: model.rvs_to_transforms.get(rv) for rv in model.free_RVs}
        resized = self.resized_observed(batch_size)
        for rv, new_rv in zip(self.structure.observed, resized, strict=True):
            rvs_to_values[new_rv] = clone_replace(
                model.rvs_to_values[rv], replacements, rebuild_strict=False
            )
            rvs_to_transforms[new_rv] = None
        terms = transformed_conditional_logp(
            rvs=resized, rvs_to_values=rvs_to_values, rvs_to_transforms=rvs_to_transforms
        )
        terms += model.replace_rvs_by_values(list(self.structure.record_potentials))
        per_record = [
            term.sum(axis=tuple(range(1, term.type.ndim))) if term.type.ndim > 1 else term
            for term in terms
        ]
        # Rebuilding (not type-checked replacing) lets numpy-backed arrays, whose static shape says
        # N, take the batch's unknown length.
        return clone_replace(per_record, replacements, rebuild_strict=False)

    def _constrained_names(self) -> list[str]:
        names = [rv.name for rv in self.model.free_RVs]
        for det in self.model.deterministics:
            # A deterministic that reads the data is per-record (or an aggregate of records): it is
            # private and stays out of the posterior.  Numpy arrays are compiled in as separate
            # constants at every use, so any array of length N counts as data here.
            if not self._reads_data(det):
                names.append(det.name)
        return names

    def _reads_data(self, variable) -> bool:
        roots = {v.variable for v in self.structure.variables}
        if self.structure.dim_length is not None:
            roots.add(self.structure.dim_length)
        dims = self.model.named_vars_to_dims.get(variable.name) or ()
        if self.record_dim is not None and self.record_dim in dims:
            return True
        for node in ancestors([variable], blockers=self.model.free_RVs):
            if node in roots:
                return True
            if isinstance(node, (Constant, SharedVariable)) and getattr(node.type, "ndim", 0) > 0:
                value = node.get_value(borrow=True) if isinstance(node, SharedVariable) else node.data
                if np.shape(value)[0] == self.n_records:
                    return True
        return False

    def _probe_record_axis(self) -> None:
        """Check on zero-filled batches that every log-likelihood term has exactly one entry per
        record.  Each term is checked before the terms are added: a length-1 aggregate (a
        potential over all records, say) broadcasts against the others and would pass as a sum."""
        names = [rv.name for rv in self.structure.observed] + [
            p.name for p in self.structure.record_potentials
        ]
        values = self.parameters.unflatten(jnp.asarray(self.initial_point()))
        for size in (1, 3):
            batch = [
                jnp.zeros((size, *v.trailing_shape), dtype=v.dtype)
                for v in self.structure.variables
            ]
            try:
                shapes = [t.shape for t in jax.eval_shape(self._terms_fn, *values, *batch)]
            except Exception as error:  # noqa: BLE001 - any failure means the same thing here
                shapes = [error] * len(names)
            wrong = [(n, s) for n, s in zip(names, shapes, strict=True) if s != (size,)]
            if wrong:
                name, shape = wrong[0]
                suspects = [
                    b.name
                    for b in self.parameters.blocks
                    if b.shape and b.shape[0] == self.n_records
                ]
                hint = (
                    f" Free variable(s) {suspects} have one entry per record: dpppl supports only "
                    "global parameters."
                    if suspects
                    else ""
                )
                raise ModelNotSupportedError(
                    "the model's log-likelihood does not factorise over records along the record "
                    f"axis ({name!r} of a batch of {size} records gave {shape!r} instead of shape "
                    f"({size},)).{hint} A pm.Potential that reads the data needs one entry per "
                    "record (leading dimension of length N)"
                )

    # -- public properties ----------------------------------------------------------------------

    @property
    def n_records(self) -> int:
        """N, the number of records the model holds."""
        return self.structure.n_records

    @property
    def record_dim(self) -> str | None:
        return self.structure.dim

    @property
    def record_names(self) -> tuple[str, ...]:
        return self.structure.names

    @property
    def n_params(self) -> int:
        """Dimension of the unconstrained parameter vector θ."""
        return self.parameters.size

    def initial_point(self) -> np.ndarray:
        """PyMC's initial point of the model, as a flat unconstrained θ."""
        return self.parameters.flatten(self.model.initial_point())

    def data(self) -> dict[str, np.ndarray]:
        """The record arrays the model holds (the private data set)."""
        return self.structure.data()

    def check_data(self, data: Mapping[str, Any]) -> dict[str, np.ndarray]:
        """Validate a data set for this model and return it as arrays.

        Raises
        ------
        InvalidDataError
            If a record array is missing, has the wrong trailing shape, a different number of
            records than the others, or values that are not finite.
        """
        expected = {v.name: v for v in self.structure.variables}
        unknown = sorted(set(data) - set(expected))
        missing = sorted(set(expected) - set(data))
        if unknown or missing:
            raise InvalidDataError(
                f"record data must have exactly the arrays {sorted(expected)}; "
                f"missing {missing}, unexpected {unknown}"
            )
        arrays, lengths = {}, set()
        for name, spec in expected.items():
            array = np.asarray(data[name])
            if array.ndim == 0 or array.shape[1:] != spec.trailing_shape:
                expected_shape = ("N", *spec.trailing_shape)
                raise InvalidDataError(
                    f"record data {name!r} must have shape ({', '.join(map(str, expected_shape))}), "
                    f"got shape {array.shape}"
                )
            if array.dtype.kind not in "biuf":
                raise InvalidDataError(f"record data {name!r} must be numeric, got {array.dtype}")
            if array.dtype.kind == "f" and not np.all(np.isfinite(array)):
                raise InvalidDataError(
                    f"record data {name!r} contain NaN or infinite values; remove or impute the "
                    "affected records before fitting"
                )
            arrays[name] = array.astype(spec.dtype, copy=False)
            lengths.add(array.shape[0])
        if len(lengths) != 1:
            raise InvalidDataError(
                f"record arrays disagree on the number of records: {sorted(lengths)}"
            )
        if lengths.pop() == 0:
            raise InvalidDataError("the data set has no records")
        return arrays

    # -- pure JAX functions -----------------------------------------------------------------------

    def loglik(self, theta: jax.Array, batch: Batch) -> jax.Array:
        """Per-record log-likelihood log p(x_i | θ), shape (B,), for a batch of B records."""
        terms = self._terms_fn(
            *self.parameters.unflatten(theta), *(batch[name] for name in self.record_names)
        )
        return functools.reduce(operator.add, terms)

    def record_loglik(self, theta: jax.Array, record: Batch) -> jax.Array:
        """log p(x | θ) of one record given without its leading axis (e.g. inside a tilted
        distribution)."""
        return self.loglik(theta, {k: jnp.expand_dims(v, 0) for k, v in record.items()})[0]

    def weighted_loglik(self, theta: jax.Array, batch: Batch, weights: jax.Array) -> jax.Array:
        """Σ_i w_i log p(x_i | θ) over a batch: the log pseudo-likelihood with record weights."""
        return jnp.sum(weights * self.loglik(theta, batch))

    def logprior(self, theta: jax.Array) -> jax.Array:
        """log p(θ) in the unconstrained space, including the log-Jacobian of PyMC's transforms
        and the potentials that do not depend on the data."""
        (out,) = self._logprior_fn(*self.parameters.unflatten(theta))
        return out

    def logp(self, theta: jax.Array, batch: Batch) -> jax.Array:
        """Unnormalised log posterior density of θ given a (full) data set."""
        return self.logprior(theta) + jnp.sum(self.loglik(theta, batch))

    def constrain(self, theta: jax.Array) -> dict[str, jax.Array]:
        """Named, constrained values of the free variables (and of deterministics that do not
        depend on the data) at θ."""
        values = self._constrain_fn(*self.parameters.unflatten(theta))
        return dict(zip(self.constrained_names, values, strict=True))

    # -- the mean-field Gaussian ELBO (NA-DPVI paper, eq. A57) ------------------------------------

    def variational_split(self, phi: jax.Array) -> tuple[jax.Array, jax.Array]:
        """Mean and standard deviation of q(θ; φ) for φ = (μ, u), variance softplus(u)."""
        n = self.n_params
        return phi[:n], jnp.sqrt(jax.nn.softplus(phi[n:]))

    def elbo_loss(
        self, phi: jax.Array, batch: Batch, eps: jax.Array, n_records: int | jax.Array
    ) -> jax.Array:
        """Per-record negative-ELBO term ℓ(φ; x_i), shape (B,).

        ``eps`` has shape (M, n): the standard-normal draws of the M Monte Carlo samples
        θ_m = μ + sqrt(softplus(u)) ⊙ ε_m, shared by every record of the batch.  Summed over all N
        records, the terms give minus the usual ELBO estimate::

            ℓ(φ; x_i) = -1/M Σ_m log p(x_i | θ_m)
                        + 1/(M N) Σ_m [log q(θ_m; φ) - log p(θ_m) - log |J(θ_m)|]

        (the paper's eq. A57 writes the Jacobian term without its logarithm; it is the log).
        """
        mu, sd = self.variational_split(phi)
        thetas = mu + sd * eps
        loglik = jax.vmap(self.loglik, in_axes=(0, None))(thetas, batch)  # (M, B)
        logprior = jax.vmap(self.logprior)(thetas)
        logq = jnp.sum(jax.scipy.stats.norm.logpdf(thetas, mu, sd), axis=-1)
        return -jnp.mean(loglik, axis=0) + jnp.mean(logq - logprior) / n_records

    def draw_variational(self, phi: jax.Array, key: jax.Array, draws: int) -> jax.Array:
        """``draws`` samples of θ from q(θ; φ), shape (draws, n)."""
        mu, sd = self.variational_split(phi)
        return mu + sd * jax.random.normal(key, (draws, self.n_params), dtype=mu.dtype)

    # -- helpers for mechanisms ------------------------------------------------------------------

    def cached(self, key: Hashable, factory: Callable[[], Any]) -> Any:
        """Return the object stored under ``key``, building it with ``factory`` the first time.

        Mechanisms keep their compiled (jitted) functions here, so they live exactly as long as
        the model and are reused by every fit of it.
        """
        if key not in self._cache:
            self._cache[key] = factory()
        return self._cache[key]


def per_example_grad(fn: Callable[..., jax.Array], n_args: int = 0) -> Callable[..., jax.Array]:
    """Per-record gradients of a per-record term, by ``vmap`` over records.

    ``fn(params, batch, *args)`` must return one value per record, shape (B,).  The returned
    function ``g(params, batch, *args)`` gives d fn_i / d params for every record i, with a leading
    batch axis on every leaf of ``params``.  ``n_args`` is the number of extra arguments, which
    are shared by all records.
    """

    def single(params, record, *args):
        return fn(params, {k: jnp.expand_dims(v, 0) for k, v in record.items()}, *args)[0]

    return jax.vmap(jax.grad(single), in_axes=(None, 0, *([None] * n_args)))


_MODELS: weakref.WeakKeyDictionary[pm.Model, dict] = weakref.WeakKeyDictionary()


def _model_signature(model: pm.Model) -> tuple:
    return tuple(model.named_vars), tuple(model.rvs_to_values)


def record_model(model: pm.Model | None = None, records: str | None = None) -> RecordModel:
    """The compiled :class:`RecordModel` of ``model`` (or of the model in the ``with`` context).

    Compiled once per model and record dimension and cached for as long as the model lives; a
    model to which variables were added since is compiled again.
    """
    model = pm.modelcontext(model)
    # Checked on every call: pm.set_data may have changed the data (and N) since the last one.
    structure = find_records(model, records)
    entry = _MODELS.setdefault(model, {})
    signature = (_model_signature(model), records)
    if signature not in entry:
        entry.clear()
        entry[signature] = RecordModel(model, structure)
    cached = entry[signature]
    cached.structure = structure
    return cached
