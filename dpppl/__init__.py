"""dpppl: differentially private probabilistic programming on PyMC.

>>> with model:
...     idata = dpppl.sample(mechanism="na-dpvi", epsilon=1.0, delta=1e-5)
>>> print(dpppl.privacy_statement(idata))

The names below are imported on first use (PEP 562): ``import dpppl`` alone loads neither PyMC,
PyTensor, JAX nor ArviZ, so ``dpppl --help`` and ``dpppl plugins`` answer at once.
"""

from __future__ import annotations

import importlib
import sys
import types
from importlib.metadata import PackageNotFoundError, version
from typing import TYPE_CHECKING, Any

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
from dpppl.events import NeighbourRelation
from dpppl.hookspecs import hookimpl
from dpppl.options import NON_NEGATIVE, POSITIVE, Interval

if TYPE_CHECKING:
    from dpppl.accounting import Accountant
    from dpppl.calibration import calibrate_noise_multiplier
    from dpppl.ledger import PrivacyLedger
    from dpppl.mechanism import Mechanism, PrivacyPlan, Release
    from dpppl.plugins import accountants, mechanisms
    from dpppl.predictive import sample_posterior_predictive
    from dpppl.record_model import RecordModel, record_model
    from dpppl.results import privacy_statement
    from dpppl.sampling import sample
    from dpppl.tarp_study import add_tarp, plot_tarp, tarp

try:
    __version__ = version("dpppl")
except PackageNotFoundError:  # pragma: no cover - running from a source tree without install
    __version__ = "0.0.0"

#: The public name -> the submodule that defines it, imported when the name is first read.
_LAZY = {
    "Accountant": "accounting",
    "calibrate_noise_multiplier": "calibration",
    "PrivacyLedger": "ledger",
    "Mechanism": "mechanism",
    "PrivacyPlan": "mechanism",
    "Release": "mechanism",
    "accountants": "plugins",
    "mechanisms": "plugins",
    "sample_posterior_predictive": "predictive",
    "RecordModel": "record_model",
    "record_model": "record_model",
    "privacy_statement": "results",
    "sample": "sampling",
    "add_tarp": "tarp_study",
    "plot_tarp": "tarp_study",
    "tarp": "tarp_study",
}


def __getattr__(name: str) -> Any:
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module 'dpppl' has no attribute {name!r}")
    value = getattr(importlib.import_module(f"dpppl.{module}"), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(_LAZY))


class _Package(types.ModuleType):
    """The ``dpppl`` module, keeping ``dpppl.record_model`` the function.

    Importing the submodule ``dpppl.record_model`` binds it as an attribute of the package, which
    would hide the function of the same name that ``dpppl.record_model(model)`` calls.
    """

    def __setattr__(self, name: str, value: Any) -> None:
        if name == "record_model" and isinstance(value, types.ModuleType):
            value = value.record_model
        super().__setattr__(name, value)


sys.modules[__name__].__class__ = _Package

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
