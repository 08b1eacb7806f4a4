"""ε and δ bounds of a :class:`~dpppl_prv.composition.Composition` with prv-accountant.

This does what prv-accountant's ``PRVAccountant`` does (Gopi, Lee & Wutschitz 2021) with the
library's own pieces, grid, truncation and numerics (long double throughout), with two changes for
speed, each measured at DP-SGD settings (q = 0.1, 10^4 steps, ε = 0.1, 2.2 million grid points):

- The grid is padded with empty cells to a length the FFT handles fast.  ``PRVAccountant`` keeps
  the length its error bound gives, often one with large prime factors, on which the long-double
  FFTs took 3.4 of the 7 seconds of a call; on a fast length they take 0.5.  Empty cells change
  no mass; they only leave the circular convolution more room.
- Cells are discretised from one evaluation of the CDF per cell edge instead of two
  (:class:`SinglePassCellCentred`); the CDF took 1.9 of the 7 seconds."""

from __future__ import annotations

import math
from collections.abc import Iterator
from contextlib import contextmanager

import numpy as np
import scipy.fft
from prv_accountant import GaussianMechanism, PoissonSubsampledGaussianMechanism
from prv_accountant.accountant import compute_safe_domain_size
from prv_accountant.composers import Heterogeneous
from prv_accountant.discrete_privacy_random_variable import DiscretePrivacyRandomVariable
from prv_accountant.discretisers import Discretiser
from prv_accountant.domain import Domain
from prv_accountant.privacy_random_variables import (
    PrivacyRandomVariable,
    PrivacyRandomVariableTruncated,
)

from dpppl.plugin import UnsupportedEventError
from dpppl_prv.composition import Composition

#: Largest grid (points) a call may build.  A call's own peak memory grows about 0.1 GB per
#: million points (long double), so this keeps it near half a gigabyte.
MAX_GRID_POINTS = 4_194_304


def epsilon_bounds(
    composition: Composition, *, delta: float, eps_error: float, delta_error: float
) -> tuple[float, float, float]:
    """prv-accountant's (lower bound, estimate, upper bound) on ε at ``delta``.

    The bounds hold up to ``eps_error`` in ε and ``delta_error`` in δ: the upper bound is the
    estimate at ``delta - delta_error`` plus ``eps_error``.

    Raises
    ------
    UnsupportedEventError
        If the grid would exceed :data:`MAX_GRID_POINTS` or prv-accountant fails numerically.
    """
    composed = composed_prv(composition, eps_error=eps_error, delta_error=delta_error)
    with _library_errors():
        return composed.compute_epsilon(delta, delta_error, eps_error)


def delta_upper_bound(
    composition: Composition, *, epsilon: float, eps_error: float, delta_error: float
) -> float:
    """prv-accountant's upper bound on δ at ``epsilon`` (its estimate at ε - eps_error, plus
    ``delta_error``), as ``PRVAccountant.compute_delta`` computes it."""
    composed = composed_prv(composition, eps_error=eps_error, delta_error=delta_error)
    with _library_errors():
        return min(1.0, float(composed.compute_delta_estimate(epsilon - eps_error)) + delta_error)


def composed_prv(
    composition: Composition, *, eps_error: float, delta_error: float
) -> DiscretePrivacyRandomVariable:
    """The discretised PRV of the whole composition, on a grid fine enough for ``eps_error``."""
    prvs, counts = _prvs(composition)
    with _library_errors():
        half_width = compute_safe_domain_size(
            prvs, counts, eps_error=eps_error, delta_error=delta_error
        )
        # Theorem 5.5 of Gopi et al., the mesh PRVAccountant uses, and its grid and truncation.
        mesh = eps_error / math.sqrt(sum(counts) / 2 * math.log(12 / delta_error))
        domain = Domain.create_aligned(-half_width, half_width, mesh)
        size = fast_even_length(len(domain))
        if size > MAX_GRID_POINTS:
            raise UnsupportedEventError(
                f"the prv accountant would need a grid of {size:,} points for this event at "
                f"eps_error={eps_error:.3g}, more than its limit of {MAX_GRID_POINTS:,}; "
                "use accountant='pld'"
            )
        discretised = [
            _padded(
                SinglePassCellCentred().discretise(
                    PrivacyRandomVariableTruncated(prv, domain.t_min(), domain.t_max()), domain
                ),
                size,
            )
            for prv in prvs
        ]
        return Heterogeneous(discretised).compute_composition(counts)


