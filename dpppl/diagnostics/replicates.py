"""The replicates of a TARP study: simulate θ_k and D_k, fit, keep the draws.

:class:`Replicates` runs a chunk of replicates in this process; :func:`remote_runner` gives the
function a worker process runs instead, with a payload that holds no private record (the model's
data-free copy, :func:`~dpppl.model.record_structure.without_records`, and a mechanism made
afresh from its class and options).  Every replicate's seeds derive from the study's root seed
alone, so a replicate draws the same numbers in this process as in any worker.
"""

from __future__ import annotations

import dataclasses
import functools
from collections.abc import Callable, Mapping
from typing import Any, NamedTuple

import cloudpickle
import numpy as np
from numpy.typing import ArrayLike

from dpppl.errors import InvalidDataError
from dpppl.model.record_model import RecordModel
from dpppl.model.record_structure import without_records
from dpppl.model.simulation import Simulator, simulator
from dpppl.plugin.mechanism import Mechanism, PrivacyPlan, Release
from dpppl.progress import Progress
from dpppl.threads import single_threaded_blas

Covariates = Mapping[str, ArrayLike] | Callable[[np.random.Generator], Mapping[str, ArrayLike]]


class ReplicateSeeds(NamedTuple):
    """Independent seeds of one replicate's steps."""

    prior: np.random.SeedSequence
    covariates: np.random.SeedSequence
    data: np.random.SeedSequence
    fit: np.random.SeedSequence


class Chunk(NamedTuple):
    """What a chunk of replicates returns: θ_k (c, d), draws (c, S, d), warnings per fit."""

    truth: np.ndarray
    samples: np.ndarray
    warnings: list[list[str]]


@dataclasses.dataclass(frozen=True)
class Replicates:
    """Everything one replicate needs besides its seed."""

    model: RecordModel
    simulator: Simulator
    mechanism: Mechanism
    plan: PrivacyPlan
    covariates: Covariates | None
    n_records: int
    n_draws: int | None
    batch_size: int

    def run(self, seeds: list[np.random.SeedSequence]) -> Chunk:
        """θ_k, posterior draws and fit warnings for a chunk of replicates, fitted
        ``batch_size`` at a time by the mechanism's :meth:`~dpppl.Mechanism.fit_replicates`.

        A shorter batch is filled up with copies of its last replicate, whose releases are
        dropped: a vectorised mechanism then runs every batch on one compiled program."""
        truth, samples, messages = [], [], []
        for start in range(0, len(seeds), self.batch_size):
            batch = seeds[start : start + self.batch_size]
            replicates = [ReplicateSeeds(*children(s, 4)) for s in batch]
            thetas = [self.simulator.prior(r.prior).theta for r in replicates]
            datasets = [
                self.simulator.data(
                    theta,
                    r.data,
                    covariates=covariates_for(self.covariates, r.covariates),
                    n_records=self.n_records,
                )
                for theta, r in zip(thetas, replicates, strict=True)
            ]
            fit_seeds = [np.random.SeedSequence(r.fit.generate_state(8)) for r in replicates]
            filling = self.batch_size - len(batch)
            with single_threaded_blas():
                releases = self.mechanism.fit_replicates(
                    self.model,
                    datasets + datasets[-1:] * filling,
                    self.plan,
                    seeds=fit_seeds + fit_seeds[-1:] * filling,
                    progress=Progress(False),
                )[: len(batch)]
            for seed, release in zip(batch, releases, strict=True):
                _refuse_non_finite_draws(release, seed)
            truth += thetas
            samples += [thin(release.draws, self.n_draws) for release in releases]
            # A mechanism's warnings (e.g. divergent transitions) are counted and reported once
            # for the study rather than repeated for every replicate.
            messages += [release.warnings for release in releases]
        return Chunk(truth=np.stack(truth), samples=np.stack(samples), warnings=messages)


