"""Poisson subsampling as fixed-shape batches: each record is in a step's batch with
probability q, independently, and the batch is a masked gather of at most ``capacity`` rows.

Pure JAX, inside ``jit``/``scan``.  The geometric gaps between included records are drawn by
comparing 128 random bits with integer thresholds, so their law is known exactly rather than
through a floating-point logarithm.  What still separates the sampler from ideal Poisson
sampling, the rounding of those thresholds and the truncation of a batch to its capacity, is
charged in δ (:meth:`PoissonSampler.delta_cost`), so the sampling matches what is accounted.
"""

from __future__ import annotations

import functools
import math
from dataclasses import dataclass
from fractions import Fraction
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
from scipy import stats

import dpppl.model.jax_compile  # noqa: F401  (64-bit integers: the draws and thresholds are uint64)
from dpppl.privacy.budget import log_total_variation_delta, total_variation_delta


@dataclass(frozen=True)
class PoissonSampler:
    """Poisson subsampling as fixed-shape masked batches.

    Every record is included in a step's batch independently with probability ``rate``.  The
    included indices are drawn as the partial sums of Geometric(rate) gaps, which costs
    O(capacity) per step instead of O(N): ``capacity`` is the fixed batch shape, chosen so that a
    batch larger than it has probability at most ``overflow_probability`` per step.

    Two things separate the batches from ideal Poisson sampling, and both are charged:

    * a batch that would overflow is truncated: ``overflow_probability`` per step in total
      variation;
    * the gaps' law rounds (1 − q)^k to multiples of 2⁻¹²⁸ (:func:`geometric_thresholds`):
      :func:`geometric_rounding_variation` per gap, ``capacity`` gaps per step.

    :meth:`delta_cost` turns their sum over ``steps`` steps into δ; mechanisms charge it on top of
    the accountant's δ (see :func:`for_target`).

    Parameters
    ----------
    n_records
        N.
    rate
        The inclusion probability q (κ in the NA-DPVI paper).
    capacity
        The fixed batch shape.
    overflow_probability
        P(Binomial(N, q) > capacity), exact.
    """

    n_records: int
    rate: float
    capacity: int
    overflow_probability: float

    @classmethod
    def for_target(
        cls, n_records: int, rate: float, steps: int, epsilon: float, delta: float,
        delta_share: float = 1e-4,
    ) -> PoissonSampler:
        """A sampler whose truncation costs at most ``delta_share * delta`` over ``steps`` steps."""
        log_budget = math.log(delta_share * delta) - log_total_variation_delta(epsilon, steps)
        capacity = _binomial_tail_quantile(log_budget, n_records, rate)
        overflow = float(stats.binom.sf(capacity, n_records, rate))
        return cls(n_records, rate, capacity, overflow)

    @property
    def expected_batch_size(self) -> float:
        """qN: the normaliser for mean gradients (never the realised, data-dependent size)."""
        return self.rate * self.n_records

    @property
    def table(self) -> GeometricTable:
        """The gaps' table at the rate: what :func:`poisson_batch` takes."""
        return GeometricTable.for_rate(self.rate)

    @property
    def step_variation(self) -> float:
        """The total variation charged per step: truncation plus ``capacity`` rounded gaps."""
        return self.overflow_probability + self.capacity * geometric_rounding_variation(self.rate)

    def delta_cost(self, steps: int, epsilon: float) -> float:
        """Extra δ from truncated batches and rounded gap laws in ``steps`` steps at ε."""
        return total_variation_delta(epsilon, steps * self.step_variation)

    def count_length(self, rows: int) -> int | None:
        """The table length L with which the batch counts of ``rows`` possible records, drawn
        as Binomial(n_u, q) counts (:func:`binomial_thresholds`), stay within the total
        variation this sampler charges per step; None when no length does.

        A count is cut at L (probability at most P(Binomial(N, q) ≥ L) whatever n_u ≤ N is)
        and its law is rounded (:func:`binomial_rounding_variation`); the counts of one step
        are independent, so their distances add up.
        """
        if not self.overflow_probability > 0:
            return None
        largest = _binomial_tail_quantile(
            math.log(self.overflow_probability / rows), self.n_records, self.rate
        )
        length = largest + 1
        tail = float(stats.binom.sf(largest, self.n_records, self.rate))
        if rows * (tail + binomial_rounding_variation(length)) > self.step_variation:
            return None
        return length

    def sample(self, key: jax.Array) -> tuple[jax.Array, jax.Array]:
        """Indices (capacity,) of the records in one batch, and a mask of which slots are used."""
        return poisson_batch(key, self.n_records, self.table, self.capacity)


