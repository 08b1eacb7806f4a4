"""Poisson subsampling, checked statistically: each record is in a batch at the sampling rate,
once at most, the gaps between records follow the geometric law their thresholds say, and what
separates the sampler from ideal Poisson sampling is charged in δ."""

from __future__ import annotations

import math
from fractions import Fraction

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from scipy import stats

from dpppl.privacy.budget import total_variation_delta
from dpppl.privacy.subsampling import (
    GeometricTable,
    PoissonSampler,
    binomial_counts,
    binomial_rounding_variation,
    binomial_thresholds,
    copies_of,
    gather,
    geometric_rounding_variation,
    geometric_thresholds,
    poisson_batch,
)

SIGNIFICANCE = 1e-6


def _batches(n_records, rate, capacity, count, seed=0):
    keys = jax.random.split(jax.random.key(seed), count)
    table = GeometricTable.for_rate(rate)
    return jax.vmap(lambda k: poisson_batch(k, n_records, table, capacity))(keys)


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


def _as_integers(thresholds):
    return [int(high) << 64 | int(low) for high, low in zip(*thresholds, strict=True)]


@pytest.mark.parametrize("rate", [0.1, 0.3, 1 / 3, 1e-3, 1.0])
def test_gap_thresholds_are_the_geometric_tail_rounded_down_to_2_to_the_minus_128(rate):
    mpmath = pytest.importorskip("mpmath")
    mpmath.mp.prec = 400
    ascending = _as_integers(geometric_thresholds(rate))
    assert ascending == sorted(ascending) and ascending[0] == 0
    keep = 1 - mpmath.mpf(rate)  # the float rate, exactly
    for k, t in enumerate(reversed(ascending), start=1):
        assert 0 <= keep**k * mpmath.mpf(2) ** 128 - t < 2
    # The table stops at the first k whose tail is below one unit.
    assert keep ** len(ascending) * mpmath.mpf(2) ** 128 < 2


@pytest.mark.parametrize("rate", [0.1, 0.5, 1e-3, 1.0])
def test_the_guessed_count_is_the_exact_count_at_every_threshold(rate, monkeypatch):
    """The float guess is corrected by exact comparisons: draws at, just below and just above
    every threshold (where a guess is most likely off by one) count exactly."""
    table = GeometricTable.for_rate(rate)
    ascending = _as_integers(table.thresholds)
    rng = np.random.default_rng(0)
    draws = {t + d for t in ascending for d in (-1, 0, 1) if 4 / rate <= t + d < 2**128}
    draws |= {int.from_bytes(rng.bytes(16)) for _ in range(2000)}
    draws = sorted(draws)
    words = np.array([(u >> 64, u & (2**64 - 1)) for u in draws], dtype=np.uint64)
    # The sampler's two draws, high words then low words, replaced by these.
    supply = iter([jnp.asarray(words[:, 0]), jnp.asarray(words[:, 1])])
    monkeypatch.setattr(jax.random, "bits", lambda key, shape, dtype: next(supply))
    indices, mask = poisson_batch(jax.random.key(0), 2**62, table, len(draws))
    assert np.asarray(mask).all()
    counts = np.diff(np.concatenate([[-1], np.asarray(indices)])) - 1
    exact = len(ascending) - np.searchsorted(np.array(ascending, dtype=object), draws,
                                             side="right")
    np.testing.assert_array_equal(counts, exact.astype(np.int64))


def test_gaps_follow_the_geometric_law():
    rate, trials, capacity = 0.3, 4000, 50
    indices, mask = _batches(2**40, rate, capacity, trials, seed=4)
    assert np.asarray(mask).all()
    positions = np.asarray(indices)
    gaps = np.diff(np.concatenate([np.full((trials, 1), -1), positions], axis=1)).ravel()
    largest = 15
    observed = np.bincount(np.minimum(gaps, largest), minlength=largest + 1)[1:]
    expected = rate * (1 - rate) ** np.arange(largest - 1)
    expected = np.append(expected, 1 - expected.sum()) * len(gaps)
    assert stats.chisquare(observed, expected).pvalue > SIGNIFICANCE


def test_the_largest_and_smallest_draws_give_gaps_of_one_and_the_table_length(monkeypatch):
    table = GeometricTable.for_rate(0.1)
    for word, gap in ((2**64 - 1, 1), (0, table.thresholds.shape[1] + 1)):
        monkeypatch.setattr(jax.random, "bits",
                            lambda key, shape, dtype, word=word: jnp.full(shape, word, dtype))
        indices, mask = poisson_batch(jax.random.key(0), 10**9, table, 5)
        assert np.asarray(mask).all()
        assert np.diff(np.asarray(indices)).tolist() == [gap] * 4


@pytest.mark.parametrize("rate", [0.0, -0.1, 1.5, 1e-7])
def test_rates_outside_the_table_range_are_refused(rate):
    with pytest.raises(ValueError, match="rate"):
        geometric_thresholds(rate)


def test_rate_one_takes_every_record():
    indices, mask = poisson_batch(jax.random.key(0), 7, GeometricTable.for_rate(1.0), 9)
    assert np.asarray(indices)[np.asarray(mask)].tolist() == list(range(7))