def _refuse_non_finite_draws(release: Release, seed: np.random.SeedSequence) -> None:
    # Stop the study at the fit that failed, not after the rest: a paper-size study takes
    # minutes to hours, and TARP cannot use non-finite draws anyway.
    if np.isfinite(release.draws).all():
        return
    said = "; ".join(release.warnings) or "none"
    raise InvalidDataError(
        f"the fit of simulation {seed.spawn_key[-1]} (counted from 0) returned non-finite "
        f"posterior draws, so the study stopped there; that fit's warnings: {said}"
    )


def root_seed(random_seed: int | np.random.SeedSequence | None) -> np.random.SeedSequence:
    """The study's root seed; a SeedSequence is copied, so the caller's is never advanced."""
    if isinstance(random_seed, np.random.SeedSequence):
        return np.random.SeedSequence(random_seed.entropy, spawn_key=random_seed.spawn_key)
    return np.random.SeedSequence(random_seed)


def children(seed: np.random.SeedSequence, n: int) -> list[np.random.SeedSequence]:
    """The first ``n`` children ``seed.spawn(n)`` would give, without advancing ``seed``: a
    replicate gets the same seeds in this process as in a worker that received a copy."""
    return [np.random.SeedSequence(seed.entropy, spawn_key=(*seed.spawn_key, i)) for i in range(n)]


def covariates_for(
    covariates: Covariates | None, seed: np.random.SeedSequence
) -> Mapping[str, ArrayLike] | None:
    if callable(covariates):
        return covariates(np.random.default_rng(seed))
    return covariates


def thin(draws: np.ndarray, n_draws: int | None) -> np.ndarray:
    """S evenly spaced draws of the release's (chain, draw, d) draws, flattened to (S, d)."""
    flat = np.asarray(draws, dtype=float).reshape(-1, draws.shape[-1])
    if n_draws is None:
        return flat
    if n_draws > flat.shape[0]:
        raise ValueError(
            f"n_posterior_draws={n_draws}, but the mechanism released only {flat.shape[0]} "
            "draws; ask it for more (e.g. its draws/chains options) or use fewer"
        )
    return flat[np.linspace(0, flat.shape[0] - 1, n_draws).round().astype(int)]


def run_remote(model_bytes: bytes, study_bytes: bytes, seeds: list) -> Chunk:
    """A chunk of replicates in a worker process.

    The worker gets the data-free copy of the model (:func:`~dpppl.model.record_structure.without_records`) and
    its structure; a ``RecordModel`` holds its model weakly, so the copy is kept here while the
    chunk runs.  Compilations are shared by structure, so later chunks on this worker reuse them.
    """
    model, structure = cloudpickle.loads(model_bytes)
    compiled = RecordModel(model, structure)
    mechanism_class, options, plan, source, n, n_draws, batch_size = cloudpickle.loads(study_bytes)
    replicates = Replicates(
        compiled.with_n_records(n),
        simulator(compiled),
        mechanism_class(**options),
        plan,
        source,
        n,
        n_draws,
        batch_size,
    )
    return replicates.run(seeds)


def remote_runner(
    model: RecordModel,
    mechanism: type[Mechanism],
    options: Mapping[str, Any],
    replicates: Replicates,
) -> Callable[[list[np.random.SeedSequence]], Chunk]:
    """``replicates.run`` for a worker process, as a picklable function of the chunk's seeds.

    ``model`` is the private record model: only its data-free copy travels.  The mechanism is
    rebuilt from its class and ``options``, so nothing an instance was shown (``check_model``
    sees the model with its data) can travel with it.
    """
    return functools.partial(
        run_remote,
        cloudpickle.dumps(without_records(model.model, model.structure)),
        cloudpickle.dumps(
            (
                mechanism,
                dict(options),
                replicates.plan,
                replicates.covariates,
                replicates.n_records,
                replicates.n_draws,
                replicates.batch_size,
            )
        ),
    )
