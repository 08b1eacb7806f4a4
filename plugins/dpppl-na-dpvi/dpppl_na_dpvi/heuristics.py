"""Data-independent rules for NA-DPVI's hyperparameters: C, β, λ_c, T* and φ_0.

The reference code tuned C (1.4 to 260) and the preconditioning (up to 5000) by hand for every
model.  The rules here instead *standardise* the per-record gradients so that one clipping bound
and one learning-rate rule fit every model.  They use only public quantities (N, d, κ, T, σ) and
the iterates DP-SGD has already released, so choosing them costs no privacy.

Standardisation.  Near the optimum of the ELBO the variance of q is about 1/(N Ī), with Ī the
average Fisher information of a record, so

* β_μ = sd · √N turns each record's μ-gradient (its score) into a quantity of unit scale per
  coordinate whatever the model and parametrisation (sd is the current standard deviation of q,
  read off the released u);
* β_u = 2N does the same for the u-gradients: at the optimum a record's u-gradient is
  (I_i/Ī − 1)/(2N) (with the antithetic Monte Carlo draws used here), so 2N brings it to unit
  scale;
* then C = ``CLIP_SCALE`` · √d bounds the norm of a standardised d-vector (d = 2n) with few records
  clipped.

Weak privacy noise.  Clipping biases the optimum the trace finds, and no part of the noise-aware
model knows by how much: the records it clips are the ones with the largest gradients, and a
scale parameter's score is skewed (a normal record's log-scale score is (z² − 1), χ²-tailed), so
clipping pulls scales low.  On a heteroscedastic regression (N = 1000, ε = 30) the log-scale
intercept came out 1–1.5 posterior sds below the exact posterior mean, and TARP read 0.080 in it
at ε = 10 and 30 alike (K = 100; 0.036 at ε = 1).  The privacy noise, by contrast, is modelled.
So where it would add less than ``MIN_NOISE_SHARE`` of q's variance to the trace's estimate of
the optimum (D below), C grows until it adds that much: the posterior widens by about 5 % and
clips almost nothing.  Below ε ≈ 5 for the models tried the noise is stronger and C is the rule
above (2026-12-05, ``tutorials/RESULTS.md``).

Learning rate.  λ = λ_heur β with λ_heur = √2 λ_c / (σ C √(T d)) (eqs. A58 and H.2).  The
ELBO's curvature in each u-coordinate is about 1/2 (exactly 1/2 in the log-variance for a
Gaussian posterior), so u relaxes by r = λ_heur β_u κ / 2 per step; λ_c is chosen to make r
equal to ``BURN_IN_RATE`` while burning in (fast approach to the optimum) and ``FINAL_RATE``
afterwards.  In μ the curvature is 1/sd², so μ relaxes by λ_heur β_μ κ / sd² = r √Ī, with Ī one
record's Fisher information: 6 r for the weights of the 10-D regression, whose trace then
wanders about 47 variances of q around the optimum at ε = 1 (2026-11-26).

Wander-bounded rates (``equal_rates``; NA-DPVI's default where it releases the curvature).  λ_μ =
λ_heur β_μ² instead makes μ relax at λ_heur N κ = r, like u.  At rate r a μ-coordinate's stationary
wander around the optimum is (rT/2)·D variances of q, where D = σ²C² / (N κ² T) is the variance the
privacy noise adds to the trace's estimate of the optimum, in the same units.  Where the gradient
is not linear the wander biases the trace: in a regression, the noise variance's gradient grows
with the squared wander of the weights, which put the trace mean of log σ² 4 posterior sds above
its optimum at ε = 1 and 10 at ε = 0.3.  Curvatures change over about √N posterior sds, so the
wander of n coordinates shifts the trace by about n·(rT/2)·D / N; the final rate keeps that within
``WANDER_SCALE`` posterior sds, √((1 + D)/N): r ≤ 2 ``WANDER_SCALE`` √(N (1 + D)) / (n T D), and
``FINAL_RATE`` where the noise is weaker.  The burn-in anneals down to it from ``BURN_IN_FACTOR``
times it (at most ``BURN_IN_RATE``): under strong noise a fast burn-in's wander ran away in the
regression (log σ² 2.8 above its optimum at ε = 0.3) and took most of the trace to come back.  The
price is information about the curvature A, which the post-processing reads off the trace's spread:
on the 10-D regression (TARP, K = 100, η = 2) the joint RMSE went from 0.134 to 0.053 at ε = 0.3
but from 0.064 to 0.152 at ε = 1, where posteriors became too wide (0.044 with a learned η,
``lkj_eta=None``, and 0.063 at ε = 0.3).  With the curvature released the trace need not wander to
inform A's correlations, so NA-DPVI's ``rates="auto"`` uses these rates exactly then
(``tutorials/RESULTS.md``, 2026-11-29).

Burn-in.  β_μ and λ are recomputed from the released trace every chunk of steps during the
burn-in T* and frozen after it, so the post-processing model sees one noise level σC/β.  The
rates start fast to bring u to q's scale, which the start does not know.  A fast start in μ
approaches an optimum far from the start, but under strong noise it also throws μ far off, and
standardised rates bring μ back √Ī times more slowly than u: a 36-parameter logistic regression's
weights wandered 15 posterior sds within 500 steps and took the whole trace to return; q's
variance tracks the curvature where they wander, lower there, so the curvature read off it was
0.6–0.8 of the true one and the posterior 20 % too wide.  So ``capped_start`` holds μ's start to
``BURN_IN_FACTOR`` times the wander bound (``tutorials/RESULTS.md``, stop 63).

q's variances in the burn-in (wander-bounded rates).  In log-variance u's gradient is
(v/v* − 1)/2 per unit of curvature, with v* its optimum: it falls fast from above but climbs at
most r/2 a step from below.  The start, 1/N, is below v* for every parameter a record informs
less than a unit's worth, N/n times below for an intercept of n records, and while v < v* the
wander-bounded rate of μ (λ_heur β_μ², with β_μ² = vN) is r·v/v*.  With varying intercepts over
20 groups of 10–190 records (N = 2000, ε = 1, r·T ≈ 2) q's sds were still climbing at the end of
the trace and the intercepts had barely moved: 12 posterior sds from the optimum at the end,
the noise scale 38 above.  So u's rate in the burn-in is ``BURN_IN_U_FACTOR`` times μ's: u's
own wander is small (its noise is D/N of its scale), and μ keeps the wander-bounded rate
(``tutorials/RESULTS.md``, stop 72).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

import jax.numpy as jnp
import numpy as np

from dpppl.plugin import GeometricTable, RecordModel, softplus_inverse
from dpppl_na_dpvi.convergence import settled_start
from dpppl_na_dpvi.dpsgd import DPSGDSettings

#: C = CLIP_SCALE · √d for standardised per-record gradients of dimension d.
CLIP_SCALE = 3.5
#: The least share of q's variance the privacy noise adds to the trace's estimate of the optimum
#: (D): where C = ``CLIP_SCALE`` · √d gives less, C grows to give this much.
MIN_NOISE_SHARE = 0.1
#: Largest per-step relaxation rate during the burn-in.
BURN_IN_RATE = 0.02
#: Largest per-step relaxation rate after the burn-in (the part of the trace the posterior is
#: built on).
FINAL_RATE = 0.002
#: The trace's wander may shift it by this many posterior standard deviations (see above).
WANDER_SCALE = 1.0
#: The burn-in starts at this multiple of the final rate (at most ``BURN_IN_RATE``).
BURN_IN_FACTOR = 10.0
#: With wander-bounded rates, u's rate in the burn-in is this multiple of μ's (see above).
BURN_IN_U_FACTOR = 10.0
#: Bounds on β_μ, against a collapsed or exploding variance early in the burn-in.
BETA_RANGE = (1e-8, 1e8)


def noise_share(
    *, noise_multiplier: float, clipping_bound: float, n_records: int, sampling_rate: float,
    steps: int,
) -> float:
    """D = σ²C² / (N κ² T): the variance the privacy noise adds to the trace's estimate of each
    coordinate of the optimum, in variances of q."""
    return (noise_multiplier * clipping_bound) ** 2 / (n_records * sampling_rate**2 * steps)


def default_clipping_bound(
    n_params: int, *, noise_multiplier: float, n_records: int, sampling_rate: float, steps: int
) -> float:
    """C = ``CLIP_SCALE`` · √d for the d = 2n standardised gradient coordinates of n parameters,
    or, where the privacy noise σ would then add less than ``MIN_NOISE_SHARE`` of q's variance
    to the optimum's estimate (:func:`noise_share`, see above), the C that adds that share."""
    standard = CLIP_SCALE * math.sqrt(2 * n_params)
    share = noise_share(
        noise_multiplier=noise_multiplier, clipping_bound=standard, n_records=n_records,
        sampling_rate=sampling_rate, steps=steps,
    )
    return standard * math.sqrt(max(1.0, MIN_NOISE_SHARE / share))


