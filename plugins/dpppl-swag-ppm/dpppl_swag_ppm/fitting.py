"""The SWAG-PPM procedure: a risk fit, weighted fits scaled until the requested ε is met, and the
optional re-weighted round (SWAG-PPM §2.3).

Everything :class:`PPMOutcome` holds besides the released draws and the achieved ε is private;
:meth:`dpppl_swag_ppm.mechanism.SwagPPM.fit` hands on only those two.  That includes the number of
calibration rounds, so progress is shown on fixed bars: one for the risk fit and one for each
calibration, sized for ``max_calibration_rounds`` fits and completed when the calibration ends,
whatever the number of fits it took.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import TYPE_CHECKING

import jax
import jax.numpy as jnp
import numpy as np

from dpppl.plugin import Progress, RecordModel, Task
from dpppl_swag_ppm.batches import Data
from dpppl_swag_ppm.errors import CalibrationError, SwagPPMError
from dpppl_swag_ppm.ppm import local_sensitivity, record_risks, reweight, risk_weights
from dpppl_swag_ppm.sgd import SwagTrainer
from dpppl_swag_ppm.swag import swag_gaussian

if TYPE_CHECKING:
    from dpppl_swag_ppm.mechanism import SwagPPM


@dataclass(frozen=True)
class WeightedRound:
    """One weighted SWAG fit and its evaluation (private apart from the draws it releases).

    Attributes
    ----------
    weights
        α_i used in the fit, shape (N,).
    risks
        r_i over ``draws``, shape (N,).
    draws
        The S draws the sensitivity was computed over, shape (S, P); the released ones are the
        first M of them, so the bound holds for each released draw.
    mean
        SWAG's mean (the next round's starting point).
    epsilon_per_draw
        2Δ_α,D over ``draws``.
    scale
        The factor s the base weights were multiplied by.
    """

    weights: np.ndarray
    risks: np.ndarray
    draws: jax.Array
    mean: jax.Array
    epsilon_per_draw: float
    scale: float


@dataclass(frozen=True)
class PPMOutcome:
    """Result of a whole SWAG-PPM run.

    Attributes
    ----------
    released
        The M released draws, shape (M, P): the only per-fit values that may leave the mechanism.
    epsilon
        The achieved ε of the release: M · 2Δ_α,D (basic composition).
    final
        The round that produced the release (private).
    risk_weights
        The weights from the risk fit, before scaling (private).
    """

    released: jax.Array
    epsilon: float
    final: WeightedRound
    risk_weights: np.ndarray


class PPMFitter:
    """Runs SWAG-PPM on one data set.

    Parameters
    ----------
    model
        The record model.
    data
        The private records, as device arrays.
    trainer
        SWAG fits of ``model`` under the chosen schedule.
    options
        The mechanism's options.
    key
        Entropy for every random draw of the run.
    progress
        Progress bars.
    """

    def __init__(
        self,
        model: RecordModel,
        data: Data,
        trainer: SwagTrainer,
        options: SwagPPM.Options,
        key: jax.Array,
        progress: Progress,
    ) -> None:
        self.model = model
        self.data = data
        self.trainer = trainer
        self.options = options
        self._key = key
        self._uses = 0
        self.progress = progress

    def _next_key(self) -> jax.Array:
        self._uses += 1
        return jax.random.fold_in(self._key, self._uses)

    def run(self, epsilon: float) -> PPMOutcome:
        """Fit, calibrate to ``epsilon`` for all M released draws together, and release.

        Parameters
        ----------
        epsilon
            The requested ε of all M released draws together.

        Returns
        -------
        PPMOutcome
            The release and, for tests, the private quantities behind it.

        Raises
        ------
        SwagPPMError
            If no record has a finite log-likelihood at the model's initial point.
        CalibrationError
            If no scaling of the weights met ``epsilon`` within the allowed rounds.
        TrainingDivergedError
            If a SWAG fit diverged.
        """
        o = self.options
        target = epsilon / o.draws
        start = jnp.asarray(self.model.initial_point())
        # Records whose log-likelihood is already infinite at the start cannot be fitted; they
        # are infinitely risky and get weight 0 from the outset.
        usable = np.isfinite(record_risks(self.model, self.data, start[None, :])).astype(float)
        if not usable.any():
            raise SwagPPMError(
                "no record has a finite log-likelihood at the model's initial point; check that "
                "the observed values lie in the likelihood's support"
            )
        epochs = self.trainer.schedule.epochs_per_fit
        with self.progress.task("SWAG-PPM risk fit", total=epochs) as bar:
            state = self.trainer.fit(
                self.data, jnp.asarray(usable), start, self._next_key(), bar=bar
            )
        gaussian = swag_gaussian(state, o.scale, o.var_floor)
        risks = record_risks(
            self.model, self.data, gaussian.sample(self._next_key(), o.risk_draws)
        )
        base = risk_weights(np.where(usable > 0, risks, np.inf), o.weight_scale, o.weight_shift)
        # The paper's α = ε / 2Δ, from the risk fit's draws, as the first guess of the scale.
        first = 2 * local_sensitivity(base, risks)
        scale = min(1.0, target / first) if first > 0 else 1.0
        final = self._calibrate(base, scale, state.mean, target, "SWAG-PPM calibration")
        if o.reweight:
            reweighted = reweight(final.weights, final.risks, o.reweight_k)
            final = self._calibrate(
                reweighted, 1.0, final.mean, target, "SWAG-PPM re-weighted calibration"
            )
        return PPMOutcome(
            released=final.draws[: o.draws],
            epsilon=o.draws * final.epsilon_per_draw,
            final=final,
            risk_weights=base,
        )

    def _weighted_round(
        self, weights: np.ndarray, scale: float, start: jax.Array, bar: Task
    ) -> WeightedRound:
        o = self.options
        state = self.trainer.fit(self.data, jnp.asarray(weights), start, self._next_key(), bar=bar)
        draws = swag_gaussian(state, o.scale, o.var_floor).sample(self._next_key(), o.risk_draws)
        risks = record_risks(self.model, self.data, draws)
        return WeightedRound(
            weights=weights,
            risks=risks,
            draws=draws,
            mean=state.mean,
            epsilon_per_draw=2 * local_sensitivity(weights, risks),
            scale=scale,
        )

    def _calibrate(
        self, base: np.ndarray, scale: float, start: jax.Array, target: float, label: str
    ) -> WeightedRound:
        """Fit with weights ``scale · base``, adjusting the scale until 2Δ ≤ ``target``.

        Accepts the first fit within ``calibration_tolerance`` below the target (or at scale 1);
        otherwise keeps the feasible fit of largest scale.  A record whose log-likelihood is not
        finite at some draw is given weight 0 and the fit is repeated.  Progress goes to one bar
        named ``label``, sized for every allowed fit (see the module docstring).
        """
        total = self.options.max_calibration_rounds * self.trainer.schedule.epochs_per_fit
        with self.progress.task(label, total=total) as bar:
            return self._calibrate_on(base, scale, start, target, bar)

    def _calibrate_on(
        self, base: np.ndarray, scale: float, start: jax.Array, target: float, bar: Task
    ) -> WeightedRound:
        o = self.options
        aim = target * (1 - o.calibration_tolerance / 2)
        best: WeightedRound | None = None
        feasible, infeasible = 0.0, math.inf
        previous: tuple[float, float] | None = None
        for _ in range(o.max_calibration_rounds):
            fitted = self._weighted_round(scale * base, scale, start, bar)
            broken = (fitted.weights > 0) & ~np.isfinite(fitted.risks)
            if broken.any():
                base = np.where(broken, 0.0, base)
                continue
            start = fitted.mean
            achieved = fitted.epsilon_per_draw
            if achieved <= target:
                if best is None or scale > best.scale:
                    best = fitted
                if achieved >= (1 - o.calibration_tolerance) * target or scale >= 1.0:
                    break
                feasible = max(feasible, scale)
            else:
                infeasible = min(infeasible, scale)
            if achieved <= 0:
                proposal = 1.0
            else:
                exponent = _growth_exponent(previous, (scale, achieved))
                proposal = scale * (aim / achieved) ** (1 / exponent)
                previous = (scale, achieved)
            # The secant's slope comes from noisy Monte Carlo maxima and can overshoot: a guess
            # outside the bracket is replaced by the bracket's geometric midpoint.
            if not feasible < proposal < infeasible:
                proposal = math.sqrt(feasible * infeasible)
            scale = min(1.0, proposal)
        if best is None:
            raise CalibrationError(
                f"no scaling of the weights brought epsilon under the request within "
                f"{o.max_calibration_rounds} rounds; ask for a larger epsilon, fewer released "
                "draws, or raise max_calibration_rounds"
            )
        return best


def _growth_exponent(
    previous: tuple[float, float] | None, current: tuple[float, float]
) -> float:
    """β in ε ∝ s^β, from the last two fits (1 with only one).

    ε grows more slowly than the scale s because a flatter pseudo posterior spreads its draws
    further, where log-likelihoods are larger; the slope is kept in [0.2, 1.5] against noise in
    the Monte Carlo maximum.
    """
    if previous is None or previous[0] == current[0]:
        return 1.0
    slope = math.log(current[1] / previous[1]) / math.log(current[0] / previous[0])
    return min(1.5, max(0.2, slope))
