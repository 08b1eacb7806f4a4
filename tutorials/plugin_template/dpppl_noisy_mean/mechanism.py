"""The ``"noisy-mean"`` mechanism: Gaussian output perturbation of a clipped sum.

For a model ``mu ~ <prior>; y ~ Normal(mu, 1)`` with N records:

1. Release s̃ = Σᵢ clip(yᵢ, -B, B) + N(0, (σB)²).  One record moves the clipped sum by at most
   B (add/remove-one), so relative to that sensitivity the noise is N(0, σ²): one Gaussian
   release, ``GaussianEvent(σ)``, with σ calibrated by the accountant.
2. From s̃ alone: s̃ | mu ≈ N(N·mu, N + (σB)²) (clipping ignored: choose B well outside the
   data's range), times the model's prior, evaluated on a grid of mu: a noise-aware posterior.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Annotated, ClassVar

import jax
import jax.numpy as jnp
import numpy as np

from dpppl.plugin import (
    POSITIVE,
    GaussianEvent,
    Interval,
    Mechanism,
    ModelNotSupportedError,
    PrivacyEvent,
    PrivacyPlan,
    Progress,
    RecordModel,
    Release,
)

#: Grid points of the posterior over mu.
GRID = 4001


class NoisyMean(Mechanism):
    """Gaussian output perturbation of a clipped mean, with a noise-aware grid posterior."""

    name: ClassVar[str] = "noisy-mean"
    description: ClassVar[str] = "Gaussian output perturbation of a clipped mean (template)"

    @dataclass(frozen=True)
    class Options:
        """Options of ``dpppl.sample(mechanism="noisy-mean", ...)``.

        Attributes
        ----------
        bound
            B: each observation is clipped to [-B, B]; choose it without looking at the data.
        draws
            Posterior draws released.
        """

        # dpppl checks every value against these annotations before any privacy budget is
        # spent; rules that tie options together go in __post_init__ (raise InvalidOptionError).
        bound: Annotated[float, POSITIVE] = 10.0
        draws: Annotated[int, Interval(2)] = 1000

    def check_model(self, model: RecordModel) -> None:
        """Refuse, before any budget is spent, models other than ``y ~ Normal(mu, 1)``."""
        if model.n_params != 1 or len(model.record_names) != 1:
            raise ModelNotSupportedError(
                "noisy-mean needs one scalar parameter mu and one observed variable "
                "y ~ Normal(mu, 1) without covariates"
            )
        name, dtype = model.record_names[0], model.structure.variables[0].dtype
        # log N(1 | mu, 1) - log N(0 | mu, 1) = mu - 1/2 for the model this mechanism assumes.
        for mu in (-0.7, 0.4):
            theta = jnp.asarray([mu])
            gap = model.loglik(theta, {name: jnp.asarray([1.0], dtype)})[0] - model.loglik(
                theta, {name: jnp.asarray([0.0], dtype)}
            )[0]
            if not math.isclose(float(gap), mu - 0.5, abs_tol=1e-8):
                raise ModelNotSupportedError(
                    "noisy-mean supports y ~ Normal(mu, 1) with mu unconstrained; this "
                    "model's likelihood is different"
                )

    def privacy_event(self, *, n_records: int, noise_multiplier: float) -> PrivacyEvent:
        return GaussianEvent(noise_multiplier)

    def noise_multiplier_guess(self, *, n_records: int, epsilon: float, delta: float) -> float:
        return math.sqrt(2 * math.log(1.25 / delta)) / epsilon

    def fit(
        self,
        model: RecordModel,
        data: Mapping[str, np.ndarray],
        plan: PrivacyPlan,
        *,
        seed: np.random.SeedSequence,
        progress: Progress,
    ) -> Release:
        bound, draws = self.options.bound, self.options.draws
        # Every random draw comes from `seed`: the same seed gives the same result.
        rng = np.random.default_rng(seed)
        y = model.check_data(data)[model.record_names[0]].astype(float)
        n = y.shape[0]
        noise_std = plan.noise_multiplier * bound
        # The DP release, the only use of the data.
        noisy_sum = float(np.clip(y, -bound, bound).sum() + rng.normal(0.0, noise_std))

        # Post-processing of noisy_sum: prior x noise-aware likelihood on a grid of mu.
        sd = math.sqrt(n + noise_std**2) / n
        grid = np.linspace(noisy_sum / n - 12 * sd - 12, noisy_sum / n + 12 * sd + 12, GRID)
        logprior = np.asarray(jax.vmap(model.logprior)(jnp.asarray(grid)[:, None]))
        loglik = -0.5 * (noisy_sum - n * grid) ** 2 / (n + noise_std**2)
        log_post = np.where(np.isfinite(logprior), logprior + loglik, -np.inf)
        weights = np.exp(log_post - log_post.max())
        cells = rng.choice(GRID, size=draws, p=weights / weights.sum())
        # Uniform within a grid cell, so that draws are not restricted to grid points.
        mu = grid[cells] + rng.uniform(-0.5, 0.5, size=draws) * (grid[1] - grid[0])
        return Release(draws=mu.reshape(1, draws, 1), attrs={"noise_std": noise_std})