def _binomial_tail_quantile(log_tail: float, n: int, p: float) -> int:
    """The smallest k in [1, n] with log P(Binomial(n, p) > k) <= ``log_tail``.

    Bisection on ``binom.logsf``: ``binom.isf`` works on the linear tail and returns n once the
    tail is below about 1e-17 (for example at ε = 8 or δ = 1e-8 with the papers' N), which would
    make every batch as large as the data set.
    """
    lo, hi = 0, n  # the tail above n is empty, so n always qualifies
    while hi - lo > 1:
        mid = (lo + hi) // 2
        if stats.binom.logsf(mid, n, p) <= log_tail:
            hi = mid
        else:
            lo = mid
    return max(hi, 1)


#: Bits of the uniform draw each gap is compared with: two 64-bit words.
_BITS = 128

#: The smallest sampling rate: its table of thresholds holds 8.9 · 10⁷ rows (1.4 GB).
MIN_RATE = 1e-6


@functools.lru_cache(maxsize=16)
def geometric_thresholds(rate: float) -> np.ndarray:
    """The integers t_k = ⌊(1 − q)^k · 2¹²⁸⌋ for k = 1, 2, … up to the first that is 0, ascending,
    as a (2, K) uint64 array: the high words, then the low words.

    A gap drawn as G = 1 + #{k : t_k > U}, for U uniform on the 128-bit integers, has exactly
    P(G > k) = t_k / 2¹²⁸: Geometric(q) with its tail probabilities rounded down to multiples of
    2⁻¹²⁸ (:func:`geometric_rounding_variation` bounds what that changes).  They are computed in
    exact integer arithmetic from the float ``rate`` (public), with 64 guard bits, each product
    rounded down.  K is about 89 / q.
    """
    if not MIN_RATE <= rate <= 1:
        raise ValueError(
            f"Poisson sampling needs a rate in [{MIN_RATE:g}, 1], got {rate!r}: below it the "
            "table of about 89 / q thresholds would not fit in memory; sample more records per step"
        )
    keep = Fraction(1) - Fraction(rate)
    guard = 64
    scale = 1 << (_BITS + guard)
    factor = keep.numerator * scale // keep.denominator
    value, thresholds = scale, []
    while True:
        value = value * factor // scale
        thresholds.append(value >> guard)
        if thresholds[-1] == 0:
            break
    ascending = thresholds[::-1]
    return np.array(
        [[t >> 64 for t in ascending], [t & (2**64 - 1) for t in ascending]], dtype=np.uint64
    )


def geometric_rounding_variation(rate: float) -> float:
    """An upper bound on the total variation between one gap of :func:`poisson_batch` and an
    exact Geometric(rate) gap.

    Two terms.  The thresholds: with e_k = (1 − q)^k − t_k / 2¹²⁸ ∈ [0, 2 · 2⁻¹²⁸) (rounded
    down, guard bits included), the distance from Geometric(q) is ½ Σ_k |e_k − e_{k−1}| ≤
    Σ_k e_k, below 2 · 2⁻¹²⁸ for each k up to the table's length K and Σ_{k ≥ K} (1 − q)^k <
    2⁻¹²⁸ / q beyond it.  The search: it starts from a floating-point guess that is within one
    of the exact count whenever U ≥ 4 / q (see ``_count_above``), so only draws below that, of
    probability 4 / q · 2⁻¹²⁸, can end elsewhere.  In all about 183 / q · 2⁻¹²⁸: 6 · 10⁻³⁴ at
    q = 10⁻³.
    """
    return (2 * geometric_thresholds(rate).shape[1] + 5 / rate) * 2.0**-_BITS


class GeometricTable(NamedTuple):
    """What :func:`poisson_batch` needs to draw Geometric(``rate``) gaps: the rate and its
    :func:`geometric_thresholds`.  A pytree, so it can be an argument of a jitted function."""

    rate: float | jax.Array
    thresholds: np.ndarray | jax.Array

    @classmethod
    def for_rate(cls, rate: float) -> GeometricTable:
        """The table of the sampling rate ``rate``, its thresholds already on the device."""
        return _device_table(float(rate))


@functools.lru_cache(maxsize=16)
def _device_table(rate: float) -> GeometricTable:
    # One device copy per rate: a host array would be copied again at every call of a jitted
    # DP-SGD chunk (14 MB at q = 10⁻⁴).
    return GeometricTable(rate, jnp.asarray(geometric_thresholds(rate)))


