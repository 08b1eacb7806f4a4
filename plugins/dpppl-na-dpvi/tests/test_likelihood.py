"""The likelihood model reads the release as a noisy observation of the records' log-likelihood
and draws θ under the model's own prior: its density is the trace's likelihood with the
likelihood's centre integrated out, and its posterior is the exact one where the model's
assumptions hold, bounded by the prior where the privacy noise leaves θ unlocated."""

from __future__ import annotations

import json
import warnings

import jax
import jax.numpy as jnp
import numpy as np
import pymc as pm
import pytest
import scipy.special
import scipy.stats

import dpppl
from dpppl.plugin import softplus_inverse
from dpppl_na_dpvi.convergence import DRIFT_LIMIT
from dpppl_na_dpvi.likelihood import (
    LikelihoodStatistics,
    LikelihoodStructure,
    LikelihoodTarget,
    _release_logp,
    sample_likelihood,
    scatter_warning,
)
from dpppl_na_dpvi.postprocess import CORRELATION_SLAB_WEIGHT, correlation_cholesky

KAPPA = 0.1


def softplus(u):
    return np.logaddexp(0.0, u)


def sigmoid(u):
    return 1 / (1 + np.exp(-u))


class GaussianWorld:
    """One parameter θ ~ N(0, prior_sd²) and a records' log-likelihood −½F(θ − θ̂)², with
    θ̂ ~ N(θ, 1/F); DP-SGD on the mean-field ELBO of q = N(μ, softplus(u)) releases
    g̃_t = κ ∇(ELBO loss)(φ_t) + noise, exactly as the likelihood model describes it."""

    def __init__(self, information=400.0, prior_sd=0.05, noise=(600.0, 0.05), unstated=1.0):
        """``unstated``: the gradients' noise sd as a multiple of the stated ``noise``, as the
        sampling of records makes it where it adds noise the release does not state."""
        self.information, self.prior_sd = information, prior_sd
        self.noise = np.asarray(noise)
        self.unstated = unstated

    def prior_part_gradient(self, phis):
        """∇ of E_q[log q − log p(θ)] for the normal prior: μ/s², and in u the entropy's and
        the prior's shares of the variance's gradient."""
        mu, u = phis[:, 0], phis[:, 1]
        precision = self.prior_sd**-2.0
        du = sigmoid(u) * (0.5 * precision - 0.5 / softplus(u))
        return np.stack([precision * mu, du], axis=1)

    def logprior(self, theta):
        return jnp.sum(jax.scipy.stats.norm.logpdf(theta, 0.0, self.prior_sd))

    def release(self, rng, theta_hat, steps=4000, rate=0.003):
        f = self.information
        phi = np.zeros((steps + 1, 2))
        grads = np.zeros((steps, 2))
        phi[0] = [theta_hat + 0.01, softplus_inverse(1 / f)]
        total = f + self.prior_sd**-2.0
        lr = np.array([rate / (KAPPA * total), 2 * rate / KAPPA])
        for t in range(steps):
            records = np.array([f * (phi[t, 0] - theta_hat), 0.5 * f * sigmoid(phi[t, 1])])
            exact = KAPPA * (records + self.prior_part_gradient(phi[t : t + 1])[0])
            grads[t] = exact + self.unstated * self.noise * rng.normal(size=2)
            phi[t + 1] = phi[t] - lr * grads[t]
        return phi, grads

    def statistics(self, phi, grads, start=0):
        return LikelihoodStatistics.from_trace(
            phi,
            grads,
            start=start,
            noise_std=self.noise,
            rate=KAPPA,
            records=np.array([True]),
            prior_part_gradient=self.prior_part_gradient,
            prior_curvature=lambda phi: np.array([[self.prior_sd**-2.0]]),
            prior_point=np.zeros(1),
        )

    def exact_posterior(self, stats):
        """θ's posterior given F at its true value: the prior times N(m; θ, 1/F + 1/Λ)."""
        f = self.information
        m = float(stats.centre[0] - stats.mean_gradient[0] / (KAPPA * f))
        spread = float(stats.noise_var[0]) / (float(stats.count) * KAPPA**2 * f**2)
        precision = self.prior_sd**-2.0 + 1 / (1 / f + spread)
        return m / (1 / f + spread) / precision, precision**-0.5


