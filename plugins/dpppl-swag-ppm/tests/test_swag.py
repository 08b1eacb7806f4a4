"""SWAG's core: running moments, the ring buffer of deviations, and its Gaussian."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from scipy import stats

from dpppl_swag_ppm.swag import (
    LowRankGaussian,
    swag_collect,
    swag_gaussian,
    swag_init,
    swag_variance,
)


def collected(iterates: np.ndarray, rank: int):
    state = swag_init(iterates.shape[1], rank)
    state, _ = jax.lax.scan(lambda s, theta: (swag_collect(s, theta), None), state, iterates)
    return state


class TestMoments:
    def test_running_mean_and_variance_equal_those_of_all_iterates(self):
        iterates = np.random.default_rng(0).normal(size=(57, 4)) * [1.0, 2.0, 0.1, 5.0]
        state = collected(iterates, rank=5)
        assert int(state.count) == 57
        np.testing.assert_allclose(state.mean, iterates.mean(axis=0), rtol=1e-12)
        np.testing.assert_allclose(swag_variance(state), iterates.var(axis=0), rtol=1e-10)

    def test_variance_is_accurate_for_parameters_far_from_zero(self):
        spread = np.random.default_rng(1).normal(size=(200, 3)) * 1e-3
        iterates = 1e8 + spread
        naive = (iterates**2).mean(axis=0) - iterates.mean(axis=0) ** 2
        state = collected(iterates, rank=5)
        # The reference implementation's sq_mean - mean² has no correct digit here; Welford's keeps
        # all but the ~1e-5 that rounding θ near 1e8 to float64 costs (its ulp is 1.5e-8).
        assert np.all(np.abs(naive / spread.var(axis=0) - 1) > 0.5)
        exact = (iterates - 1e8).var(axis=0)  # the stored iterates' own spread, shifted exactly
        np.testing.assert_allclose(swag_variance(state), exact, rtol=1e-4)

    def test_variance_floor_applies_to_parameters_that_never_move(self):
        iterates = np.column_stack([np.arange(10.0), np.full(10, 3.0)])
        state = collected(iterates, rank=5)
        assert float(swag_variance(state, var_floor=1e-7)[1]) == 1e-7
        assert float(swag_variance(state, var_floor=1e-7)[0]) == pytest.approx(8.25)


class TestDeviations:
    def test_ring_buffer_holds_the_last_K_deviations_from_the_updated_mean(self):
        iterates = np.random.default_rng(2).normal(size=(13, 3))
        rank = 5
        state = collected(iterates, rank)
        assert state.deviations.shape == (rank, 3)
        running_means = np.cumsum(iterates, axis=0) / np.arange(1, 14)[:, None]
        for t in range(13 - rank, 13):  # iterate t (0-based) lives in slot t mod K
            np.testing.assert_allclose(
                state.deviations[t % rank], iterates[t] - running_means[t], rtol=1e-12
            )

    def test_low_rank_part_is_divided_by_the_deviations_held_not_by_K(self):
        iterates = np.random.default_rng(3).normal(size=(3, 4))
        state = collected(iterates, rank=20)
        gaussian = swag_gaussian(state, scale=0.5)
        deviations = np.asarray(state.deviations[:3])
        np.testing.assert_allclose(
            gaussian.factor.T @ gaussian.factor, 0.5 * deviations.T @ deviations / (3 - 1),
            rtol=1e-12,
        )

    def test_a_single_iterate_gives_no_low_rank_part(self):
        state = collected(np.ones((1, 3)), rank=20)
        gaussian = swag_gaussian(state, scale=0.5, var_floor=1e-4)
        assert np.all(np.isfinite(gaussian.factor))
        np.testing.assert_allclose(gaussian.covariance(), 0.5 * 1e-4 * np.eye(3))


class TestGaussian:
    def test_noise_is_scaled_by_the_standard_deviation_not_the_variance(self):
        gaussian = LowRankGaussian(
            mean=jnp.zeros(2), variance=jnp.array([4.0, 0.25]), factor=jnp.zeros((3, 2))
        )
        draws = np.asarray(gaussian.sample(jax.random.key(0), 20_000))
        np.testing.assert_allclose(draws.std(axis=0), [2.0, 0.5], rtol=0.03)

    def test_sample_covariance_matches_covariance(self):
        rng = np.random.default_rng(4)
        gaussian = LowRankGaussian(
            mean=jnp.asarray(rng.normal(size=3)),
            variance=jnp.asarray(rng.uniform(0.5, 2.0, size=3)),
            factor=jnp.asarray(rng.normal(size=(2, 3))),
        )
        draws = np.asarray(gaussian.sample(jax.random.key(1), 100_000))
        np.testing.assert_allclose(draws.mean(axis=0), gaussian.mean, atol=0.03)
        np.testing.assert_allclose(np.cov(draws.T), gaussian.covariance(), atol=0.06)

    @pytest.mark.parametrize("n_params", [5, 30])
    @pytest.mark.parametrize("scale", [0.1, 0.5, 1.0, 2.0])
    def test_quadratic_forms_of_samples_follow_chi_squared(self, n_params, scale):
        """χ² coverage: (θ - μ)ᵀ Σ⁻¹ (θ - μ) ~ χ²(P) for draws from N(μ, Σ), also when P > K."""
        rng = np.random.default_rng(n_params)
        iterates = rng.normal(size=(40, n_params)) @ rng.normal(size=(n_params, n_params))
        gaussian = swag_gaussian(collected(iterates, rank=20), scale=scale)
        n_draws = 4000
        draws = np.asarray(gaussian.sample(jax.random.key(n_params), n_draws))
        centred = draws - np.asarray(gaussian.mean)
        forms = np.einsum(
            "ij,ij->i", centred, np.linalg.solve(np.asarray(gaussian.covariance()), centred.T).T
        )
        inside = np.mean(forms <= stats.chi2.ppf(0.95, df=n_params))
        # 0.95 ± 5 binomial standard errors (0.0034 each).
        assert abs(inside - 0.95) < 5 * np.sqrt(0.95 * 0.05 / n_draws)
        assert stats.kstest(forms, stats.chi2(df=n_params).cdf).pvalue > 1e-4