def _count_above(table: GeometricTable, high: jax.Array, low: jax.Array) -> jax.Array:
    """#{k ≥ 1 : t_k > U} for each 128-bit U = (high, low), t as :func:`geometric_thresholds`.

    With y = log(U / 2¹²⁸) / log(1 − q), the tail (1 − q)^k 2¹²⁸ exceeds U exactly for k < y, and
    t_k, below it by less than 2, exceeds U at least for k ≤ y − 2 / (U q).  For U ≥ 4 / q that
    margin is at most ½, and y computed in float64 (U to a relative 3 · 2⁻⁵³, a logarithm of at
    most 89) is off by less than 10⁻¹³ / q ≤ 10⁻⁷ (q ≥ ``MIN_RATE``): so c lies in
    {a, a + 1, a + 2} for a = ⌊y⌋ − 1, and two exact integer comparisons, t_{a+1} > U and
    t_{a+2} > U, settle it.  That costs two lookups, where a binary search over the table costs
    2 log₂ K dependent ones.
    """
    thresholds = jnp.asarray(table.thresholds, dtype=jnp.uint64)
    size = thresholds.shape[1]
    fraction = (high.astype(jnp.float64) + low.astype(jnp.float64) * 2.0**-64) * 2.0**-64
    guess = jnp.floor(jnp.log(fraction) / jnp.log1p(-jnp.asarray(table.rate, jnp.float64)))
    # NaN only for q = 1 and U = 0 (−∞ / −∞), where every count is 0.
    base = jnp.clip(jnp.nan_to_num(guess - 1, nan=0.0), 0, size).astype(jnp.int64)
    count = base
    for step in (1, 2):
        # t_k sits at row size − k of the ascending table; t_k = 0 for k past it.
        row = jnp.clip(size - (base + step), 0, size - 1)
        t_high, t_low = thresholds[0][row], thresholds[1][row]
        above = (t_high > high) | ((t_high == high) & (t_low > low))
        count = count + (above & (base + step <= size))
    return count


def poisson_batch(
    key: jax.Array, n_records: int | jax.Array, table: GeometricTable, capacity: int
) -> tuple[jax.Array, jax.Array]:
    """One Poisson-subsampled batch as ``capacity`` indices and a mask of the used slots.

    Record i is included with probability q, independently of the others: the included indices
    are the partial sums of i.i.d. Geometric(q) gaps that fall below ``n_records``, each gap
    drawn from 128 random bits against ``table = GeometricTable.for_rate(q)`` (whose
    thresholds' length is static).  Only a batch of more than ``capacity`` records is cut short
    (see :class:`PoissonSampler`).
    """
    # Two draws rather than one of shape (2, capacity): XLA on the CPU then keeps the low words'
    # comparison cheap (42 against 34 µs per step of a 64-replicate M2 study, measured).
    key_high, key_low = jax.random.split(key)
    high = jax.random.bits(key_high, (capacity,), dtype=jnp.uint64)
    low = jax.random.bits(key_low, (capacity,), dtype=jnp.uint64)
    gaps = 1 + _count_above(table, high, low)
    # An associative scan, not jnp.cumsum: XLA on the CPU lowers cumsum to a reduce_window that
    # costs several times more here, and integer sums are exact in any order.  Gaps are at most
    # the table's length + 1, so the sum cannot overflow.
    positions = jax.lax.associative_scan(jnp.add, gaps.astype(jnp.int64)) - 1
    mask = (positions >= 0) & (positions < n_records)
    return jnp.where(mask, positions, 0), mask


def gather(data: Any, indices: jax.Array) -> Any:
    """The records at ``indices`` of every array in ``data`` (a pytree with a leading record axis)."""
    return jax.tree.map(lambda a: a[indices], data)


def copies_of(rows: Any, data: Any) -> np.ndarray:
    """How many copies of each of ``rows`` ``data`` holds, shape (U,) int64.

    ``data`` is a pytree of arrays with a leading record axis, ``rows`` the same pytree with one
    entry per possible record; they should be public (the records a model allows,
    :meth:`~dpppl.model.record_model.RecordModel.possible_records`), so that the shapes of the
    programs that use them, and with them the compilation cache, say nothing about the data.
    A Poisson batch holds each record with probability q independently, so it holds
    Binomial(copies[u], q) copies of row u, independently of the other rows
    (:func:`binomial_counts` draws them); identical records have identical clipped gradients,
    so a step can take one gradient per row and weight it by its count.

    Raises
    ------
    ValueError
        If a record of ``data`` is none of ``rows`` (which record is not said).
    """
    row_bytes, n_rows = _record_bytes(rows)
    data_bytes, _ = _record_bytes(data)
    position = {row.tobytes(): i for i, row in enumerate(row_bytes)}
    distinct, inverse = np.unique(data_bytes, axis=0, return_inverse=True)
    found = [position.get(row.tobytes()) for row in distinct]
    if None in found:
        raise ValueError("the data hold a record that is none of the possible records")
    return np.bincount(np.asarray(found)[inverse.ravel()], minlength=n_rows).astype(np.int64)


