"""The post-processing model recovers the optimum φ* and curvature A from a noisy gradient trace,
with honest uncertainty."""

from __future__ import annotations

from dataclasses import dataclass

import blackjax
import jax
import jax.numpy as jnp
import numpy as np
import pymc as pm
import pytest
import scipy.stats
from scipy.integrate import quad

from dpppl import record_model
from dpppl.plugin import softplus_inverse
from dpppl_na_dpvi import postprocess
from dpppl_na_dpvi.postprocess import (
    CORRELATION_SLAB_WEIGHT,
    REDRAW_TARGET_ACCEPT,
    UNINFORMATIVE_DEVIATION,
    ModelStructure,
    TraceStatistics,
    correlation_cholesky,
    correlation_scales,
    correlation_slab_weights,
    curvature_matrices,
    draw_optimum,
    initial_position,
    laplace_convergence,
    log_density,
    log_sech_squared,
    partial_correlation_logp,
    partial_correlations,
    released_correlation_prior,
    released_fisher_correlations,
    run_nuts,
    sample_laplace,
    sample_nuts,
)

KAPPA = 0.1
#: Curvatures of a mean-field ELBO at its optimum for variance 1e-3: A_μ = 1/v, A_u ≈ 1/2.
VARIANCE = 1e-3


def simulate_trace(rng, phi_star, a, noise_std, rate, steps=6000):
    """DP-SGD on an exactly quadratic loss: g̃_{t+1} = κ A (φ_t − φ*) + noise."""
    lr = rate / (KAPPA * a)
    phi = np.zeros((steps + 1, len(a)))
    grads = np.zeros((steps, len(a)))
    phi[0] = phi_star + 3 * noise_std / (KAPPA * a)
    for t in range(steps):
        grads[t] = KAPPA * a * (phi[t] - phi_star) + noise_std * rng.normal(size=len(a))
        phi[t + 1] = phi[t] - lr * grads[t]
    return phi, grads


def cache():
    store = {}
    return lambda key, factory: store.setdefault(key, factory()) if key not in store else store[key]


def stats_for(rng, phi_star, prior="structural"):
    a = np.array([1 / VARIANCE, 0.5])
    noise_std = np.array([300.0, 0.4])
    phi, grads = simulate_trace(rng, phi_star, a, noise_std, rate=np.array([0.01, 0.01]))
    return TraceStatistics.from_trace(
        phi, grads, burn_in=1000, noise_std=noise_std, rate=KAPPA,
        subsampling_scale=np.zeros(2), curvature_prior=prior,
    )


def test_sufficient_statistics_give_the_same_density_as_the_full_trace():
    rng = np.random.default_rng(0)
    phi_star = np.array([0.3, softplus_inverse(VARIANCE)])
    a = np.array([1 / VARIANCE, 0.5])
    noise_std = np.array([300.0, 0.4])
    phi, grads = simulate_trace(rng, phi_star, a, noise_std, rate=np.array([0.01, 0.01]), steps=500)
    stats = TraceStatistics.from_trace(phi, grads, burn_in=100, noise_std=noise_std, rate=KAPPA,
                                       subsampling_scale=np.zeros(2))

    def direct(params):
        delta, v = params[:2], params[2:]
        mean = KAPPA * jnp.exp(v) * (phi[100:-1] - stats.phi_bar - delta)
        return (
            jax.scipy.stats.norm.logpdf(grads[100:], mean, noise_std).sum()
            + jax.scipy.stats.norm.logpdf(delta).sum()
            + jax.scipy.stats.norm.logpdf(v, stats.prior_v_mean, stats.prior_v_std).sum()
        )

    # Up to the constants the sufficient-statistic form drops, the densities are the same
    # (with the paper's N(0, I) prior on δ, which ``direct`` writes out).
    structure = ModelStructure(optimum_prior="standard-normal")
    a, b = jnp.array([0.01, -0.02, 6.8, -0.5]), jnp.array([-0.03, 0.05, 7.1, -0.9])
    np.testing.assert_allclose(
        log_density(a, stats, structure) - log_density(b, stats, structure),
        direct(a) - direct(b),
        rtol=1e-8,
    )


def test_a_full_curvature_block_gives_the_same_density_as_the_full_trace():
    """The same check for a correlated μ-block, whose A is rebuilt by curvature_matrices."""
    rng = np.random.default_rng(1)
    a = np.diag([1 / VARIANCE, 1 / VARIANCE, 0.5, 0.5])
    a[0, 1] = a[1, 0] = -0.6 / VARIANCE
    noise_std = np.array([300.0, 300.0, 0.4, 0.4])
    phi_star = np.array([0.05, -0.02, *[float(softplus_inverse(VARIANCE))] * 2])
    phi, grads = simulate_correlated(rng, phi_star, a, noise_std, steps=600)
    stats = TraceStatistics.from_trace(phi, grads, burn_in=100, noise_std=noise_std, rate=KAPPA,
                                       subsampling_scale=np.zeros(4))
    structure = ModelStructure(full_curvature=True, optimum_prior="standard-normal")

    def direct(params):
        delta, v, y = params[:4], params[4:8], params[8:]
        chol, _ = correlation_cholesky(y, 2)
        matrix = curvature_matrices(np.exp(v), np.asarray(chol @ chol.T)[1:, :1].ravel())
        mean = KAPPA * (phi[100:-1] - stats.phi_bar - delta) @ matrix.T
        return (
            scipy.stats.norm.logpdf(grads[100:], mean, noise_std).sum()
            + scipy.stats.norm.logpdf(delta).sum()
            + scipy.stats.norm.logpdf(v, stats.prior_v_mean, stats.prior_v_std).sum()
        )

    v = np.asarray(stats.prior_v_mean)
    a = np.concatenate([[0.01, -0.02, 0.03, -0.01], v + 0.1, [0.4]])
    b = np.concatenate([[-0.03, 0.05, -0.02, 0.02], v - 0.2, [0.4]])
    np.testing.assert_allclose(
        log_density(jnp.asarray(a), stats, structure) - log_density(jnp.asarray(b), stats, structure),
        direct(a) - direct(b),
        rtol=1e-8,
    )


def test_the_structural_prior_is_centred_on_the_elbo_curvature():
    stats = stats_for(np.random.default_rng(1), np.array([0.0, softplus_inverse(VARIANCE)]))
    centre = np.exp(np.asarray(stats.prior_v_mean))
    # ū wanders with the trace, so the centre is right to within the prior's own width.
    np.testing.assert_allclose(centre, [1 / VARIANCE, 0.5], rtol=0.25)


def test_the_structural_curvature_matches_a_real_elbo_hessian():
    rng = np.random.default_rng(2)
    y = rng.binomial(1, 0.3, 1000)
    with pm.Model() as m:
        p = pm.Beta("p", 1, 1)
        pm.Bernoulli("y", p=p, observed=y)
    model = record_model(m)
    eps = jax.random.normal(jax.random.key(0), (3000, 1))
    eps = jnp.concatenate([eps, -eps])
    loss = lambda phi: jnp.sum(model.elbo_loss(phi, model.data(), eps, model.n_records))
    logit = np.log(y.mean() / (1 - y.mean()))
    phi = jnp.array([logit, float(softplus_inverse(1 / (len(y) * 0.21)))])
    hessian_of = jax.jit(jax.hessian(loss))
    gradient_of = jax.jit(jax.grad(loss))
    for _ in range(8):  # Newton to the optimum
        phi = phi - jnp.linalg.solve(hessian_of(phi), gradient_of(phi))
    hessian = np.diag(np.asarray(hessian_of(phi)))
    u = float(phi[1])
    variance, slope = np.log1p(np.exp(u)), 1 / (1 + np.exp(-u))
    # Stein's identity behind A_μ = 1/v holds in expectation: allow the Monte Carlo error.
    np.testing.assert_allclose(hessian, [1 / variance, slope**2 / (2 * variance**2)], rtol=0.05)


