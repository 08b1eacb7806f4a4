"""Clipping, Gaussian noise and PRNG keys, checked statistically: they do what the accounting
assumes."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
from scipy import stats

from dpppl.privacy.noise import clip_rows, gaussian_noise, jax_key

SIGNIFICANCE = 1e-6


def test_clipped_rows_have_norm_at_most_the_bound():
    rows = jax.random.normal(jax.random.key(3), (1000, 5)) * jnp.logspace(-3, 3, 1000)[:, None]
    clipped = clip_rows(rows, 2.0)
    norms = np.linalg.norm(np.asarray(clipped), axis=1)
    assert norms.max() <= 2.0 * (1 + 1e-12)
    small = np.linalg.norm(np.asarray(rows), axis=1) <= 2.0
    np.testing.assert_array_equal(np.asarray(clipped)[small], np.asarray(rows)[small])
    big = ~small
    np.testing.assert_allclose(norms[big], 2.0)


def test_a_huge_canary_moves_the_sum_by_at_most_the_bound():
    rows = jnp.zeros((10, 3)).at[4].set(jnp.array([1e6, -3e7, 5e5]))
    assert float(jnp.linalg.norm(clip_rows(rows, 1.5).sum(axis=0))) <= 1.5 * (1 + 1e-12)


def test_rows_that_are_not_finite_contribute_nothing():
    rows = jnp.array([[1.0, 2.0], [jnp.nan, 0.0], [jnp.inf, 1.0]])
    np.testing.assert_array_equal(np.asarray(clip_rows(rows, 10.0))[1:], 0.0)


def test_gaussian_noise_has_the_requested_standard_deviation():
    std, count = 3.7, 200_000
    noise = np.asarray(gaussian_noise(jax.random.key(4), (count,), std))
    statistic = np.sum(noise**2) / std**2  # χ²(count) when the std is right
    assert stats.chi2.sf(statistic, count) > SIGNIFICANCE
    assert stats.chi2.cdf(statistic, count) > SIGNIFICANCE
    assert abs(noise.mean()) < 5 * std / np.sqrt(count)


def test_noise_at_the_wrong_scale_is_detected():
    noise = np.asarray(gaussian_noise(jax.random.key(5), (200_000,), 3.7 * 0.99))
    assert stats.chi2.cdf(np.sum(noise**2) / 3.7**2, 200_000) < SIGNIFICANCE


def test_keys_come_from_the_seed_sequence():
    a = jax_key(np.random.SeedSequence(1))
    b = jax_key(np.random.SeedSequence(1))
    c = jax_key(np.random.SeedSequence(2))
    assert jnp.array_equal(jax.random.key_data(a), jax.random.key_data(b))
    assert not jnp.array_equal(jax.random.key_data(a), jax.random.key_data(c))


def test_keys_hold_128_bits_of_seed_entropy():
    """Every draw of a fit is a function of its key; 64 bits could be searched for."""
    keys = [jax_key(np.random.SeedSequence(1)) for _ in range(2)]
    assert jax.random.key_data(keys[0]).nbytes * 8 >= 128
    # All four words come from the seed sequence, none is a constant.
    words = np.asarray(jax.random.key_data(keys[0]))
    np.testing.assert_array_equal(words, np.random.SeedSequence(1).generate_state(4, np.uint32))
