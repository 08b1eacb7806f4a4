"""The SEP engine: exactness without noise and clipping, and the privacy-critical pieces of a step
(clipping before noise, the noise scale, positive definiteness after every step)."""

from __future__ import annotations

import dataclasses
import math

import jax
import jax.numpy as jnp
import numpy as np
import pymc as pm
import pytest
from scipy import stats

import dpppl
from dpppl.plugin import Progress
from dpppl_dp_sep import SEPSettings, run_sep
from dpppl_dp_sep.families import FAMILIES, Natural, clip_natural
from dpppl_dp_sep.moments import GaussHermite, Spherical
from dpppl_dp_sep.prior import gaussian_prior
from dpppl_dp_sep.sep import (
    Constants,
    centred,
    effective_sites,
    global_natural,
    post_process,
    private_release,
    record_sites,
)
from dpppl_dp_sep.subsets import uniform_subset

QUIET = Progress(False)


def full_batch(n_records: int, **changes) -> SEPSettings:
    """Every record at every step with γ = 1: SEP's fixed point after a few steps."""
    settings = SEPSettings(
        covariance="full", nodes=GaussHermite(8), steps=4, batch_size=n_records, damping=1.0
    )
    return dataclasses.replace(settings, **changes)


def fit(model: pm.Model, settings: SEPSettings, seed: int = 0):
    compiled = dpppl.record_model(model)
    return run_sep(compiled, compiled.data(), settings, key=jax.random.key(seed), progress=QUIET)


class TestExactWithoutNoiseAndClipping:
    """On a conjugate Gaussian model every site is exactly Gaussian, so SEP without noise and
    clipping reaches the exact posterior."""

    def test_full_covariance_reaches_the_exact_posterior(self, linear_2d, exact_linear):
        result = fit(linear_2d, full_batch(60))
        mean, covariance = result.family.moments(result.approximation)
        exact_mean, exact_covariance = exact_linear()
        np.testing.assert_allclose(mean, exact_mean, rtol=1e-6)
        np.testing.assert_allclose(covariance, exact_covariance, rtol=1e-6, atol=1e-10)

    def test_diagonal_covariance_reaches_the_exact_posterior_of_one_parameter(
        self, linear_1d, exact_linear
    ):
        result = fit(linear_1d, full_batch(60, covariance="diagonal"))
        mean, variance = result.family.moments(result.approximation)
        exact_mean, exact_covariance = exact_linear(n_features=1)
        np.testing.assert_allclose(mean, exact_mean, rtol=1e-6)
        np.testing.assert_allclose(variance, np.diag(exact_covariance), rtol=1e-6)

    def test_one_record_per_step_fluctuates_around_the_exact_posterior(
        self, linear_2d, exact_linear
    ):
        """SEP proper (one uniformly drawn record per step, damping γ/N): the global site
        fluctuates with the records drawn, by about 0.7 posterior sd at γ = 1, and its average
        over the second half of 100 passes (some 50 independent values) is the exact posterior
        up to a tenth of a posterior sd."""
        settings = full_batch(
            60, nodes=Spherical(), batch_size=1, steps=60 * 100, average_last=0.5
        )
        result = fit(linear_2d, settings)
        mean, covariance = result.family.moments(result.approximation)
        exact_mean, exact_covariance = exact_linear()
        sd = np.sqrt(np.diag(exact_covariance))
        np.testing.assert_array_less(np.abs(mean - exact_mean), 0.35 * sd)
        np.testing.assert_allclose(np.sqrt(np.diag(covariance)), sd, rtol=0.03)


