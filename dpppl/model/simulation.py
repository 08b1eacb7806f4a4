"""Simulating from a PyMC model: parameters from its prior, record data given parameters.

A :class:`Simulator` is built once per :class:`~dpppl.model.record_model.RecordModel` (use
:func:`simulator`, which caches it on the model) and compiles two PyTensor functions with
``pm.compile``, which threads the random generators' updates:

* a prior draw: the free variables, constrained, and the flat unconstrained vector θ that PyMC's
  own transforms give them;
* a data set given θ: the observed variables, resized to any number of records and fed
  covariates of that length, so the same compiled function serves every simulated data set.

Every draw takes a ``numpy.random.SeedSequence``, so a simulation study is reproducible whatever
the order in which its replicates run.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import NamedTuple

import numpy as np
import pymc as pm
import pytensor.tensor as pt
from numpy.typing import ArrayLike
from pymc.pytensorf import reseed_rngs
from pytensor.compile.sharedvalue import SharedVariable
from pytensor.graph.basic import Variable
from pytensor.graph.replace import clone_replace
from pytensor.graph.traversal import ancestors, graph_inputs
from pytensor.tensor.random.type import RandomGeneratorType

from dpppl.errors import InvalidDataError, ModelNotSupportedError
from dpppl.model.record_model import RecordModel
from dpppl.model.record_structure import uncast

_CACHE_KEY = "dpppl.model.simulation.Simulator"


@dataclass(frozen=True)
class PriorDraw:
    """One draw of the parameters from the model's prior.

    Attributes
    ----------
    theta
        The flat unconstrained vector θ (layout of ``RecordModel.parameters``).
    values
        The free variables, constrained, by name.
    """

    theta: np.ndarray
    values: dict[str, np.ndarray]


class Simulator:
    """Draws parameters from a model's prior and record data sets from its likelihood.

    Get one with :func:`simulator`; the constructor compiles.

    Parameters
    ----------
    model
        The compiled record model.

    Attributes
    ----------
    covariate_names
        The record arrays the likelihood reads as inputs (``pm.Data`` or numpy covariates): a
        simulated data set needs them from the user.
    observed_names
        The record arrays that hold observations: these are simulated.

    Raises
    ------
    ModelNotSupportedError
        If the model has a ``pm.Potential`` (it changes the density without a way to sample from
        it) or an observed value that is an expression of data other than a type cast.
    """

    def __init__(self, model: RecordModel):
        self.model = model
        pm_model = model.model
        potentials = [p.name for p in pm_model.potentials]
        if potentials:
            raise ModelNotSupportedError(
                f"the model has pm.Potential term(s) {potentials}; dpppl cannot draw from a prior "
                "or likelihood changed by a potential, so it cannot simulate from this model. "
                "Write the term as a distribution to simulate from it"
            )
        self._observed_targets = [self._record_array_of(rv) for rv in model.structure.observed]
        self.observed_names = tuple(v.name for v in self._observed_targets)

        n_records = pt.scalar("n_records", dtype="int64")
        replacements = model.batch_replacements(n_records)
        forward = clone_replace(
            pm_model.replace_rvs_by_values(model.resized_observed(n_records)),
            replacements,
            rebuild_strict=False,
        )
        inputs = set(graph_inputs(forward))
        covariates = [
            v
            for v in model.structure.variables
            if replacements[v.variable] in inputs and v.name not in self.observed_names
        ]
        self.covariate_names = tuple(v.name for v in covariates)
        self._data_fn = pm.compile(
            [*pm_model.value_vars, *(replacements[v.variable] for v in covariates), n_records],
            forward,
            on_unused_input="ignore",
        )

        prior = [*pm_model.free_RVs, *(_unconstrained(pm_model, rv) for rv in pm_model.free_RVs)]
        self._prior_fn = pm.compile([], prior)
        # The simulator is shared by every model of this structure (it is cached on the compiled
        # structure), so it keeps names, not the model.
        self._free_names = tuple(rv.name for rv in pm_model.free_RVs)
        self._data_rngs = _random_generators(forward)
        self._prior_rngs = _random_generators(prior)

    def _record_array_of(self, rv: Variable):
        """The record array that holds the observations of ``rv``."""
        # PyMC casts a float pm.Data observed by an integer distribution; the cast is the one
        # expression of data a simulated value can be written back through.
        value = uncast(self.model.model.rvs_to_values[rv])
        if value.owner is not None:
            raise ModelNotSupportedError(
                f"the observed values of {rv.name!r} are an expression of data; dpppl can "
                "simulate only observations held as they are in pm.Data or a numpy array"
            )
        for variable in self.model.structure.variables:
            if variable.variable is value:
                return variable
        raise ModelNotSupportedError(  # pragma: no cover - find_records lists every observed array
            f"no record array holds the observations of {rv.name!r}"
        )

    def prior(self, seed: np.random.SeedSequence) -> PriorDraw:
        """Draw the parameters from the model's prior.

        Parameters
        ----------
        seed
            Entropy of the draw.

        Returns
        -------
        PriorDraw
            θ (unconstrained, flat) and the constrained values of the free variables.
        """
        reseed_rngs(self._prior_rngs, seed.generate_state(4))
        outputs = self._prior_fn()
        n_free = len(self._free_names)
        values = dict(
            zip(self._free_names, (np.asarray(v) for v in outputs[:n_free]), strict=True)
        )
        unconstrained = {
            block.value_name: value
            for block, value in zip(self.model.parameters.blocks, outputs[n_free:], strict=True)
        }
        return PriorDraw(theta=self.model.parameters.flatten(unconstrained), values=values)

    def data(
        self,
        theta: ArrayLike,
        seed: np.random.SeedSequence,
        *,
        covariates: Mapping[str, ArrayLike] | None = None,
        n_records: int | None = None,
    ) -> dict[str, np.ndarray]:
        """Simulate a record data set from the likelihood at θ.

        Parameters
        ----------
        theta
            The flat unconstrained parameter vector.
        seed
            Entropy of the draw.
        covariates
            One array per name in :attr:`covariate_names`, all of the same length N; required
            exactly when the model has covariates.
        n_records
            N, for a model without covariates (with covariates it is their length, and a value
            given here must agree).

        Returns
        -------
        dict of numpy.ndarray
            Every record array of the model (covariates as given, observations simulated), by
            name, ready for a mechanism's ``fit``.

        Raises
        ------
        InvalidDataError
            If covariates are missing, unexpected, of the wrong shape or not finite, or N is
            missing or disagrees with them.
        """
        covariates = self.check_covariates(covariates, n_records)
        n = _records_in(covariates) if covariates else n_records
        theta = np.asarray(theta, dtype=float)
        if theta.shape != (self.model.n_params,):
            raise InvalidDataError(
                f"theta must be a flat vector of {self.model.n_params} unconstrained values, "
                f"got shape {theta.shape}"
            )
        reseed_rngs(self._data_rngs, seed.generate_state(4))
        simulated = self._data_fn(
            *self.model.parameters.unflatten(theta),
            *(covariates[name] for name in self.covariate_names),
            np.int64(n),
        )
        data = dict(covariates)
        for target, values in zip(self._observed_targets, simulated, strict=True):
            data[target.name] = np.asarray(values).astype(target.dtype, copy=False)
        return data

    def check_covariates(
        self, covariates: Mapping[str, ArrayLike] | None, n_records: int | None = None
    ) -> dict[str, np.ndarray]:
        """Validate covariates for a simulated data set (and N against them).

        Returns
        -------
        dict of numpy.ndarray
            The covariates as arrays of the model's dtypes (empty for a model without any).
        """
        covariates = dict(covariates or {})
        if n_records is not None and (int(n_records) != n_records or n_records < 1):
            raise InvalidDataError(f"n_records must be a positive integer, got {n_records!r}")
        if not self.covariate_names:
            if covariates:
                raise InvalidDataError(
                    f"the model reads no covariates, but {sorted(covariates)} were given"
                )
            if n_records is None:
                raise InvalidDataError("give n_records: the model has no covariates to count")
            return {}
        unexpected = sorted(set(covariates) - set(self.covariate_names))
        missing = sorted(set(self.covariate_names) - set(covariates))
        if unexpected or missing:
            raise InvalidDataError(
                f"covariates must be exactly {list(self.covariate_names)}; missing {missing}, "
                f"unexpected {unexpected}"
            )
        lengths = {np.shape(value)[0] if np.ndim(value) else 0 for value in covariates.values()}
        n = lengths.pop() if len(lengths) == 1 else None
        if n_records is not None and n is not None and n != n_records:
            raise InvalidDataError(
                f"the covariates hold {n} records but n_records={n_records}; leave n_records out "
                "or make them agree"
            )
        # The model's own data check, with zero placeholders for the observations, validates the
        # covariates' shapes, dtypes, lengths and values exactly as it does real data.
        placeholders = {
            v.name: np.zeros((n or 1, *v.trailing_shape), dtype=v.dtype)
            for v in self.model.compiled.records
            if v.name not in self.covariate_names
        }
        checked = self.model.check_data({**covariates, **placeholders})
        return {name: checked[name] for name in self.covariate_names}


def simulator(model: RecordModel) -> Simulator:
    """The :class:`Simulator` of ``model``, compiled on first use and cached on the model."""
    return model.cached(_CACHE_KEY, lambda: Simulator(model))


#: Prior draws behind :func:`prior_summary`: its percentiles to a few % of the scale.
PRIOR_SUMMARY_DRAWS = 2000
#: How far (in scales) the prior's 2.5th and 97.5th percentiles may lie from a normal's for
#: :attr:`PriorSummary.normal`: a few times their sampling error at 2000 draws (about 0.07).
NORMAL_TAIL_TOLERANCE = 0.25


class PriorSummary(NamedTuple):
    """Where the model's prior puts each coordinate of the unconstrained θ (both (n,))."""

    #: The prior's median.
    centre: np.ndarray
    #: Half the distance between its 16th and 84th percentiles: the standard deviation of a
    #: normal prior, and finite for a heavy-tailed one.
    scale: np.ndarray
    #: Whether N(centre, scale²) describes the prior's tails too: its 2.5th and 97.5th
    #: percentiles lie within ``NORMAL_TAIL_TOLERANCE`` · scale of the normal's.  Not so for
    #: the log of a scale parameter, whose left tail is long.
    normal: np.ndarray


