"""Moment matching for a generic likelihood: tilted moments from nodes and autodiff gradients.

A record's tilted distribution is p̃(θ) ∝ q₋₁(θ) exp h(θ), with q₋₁ = N(μ, Σ) the cavity and h the
record's log-likelihood from the PyMC graph.  With θ = μ + S z (S Sᵀ = Σ) and
Z(a) = E_{z~N(0,I)}[exp h(μ + S(z + a))], Minka's formulas give the tilted moments in whitened
coordinates from derivatives of log Z at a = 0::

    m = ∂_a log Z = E_p̃[∇_z h],     M = ∂²_a log Z = Cov_p̃[z] − I = sym(E_p̃[∇_z h zᵀ]) − m mᵀ

(the second by Stein's lemma, so only first derivatives of h are needed, from JAX's autodiff).
The expectation over z is a weighted sum over nodes z_s with weights w_s: a *node rule* is all a
moment-matching backend has to provide.

* :class:`GaussHermite`: the tensor-product Gauss–Hermite rule, deterministic and accurate, with
  ``order**d`` nodes (low dimension only).
* :class:`MonteCarlo`: standard normal draws in antithetic pairs (z, −z), which cancel the
  odd-order noise that would otherwise swamp a single record's small effect.  Any dimension.
"""

from __future__ import annotations

import itertools
import math
from dataclasses import dataclass
from typing import ClassVar

import jax
import jax.numpy as jnp
import numpy as np

from dpppl_dp_sep.families import Family, Whitening


@dataclass(frozen=True)
class GaussHermite:
    """Tensor-product Gauss–Hermite nodes for E_{z~N(0, I_d)}: ``order`` points per dimension.

    Exact for polynomials of degree up to 2·order − 1 in each coordinate.
    """

    order: int = 8
    name: ClassVar[str] = "cubature"

    def n_nodes(self, d: int) -> int:
        return self.order**d

    def nodes(self, key: jax.Array, d: int) -> tuple[jax.Array, jax.Array]:
        """Nodes (order**d, d) and log-weights summing to one; ``key`` is not used."""
        points, weights = np.polynomial.hermite_e.hermegauss(self.order)
        log_weights = np.log(weights / math.sqrt(2 * math.pi))
        grid = np.array(list(itertools.product(points, repeat=d)), dtype=float)
        log_grid = np.array(
            [sum(c) for c in itertools.product(log_weights, repeat=d)], dtype=float
        )
        return jnp.asarray(grid.reshape(-1, d)), jnp.asarray(log_grid)


@dataclass(frozen=True)
class MonteCarlo:
    """``draws`` standard normal nodes in antithetic pairs, fresh at every step."""

    draws: int = 32
    name: ClassVar[str] = "monte-carlo"

    def n_nodes(self, d: int) -> int:
        return self.draws

    def nodes(self, key: jax.Array, d: int) -> tuple[jax.Array, jax.Array]:
        """Nodes (draws, d) as (z, −z) pairs, and equal log-weights."""
        half = jax.random.normal(key, (self.draws // 2, d), dtype=jnp.float64)
        z = jnp.concatenate([half, -half])
        return z, jnp.full(self.draws, -math.log(self.draws))


@dataclass(frozen=True)
class Spherical:
    """The degree-3 spherical rule: 2d nodes ±√d·q_i on the axes q_i of a random orthogonal
    frame, fresh at every step, with equal weights.

    Exact for every polynomial of degree up to 3 whatever the frame, so the odd-order terms that
    make Monte Carlo estimates of one record's small effect noisy cancel exactly, at the cost of
    2d nodes.  Meant for moderate d: the nodes lie √d cavity standard deviations out.
    """

    name: ClassVar[str] = "spherical"

    def n_nodes(self, d: int) -> int:
        return 2 * d

    def nodes(self, key: jax.Array, d: int) -> tuple[jax.Array, jax.Array]:
        """Nodes (2d, d) and equal log-weights."""
        q, r = jnp.linalg.qr(jax.random.normal(key, (d, d), dtype=jnp.float64))
        # Fixing the signs by R's diagonal makes the frame uniformly distributed.
        frame = (q * jnp.sign(jnp.diagonal(r))).T * math.sqrt(d)
        return jnp.concatenate([frame, -frame]), jnp.full(2 * d, -math.log(2 * d))


NodeRule = GaussHermite | Spherical | MonteCarlo


#: Powers tried for a record's tilted distribution, largest first (see :func:`choose_power`).
POWERS = tuple(2.0**-k for k in range(9))
#: Smallest relative effective sample size of the node weights at which a power is accepted.
MIN_RELATIVE_ESS = 0.5


def choose_power(log_weights: jax.Array, h: jax.Array) -> jax.Array:
    """The largest power α in :data:`POWERS` whose tilted weights w_s ∝ w_s⁰ exp(α h_s) keep a
    relative effective sample size 1 / Σ_s (w_s² / w_s⁰) of at least :data:`MIN_RELATIVE_ESS`;
    0 if none does.

    α = 1 is EP's tilted distribution.  When one record's likelihood is far sharper than the
    cavity, or pulls it far away (early steps, from a wide prior), the nodes cannot resolve
    q₋₁ exp(h); a power-EP site from q₋₁ exp(αh) still can.  Near SEP's fixed point a single
    record changes the cavity little and α = 1.
    """
    finite = jnp.isfinite(h)
    powers = jnp.asarray(POWERS)
    logits = jnp.where(finite, log_weights + powers[:, None] * h, -jnp.inf)
    weights = jax.nn.softmax(logits, axis=1)
    ess = 1 / jnp.sum(weights**2 * jnp.exp(-log_weights), axis=1)
    ok = ess >= MIN_RELATIVE_ESS
    return jnp.where(ok.any(), powers[jnp.argmax(ok)], 0.0)


def tilted_moments(
    family: Family,
    cavity: Whitening,
    z: jax.Array,
    log_weights: jax.Array,
    h: jax.Array,
    grads: jax.Array,
    power: jax.Array,
) -> tuple[jax.Array, jax.Array]:
    """Whitened moments (m, M) of one record's tilted distribution p̃ ∝ q₋₁ exp(power·h):
    m = E_p̃[∇_z h] and M with Cov_p̃[z] = I + power·M (so power = 0 gives the cavity's expected
    gradient and curvature of h).

    Parameters
    ----------
    family
        The Gaussian family (M is a matrix for the full family, a vector for the diagonal one).
    cavity
        The whitened cavity the nodes were placed in.
    z, log_weights
        The nodes (S, d) and their log-weights (S,).
    h, grads
        The record's log-factor at θ_s = μ + S z_s, shape (S,), and its gradient in θ, (S, d).
        Nodes where h is not finite (outside the likelihood's support) get weight zero.
    power
        α in [0, 1].
    """
    finite = jnp.isfinite(h)
    weights = jax.nn.softmax(jnp.where(finite, log_weights + power * h, -jnp.inf))
    whitened = family.whiten_gradients(cavity, jnp.where(finite[:, None], grads, 0.0))
    m = weights @ whitened
    return m, family.tilted_curvature(weights, whitened, z, m, power)
