"""Exceptions raised by dpppl.

Every refusal happens before any privacy budget is spent (the one exception,
:class:`InexactReleaseError`, is a run-time safety check that the mechanisms' public parameters
make unreachable), and no message carries a value of the private data: messages name variables,
shapes and settings, never records.
"""

from __future__ import annotations


class DPPPLError(Exception):
    """Base class of every error dpppl raises on purpose."""


class ModelNotSupportedError(DPPPLError, ValueError):
    """The PyMC model has no structure dpppl can privatise (see the message for what to change)."""


class InvalidDataError(DPPPLError, ValueError):
    """The record data cannot be used as they are (NaN, infinite, empty, wrong shape)."""


class InvalidPrivacyParameterError(DPPPLError, ValueError):
    """ε, δ or another privacy setting is outside its valid range."""


class InvalidOptionError(DPPPLError, ValueError):
    """A mechanism or accountant option has a value its declaration does not allow."""


class UnsupportedEventError(DPPPLError, ValueError):
    """An accountant cannot account the declared privacy event under the declared neighbour relation."""


class PrivacyBudgetExceededError(DPPPLError):
    """A fit would take a privacy ledger past its budget; nothing was run."""


class PluginNotFoundError(DPPPLError, LookupError):
    """No installed plugin provides the requested mechanism or accountant."""


class PluginError(DPPPLError):
    """A plugin broke the plugin contract (bad registration, forbidden output, wrong types)."""


class InexactReleaseError(DPPPLError, ArithmeticError):
    """A hardened (snapped) noisy release left the range float64 holds exactly; nothing of it
    was returned."""


class PrivacyWarning(UserWarning):
    """A setting is valid but weakens the guarantee (for example δ ≥ 1/N)."""


class PrivateDataError(DPPPLError, ValueError):
    """A request would put private data, or a per-record function of them, into an output."""
