"""Hook implementations of dpppl-swag-ppm: registers the ``"swag-ppm"`` mechanism."""

from __future__ import annotations

from collections.abc import Callable

import dpppl
from dpppl_swag_ppm.mechanism import SwagPPM


@dpppl.hookimpl
def register_mechanisms(register: Callable[[type], None]) -> None:
    """Register :class:`~dpppl_swag_ppm.mechanism.SwagPPM` under ``"swag-ppm"``."""
    register(SwagPPM)