@dataclass
class StandardisedSchedule:
    """The rules above, as a schedule for :func:`dpppl_na_dpvi.dpsgd.run_dpsgd`.

    Parameters
    ----------
    model
        The record model (for n and N).
    noise_multiplier, sampling_rate, steps, burn_in_steps
        σ, κ, T and T*.
    clipping_bound, u_preconditioning, learning_rate_scale
        User overrides of C, β_u and λ_c (None: by rule).
    settle
        Leave out the free steps that still drift (:meth:`settled_start`): the anchor and the
        noise-aware posterior read the rest.
    equal_rates
        The wander-bounded rates above instead of the standardised ones.
    capped_start
        μ's burn-in starts no faster than ``BURN_IN_FACTOR`` times the wander bound
        (:meth:`start_rate`).
    """

    model: RecordModel
    noise_multiplier: float
    sampling_rate: float
    steps: int
    burn_in_steps: int
    clipping_bound: float | None = None
    u_preconditioning: float | None = None
    learning_rate_scale: float | None = None
    settle: bool = True
    equal_rates: bool = False
    capped_start: bool = False
    last: DPSGDSettings | None = field(default=None, init=False)

    def __post_init__(self) -> None:
        if self.clipping_bound is None:
            self.clipping_bound = default_clipping_bound(
                self.model.n_params,
                noise_multiplier=self.noise_multiplier,
                n_records=self.model.n_records,
                sampling_rate=self.sampling_rate,
                steps=self.steps,
            )
        if self.u_preconditioning is None:
            self.u_preconditioning = 2.0 * self.model.n_records

    @property
    def init_variance(self) -> float:
        """Variance of q at the start: 1/N, a posterior's variance at unit Fisher information."""
        return 1.0 / self.model.n_records

    def privacy_noise_share(self) -> float:
        """:func:`noise_share` of this schedule."""
        return noise_share(
            noise_multiplier=self.noise_multiplier,
            clipping_bound=self.clipping_bound,
            n_records=self.model.n_records,
            sampling_rate=self.sampling_rate,
            steps=self.steps,
        )

    def wander_bound(self) -> float:
        """The largest rate at which the stationary wander of the n μ-coordinates shifts the
        trace by at most ``WANDER_SCALE`` posterior standard deviations (see above)."""
        share = self.privacy_noise_share()
        n_records, n = self.model.n_records, self.model.n_params
        return 2 * WANDER_SCALE * math.sqrt(n_records * (1 + share)) / (n * self.steps * share)

    def final_rate(self) -> float:
        """The relaxation rate after the burn-in: ``FINAL_RATE``, or with ``equal_rates`` less
        where the privacy noise would make the trace wander beyond the wander bound."""
        if not self.equal_rates:
            return FINAL_RATE
        return min(FINAL_RATE, self.wander_bound())

    def start_rate(self, mu: bool = False) -> float:
        """The burn-in's first rate: ``BURN_IN_FACTOR`` times the final one (at most
        ``BURN_IN_RATE``); for μ (``mu``) with ``capped_start`` also at most ``BURN_IN_FACTOR``
        times the wander bound, and never below the final rate."""
        start = min(BURN_IN_RATE, BURN_IN_FACTOR * self.final_rate())
        if mu and self.capped_start:
            start = max(self.final_rate(), min(start, BURN_IN_FACTOR * self.wander_bound()))
        return start

    def bounded_relaxations(self, steps: int) -> float | None:
        """How many relaxation times ``steps`` steps at the final rate span, where the privacy
        noise bounds that rate (``equal_rates``); None where it does not."""
        return self.final_rate() * steps if self.equal_rates else None

    def initial_phi(self) -> np.ndarray:
        """φ_0: μ at PyMC's initial point of the model, variances :attr:`init_variance`."""
        n = self.model.n_params
        u0 = float(softplus_inverse(self.init_variance))
        return np.concatenate([self.model.initial_point(), np.full(n, u0)])

    def learning_rate_constant(self, progress: float, mu: bool = False) -> float:
        """λ_c: the user's, or the one that gives every coordinate (μ's, with ``mu``) its target
        rate, annealed geometrically from the burn-in's first rate to the final one."""
        if self.learning_rate_scale is not None:
            return self.learning_rate_scale
        final = self.final_rate()
        start = self.start_rate(mu)
        rate = start * (final / start) ** progress
        d = 2 * self.model.n_params
        lr_heur = 2 * rate / (self.u_preconditioning * self.sampling_rate)
        return lr_heur * self.noise_multiplier * self.clipping_bound * math.sqrt(
            self.steps * d
        ) / math.sqrt(2)

    def restart(self, burn_in_phi: np.ndarray) -> np.ndarray:
        """The average of the last quarter of the burn-in: closer to the optimum than any single
        iterate, so the fixed phase starts inside the region where the gradient is linear."""
        return burn_in_phi[-max(1, len(burn_in_phi) // 4) :].mean(axis=0)

    def settled_start(self, free_phi: np.ndarray) -> int:
        """How many of the free steps to leave out as still drifting
        (:func:`dpppl_na_dpvi.convergence.settled_start`); none with ``settle`` off.

        Where no start settles the trace, equal rates leave out half: every coordinate is then
        still on its way, so the early half is the most biased.  Standardised rates leave out
        none: their drifting coordinates are those of few records, which relax √Ī more slowly
        than the rest and drift through the whole trace, so the cut would not settle them and
        would halve what every other coordinate tells (UCI Adult at ε = 0.1, one fit: 250 → 126
        × 10⁻³ calibration RMSE without the cut; ``tutorials/RESULTS.md``).
        """
        if not self.settle:
            return 0
        return settled_start(free_phi, halve_unsettled=self.equal_rates)

    def anchor(self, free_phi: np.ndarray) -> np.ndarray:
        """The mean of the free steps after any drift they still show: the point whose released
        gradients locate the optimum."""
        return free_phi[self.settled_start(free_phi) :].mean(axis=0)

    def _rate_factor(self, beta: np.ndarray, progress: float) -> np.ndarray | float:
        """λ's factor on λ_heur β: 1 without ``equal_rates``; with them β_μ for μ (λ_μ =
        λ_heur β_μ², so that μ relaxes at r) and, in the burn-in of the rule's rates,
        ``BURN_IN_U_FACTOR`` for u."""
        if not self.equal_rates:
            return 1.0
        n = self.model.n_params
        # A user's λ_c is one rate for the whole run; only the rule's burn-in speeds u up.
        burning_in = progress < 1 and self.learning_rate_scale is None
        return np.concatenate([beta[:n], np.full(n, BURN_IN_U_FACTOR if burning_in else 1.0)])

    def settings(self, recent_phi: np.ndarray, *, progress: float) -> DPSGDSettings:
        n = self.model.n_params
        d = 2 * n
        u = np.mean(recent_phi[:, n:], axis=0)
        sd = np.sqrt(np.logaddexp(0.0, u))
        beta = np.concatenate(
            [
                np.clip(sd * math.sqrt(self.model.n_records), *BETA_RANGE),
                np.full(n, self.u_preconditioning),
            ]
        )
        constants = np.concatenate(
            [
                np.full(n, self.learning_rate_constant(progress, mu=True)),
                np.full(n, self.learning_rate_constant(progress)),
            ]
        )
        lr_heur = (
            math.sqrt(2)
            * constants
            / (self.noise_multiplier * self.clipping_bound * math.sqrt(self.steps * d))
        )
        self.last = DPSGDSettings(
            clipping_bound=float(self.clipping_bound),
            noise_multiplier=float(self.noise_multiplier),
            preconditioner=jnp.asarray(beta),
            learning_rate=jnp.asarray(lr_heur * beta * self._rate_factor(beta, progress)),
            gaps=GeometricTable.for_rate(self.sampling_rate),
            n_records=int(self.model.n_records),
        )
        return self.last

    def public(self) -> dict[str, Any]:
        """The settings of the fixed phase, as public metadata for the result."""
        n = self.model.n_params
        beta = np.asarray(self.last.preconditioner)
        lr = np.asarray(self.last.learning_rate)
        return {
            "clipping_bound": float(self.clipping_bound),
            "preconditioning_mu": beta[:n].tolist(),
            "preconditioning_u": float(self.u_preconditioning),
            "learning_rate_mu": lr[:n].tolist(),
            "learning_rate_u": float(lr[n]),
            "learning_rate_constant": self.learning_rate_constant(progress=1.0),
            "burn_in_steps": self.burn_in_steps,
            "init_variance": self.init_variance,
        }
