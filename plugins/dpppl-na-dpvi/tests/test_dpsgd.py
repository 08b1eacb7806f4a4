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
from dpppl_na_dpvi.dpsgd import (
    CURVATURE_CLIP_SCALE,
    CURVATURE_SHARE,
    CountedRecords,
    DPSGDSettings,
    clip_mu_first,
    curvature_matrix,
    curvature_rows,
    make_step,
    release_bound,
    run_dpsgd,
)
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


@pytest.mark.parametrize("mu_first", [False, True], ids=["joint", "mu-first"])
def test_one_record_moves_the_noise_free_sum_by_at_most_the_bound(model, mu_first):
    step = jax.jit(make_step(model, capacity=1, mc_draws=4, mu_first=mu_first))
    data = {k: jnp.asarray(v[:1]) for k, v in model.data().items()}
    beta = jnp.array([1.0, 1.0, 50.0, 50.0])
    for seed in range(20):
        grad = step(far_phi(model), jax.random.key(seed), data,
                    settings(model, sigma=0.0, bound=0.7, beta=beta))[1].noisy_grad
        assert float(jnp.linalg.norm(grad * beta)) <= 0.7 * (1 + 1e-12)


def test_clipping_mu_first_keeps_the_mu_part_of_a_record_whose_u_part_is_large():
    """Clipped whole, a row's large u-part shrinks its μ-part with it; μ first, a μ-part within
    the bound comes through whole, the u-part fills what it leaves, and a row within the bound
    is not touched."""
    rng = np.random.default_rng(3)
    n, bound = 3, 6.0
    # Heavy-tailed rows, as the records of a long-tailed outcome give.
    rows = rng.standard_t(2, size=(2000, 2 * n))
    rows[0, :n], rows[0, n:] = [1.0, -2.0, 0.5], [40.0, 0.0, 30.0]
    rows[1, :n], rows[1, n:] = [30.0, 40.0, 0.0], [1.0, 1.0, 1.0]
    rows[2, 0] = np.nan
    clipped = np.asarray(clip_mu_first(jnp.asarray(rows), n, bound))
    norms = np.linalg.norm(clipped, axis=1)
    assert np.all(norms <= bound * (1 + 1e-12))
    np.testing.assert_allclose(clipped[0, :n], rows[0, :n])
    assert norms[0] == pytest.approx(bound)
    np.testing.assert_allclose(clipped[1, :n], rows[1, :n] * bound / 50.0)
    np.testing.assert_allclose(clipped[1, n:], 0.0, atol=1e-7)
    np.testing.assert_array_equal(clipped[2], 0.0)
    within = np.linalg.norm(rows, axis=1) <= bound
    np.testing.assert_allclose(clipped[within], rows[within])
    mu_within = (np.linalg.norm(rows[:, :n], axis=1) <= bound) & ~np.isnan(rows).any(axis=1)
    np.testing.assert_allclose(clipped[mu_within, :n], rows[mu_within, :n])


def test_the_batch_sum_is_bounded_by_the_bound_times_the_batch_size(model):
    step = jax.jit(make_step(model, capacity=50, mc_draws=4))
    data = {k: jnp.asarray(v) for k, v in model.data().items()}
    grad = step(far_phi(model), jax.random.key(1), data,
                settings(model, sigma=0.0, bound=0.5))[1].noisy_grad
    # Far from the optimum all records push the same way, so the clipped sum is nearly 50 · C.
    assert 0.9 * 25 <= float(jnp.linalg.norm(grad)) <= 25 * (1 + 1e-12)


def test_with_the_curvature_release_one_record_moves_the_release_by_at_most_its_bound(model):
    """The gradient (norm ≤ C) and the curvature row (norm ≤ ρC) together: C·√(1 + ρ²)."""
    step = jax.jit(make_step(model, capacity=1, mc_draws=4, curvature=True))
    data = {k: jnp.asarray(v[:1]) for k, v in model.data().items()}
    beta = jnp.array([1.0, 1.0, 50.0, 50.0])
    bound = float(release_bound(0.7, curvature=True))
    assert bound == pytest.approx(0.7 * np.sqrt(1 + CURVATURE_SHARE**2))
    for seed in range(20):
        out = step(far_phi(model), jax.random.key(seed), data,
                   settings(model, sigma=0.0, bound=0.7, beta=beta))[1]
        release = np.concatenate([out.noisy_sum, out.curvature])
        assert np.linalg.norm(release) <= bound * (1 + 1e-12)
        assert np.linalg.norm(out.curvature) <= CURVATURE_SHARE * 0.7 * (1 + 1e-12)


def test_a_records_curvature_row_is_the_outer_product_of_its_released_mu_gradient(model):
    """One record at q = 1 without noise: the curvature release is r rᵀ for its μ-gradient r as
    released (clipped to C), clipped again to B = CURVATURE_CLIP_SCALE·√n."""
    step = jax.jit(make_step(model, capacity=1, mc_draws=4, curvature=True))
    data = {k: jnp.asarray(v[3:4]) for k, v in model.data().items()}
    n, bound = model.n_params, 2.0
    limit = CURVATURE_CLIP_SCALE * np.sqrt(n)
    for phi in (far_phi(model), far_phi(model) / 40):
        out = step(phi, jax.random.key(0), data, settings(model, sigma=0.0, bound=bound))[1]
        r = np.asarray(out.noisy_sum[:n])
        r = r * min(1.0, limit / np.linalg.norm(r))
        np.testing.assert_allclose(
            curvature_matrix(out.curvature, n, bound), np.outer(r, r), rtol=1e-10
        )


