"""One DP-SGD step of DPVI bounds each record's contribution and adds the declared noise, in
float64 or snapped to a grid."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pymc as pm
import pytest
from scipy import stats

from dpppl import record_model
from dpppl.plugin import GeometricTable, Progress, binomial_thresholds, copies_of
from dpppl_na_dpvi.dpsgd import CountedRecords, DPSGDSettings, make_step, run_dpsgd
from dpppl_na_dpvi.heuristics import StandardisedSchedule

SIGNIFICANCE = 1e-6


@pytest.fixture(scope="module")
def model():
    rng = np.random.default_rng(0)
    x = rng.normal(size=50)
    with pm.Model() as m:
        X = pm.Data("X", x)
        a = pm.Normal("a", 0, 5)
        sigma = pm.HalfNormal("sigma", 1)
        pm.Normal("y", a * X, sigma, observed=3 * x + rng.normal(size=50))
    return record_model(m)


def settings(model, *, sigma, bound, rate=1.0, beta=None, lr=0.0):
    d = 2 * model.n_params
    return DPSGDSettings(
        clipping_bound=bound,
        noise_multiplier=sigma,
        preconditioner=jnp.ones(d) if beta is None else jnp.asarray(beta),
        learning_rate=jnp.full(d, lr),
        gaps=GeometricTable.for_rate(rate),
        n_records=model.n_records,
    )


def far_phi(model):
    # Far from the optimum: every per-record gradient is much larger than the bound.
    return jnp.concatenate([jnp.full(model.n_params, 40.0), jnp.full(model.n_params, 3.0)])


def test_one_record_moves_the_noise_free_sum_by_at_most_the_bound(model):
    step = jax.jit(make_step(model, capacity=1, mc_draws=4))
    data = {k: jnp.asarray(v[:1]) for k, v in model.data().items()}
    beta = jnp.array([1.0, 1.0, 50.0, 50.0])
    for seed in range(20):
        grad = step(far_phi(model), jax.random.key(seed), data,
                    settings(model, sigma=0.0, bound=0.7, beta=beta))[1].noisy_grad
        assert float(jnp.linalg.norm(grad * beta)) <= 0.7 * (1 + 1e-12)


def test_the_batch_sum_is_bounded_by_the_bound_times_the_batch_size(model):
    step = jax.jit(make_step(model, capacity=50, mc_draws=4))
    data = {k: jnp.asarray(v) for k, v in model.data().items()}
    grad = step(far_phi(model), jax.random.key(1), data,
                settings(model, sigma=0.0, bound=0.5))[1].noisy_grad
    # Far from the optimum all records push the same way, so the clipped sum is nearly 50 · C.
    assert 0.9 * 25 <= float(jnp.linalg.norm(grad)) <= 25 * (1 + 1e-12)


@pytest.mark.parametrize("grid", [None, 2.0**-20], ids=["float", "snapped"])
def test_the_injected_noise_has_the_declared_standard_deviation(model, grid):
    """σC for float noise; σ(C + g√d) for the snapped release, whose rows are rounded to the
    grid g first, so its difference from the float noise-free sum is noise plus at most
    64 g/2 per coordinate (10⁻⁵ of the noise std here)."""
    clean_step = jax.jit(make_step(model, capacity=64, mc_draws=4))
    step = jax.jit(make_step(model, capacity=64, mc_draws=4, snapped=grid is not None))
    data = {k: jnp.asarray(v) for k, v in model.data().items()}
    phi = far_phi(model)
    beta = jnp.array([1.0, 2.0, 30.0, 30.0])
    sigma, bound = 3.0, 0.8
    noisy_settings = settings(model, sigma=sigma, bound=bound, rate=0.3, beta=beta)
    clean_settings = settings(model, sigma=0.0, bound=bound, rate=0.3, beta=beta)
    std = sigma * (bound if grid is None else bound + grid * 2)  # d = 4
    noise = []
    for seed in range(3000):
        key = jax.random.key(seed)
        # The same key draws the same batch and Monte Carlo draws: the difference is the noise.
        noisy = step(phi, key, data, noisy_settings, grid)[1]
        clean = clean_step(phi, key, data, clean_settings)[1]
        assert bool(noisy.exact)
        np.testing.assert_allclose(noisy.noisy_grad, noisy.noisy_sum / beta)
        noise.append(np.asarray(noisy.noisy_sum - clean.noisy_sum))
    noise = np.concatenate(noise)
    statistic = np.sum(noise**2) / std**2
    assert stats.chi2.sf(statistic, noise.size) > SIGNIFICANCE
    assert stats.chi2.cdf(statistic, noise.size) > SIGNIFICANCE


def test_records_are_included_at_the_sampling_rate(model):
    """With zero noise and the gradient of one record known, the noise-free sum counts records."""
    rng = np.random.default_rng(5)
    n = model.n_records
    # Identical records: every included record contributes the same clipped vector.
    data = {k: jnp.asarray(np.repeat(v[:1], n, axis=0)) for k, v in model.data().items()}
    step = jax.jit(make_step(model, capacity=n, mc_draws=2))
    one = step(far_phi(model), jax.random.key(0),
               {k: v[:1] for k, v in data.items()},
               DPSGDSettings(0.5, 0.0, jnp.ones(4), jnp.zeros(4), GeometricTable.for_rate(1.0), 1))[1].noisy_grad
    counts = []
    for seed in rng.integers(0, 2**31, size=400):
        grad = step(far_phi(model), jax.random.key(int(seed)), data,
                    settings(model, sigma=0.0, bound=0.5, rate=0.2))[1].noisy_grad
        counts.append(float(jnp.linalg.norm(grad) / jnp.linalg.norm(one)))
    counts = np.rint(counts)
    assert abs(counts.mean() - 0.2 * n) < 5 * np.sqrt(0.2 * 0.8 * n / len(counts))


@pytest.mark.parametrize("grid", [None, 2.0**-20], ids=["float", "snapped"])
def test_a_step_that_counts_records_releases_what_a_step_on_their_copies_releases(model, grid):
    """At q = 1 every copy is in the batch: a step that takes one gradient per possible record
    and counts its copies releases the sum a step over all the copies releases (snapped: bit for
    bit; float: up to the order of the sum)."""
    possible = {k: v[:6] for k, v in model.data().items()}  # the sixth has no copies
    copies = np.array([40, 1, 0, 77, 12, 0])
    # The data in the possible records' order, as a step over all of them reads it.
    expanded = {k: np.repeat(v, copies, axis=0) for k, v in possible.items()}
    thresholds = [binomial_thresholds(int(n), 1.0, 80) for n in copies_of(possible, expanded)]
    counted = CountedRecords(jax.tree.map(jnp.asarray, possible), jnp.asarray(np.stack(thresholds)))
    expanded = jax.tree.map(jnp.asarray, expanded)
    snapped = grid is not None
    per_slot = jax.jit(make_step(model, capacity=130, mc_draws=4, snapped=snapped))
    per_row = jax.jit(make_step(model, capacity=130, mc_draws=4, snapped=snapped, counted=True))
    every = settings(model, sigma=1.0, bound=0.5, rate=1.0, lr=0.01)._replace(n_records=130)
    for seed in range(10):
        a = per_slot(far_phi(model) / 8, jax.random.key(seed), expanded, every, grid)[1]
        b = per_row(far_phi(model) / 8, jax.random.key(seed), counted, every, grid)[1]
        if snapped:
            np.testing.assert_array_equal(a.noisy_sum, b.noisy_sum)
        else:
            np.testing.assert_allclose(a.noisy_sum, b.noisy_sum, rtol=1e-12, atol=1e-12)


def test_the_update_is_minus_learning_rate_times_the_noisy_gradient(model):
    step = jax.jit(make_step(model, capacity=50, mc_draws=2))
    data = {k: jnp.asarray(v) for k, v in model.data().items()}
    phi = far_phi(model)
    new_phi, out = step(phi, jax.random.key(2), data,
                        settings(model, sigma=1.0, bound=1.0, lr=0.01))
    np.testing.assert_allclose(out.phi, phi)
    np.testing.assert_allclose(new_phi, phi - 0.01 * out.noisy_grad)


def test_the_anchored_phase_releases_gradients_at_the_schedules_anchor(model):
    schedule = StandardisedSchedule(model, noise_multiplier=2.0, sampling_rate=0.5, steps=400,
                                    burn_in_steps=100)
    trace, _ = run_dpsgd(model, model.data(), schedule.initial_phi(), schedule, steps=400,
                         capacity=50, mc_draws=4, key=jax.random.key(3), progress=Progress(False),
                         chunk=50, anchored_steps=150)
    free = trace.phi[100:250]
    assert np.ptp(free, axis=0).min() > 0  # the free steps move
    np.testing.assert_allclose(trace.phi[250:], np.broadcast_to(schedule.anchor(free), (151, 4)))
    # ... and the anchored ones release a noisy gradient every step without moving.
    assert np.all(trace.noisy_grad[250:].std(axis=0) > 0)


def test_an_anchored_phase_must_leave_free_steps(model):
    schedule = StandardisedSchedule(model, noise_multiplier=2.0, sampling_rate=0.5, steps=200,
                                    burn_in_steps=100)
    with pytest.raises(ValueError, match="free"):
        run_dpsgd(model, model.data(), schedule.initial_phi(), schedule, steps=200, capacity=50,
                  mc_draws=4, key=jax.random.key(3), progress=Progress(False), anchored_steps=100)
