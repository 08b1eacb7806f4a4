"""Exceptions of the SWAG-PPM mechanism.  Messages name settings, never records or their values."""

from __future__ import annotations

from dpppl.plugin import DPPPLError


class SwagPPMError(DPPPLError):
    """A SWAG-PPM fit could not finish; nothing was released."""


class TrainingDivergedError(SwagPPMError):
    """SGD produced non-finite gradients in most steps of a phase."""


class CalibrationError(SwagPPMError):
    """No scaling of the weights brought the released draws' epsilon under the request."""
