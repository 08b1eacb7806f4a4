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

import copy
import dataclasses
import functools
import hashlib
import math
import operator
import os
import re
import weakref
from collections import OrderedDict
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
from pytensor.graph.basic import Constant, Variable
from pytensor.graph.replace import clone_replace
from pytensor.graph.traversal import ancestors, toposort
from pytensor.tensor.random.type import RandomGeneratorType

from dpppl.errors import InvalidDataError, ModelNotSupportedError
from dpppl.model.jax_compile import jaxify
from dpppl.model.locality import is_record_local
from dpppl.model.record_structure import (
    RecordStructure,
    find_records,
    finite_support,
    pymc_model,
    uncast,
    value_of,
)

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


@dataclass(frozen=True)
class RecordSpec:
    """The structure of one record array: its name, trailing shape and dtype (never its values)."""

    name: str
    trailing_shape: tuple[int, ...]
    dtype: str


class CompiledRecordModel:
    """The compiled, data-free part of a record model, shared by every model of one structure.

    It holds the JAX functions, the parameter layout, the record arrays' names, shapes and dtypes,
    and what mechanisms compiled from them (:meth:`cache`), and nothing of any data set: record
    arrays are function inputs.  :func:`record_model` looks it up by :func:`structure_key`, so a
    freshly built model of the same structure reuses every compilation of the ones before it.
    """

    def __init__(
        self,
        *,
        parameters: ParameterSpace,
        records: tuple[RecordSpec, ...],
        term_names: tuple[str, ...],
        constrained_names: tuple[str, ...],
        initial_theta: np.ndarray,
        record_parameters: np.ndarray,
        record_parameter_rank: int,
        terms_fn: Callable,
        logprior_fn: Callable,
        constrain_fn: Callable,
    ):
        self.parameters = parameters
        self.record_parameters = record_parameters
        self.record_parameter_rank = record_parameter_rank
        self.records = records
        self.term_names = term_names
        self.constrained_names = list(constrained_names)
        self.initial_theta = initial_theta
        self.terms_fn = terms_fn
        self.logprior_fn = logprior_fn
        self.constrain_fn = constrain_fn
        # Mechanisms may compile N into what they cache (batch shapes, step sizes), so their
        # artefacts are kept per N.
        self._caches: dict[int, dict[Hashable, Any]] = {}

    def cache(self, n_records: int) -> dict[Hashable, Any]:
        """The artefacts mechanisms compiled for data sets of ``n_records`` records."""
        return self._caches.setdefault(int(n_records), {})


def structure_key(
    inputs: list[Variable], outputs: list[Variable], metadata: Hashable
) -> Hashable:
    """A key that two graphs share exactly when they compute the same function of ``inputs``.

    Apply nodes are identified by their Op (PyTensor Ops compare by their properties) and their
    inputs' positions; constants and non-random shared variables by type and a digest of their
    values, which are public model structure (record arrays are among ``inputs``); random
    generators by type only, as the log-densities do not draw from them.  An Op that compares by
    identity makes the key unique to one model: a missed reuse, never a wrong one.
    """
    index: dict[Variable, int] = {v: i for i, v in enumerate(inputs)}
    items: list[Hashable] = [("input", v.type) for v in inputs]

    def ref(variable: Variable) -> int:
        if variable not in index:
            index[variable] = len(items)
            items.append(_leaf_key(variable))
        return index[variable]

    for node in toposort(outputs):
        refs = tuple(ref(v) for v in node.inputs)
        items.append((node.op, refs, tuple(o.type for o in node.outputs)))
        for position, output in enumerate(node.outputs):
            index[output] = len(items) - 1 if position == 0 else (len(items) - 1, position)
    return (tuple(items), tuple(index[v] for v in outputs), metadata)


def _leaf_key(variable: Variable) -> Hashable:
    if isinstance(variable, SharedVariable):
        if isinstance(variable.type, RandomGeneratorType):
            return ("rng", variable.type)
        return ("shared", variable.type, _digest(variable.get_value(borrow=True)))
    if isinstance(variable, Constant):
        return ("constant", variable.type, _digest(variable.data))
    # A free root the caller did not declare as an input: only this very variable matches.
    return ("root", id(variable))


def _digest(value: Any) -> str:
    array = np.asarray(value)
    if array.dtype == object:
        return f"object:{id(value)}"
    hashed = hashlib.blake2b(digest_size=16)
    hashed.update(f"{array.dtype.str}{array.shape}".encode())
    hashed.update(np.ascontiguousarray(array).tobytes())
    return hashed.hexdigest()


