"""Hook implementations of dpppl-dp-sep."""

import dpppl
from dpppl_dp_sep.mechanism import DPSEP


@dpppl.hookimpl
def register_mechanisms(register):
    register(DPSEP)
