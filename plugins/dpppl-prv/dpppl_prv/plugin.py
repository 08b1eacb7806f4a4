"""Hook implementations of dpppl-prv: the ``prv`` accountant."""

from collections.abc import Callable

import dpppl
from dpppl_prv.accountant import PrvAccountant


@dpppl.hookimpl
def register_accountants(register: Callable[[type], None]) -> None:
    register(PrvAccountant)
