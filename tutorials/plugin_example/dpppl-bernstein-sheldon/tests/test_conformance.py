"""The example plugin passes dpppl's conformance suite on each family it supports.

Run after installing the plugin (``pip install -e .`` in its folder): ``pytest tests``.
"""

from __future__ import annotations

import pytest

from dpppl.testing import beta_bernoulli, dirichlet_categorical, mechanism_checks

#: Fewer draws than the default 1000: the suite fits about 130 times per model.
FAST = {"draws": 200, "oversampling": 10}

CHECKS = {
    f"{family}: {check}": check
    for family, builder in [
        # The default model: Gamma–Exponential with distinctive float records (leak check).
        ("gamma_exponential", None),
        ("beta_bernoulli", beta_bernoulli),
        ("dirichlet_categorical", dirichlet_categorical),
    ]
    for check in mechanism_checks("bernstein_sheldon", options=FAST, model=builder)
}


@pytest.mark.parametrize("check", CHECKS.values(), ids=CHECKS.keys())
def test_bernstein_sheldon_keeps_the_mechanism_contract(check):
    skipped = check()
    if skipped:
        pytest.skip(skipped)