@pytest.mark.parametrize("prior", ["structural", "trace"])
def test_nuts_recovers_the_optimum_with_calibrated_uncertainty(prior):
    """40 simulated traces, sampled as one vmapped program of replicates."""
    rng = np.random.default_rng(3)
    truths = [np.array([rng.normal(), softplus_inverse(VARIANCE) + 0.1 * rng.normal()])
              for _ in range(40)]
    stats = [stats_for(rng, phi_star, prior) for phi_star in truths]
    draws = sample_nuts(stats, [jax.random.key(k) for k in range(40)], tune=300, draws=500,
                        chains=1, structure=ModelStructure(), cache=cache(), replicates=True)
    z = []
    for one, phi_star in zip(draws, truths, strict=True):
        samples = one.phi_star.reshape(-1, 2)
        z.append((samples.mean(axis=0) - phi_star) / samples.std(axis=0))
    z = np.array(z)
    assert np.all(np.abs(z.mean(axis=0)) < 0.6)
    assert np.all((z.std(axis=0) > 0.6) & (z.std(axis=0) < 1.5))


def test_laplace_agrees_with_nuts_on_a_well_identified_trace():
    stats = stats_for(np.random.default_rng(4), np.array([0.2, softplus_inverse(VARIANCE)]))
    store = cache()
    [nuts] = sample_nuts([stats], [jax.random.key(0)], tune=500, draws=2000, chains=1,
                         structure=ModelStructure(), cache=store)
    [laplace] = sample_laplace([stats], [jax.random.key(1)], draws=2000, chains=1,
                               structure=ModelStructure(), cache=store)
    nuts, laplace = nuts.phi_star.reshape(-1, 2), laplace.phi_star.reshape(-1, 2)
    np.testing.assert_allclose(laplace.mean(0), nuts.mean(0), atol=0.2 * nuts.std(0).max())
    np.testing.assert_allclose(laplace.std(0), nuts.std(0), rtol=0.2)


def test_the_first_window_starts_from_each_coordinates_curvature():
    # 1 / curvature where the log density curves down, the identity's 1 where it does not.
    def logdensity(x):
        return -0.5 * jnp.sum((x[:3] / jnp.array([0.1, 1.0, 10.0])) ** 2) + 0.5 * x[3] ** 2

    start = jnp.array([0.3, -1.0, 4.0, 2.0])
    np.testing.assert_allclose(
        postprocess._curvature_scaled_inverse_mass(logdensity, start), [0.01, 1.0, 100.0, 1.0]
    )


def test_nuts_warms_up_and_draws_exactly_as_blackjax_fisher_diagonal_adaptation_then_nuts():
    # The sampler runs Stan's window schedule with the Fisher-diagonal mass matrix and the draws
    # as one scan over one NUTS kernel; blackjax's own warm-up scans a kernel of its own.  Given
    # the same starting inverse mass matrix and keys, the same draws, bit for bit.
    scales = jnp.array([0.1, 1.0, 10.0])

    def logdensity(x):
        return -0.5 * jnp.sum((x / scales) ** 2) - jnp.sum(jnp.log1p(x**2)) * 0.1

    key, start, tune, draws = jax.random.key(3), jnp.array([1.0, -2.0, 5.0]), 150, 40
    inverse_mass = postprocess._curvature_scaled_inverse_mass(logdensity, start)
    drawn, stats = jax.jit(
        lambda k: postprocess._adapted_nuts(
            logdensity, start, k, inverse_mass=inverse_mass, tune=tune, draws=draws,
            target_accept=0.9,
        )
    )(key)

    def blackjax_run(k):
        key_warmup, key_sample = jax.random.split(k)
        warmup = blackjax.staged_adaptation(
            blackjax.nuts, logdensity, metric="fisher_diag", target_acceptance_rate=0.9,
            initial_inverse_mass_matrix=inverse_mass,
            adaptation_info_fn=blackjax.adaptation.base.get_filter_adapt_info_fn(),
        )
        (state, parameters), _ = warmup.run(key_warmup, start, num_steps=tune)
        step = blackjax.nuts(logdensity, **parameters).step
        _, positions = jax.lax.scan(
            lambda s, k: (lambda new: (new, new.position))(step(k, s)[0]),
            state, jax.random.split(key_sample, draws),
        )
        return positions, parameters["step_size"]

    positions, adapted = jax.jit(blackjax_run)(key)
    np.testing.assert_array_equal(drawn, positions)
    np.testing.assert_array_equal(stats["step_size"], np.full(draws, adapted))
    assert adapted != 1.0  # it adapted from the starting step size


@dataclass(frozen=True)
class Funnel:
    """Neal's funnel (log scale v ~ N(0, 3²), x | v ~ N(0, e^v)), whose neck makes NUTS diverge,
    or with ``depth`` 0 a standard normal, where it does not; ``stats`` is only its dimension."""

    depth: float = 3.0
    target_accept: float = 0.8

    def logdensity(self, position, stats):
        v, x = position[0], position[1:]
        if not self.depth:
            return -0.5 * jnp.sum(position**2)
        return -0.5 * (v / self.depth) ** 2 - 0.5 * jnp.sum(x**2) * jnp.exp(-v) - 0.5 * x.size * v

    def initial(self, stats):
        return jnp.zeros_like(stats)

    def finish(self, positions, stats, key):
        return positions


def funnel_runs(target, keys, **options):
    return run_nuts(
        target, [jnp.zeros(10)] * len(keys), keys, tune=200, draws=300, chains=1,
        cache=cache(), cache_key="funnel", **options,
    )


@pytest.mark.parametrize("replicates", [False, True])
def test_a_fit_whose_nuts_diverged_is_drawn_again_with_smaller_steps(replicates):
    # The post-processing costs no privacy, so a diverging fit's sampler can simply run again.
    # Whether that run diverges less is the studies' to measure (REDRAW_TARGET_ACCEPT): in a
    # funnel as deep as this one some runs diverge at any acceptance rate.
    keys = [jax.random.key(k) for k in ((1, 7) if replicates else (7,))]
    first = [
        postprocess._nuts_program(Funnel(), 200, 300, 1, False, True, 0.8)(k, jnp.zeros(10))[1]
        for k in keys
    ]
    runs = funnel_runs(Funnel(), keys, replicates=replicates)
    for run, info in zip(runs, first, strict=True):
        assert info["diverging"].sum() > 0
        assert run.target_accept == REDRAW_TARGET_ACCEPT
        assert run.kept.shape == (1, 300, 10)
        assert run.info["step_size"].mean() < 0.8 * info["step_size"].mean()


