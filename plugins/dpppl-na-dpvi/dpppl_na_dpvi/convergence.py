"""Has the released DP-SGD trace settled?  A drift test computed from the release alone.

The noise-aware posterior models the trace after the burn-in as a stationary process around the
optimum φ* (linear gradients, Gaussian noise).  A trace still travelling towards the optimum, or
wandering away from it, breaks that model: the posterior then reads the drift as the optimum and
is over-confident and off-centre (``tutorials/RESULTS.md``, the 10-D regression at ε = 0.1).

:func:`drift_scores` compares the mean of each coordinate over the first and the last third of
the fixed phase (Geweke's test).  The standard errors come from the batch means of the whole
fixed phase, which allow for the strong autocorrelation of an SGD trace; their spread is taken
around a straight line through them, so that a steady drift does not hide itself by inflating
its own standard error.  For a stationary trace each score is close to a standard
normal; :data:`DRIFT_LIMIT` flags a coordinate whose score is beyond what d coordinates of a
stationary trace would reach by chance.  The scores are functions of the released iterates and
public settings only, so publishing them costs no privacy.
"""

from __future__ import annotations

import numpy as np

#: |score| above which a coordinate is reported as drifting (a stationary trace exceeds 4 with
#: probability 6·10⁻⁵ per coordinate).
DRIFT_LIMIT = 4.0
#: Batches of the fixed phase for the batch-means standard errors.
BATCHES = 30


def drift_scores(phi: np.ndarray, burn_in: int) -> np.ndarray:
    """Geweke scores (mean of the last third − mean of the first third, over its standard error)
    of each coordinate of the iterates ``phi`` (T + 1, d) after ``burn_in`` steps."""
    fixed = np.asarray(phi, dtype=float)[burn_in:]
    size = len(fixed) // BATCHES
    if size < 2:
        return np.zeros(fixed.shape[1])
    third = len(fixed) // 3
    # Long-run variance of one step: the spread of the batch means around their linear trend,
    # times the batch length.
    means = fixed[: size * BATCHES].reshape(BATCHES, size, -1).mean(axis=1)
    design = np.stack([np.ones(BATCHES), np.arange(BATCHES)], axis=1)
    residuals = means - design @ np.linalg.lstsq(design, means, rcond=None)[0]
    spread = (residuals**2).sum(axis=0) / (BATCHES - 2)
    long_run = np.maximum(spread * size, np.finfo(float).tiny)
    difference = fixed[-third:].mean(axis=0) - fixed[:third].mean(axis=0)
    return difference / np.sqrt(2 * long_run / third)


def drift_warning(scores: np.ndarray, labels: list[str]) -> str | None:
    """The warning a user gets when some coordinate drifts, naming it and what to change."""
    worst = int(np.argmax(np.abs(scores)))
    if abs(scores[worst]) <= DRIFT_LIMIT:
        return None
    return (
        f"the DP-SGD trace has not settled: {labels[worst]} drifts by {scores[worst]:+.1f} "
        "standard errors between the first and last third of the steps after the burn-in, so "
        "the noise-aware posterior, which assumes a trace around its optimum, may be "
        "over-confident and off-centre; try more steps or a longer burn-in (option burn_in), "
        "or a larger epsilon"
    )
