"""The RDP and PLD accountants pass dpppl's conformance suite for accountant plugins."""

from __future__ import annotations

import pytest

from dpppl.testing import accountant_checks

CHECKS = {f"{name}: {check}": check for name in ("rdp", "pld") for check in accountant_checks(name)}


@pytest.mark.parametrize("check", CHECKS.values(), ids=CHECKS.keys())
def test_keeps_the_accountant_contract(check):
    skipped = check()
    if skipped:
        pytest.skip(skipped)