@pytest.mark.parametrize("replicates", [False, True])
def test_a_fit_that_did_not_diverge_keeps_its_first_run(replicates):
    keys = [jax.random.key(k) for k in range(2 if replicates else 1)]
    runs = funnel_runs(Funnel(depth=0.0), keys, replicates=replicates)
    for run, key in zip(runs, keys, strict=True):
        drawn, info = postprocess._nuts_program(Funnel(0.0), 200, 300, 1, False, True, 0.8)(
            key, jnp.zeros(10)
        )
        assert not info["diverging"].any()
        assert run.target_accept == 0.8
        assert run.kept.shape == (1, 300, 10) and run.info["diverging"].shape == (1, 300)
        np.testing.assert_allclose(run.kept, drawn, rtol=1e-12)


def test_a_converged_laplace_fit_says_so():
    stats = stats_for(np.random.default_rng(4), np.array([0.2, softplus_inverse(VARIANCE)]))
    [laplace] = sample_laplace([stats], [jax.random.key(1)], draws=10, chains=1,
                               structure=ModelStructure(), cache=cache())
    assert laplace.fit_stats["newton_decrement"] < 1e-6
    assert laplace_convergence(laplace.fit_stats) is None


def test_a_laplace_fit_stopped_short_of_the_mode_says_so(monkeypatch):
    # One Newton step from the trace mean (a fresh cache, so the short fit is compiled anew).
    monkeypatch.setattr(postprocess, "LAPLACE_ITERATIONS", 1)
    stats = stats_for(np.random.default_rng(4), np.array([0.2, softplus_inverse(VARIANCE)]))
    [laplace] = sample_laplace([stats], [jax.random.key(1)], draws=10, chains=1,
                               structure=ModelStructure(), cache=cache())
    message = laplace_convergence(laplace.fit_stats)
    assert laplace.fit_stats["newton_decrement"] > postprocess.LAPLACE_TOLERANCE
    assert "has not converged" in message and "off-centre" in message


def test_a_laplace_fit_at_a_saddle_says_so():
    message = laplace_convergence({"newton_decrement": 0.0, "min_curvature": -2.0})
    assert "not concave" in message


def test_the_subsampling_noise_can_be_modelled():
    stats = stats_for(np.random.default_rng(5), np.array([0.0, softplus_inverse(VARIANCE)]))
    stats = stats._replace(subsampling_scale=jnp.array([50.0, 0.1]))
    [draws] = sample_nuts([stats], [jax.random.key(0)], tune=200, draws=200, chains=1,
                          structure=ModelStructure(subsampling=True), cache=cache())
    assert np.isfinite(draws.phi_star).all()


def simulate_correlated(rng, phi_star, a, noise_std, steps=8000):
    lr = 1e-3 / (KAPPA * np.diag(a).max())
    phi = np.zeros((steps + 1, len(phi_star)))
    grads = np.zeros((steps, len(phi_star)))
    phi[0] = phi_star + 0.3
    for t in range(steps):
        grads[t] = KAPPA * a @ (phi[t] - phi_star) + noise_std * rng.normal(size=len(phi_star))
        phi[t + 1] = phi[t] - lr * grads[t]
    return phi, grads


@pytest.mark.slow
def test_a_full_curvature_locates_the_optimum_of_a_correlated_objective():
    """Two model parameters whose ELBO Hessian in μ has correlation −0.78 (a simplex posterior),
    under the paper's trace-based prior: a diagonal A mislocates φ* (z-scores spread ≈ 2), the
    full μ-block much less."""
    rng = np.random.default_rng(6)
    u = float(softplus_inverse(VARIANCE))
    a = np.diag([1 / VARIANCE, 1 / VARIANCE, 0.5, 0.5])
    a[0, 1] = a[1, 0] = -0.78 / VARIANCE
    noise_std = np.array([400.0, 400.0, 0.4, 0.4])
    store = cache()
    z = {False: [], True: []}
    for k in range(40):
        phi_star = np.array([*(0.1 * rng.normal(size=2)), u, u])
        phi, grads = simulate_correlated(rng, phi_star, a, noise_std)
        stats = TraceStatistics.from_trace(phi, grads, burn_in=1000, noise_std=noise_std,
                                           rate=KAPPA, subsampling_scale=np.zeros(4),
                                           curvature_prior="trace")
        for full in (False, True):
            [draws] = sample_nuts([stats], [jax.random.key(k)], tune=300, draws=400, chains=1,
                                  structure=ModelStructure(full_curvature=full), cache=store)
            samples = draws.phi_star.reshape(-1, 4)[:, :2]
            z[full].append((samples.mean(axis=0) - phi_star[:2]) / samples.std(axis=0))
    full_z, diagonal_z = np.array(z[True]), np.array(z[False])
    assert np.all(full_z.std(axis=0) < 1.6) and np.all(np.abs(full_z.mean(axis=0)) < 0.6)
    assert diagonal_z.std(axis=0).max() > 1.2 * full_z.std(axis=0).max()


def _gauss_legendre_3():
    """Nodes z (n³, 3) and weights over the three partial correlations of a 3 × 3 matrix."""
    nodes, weights = np.polynomial.legendre.leggauss(60)
    z = np.stack(np.meshgrid(nodes, nodes, nodes, indexing="ij"), -1).reshape(-1, 3)
    w = np.prod(np.stack(np.meshgrid(weights, weights, weights, indexing="ij"), -1), -1).ravel()
    return z, w


def _lkj_density_through_cholesky(y, eta):
    """LKJ(η) of R = LLᵀ as Lewandowski, Kurowicka & Joe (2009) write it, det(R)^(η − 1) over
    its normaliser, in y through the Jacobian of :func:`correlation_cholesky`: the reference that
    :func:`partial_correlation_logp` must reproduce one partial correlation at a time."""
    n = 3
    chol, log_jac = correlation_cholesky(y, n)
    k = np.arange(1, n)
    log_normaliser = (
        0.5 * np.log(np.pi) * k.sum()
        + jnp.sum(jax.scipy.special.gammaln(eta + 0.5 * (n - 1 - k)))
        - (n - 1) * jax.scipy.special.gammaln(eta + 0.5 * (n - 1))
    )
    exponents = n - jnp.arange(2, n + 1) + 2 * eta - 2
    log_det_part = jnp.sum(exponents * jnp.log(jnp.diagonal(chol)[1:]))
    return jnp.exp(log_det_part + log_jac - log_normaliser)


@pytest.mark.parametrize("eta", [1.5, 3.0, 7.0])
def test_without_a_slab_the_correlation_prior_is_the_normalised_lkj_density(eta):
    """η is a parameter of the post-processing model, so the prior's normaliser must be right:
    with no slab the partial correlations' density is LKJ(η)'s, and it integrates to 1 over y
    (Gauss–Legendre in z = tanh y)."""
    z, w = _gauss_legendre_3()
    y = jnp.arctanh(jnp.asarray(z))
    ours = jnp.exp(jax.vmap(lambda v: partial_correlation_logp(v, 3, eta))(y))
    np.testing.assert_allclose(ours, jax.vmap(lambda v: _lkj_density_through_cholesky(v, eta))(y),
                               rtol=1e-9)
    np.testing.assert_allclose(float(jnp.sum(ours * w / np.prod(1 - z**2, axis=1))), 1.0,
                               rtol=1e-5)