def test_a_non_gaussian_prior_enters_exactly_through_the_residual():
    """σ ~ HalfNormal is not Gaussian on the log scale: SEP keeps its Laplace approximation as the
    prior site and the residual in the tilted distributions, so it targets the model's own
    posterior of log σ (compared with the exact one by quadrature)."""
    rng = np.random.default_rng(3)
    y = rng.normal(size=4) * 1.5
    with pm.Model() as model:
        sigma = pm.HalfNormal("sigma", 0.5)
        pm.Normal("y", 0, sigma, observed=y)
    u = np.linspace(-6, 4, 20001)
    log_post = (
        stats.halfnorm.logpdf(np.exp(u), scale=0.5) + u
        + stats.norm.logpdf(y[:, None], 0, np.exp(u)).sum(0)
    )
    weights = np.exp(log_post - log_post.max())
    weights /= weights.sum()
    exact_mean = weights @ u
    exact_sd = math.sqrt(weights @ (u - exact_mean) ** 2)
    result = fit(model, full_batch(4, nodes=GaussHermite(20), steps=30, damping=0.5))
    mean, covariance = result.family.moments(result.approximation)
    # EP's Gaussian is close to, not equal to, the moments of a skewed 4-record posterior; the
    # prior's Laplace approximation alone (without the residual) is off by more than 0.25.
    assert mean[0] == pytest.approx(exact_mean, abs=0.05)
    assert math.sqrt(covariance[0, 0]) == pytest.approx(exact_sd, rel=0.1)


# -- the pieces of a private step -------------------------------------------------------------------

N_RECORDS = 40
BATCH = 6
BOUND = 0.3
DAMPING = 0.8


def constants(noise_std: float) -> Constants:
    values = (N_RECORDS, DAMPING, BOUND, noise_std, 0.25)
    return Constants(*(jnp.asarray(v, dtype=jnp.float64) for v in values),
                     jnp.asarray(1), jnp.asarray(0), jnp.asarray(0.0), jnp.asarray(0.0))


@pytest.fixture(scope="module")
def step(make_linear):
    """One step's pieces on a 2-D linear model from a fixed public state, compiled once:
    ``step(batch, noise_std, key)`` gives the records' raw sites, their effective sites and the
    release, in the step's centred coordinates, and the model's data."""
    compiled = dpppl.record_model(make_linear(N_RECORDS, 2))
    family = FAMILIES["full"]
    prior = gaussian_prior(compiled, family)
    site = Natural(jnp.array([0.05, -0.02]), jnp.array([[0.08, 0.01], [0.01, 0.06]]))

    @jax.jit
    def pieces(batch, noise_std, key):
        c = constants(noise_std)
        centre = family.whiten(global_natural(prior, site, c.n_records)).mean
        state = centred(family, site, centre)
        sites, powers = record_sites(
            compiled, family, Spherical(), prior, global_natural(prior, site, c.n_records - 1),
            batch, jax.random.key(0), c.n_records,
        )
        effective = effective_sites(state, centred(family, sites, centre), powers, BOUND)
        return sites, effective, private_release(family, state, effective, key, c), state

    data = {k: jnp.asarray(v[:BATCH]) for k, v in compiled.data().items()}
    return pieces, data


def with_outlier(batch, index: int, scale: float):
    return {k: v.at[index].set(v[index] * scale + 50.0) for k, v in batch.items()}


def test_every_records_contribution_is_clipped_before_the_noise(step):
    """Each block of each effective site has norm ≤ C, however extreme the record; with the
    noise off, the release is exactly θ_f + (γ/N) Σ_n (g_n − θ_f)."""
    pieces, batch = step
    sites, effective, release, state = pieces(with_outlier(batch, 0, 1e3), 0.0, jax.random.key(1))
    raw = np.linalg.norm(np.asarray(sites.precision).reshape(BATCH, -1), axis=1)
    assert np.nanmax(raw) > 10 * BOUND  # the clipping has work to do
    eta_norms = np.linalg.norm(np.asarray(effective.eta), axis=1)
    precision_norms = np.linalg.norm(np.asarray(effective.precision).reshape(BATCH, -1), axis=1)
    assert eta_norms.max() <= BOUND * (1 + 1e-9)
    assert precision_norms.max() <= BOUND * (1 + 1e-9)
    expected = jax.tree.map(
        lambda f, g: f + DAMPING / N_RECORDS * (g - f[None]).sum(0), state, effective
    )
    for got, want in zip(release, expected, strict=True):
        np.testing.assert_allclose(got, want, rtol=1e-12, atol=1e-15)


