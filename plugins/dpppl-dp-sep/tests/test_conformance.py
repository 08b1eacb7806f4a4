"""DP-SEP passes dpppl's conformance suite for mechanism plugins (``dpppl.testing``)."""

from __future__ import annotations

import pytest

from dpppl.testing import mechanism_checks

#: Three passes and few draws keep the statistical check of the declared noise (80 fits) cheap.
FAST = {"passes": 3.0, "draws": 50, "chains": 2}


@pytest.mark.parametrize("check", mechanism_checks("dp-sep", options=FAST, noise_fits=20), ids=str)
def test_dp_sep_keeps_the_mechanism_contract(check):
    skipped = check()
    if skipped:
        pytest.skip(skipped)