def test_log_one_minus_tanh_squared_keeps_its_relative_precision_near_zero_and_far_out():
    """LKJ(η) multiplies log(1 − z²) by η, so an absolute error of 10⁻¹⁶ at small y (where the
    value is −y²) is a rough density at large η: the value must be right relative to itself."""
    y = np.array([1e-9, 1e-5, 0.3, 0.999, 1.0, 1.001, 5.0, 30.0, 400.0])
    # log(1 − tanh²y) = −2 log cosh y = −y² + y⁴/6 − … near 0, and −2|y| + 2 log 2 − 2 log1p(e^(−2|y|)) far out.
    reference = np.where(
        y < 1e-3, -(y**2) + y**4 / 6, -2 * np.log(np.cosh(np.minimum(y, 300.0)))
    )
    reference[-1] = -2 * 400.0 + 2 * np.log(2.0)
    np.testing.assert_allclose(np.asarray(log_sech_squared(jnp.asarray(y))), reference, rtol=1e-13)
    np.testing.assert_allclose(
        np.asarray(jax.vmap(jax.grad(log_sech_squared))(jnp.asarray(y))), -2 * np.tanh(y),
        rtol=1e-12,
    )


@pytest.mark.parametrize("log_eta", [5.0, 20.0, 32.0])
def test_the_correlation_prior_is_smooth_in_eta_however_large_eta_grows(log_eta):
    """A warm-up trajectory reached η ≈ 10¹⁴ where the release held every correlation near 0:
    the density must still change by its derivative's amount over a step of 10⁻⁹ in log η (it
    jumped by 12 there, and NUTS's step size fell to 10⁻¹³)."""
    y = jnp.full(66, 3e-7)

    def logp(r):
        return partial_correlation_logp(y, 12, 1 + jnp.exp(r))

    step = 1e-9
    slope = float(jax.grad(logp)(jnp.asarray(log_eta)))
    change = float(logp(jnp.asarray(log_eta + step)) - logp(jnp.asarray(log_eta)))
    assert np.isfinite(slope)
    assert abs(change - slope * step) < 1e-6


@pytest.mark.parametrize("barrier", [None, 2.0])
def test_the_slab_keeps_the_prior_normalised_and_only_widens_the_entries_it_is_given_to(barrier):
    """Each observed partial correlation is LKJ(η)'s with probability 1 − π and, with
    probability π, the alternative's (uniform, or ∝ exp(−atanh(z)²/2s²) with a barrier of width
    s): still a density, its variance (1 − π)·v_LKJ(η) + π·v', the others untouched."""
    eta, slab = 7.0, jnp.array([0.2, 0.0, 0.2])
    z, w = _gauss_legendre_3()
    y = jnp.arctanh(jnp.asarray(z))
    mass = np.asarray(
        jnp.exp(jax.vmap(lambda v: partial_correlation_logp(v, 3, eta, slab, barrier))(y))
    )
    mass = mass * w / np.prod(1 - z**2, axis=1)
    np.testing.assert_allclose(mass.sum(), 1.0, rtol=1e-5)
    lkj_variance = np.asarray(correlation_scales(eta, 3)) ** 2
    slab_variance = 1 / 3
    if barrier is not None:
        density = lambda c, k: c**k * np.exp(-0.5 * (np.arctanh(c) / barrier) ** 2)  # noqa: E731
        slab_variance = quad(density, -1, 1, args=(2,))[0] / quad(density, -1, 1, args=(0,))[0]
    expected = (1 - np.asarray(slab)) * lkj_variance + np.asarray(slab) * slab_variance
    # 60 Gauss–Legendre nodes in z resolve the barrier's approach to ±1 to about 10⁻⁵.
    np.testing.assert_allclose((mass[:, None] * z**2).sum(axis=0), expected, rtol=1e-4)


@pytest.mark.xfail(
    strict=True,
    reason="known: the slab is set on canonical partial correlations, which favours the first "
    "coordinate's correlations; an exchangeable form measured neutral on the class studies and "
    "is not the default (tutorials/RESULTS.md, stop 77)",
)
@pytest.mark.parametrize("barrier", [None, 2.0])
def test_the_slab_treats_every_coordinate_alike(barrier):
    """Numbering the coordinates differently must not change the prior of R: the density of R
    relative to LKJ(η)'s, with each correlation's slab weight carried along with it, is the
    same for R and for R with its rows and columns permuted.  (A slab on each canonical partial
    correlation in turn gives the first coordinate's correlations the most room.)"""
    n, eta = 5, 6.0
    rng = np.random.default_rng(3)
    factor = rng.standard_normal((n, n + 2))
    covariance = factor @ factor.T
    correlation = covariance / np.sqrt(np.outer(np.diag(covariance), np.diag(covariance)))
    weights = np.where(rng.random((n, n)) < 0.5, 0.2, 0.0)
    weights = np.tril(weights, -1) + np.tril(weights, -1).T
    rows, cols = np.tril_indices(n, -1)

    def tilt(order):
        permuted = correlation[np.ix_(order, order)]
        y = jnp.asarray(np.arctanh(partial_correlations(permuted)))
        slab = jnp.asarray(weights[np.ix_(order, order)][rows, cols])
        return float(
            partial_correlation_logp(y, n, eta, slab, barrier) - partial_correlation_logp(y, n, eta)
        )

    assert abs(tilt(np.arange(n))) > 0.1
    for order in ([4, 3, 2, 1, 0], [2, 0, 4, 1, 3], [1, 2, 3, 4, 0]):
        assert tilt(np.array(order)) == pytest.approx(tilt(np.arange(n)), abs=1e-9)


def _posterior_of_one_correlation(observed, slab, barrier):
    """Grid y and posterior weights of the first correlation of a 5 × 5 matrix under LKJ(6)
    (η taken up by weak correlations) mixed with the alternative, observed ± 0.12."""
    y = jnp.linspace(-8.0, 8.0, 4001)
    z = np.tanh(np.asarray(y))
    # The first partial correlation of column 0 is the correlation itself.
    prior = jax.vmap(
        lambda v: partial_correlation_logp(
            jnp.zeros(10).at[0].set(v), 5, 6.0, jnp.full(10, slab), barrier
        )
    )(y)
    log_post = np.asarray(prior) - 0.5 * ((z - observed) / 0.12) ** 2
    weight = np.exp(log_post - log_post.max())
    return np.asarray(y), weight / weight.sum()


def test_the_slab_lets_one_well_observed_strong_correlation_stand_where_eta_shrinks_the_rest():
    """LKJ(η) alone pulls a strong correlation observed at 0.8 ± 0.12 down to 0.61; with the
    barrier alternative at 0.2 it keeps nearly all of it (0.75), while one observed at 0.1
    stays where LKJ(η) puts it."""

    def posterior_mean(observed, slab):
        y, weight = _posterior_of_one_correlation(observed, slab, 2.0)
        return float((weight * np.tanh(y)).sum())

    assert posterior_mean(0.8, 0.0) < 0.62
    assert posterior_mean(0.8, 0.2) > 0.74
    assert abs(posterior_mean(0.1, 0.2) - posterior_mean(0.1, 0.0)) < 0.005


@pytest.mark.parametrize("observed", [1, 6, 10, 11, 21, 55, 435])
def test_among_weak_correlations_the_slab_expects_two_strong_ones_whatever_their_number(observed):
    """Up to ten observed correlations, all released near 0, each get the slab weight 0.2;
    beyond, the weights shrink so that the prior expects two of them to be strong.  Those the
    release does not observe do not count."""
    correlation = jnp.concatenate([jnp.full(observed, 0.1), jnp.full(5, 0.9)])
    std = jnp.concatenate([jnp.full(observed, 0.1), jnp.full(5, UNINFORMATIVE_DEVIATION)])
    weight = float(correlation_slab_weights(correlation, std)[0])
    assert weight == pytest.approx(min(CORRELATION_SLAB_WEIGHT, 2 / observed))


