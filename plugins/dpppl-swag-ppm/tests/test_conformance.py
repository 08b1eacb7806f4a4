"""SWAG-PPM passes dpppl's conformance suite for mechanism plugins (``dpppl.testing``).

Its guarantee is not (ε, δ)-DP from an accountant, so the suite skips the event and noise
checks and says so; every other contract applies.
"""

from __future__ import annotations

import pytest

from dpppl.testing import mechanism_checks

#: Settings that keep one fit on the suite's 40-record model well under a second.
FAST = {"warmup_epochs": 20, "swag_epochs": 20, "risk_draws": 200}


@pytest.mark.parametrize("check", mechanism_checks("swag-ppm", options=FAST), ids=str)
def test_swag_ppm_keeps_the_mechanism_contract(check):
    skipped = check()
    if skipped:
        pytest.skip(skipped)
