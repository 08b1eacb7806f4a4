"""The plugin module named in pyproject.toml's entry point: its hooks register the mechanism."""

from __future__ import annotations

from collections.abc import Callable

import dpppl
from dpppl_noisy_mean.mechanism import NoisyMean


@dpppl.hookimpl
def register_mechanisms(register: Callable[[type], None]) -> None:
    """Register every mechanism class this plugin provides."""
    register(NoisyMean)