def test_the_slab_expects_as_many_strong_correlations_as_the_release_shows():
    """Of 21 observed correlations, those released beyond three of their standard deviations
    from 0 count as strong: with 12 of them the weight is 12/21 capped at 0.2, with 3 it is
    3/21."""
    std = jnp.full(21, 0.1)
    many = jnp.where(jnp.arange(21) < 12, 0.5, 0.05)
    few = jnp.where(jnp.arange(21) < 3, -0.5, 0.29)
    assert float(correlation_slab_weights(many, std)[0]) == CORRELATION_SLAB_WEIGHT
    assert float(correlation_slab_weights(few, std)[0]) == pytest.approx(3 / 21)


def test_among_many_weak_correlations_each_stays_on_the_spike_that_eta_gives_it():
    """One of the 10-D regression's 55 observed correlations, released at 0.05 ± 0.17 with η
    learned at 5000: at 0.2 each, 4 % of its posterior lies off LKJ(η)'s spike (|z| > 0.05), a
    second mode for each of 55 coordinates of NUTS; at the weight for 55 weak ones under 1 %."""
    y = jnp.linspace(-8.0, 8.0, 40001)
    z = np.tanh(np.asarray(y))

    def mass_off_the_spike(weight):
        prior = jax.vmap(
            lambda v: partial_correlation_logp(
                jnp.zeros(55).at[0].set(v), 11, 5000.0, jnp.full(55, weight), 2.0
            )
        )(y)
        log_post = np.asarray(prior) - 0.5 * ((z - 0.05) / 0.17) ** 2
        posterior = np.exp(log_post - log_post.max())
        return posterior[np.abs(z) > 0.05].sum() / posterior.sum()

    assert mass_off_the_spike(CORRELATION_SLAB_WEIGHT) > 0.03
    weak = float(correlation_slab_weights(jnp.zeros(55), jnp.full(55, 0.17))[0])
    assert mass_off_the_spike(weak) < 0.01


def test_the_barrier_keeps_a_correlation_observed_near_one_away_from_singular_matrices():
    """Observed at −0.99, the uniform alternative's tail in y = atanh(z) is exp(−2|y|), long
    enough for NUTS to reach nearly singular matrices (divergent transitions in 2 of 200 demo
    fits); the barrier's is Gaussian, with a fraction of the uniform's mass beyond |y| = 4."""

    def mass_beyond(barrier):
        y, weight = _posterior_of_one_correlation(-0.99, 0.2, barrier)
        return float(weight[np.abs(y) > 4].sum())

    assert mass_beyond(2.0) < 0.3 * mass_beyond(None)


@pytest.mark.parametrize("eta", [1.5, 7.0, 40.0])
def test_the_correlation_scales_are_the_lkj_priors_standard_deviations(eta):
    """NUTS sees each correlation the release leaves to the prior divided by its scale under
    LKJ(η) where η is learned: the scales are the standard deviations of the canonical partial
    correlations z = tanh y that the LKJ density itself gives (3 × 3, Gauss–Legendre in z)."""
    z, w = _gauss_legendre_3()
    y = jnp.arctanh(jnp.asarray(z))
    density = jax.vmap(lambda v: _lkj_density_through_cholesky(v, eta))(y)
    mass = np.asarray(density) * w / np.prod(1 - z**2, 1)
    variance = (mass[:, None] * z**2).sum(axis=0) / mass.sum()
    np.testing.assert_allclose(np.sqrt(variance), correlation_scales(eta, 3), rtol=1e-5)


@pytest.mark.parametrize(
    ("lkj_eta", "observed"),
    [(None, False), (None, True), (2.0, False)],
    ids=["learned-eta", "learned-eta-observed", "fixed-eta"],
)
def test_the_samplers_coordinates_are_a_change_of_variables_of_the_model(lkj_eta, observed):
    """Where η is learned NUTS samples the correlations that the release leaves to the prior
    non-centred: its coordinates map to the model's parameters and back, and the log density it
    sees carries the map's exact log-Jacobian.  A correlation the release observes, or any with
    a fixed η, is the model's parameter."""
    from dpppl_na_dpvi.postprocess import _from_sampler, _to_sampler

    stats = correlated_stats(np.random.default_rng(7))
    if not observed:
        stats = stats._replace(fisher_correlation_std=jnp.full(1, UNINFORMATIVE_DEVIATION))
    structure = ModelStructure(full_curvature=True, integrated_optimum=True, lkj_eta=lkj_eta,
                               correlation_prior="released-likelihood")
    base = initial_position(stats, structure)
    position = base + 0.3 * jnp.asarray(np.random.default_rng(9).normal(size=base.shape))
    params, log_jacobian = _from_sampler(position, stats, structure)
    np.testing.assert_allclose(_to_sampler(params, stats, structure), position, rtol=1e-12)
    jacobian = jax.jacfwd(lambda p: _from_sampler(p, stats, structure)[0])(position)
    np.testing.assert_allclose(log_jacobian, np.linalg.slogdet(jacobian)[1], atol=1e-12)
    if lkj_eta is None and not observed:
        assert not np.allclose(params, position)
    else:
        np.testing.assert_array_equal(params, position)


def test_the_correlation_factor_is_a_valid_cholesky_of_a_correlation_matrix():
    from dpppl_na_dpvi.postprocess import correlation_cholesky

    chol, _ = correlation_cholesky(jnp.array([0.3, -1.2, 2.0]), 3)
    corr = np.asarray(chol @ chol.T)
    np.testing.assert_allclose(np.diag(corr), 1.0)
    assert np.all(np.linalg.eigvalsh(corr) > 0)


def random_correlation(rng, n):
    factor = rng.normal(size=(n, 2 * n))
    covariance = factor @ factor.T
    root = np.sqrt(np.diag(covariance))
    return covariance / np.outer(root, root)


def correlation_of(y, n):
    chol, _ = correlation_cholesky(jnp.asarray(y), n)
    return np.asarray(chol @ chol.T)


def test_partial_correlations_invert_the_correlation_factor():
    rng = np.random.default_rng(12)
    for n in (2, 3, 6):
        correlation = random_correlation(rng, n)
        y = np.arctanh(partial_correlations(correlation))
        np.testing.assert_allclose(correlation_of(y, n), correlation, atol=1e-12)


