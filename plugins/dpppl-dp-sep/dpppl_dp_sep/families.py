"""Gaussian approximating families over the model's unconstrained parameter vector θ.

SEP keeps every factor (the prior site, the global site f, each record's site f_n) as the natural
parameters of a Gaussian: η = Λμ and the precision Λ.  A family says what shape Λ has and how to
do with it the few things SEP needs: whiten a cavity, turn tilted moments into a site, clip, add
noise and project back to positive definite.

* :class:`FullCovariance`: Λ is a dense symmetric d×d matrix (small d).
* :class:`DiagonalCovariance`: Λ is the vector of its diagonal (large d; the family PBP and the
  DP-SEP paper use for neural networks).

Both work in whitened coordinates z: a cavity N(μ, Σ) is written θ = μ + S z with S Sᵀ = Σ and
z ~ N(0, I).  A record's tilted distribution q₋₁ exp(α h) (α ≤ 1, see
:mod:`dpppl_dp_sep.moments`) has E[z] = α m and Cov[z] = I + α M there, and the site follows from
(m, M) without subtracting two nearly equal precisions (see :meth:`FullCovariance.site`), so a
record whose effect is a thousandth of the cavity's still gets an accurate site.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar, NamedTuple

import jax
import jax.numpy as jnp
import jax.scipy.linalg as jsl
import numpy as np

from dpppl.plugin import clip_rows, gaussian_noise


class Natural(NamedTuple):
    """Natural parameters of a Gaussian factor: η = Λμ and the precision Λ.

    ``precision`` is (d, d) in the full family and (d,) in the diagonal one; either may carry
    leading batch axes (one factor per record).
    """

    eta: jax.Array
    precision: jax.Array


class Whitening(NamedTuple):
    """A cavity N(μ, Σ) ready for whitened coordinates.

    ``root`` is the lower Cholesky factor R of the precision (full family: Λ = R Rᵀ, so
    S = R⁻ᵀ whitens) or the vector √Λ (diagonal family).
    """

    mean: jax.Array
    root: jax.Array


def clip_natural(sites: Natural, bound: float | jax.Array) -> Natural:
    """Scale each natural-parameter block of each site to L2 (Frobenius) norm at most ``bound``.

    ``sites`` has one leading record axis.  η and Λ are clipped separately, as DP-SEP's
    sensitivity analysis requires (Algorithm 3, lines 7 and 12); a block that is not finite
    becomes zero (:func:`dpppl.plugin.clip_rows`).
    """
    eta = clip_rows(sites.eta, bound)
    batch = sites.precision.shape[0]
    precision = clip_rows(sites.precision.reshape(batch, -1), bound).reshape(
        sites.precision.shape
    )
    return Natural(eta, precision)


@dataclass(frozen=True)
class FullCovariance:
    """Gaussians with a dense covariance matrix.

    Costs O(d³) per step (a Cholesky factor and an eigendecomposition) and O(d²) per record and
    node; the Λ block released at each step has d(d+1)/2 free entries.
    """

    name: ClassVar[str] = "full"

    def precision_from_matrix(self, matrix: jax.Array) -> jax.Array:
        """This family's form of a dense precision matrix (the matrix itself)."""
        return matrix

    def precision_matvec(self, precision: jax.Array, vector: jax.Array) -> jax.Array:
        """Λ v (Λ may carry leading batch axes)."""
        return precision @ vector

    def whiten(self, q: Natural) -> Whitening:
        """Mean and whitening root of the Gaussian ``q`` (its precision must be positive definite)."""
        root = jnp.linalg.cholesky(q.precision)
        mean = jsl.cho_solve((root, True), q.eta)
        return Whitening(mean, root)

    def to_theta(self, w: Whitening, z: jax.Array) -> jax.Array:
        """θ = μ + R⁻ᵀ z for whitened nodes ``z`` of shape (S, d)."""
        return w.mean + jsl.solve_triangular(w.root.T, z.T, lower=False).T

    def whiten_gradients(self, w: Whitening, grads: jax.Array) -> jax.Array:
        """∂/∂z = Sᵀ ∇_θ = R⁻¹ ∇_θ, for gradients of shape (S, d)."""
        return jsl.solve_triangular(w.root, grads.T, lower=True).T

    def tilted_curvature(
        self, weights: jax.Array, grads: jax.Array, z: jax.Array, m: jax.Array, power: jax.Array
    ) -> jax.Array:
        """M with Cov_p̃[z] − I = power·M under p̃ ∝ q₋₁ exp(power·h), by Stein's lemma:
        E_p̃[∇_z h zᵀ] = power·E_p̃[∇_z h ∇_z hᵀ] + E_p̃[∇²_z h], so M = sym(E_p̃[∇_z h zᵀ]) −
        power·m mᵀ, where m = E_p̃[∇_z h] (and power·m = E_p̃[z])."""
        cross = (weights[:, None] * grads).T @ z
        return 0.5 * (cross + cross.T) - power * jnp.outer(m, m)

    def site(self, w: Whitening, m: jax.Array, M: jax.Array, power: jax.Array) -> Natural:
        """The power-EP site (proj[p̃]/q₋₁)^(1/power) for the tilted p̃ ∝ q₋₁ exp(power·h) with
        whitened moments E_p̃[z] = power·m and Cov_p̃[z] = I + power·M.

        With Λ = R Rᵀ the cavity's precision and u = Rᵀμ, the site is::

            Λ_n = −R (I + power·M)⁻¹ M Rᵀ,     η_n = R (I + power·M)⁻¹ (m − M u)

        which never forms Λ̃ − Λ, and at power → 0 becomes the expected-curvature site
        Λ_n = −E_q₋₁[∇²h], η_n = Λ_n μ + E_q₋₁[∇h].  Not finite when I + power·M is not
        positive definite (the moments do not describe a Gaussian).
        """
        d = m.shape[0]
        factor = jnp.linalg.cholesky(jnp.eye(d) + power * M)
        u = w.root.T @ w.mean
        solved = jsl.cho_solve((factor, True), jnp.column_stack([m - M @ u, M]))
        eta = w.root @ solved[:, 0]
        precision = -(w.root @ solved[:, 1:]) @ w.root.T
        return Natural(eta, 0.5 * (precision + precision.T))

    def noise(self, key: jax.Array, d: int, std: float | jax.Array) -> Natural:
        """Gaussian noise for a released factor: iid N(0, std²) on η and on the upper triangle of
        Λ (diagonal included), mirrored below it, as in the paper's Definition 4.2.

        A symmetric difference D has ‖upper triangle of D‖₂ ≤ ‖D‖_F, so the noise on the d(d+1)/2
        free entries is calibrated against a sensitivity no smaller than the Frobenius one.
        """
        key_eta, key_precision = jax.random.split(key)
        upper = jnp.triu(gaussian_noise(key_precision, (d, d), std))
        return Natural(
            gaussian_noise(key_eta, (d,), std), upper + jnp.triu(upper, 1).T
        )

    def project(self, precision: jax.Array, floor: float | jax.Array) -> jax.Array:
        """The symmetric matrix with the eigenvectors of ``precision`` and its eigenvalues raised
        to at least ``floor``: the paper's positive definite projection (Section 3.1, line 10)."""
        values, vectors = jnp.linalg.eigh(0.5 * (precision + precision.T))
        return (vectors * jnp.maximum(values, floor)) @ vectors.T

    def noise_spread(self, d: int) -> float:
        """About the largest eigenvalue of symmetric noise with iid N(0, 1) upper triangle: 2√d
        (the edge of Wigner's semicircle)."""
        return 2 * d**0.5

    def min_eigenvalue(self, precision: jax.Array) -> jax.Array:
        """Smallest eigenvalue of the precision."""
        return jnp.linalg.eigvalsh(precision)[0]

    def moments(self, q: Natural) -> tuple[np.ndarray, np.ndarray]:
        """Mean and covariance matrix of the Gaussian ``q`` (NumPy, float64)."""
        precision = np.asarray(q.precision, dtype=float)
        covariance = np.linalg.inv(precision)
        covariance = 0.5 * (covariance + covariance.T)
        return covariance @ np.asarray(q.eta, dtype=float), covariance

    def sample(self, q: Natural, rng: np.random.Generator, shape: tuple[int, ...]) -> np.ndarray:
        """Draws from the Gaussian ``q``, of shape ``shape + (d,)``."""
        mean, covariance = self.moments(q)
        z = rng.standard_normal((*shape, mean.shape[0]))
        return mean + z @ np.linalg.cholesky(covariance).T