def prior_summary(model: RecordModel) -> PriorSummary | None:
    """The centre and scale of the model's prior of each coordinate of the unconstrained θ,
    from :data:`PRIOR_SUMMARY_DRAWS` prior draws.

    The prior is part of the model, not of the data, so the summary is public.  The draws are
    seeded by a constant: every model of a structure gets the same numbers.  None where the
    model cannot be simulated from (a ``pm.Potential`` changes its prior).
    """
    return model.cached(_CACHE_KEY + ".prior_summary", lambda: _prior_summary(model))


def _prior_summary(model: RecordModel) -> PriorSummary | None:
    try:
        sim = simulator(model)
    except ModelNotSupportedError:
        return None
    seeds = np.random.SeedSequence(0).spawn(PRIOR_SUMMARY_DRAWS)
    theta = np.stack([sim.prior(seed).theta for seed in seeds])
    tail_low, low, centre, high, tail_high = np.percentile(
        theta, [2.5, 15.865, 50, 84.135, 97.5], axis=0
    )
    scale = (high - low) / 2
    with np.errstate(divide="ignore", invalid="ignore"):
        misfit = np.maximum(
            np.abs(tail_low - (centre - 1.96 * scale)), np.abs(tail_high - (centre + 1.96 * scale))
        ) / scale
    return PriorSummary(centre=centre, scale=scale, normal=misfit <= NORMAL_TAIL_TOLERANCE)


def _records_in(covariates: Mapping[str, np.ndarray]) -> int:
    return int(next(iter(covariates.values())).shape[0])


def _unconstrained(model: pm.Model, rv: Variable) -> Variable:
    """``rv`` mapped to the unconstrained space by the transform PyMC gave it (if any)."""
    transform = model.rvs_to_transforms.get(rv)
    return rv if transform is None else transform.forward(rv, *rv.owner.inputs)


def _random_generators(outputs: list[Variable]) -> list[SharedVariable]:
    return [
        v
        for v in ancestors(outputs)
        if isinstance(v, SharedVariable) and isinstance(v.type, RandomGeneratorType)
    ]