STRUCTURE = LikelihoodStructure(records=(True,), full=False, released=False)


def cache():
    store = {}
    return lambda key, factory: store[key] if key in store else store.setdefault(key, factory())


def grid_posterior(logprior, information, stats, grid):
    """Unnormalised weights of θ's posterior given F on ``grid``: the prior times the release."""
    information = jnp.array([[information]])
    log_post = jax.vmap(lambda t: logprior(t[None]) + _release_logp(t[None], information, stats))(
        grid
    )
    return np.exp(np.asarray(log_post) - float(log_post.max()))


def test_the_release_density_is_the_trace_likelihood_with_the_centre_integrated_out():
    # Brute force on a grid of θ̂: Σ_t log N(r_t; κF(μ_t − θ̂), V) + the u-gradients' terms +
    # log N(θ̂; θ, 1/F), integrated over θ̂ by quadrature, against the closed form, for several
    # (θ, F): equal up to one constant.  The μ-gradients' noise is the one the statistics state
    # (the release's, or the gradients' scatter where larger).
    world = GaussianWorld()
    rng = np.random.default_rng(0)
    phi, grads = world.release(rng, theta_hat=0.02, steps=600)
    stats = world.statistics(phi, grads)
    residual = grads - KAPPA * world.prior_part_gradient(phi[:-1])
    grid = np.linspace(-0.6, 0.6, 40001)
    differences = []
    for theta, f in [(0.0, 400.0), (0.05, 300.0), (-0.04, 500.0), (0.02, 420.0)]:
        mu_term = -0.5 * (
            (residual[:, 0, None] - KAPPA * f * (phi[:-1, 0, None] - grid)) ** 2
        ).sum(axis=0) / float(stats.noise_var[0])
        u_term = -0.5 * (
            (residual[:, 1] - 0.5 * KAPPA * f * sigmoid(phi[:-1, 1])) ** 2
        ).sum() / world.noise[1] ** 2
        centre = scipy.stats.norm.logpdf(grid, theta, f**-0.5)
        brute = scipy.special.logsumexp(mu_term + centre) + np.log(grid[1] - grid[0]) + u_term
        closed = float(_release_logp(jnp.array([theta]), jnp.array([[f]]), stats))
        differences.append(brute - closed)
    assert np.ptp(differences) < 1e-6


def test_the_posterior_is_the_exact_one_under_a_prior_that_binds():
    # The privacy noise leaves θ̂ uncertain by 0.24, five times the prior's sd: the posterior is
    # the prior's width, not the noise's (which the optimum model reads it as).
    world = GaussianWorld()
    rng = np.random.default_rng(1)
    phi, grads = world.release(rng, theta_hat=0.03)
    stats = world.statistics(phi, grads)
    [draws] = sample_likelihood(
        [stats], [jax.random.key(0)], tune=500, draws=4000, chains=2, structure=STRUCTURE,
        logprior=world.logprior, cache=cache(),
    )
    mean, sd = world.exact_posterior(stats)
    theta = draws.theta.reshape(-1)
    assert sd < world.prior_sd
    assert abs(theta.mean() - mean) < 0.1 * sd
    assert theta.std() == pytest.approx(sd, rel=0.08)
    assert np.median(draws.information_diagonal) == pytest.approx(world.information, rel=0.1)
    assert int(draws.sample_stats["diverging"].sum()) == 0


def test_the_posterior_is_calibrated_over_worlds_drawn_from_the_prior():
    world = GaussianWorld()
    rng = np.random.default_rng(2)
    thetas = rng.normal(0.0, world.prior_sd, 40)
    stats = [
        world.statistics(*world.release(rng, theta + rng.normal() / world.information**0.5))
        for theta in thetas
    ]
    draws = sample_likelihood(
        stats, [jax.random.key(k) for k in range(40)], tune=300, draws=500, chains=1,
        structure=STRUCTURE, logprior=world.logprior, cache=cache(), replicates=True,
    )
    ranks = np.array([(one.theta.reshape(-1) < t).mean() for one, t in zip(draws, thetas)])
    # Uniform ranks: a calibrated posterior.  KS at α = 10⁻³ (40 worlds).
    assert scipy.stats.kstest(ranks, "uniform").pvalue > 1e-3
    assert 0.25 < np.mean((ranks > 0.25) & (ranks < 0.75)) < 0.75