def test_capacity_makes_overflow_rarer_than_its_delta_share():
    sampler = PoissonSampler.for_target(5000, 0.1, 10_000, epsilon=1.0, delta=1e-5)
    assert sampler.overflow_probability == pytest.approx(stats.binom.sf(sampler.capacity, 5000, 0.1))
    assert sampler.delta_cost(10_000, 1.0) <= 1e-4 * 1e-5
    assert sampler.capacity < 5000 * 0.1 * 1.5
    assert sampler.expected_batch_size == 500


@pytest.mark.parametrize("rate", [0.1, 1e-3])
def test_the_delta_cost_charges_truncation_and_the_rounded_gap_law(rate):
    sampler = PoissonSampler.for_target(100_000, rate, 10_000, epsilon=1.0, delta=1e-6)
    variation = 10_000 * (sampler.overflow_probability
                          + sampler.capacity * geometric_rounding_variation(rate))
    assert sampler.delta_cost(10_000, 1.0) == pytest.approx(total_variation_delta(1.0, variation))
    # The rounding's share is far below the truncation's: about 183 / q · 2⁻¹²⁸ per gap.
    assert 0 < geometric_rounding_variation(rate) < 1e-30


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


def test_a_data_set_is_counted_as_copies_of_its_possible_records():
    rows = {"x": np.array([1.0, 2.0, 1.0, 2.0]), "group": np.array([0, 0, 1, 1])}
    data = {"x": np.array([1.0, 2.0, 1.0, 1.0, 2.0, 1.0]), "group": np.array([0, 0, 0, 1, 0, 0])}
    # (1, 0) three times, (2, 0) twice, (1, 1) once, (2, 1) never.
    assert copies_of(rows, data).tolist() == [3, 2, 1, 0]


def test_a_negative_zero_is_the_record_zero():
    copies = copies_of({"y": np.array([0.0, 1.0])}, {"y": np.array([-0.0, 1.0, 0.0])})
    assert copies.tolist() == [2, 1]


def test_a_record_that_is_none_of_the_possible_ones_is_refused_without_saying_which():
    with pytest.raises(ValueError, match="none of the possible records") as refused:
        copies_of({"y": np.array([0, 1])}, {"y": np.array([0, 1, 7, 1])})
    assert "7" not in str(refused.value)


@pytest.mark.parametrize(("n", "rate"), [(0, 0.1), (1, 0.1), (7, 0.3), (30, 0.1), (50, 0.5), (5, 1.0)])
def test_binomial_thresholds_are_the_distribution_function_rounded_down(n, rate):
    length = 12
    words = binomial_thresholds(n, rate, length)
    thresholds = [(int(high) << 64) | int(low) for high, low in zip(*words, strict=True)]
    q = Fraction(rate)
    pmf = [math.comb(n, k) * q**k * (1 - q) ** (n - k) if k <= n else 0 for k in range(length)]
    cdf = np.cumsum(pmf)
    exact = [min(int(f * 2**128), 2**128 - 1) for f in cdf]
    # Within 2 of ⌊F(k) 2¹²⁸⌋ is what the rounding bound assumes; here they are equal.
    assert all(abs(t - e) <= 2 for t, e in zip(thresholds, exact, strict=True))


def test_binomial_counts_follow_the_binomial_law():
    sizes, rate, draws = [0, 5, 40], 0.2, 40_000
    table = jnp.asarray(np.stack([binomial_thresholds(n, rate, 41) for n in sizes]))
    keys = jax.random.split(jax.random.key(4), draws)
    counts = np.asarray(jax.vmap(binomial_counts, in_axes=(0, None))(keys, table))
    assert np.all(counts[:, 0] == 0)
    for column, n in zip(counts.T[1:], sizes[1:], strict=True):
        observed = np.bincount(column, minlength=n + 1)
        expected = draws * stats.binom.pmf(np.arange(n + 1), n, rate)
        # The χ² approximation needs filled cells: the rest are pooled into one.
        keep = expected > 5
        pooled = [*observed[keep], *([observed[~keep].sum()] if (~keep).any() else [])]
        pooled_expected = [*expected[keep], *([expected[~keep].sum()] if (~keep).any() else [])]
        statistic = stats.chisquare(pooled, pooled_expected).statistic
        assert stats.chi2.sf(statistic, len(pooled) - 1) > SIGNIFICANCE


def test_a_count_is_cut_at_the_table_length():
    n, rate, length, draws = 100, 0.2, 15, 20_000
    table = jnp.asarray(binomial_thresholds(n, rate, length)[None])
    keys = jax.random.split(jax.random.key(5), draws)
    counts = np.asarray(jax.vmap(binomial_counts, in_axes=(0, None))(keys, table))[:, 0]
    assert counts.max() == length
    cut = stats.binom.sf(length - 1, n, rate)
    assert abs(np.mean(counts == length) - cut) < 5 * np.sqrt(cut * (1 - cut) / draws)


@pytest.mark.parametrize("rows", [1, 2, 3, 64])
def test_counts_of_possible_records_stay_within_the_samplers_charged_variation(rows):
    sampler = PoissonSampler.for_target(5000, 0.1, steps=10_000, epsilon=0.1, delta=1e-5)
    length = sampler.count_length(rows)
    cut = stats.binom.sf(length - 1, 5000, 0.1)  # at most any row's, whatever its n_u ≤ N
    assert rows * (cut + binomial_rounding_variation(length)) <= sampler.step_variation
    # ... and the table is no longer than that needs.
    assert rows * stats.binom.sf(length - 2, 5000, 0.1) > sampler.overflow_probability
