"""The prior as a Gaussian site plus an exact correction shared out among the records.

SEP needs the prior p₀(θ) as a Gaussian site (q = p₀ f^N).  The model's prior on the unconstrained
θ is Gaussian only for Normal priors; a HalfNormal scale, say, is not Gaussian on the log scale.
So the prior is split into

* p̂₀, its Laplace approximation (mode and curvature of the model's log prior in θ, Jacobians
  included), the Gaussian prior site, and
* the residual r(θ) = log p₀(θ) − log p̂₀(θ), which every record's tilted distribution carries with
  weight 1/N: p̃_n ∝ q₋₁ p(x_n | θ) exp(r(θ)/N).  SEP's N copies of the global site then stand
  for exp(r) ∏ p(x_n | θ), so the fixed point targets the model's own posterior.

For Normal priors r is constant and nothing changes.  Both parts are functions of the model alone,
never of the data.
"""

from __future__ import annotations

from typing import NamedTuple

import jax
import jax.numpy as jnp
import numpy as np

from dpppl.plugin import ModelNotSupportedError, RecordModel
from dpppl_dp_sep.families import Family, Natural

#: Newton iterations allowed to find the prior's mode.
MAX_NEWTON_STEPS = 100
#: The mode is accepted once a Newton step moves θ by less than this (in prior standard deviations).
NEWTON_TOLERANCE = 1e-10


class GaussianPrior(NamedTuple):
    """The Gaussian prior site p̂₀ = N(mean, precision⁻¹) in a family's parametrisation."""

    site: Natural
    mean: jax.Array


def _laplace_functions(model: RecordModel):
    return (
        jax.jit(jax.value_and_grad(model.logprior)),
        jax.jit(jax.hessian(model.logprior)),
    )


def prior_mode(model: RecordModel) -> tuple[np.ndarray, np.ndarray]:
    """Mode of the model's log prior in θ and the negative Hessian there, by damped Newton steps
    from PyMC's initial point.

    Raises
    ------
    ModelNotSupportedError
        If the log prior has no mode with a positive definite curvature (an improper prior such
        as ``pm.Flat``): DP-SEP needs a proper Gaussian prior site.
    """
    value_and_grad, hessian = model.cached("dp-sep/prior-laplace", lambda: _laplace_functions(model))
    theta = np.asarray(model.initial_point(), dtype=float)
    value, grad = value_and_grad(theta)
    for _ in range(MAX_NEWTON_STEPS):
        curvature = -np.asarray(hessian(theta))
        step = _newton_step(curvature, np.asarray(grad))
        if step is None:
            break
        # Halve the step until the log prior does not decrease (the prior need not be log-concave).
        for _ in range(60):
            new_value, new_grad = value_and_grad(theta + step)
            if np.isfinite(new_value) and new_value >= value - 1e-12 * abs(value):
                break
            step = step / 2
        theta, value, grad = theta + step, new_value, new_grad
        scale = np.sqrt(np.abs(np.diag(curvature))) + 1e-300
        if np.max(np.abs(step) * scale) < NEWTON_TOLERANCE:
            break
    curvature = -np.asarray(hessian(theta))
    curvature = 0.5 * (curvature + curvature.T)
    if not (np.all(np.isfinite(curvature)) and np.linalg.eigvalsh(curvature)[0] > 0):
        raise ModelNotSupportedError(
            "dp-sep needs a proper prior whose log density (on the unconstrained scale) has a "
            "mode with positive curvature, to serve as SEP's Gaussian prior site; this model's "
            "prior has none (an improper prior such as pm.Flat?). Give every free variable a "
            "proper prior"
        )
    return theta, curvature


def _newton_step(curvature: np.ndarray, grad: np.ndarray) -> np.ndarray | None:
    """The Newton step, or a gradient step where the curvature is not positive definite."""
    if not np.all(np.isfinite(grad)):
        return None
    try:
        np.linalg.cholesky(curvature)
    except np.linalg.LinAlgError:
        return grad / max(1.0, float(np.linalg.norm(grad)))
    return np.linalg.solve(curvature, grad)


def gaussian_prior(model: RecordModel, family: Family) -> GaussianPrior:
    """The Laplace approximation of the model's prior as a site of ``family``."""
    mean, curvature = prior_mode(model)
    precision = family.precision_from_matrix(jnp.asarray(curvature))
    eta = family.precision_matvec(precision, jnp.asarray(mean))
    return GaussianPrior(Natural(eta, precision), jnp.asarray(mean))


def prior_residual(model: RecordModel, family: Family, prior: GaussianPrior, theta: jax.Array):
    """r(θ) = log p₀(θ) − log p̂₀(θ), up to a constant."""
    centred = theta - prior.mean
    quadratic = centred @ family.precision_matvec(prior.site.precision, centred)
    return model.logprior(theta) + 0.5 * quadratic