def _padded(prv: DiscretePrivacyRandomVariable, size: int) -> DiscretePrivacyRandomVariable:
    """``prv`` with empty cells added on both sides up to ``size`` cells.

    Only the grid grows: the truncation and the mean correction stay the library's.  (Truncating
    on the wider grid instead changes the interval prv-accountant integrates the mean over, and
    its quadrature then fails issue #36's check in cases where the library's own grid passes.)
    The Fourier composer expects the layout ``create_aligned`` gives, t_min = -(size/2 - 1)·mesh,
    which padding both sides by the same number of cells keeps.
    """
    pad = (size - len(prv)) // 2
    pmf = np.zeros(size, dtype=prv.pmf.dtype)
    pmf[pad : pad + len(prv)] = prv.pmf
    mesh = prv.domain.dt()
    domain = Domain(
        t_min=prv.domain.t_min() - pad * mesh,
        t_max=prv.domain.t_max() + pad * mesh,
        size=size,
        shifts=prv.domain.shifts(),
    )
    return DiscretePrivacyRandomVariable(pmf, domain, log_pmc_inf=prv.log_pmc_inf)


class SinglePassCellCentred(Discretiser):
    """prv-accountant's ``CellCentred`` discretisation, one CDF evaluation per cell edge.

    ``CellCentred`` takes each cell's mass as CDF(right edge) - CDF(left edge), evaluating the CDF
    at every inner edge twice.  This takes the differences of one evaluation at all edges, which
    gives the same masses (tests compare the two), and then shifts the grid by the same mean
    correction and raises the same error when that correction exceeds half a cell.
    """

    def discretise(
        self, prv: PrivacyRandomVariableTruncated, domain: Domain
    ) -> DiscretePrivacyRandomVariable:
        centres = domain.ts()
        edges = np.empty(len(centres) + 1, dtype=centres.dtype)
        edges[1:-1] = centres[1:] - domain.dt() / 2
        # The outer half cells end at the truncation points, as CellCentred's clipping makes them.
        edges[0], edges[-1] = prv.t_min, prv.t_max
        masses = np.diff(prv.prv.cdf(edges)) / prv.remaining_mass
        mean_shift = prv.mean() - np.dot(centres, masses)
        if not np.abs(mean_shift) < domain.dt() / 2:
            raise RuntimeError("Discrete mean differs from continuous mean significantly.")
        return DiscretePrivacyRandomVariable(
            masses, domain.shift_right(mean_shift), log_pmc_inf=np.log(1 - prv.pm_inf)
        )


def _prvs(composition: Composition) -> tuple[list[PrivacyRandomVariable], list[int]]:
    prvs: list[PrivacyRandomVariable] = []
    counts: list[int] = []
    sigma = composition.gaussian_noise_multiplier
    if sigma is not None:
        prvs.append(GaussianMechanism(noise_multiplier=sigma))
        counts.append(1)
    for q, sigma, count in composition.subsampled:
        prvs.append(
            PoissonSubsampledGaussianMechanism(sampling_probability=q, noise_multiplier=sigma)
        )
        counts.append(count)
    return prvs, counts


def fast_even_length(n: int) -> int:
    """The smallest even length ≥ n whose real FFT is fast (only small prime factors)."""
    n = scipy.fft.next_fast_len(n, real=True)
    while n % 2:
        n = scipy.fft.next_fast_len(n + 1, real=True)
    return n


@contextmanager
def _library_errors() -> Iterator[None]:
    """Turn prv-accountant's numerical failures into refusals that name a way out.

    Known ones in 0.2.0: "Floating point errors will dominate" (ValueError) at small δ, "Cannot
    compute epsilon" (RuntimeError) at large ε, "Discrete mean differs from continuous mean
    significantly" (RuntimeError, issue #36, fixed only after the release) at large ε.
    """
    try:
        # Its subsampled-Gaussian CDF overflows exp(t) far out on wide grids, where the result is
        # still right (the CDF's limit 1); the warning would only alarm.
        with np.errstate(over="ignore"):
            yield
    except UnsupportedEventError:
        raise
    except (ValueError, RuntimeError, ArithmeticError) as error:
        raise UnsupportedEventError(
            f"prv-accountant 0.2.0 failed on this event: {error}; use accountant='pld'"
        ) from error
