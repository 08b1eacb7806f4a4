"""The noise-aware post-processing model of the DP-SGD trace (NA-DPVI paper, Algorithm 4).

After the burn-in T*, every noisy gradient is modelled as

    g̃_{t+1} ~ N(κ A (φ_t − φ*), diag(σ C / β)² [+ diag(ς / β)²]),     A = diag(softplus(v)),

with φ* ~ N(φ̄, I) (eq. A61) and v_j ~ N(m_j, s_j²) centred on the per-coordinate least-squares
estimate of A (Appendix H.3).  Because A and the noise are diagonal, the likelihood separates by
coordinate and depends on the trace only through five sums per coordinate, so evaluating it costs
O(d) however long the trace is.

Two departures from the paper's text, both where it is ambiguous or dimensionally off:

* eq. (A60) writes the noise covariance as (1/β) ⊙ (σ²C² I + Σ_sub); the noisy gradient is
  (sum + σCη)/β, whose variance is σ²C²/β², which is what is used here (as in the reference code);
* Appendix H.3 centres the prior of v on the estimate of A itself; since A = softplus(v), the
  prior is centred on softplus⁻¹ of that estimate, its standard deviation carried over by the
  delta method, and the estimate is floored at one standard deviation so weakly identified
  coordinates keep a wide prior.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import NamedTuple

import blackjax
import jax
import jax.numpy as jnp
import numpy as np
from jax.scipy.optimize import minimize

from dpppl.record_model import softplus_inverse


class TraceStatistics(NamedTuple):
    """Sufficient statistics of the trace after burn-in, one entry per coordinate of φ.

    ``x_t = φ_t − φ̄`` is the centred trace, so Σ x_t = 0 and φ* = φ̄ + δ.
    """

    count: jax.Array  # T − T*
    phi_bar: jax.Array  # φ̄
    sum_g2: jax.Array  # Σ g̃²
    sum_gx: jax.Array  # Σ g̃ x
    sum_g: jax.Array  # Σ g̃
    sum_x2: jax.Array  # Σ x²
    noise_std: jax.Array  # σ C / β
    rate: jax.Array  # κ
    prior_v_mean: jax.Array
    prior_v_std: jax.Array
    subsampling_scale: jax.Array  # prior scale of ς per coordinate (used when Σ_sub is modelled)

    @classmethod
    def from_trace(
        cls,
        phi: np.ndarray,
        noisy_grad: np.ndarray,
        *,
        burn_in: int,
        noise_std: np.ndarray,
        rate: float,
        subsampling_scale: np.ndarray,
    ) -> TraceStatistics:
        """Statistics of the pairs (φ_t, g̃_{t+1}) for t = ``burn_in`` … T − 1."""
        x = phi[burn_in:-1]
        g = noisy_grad[burn_in:]
        phi_bar = x.mean(axis=0)
        x = x - phi_bar
        sum_gx, sum_x2 = (g * x).sum(axis=0), (x**2).sum(axis=0)
        # Least-squares slope of g̃ on κ(φ − φ̄) and its standard error under the DP noise.
        slope_std = noise_std / (rate * np.sqrt(sum_x2))
        slope = np.maximum(np.abs(sum_gx) / (rate * sum_x2), slope_std)
        v_mean = softplus_inverse(slope)
        v_std = slope_std / (1 / (1 + np.exp(-v_mean)))
        return cls(
            count=jnp.asarray(float(len(x))),
            phi_bar=jnp.asarray(phi_bar),
            sum_g2=jnp.asarray((g**2).sum(axis=0)),
            sum_gx=jnp.asarray(sum_gx),
            sum_g=jnp.asarray(g.sum(axis=0)),
            sum_x2=jnp.asarray(sum_x2),
            noise_std=jnp.asarray(noise_std, dtype=float),
            rate=jnp.asarray(float(rate)),
            prior_v_mean=jnp.asarray(v_mean),
            prior_v_std=jnp.asarray(v_std),
            subsampling_scale=jnp.asarray(subsampling_scale, dtype=float),
        )


def unpack(params: jax.Array, d: int) -> tuple[jax.Array, jax.Array, jax.Array]:
    """(δ, v, ς) from the flat parameter vector of the post-processing model."""
    return params[:d], params[d : 2 * d], params[2 * d :]


def log_density(params: jax.Array, stats: TraceStatistics) -> jax.Array:
    """Log posterior density of the post-processing model (up to a constant)."""
    d = stats.phi_bar.shape[0]
    delta, v, sub = unpack(params, d)
    a = jax.nn.softplus(v)
    ka = stats.rate * a
    residual_ss = (
        stats.sum_g2
        - 2 * ka * (stats.sum_gx - delta * stats.sum_g)
        + ka**2 * (stats.sum_x2 + stats.count * delta**2)
    )
    variance = stats.noise_std**2
    log_prior = -0.5 * jnp.sum(delta**2) - 0.5 * jnp.sum(
        ((v - stats.prior_v_mean) / stats.prior_v_std) ** 2
    )
    if sub.shape[0]:
        variance = variance + sub**2
        log_prior = log_prior - 0.5 * jnp.sum((sub / stats.subsampling_scale) ** 2)
    log_lik = -0.5 * jnp.sum(residual_ss / variance + stats.count * jnp.log(variance))
    return log_lik + log_prior


def initial_position(stats: TraceStatistics, subsampling: bool) -> jax.Array:
    d = stats.phi_bar.shape[0]
    parts = [jnp.zeros(d), stats.prior_v_mean]
    if subsampling:
        parts.append(jnp.full(d, 0.1) * stats.subsampling_scale)
    return jnp.concatenate(parts)


@dataclass(frozen=True)
class PostProcessingDraws:
    """Draws of (φ*, A) and the sampler's statistics, shapes (chain, draw, ...)."""

    phi_star: np.ndarray
    a: np.ndarray
    sample_stats: dict[str, np.ndarray]


