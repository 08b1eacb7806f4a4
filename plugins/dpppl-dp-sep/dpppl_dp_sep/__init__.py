"""dpppl-dp-sep: differentially private stochastic expectation propagation for dpppl.

The mechanism is registered as ``"dp-sep"``; :func:`run_sep` runs the same engine without the
accountant, for plain and clipped SEP baselines (not private: it releases nothing by itself).
"""

from dpppl_dp_sep.mechanism import DPSEP
from dpppl_dp_sep.moments import GaussHermite, MonteCarlo
from dpppl_dp_sep.sep import SEPResult, SEPSettings, run_sep

__all__ = ["DPSEP", "GaussHermite", "MonteCarlo", "SEPResult", "SEPSettings", "run_sep"]
