"""The ``"bernstein_sheldon"`` mechanism: noisy sufficient statistics, noise-aware posterior.

Bernstein & Sheldon, "Differentially private Bayesian inference for exponential families"
(NeurIPS 2018), with Gaussian instead of Laplace noise:

1. Release s̃ = Σᵢ s(xᵢ) + N(0, (σΔ)² I): the sum of each record's bounded sufficient statistic
   (L2 sensitivity Δ under add/remove) plus Gaussian noise, σ calibrated by the accountant for
   one Gaussian release.  This is the only access to the data.
2. Post-process s̃ alone: by the central limit theorem Σᵢ s(xᵢ) | θ ≈ N(N μ(θ), N Σ(θ)), with μ
   and Σ the mean and covariance of the *bounded* statistic, so the noise integrates out in
   closed form, s̃ | θ ≈ N(N μ(θ), N Σ(θ) + (σΔ)² I).  The posterior of θ under the model's own
   prior and this likelihood is sampled by importance sampling from a Student-t centred at its
   mode.  The result is as uncertain as the noise makes it: the posterior is noise-aware.
"""

from __future__ import annotations

import math
import warnings
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Annotated, ClassVar

import jax
import jax.numpy as jnp
import numpy as np
import xarray as xr
from scipy import optimize, stats

from dpppl.plugin import (
    POSITIVE,
    GaussianEvent,
    Mechanism,
    NeighbourRelation,
    PrivacyEvent,
    PrivacyPlan,
    Progress,
    RecordModel,
    Release,
)
from dpppl_bernstein_sheldon.families import Family, family_of

#: Degrees of freedom of the importance proposal: heavy tails keep the weights bounded when the
#: posterior is skewed (a rate near zero, a probability near the boundary).
PROPOSAL_DOF = 5.0
#: The proposal's scale is the Laplace approximation's, widened by this factor.
PROPOSAL_WIDENING = 1.5
#: A fit whose importance weights have an effective sample size below this fraction of the
#: released draws warns: its draws repeat a few proposals.
MIN_ESS_FRACTION = 0.25


class BernsteinSheldon(Mechanism):
    """Noisy sufficient statistics with a noise-aware posterior (Bernstein & Sheldon 2018).

    Supports one observed variable with a Bernoulli, Exponential or Categorical likelihood
    and no covariates, under any prior of its parameters (e.g. Beta–Bernoulli,
    Gamma–Exponential, Dirichlet–Categorical).
    """

    name: ClassVar[str] = "bernstein_sheldon"
    description: ClassVar[str] = (
        "noisy sufficient statistics + noise-aware posterior for exponential families "
        "(Bernstein & Sheldon 2018); example third-party plugin"
    )
    relation: ClassVar[NeighbourRelation] = NeighbourRelation.ADD_OR_REMOVE_ONE

    @dataclass(frozen=True)
    class Options:
        """Options of ``dpppl.sample(mechanism="bernstein_sheldon", ...)``.

        Attributes
        ----------
        bound
            B, for Exponential likelihoods: each observation is clipped to [0, B] before it is
            summed, so one record moves the sum by at most B (the sensitivity).  Choose it
            without looking at the data (from the prior or domain knowledge): too small biases
            nothing (the posterior models the clipping) but loses information; too large
            costs noise.  Unused by the other families, whose statistics are bounded already.
        draws
            Posterior draws released.
        oversampling
            Importance proposals per released draw.
        """

        bound: Annotated[float, POSITIVE] = 5.0
        draws: Annotated[int, POSITIVE] = 1000
        oversampling: Annotated[int, POSITIVE] = 20

    # -- privacy (runs before the data are touched) -------------------------------------------

    def check_model(self, model: RecordModel) -> None:
        family_of(model, self.options.bound)

    def privacy_event(self, *, n_records: int, noise_multiplier: float) -> PrivacyEvent:
        # One release of a sum of bounded statistics: the statistic is bounded by Δ and the noise
        # has standard deviation σΔ, so relative to the sensitivity it is plain N(0, σ²).
        return GaussianEvent(noise_multiplier)

    def noise_multiplier_guess(self, *, n_records: int, epsilon: float, delta: float) -> float:
        # The classical Gaussian-mechanism σ; the accountant refines it in a few steps.
        return math.sqrt(2 * math.log(1.25 / delta)) / epsilon

    # -- fitting --------------------------------------------------------------------------------

    def fit(
        self,
        model: RecordModel,
        data: Mapping[str, np.ndarray],
        plan: PrivacyPlan,
        *,
        seed: np.random.SeedSequence,
        progress: Progress,
    ) -> Release:
        o = self.options
        arrays = model.check_data(data)
        family = family_of(model, o.bound)
        rng = np.random.default_rng(seed)
        n_records = next(iter(arrays.values())).shape[0]

        # The DP release: the only line that reads the data.
        noise_std = plan.noise_multiplier * family.sensitivity
        statistics = family.statistic(arrays[model.record_names[0]])
        noisy = statistics.sum(axis=0) + rng.normal(0.0, noise_std, size=statistics.shape[1])

        # Post-processing of `noisy` alone.
        log_target, gradient, hessian = _compiled(model, family)
        args = (jnp.asarray(noisy), float(n_records), noise_std)
        with progress.task("noise-aware posterior (importance sampling)", total=1) as bar:
            draws, ess = _importance_sample(
                model, log_target, gradient, hessian, args, rng, o.draws, o.oversampling
            )
            bar.advance(1)
        if ess < MIN_ESS_FRACTION * o.draws:
            warnings.warn(
                f"bernstein_sheldon: the importance weights' effective sample size is {ess:.0f} "
                f"for {o.draws} draws; the posterior is approximated by few distinct points",
                stacklevel=3,
            )
        return Release(
            draws=draws[None],
            groups={
                "noisy_sufficient_statistics": xr.Dataset(
                    {"s": (("statistic",), noisy)},
                    coords={"statistic": list(family.labels)},
                    attrs={"description": "the DP release: sum of bounded sufficient statistics "
                           "plus N(0, noise_std^2) noise per coordinate"},
                )
            },
            attrs={
                "family": family.name,
                "sensitivity": family.sensitivity,
                "noise_std": noise_std,
                "importance_ess": ess,
            },
        )


