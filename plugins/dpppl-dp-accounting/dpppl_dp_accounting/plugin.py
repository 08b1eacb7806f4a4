"""Hook implementations of dpppl-dp-accounting: the ``rdp`` and ``pld`` accountants."""

from collections.abc import Callable

import dpppl
from dpppl_dp_accounting.pld import PldAccountant
from dpppl_dp_accounting.rdp import RdpAccountant


@dpppl.hookimpl
def register_accountants(register: Callable[[type], None]) -> None:
    register(RdpAccountant)
    register(PldAccountant)