def _nuts_sampler(tune: int, draws: int, chains: int, subsampling: bool):
    def one_chain(key, stats):
        def logdensity(params):
            return log_density(params, stats)

        key_warmup, key_sample = jax.random.split(key)
        warmup = blackjax.window_adaptation(
            blackjax.nuts,
            logdensity,
            adaptation_info_fn=blackjax.adaptation.base.get_filter_adapt_info_fn(),
        )
        (state, parameters), _ = warmup.run(
            key_warmup, initial_position(stats, subsampling), num_steps=tune
        )
        kernel = blackjax.nuts(logdensity, **parameters).step

        def step(state, key):
            state, info = kernel(key, state)
            stats_out = {
                "diverging": info.is_divergent,
                "n_steps": info.num_integration_steps,
                "tree_depth": info.num_trajectory_expansions,
                "acceptance_rate": info.acceptance_rate,
                "energy": info.energy,
                "step_size": parameters["step_size"],
            }
            return state, (state.position, stats_out)

        _, (positions, info) = jax.lax.scan(step, state, jax.random.split(key_sample, draws))
        return positions, info

    @jax.jit
    def run(key, stats):
        return jax.vmap(one_chain, in_axes=(0, None))(jax.random.split(key, chains), stats)

    return run


def _to_draws(positions: jax.Array, stats: TraceStatistics, sample_stats) -> PostProcessingDraws:
    d = stats.phi_bar.shape[0]
    positions = np.asarray(positions)
    return PostProcessingDraws(
        phi_star=np.asarray(stats.phi_bar) + positions[..., :d],
        a=np.asarray(jax.nn.softplus(positions[..., d : 2 * d])),
        sample_stats={k: np.asarray(v) for k, v in sample_stats.items()},
    )


def sample_nuts(
    stats: TraceStatistics,
    key: jax.Array,
    *,
    tune: int,
    draws: int,
    chains: int,
    subsampling: bool,
    cache,
) -> PostProcessingDraws:
    """NUTS (blackjax, window adaptation) on the post-processing model.

    ``cache(key, factory)`` stores the compiled sampler (e.g. ``RecordModel.cached``), so fits of
    the same sizes reuse it.
    """
    run = cache(
        ("na-dpvi", "nuts", stats.phi_bar.shape[0], tune, draws, chains, subsampling),
        lambda: _nuts_sampler(tune, draws, chains, subsampling),
    )
    positions, info = run(key, stats)
    return _to_draws(positions, stats, info)


def _laplace_fit(subsampling: bool):
    @jax.jit
    def fit(stats):
        start = initial_position(stats, subsampling)
        result = minimize(lambda p: -log_density(p, stats), start, method="BFGS")
        # A few Newton steps polish BFGS's answer so the Hessian is taken at the mode.
        hessian_fn = jax.hessian(lambda p: -log_density(p, stats))

        def newton(position, _):
            hess = hessian_fn(position)
            grad = jax.grad(lambda p: -log_density(p, stats))(position)
            return position - jnp.linalg.solve(hess, grad), None

        mode, _ = jax.lax.scan(newton, result.x, None, length=3)
        hess = hessian_fn(mode)
        eigenvalues, eigenvectors = jnp.linalg.eigh((hess + hess.T) / 2)
        # The mode of a well-posed model has a positive-definite Hessian; the floor only guards
        # against round-off in flat directions.
        scale = eigenvectors / jnp.sqrt(jnp.maximum(eigenvalues, 1e-12))
        return mode, scale

    return fit


def sample_laplace(
    stats: TraceStatistics, key: jax.Array, *, draws: int, chains: int, subsampling: bool, cache
) -> PostProcessingDraws:
    """Laplace's approximation: a Gaussian at the MAP with the inverse Hessian as covariance."""
    fit = cache(("na-dpvi", "laplace", stats.phi_bar.shape[0], subsampling), lambda: _laplace_fit(subsampling))
    mode, scale = fit(stats)
    z = jax.random.normal(key, (chains, draws, mode.shape[0]))
    positions = mode + z @ scale.T
    return _to_draws(positions, stats, {})