class _CompiledCache:
    """A bounded LRU of compiled record models, so that memory stays flat however many models a
    process builds: the least recently used structure is dropped with everything compiled for it."""

    def __init__(self, size: int):
        self.size = size
        self._entries: OrderedDict[Hashable, CompiledRecordModel] = OrderedDict()
        self.hits = 0
        self.misses = 0

    def get(self, key: Hashable, build: Callable[[], CompiledRecordModel]) -> CompiledRecordModel:
        if key in self._entries:
            self.hits += 1
            self._entries.move_to_end(key)
            return self._entries[key]
        self.misses += 1
        compiled = build()
        self._entries[key] = compiled
        while len(self._entries) > self.size:
            self._entries.popitem(last=False)
        return compiled

    def clear(self) -> None:
        self._entries.clear()

    def __len__(self) -> int:
        return len(self._entries)


#: Model structures whose compiled code a process keeps (``DPPPL_COMPILED_MODELS`` overrides).
COMPILED_MODELS = int(os.environ.get("DPPPL_COMPILED_MODELS", "16"))
_COMPILED = _CompiledCache(COMPILED_MODELS)


def compiled_models() -> _CompiledCache:
    """The process's cache of compiled model structures (``len()``, ``hits``, ``misses``,
    ``clear()``)."""
    return _COMPILED