def test_linear_gradients_scatter_about_their_fit_as_much_as_the_release_noise_says():
    world = GaussianWorld()
    rng = np.random.default_rng(8)
    stats = [world.statistics(*world.release(rng, theta_hat=0.02)) for _ in range(30)]
    scatter = np.array([float(one.scatter[0]) for one in stats])
    # T = 4000 gradients: the scatter's sd is √(2/3998) = 0.022.
    assert abs(scatter.mean() - 1) < 3 * 0.022 / np.sqrt(30)
    assert np.all(np.abs(scatter - 1) < 4 * 0.022)
    noise = np.array([float(one.noise_var[0]) for one in stats])
    np.testing.assert_allclose(noise, world.noise[0] ** 2 * np.maximum(scatter, 1.0))
    assert scatter_warning(scatter, ["mu[theta]"] * 30) is None
    # The u-gradients about ½κF sigmoid(u_t), F fitted: one coefficient, so sd √(2/3999).
    scatter_u = np.array([float(one.scatter_u[0]) for one in stats])
    assert abs(scatter_u.mean() - 1) < 3 * 0.022 / np.sqrt(30)
    assert np.all(np.abs(scatter_u - 1) < 4 * 0.022)
    noise_u = np.array([float(one.noise_var_u[0]) for one in stats])
    np.testing.assert_allclose(noise_u, world.noise[1] ** 2 * np.maximum(scatter_u, 1.0))


def standardised_errors(world, rng, stats_of, n_worlds=60):
    """(θ − posterior mean) / posterior sd over worlds drawn from the prior: standard normal
    where the posterior is calibrated."""
    thetas = rng.normal(0.0, world.prior_sd, n_worlds)
    stats = [
        stats_of(world.release(rng, theta + rng.normal() / world.information**0.5))
        for theta in thetas
    ]
    draws = sample_likelihood(
        stats, [jax.random.key(k) for k in range(n_worlds)], tune=300, draws=500, chains=1,
        structure=STRUCTURE, logprior=world.logprior, cache=cache(), replicates=True,
    )
    return np.array(
        [(t - one.theta.mean()) / one.theta.std() for one, t in zip(draws, thetas)]
    )


def test_noise_the_release_does_not_state_is_counted_and_the_posterior_stays_calibrated():
    # The gradients' noise is 1.5 times the stated sd, and it, not the records, decides where
    # the likelihood's centre is (W/F² = 0.014 against 1/F = 0.0025).  Read with the stated
    # noise the posterior is 1.4 times too narrow; read with the noise the gradients show, it is
    # calibrated.  60 worlds: the z-scores' sd is known to about ±0.09 (0.85 counted, 1.15 not).
    world = GaussianWorld(prior_sd=0.5, noise=(200.0, 0.05), unstated=1.5)
    stats = world.statistics(*world.release(np.random.default_rng(9), theta_hat=0.0))
    assert float(stats.scatter[0]) == pytest.approx(2.25, rel=0.1)  # four of its sds
    assert float(stats.scatter_u[0]) == pytest.approx(2.25, rel=0.1)
    warning = scatter_warning(np.asarray(stats.scatter), ["mu[theta]"])
    assert f"mu[theta] scatters {float(stats.scatter[0]):.1f} times" in warning
    assert "postprocessing='optimum'" in warning

    counted = standardised_errors(world, np.random.default_rng(10), lambda r: world.statistics(*r))
    assert 0.8 < counted.std() < 1.2, counted.std()

    def stated(release):
        one = world.statistics(*release)
        return one._replace(noise_var=jnp.asarray(world.noise[:1] ** 2))

    # The same worlds and releases, so the ratio is the widths' (1.38 expected), not chance's.
    ignored = standardised_errors(world, np.random.default_rng(10), stated)
    assert ignored.std() > 1.25 * counted.std(), (ignored.std(), counted.std())


