"""The ``"swag-ppm"`` mechanism: SWAG draws from a risk-weighted pseudo posterior.

Its guarantee is not (ε, δ)-DP in the DP-SGD sense and no accountant composes it: ε is twice the
*local* sensitivity of the weighted log-likelihood, estimated by Monte Carlo over posterior draws
on this data set, and the δ that makes it a global guarantee shrinks as O(n^(-1/2)) without a
finite-sample value (SWAG-PPM Appendix C).  The plan says so (``event=None``, ``accountant=None``)
and the result's ``dp_guarantee`` names that kind.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Annotated, ClassVar, Literal

import numpy as np

from dpppl.plugin import (
    NON_NEGATIVE,
    POSITIVE,
    Accountant,
    Interval,
    InvalidOptionError,
    Mechanism,
    NeighbourRelation,
    PrivacyPlan,
    Progress,
    RecordModel,
    Release,
    jax_key,
)
from dpppl_swag_ppm.batches import to_device
from dpppl_swag_ppm.fitting import PPMFitter
from dpppl_swag_ppm.sgd import (
    DENSE_PRECONDITIONER_LIMIT,
    Schedule,
    SwagTrainer,
    default_batch_size,
    default_warmup_epochs,
)
from dpppl_swag_ppm.swag import DEFAULT_SCALE, DEFAULT_VAR_FLOOR

#: The kind of guarantee, as ``dp_guarantee`` states it.
GUARANTEE = (
    "local asymptotic DP of the pseudo posterior mechanism (not (epsilon, delta)-DP: epsilon is "
    "the requested bound on 2 x a Monte Carlo estimate of the local sensitivity on this data set, "
    "per released draw, composed over the draws; the argument is about exact pseudo-posterior "
    "draws, not SWAG's Gaussian approximation of them; delta -> 0 as O(n^-1/2) and has no "
    "finite-sample value)"
)
_DELTA_NOTE = (
    "not quantified: delta -> 0 as O(n^-1/2) (Savitsky et al. 2022; SWAG-PPM Appendix C); "
    "dp_delta is NaN and the requested delta is not guaranteed"
)
class SwagPPM(Mechanism):
    """SWAG pseudo posterior mechanism (SWAG-PPM).

    1. A SWAG fit of the posterior; ``risk_draws`` draws from it give each record's risk
       r_i = max_s |log p(x_i | θ_s)| and weight α_i = c(1 - r̃_i) + g in [0, 1] (0 for records
       whose log-likelihood is not finite).
    2. SWAG fits of the pseudo posterior p(θ) Π p(x_i | θ)^(s·α_i), adjusting s ≤ 1 until
       ``draws`` · 2Δ ≤ ε, where Δ = max over ``risk_draws`` draws and the records of
       |s α_i log p(x_i | θ)|.
    3. Optionally (``reweight=True``) the re-weighted round α_i^w = k α_i Δ / Δ_i, calibrated the
       same way.

    The result holds ``draws`` draws of the last fit (among those Δ was computed over).  Each draw
    is 2Δ-private and they compose by basic composition to ``draws`` · 2Δ, which the calibration
    keeps at or below the requested ε.  ``dp_epsilon`` is that requested ε: the achieved value is
    a noise-free statistic of the most extreme weighted record, so it differs between neighbouring
    data sets and is kept inside the mechanism.
    """

    name: ClassVar[str] = "swag-ppm"
    description: ClassVar[str] = (
        "SWAG pseudo posterior mechanism: risk-weighted likelihood; local asymptotic DP, "
        "not (epsilon, delta)-DP"
    )
    relation: ClassVar[NeighbourRelation] = NeighbourRelation.ADD_OR_REMOVE_ONE
    preferred_accountants: ClassVar[tuple[str, ...]] = ()

    @dataclass(frozen=True)
    class Options:
        """Options of ``dpppl.sample(mechanism="swag-ppm", ...)``.

        Attributes
        ----------
        draws
            M, posterior draws released.  Each costs 2Δ, so the weights are scaled until
            M · 2Δ ≤ ε: more draws describe the posterior better but flatten it.  10 by default:
            enough for a mean and spread, at a tenth of the budget per draw.
        risk_draws
            S, draws per SWAG fit over which risks and Δ are maximised (the paper's 500).  The
            released draws are among them.
        rank
            K, deviations kept for SWAG's low-rank part (Maddox et al.'s 20).
        scale
            SWAG's covariance scale (½ for the low-rank-plus-diagonal form).
        var_floor
            Smallest diagonal variance (the reference implementation's 1e-30).
        batch_size
            B, records per SGD step; None: N // 10, at most 256.
        warmup_epochs
            Adam epochs at the start of every SWAG fit; None: at least 20 epochs and 2000 steps.
        warmup_lr
            Initial Adam learning rate, cosine-decayed to 0 over the warm-up.
        burn_in_epochs
            Constant-learning-rate SGD epochs before collecting (5: SGD reaches its stationary
            spread within about two epochs under the learning-rate rule).
        swag_epochs
            Collected SGD epochs per fit (50).
        collect_every
            SGD steps between collections; None: once per epoch (N // B steps).
        preconditioner
            ``"dense"``, ``"diagonal"`` or ``"auto"`` (dense up to 1000 parameters).  The learning
            rate is the matrix 2(Q + 1.25 Λ)⁻¹ from the gradient noise Q and the curvature Λ,
            which makes SGD's stationary spread the posterior's (see ``dpppl_swag_ppm.sgd``); the
            diagonal form misses the posterior's correlations.
        weight_scale, weight_shift
            c and g of α_i = c(1 - r̃_i) + g (the paper's 1 and 0).
        reweight
            Run the re-weighted third round (α_i^w = k α_i Δ / Δ_i).
        reweight_k
            k < 1 of the re-weighting (the paper's 0.95).
        calibration_tolerance
            A fit whose ε lies within this fraction below the target is accepted; otherwise the
            weights are rescaled and refitted.  0.15: the Monte Carlo maximum behind ε varies by
            about ±8 % between fits of the same scale, so a narrower band mostly costs refits.
        max_calibration_rounds
            Weighted fits allowed per calibration; if none meets ε the fit fails and nothing is
            released.
        """

        draws: Annotated[int, POSITIVE] = 10
        risk_draws: Annotated[int, POSITIVE] = 500
        rank: Annotated[int, POSITIVE] = 20
        scale: Annotated[float, POSITIVE] = DEFAULT_SCALE
        var_floor: Annotated[float, NON_NEGATIVE] = DEFAULT_VAR_FLOOR
        batch_size: Annotated[int, POSITIVE] | None = None
        warmup_epochs: Annotated[int, POSITIVE] | None = None
        warmup_lr: Annotated[float, POSITIVE] = 0.05
        burn_in_epochs: Annotated[int, NON_NEGATIVE] = 5
        swag_epochs: Annotated[int, POSITIVE] = 50
        collect_every: Annotated[int, POSITIVE] | None = None
        preconditioner: Literal["auto", "dense", "diagonal"] = "auto"
        weight_scale: Annotated[float, POSITIVE] = 1.0
        weight_shift: float = 0.0
        reweight: bool = False
        reweight_k: Annotated[float, Interval(0, 1, low_open=True, high_open=True)] = 0.95
        calibration_tolerance: Annotated[
            float, Interval(0, 1, low_open=True, high_open=True)
        ] = 0.15
        max_calibration_rounds: Annotated[int, POSITIVE] = 8

        def __post_init__(self) -> None:
            if self.risk_draws < self.draws:
                raise InvalidOptionError(
                    f"risk_draws ({self.risk_draws}) must be at least draws ({self.draws}): the "
                    "released draws are among those the sensitivity is computed over"
                )
            if self.weight_scale + self.weight_shift <= 0:
                raise InvalidOptionError(
                    "weight_scale + weight_shift must be positive, or every record gets weight 0"
                )

    def schedule(self, n_records: int, n_params: int) -> Schedule:
        """The SGD schedule for N = ``n_records`` records and P = ``n_params`` parameters.

        Parameters
        ----------
        n_records
            N, public.
        n_params
            P, the length of the model's unconstrained parameter vector; it only chooses the
            preconditioner when ``preconditioner="auto"``.

        Returns
        -------
        Schedule
            Batch size, epochs, collection interval and preconditioner of every SWAG fit.

        Raises
        ------
        ValueError
            If ``batch_size`` exceeds N or the schedule collects fewer than two iterates per fit.
        """
        o = self.options
        batch_size = o.batch_size if o.batch_size is not None else default_batch_size(n_records)
        if batch_size > n_records:
            raise InvalidOptionError(
                f"batch_size ({batch_size}) exceeds the number of records ({n_records})"
            )
        steps = n_records // batch_size
        preconditioner = o.preconditioner
        if preconditioner == "auto":
            preconditioner = "dense" if n_params <= DENSE_PRECONDITIONER_LIMIT else "diagonal"
        schedule = Schedule(
            n_records=n_records,
            batch_size=batch_size,
            warmup_epochs=(
                o.warmup_epochs if o.warmup_epochs is not None else default_warmup_epochs(steps)
            ),
            warmup_lr=float(o.warmup_lr),
            burn_in_epochs=o.burn_in_epochs,
            swag_epochs=o.swag_epochs,
            collect_every=o.collect_every if o.collect_every is not None else steps,
            rank=o.rank,
            preconditioner=preconditioner,
        )
        if schedule.collections < 2:
            raise InvalidOptionError(
                f"swag_epochs={o.swag_epochs} with collect_every={schedule.collect_every} steps "
                f"({steps} steps per epoch) collects {schedule.collections} iterate(s); SWAG needs "
                "at least 2"
            )
        return schedule

    def plan(
        self, *, n_records: int, epsilon: float, delta: float, accountant: Accountant | None
    ) -> PrivacyPlan:
        """The promised guarantee: achieved ε ≤ ``epsilon``, of the PPM's local, asymptotic kind.

        No accountant is used: ``accountant`` is ignored (the core passes None, as
        ``preferred_accountants`` is empty, unless the user names one).  The requested ``delta``
        is recorded but not guaranteed: the PPM has no finite-sample δ, so the plan's δ is NaN.

        Raises
        ------
        ValueError
            If the options give an impossible schedule for ``n_records`` records.
        """
        # Refuse impossible schedules before any data is read (P is not known yet).
        self.schedule(n_records, n_params=0)
        o = self.options
        return PrivacyPlan(
            epsilon=float(epsilon),
            delta=math.nan,
            relation=self.relation,
            event=None,
            accountant=None,
            guarantee=GUARANTEE,
            details={
                "released_draws": o.draws,
                "risk_draws": o.risk_draws,
                "composition": "basic: epsilon = released_draws x 2 x local sensitivity",
                "per_draw_epsilon_target": float(epsilon) / o.draws,
                "sensitivity": (
                    "Monte Carlo local sensitivity: max over risk_draws draws and the records of "
                    "|alpha_i log p(x_i | theta)|; a lower bound on the supremum over theta"
                ),
                "delta": _DELTA_NOTE,
                "requested_delta": float(delta),
            },
        )

    def fit(
        self,
        model: RecordModel,
        data: Mapping[str, np.ndarray],
        plan: PrivacyPlan,
        *,
        seed: np.random.SeedSequence,
        progress: Progress,
    ) -> Release:
        """Run SWAG-PPM and release M draws under the requested ε (nothing per record; not even
        the achieved ε, which is a statistic of the data).

        Raises
        ------
        CalibrationError
            If no scaling of the weights met ``plan.epsilon``; nothing is released.
        TrainingDivergedError
            If a SWAG fit diverged.
        SwagPPMError
            If no record has a finite log-likelihood at the model's initial point.
        """
        arrays = to_device(model.check_data(data))
        n_records = next(iter(arrays.values())).shape[0]
        schedule = self.schedule(n_records, model.n_params)
        fitter = PPMFitter(
            model, arrays, SwagTrainer(model, schedule), self.options, jax_key(seed), progress
        )
        outcome = fitter.run(plan.epsilon)
        return Release(
            draws=np.asarray(outcome.released)[None, :, :],
            attrs={
                "batch_size": schedule.batch_size,
                "steps_per_epoch": schedule.steps_per_epoch,
                "warmup_epochs": schedule.warmup_epochs,
                "burn_in_epochs": schedule.burn_in_epochs,
                "swag_epochs": schedule.swag_epochs,
                "collect_every": schedule.collect_every,
                "collections_per_fit": schedule.collections,
                "preconditioner": schedule.preconditioner,
            },
            # The requested ε bounds the achieved one by construction; publishing the achieved
            # value would release max_i |α_i log p(x_i | θ)| without noise.
            privacy={"epsilon": plan.epsilon, "details": plan.details},
        )