def test_replacing_one_record_moves_each_released_block_by_at_most_2_gamma_C_over_N(step):
    """The sensitivity the noise is calibrated to, checked on the release itself: the same step
    (same key, noise off) on data sets that differ in one sampled record."""
    pieces, batch = step
    bound = 2 * DAMPING * BOUND / N_RECORDS
    release = pieces(batch, 0.0, jax.random.key(2))[2]
    largest = 0.0
    for scale in (1e-3, -40.0, 1e4):
        other = pieces(with_outlier(batch, 2, scale), 0.0, jax.random.key(2))[2]
        for block, other_block in zip(release, other, strict=True):
            distance = float(np.linalg.norm(np.asarray(block - other_block)))
            largest = max(largest, distance)
            assert distance <= bound * (1 + 1e-9)
    assert largest > 0.5 * bound  # the records were different enough to matter


def test_the_noise_has_standard_deviation_sigma_times_2_gamma_C_over_N(step):
    """χ² test on the release minus its noiseless value, over 300 keys: η's coordinates and
    the upper triangle of Λ (mirrored below) are iid N(0, (σ·2γC/N)²)."""
    pieces, batch = step
    sigma = 1.7
    std = sigma * 2 * DAMPING * BOUND / N_RECORDS
    noiseless = pieces(batch, 0.0, jax.random.key(0))[2]
    eta, upper = [], []
    for key in jax.random.split(jax.random.key(7), 300):
        release = pieces(batch, std, key)[2]
        precision = np.asarray(release.precision - noiseless.precision)
        np.testing.assert_array_equal(precision, precision.T)
        eta.append(np.asarray(release.eta - noiseless.eta))
        upper.append(precision[np.triu_indices(2)])
    z = np.concatenate([np.ravel(eta), np.ravel(upper)]) / std
    statistic = float(z @ z)
    assert stats.chi2.sf(statistic, z.size) > 1e-4
    assert stats.chi2.cdf(statistic, z.size) > 1e-4
    # The same test rejects noise 10 % off.
    assert stats.chi2.sf(statistic / 0.9**2, z.size) < 1e-4


def test_the_precision_is_positive_definite_after_every_step(linear_2d):
    """With noise large enough that releases are often indefinite, the projected precision (the
    one every later step and the result use) is still positive definite after every step."""
    compiled = dpppl.record_model(linear_2d)
    family = FAMILIES["full"]
    prior = gaussian_prior(compiled, family)
    noise = 5.0 / compiled.n_records
    settings = full_batch(60, nodes=Spherical(), batch_size=1, steps=600, noise_std=noise,
                          clipping_bound=1.0)
    result = fit(linear_2d, settings)
    floor = float(np.linalg.eigvalsh(np.asarray(prior.site.precision))[0])
    assert result.min_eigenvalue.shape == (600,)
    assert np.all(result.min_eigenvalue >= floor * (1 - 1e-9))
    # The projection did work: the precision sat on its floor at some steps.
    assert np.any(np.isclose(result.min_eigenvalue, floor, rtol=1e-6))
    assert np.linalg.eigvalsh(result.approximation.precision)[0] > 0


def test_the_noise_floor_follows_the_public_noise_level_after_every_step(linear_2d):
    """With ``noise_floor`` on, q's smallest precision eigenvalue never drops below the expected
    largest eigenvalue of the noise accumulated so far, 2√d · N·s·√(Σ_k ρ^{2k}): a function of
    the settings and the step count alone, the same for any data."""
    compiled = dpppl.record_model(linear_2d)
    n, steps, noise = compiled.n_records, 400, 2.0 / compiled.n_records
    settings = full_batch(n, nodes=Spherical(), batch_size=1, steps=steps, noise_std=noise,
                          clipping_bound=1.0, noise_floor=1.0)
    result = fit(linear_2d, settings)
    decay_sq = (1 - settings.damping / n) ** 2
    level = 2 * math.sqrt(2) * n * noise * np.sqrt(
        (1 - decay_sq ** np.arange(1, steps + 1)) / (1 - decay_sq)
    )
    assert np.all(result.min_eigenvalue >= np.maximum(level, result.floor) * (1 - 1e-9))
    # The floor did bind: the noise swamps this small model's precision at some steps.
    assert np.any(np.isclose(result.min_eigenvalue, level, rtol=1e-6))