class TestTheReleasedCorrelationPrior:
    """The prior of A's μ-block correlation from the released Fisher information."""

    def test_without_noise_it_is_centred_on_the_fishers_correlation(self):
        rng = np.random.default_rng(13)
        correlation = random_correlation(rng, 4)
        scales = np.array([3.0, 0.5, 1.0, 20.0])  # clipping and standardisation: any scale
        fisher = correlation * np.outer(scales, scales)
        centre, width = released_correlation_prior(fisher, 0.0)
        np.testing.assert_allclose(correlation_of(centre, 4), correlation, atol=1e-12)
        np.testing.assert_allclose(width, postprocess.RELEASED_CORRELATION_WIDTH)

    def test_its_width_grows_with_the_releases_noise(self):
        fisher = random_correlation(np.random.default_rng(14), 3)
        widths = [
            released_correlation_prior(fisher, noise)[1]
            for noise in (0.0, 0.05, 0.2)
        ]
        assert np.all(widths[0] < widths[1]) and np.all(widths[1] < widths[2])
        # 0.05 of unit information moves a partial correlation by about that much.
        assert np.all(widths[1] ** 2 - widths[0] ** 2 > 0.02**2)

    def test_a_coordinate_without_released_information_gets_no_correlation_from_it(self):
        fisher = np.array([[1.0, 0.9, 0.5], [0.9, 1.0, 0.3], [0.5, 0.3, -0.1]])
        centre, _ = released_correlation_prior(fisher, 0.0)
        correlation = correlation_of(centre, 3)
        np.testing.assert_allclose(correlation[2, :2], 0.0, atol=1e-12)
        assert correlation[0, 1] > 0.8

    def test_an_indefinite_release_gives_a_well_conditioned_centre(self):
        fisher = np.array([[1.0, 0.99, -0.99], [0.99, 1.0, 0.99], [-0.99, 0.99, 1.0]])
        centre, width = released_correlation_prior(fisher, 0.3)
        eigenvalues = np.linalg.eigvalsh(correlation_of(centre, 3))
        # Floored, then rescaled to a unit diagonal (which can lower it by the diagonal's growth).
        assert eigenvalues.min() >= postprocess.RELEASED_CORRELATION_FLOOR / 2
        assert np.all(np.isfinite(width))


class TestTheReleasedCorrelationLikelihood:
    """The released Fisher information read as an observation of the records' share of A's
    μ-block, beside its LKJ prior."""

    def test_without_noise_it_observes_the_fishers_correlations_at_the_fixed_width(self):
        rng = np.random.default_rng(15)
        correlation = random_correlation(rng, 4)
        scales = np.array([3.0, 0.5, 1.0, 20.0])
        observed, std = released_fisher_correlations(
            correlation * np.outer(scales, scales), 0.0
        )
        rows, cols = np.tril_indices(4, -1)
        np.testing.assert_allclose(observed, correlation[rows, cols], atol=1e-12)
        np.testing.assert_allclose(std, postprocess.RELEASED_CORRELATION_WIDTH)

    def test_its_deviations_grow_with_the_releases_noise_as_redraws_of_it_say(self):
        fisher = np.eye(3)
        _, std = released_fisher_correlations(fisher, 0.1)
        # A correlation of two unit informations moves by about the noise of their cross term.
        noise = np.sqrt(std**2 - postprocess.RELEASED_CORRELATION_WIDTH**2)
        np.testing.assert_allclose(noise, 0.1, rtol=0.25)

    def test_a_coordinate_without_released_information_observes_nothing(self):
        fisher = np.array([[1.0, 0.9, 0.5], [0.9, 1.0, 0.3], [0.5, 0.3, -0.1]])
        _, std = released_fisher_correlations(fisher, 0.0)
        # Entries (1, 0), (2, 0), (2, 1): only the first is between informative coordinates.
        assert std[0] == postprocess.RELEASED_CORRELATION_WIDTH
        np.testing.assert_array_equal(std[1:], postprocess.UNINFORMATIVE_DEVIATION)

    @pytest.mark.parametrize("information", [1.0, 2.0, 3.0, 5.0, 10.0])
    def test_pure_noise_is_not_read_as_correlation(self, information):
        """Uncorrelated coordinates whose released information is a few noise standard
        deviations: a correlation read off the noise is no further from 0 than its deviation
        says (mean squared ratio about 1 or less; 2.1 when every positive diagonal was read)."""
        rng = np.random.default_rng(17)
        n = 12
        ratios = []
        for _ in range(40):
            noise = rng.normal(size=(n, n))
            released = information * np.eye(n) + np.triu(noise) + np.triu(noise, 1).T
            observed, std = released_fisher_correlations(released, 1.0)
            read = std < postprocess.UNINFORMATIVE_DEVIATION
            ratios.append(observed[read] / std[read])
        assert np.mean(np.concatenate(ratios) ** 2) < 1.3

    def test_it_favours_the_correlation_the_release_observed(self):
        """R is the correlation of the records' share: the released correlation is the
        density's best, and a share without it is worse."""
        rng = np.random.default_rng(16)
        n = 3
        share = random_correlation(rng, n) * 4.0
        stats = TraceStatistics.from_trace(
            rng.normal(size=(201, 2 * n)), rng.normal(size=(200, 2 * n)), burn_in=0,
            noise_std=np.ones(2 * n), rate=KAPPA, subsampling_scale=np.zeros(2 * n),
            released_curvature=(share * 7.0, 0.0, lambda phi: np.diag([1.0, 0.5, 2.0])),
        )
        truth = np.arctanh(partial_correlations(share / 4.0))

        def released_term(y):
            chol, _ = correlation_cholesky(jnp.asarray(y), n)
            return postprocess._released_likelihood(
                chol, stats.fisher_correlation, stats.fisher_correlation_std
            )

        assert float(released_term(truth)) == pytest.approx(0.0, abs=1e-9)
        assert float(released_term(np.zeros_like(truth))) < -1.0


class TestTheStructuredCurvature:
    """Where the curvature is released, A's μ-block is the model's prior curvature P, which is
    public and exact, plus the records' share D^½ R D^½, whose correlation R the release
    observes: the correlations the prior makes (a group mean with its groups' intercepts) are
    not shrunk with the records' (which a hierarchical prior does not have)."""

    @staticmethod
    def stats(prior, phi_bar_u, fisher):
        n = prior.shape[0]
        rng = np.random.default_rng(17)
        phi = rng.normal(scale=1e-3, size=(201, 2 * n))
        phi[:, n:] += phi_bar_u - phi[:, n:].mean(axis=0)
        return TraceStatistics.from_trace(
            phi, rng.normal(size=(200, 2 * n)), burn_in=0, noise_std=np.ones(2 * n),
            rate=KAPPA, subsampling_scale=np.zeros(2 * n),
            released_curvature=(fisher, 0.0, lambda phi: prior),
        )

    def test_the_records_share_of_the_diagonal_is_what_the_prior_leaves(self):
        prior = np.array([[3.0, 2.0, 0.0], [2.0, 2.0, 0.0], [0.0, 0.0, 0.0]])
        u = np.asarray(softplus_inverse(np.array([0.2, 0.1, 0.5])))  # A's diagonal 5, 10, 2
        stats = self.stats(prior, u, np.eye(3))
        share = np.exp(np.asarray(stats.prior_v_mean[:3]))
        np.testing.assert_allclose(share, np.array([5.0, 10.0, 2.0]) - [3.0, 2.0, 0.0],
                                   rtol=1e-2)

    def test_the_prior_keeps_its_correlations_whatever_the_records_share(self):
        prior = np.array([[3.0, 2.0, 0.0], [2.0, 2.0, 0.0], [0.0, 0.0, 0.0]])
        u = np.asarray(softplus_inverse(np.array([0.2, 0.1, 0.5])))
        stats = self.stats(prior, u, np.eye(3))
        n_corr = 3
        position = jnp.concatenate([stats.prior_v_mean, jnp.zeros(n_corr)])
        mu_block, _ = postprocess.curvature_blocks(
            jnp.concatenate([jnp.zeros(6), position]), stats, True
        )
        share = np.diag(np.exp(np.asarray(stats.prior_v_mean[:3])))
        np.testing.assert_allclose(np.asarray(mu_block), prior + share, rtol=1e-12)

    def test_a_prior_curvature_that_is_not_positive_is_made_so(self):
        """A funnel's prior curvature can be indefinite; A must stay positive definite."""
        prior = np.array([[1.0, 2.0], [2.0, 1.0]])  # eigenvalues 3 and −1
        kept = postprocess.fitted_prior_curvature(prior, np.full(2, 100.0))
        np.testing.assert_allclose(kept, np.full((2, 2), 1.5), rtol=1e-12)

    def test_a_prior_curvature_beyond_qs_precision_is_scaled_into_it(self):
        """A's diagonal keeps its centre, q's precision: P takes at most all but
        LIKELIHOOD_SHARE_FLOOR of it, with its correlations kept."""
        prior = np.array([[4.0, 1.8], [1.8, 1.0]])
        diagonal = np.array([2.0, 10.0])
        kept = postprocess.fitted_prior_curvature(prior, diagonal)
        room = 1 - postprocess.LIKELIHOOD_SHARE_FLOOR
        np.testing.assert_allclose(np.diagonal(kept), [room * 2.0, 1.0], rtol=1e-12)
        np.testing.assert_allclose(kept[0, 1] / np.sqrt(kept[0, 0] * kept[1, 1]), 0.9,
                                   rtol=1e-12)
        stats = self.stats(prior, np.asarray(softplus_inverse(1 / diagonal)), np.eye(2))
        a_diagonal = np.diagonal(np.asarray(stats.prior_curvature)) + np.exp(
            np.asarray(stats.prior_v_mean[:2])
        )
        np.testing.assert_allclose(a_diagonal, diagonal, rtol=1e-2)


