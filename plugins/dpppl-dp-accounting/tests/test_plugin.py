"""The distribution's entry point registers both accountants, as any third-party plugin would."""

from __future__ import annotations

import pytest

import dpppl
from dpppl.plugin import get_accountant
from dpppl_dp_accounting.pld import PldAccountant
from dpppl_dp_accounting.rdp import RdpAccountant


@pytest.mark.parametrize(("name", "cls"), [("rdp", RdpAccountant), ("pld", PldAccountant)])
def test_accountants_are_found_by_name_through_the_entry_point(name, cls):
    assert get_accountant(name) is cls
    assert dpppl.accountants()[name].distribution == "dpppl-dp-accounting"
