"""Has the released DP-SGD trace settled?  A drift test computed from the release alone.

The noise-aware posterior models the trace after the burn-in as a stationary process around the
optimum φ* (linear gradients, Gaussian noise).  A trace still travelling towards the optimum, or
wandering away from it, breaks that model: the posterior then reads the drift as the optimum and
is over-confident and off-centre (``tutorials/RESULTS.md``, the 10-D regression at ε = 0.1).

:func:`drift_scores` compares the mean of each coordinate over the first and the last third of
the fixed phase (Geweke's test).  Their standard error is that of an AR(1) process, the model the
post-processing assumes (gradients linear in φ, so each coordinate relaxes geometrically),
fitted to the whole fixed phase after removing a straight line, so that a steady drift does not
hide itself by inflating its own standard error.  The lag-one autocorrelation of an SGD trace is
close to 1 (NA-DPVI's rule relaxes about 0.2 % per step), where its least-squares estimate is
biased down by about (2 + 4ρ)/n (Marriott & Pope 1954, for a fitted mean and trend), and that
bias is added back.  On stationary traces of 8 coordinates relaxing 0.2 % per step over 8000
steps, batch means of 267 steps (shorter than the 500-step relaxation) flagged 46 % of them, the
AR(1) fit without the correction 3 %, with it under 2 %; a trace still approaching an optimum
30 standard deviations away is flagged 9 times in 10.  For a stationary trace each score is
close to a standard normal; :data:`DRIFT_LIMIT` flags a coordinate whose score is beyond what d
coordinates of a stationary trace would reach by chance.  The scores are functions of the released iterates and public
settings only, so publishing them costs no privacy.
"""

from __future__ import annotations

import numpy as np

#: |score| above which a coordinate is reported as drifting (a stationary trace exceeds 4 with
#: probability 6·10⁻⁵ per coordinate).
DRIFT_LIMIT = 4.0
#: Largest |score| of a trace window that counts as settled (a stationary trace of 24
#: coordinates exceeds it somewhere with probability about 6 %, and then loses a tenth of its
#: steps needlessly).
SETTLED_LIMIT = 3.0
#: Fewer relaxation times than this over the steps read leave a trace that cannot forget where it
#: started (e^-3: 5 % of its first offset remains).
FEW_RELAXATIONS = 3.0
#: Starts that :func:`settled_start` tries: every tenth of the moving steps, up to the half.
SETTLE_GRID = 10


def drift_scores(phi: np.ndarray, burn_in: int) -> np.ndarray:
    """Geweke scores (mean of the last third − mean of the first third, over its standard error)
    of each coordinate of the iterates ``phi`` (T + 1, d) after ``burn_in`` steps."""
    fixed = np.asarray(phi, dtype=float)[burn_in:]
    n = len(fixed)
    third = n // 3
    if third < 2:
        return np.zeros(fixed.shape[1])
    design = np.stack([np.ones(n), np.arange(n)], axis=1)
    residuals = fixed - design @ np.linalg.lstsq(design, fixed, rcond=None)[0]
    before, after = residuals[:-1], residuals[1:]
    rho = (before * after).sum(axis=0) / np.maximum((before**2).sum(axis=0), np.finfo(float).tiny)
    rho = np.clip(rho + (2 + 4 * rho) / n, -1 + 1 / n, 1 - 1 / n)
    # Long-run variance of one step of an AR(1): innovation variance / (1 − ρ)².
    long_run = np.maximum((after - rho * before).var(axis=0), np.finfo(float).tiny) / (1 - rho) ** 2
    difference = fixed[-third:].mean(axis=0) - fixed[:third].mean(axis=0)
    return difference / np.sqrt(2 * long_run / third)


def settled_start(phi: np.ndarray, *, halve_unsettled: bool = True) -> int:
    """How many of the first iterates of the moving steps ``phi`` (T, d) to leave out, so that
    the rest shows no drift: the earliest tenth of the steps after which every coordinate's
    score is within ``SETTLED_LIMIT``; if none is, half of them, or none with
    ``halve_unsettled`` off.

    After the burn-in a trace may still be on its way to the optimum: in the 10-D regression at
    ε = 0.3, log σ² came down from 2.8 above its optimum to 0.2 over 6000 steps, held up by the
    weights' slow approach (2026-11-26).  A posterior that read those steps as wander around φ*
    would sit far from it; leaving them out costs the information of the steps dropped.  The
    choice reads the released iterates only.
    """
    phi = np.asarray(phi, dtype=float)
    step = len(phi) // SETTLE_GRID
    starts = [k * step for k in range(SETTLE_GRID // 2 + 1)] if step else [0]
    for start in starts:
        if np.abs(drift_scores(phi, start)).max() <= SETTLED_LIMIT:
            return start
    return starts[-1] if halve_unsettled else 0


def drift_warning(
    scores: np.ndarray, labels: list[str], bounded_relaxations: float | None = None
) -> str | None:
    """The warning a user gets when some coordinate drifts, naming it and what to change.

    ``bounded_relaxations``: with rates bounded by the privacy noise (NA-DPVI's wander-bounded
    rates), how many relaxation times the steps the posterior reads span.  That number is fixed
    by ε, N and the number of parameters, not by the number of steps (the bound scales the rate
    as 1/T, and σ² grows about as T), so below ``FEW_RELAXATIONS`` the advice is a larger ε or
    faster rates, not more steps: on the 10-D regression at ε = 0.1 (0.6 relaxation times over
    the steps read, at 10 000 steps and at 40 000), 40 000 steps drifted as much as 10 000.
    """
    worst = int(np.argmax(np.abs(scores)))
    if abs(scores[worst]) <= DRIFT_LIMIT:
        return None
    if bounded_relaxations is not None and bounded_relaxations < FEW_RELAXATIONS:
        advice = (
            f"its rates are bounded by the privacy noise, so the steps it reads span only "
            f"{bounded_relaxations:.1f} relaxation times whatever the number of steps; a larger "
            "epsilon, or rates='standardised' (faster, but the wander then biases coordinates "
            "whose gradient is not linear, such as a noise scale), gives it more"
        )
    else:
        advice = "try more steps or a longer burn-in (option burn_in), or a larger epsilon"
    return (
        f"the DP-SGD trace has not settled: {labels[worst]} drifts by {scores[worst]:+.1f} "
        "standard errors between the first and last third of the moving steps that the "
        "posterior reads, so the noise-aware posterior, which assumes a trace around its "
        f"optimum, may be over-confident and off-centre; {advice}"
    )