@pytest.mark.parametrize(
    ("full", "released"), [(True, False), (False, False), (True, True)],
    ids=["full", "diagonal", "prior-plus-records"],
)
def test_the_stored_diagonal_and_correlations_rebuild_every_curvature_matrix(full, released):
    """Draws keep A by its diagonal and the correlations of its μ-block, not d × d numbers each."""
    from dpppl_na_dpvi.postprocess import (
        _to_draws,
        curvature,
        curvature_matrices,
        n_shape_parameters,
    )

    rng = np.random.default_rng(7)
    d = 6
    prior = np.array([[2.0, 1.0, 0.0], [1.0, 1.0, 0.0], [0.0, 0.0, 0.5]])
    stats = TraceStatistics.from_trace(
        rng.normal(size=(201, d)), rng.normal(size=(200, d)), burn_in=0, noise_std=np.ones(d),
        rate=KAPPA, subsampling_scale=np.zeros(d),
        released_curvature=(np.eye(3), 0.1, lambda phi: prior) if released else None,
    )
    size = 2 * d + n_shape_parameters(stats, ModelStructure(full_curvature=full))
    positions = rng.normal(size=(2, 5, size))
    draws = _to_draws(jnp.asarray(positions), stats, ModelStructure(full_curvature=full), {})
    expected = np.stack([curvature(p, stats, full) for p in positions.reshape(-1, size)])
    rebuilt = curvature_matrices(draws.curvature_diagonal, draws.mu_correlation)
    np.testing.assert_allclose(rebuilt, expected.reshape(2, 5, d, d), rtol=1e-12, atol=1e-12)
    assert draws.mu_correlation.shape == (2, 5, 3 if full else 0)


def correlated_stats(rng):
    a = np.diag([1 / VARIANCE, 1 / VARIANCE, 0.5, 0.5])
    a[0, 1] = a[1, 0] = -0.78 / VARIANCE
    noise_std = np.array([400.0, 400.0, 0.4, 0.4])
    phi_star = np.array([0.05, -0.02, *[float(softplus_inverse(VARIANCE))] * 2])
    phi, grads = simulate_correlated(rng, phi_star, a, noise_std, steps=3000)
    # A released Fisher information with the μ-block's correlation (read by the released prior).
    released = (a[:2, :2] * 1e-3, 0.05, lambda phi: np.zeros((2, 2)))
    return TraceStatistics.from_trace(phi, grads, burn_in=500, noise_std=noise_std, rate=KAPPA,
                                      subsampling_scale=np.full(4, 50.0), curvature_prior="trace",
                                      # As narrow as the trace's information about δ, so the
                                      # model-bounded prior differs from the unit-information one.
                                      model_prior=(np.array([0.1, 0.0]), np.array([0.01, 0.03]),
                                                   np.array([True, True])),
                                      released_curvature=released)


@pytest.mark.parametrize("optimum_prior", ["unit-information", "standard-normal"])
@pytest.mark.parametrize("subsampling", [False, True])
@pytest.mark.parametrize(
    ("lkj_eta", "correlation_prior"),
    [(2.0, "lkj"), (None, "lkj"), (2.0, "released"), (2.0, "released-likelihood")],
    ids=["fixed-eta", "learned-eta", "released", "released-likelihood"],
)
def test_the_integrated_density_is_the_sampled_one_with_the_optimum_integrated_out(
    subsampling, optimum_prior, lkj_eta, correlation_prior
):
    """The density is Gaussian in δ, so Laplace's formula is exact:
    log ∫ p(δ, ψ) dδ = log p(δ̂, ψ) + (d/2) log 2π − ½ log |−H|, and the Gaussian prior's
    constant (2π)^(−d/2) is what the sampled density leaves out.  (The unit-information prior's
    integral has a closed form free of A, which this checks against the general one.)"""
    stats = correlated_stats(np.random.default_rng(7))
    sampled = ModelStructure(full_curvature=True, subsampling=subsampling,
                             optimum_prior=optimum_prior, lkj_eta=lkj_eta,
                             correlation_prior=correlation_prior)
    integrated = ModelStructure(full_curvature=True, subsampling=subsampling,
                                integrated_optimum=True, optimum_prior=optimum_prior,
                                lkj_eta=lkj_eta, correlation_prior=correlation_prior)
    rng = np.random.default_rng(8)
    base = initial_position(stats, integrated)
    for _ in range(3):
        psi = base + 0.2 * jnp.asarray(rng.normal(size=base.shape))
        full = lambda delta, psi=psi: log_density(jnp.concatenate([delta, psi]), stats, sampled)
        hessian = jax.hessian(full)(jnp.zeros(4))
        optimum = -jnp.linalg.solve(hessian, jax.grad(full)(jnp.zeros(4)))
        expected = full(optimum) - 0.5 * jnp.linalg.slogdet(-hessian)[1]
        np.testing.assert_allclose(log_density(psi, stats, integrated), expected, rtol=1e-9)