def test_a_drifting_trace_read_by_the_likelihood_model_is_judged_by_its_scatter_not_its_drift():
    # The likelihood model regresses the gradients on the iterates and assumes no stationarity:
    # at ε = 0.1 this trace drifts (a Geweke score beyond 4), which the optimum model would be
    # warned of, but its gradients are linear with the release's noise, so no warning is due.
    rng = np.random.default_rng(0)
    x = rng.multivariate_normal(np.zeros(3), np.eye(3) * 0.5 + 0.5, 1000)
    y = 0.5 + x @ np.array([0.3, -0.2, 0.1]) + 0.8 * rng.standard_normal(1000)
    with pm.Model():
        b0 = pm.Normal("b0", 0, 1)
        w = pm.Normal("w", 0, 1, shape=3)
        s = pm.HalfNormal("s", 1)
        pm.Normal("y", b0 + pm.Data("X", x) @ w, s, observed=y)
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            result = dpppl.sample(
                mechanism="na-dpvi", epsilon=0.1, delta=1e-5, steps=3000, tune=200, draws=200,
                chains=1, random_seed=2, progressbar=False,
            )
    trace = result["dpvi_trace"]
    assert np.abs(trace["drift_score"].values).max() > DRIFT_LIMIT
    messages = [str(w.message) for w in caught]
    assert not [m for m in messages if "has not settled" in m or "scatters" in m], messages
    scatter = trace["gradient_scatter"]
    assert list(scatter["record_param"].values) == ["b0", "w[0]", "w[1]", "w[2]", "s_log__"]
    attrs = json.loads(result.attrs["dp_mechanism_attrs"])
    read = 3000 - attrs["anchored_steps"] - attrs["settled_step"]
    assert np.all(np.abs(scatter.values - 1) < 4 * np.sqrt(2 / read))
    scatter_u = trace["u_gradient_scatter"]
    assert scatter_u.dims == ("record_param",)
    assert np.all(np.abs(scatter_u.values - 1) < 4 * np.sqrt(2 / read))


def test_through_dpppl_sample_the_posterior_keeps_the_correlation_of_correlated_weights():
    # y = a x₁ + b x₂ + N(0, 1) with corr(x₁, x₂) = 0.9: the non-private posterior of (a, b)
    # has correlation about −0.9, which mean-field q loses (tests/test_covariance.py).  The
    # privacy noise adds the likelihood centre's uncertainty F⁻¹WF⁻¹, correlated more strongly
    # still (F⁻¹'s weak direction squared): so the private posterior is at least as correlated
    # and at least as wide.
    rng = np.random.default_rng(4)
    x = rng.multivariate_normal([0, 0], [[1, 0.9], [0.9, 1]], 2000)
    y = x @ np.array([0.5, -0.3]) + rng.standard_normal(2000)
    with pm.Model():
        ab = pm.Normal("ab", 0.0, 3.0, shape=2)
        pm.Normal("y", pm.math.dot(pm.Data("x", x), ab), 1.0, observed=y)
        result = dpppl.sample(
            mechanism="na-dpvi", epsilon=4.0, delta=1e-5, tune=500, draws=1000, random_seed=1,
            progressbar=False,
        )
    assert json.loads(result.attrs["dp_mechanism_attrs"])["postprocessing"] == "likelihood"
    exact = np.linalg.inv(x.T @ x + np.eye(2) / 9.0)
    theta = result.posterior["ab"].values.reshape(-1, 2)
    exact_corr = exact[0, 1] / np.sqrt(exact[0, 0] * exact[1, 1])
    assert np.corrcoef(theta.T)[0, 1] < exact_corr + 0.05
    assert np.all(theta.std(axis=0) >= 0.9 * np.sqrt(np.diag(exact))), (
        theta.std(axis=0), np.sqrt(np.diag(exact))
    )


