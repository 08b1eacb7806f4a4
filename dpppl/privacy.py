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

# Imported for its setting: 64-bit JAX before any noise is drawn (``import dpppl`` is lazy and no
# longer sets it).
import dpppl.jax_compile  # noqa: F401


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
        log_budget = (
            math.log(delta_share * delta) - _log1p_exp(epsilon) - math.log(steps)
        )
        capacity = _binomial_tail_quantile(log_budget, n_records, rate)
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


def _log1p_exp(x: float) -> float:
    """log(1 + eˣ) without overflow for large ε."""
    return x + math.log1p(math.exp(-x)) if x > 0 else math.log1p(math.exp(x))


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
    positions = jnp.cumsum(gaps) - 1
    mask = (positions >= 0) & (positions < n_records)
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
    """A JAX PRNG key whose 128 bits of key data come from the seed sequence.

    Every noise draw of a fit is a deterministic function of this key, and a guessed key can be
    checked against a released trace, so its size bounds the work of such a search.  JAX's default
    threefry2x32 key holds 64 bits; the ``rbg`` implementation holds 128 (streams then depend on
    the platform: a seeded fit reproduces on the same kind of device).
    """
    return jax.random.wrap_key_data(
        jnp.asarray(seed.generate_state(4, dtype=np.uint32)), impl="rbg"
    )


# -- noise hardened against floating-point attacks ------------------------------------------------


def discrete_gaussian(key: jax.Array, shape: tuple[int, ...], scale: float) -> jax.Array:
    """Integers drawn from the discrete Gaussian N_Z(0, ``scale``²): P(k) ∝ exp(−k² / (2 scale²)).

    The rejection sampler of Canonne, Kamath and Steinke (2020, Algorithm 3): propose from the
    discrete Laplace distribution with parameter t = ⌊scale⌋ + 1 (a Geometric magnitude and a
    sign, −0 rejected), accept with probability exp(−(|Y| − scale²/t)² / (2 scale²)).  Every
    coordinate is retried until accepted (the acceptance rate is above 1/2 for scale ≥ 1); the
    loop is a ``jax.lax.while_loop``, so the function runs inside ``jit``.

    The output has no floating-point structure: it is an exact integer (returned as int64).  The
    acceptance tests compare uniform floats with ``exp``, so the sampled distribution is the
    discrete Gaussian up to float64 rounding of those probabilities (relative error ~10⁻¹⁶), which
    the privacy analysis may absorb in δ; unlike rounding errors of a continuous sample, it does
    not make some outputs possible under one data set and impossible under its neighbour.

    Parameters
    ----------
    key
        A JAX PRNG key.
    shape
        Shape of the draw.
    scale
        σ of the discrete Gaussian, in grid units; at least 1 (use a finer grid otherwise).
    """
    scale = float(scale)
    if not (math.isfinite(scale) and scale >= 1):
        raise ValueError(f"scale must be a finite number >= 1, got {scale!r}")
    t = math.floor(scale) + 1
    # Geometric magnitude with success probability 1 − e^(−1/t) on {0, 1, 2, ...}.
    success = -math.expm1(-1.0 / t)

    def propose(key):
        k_mag, k_sign, k_accept = jax.random.split(key, 3)
        magnitude = jax.random.geometric(k_mag, success, shape=shape, dtype=jnp.int64) - 1
        negative = jax.random.bernoulli(k_sign, 0.5, shape=shape)
        value = jnp.where(negative, -magnitude, magnitude)
        keep_laplace = ~(negative & (magnitude == 0))
        log_accept = -((magnitude - scale**2 / t) ** 2) / (2 * scale**2)
        uniform = jax.random.uniform(k_accept, shape, dtype=jnp.float64)
        return value, keep_laplace & (jnp.log(uniform) < log_accept)

    def cond(state):
        return ~jnp.all(state[1])

    def body(state):
        value, done, key = state
        key, sub = jax.random.split(key)
        proposal, accepted = propose(sub)
        take = ~done & accepted
        return jnp.where(take, proposal, value), done | accepted, key

    start = (jnp.zeros(shape, dtype=jnp.int64), jnp.zeros(shape, dtype=bool), key)
    return jax.lax.while_loop(cond, body, start)[0]


def snapped_gaussian_release(
    key: jax.Array, values: jax.Array, std: float, grid: float | None = None
) -> jax.Array:
    """``values`` + Gaussian noise of std ``std``, released on the grid {k · ``grid``}.

    A hardened alternative to ``values + gaussian_noise(...)`` against floating-point attacks
    (Mironov 2012 for Laplace; Jin et al. 2022, arXiv 2107.10138, and Haney et al. 2022,
    arXiv 2112.05307, for Gaussian noise): there, which floating-point numbers a noisy output can
    be depends on the exact value of the noise-free sum, so its low bits can tell neighbouring data
    sets apart whatever ε says.  Here the sum is first rounded to the nearest multiple of a
    power-of-two ``grid`` and then moved by ``grid`` times an integer from the discrete Gaussian
    N_Z(0, (std / grid)²) (:func:`discrete_gaussian`), so every output is exactly k · grid and
    its distribution on the grid is the discrete Gaussian's, nothing finer.

    Cost in privacy: rounding moves each coordinate of a record's contribution by at most
    grid / 2, so the L2 sensitivity C becomes at most C + grid·√d (two roundings, d coordinates);
    the discrete Gaussian at scale σ with that sensitivity satisfies the same ρ = Δ²/(2σ²)
    concentrated DP as the continuous one (Canonne, Kamath and Steinke 2020, Theorem 14).  With
    the default grid, 2⁻⁴⁰ · std rounded down to a power of two, the change is far below the
    accountant's own error.  Outputs must stay below 2⁵² grid steps to be exact in float64.

    Parameters
    ----------
    key
        A JAX PRNG key.
    values
        The noise-free (clipped and summed) values, float64.
    std
        σC, the noise standard deviation.
    grid
        The output grid; a power of two.  None: the power of two at or below 2⁻⁴⁰ · std.

    Returns
    -------
    jax.Array
        float64 values, each an integer multiple of ``grid``.
    """
    std = float(std)
    if not (math.isfinite(std) and std > 0):
        raise ValueError(f"std must be a positive finite number, got {std!r}")
    if grid is None:
        grid = 2.0 ** math.floor(math.log2(std) - 40)
    grid = float(grid)
    mantissa, _ = math.frexp(grid)
    if not (grid > 0 and mantissa == 0.5):
        raise ValueError(f"grid must be a positive power of two, got {grid!r}")
    values = jnp.asarray(values, dtype=jnp.float64)
    steps = jnp.round(values / grid).astype(jnp.int64)
    noise = discrete_gaussian(key, values.shape, std / grid)
    return (steps + noise).astype(jnp.float64) * grid
