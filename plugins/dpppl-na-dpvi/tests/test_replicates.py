"""Replicate fits run as one vmapped program and are distributed as single fits are."""

from __future__ import annotations

import jax
import numpy as np
import pymc as pm
import pytest
from scipy import stats

from dpppl import record_model
from dpppl.plugin import Progress, get_accountant, get_mechanism
from dpppl.testing import wide_logistic_regression
from dpppl_na_dpvi import mechanism as mechanism_module
from dpppl_na_dpvi.mechanism import (
    ACCELERATOR_MEMORY_SHARE,
    MIN_REPLICATE_BATCH,
    REPLICATE_MEMORY,
    REPLICATE_STEP_ELEMENTS,
    replicate_limits,
)

N = 200
REPLICATES = 16
OPTIONS = {"steps": 200, "burn_in": 0.2, "mc_draws": 2, "posterior": "naive", "draws": 10}


@pytest.fixture(scope="module")
def setting():
    x = np.random.default_rng(0).binomial(1, 0.3, N)
    with pm.Model() as model:
        p = pm.Beta("p", 10, 10)
        pm.Bernoulli("x", p, observed=x)
    compiled = record_model(model)
    mechanism = get_mechanism("na-dpvi")(**OPTIONS)
    mechanism.check_model(compiled)
    plan = mechanism.plan(
        n_records=N, epsilon=0.3, delta=1e-5, accountant=get_accountant("rdp")()
    )
    return mechanism, compiled, plan


def _sums(releases):
    return np.stack([r.groups["dpvi_trace"]["noisy_sum"].values for r in releases])


def test_vectorised_replicates_release_what_single_fits_release(setting):
    mechanism, model, plan = setting
    data = model.data()
    seeds = np.random.SeedSequence(1).spawn(2 * REPLICATES)
    batched = mechanism.fit_replicates(
        model, [data] * REPLICATES, plan, seeds=seeds[:REPLICATES], progress=Progress(False)
    )
    single = [
        mechanism.fit(model, data, plan, seed=seed, progress=Progress(False))
        for seed in seeds[REPLICATES:]
    ]
    assert mechanism.replicate_batch_size(model, plan) >= REPLICATES
    assert len(batched) == REPLICATES
    vectorised, alone = _sums(batched), _sums(single)
    # Same data, same plan: the noisy sums of every step and coordinate have one distribution.
    for coordinate in range(vectorised.shape[-1]):
        a, b = vectorised[..., coordinate].ravel(), alone[..., coordinate].ravel()
        assert stats.ks_2samp(a, b).pvalue > 1e-3
        assert 0.9 < a.std() / b.std() < 1.1
    # ... on the plan's grid, and with independent noise across replicates.
    steps = vectorised / plan.details["grid"]
    np.testing.assert_array_equal(steps, np.round(steps))
    noise = vectorised - vectorised.mean(axis=0)
    flat = noise[..., 0].reshape(REPLICATES, -1)
    correlations = np.corrcoef(flat)[np.triu_indices(REPLICATES, 1)]
    assert np.abs(correlations).max() < 5 / np.sqrt(flat.shape[1])


def test_a_batch_is_one_program_and_returns_one_release_per_data_set(setting, monkeypatch):
    mechanism, model, plan = setting
    fitted = []
    fit = mechanism._fit

    def counting_fit(model, datasets, *args, replicates, **kwargs):
        fitted.append((len(datasets), replicates))
        return fit(model, datasets, *args, replicates=replicates, **kwargs)

    monkeypatch.setattr(mechanism, "_fit", counting_fit)
    n = 14
    data = model.data()
    seeds = np.random.SeedSequence(2).spawn(n)
    releases = mechanism.fit_replicates(model, [data] * n, plan, seeds=seeds,
                                        progress=Progress(False))
    assert fitted == [(n, True)]
    assert len(releases) == n
    assert len({s.tobytes() for s in _sums(releases)}) == n