@dataclass(frozen=True)
class DiagonalCovariance:
    """Gaussians with a diagonal covariance: O(d) per step, per record and node."""

    name: ClassVar[str] = "diagonal"

    def precision_from_matrix(self, matrix: jax.Array) -> jax.Array:
        """This family's form of a dense precision matrix (its diagonal)."""
        return jnp.diagonal(matrix)

    def precision_matvec(self, precision: jax.Array, vector: jax.Array) -> jax.Array:
        """Λ v (Λ may carry leading batch axes)."""
        return precision * vector

    def whiten(self, q: Natural) -> Whitening:
        """Mean and whitening root √Λ of the Gaussian ``q`` (its precisions must be positive)."""
        return Whitening(q.eta / q.precision, jnp.sqrt(q.precision))

    def to_theta(self, w: Whitening, z: jax.Array) -> jax.Array:
        """θ = μ + z / √Λ for whitened nodes ``z`` of shape (S, d)."""
        return w.mean + z / w.root

    def whiten_gradients(self, w: Whitening, grads: jax.Array) -> jax.Array:
        """∂/∂z = ∇_θ / √Λ."""
        return grads / w.root

    def tilted_curvature(
        self, weights: jax.Array, grads: jax.Array, z: jax.Array, m: jax.Array, power: jax.Array
    ) -> jax.Array:
        """Diagonal of the M of :meth:`FullCovariance.tilted_curvature`."""
        return weights @ (grads * z) - power * m**2

    def site(self, w: Whitening, m: jax.Array, M: jax.Array, power: jax.Array) -> Natural:
        """The diagonal version of :meth:`FullCovariance.site`; not finite where
        1 + power·M ≤ 0."""
        scale = 1 + power * M
        inverse = jnp.where(scale > 0, 1 / scale, jnp.nan)
        eta = w.root * (m - M * w.root * w.mean) * inverse
        return Natural(eta, -(w.root**2) * M * inverse)

    def noise(self, key: jax.Array, d: int, std: float | jax.Array) -> Natural:
        """iid N(0, std²) noise on η and on each precision."""
        key_eta, key_precision = jax.random.split(key)
        return Natural(
            gaussian_noise(key_eta, (d,), std), gaussian_noise(key_precision, (d,), std)
        )

    def project(self, precision: jax.Array, floor: float | jax.Array) -> jax.Array:
        """Each precision raised to at least ``floor``."""
        return jnp.maximum(precision, floor)

    def noise_spread(self, d: int) -> float:
        """Two standard deviations: each precision carries its own noise."""
        return 2.0

    def min_eigenvalue(self, precision: jax.Array) -> jax.Array:
        """Smallest precision."""
        return jnp.min(precision)

    def moments(self, q: Natural) -> tuple[np.ndarray, np.ndarray]:
        """Mean and vector of variances of the Gaussian ``q`` (NumPy, float64)."""
        precision = np.asarray(q.precision, dtype=float)
        return np.asarray(q.eta, dtype=float) / precision, 1 / precision

    def sample(self, q: Natural, rng: np.random.Generator, shape: tuple[int, ...]) -> np.ndarray:
        """Draws from the Gaussian ``q``, of shape ``shape + (d,)``."""
        mean, variance = self.moments(q)
        return mean + np.sqrt(variance) * rng.standard_normal((*shape, mean.shape[0]))


Family = FullCovariance | DiagonalCovariance

#: The families by the name users pass as ``covariance=``.
FAMILIES: dict[str, Family] = {"full": FullCovariance(), "diagonal": DiagonalCovariance()}
