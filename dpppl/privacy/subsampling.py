"""Poisson subsampling as fixed-shape batches: each record is in a step's batch with
probability q, independently, and the batch is a masked gather of at most ``capacity`` rows.

Pure JAX, inside ``jit``/``scan``.  Truncating a batch to its capacity is charged in δ
(:meth:`PoissonSampler.delta_cost`), so the sampling matches what is accounted.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import jax
import jax.numpy as jnp
from scipy import stats

from dpppl.privacy.budget import total_variation_delta


@dataclass(frozen=True)
class PoissonSampler:
    """Poisson subsampling as fixed-shape masked batches.

    Every record is included in a step's batch independently with probability ``rate``.  The
    included indices are drawn as the partial sums of Geometric(rate) gaps, which costs
    O(capacity) per step instead of O(N): ``capacity`` is the fixed batch shape, chosen so that a
    batch larger than it has probability at most ``overflow_probability`` per step.

    A batch that would overflow is truncated.  Over ``steps`` steps that changes the mechanism's
    output distribution by at most ``steps * overflow_probability`` in total variation, which
    :meth:`delta_cost` turns into the δ the truncation costs; mechanisms charge it on top of the
    accountant's δ (see :func:`for_target`).

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
        log_budget = math.log(delta_share * delta) - math.log(total_variation_delta(epsilon, steps))
        capacity = _binomial_tail_quantile(log_budget, n_records, rate)
        overflow = float(stats.binom.sf(capacity, n_records, rate))
        return cls(n_records, rate, capacity, overflow)

    @property
    def expected_batch_size(self) -> float:
        """qN: the normaliser for mean gradients (never the realised, data-dependent size)."""
        return self.rate * self.n_records

    def delta_cost(self, steps: int, epsilon: float) -> float:
        """Extra δ from truncating overflowing batches in ``steps`` steps at privacy level ε."""
        return total_variation_delta(epsilon, steps * self.overflow_probability)

    def sample(self, key: jax.Array) -> tuple[jax.Array, jax.Array]:
        """Indices (capacity,) of the records in one batch, and a mask of which slots are used."""
        return poisson_batch(key, self.n_records, self.rate, self.capacity)


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


def poisson_batch(
    key: jax.Array, n_records: int | jax.Array, rate: float | jax.Array, capacity: int
) -> tuple[jax.Array, jax.Array]:
    """One Poisson-subsampled batch as ``capacity`` indices and a mask of the used slots.

    Record i is included with probability ``rate``, independently of the others: the included
    indices are the partial sums of i.i.d. Geometric(rate) gaps that fall below ``n_records``.
    Only a batch of more than ``capacity`` records is cut short (see :class:`PoissonSampler`).
    """
    # Geometric(1) is always 1, so rate = 1 takes every record, as it should.
    gaps = jnp.where(rate >= 1, 1, jax.random.geometric(key, jnp.minimum(rate, 1.0), shape=(capacity,)))
    # A gap past N + 1 already ends the batch, so clipping it changes no batch; it keeps the
    # cumulative sum far from int64 overflow whatever the sampler returns (JAX before 0.10.2 turned
    # a uniform draw of exactly 0 into a gap of INT64_MAX, and the wrapped sum then put the last
    # record into every later slot).  Gaps below 1 would repeat a record.
    gaps = jnp.clip(gaps, 1, n_records + 1)
    # An associative scan, not jnp.cumsum: XLA on the CPU lowers cumsum to a reduce_window that
    # costs several times more here, and integer sums are exact in any order.
    positions = jax.lax.associative_scan(jnp.add, gaps) - 1
    mask = (positions >= 0) & (positions < n_records)
    return jnp.where(mask, positions, 0), mask


def gather(data: Any, indices: jax.Array) -> Any:
    """The records at ``indices`` of every array in ``data`` (a pytree with a leading record axis)."""
    return jax.tree.map(lambda a: a[indices], data)