class RecordModel:
    """A PyMC model compiled to JAX as a function of θ and a batch of records.

    Use :func:`record_model` to get one.  The compiled part (:attr:`compiled`) is shared by every
    model of the same structure, so fits of freshly built models, simulated data sets and TARP
    replicates reuse one compilation.  The model itself is held weakly: what mechanisms compile
    and cache may keep a ``RecordModel`` alive, and it must not keep a data set alive.

    Parameters
    ----------
    model
        The PyMC model.
    structure
        Its records, from :func:`dpppl.model.record_structure.find_records`.

    Attributes
    ----------
    compiled
        The shared, data-free compiled structure.
    parameters
        Layout of the unconstrained parameter vector θ.
    """

    def __init__(self, model: pm.Model, structure: RecordStructure):
        self._model = weakref.ref(model)
        # Holds the structure (and through it the data) only while the model lives.
        self._structures: weakref.WeakKeyDictionary[pm.Model, RecordStructure] = (
            weakref.WeakKeyDictionary({model: structure})
        )
        self._n_records = structure.n_records
        self._record_dim = structure.dim
        self._holds: pm.Model | None = None  # see record_model(hold_model=...)
        self._batch_inputs = {
            v.name: pt.tensor(
                name=f"{v.name}_batch", dtype=v.dtype, shape=(None, *v.trailing_shape)
            )
            for v in structure.variables
        }
        parameters = ParameterSpace.from_model(model)
        if parameters.size == 0:
            raise ModelNotSupportedError(
                "the model has no free parameter to infer; add a prior for what you want to learn"
            )
        constrained_names = tuple(self._constrained_names())
        terms = self._record_terms()
        record_parameters = _record_parameters(model, parameters, terms)
        logprior = model.logp(
            vars=model.free_RVs + list(structure.prior_potentials), jacobian=True
        )
        constrained = model.replace_rvs_by_values(
            [model[name] for name in constrained_names]
        )
        initial_theta = parameters.flatten(model.initial_point())
        inputs = model.value_vars + list(self._batch_inputs.values())
        records = tuple(
            RecordSpec(v.name, tuple(v.trailing_shape), v.dtype) for v in structure.variables
        )
        term_names = tuple(rv.name for rv in structure.observed) + tuple(
            p.name for p in structure.record_potentials
        )
        metadata = (
            parameters, records, term_names, constrained_names, _digest(initial_theta),
            structure.dim,
        )
        key = structure_key(inputs, [*terms, logprior, *constrained], metadata)

        def build() -> CompiledRecordModel:
            compiled = CompiledRecordModel(
                parameters=parameters,
                records=records,
                term_names=term_names,
                constrained_names=constrained_names,
                initial_theta=initial_theta,
                record_parameters=record_parameters,
                record_parameter_rank=_record_parameter_rank(
                    model, parameters, terms, list(self._batch_inputs.values()),
                    record_parameters, initial_theta,
                ),
                # One function per term, so that the probe can check each term's record axis.
                terms_fn=jaxify(inputs, terms),
                logprior_fn=jaxify(model.value_vars, [logprior]),
                constrain_fn=jaxify(model.value_vars, constrained),
            )
            _probe_record_axis(
                compiled, structure.n_records,
                frozenset(p.name for p in structure.record_potentials),
            )
            return compiled

        self.compiled = _COMPILED.get(key, build)

    # -- the model and its records, while the model lives ---------------------------------------

    @property
    def model(self) -> pm.Model:
        """The PyMC model."""
        model = self._model()
        if model is None:
            raise ReferenceError(
                "the PyMC model of this RecordModel no longer exists; call dpppl.record_model(model) "
                "on a live model"
            )
        return model

    @property
    def structure(self) -> RecordStructure:
        """The records found in the model (see :func:`dpppl.model.record_structure.find_records`)."""
        return self._structures[self.model]

    @structure.setter
    def structure(self, structure: RecordStructure) -> None:
        self._structures[self.model] = structure
        self._n_records = structure.n_records
        self._record_dim = structure.dim

    def with_n_records(self, n_records: int) -> RecordModel:
        """This model as mechanisms see a data set of ``n_records`` records: the same compiled
        structure, with the artefacts mechanisms cache for that N."""
        if n_records == self.n_records:
            return self
        view = copy.copy(self)
        view._structures = weakref.WeakKeyDictionary(
            {self.model: dataclasses.replace(self.structure, n_records=int(n_records))}
        )
        view._n_records = int(n_records)
        return view

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
            # Its other batch sizes are the model's, taken as numbers: symbolically they are read
            # off the observed array, which a simulated data set does not have yet.  The array
            # behind PyMC's cast has the same shape, and reading it compiles nothing.
            ndim_batch = rv.type.ndim - getattr(rv.owner.op, "ndim_supp", 0)
            trailing = np.shape(value_of(uncast(self.model.rvs_to_values[rv])))[1:ndim_batch]
            new_size = [batch_size, *trailing]
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

    # -- public properties ----------------------------------------------------------------------

    @property
    def parameters(self) -> ParameterSpace:
        """Layout of the unconstrained parameter vector θ."""
        return self.compiled.parameters

    @property
    def constrained_names(self) -> list[str]:
        """Free variables and the deterministics that read no data, as the posterior names them."""
        return self.compiled.constrained_names

    @property
    def n_records(self) -> int:
        """N, the number of records the model holds."""
        return self._n_records

    @property
    def record_dim(self) -> str | None:
        return self._record_dim

    @property
    def record_names(self) -> tuple[str, ...]:
        return tuple(r.name for r in self.compiled.records)

    @property
    def n_params(self) -> int:
        """Dimension of the unconstrained parameter vector θ."""
        return self.parameters.size

    @property
    def record_parameters(self) -> np.ndarray:
        """Which coordinates of θ the records' log-likelihood reads (bool, shape (n,)), by
        free variable: False for a variable that only the prior reads, such as the mean and
        scale of a centred hierarchy's group effects.  The records carry no information about
        such a coordinate beyond what they say about the others, so given those its posterior
        is its prior conditional, which a mechanism may draw exactly."""
        return self.compiled.record_parameters.copy()

    @property
    def record_parameter_rank(self) -> int:
        """The rank, in the record parameters (:attr:`record_parameters`), of the Jacobian of
        what the records' part of the graph reads of θ before the data enter (each record's
        mean and scale, say, or the group intercepts that its group index picks).

        Equal to ``record_parameters.sum()`` unless the likelihood reads the parameters through
        fewer functions of them, as a non-centred hierarchy does: its records read the group
        intercepts ``mu_a + tau * z`` and not ``mu_a``, ``tau`` and ``z`` apart, so whatever the
        data the likelihood is flat along the directions that leave the intercepts fixed.  It
        is an upper bound on what the records can tell apart: a combination formed with the
        data (``a[group] + b`` for a free ``b``) reads ``a`` and ``b`` apart here.  Computed from
        the model's structure at two points about its initial point, without the data.
        """
        return self.compiled.record_parameter_rank

    def initial_point(self) -> np.ndarray:
        """PyMC's initial point of the model, as a flat unconstrained θ."""
        return self.compiled.initial_theta.copy()

    def data(self) -> dict[str, np.ndarray]:
        """The record arrays the model holds (the private data set)."""
        return self.structure.data()

    def possible_records(self, limit: int) -> dict[str, np.ndarray] | None:
        """Every record the model allows, when the model alone makes them at most ``limit``.

        Public: the rows come from the supports of the likelihood (:func:`finite_support`: a
        Bernoulli or Categorical observation), never from the data.  They are arrays like
        :meth:`data`'s, one row per possible record; None when some record array is a covariate
        or an observation without such a support, or when there are more than ``limit`` rows.
        """
        observations = {value: rv for rv, value in self.model.rvs_to_values.items()}
        choices = []
        for variable in self.structure.variables:
            rv = observations.get(variable.variable)
            support = None if rv is None else finite_support(rv)
            if support is None:
                return None
            choices += [(variable, support)] * math.prod(variable.trailing_shape)
        if math.prod(len(support) for _, support in choices) > limit:
            return None
        grids = np.meshgrid(*(support for _, support in choices), indexing="ij")
        grid = np.stack([a.ravel() for a in grids])
        rows, start = {}, 0
        for variable in self.structure.variables:
            size = math.prod(variable.trailing_shape)
            block = grid[start : start + size].T.reshape(-1, *variable.trailing_shape)
            rows[variable.name] = block.astype(variable.dtype)
            start += size
        return rows

    def check_data(self, data: Mapping[str, Any]) -> dict[str, np.ndarray]:
        """Validate a data set for this model and return it as arrays.

        Raises
        ------
        InvalidDataError
            If a record array is missing, has the wrong trailing shape, a different number of
            records than the others, or values that are not finite.
        """
        expected = {r.name: r for r in self.compiled.records}
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
        terms = self.compiled.terms_fn(
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
        (out,) = self.compiled.logprior_fn(*self.parameters.unflatten(theta))
        return out

    def logp(self, theta: jax.Array, batch: Batch) -> jax.Array:
        """Unnormalised log posterior density of θ given a (full) data set."""
        return self.logprior(theta) + jnp.sum(self.loglik(theta, batch))

    def constrain(self, theta: jax.Array) -> dict[str, jax.Array]:
        """Named, constrained values of the free variables (and of deterministics that do not
        depend on the data) at θ."""
        values = self.compiled.constrain_fn(*self.parameters.unflatten(theta))
        return dict(zip(self.constrained_names, values, strict=True))

    # -- the mean-field Gaussian ELBO (NA-DPVI paper, eq. A57) ------------------------------------

    def variational_split(self, phi: jax.Array) -> tuple[jax.Array, jax.Array]:
        """Mean and standard deviation of q(θ; φ) for φ = (μ, u), variance softplus(u)."""
        n = self.n_params
        return phi[:n], _variational_sd(phi[n:])

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
        loglik = jax.vmap(self.loglik, in_axes=(0, None))(self._mc_draws(phi, eps), batch)
        return -jnp.mean(loglik, axis=0) + self.entropy_and_prior(phi, eps) / n_records

    def elbo_loss_grads(
        self, phi: jax.Array, batch: Batch, eps: jax.Array, n_records: int | jax.Array
    ) -> jax.Array:
        """Per-record gradients ∇_φ ℓ(φ; x_i) of :meth:`elbo_loss`, shape (B, 2n).

        From :data:`CHAIN_RULE_MIN_PARAMS` parameters on, by the chain rule through the draws
        θ_m = μ + sd(u) ⊙ ε_m, elementwise in φ = (μ, u): with the scores
        s_im = ∇_θ log p(x_i | θ_m) (:func:`per_example_grad`, so row i reads record i alone),
        ∇_μ ℓ_i = −1/M Σ_m s_im and ∇_u ℓ_i = −1/M Σ_m s_im ⊙ ε_m ⊙ sd'(u), plus the gradient
        of the part that reads no record, the same in every row.  That differentiates the
        log-likelihood along the n directions of θ instead of all M draws along the 2n
        directions of φ.  Below it, ``per_example_grad(elbo_loss)``.  The numbers are the same
        either way.
        """
        n = self.n_params
        if n < CHAIN_RULE_MIN_PARAMS:
            return per_example_grad(self.elbo_loss, n_args=2)(phi, batch, eps, n_records)
        scores = jax.vmap(per_example_grad(self.loglik), in_axes=(0, None))(
            self._mc_draws(phi, eps), batch
        ) / -eps.shape[0]
        slope = jax.grad(lambda u: jnp.sum(_variational_sd(u)))(phi[n:])  # elementwise: sd'(u)
        rows = jnp.concatenate(
            [jnp.sum(scores, axis=0), jnp.sum(scores * eps[:, None, :], axis=0) * slope], axis=1
        )
        return rows + jax.grad(self.entropy_and_prior)(phi, eps) / n_records

    def _mc_draws(self, phi: jax.Array, eps: jax.Array) -> jax.Array:
        """θ_m = μ + sd ⊙ ε_m for the rows ε_m of ``eps``, shape (M, n)."""
        mu, sd = self.variational_split(phi)
        return mu + sd * eps

    def entropy_and_prior(self, phi: jax.Array, eps: jax.Array) -> jax.Array:
        """1/M Σ_m [log q(θ_m; φ) − log p(θ_m)] over the draws θ_m = μ + sd ⊙ ε_m of the rows of
        ``eps`` (M, n): the part of the negative ELBO that reads no record, public given φ."""
        mu, sd = self.variational_split(phi)
        thetas = self._mc_draws(phi, eps)
        logq = jnp.sum(jax.scipy.stats.norm.logpdf(thetas, mu, sd), axis=-1)
        return jnp.mean(logq - jax.vmap(self.logprior)(thetas))

    def draw_variational(self, phi: jax.Array, key: jax.Array, draws: int) -> jax.Array:
        """``draws`` samples of θ from q(θ; φ), shape (draws, n)."""
        mu, sd = self.variational_split(phi)
        return mu + sd * jax.random.normal(key, (draws, self.n_params), dtype=mu.dtype)

    # -- helpers for mechanisms ------------------------------------------------------------------

    def cached(self, key: Hashable, factory: Callable[[], Any]) -> Any:
        """Return the object stored under ``key``, building it with ``factory`` the first time.

        Mechanisms keep their compiled (jitted) functions here.  The store belongs to the
        compiled structure and the number of records, so every model of the same structure and N
        reuses what the first one built, and it lives as long as the structure stays in the
        process's bounded cache (:func:`compiled_models`).  ``factory`` may close over this
        ``RecordModel``, which holds its model weakly; it must not close over data.
        """
        cache = self.compiled.cache(self.n_records)
        if key not in cache:
            cache[key] = factory()
        return cache[key]


def _record_parameters(
    model: pm.Model, parameters: ParameterSpace, terms: list[pt.TensorVariable]
) -> np.ndarray:
    """The coordinates of θ whose value variable the per-record terms' graph reads."""
    read = set(ancestors(terms))
    mask = np.zeros(parameters.size, dtype=bool)
    for block, rv in zip(parameters.blocks, model.free_RVs, strict=True):
        mask[block.start : block.stop] = model.rvs_to_values[rv] in read
    return mask


def _likelihood_inputs(
    terms: list[pt.TensorVariable], value_vars: list[Variable], batch: list[Variable]
) -> list[Variable]:
    """The variables of θ alone (no record among their ancestors) that the terms' graph feeds
    into a computation with the records: what the records' log-likelihood reads of θ."""
    nodes = list(toposort(terms))
    reads_records, reads_theta = set(batch), set(value_vars)
    for node in nodes:
        if any(i in reads_records for i in node.inputs):
            reads_records.update(node.outputs)
        if any(i in reads_theta for i in node.inputs):
            reads_theta.update(node.outputs)
    inputs: dict[Variable, None] = {}  # ordered, without repeats
    for node in nodes:
        if not any(o in reads_records for o in node.outputs):
            continue
        for i in node.inputs:
            # Integer inputs of θ alone are shapes, which have no direction to tell apart.
            if i in reads_theta and i not in reads_records and i.type.dtype.startswith("float"):
                inputs[i] = None
    return list(inputs)


def _record_parameter_rank(
    model: pm.Model,
    parameters: ParameterSpace,
    terms: list[pt.TensorVariable],
    batch: list[Variable],
    record_parameters: np.ndarray,
    initial_theta: np.ndarray,
) -> int:
    """The generic rank of ∂(what the records read of θ)/∂(record parameters): the largest rank
    at two points about the initial point (one point could sit where the Jacobian happens to
    lose rank, as at tau = 0).  Reads no data: the records are the graph's inputs, not values."""
    if not record_parameters.any():
        return 0
    reads = _likelihood_inputs(terms, model.value_vars, batch)
    if not reads:
        return 0
    read_fn = jaxify(model.value_vars, reads)

    def read(theta: jax.Array) -> jax.Array:
        return jnp.concatenate([jnp.ravel(v) for v in read_fn(*parameters.unflatten(theta))])

    rng = np.random.default_rng(0)
    ranks = []
    for _ in range(2):
        theta = initial_theta + rng.standard_normal(initial_theta.shape)
        jacobian = np.asarray(jax.jacfwd(read)(jnp.asarray(theta)))[:, record_parameters]
        if np.isfinite(jacobian).all():
            ranks.append(int(np.linalg.matrix_rank(jacobian)))
    # Where neither point gives a finite Jacobian, nothing is known: count every direction.
    return max(ranks, default=int(record_parameters.sum()))


def _probe_record_axis(
    compiled: CompiledRecordModel, n_records: int, potentials: frozenset[str] = frozenset()
) -> None:
    """Check on zero-filled batches that every log-likelihood term has exactly one entry per
    record.  Each term is checked before the terms are added: a length-1 aggregate (a potential
    over all records, say) broadcasts against the others and would pass as a sum.  The refusal
    names the likeliest cause: free variables with one entry per record, a tensor of the data's
    length that does not follow the batch (``pt.zeros((N, 1))``), or a potential (``potentials``,
    the names of the record-reading ones) that sums over records."""
    values = compiled.parameters.unflatten(jnp.asarray(compiled.initial_theta))
    names = compiled.term_names
    for size in (1, 3):
        batch = [jnp.zeros((size, *r.trailing_shape), dtype=r.dtype) for r in compiled.records]
        try:
            shapes = [t.shape for t in jax.eval_shape(compiled.terms_fn, *values, *batch)]
        except Exception as error:  # noqa: BLE001 - any failure means the same thing here
            shapes = [error] * len(names)
        wrong = [(n, s) for n, s in zip(names, shapes, strict=True) if s != (size,)]
        if wrong:
            name, shape = wrong[0]
            outcome = (
                f"failed ({type(shape).__name__}: {' '.join(str(shape).split())})"
                if isinstance(shape, Exception)
                else f"gave {shape!r} instead of shape ({size},)"
            )
            raise ModelNotSupportedError(
                "the model's log-likelihood does not factorise over records along the record "
                f"axis ({name!r} of a batch of {size} records {outcome})."
                + _record_axis_hint(compiled, n_records, name in potentials, str(shape))
            )


def _record_axis_hint(
    compiled: CompiledRecordModel, n_records: int, potential: bool, outcome: str
) -> str:
    """What to change in a model whose term gave ``outcome`` on a probe batch."""
    suspects = [
        b.name for b in compiled.parameters.blocks if b.shape and b.shape[0] == n_records
    ]
    if suspects:
        return (
            f" Free variable(s) {suspects} have one entry per record: dpppl supports only "
            "global parameters."
        )
    if re.search(rf"\b{n_records}\b", outcome):
        # A constant of N rows broadcasts against, or fails to concatenate with, a batch.
        return (
            f" Something in it keeps the data's length N = {n_records} whatever the batch: a "
            "tensor built from a constant or a NumPy array (pt.zeros((N, 1)), np.ones(N)) rather "
            "than from pm.Data.  Make it pm.Data, or build it from one (pt.zeros_like(X[:, :1]) "
            "for pm.Data X), so that it follows the records."
        )
    if potential:
        return (
            " A pm.Potential that reads the data needs one entry per record (leading dimension "
            "of length N)."
        )
    return (
        " Each observed variable needs one entry per record along its leading dimension, the "
        "one the pm.Data it reads has."
    )


#: Fewest model parameters for which :meth:`RecordModel.elbo_loss_grads` takes the chain rule
#: through the Monte Carlo draws.  Microseconds per replicate and DP-SGD step of NA-DPVI (665
#: batch slots, 10 draws, snapped release), chain rule against ``per_example_grad(elbo_loss)``:
#: 52 / 29 with 1 parameter (Beta–Bernoulli), 96 / 68 with 2, 114 / 159 with 4 (logistic
#: regressions), 174 / 481 with 12 (the 10-D linear regression).
CHAIN_RULE_MIN_PARAMS = 3

#: Largest number of parameters (leaves' total size) for which per-record gradients are taken in
#: forward mode over the whole batch.  Against ``vmap`` of reverse mode per record, at a batch
#: of 600 records and 10 Monte Carlo draws of the NA-DPVI ELBO: 8× faster with 2 parameters
#: (Beta–Bernoulli), 15× with 6 and 1.5× with 24 (linear regressions); 0.55× with 64.
FORWARD_MODE_MAX_PARAMS = 32


def per_example_grad(fn: Callable[..., jax.Array], n_args: int = 0) -> Callable[..., jax.Array]:
    """Per-record gradients of a per-record term.

    ``fn(params, batch, *args)`` must return one value per record, shape (B,).  The returned
    function ``g(params, batch, *args)`` gives d fn_i / d params for every record i, with a leading
    batch axis on every leaf of ``params``.  ``n_args`` is the number of extra arguments, which
    are shared by all records.

    Row i must depend on record i alone, or clipping would not bound a record's influence.
    ``vmap`` of the gradient of one record at a time guarantees that by construction.  With few
    parameters (at most :data:`FORWARD_MODE_MAX_PARAMS`), forward mode over the whole batch is
    several times faster; it is used only when :func:`dpppl.model.locality.is_record_local`
    proves, on the jaxpr of that exact computation, that no row reads another record.  The choice
    is made when ``g`` is traced, for the shapes it is traced at.
    """

    def single(params, record, *args):
        return fn(params, {k: jnp.expand_dims(v, 0) for k, v in record.items()}, *args)[0]

    by_record = jax.vmap(jax.grad(single), in_axes=(None, 0, *([None] * n_args)))
    by_batch = jax.jacfwd(fn)

    def grads(params, batch, *args):
        size = sum(math.prod(jnp.shape(leaf)) for leaf in jax.tree.leaves(params))
        if size <= FORWARD_MODE_MAX_PARAMS:
            shapes = jax.tree.map(
                lambda x: jax.ShapeDtypeStruct(jnp.shape(x), jnp.result_type(x)),
                (params, batch, *args),
            )
            if is_record_local(by_batch, shapes, [False, True, *([False] * n_args)]):
                return by_batch(params, batch, *args)
        return by_record(params, batch, *args)

    return grads


def _variational_sd(u: jax.Array) -> jax.Array:
    """The standard deviation sqrt(softplus(u)) of q(θ; μ, u), elementwise."""
    return jnp.sqrt(jax.nn.softplus(u))


_MODELS: weakref.WeakKeyDictionary[pm.Model, dict] = weakref.WeakKeyDictionary()


def _model_signature(model: pm.Model, structure: RecordStructure) -> tuple:
    """What tells a model's compilation apart from the one before it: its variables, and the values
    of its non-record shared data, which are compiled in as constants (``pm.set_data`` on them
    changes the function; on the records it does not)."""
    records = {v.variable for v in structure.variables}
    shared = tuple(
        (v.name, _digest(v.get_value(borrow=True)))
        for v in model.data_vars
        if isinstance(v, SharedVariable) and v not in records
    )
    return tuple(model.named_vars), tuple(model.rvs_to_values), shared


def record_model(
    model: pm.Model | None = None, records: str | None = None, *, hold_model: bool = True
) -> RecordModel:
    """The compiled :class:`RecordModel` of ``model`` (or of the model in the ``with`` context, or
    of a ``bambi.Model``: see :func:`dpppl.model.record_structure.pymc_model`).

    The compilation is looked up by the model's structure (its graph, with the record arrays as
    inputs, and N), so a freshly built model of the same structure as one before it compiles
    nothing; a bounded number of structures is kept (:func:`compiled_models`).

    Parameters
    ----------
    model
        The PyMC model; the one in the ``with`` context when None.
    records
        Name of the record dimension; found from the observed variables when None.
    hold_model
        Keep ``model`` alive for as long as the returned object lives (the default, so that
        ``record_model(build())`` can be used on its own).  dpppl's own fits pass False: what a
        mechanism caches is shared by every model of the structure and may keep the
        ``RecordModel`` it was given, which must then not keep a data set alive.
    """
    model = pymc_model(model)
    # Checked on every call: pm.set_data may have changed the data (and N) since the last one.
    structure = find_records(model, records)
    entry = _MODELS.setdefault(model, {})
    signature = (_model_signature(model, structure), records, structure.n_records)
    if signature not in entry:
        entry.clear()
        entry[signature] = RecordModel(model, structure)
    bound = entry[signature]
    bound.structure = structure
    if not hold_model:
        return bound
    holding = copy.copy(bound)
    holding._holds = model
    return holding