def test_the_whitening_centres_theta_at_its_mode_where_the_release_barely_locates_it():
    # A log-scale coordinate: prior log p(θ) = −a θ − a e^(−θ) (mode 0, sd 1/√a), whose
    # curvature vanishes far to the right, and privacy noise that leaves the records' centre
    # uncertain by several prior sds.  For a small F the likelihood's centre m = μ̄ − r̄/(κF)
    # lies far off, where a Newton step taken from m falls short; ε = 0 must map to within a
    # conditional sd of the conditional mode of θ given F, for every F the posterior visits.
    a = 20.0
    world = GaussianWorld(information=400.0, prior_sd=a**-0.5, noise=(3000.0, 0.05))
    # Rates bounded by the noise, as NA-DPVI's are: the trace stays near where it started.
    phi, grads = world.release(np.random.default_rng(5), theta_hat=0.05, rate=3e-6)
    stats = world.statistics(phi, grads)

    def logprior(theta):
        return jnp.sum(-a * theta - a * jnp.exp(-theta))

    target = LikelihoodTarget(STRUCTURE, logprior)
    grid = jnp.linspace(-3.0, 3.0, 60001)
    for log_information in np.log(400.0) + np.array([-3.0, -1.5, 0.0, 1.0]):
        weights = grid_posterior(logprior, np.exp(log_information), stats, grid)
        mode = float(grid[np.argmax(weights)])
        sd = np.sqrt(np.average((np.asarray(grid) - mode) ** 2, weights=weights))
        params = jnp.array([0.0, log_information])
        theta, *_ = target._theta(params, stats)
        assert abs(float(theta[0]) - mode) < sd, (log_information, float(theta[0]), mode, sd)


def test_nuts_starts_the_correlations_the_release_does_not_observe_at_zero():
    # Three record coordinates; the third's released information is below three noise sds, so
    # its correlations are held at 0, and the released correlation of the first two is kept.
    # The start must be the correlation matrix the model is given, not the released values,
    # and only the observed correlation may escape LKJ(η)'s shrinkage.
    rng = np.random.default_rng(6)
    n, steps = 3, 200
    phi = rng.normal(0.0, 0.01, (steps + 1, 2 * n))
    fisher = np.array([[1e4, 5e3, 9.0], [5e3, 1e4, -8.0], [9.0, -8.0, 20.0]])
    stats = LikelihoodStatistics.from_trace(
        phi, rng.normal(size=(steps, 2 * n)), start=0, noise_std=np.ones(2 * n), rate=KAPPA,
        records=np.ones(n, dtype=bool),
        prior_part_gradient=lambda phis: np.zeros_like(phis),
        prior_curvature=lambda phi: np.eye(n),
        prior_point=np.zeros(n),
        released_fisher=(fisher, 10.0),
    )
    np.testing.assert_allclose(stats.fisher_correlation, [0.5, 0.0, 0.0])
    np.testing.assert_allclose(stats.correlation_slab, [CORRELATION_SLAB_WEIGHT, 0.0, 0.0])
    chol, _ = correlation_cholesky(stats.correlation_start, n)
    np.testing.assert_allclose(np.asarray(chol @ chol.T), [[1, 0.5, 0], [0.5, 1, 0], [0, 0, 1]],
                               atol=1e-12)


def test_the_whitening_is_as_narrow_as_the_prior_where_the_data_sit_in_its_tail():
    # A noise scale: θ = log s under s ~ HalfNormal(1), log p(θ) = θ − e^(2θ)/2, whose curvature
    # 2e^(2θ) is 0.003 where the data put θ (−3.3) and 2 at the model's initial point (0).  Where
    # F leaves θ to its prior, the posterior given F is about one wide; the map's scale ∂θ/∂ε
    # must be within a factor of 3 of the conditional sd of θ given F for every F, from one
    # that locates θ to one that leaves it to the prior.  Read at μ̄ alone the curvature made it
    # 19, and NUTS diverged where the posterior's tail meets the prior's steep side.
    world = GaussianWorld(information=2000.0, prior_sd=1.0, noise=(3000.0, 0.05))
    phi, grads = world.release(np.random.default_rng(7), theta_hat=-3.3, rate=3e-6)
    stats = world.statistics(phi, grads)

    def logprior(theta):
        return jnp.sum(theta - 0.5 * jnp.exp(2 * theta))

    target = LikelihoodTarget(STRUCTURE, logprior)
    grid = jnp.linspace(-8.0, 3.0, 110001)
    for log_information in np.log(2000.0) + np.array([-16.0, -10.0, -6.0, -3.0, 0.0, 1.0]):
        weights = grid_posterior(logprior, np.exp(log_information), stats, grid)
        mean = np.average(np.asarray(grid), weights=weights)
        sd = np.sqrt(np.average((np.asarray(grid) - mean) ** 2, weights=weights))
        scale = jax.jacfwd(lambda e: target._theta(jnp.array([e, log_information]), stats)[0][0])
        ratio = float(scale(0.0)) / sd
        assert 1 / 3 < ratio < 3, (log_information, ratio, sd)
