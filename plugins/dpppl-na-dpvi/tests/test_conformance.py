"""NA-DPVI passes dpppl's conformance suite for mechanism plugins (``dpppl.testing``)."""

from __future__ import annotations

import pytest

from dpppl.testing import mechanism_checks

#: Few DP-SGD steps and draws, and the Laplace post-processing: about 30 ms per fit once
#: compiled, so the suite's statistical check of the declared noise (80 fits) stays cheap.
FAST = {"steps": 300, "tune": 100, "draws": 100, "chains": 2, "mc_draws": 2, "inference": "laplace"}


@pytest.mark.parametrize("check", mechanism_checks("na-dpvi", options=FAST, noise_fits=20), ids=str)
def test_na_dpvi_keeps_the_mechanism_contract(check):
    skipped = check()
    if skipped:
        pytest.skip(skipped)
