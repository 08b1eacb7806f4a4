"""SWAG: a Gaussian posterior approximation from SGD iterates (Maddox et al. 2019).

Pure ``jax.numpy`` functions of flat parameter vectors: they know nothing of models, optimisers
or data, run inside ``jit``/``scan`` and accept NumPy arrays as well.  The collected state is

* the running mean and the running sum of squared deviations of the iterates, updated with
  Welford's recurrence (``sq_mean - mean**2``, the reference implementation's form, loses every
  digit when the parameters are large compared with their spread);
* a ring buffer of the last K deviations ``θ_t - mean_t`` (the mean *after* adding ``θ_t``, as in
  the reference implementation).

The approximation is ``N(mean, scale · (diag(var) + DᵀD / (k - 1)))`` with ``k = min(n, K)`` the
number of deviations actually held: dividing by ``K - 1`` before K deviations exist makes the
low-rank part too small, and with fewer than two deviations there is no low-rank part at all.
"""

from __future__ import annotations

from typing import NamedTuple

import jax
import jax.numpy as jnp

#: SWAG's default covariance scale (the ½ of Maddox et al. for the low-rank-plus-diagonal form).
DEFAULT_SCALE = 0.5
#: Smallest variance a coordinate may get (the reference implementation's ``var_clamp``).
DEFAULT_VAR_FLOOR = 1e-30


class SwagState(NamedTuple):
    """Running moments of the collected iterates and the ring buffer of their deviations.

    Attributes
    ----------
    count
        n, the number of iterates collected.
    mean
        Mean of the n iterates, shape (P,).
    sum_sq_dev
        Σ_t (θ_t - mean)² over the n iterates, shape (P,) (Welford's M2).
    deviations
        Ring buffer, shape (K, P): row ``(t - 1) mod K`` holds θ_t - mean_t of the t-th iterate;
        rows not yet written are zero.
    """

    count: jax.Array
    mean: jax.Array
    sum_sq_dev: jax.Array
    deviations: jax.Array


class LowRankGaussian(NamedTuple):
    """N(mean, diag(variance) + factorᵀ factor), sampled without forming the covariance.

    Attributes
    ----------
    mean
        Shape (P,).
    variance
        Diagonal part, shape (P,).
    factor
        Low-rank part, shape (R, P).
    """

    mean: jax.Array
    variance: jax.Array
    factor: jax.Array

    def sample(self, key: jax.Array, n: int) -> jax.Array:
        """``n`` independent draws, shape (n, P)."""
        key_diag, key_low = jax.random.split(key)
        dtype = self.mean.dtype
        z_diag = jax.random.normal(key_diag, (n, self.mean.shape[0]), dtype=dtype)
        z_low = jax.random.normal(key_low, (n, self.factor.shape[0]), dtype=dtype)
        # Noise is scaled by the standard deviation: multiplying by the variance was a bug in two
        # refactors of the reference code (drbayes#6, understandingbdl#14).
        return self.mean + jnp.sqrt(self.variance) * z_diag + z_low @ self.factor

    def covariance(self) -> jax.Array:
        """The dense covariance matrix, shape (P, P) (for small P: tests, diagnostics)."""
        return jnp.diag(self.variance) + self.factor.T @ self.factor


def swag_init(n_params: int, rank: int, dtype: jnp.dtype = jnp.float64) -> SwagState:
    """An empty state for P = ``n_params`` parameters keeping the last ``rank`` = K deviations."""
    if rank < 1:
        raise ValueError(f"rank must be at least 1, got {rank}")
    zeros = jnp.zeros(n_params, dtype=dtype)
    return SwagState(
        count=jnp.zeros((), dtype=jnp.int64),
        mean=zeros,
        sum_sq_dev=zeros,
        deviations=jnp.zeros((rank, n_params), dtype=dtype),
    )


def swag_collect(state: SwagState, theta: jax.Array) -> SwagState:
    """Add one iterate θ: Welford update of the moments, its deviation into the ring buffer."""
    count = state.count + 1
    delta = theta - state.mean
    mean = state.mean + delta / count
    sum_sq_dev = state.sum_sq_dev + delta * (theta - mean)
    slot = (count - 1) % state.deviations.shape[0]
    deviations = state.deviations.at[slot].set(theta - mean)
    return SwagState(count, mean, sum_sq_dev, deviations)


def swag_variance(state: SwagState, var_floor: float = DEFAULT_VAR_FLOOR) -> jax.Array:
    """Per-coordinate (population) variance of the iterates, at least ``var_floor``."""
    return jnp.maximum(state.sum_sq_dev / jnp.maximum(state.count, 1), var_floor)


def swag_gaussian(
    state: SwagState, scale: float = DEFAULT_SCALE, var_floor: float = DEFAULT_VAR_FLOOR
) -> LowRankGaussian:
    """SWAG's Gaussian ``N(mean, scale · (diag(var) + DᵀD / (k - 1)))``, k = min(n, K).

    Parameters
    ----------
    state
        The collected iterates; at least one.
    scale
        Covariance scale (SWAG's ½ by default; 0 gives SWA's point estimate).
    var_floor
        Lower bound of the diagonal variance.

    Returns
    -------
    LowRankGaussian
        The approximation, to sample from without forming its covariance.
    """
    held = jnp.minimum(state.count, state.deviations.shape[0])
    # No low-rank part until two deviations exist (k - 1 would be 0).
    low_rank_norm = jnp.where(held >= 2, 1.0 / jnp.sqrt(jnp.maximum(held - 1, 1)), 0.0)
    root_scale = jnp.sqrt(scale)
    return LowRankGaussian(
        mean=state.mean,
        variance=scale * swag_variance(state, var_floor),
        factor=root_scale * low_rank_norm * state.deviations,
    )