def _compiled(model: RecordModel, family: Family):
    """log posterior of θ given the noisy sum, its gradient and Hessian, jitted once per model."""

    def build():
        def log_target(theta, noisy, n, noise_std):
            mean, cov = family.moments(theta)
            total = n * cov + noise_std**2 * jnp.eye(mean.shape[0])
            residual = noisy - n * mean
            _, logdet = jnp.linalg.slogdet(total)
            quad = residual @ jnp.linalg.solve(total, residual)
            loglik = -0.5 * (quad + logdet + mean.shape[0] * jnp.log(2 * jnp.pi))
            value = model.logprior(theta) + loglik
            return jnp.where(jnp.isfinite(value), value, -jnp.inf)

        return (
            jax.jit(jax.vmap(log_target, in_axes=(0, None, None, None))),
            jax.jit(jax.grad(log_target)),
            jax.jit(jax.hessian(log_target)),
        )

    return model.cached(("dpppl_bernstein_sheldon", family.name, family.sensitivity), build)


def _importance_sample(model, log_target, gradient, hessian, args, rng, draws, oversampling):
    """``draws`` posterior draws (draws, d) by importance resampling, and the weights' ESS."""
    d = model.n_params

    def negative(theta):
        return -float(log_target(jnp.asarray(theta)[None], *args)[0])

    def negative_grad(theta):
        return -np.asarray(gradient(jnp.asarray(theta), *args))

    found = optimize.minimize(negative, model.initial_point(), jac=negative_grad, method="BFGS")
    mode = found.x
    precision = -np.asarray(hessian(jnp.asarray(mode), *args))
    eigenvalues, vectors = np.linalg.eigh(0.5 * (precision + precision.T))
    # A flat or non-concave direction (a noisy sum far outside the model's range) falls back to
    # a unit scale there rather than an infinite one.
    eigenvalues = np.where(eigenvalues > 1e-8, eigenvalues, 1.0)
    scale = PROPOSAL_WIDENING**2 * (vectors / eigenvalues) @ vectors.T
    proposal = stats.multivariate_t(loc=mode, shape=scale, df=PROPOSAL_DOF, seed=rng)
    points = np.asarray(proposal.rvs(size=draws * oversampling)).reshape(-1, d)
    log_weights = np.asarray(log_target(jnp.asarray(points), *args)) - proposal.logpdf(points)
    log_weights = np.where(np.isfinite(log_weights), log_weights, -np.inf)
    weights = np.exp(log_weights - log_weights.max())
    weights /= weights.sum()
    ess = float(1.0 / np.sum(weights**2))
    chosen = rng.choice(points.shape[0], size=draws, replace=True, p=weights)
    return points[chosen], ess