def test_a_batch_of_one_is_fitted_as_a_single_fit_is(setting):
    mechanism, model, plan = setting
    data = model.data()
    [seed] = np.random.SeedSequence(3).spawn(1)
    [one] = mechanism.fit_replicates(model, [data], plan, seeds=[seed], progress=Progress(False))
    single = mechanism.fit(model, data, plan, seed=seed, progress=Progress(False))
    np.testing.assert_array_equal(_sums([one]), _sums([single]))


def test_a_model_with_large_steps_still_gets_batches_of_the_smallest_size():
    """One replicate at a time is slower than a batch whose step outgrows the CPU's caches, so
    a batch holds at least MIN_REPLICATE_BATCH replicates where memory allows."""
    rng = np.random.default_rng(0)
    x = rng.normal(size=(5000, 10))
    with pm.Model() as model:
        w = pm.Normal("w", 0, 1, shape=10)
        sigma = pm.HalfNormal("sigma", 1)
        pm.Normal("y", x @ w, sigma, observed=x.sum(axis=1) + rng.normal(size=5000))
    compiled = record_model(model)
    mechanism = get_mechanism("na-dpvi")()
    mechanism.check_model(compiled)
    plan = mechanism.plan(
        n_records=5000, epsilon=1.0, delta=1e-5, accountant=get_accountant("rdp")()
    )
    per_step = plan.details["batch_capacity"] * mechanism.options.mc_draws * 2 * compiled.n_params
    assert per_step * MIN_REPLICATE_BATCH > REPLICATE_STEP_ELEMENTS
    assert mechanism.replicate_batch_size(compiled, plan) == MIN_REPLICATE_BATCH


def test_on_a_cpu_a_batch_is_limited_by_memory_and_by_the_caches():
    assert replicate_limits(jax.devices("cpu")[0]) == (REPLICATE_MEMORY, REPLICATE_STEP_ELEMENTS)


class _Accelerator:
    """Stands in for a GPU, which this machine and CI do not have: it answers the two questions
    ``replicate_limits`` asks of a ``jax.Device`` as an 80 GB card's device does."""

    platform = "gpu"

    def __init__(self, stats):
        self.stats = stats

    def memory_stats(self):
        return self.stats


def test_on_an_accelerator_a_batch_takes_a_share_of_its_memory_and_has_no_cache_limit():
    pool = 60 * 2**30
    assert replicate_limits(_Accelerator({"bytes_limit": pool})) == (
        pool // ACCELERATOR_MEMORY_SHARE,
        None,
    )
    assert replicate_limits(_Accelerator(None)) == (REPLICATE_MEMORY, None)


def test_the_released_curvature_rows_count_toward_a_batch_step(monkeypatch):
    """At 36 parameters a record's curvature row (666 entries) nearly doubles what a step holds
    per record (its 10 Monte Carlo gradients of 72 coordinates): a batch that releases the rows
    holds fewer replicates under the same step limit."""
    compiled = record_model(wide_logistic_regression(np.random.default_rng(0)))
    # A device with memory to spare and room for 2²⁴ entries a step, so the step limit decides.
    monkeypatch.setattr(mechanism_module, "replicate_limits", lambda device: (2**40, 2**24))
    sizes = {}
    for curvature in ("diagonal", "full"):
        mechanism = get_mechanism("na-dpvi")(curvature=curvature)
        mechanism.check_model(compiled)
        plan = mechanism.plan(
            n_records=2000, epsilon=1.0, delta=1e-5, accountant=get_accountant("rdp")()
        )
        sizes[curvature] = mechanism.replicate_batch_size(compiled, plan)
    assert not get_mechanism("na-dpvi")().options.releases_curvature(36)
    assert get_mechanism("na-dpvi")(curvature="full").options.releases_curvature(36)
    assert sizes["full"] < sizes["diagonal"] < 128
