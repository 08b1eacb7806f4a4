"""Hook implementations: registers the ``"bernstein_sheldon"`` mechanism with dpppl."""

from __future__ import annotations

from collections.abc import Callable

import dpppl
from dpppl_bernstein_sheldon.mechanism import BernsteinSheldon


@dpppl.hookimpl
def register_mechanisms(register: Callable[[type], None]) -> None:
    """Register :class:`~dpppl_bernstein_sheldon.mechanism.BernsteinSheldon`."""
    register(BernsteinSheldon)