def _record_bytes(data: Any) -> tuple[np.ndarray, int]:
    """Each record of ``data`` as one row of bytes, and the number of records (−0.0 read as
    0.0, which it equals)."""
    arrays = [np.ascontiguousarray(_zero_signed(leaf)) for leaf in jax.tree.leaves(data)]
    n = arrays[0].shape[0]
    return np.concatenate([a.reshape(n, -1).view(np.uint8).reshape(n, -1) for a in arrays], 1), n


def _zero_signed(array: Any) -> np.ndarray:
    array = np.asarray(array)
    return array + 0.0 if array.dtype.kind == "f" else array


@functools.lru_cache(maxsize=1024)
def binomial_thresholds(n: int, rate: float, length: int) -> np.ndarray:
    """The integers T_k ≈ F(k) · 2¹²⁸ for k = 0 … ``length`` − 1, F the distribution function of
    Binomial(n, ``rate``), as a (2, length) uint64 array: the high words, then the low words.

    A count drawn as C = #{k : T_k ≤ U}, for U uniform on the 128-bit integers, has
    P(C ≤ k) = T_k / 2¹²⁸: Binomial(n, q) with its distribution function within 2 · 2⁻¹²⁸, and
    cut at ``length`` (:func:`binomial_rounding_variation`).  Exact integer arithmetic from the
    float ``rate``: the probabilities are fixed-point numbers with P fractional bits, P = 128 +
    64 guard bits + 2 log₂(length + 1) + log₂(1 / (1 − q)ⁿ), each rounded down.  Starting from
    (1 − q)ⁿ, exact, each probability is the last times (n − k + 1) q / (k (1 − q)); rounding adds
    less than 1 unit per step, and an error carried from step i to step k grows by f(k) / f(i) ≤
    1 / (1 − q)ⁿ (f, the probability function, is unimodal), so each partial sum is within
    length² · 2⁻⁽¹²⁸ ⁺ ⁶⁴⁾ of its exact value before the final rounding down.
    """
    q = Fraction(rate)
    keep = 1 - q
    if keep == 0:  # every copy is in the batch: the count is n
        words = [0 if k < n else 2**_BITS - 1 for k in range(length)]
    else:
        words = _binomial_words(n, q, length)
    return np.array([[t >> 64 for t in words], [t & (2**64 - 1) for t in words]], dtype=np.uint64)


def _binomial_words(n: int, q: Fraction, length: int) -> list[int]:
    keep = 1 - q
    start_bits = math.ceil(n * math.log2(keep.denominator / keep.numerator)) if n else 0
    bits = _BITS + 64 + 2 * (length + 1).bit_length() + start_bits
    # ⌊(1 − q)ⁿ 2^P⌋ exactly.
    mass = (keep.numerator**n << bits) // keep.denominator**n
    total, words = 0, []
    for k in range(length):
        if k:
            mass = mass * (n - k + 1) * q.numerator * keep.denominator // (
                k * q.denominator * keep.numerator
            )
        total += mass
        words.append(min(total >> (bits - _BITS), 2**_BITS - 1))
    return words


def binomial_rounding_variation(length: int) -> float:
    """An upper bound on the total variation between a count of :func:`binomial_counts` and an
    exact Binomial(n, q) count, besides the cut at ``length``: each T_k / 2¹²⁸ is within
    2 · 2⁻¹²⁸ of F(k), so each of the length + 1 probabilities moves by less than 4 · 2⁻¹²⁸."""
    return 2 * (length + 1) * 2.0**-_BITS


def binomial_counts(key: jax.Array, thresholds: jax.Array) -> jax.Array:
    """One count per row of ``thresholds`` ((U, 2, L) uint64, each row
    :func:`binomial_thresholds`), shape (U,) int64: the number of T_k at or below a 128-bit
    uniform draw, found by bisection over the ascending T_k."""
    key_high, key_low = jax.random.split(key)
    rows, _, length = thresholds.shape
    high = jax.random.bits(key_high, (rows,), dtype=jnp.uint64)
    low = jax.random.bits(key_low, (rows,), dtype=jnp.uint64)

    def halve(_, bounds):
        # Invariant: T_k ≤ U for k < lo, T_k > U for k ≥ hi.
        lo, hi = bounds
        mid = (lo + hi) // 2
        at = jnp.minimum(mid, length - 1)
        t_high = jnp.take_along_axis(thresholds[:, 0], at[:, None], axis=1)[:, 0]
        t_low = jnp.take_along_axis(thresholds[:, 1], at[:, None], axis=1)[:, 0]
        below = (t_high < high) | ((t_high == high) & (t_low <= low))
        open_ = lo < hi
        return jnp.where(open_ & below, mid + 1, lo), jnp.where(open_ & ~below, mid, hi)

    start = (jnp.zeros(rows, jnp.int64), jnp.full(rows, length, jnp.int64))
    count, _ = jax.lax.fori_loop(0, length.bit_length(), halve, start)
    return count
