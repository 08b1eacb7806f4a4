"""Poisson subsampling, checked statistically: each record is in a batch at the sampling rate,
once at most, and a truncated batch is as rare as its δ share says."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from scipy import stats

from dpppl.privacy.subsampling import PoissonSampler, gather, poisson_batch

SIGNIFICANCE = 1e-6


def _batches(n_records, rate, capacity, count, seed=0):
    keys = jax.random.split(jax.random.key(seed), count)
    return jax.vmap(lambda k: poisson_batch(k, n_records, rate, capacity))(keys)


def test_every_record_is_included_at_the_sampling_rate():
    n, q, trials = 200, 0.1, 4000
    indices, mask = _batches(n, q, 80, trials)
    counts = np.zeros(n)
    np.add.at(counts, np.asarray(indices)[np.asarray(mask)], 1)
    # Each count is Binomial(trials, q); the sum of squared standardised counts is χ²(n).
    z = (counts - trials * q) / np.sqrt(trials * q * (1 - q))
    assert stats.chi2.sf(np.sum(z**2), df=n) > SIGNIFICANCE
    assert stats.chi2.cdf(np.sum(z**2), df=n) > SIGNIFICANCE


def test_batch_sizes_are_binomial():
    n, q, trials = 500, 0.05, 20_000
    _, mask = _batches(n, q, 80, trials, seed=1)
    sizes = np.asarray(mask).sum(axis=1)
    mean, var = n * q, n * q * (1 - q)
    assert abs(sizes.mean() - mean) < 5 * np.sqrt(var / trials)
    # Variance of a sample variance of a nearly normal variable: 2σ⁴/(trials − 1).
    assert abs(sizes.var() - var) < 5 * var * np.sqrt(2 / (trials - 1))


def test_a_batch_holds_each_record_at_most_once():
    indices, mask = _batches(1000, 0.3, 400, 50, seed=2)
    for row, used in zip(np.asarray(indices), np.asarray(mask), strict=True):
        chosen = row[used]
        assert len(np.unique(chosen)) == len(chosen)
        assert chosen.min() >= 0 and chosen.max() < 1000


@pytest.mark.parametrize("slot", [0, 5])
def test_a_degenerate_geometric_gap_cannot_repeat_a_record(monkeypatch, slot):
    """JAX before 0.10.2 returned INT64_MAX as a gap for a uniform draw of exactly 0; the int64
    sum then wrapped negative and the last record filled every later slot of the batch."""
    honest = jax.random.geometric

    def degenerate(key, p, shape=(), dtype=None):
        gaps = honest(key, p, shape=shape, dtype=jnp.int64)
        return gaps.at[slot].set(jnp.iinfo(jnp.int64).max)

    monkeypatch.setattr(jax.random, "geometric", degenerate)
    for batch in (poisson_batch, jax.jit(poisson_batch, static_argnums=3)):
        indices, mask = batch(jax.random.key(8), 1000, 0.1, 130)
        chosen = np.asarray(indices)[np.asarray(mask)]
        assert ((chosen >= 0) & (chosen < 1000)).all()
        assert len(np.unique(chosen)) == len(chosen)
        assert (np.diff(chosen) > 0).all()


def test_the_installed_jax_samples_geometric_gaps_of_at_least_one():
    """The floor in pyproject.toml: a uniform draw of 0 must give a gap of 1, not INT64_MAX."""
    from importlib.metadata import version

    major, minor, patch = (int(part) for part in version("jax").split(".")[:3])
    assert (major, minor, patch) >= (0, 10, 2)


def test_rate_one_takes_every_record():
    indices, mask = poisson_batch(jax.random.key(0), 7, 1.0, 9)
    assert np.asarray(indices)[np.asarray(mask)].tolist() == list(range(7))


def test_capacity_makes_overflow_rarer_than_its_delta_share():
    sampler = PoissonSampler.for_target(5000, 0.1, 10_000, epsilon=1.0, delta=1e-5)
    assert sampler.overflow_probability == pytest.approx(stats.binom.sf(sampler.capacity, 5000, 0.1))
    assert sampler.delta_cost(10_000, 1.0) <= 1e-4 * 1e-5
    assert sampler.capacity < 5000 * 0.1 * 1.5
    assert sampler.expected_batch_size == 500


@pytest.mark.parametrize(
    ("n_records", "rate", "epsilon", "delta"),
    [(30_718, 0.1, 8.0, 1e-5), (30_718, 0.1, 1.0, 1e-8), (30_718, 0.1, 10.0, 1e-5),
     (100, 0.01, 1.0, 1e-5), (5000, 0.3, 20.0, 1e-12), (1_000_000, 0.001, 2.0, 1e-9)],
)
def test_capacity_stays_near_the_expected_batch_at_tiny_tail_budgets(n_records, rate, epsilon, delta):
    """binom.isf returns N below tail probabilities of about 1e-17: 1/q times the work per step."""
    steps = 10_000
    sampler = PoissonSampler.for_target(n_records, rate, steps, epsilon, delta)
    budget = 1e-4 * delta / ((1 + np.exp(epsilon)) * steps)
    assert stats.binom.logsf(sampler.capacity, n_records, rate) <= np.log(budget)
    # The smallest such capacity: one fewer slot would overflow more often than the budget allows.
    assert stats.binom.logsf(sampler.capacity - 1, n_records, rate) > np.log(budget)
    assert sampler.capacity < n_records * rate + 20 * np.sqrt(n_records * rate) + 20
    assert sampler.delta_cost(steps, epsilon) <= 1e-4 * delta * (1 + 1e-9)


def test_gather_takes_the_same_rows_of_every_array():
    data = {"x": jnp.arange(10.0), "y": jnp.arange(20.0).reshape(10, 2)}
    batch = gather(data, jnp.array([3, 1]))
    assert batch["x"].tolist() == [3.0, 1.0]
    assert batch["y"].tolist() == [[6.0, 7.0], [2.0, 3.0]]
