"""dpppl: differentially private probabilistic programming on PyMC.

>>> with model:
...     idata = dpppl.sample(mechanism="na-dpvi", epsilon=1.0, delta=1e-5)
>>> print(dpppl.privacy_statement(idata))

The names below are imported on first use (PEP 562): ``import dpppl`` alone loads neither PyMC,
PyTensor, JAX nor ArviZ, so ``dpppl --help`` and ``dpppl plugins`` answer at once.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from dpppl.errors import (
    DPPPLError,
    InvalidDataError,
    InvalidOptionError,
    InvalidPrivacyParameterError,
    ModelNotSupportedError,
    PluginError,
    PluginNotFoundError,
    PrivacyBudgetExceededError,
    PrivacyWarning,
    PrivateDataError,
    UnsupportedEventError,
)
from dpppl.lazy import lazy_exports
from dpppl.plugin.hookspecs import hookimpl
from dpppl.plugin.options import NON_NEGATIVE, POSITIVE, Interval
from dpppl.privacy.events import NeighbourRelation
from dpppl.version import __version__

if TYPE_CHECKING:
    from dpppl.diagnostics.study import add_tarp, plot_tarp, tarp
    from dpppl.ledger import PrivacyLedger
    from dpppl.model.record_model import RecordModel, record_model
    from dpppl.plugin.accountant import Accountant
    from dpppl.plugin.mechanism import Mechanism, PrivacyPlan, Release
    from dpppl.plugin.registry import accountants, mechanisms
    from dpppl.predictive import sample_posterior_predictive
    from dpppl.privacy.noise_calibration import calibrate_noise_multiplier
    from dpppl.results import PrivacyMetadata, privacy_statement
    from dpppl.sampling import sample

__getattr__, __dir__, _ = lazy_exports(
    __name__,
    {
        "dpppl.diagnostics.study": ["add_tarp", "plot_tarp", "tarp"],
        "dpppl.ledger": ["PrivacyLedger"],
        "dpppl.model.record_model": ["RecordModel", "record_model"],
        "dpppl.plugin.accountant": ["Accountant"],
        "dpppl.plugin.mechanism": ["Mechanism", "PrivacyPlan", "Release"],
        "dpppl.plugin.registry": ["accountants", "mechanisms"],
        "dpppl.predictive": ["sample_posterior_predictive"],
        "dpppl.privacy.noise_calibration": ["calibrate_noise_multiplier"],
        "dpppl.results": ["PrivacyMetadata", "privacy_statement"],
        "dpppl.sampling": ["sample"],
    },
)

__all__ = [
    "Accountant",
    "DPPPLError",
    "Interval",
    "InvalidDataError",
    "InvalidOptionError",
    "InvalidPrivacyParameterError",
    "Mechanism",
    "ModelNotSupportedError",
    "NON_NEGATIVE",
    "NeighbourRelation",
    "POSITIVE",
    "PluginError",
    "PluginNotFoundError",
    "PrivacyBudgetExceededError",
    "PrivacyLedger",
    "PrivacyMetadata",
    "PrivacyPlan",
    "PrivacyWarning",
    "PrivateDataError",
    "RecordModel",
    "Release",
    "UnsupportedEventError",
    "__version__",
    "accountants",
    "add_tarp",
    "calibrate_noise_multiplier",
    "hookimpl",
    "mechanisms",
    "plot_tarp",
    "privacy_statement",
    "record_model",
    "sample",
    "sample_posterior_predictive",
    "tarp",
]