def test_post_processing_projects_the_precision_to_its_floor_and_nothing_else(linear_2d):
    """The release's indefinite global precision comes back with its eigenvectors, its
    eigenvalues raised to the floor, and η untouched."""
    family = FAMILIES["full"]
    prior = gaussian_prior(dpppl.record_model(linear_2d), family)
    released = Natural(jnp.array([3.0, -4.0]), jnp.array([[-2.0, 0.5], [0.5, 1.0]]))
    floor = 0.25
    new, min_eigenvalue = post_process(family, prior, released, constants(0.0))
    q_released = np.asarray(prior.site.precision + N_RECORDS * released.precision)
    q_new = np.asarray(prior.site.precision + N_RECORDS * new.precision)
    values, vectors = np.linalg.eigh(q_released)
    assert values[0] < 0
    np.testing.assert_allclose(q_new, (vectors * np.maximum(values, floor)) @ vectors.T)
    assert float(min_eigenvalue) == pytest.approx(floor)
    np.testing.assert_array_equal(np.asarray(new.eta), np.asarray(released.eta))


class TestUniformSubset:
    def test_each_record_is_included_at_the_declared_rate_m_over_n(self):
        """The event declares m of N records per step: over K steps each record's inclusion count
        is Binomial(K, m/N) (two-sided binomial tests, Bonferroni over the records), and every
        step holds exactly m records."""
        n_records, size, steps = 13, 3, 6_000
        keys = jax.random.split(jax.random.key(3), steps)
        draws = np.asarray(jax.vmap(lambda k: uniform_subset(k, n_records, size))(keys))
        counts = np.bincount(draws.ravel(), minlength=n_records)
        assert counts.sum() == steps * size
        p_values = [stats.binomtest(int(c), steps, size / n_records).pvalue for c in counts]
        assert min(p_values) > 1e-3 / n_records
        # The same test notices a rate 10 % off.
        assert stats.binomtest(int(counts[0] * 1.1), steps, size / n_records).pvalue < 1e-3

    def test_draws_distinct_indices_in_range(self):
        draws = jax.vmap(lambda k: uniform_subset(k, 9, 4))(jax.random.split(jax.random.key(0), 500))
        draws = np.asarray(draws)
        assert draws.min() >= 0 and draws.max() < 9
        assert all(len(set(row)) == 4 for row in draws)

    def test_every_subset_is_equally_likely(self):
        """χ² goodness of fit over the 10 subsets of size 2 from 5 records."""
        keys = jax.random.split(jax.random.key(1), 20_000)
        draws = np.sort(np.asarray(jax.vmap(lambda k: uniform_subset(k, 5, 2))(keys)), axis=1)
        codes = draws[:, 0] * 5 + draws[:, 1]
        _, counts = np.unique(codes, return_counts=True)
        assert counts.size == 10
        assert stats.chisquare(counts).pvalue > 1e-4


def test_clip_natural_scales_only_blocks_over_the_bound():
    sites = Natural(
        jnp.array([[3.0, 4.0], [0.1, 0.0], [jnp.nan, 1.0]]),
        jnp.array([np.eye(2) * 0.1, np.eye(2) * 10.0, np.eye(2)]),
    )
    clipped = clip_natural(sites, 1.0)
    np.testing.assert_allclose(clipped.eta[0], [0.6, 0.8])
    np.testing.assert_allclose(clipped.eta[1], [0.1, 0.0])
    np.testing.assert_allclose(clipped.precision[0], np.eye(2) * 0.1)
    np.testing.assert_allclose(np.linalg.norm(clipped.precision[1]), 1.0)
    np.testing.assert_array_equal(clipped.eta[2], [0.0, 0.0])  # not finite: contributes nothing
