"""The PRV accountant passes dpppl's conformance suite for accountant plugins."""

from __future__ import annotations

import pytest

from dpppl.testing import accountant_checks


@pytest.mark.parametrize("check", accountant_checks("prv"), ids=str)
def test_prv_keeps_the_accountant_contract(check):
    skipped = check()
    if skipped:
        pytest.skip(skipped)
