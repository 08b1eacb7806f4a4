"""dpppl: differentially private probabilistic programming on PyMC.

>>> with model:
...     idata = dpppl.sample(mechanism="na-dpvi", epsilon=1.0, delta=1e-5)
>>> print(dpppl.privacy_statement(idata))
"""

from importlib.metadata import PackageNotFoundError, version

from dpppl.accounting import Accountant
from dpppl.calibration import calibrate_noise_multiplier
from dpppl.errors import (
    DPPPLError,
    InvalidDataError,
    InvalidPrivacyParameterError,
    ModelNotSupportedError,
    PluginError,
    PluginNotFoundError,
    PrivacyBudgetExceededError,
    PrivacyWarning,
    UnsupportedEventError,
)
from dpppl.events import NeighbourRelation
from dpppl.hookspecs import hookimpl
from dpppl.ledger import PrivacyLedger
from dpppl.mechanism import Mechanism, PrivacyPlan, Release
from dpppl.record_model import RecordModel, record_model
from dpppl.results import privacy_statement
from dpppl.sampling import sample
from dpppl.tarp_study import add_tarp, plot_tarp, tarp

try:
    __version__ = version("dpppl")
except PackageNotFoundError:  # pragma: no cover - running from a source tree without install
    __version__ = "0.0.0"

__all__ = [
    "Accountant",
    "DPPPLError",
    "InvalidDataError",
    "InvalidPrivacyParameterError",
    "Mechanism",
    "ModelNotSupportedError",
    "NeighbourRelation",
    "PluginError",
    "PluginNotFoundError",
    "PrivacyBudgetExceededError",
    "PrivacyLedger",
    "PrivacyPlan",
    "PrivacyWarning",
    "RecordModel",
    "Release",
    "UnsupportedEventError",
    "__version__",
    "add_tarp",
    "calibrate_noise_multiplier",
    "hookimpl",
    "plot_tarp",
    "privacy_statement",
    "record_model",
    "sample",
    "tarp",
]
