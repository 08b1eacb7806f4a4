"""Hook implementations of dpppl-na-dpvi."""

import dpppl
from dpppl_na_dpvi.mechanism import NADPVI


@dpppl.hookimpl
def register_mechanisms(register):
    register(NADPVI)
