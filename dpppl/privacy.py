"""Privacy primitives shared by mechanisms: Poisson subsampling, clipping and Gaussian noise.

All functions are pure JAX and run inside ``jit``/``scan``.  They are the pieces whose
correctness the guarantee rests on, so they are small and tested on their own, statistically.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from scipy import stats


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
        budget = delta_share * delta / ((1 + math.exp(epsilon)) * steps)
        capacity = int(stats.binom.isf(budget, n_records, rate)) + 1
        capacity = min(max(capacity, 1), n_records)
        overflow = float(stats.binom.sf(capacity, n_records, rate))
        return cls(n_records, rate, capacity, overflow)

    @property
    def expected_batch_size(self) -> float:
        """qN: the normaliser for mean gradients (never the realised, data-dependent size)."""
        return self.rate * self.n_records

    def delta_cost(self, steps: int, epsilon: float) -> float:
        """Extra δ from truncating overflowing batches in ``steps`` steps at privacy level ε."""
        return (1 + math.exp(epsilon)) * steps * self.overflow_probability

    def sample(self, key: jax.Array) -> tuple[jax.Array, jax.Array]:
        """Indices (capacity,) of the records in one batch, and a mask of which slots are used."""
        return poisson_batch(key, self.n_records, self.rate, self.capacity)


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
    positions = jnp.cumsum(gaps) - 1
    mask = positions < n_records
    return jnp.where(mask, positions, 0), mask


def gather(data: Any, indices: jax.Array) -> Any:
    """The records at ``indices`` of every array in ``data`` (a pytree with a leading record axis)."""
    return jax.tree.map(lambda a: a[indices], data)


def clip_rows(rows: jax.Array, bound: float | jax.Array) -> jax.Array:
    """Scale every row to L2 norm at most ``bound``; rows that are not finite become zero.

    A record whose gradient is NaN or infinite (for example a value outside the model's support)
    contributes nothing rather than poisoning the sum: the rule does not depend on other records,
    so the sensitivity stays ``bound``.
    """
    finite = jnp.all(jnp.isfinite(rows), axis=-1, keepdims=True)
    rows = jnp.where(finite, rows, 0.0)
    norms = jnp.sqrt(jnp.sum(rows**2, axis=-1, keepdims=True))
    return rows * jnp.minimum(1.0, bound / jnp.maximum(norms, jnp.finfo(rows.dtype).tiny))


def gaussian_noise(key: jax.Array, shape: tuple[int, ...], std: float | jax.Array) -> jax.Array:
    """N(0, std²) noise of the given shape."""
    return std * jax.random.normal(key, shape, dtype=jnp.float64)


def jax_key(seed: np.random.SeedSequence) -> jax.Array:
    """A JAX (threefry) PRNG key whose 64 bits of key data come from the seed sequence."""
    return jax.random.wrap_key_data(
        jnp.asarray(seed.generate_state(2, dtype=np.uint32)), impl="threefry2x32"
    )
