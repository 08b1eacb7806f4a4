"""An independent reference for accountants: two-sided bounds on the exact ε of the
Poisson-subsampled Gaussian mechanism composed over T steps (add-or-remove-one neighbours).

The privacy loss of one step has a closed form and so has its inverse, so the probability of
every interval of losses is a difference of normal CDFs.  Rounding each interval's mass to its
upper end makes the loss stochastically larger and δ(ε) an upper bound; rounding to its lower end
gives a lower bound.  The T-fold composition of each discretised loss is then exact up to
floating point (FFT convolution).  The bracket's width shrinks with the grid; it is a check, not
an accountant: it needs seconds where an accountant needs milliseconds.
"""

from __future__ import annotations

import math

import numpy as np
from scipy import optimize, signal, special

from dpppl.privacy.events import NeighbourRelation

#: Mass of a step's loss beyond the tabulated range (pessimistic: counted as infinite loss).
TAIL_MASS = 1e-18


def _step_losses(
    sigma: float, q: float, grid: float, direction: str, pessimistic: bool
) -> tuple[np.ndarray, int, float]:
    """One step's discretised loss: pmf on ``grid``·(base + k), base, and mass at +∞.

    remove: X ~ (1−q)N(0, σ²) + qN(1, σ²), loss ℓ(x) = log(1 − q + q e^{(2x−1)/(2σ²)});
    add: X ~ N(0, σ²), loss −ℓ(x).  ℓ is increasing, with inverse
    x(l) = σ² log1p(expm1(l)/q) + ½ for l > log(1 − q).  Rounding up (``pessimistic``) puts
    each interval's mass at its upper edge, the mass below the range at its lowest edge and the
    mass above it at +∞; rounding down puts it at the lower edge, drops the mass below (a loss
    of −∞) and puts the mass above at the highest edge.
    """
    floor = math.log1p(-q) if q < 1 else -math.inf

    def loss(x: float) -> float:
        return float(np.logaddexp(floor, math.log(q) + (2 * x - 1) / (2 * sigma**2)))

    def x_of(values: np.ndarray) -> np.ndarray:
        return sigma**2 * np.log1p(np.expm1(values) / q) + 0.5

    z = -special.ndtri(TAIL_MASS)
    if direction == "remove":
        low, high = loss(-z * sigma), loss(1 + z * sigma)
    else:
        low, high = -loss(z * sigma), -loss(-z * sigma)
    lo_k, hi_k = math.floor(low / grid), math.ceil(high / grid)
    edges = grid * np.arange(lo_k, hi_k + 1, dtype=float)
    # F(e) = P(loss ≤ e) at every edge.
    if direction == "remove":
        valid = edges > floor
        cdf = np.zeros_like(edges)
        x = x_of(edges[valid])
        cdf[valid] = (1 - q) * special.ndtr(x / sigma) + q * special.ndtr((x - 1) / sigma)
    else:  # −ℓ(X) ≤ e ⇔ X ≥ x(−e)
        valid = -edges > floor
        cdf = np.ones_like(edges)
        cdf[valid] = special.ndtr(-x_of(-edges[valid]) / sigma)
    mass = np.maximum(np.diff(cdf), 0.0)
    below, above = float(cdf[0]), float(1 - cdf[-1])
    if pessimistic:
        pmf = np.concatenate([[below], mass])
        return pmf, lo_k, above
    pmf = np.concatenate([mass, [above]])
    return pmf, lo_k, 0.0


def _compose(
    pmf: np.ndarray, base: int, inf: float, steps: int, cap: int, pessimistic: bool
) -> tuple[np.ndarray, int, float]:
    """The ``steps``-fold convolution; losses above ``cap`` grid steps go to +∞ (pessimistic) or
    to ``cap`` (optimistic)."""

    def convolve(a, a_base, a_inf, b, b_base, b_inf):
        c = np.maximum(signal.fftconvolve(a, b), 0.0)
        c_base = a_base + b_base
        c_inf = 1 - (1 - a_inf) * (1 - b_inf)
        keep = cap - c_base + 1
        if 0 < keep < len(c):
            if pessimistic:
                c_inf += c[keep:].sum()
            else:
                c[keep - 1] += c[keep:].sum()
            c = c[:keep]
        return c, c_base, c_inf

    result = (np.ones(1), 0, 0.0)
    power = (pmf, base, inf)
    while steps:
        if steps & 1:
            result = convolve(*result, *power)
        steps >>= 1
        if steps:
            power = convolve(*power, *power)
    return result


def _delta(epsilon: float, pmf: np.ndarray, base: int, inf: float, grid: float) -> float:
    losses = grid * (base + np.arange(len(pmf)))
    above = losses > epsilon
    return float(np.sum(pmf[above] * -np.expm1(epsilon - losses[above])) + inf)


def subsampled_gaussian_epsilon_bounds(
    noise_multiplier: float,
    sampling_rate: float,
    steps: int,
    delta: float,
    *,
    relation: NeighbourRelation = NeighbourRelation.ADD_OR_REMOVE_ONE,
    grid: float = 1e-4,
) -> tuple[float, float]:
    """Bounds (lower, upper) on the exact ε at ``delta`` of ``steps`` Poisson-subsampled Gaussian
    releases (sensitivity 1, noise multiplier σ, inclusion probability q), the larger of the
    add and remove directions.  An accountant's ε below ``lower`` is not a bound.
    """
    if NeighbourRelation(relation) is not NeighbourRelation.ADD_OR_REMOVE_ONE:
        raise ValueError("the reference covers add-or-remove-one neighbours only")
    bounds = []
    for pessimistic in (False, True):
        epsilons = []
        for direction in ("remove", "add"):
            pmf, base, inf = _step_losses(
                noise_multiplier, sampling_rate, grid, direction, pessimistic
            )
            cap = int(100 / grid)
            composed = _compose(pmf, base, inf, steps, cap, pessimistic)
            if _delta(0.0, *composed, grid) <= delta:
                epsilons.append(0.0)
                continue
            epsilons.append(
                optimize.brentq(
                    lambda e, c=composed: _delta(e, *c, grid) - delta, 0.0, 100.0, xtol=1e-9
                )
            )
        bounds.append(max(epsilons))
    return bounds[0], bounds[1]
