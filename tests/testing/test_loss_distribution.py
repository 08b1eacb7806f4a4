"""The independent reference the accountant suite checks against: a bracket of the exact ε of
composed Poisson-subsampled Gaussian releases, from the privacy-loss distribution rounded up and
rounded down."""

from __future__ import annotations

import math

import pytest

from dpppl.privacy.events import NeighbourRelation
from dpppl.testing import exact_gaussian_epsilon
from dpppl.testing.loss_distribution import subsampled_gaussian_epsilon_bounds


@pytest.mark.parametrize(("sigma", "steps"), [(1.0, 1), (2.0, 1), (10.0, 100)])
def test_without_subsampling_the_bracket_holds_the_analytic_gaussian_epsilon(sigma, steps):
    # q = 1: T releases with noise σ are one release with noise σ/√T.
    lower, upper = subsampled_gaussian_epsilon_bounds(sigma, 1.0, steps, 1e-5)
    exact = exact_gaussian_epsilon(sigma / math.sqrt(steps), 1e-5)
    assert lower <= exact <= upper
    # Rounding moves each step's loss by at most one grid step (10⁻⁴) either way.
    assert upper - lower <= 2e-4 * steps


def test_a_finer_grid_gives_a_nested_narrower_bracket():
    coarse = subsampled_gaussian_epsilon_bounds(1.0, 0.1, 50, 1e-5, grid=1e-3)
    fine = subsampled_gaussian_epsilon_bounds(1.0, 0.1, 50, 1e-5, grid=1e-4)
    assert coarse[0] <= fine[0] <= fine[1] <= coarse[1]
    assert fine[1] - fine[0] < 0.2 * (coarse[1] - coarse[0])


def test_subsampling_amplifies_privacy():
    _, sampled = subsampled_gaussian_epsilon_bounds(2.0, 0.01, 20, 1e-5)
    full, _ = subsampled_gaussian_epsilon_bounds(2.0, 1.0, 20, 1e-5)
    assert sampled < 0.1 * full


def test_replace_one_is_refused():
    with pytest.raises(ValueError, match="add-or-remove-one"):
        subsampled_gaussian_epsilon_bounds(
            1.0, 0.1, 10, 1e-5, relation=NeighbourRelation.REPLACE_ONE
        )