def test_curvature_rows_sum_to_the_sum_of_the_clipped_outer_products():
    rng = np.random.default_rng(1)
    n, bound = 5, 3.0
    rows = rng.normal(size=(40, 2 * n)) * rng.choice([0.1, 1.0, 30.0], size=(40, 1))
    released = curvature_rows(jnp.asarray(rows), n, bound)
    assert np.linalg.norm(released, axis=1).max() <= CURVATURE_SHARE * bound * (1 + 1e-12)
    limit = CURVATURE_CLIP_SCALE * np.sqrt(n)
    mu = rows[:, :n] * np.minimum(1.0, limit / np.linalg.norm(rows[:, :n], axis=1))[:, None]
    np.testing.assert_allclose(
        curvature_matrix(np.asarray(released).sum(axis=0), n, bound), mu.T @ mu, rtol=1e-10
    )


@pytest.mark.parametrize("curvature", [False, True], ids=["gradients", "with curvature"])
@pytest.mark.parametrize("grid", [None, 2.0**-20], ids=["float", "snapped"])
def test_the_injected_noise_has_the_declared_standard_deviation(model, grid, curvature):
    """σC for float noise; σ(C + g√d) for the snapped release, whose rows are rounded to the
    grid g first, so its difference from the float noise-free sum is noise plus at most
    64 g/2 per coordinate (10⁻⁵ of the noise std here).  With the curvature release C is
    C·√(1 + ρ²) and d counts the curvature rows, on every coordinate of the release."""
    clean_step = jax.jit(make_step(model, capacity=64, mc_draws=4, curvature=curvature))
    step = jax.jit(
        make_step(model, capacity=64, mc_draws=4, snapped=grid is not None, curvature=curvature)
    )
    data = {k: jnp.asarray(v) for k, v in model.data().items()}
    phi = far_phi(model)
    beta = jnp.array([1.0, 2.0, 30.0, 30.0])
    sigma, bound = 3.0, 0.8
    noisy_settings = settings(model, sigma=sigma, bound=bound, rate=0.3, beta=beta)
    clean_settings = settings(model, sigma=0.0, bound=bound, rate=0.3, beta=beta)
    dim = 4 + (3 if curvature else 0)  # 2n, and n(n + 1)/2 curvature entries
    sensitivity = float(release_bound(bound, curvature))
    std = sigma * (sensitivity if grid is None else sensitivity + grid * np.sqrt(dim))
    noise = []
    for seed in range(3000):
        key = jax.random.key(seed)
        # The same key draws the same batch and Monte Carlo draws: the difference is the noise.
        noisy = step(phi, key, data, noisy_settings, grid)[1]
        clean = clean_step(phi, key, data, clean_settings)[1]
        assert bool(noisy.exact)
        np.testing.assert_allclose(noisy.noisy_grad, noisy.noisy_sum / beta)
        noise.append(np.asarray(noisy.noisy_sum - clean.noisy_sum))
        noise.append(np.asarray(noisy.curvature - clean.curvature))
    noise = np.concatenate(noise)
    assert noise.size == 3000 * dim
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


@pytest.mark.parametrize("curvature", [False, True], ids=["gradients", "with curvature"])
@pytest.mark.parametrize("grid", [None, 2.0**-20], ids=["float", "snapped"])
def test_a_step_that_counts_records_releases_what_a_step_on_their_copies_releases(
    model, grid, curvature
):
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
    per_slot = jax.jit(
        make_step(model, capacity=130, mc_draws=4, snapped=snapped, curvature=curvature)
    )
    per_row = jax.jit(make_step(model, capacity=130, mc_draws=4, snapped=snapped, counted=True,
                                curvature=curvature))
    every = settings(model, sigma=1.0, bound=0.5, rate=1.0, lr=0.01)._replace(n_records=130)
    for seed in range(10):
        a = per_slot(far_phi(model) / 8, jax.random.key(seed), expanded, every, grid)[1]
        b = per_row(far_phi(model) / 8, jax.random.key(seed), counted, every, grid)[1]
        for released, counted_release in ((a.noisy_sum, b.noisy_sum), (a.curvature, b.curvature)):
            if snapped:
                np.testing.assert_array_equal(released, counted_release)
            else:
                np.testing.assert_allclose(released, counted_release, rtol=1e-12, atol=1e-12)


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


def _dpsgd_programs(model) -> set:
    return {key for key in model.compiled.cache(model.n_records) if key[:2] == ("na-dpvi", "dpsgd")}


def test_phases_that_are_not_whole_chunks_run_every_step_on_one_compiled_program(model):
    # Burn-in 70 = 50 + 20 and 260 = 5 × 50 + 10 free steps (330), or 300 = 6 × 50 (370): one
    # program of 50 steps runs every chunk, the shorter ones stopping at their length.
    before = _dpsgd_programs(model)
    for steps in (330, 370):
        schedule = StandardisedSchedule(model, noise_multiplier=2.0, sampling_rate=0.5,
                                        steps=steps, burn_in_steps=70)
        trace, _ = run_dpsgd(model, model.data(), schedule.initial_phi(), schedule, steps=steps,
                             capacity=50, mc_draws=4, key=jax.random.key(4),
                             progress=Progress(False), chunk=50)
        assert trace.phi.shape[0] == steps + 1 and trace.noisy_sum.shape[0] == steps
        # Every step released a noisy sum and moved the iterate: no idle step's zeros kept.
        assert np.all(np.abs(trace.noisy_sum).min(axis=1) > 0)
        assert np.all(np.abs(np.diff(trace.phi, axis=0)).max(axis=1) > 0)
    assert len(_dpsgd_programs(model) - before) <= 1