def test_the_model_bounded_prior_holds_the_optimum_by_the_models_prior_and_leaves_a_alone():
    """A's density is the unit-information one; δ | A is its unit-information conditional times
    the model's prior N(b, P_m⁻¹) of the μ-coordinates (b = centre − φ̄)."""
    stats = correlated_stats(np.random.default_rng(9))
    unit = ModelStructure(full_curvature=True, integrated_optimum=True)
    bounded = ModelStructure(full_curvature=True, integrated_optimum=True,
                             optimum_prior="model-bounded")
    psi = initial_position(stats, unit) + 0.05
    assert log_density(psi, stats, bounded) == log_density(psi, stats, unit)
    # The unit-information conditional N(m, C), from the sampled density's exact quadratic.
    sampled = ModelStructure(full_curvature=True)
    full = lambda delta: log_density(jnp.concatenate([delta, psi]), stats, sampled)
    precision = -np.asarray(jax.hessian(full)(jnp.zeros(4)))
    shift = np.asarray(jax.grad(full)(jnp.zeros(4)))
    model_precision = np.diag(np.asarray(stats.model_precision))
    covariance = np.linalg.inv(precision + model_precision)
    mean = covariance @ (shift + model_precision @ np.asarray(stats.model_offset))
    keys = jax.random.split(jax.random.key(0), 20_000)
    draws = np.asarray(jax.vmap(lambda k: draw_optimum(psi, stats, bounded, k))(keys))
    sd = np.sqrt(np.diag(covariance))
    assert np.all(np.abs(draws.mean(axis=0) - mean) < 4 * sd / np.sqrt(len(draws)))
    np.testing.assert_allclose(np.cov(draws.T), covariance, rtol=0.05, atol=0.05 * sd.max() ** 2)
    # The model's prior matters here: its scale is about the trace's own sd of μ*.
    unit_sd = np.sqrt(np.diag(np.linalg.inv(precision)))
    assert np.all(sd[:2] < 0.9 * unit_sd[:2])


def test_the_optimum_is_drawn_exactly_from_its_conditional():
    stats = correlated_stats(np.random.default_rng(9))
    sampled = ModelStructure(full_curvature=True)
    integrated = ModelStructure(full_curvature=True, integrated_optimum=True)
    psi = initial_position(stats, integrated)
    full = lambda delta: log_density(jnp.concatenate([delta, psi]), stats, sampled)
    hessian = jax.hessian(full)(jnp.zeros(4))
    covariance = np.linalg.inv(-np.asarray(hessian))
    mean = covariance @ np.asarray(jax.grad(full)(jnp.zeros(4)))
    keys = jax.random.split(jax.random.key(0), 20_000)
    draws = np.asarray(jax.vmap(lambda k: draw_optimum(psi, stats, integrated, k))(keys))
    sd = np.sqrt(np.diag(covariance))
    assert np.all(np.abs(draws.mean(axis=0) - mean) < 4 * sd / np.sqrt(len(draws)))
    np.testing.assert_allclose(np.cov(draws.T), covariance, rtol=0.05, atol=0.05 * sd.max() ** 2)


A_TWO = np.array([1 / VARIANCE, 1 / VARIANCE, 0.5, 0.5])
NOISE_TWO = np.array([300.0, 300.0, 0.4, 0.4])
#: How far a squared wander of the first coordinate moves the second one's gradient: with the
#: wander's variance (≈ 0.045 here) it shifts the trace mean of the second coordinate by about
#: five posterior standard deviations, as the weights' wander moves log σ² in a regression.
BEND = 5.0


def bent_gradient(rng, phi, phi_star):
    """κA(φ − φ*) plus the bend: the second coordinate's gradient falls with the first's squared
    distance from its optimum, so the trace's mean of it is not its optimum."""
    x = phi - phi_star
    mean = KAPPA * A_TWO * x
    mean[1] -= KAPPA * A_TWO[1] * BEND * x[0] ** 2
    return mean + NOISE_TWO * rng.normal(size=4)


def simulate_bent_trace(rng, phi_star, *, free=5000, anchored=0, burn_in=1000):
    lr = 0.01 / (KAPPA * A_TWO)
    phi = np.zeros((burn_in + free + anchored + 1, 4))
    grads = np.zeros((burn_in + free + anchored, 4))
    phi[0] = phi_star
    for t in range(len(grads)):
        if anchored and t == burn_in + free:
            phi[t] = phi[burn_in:t].mean(axis=0)
        grads[t] = bent_gradient(rng, phi[t], phi_star)
        moving = t < burn_in + free or not anchored
        phi[t + 1] = phi[t] - lr * grads[t] if moving else phi[t]
    return phi, grads


def test_an_anchored_trace_gives_the_density_of_the_full_trace_with_its_free_offset_integrated_out():
    rng = np.random.default_rng(10)
    phi_star = np.array([0.1, -0.2, *[float(softplus_inverse(VARIANCE))] * 2])
    phi, grads = simulate_bent_trace(rng, phi_star, free=300, anchored=200, burn_in=100)
    stats = TraceStatistics.from_trace(phi, grads, burn_in=100, noise_std=NOISE_TWO, rate=KAPPA,
                                       subsampling_scale=np.zeros(4), anchored=200)
    structure = ModelStructure(optimum_prior="standard-normal")
    anchor = phi[400]
    np.testing.assert_allclose(stats.phi_bar, anchor)

    def direct(params):
        delta, v = params[:4], params[4:]
        residual = grads - KAPPA * np.exp(v) * (phi[:-1] - anchor - delta)
        free, fixed = residual[100:400], residual[400:]
        # A flat prior on the free steps' offset b integrates to their centred residuals (times
        # a constant, since the noise variance is fixed here).
        squares = ((free - free.mean(axis=0)) ** 2).sum(axis=0) + (fixed**2).sum(axis=0)
        return (
            -0.5 * np.sum(squares / NOISE_TWO**2)
            + scipy.stats.norm.logpdf(delta).sum()
            + scipy.stats.norm.logpdf(v, stats.prior_v_mean, stats.prior_v_std).sum()
        )

    v = np.asarray(stats.prior_v_mean)
    a = np.concatenate([[0.01, -0.02, 0.03, -0.01], v + 0.1])
    b = np.concatenate([[-0.03, 0.05, -0.02, 0.02], v - 0.2])
    np.testing.assert_allclose(
        log_density(jnp.asarray(a), stats, structure) - log_density(jnp.asarray(b), stats, structure),
        direct(a) - direct(b),
        rtol=1e-8,
    )


def test_an_anchored_phase_locates_the_optimum_where_the_gradient_bends():
    """The trace mean of a coordinate whose gradient is not linear is off its optimum: read as the
    optimum, it misplaces it by several posterior standard deviations.  Gradients released at
    the anchor locate it (20 simulated traces of each design, the same total number of steps)."""
    rng = np.random.default_rng(11)
    u = float(softplus_inverse(VARIANCE))
    truths = [np.array([*(0.1 * rng.normal(size=2)), u, u]) for _ in range(20)]
    z = {}
    for anchored in (0, 2500):
        stats = []
        for phi_star in truths:
            phi, grads = simulate_bent_trace(rng, phi_star, free=5000 - anchored, anchored=anchored)
            stats.append(TraceStatistics.from_trace(
                phi, grads, burn_in=1000, noise_std=NOISE_TWO, rate=KAPPA,
                subsampling_scale=np.zeros(4), anchored=anchored,
            ))
        draws = sample_nuts(stats, [jax.random.key(k) for k in range(20)], tune=300, draws=500,
                            chains=1, structure=ModelStructure(integrated_optimum=True),
                            cache=cache(), replicates=True)
        samples = [one.phi_star.reshape(-1, 4)[:, 1] for one in draws]
        z[anchored] = np.array([(s.mean() - t[1]) / s.std() for s, t in zip(samples, truths)])
    assert z[0].mean() > 2
    assert abs(z[2500].mean()) < 0.6 and 0.5 < z[2500].std() < 1.6

