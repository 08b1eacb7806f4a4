"""Diagnostics of private posteriors: noise-aware TARP coverage and predictive calibration.

>>> tarp = dpppl.diagnostics.tarp_coverage(samples, truth, random_seed=0)
>>> print(dpppl.diagnostics.coverage_summary(tarp))
>>> dpppl.diagnostics.save_png(dpppl.diagnostics.plot_coverage(tarp), "coverage.png")

``samples`` (K simulations, S draws, d) and ``truth`` (K, d) come from a simulate-then-fit loop in
the unconstrained space.  The results are ``xarray.Dataset`` objects ready to become the ``tarp``
(or a calibration) group of an ArviZ ``DataTree``.
"""

from dpppl.diagnostics.calibration import calibration_summary, predictive_calibration
from dpppl.diagnostics.plots import (
    plot_coverage,
    plot_coverage_error,
    plot_marginal_coverage,
    plot_reliability,
    save_png,
)
from dpppl.diagnostics.tarp import (
    DEFAULT_ALPHA,
    REFERENCE_RULES,
    coverage_summary,
    tarp_coverage,
)

__all__ = [
    "DEFAULT_ALPHA",
    "REFERENCE_RULES",
    "calibration_summary",
    "coverage_summary",
    "plot_coverage",
    "plot_coverage_error",
    "plot_marginal_coverage",
    "plot_reliability",
    "predictive_calibration",
    "save_png",
    "tarp_coverage",
]
