"""PRV bounds: prv-accountant's own numbers, on a faster grid and discretisation."""

from __future__ import annotations

import math

import numpy as np
import pytest
from prv_accountant import PoissonSubsampledGaussianMechanism, PRVAccountant
from prv_accountant.discretisers import CellCentred
from prv_accountant.domain import Domain
from prv_accountant.privacy_random_variables import PrivacyRandomVariableTruncated
from scipy.stats import norm

from dpppl.plugin import GaussianEvent, NeighbourRelation, SelfComposedEvent, UnsupportedEventError
from dpppl.plugin import poisson_subsampled_gaussian as dp_sgd
from dpppl_prv.bounds import (
    SinglePassCellCentred,
    delta_upper_bound,
    epsilon_bounds,
    fast_even_length,
)
from dpppl_prv.composition import composition_of

ADD_REMOVE = NeighbourRelation.ADD_OR_REMOVE_ONE


def composition(sigma, q, steps):
    return composition_of(dp_sgd(sigma, q, steps), ADD_REMOVE)


@pytest.mark.parametrize(
    ("sigma", "q", "steps", "expected"),
    [
        (0.8, 0.001, 100, 0.270403364058018680360362395731),
        (3.0, 0.05, 100, 0.767933789666825572517439013609),
        (1.5, 0.05, 1000, 6.20996924657726712126759593957),
    ],
)
def test_opacus_table_computed_with_microsofts_accountant(sigma, q, steps, expected):
    # opacus/tests/prv_accountant.py: upper bounds at δ = 1e-6 with eps_error = 0.01 and
    # delta_error = δ/1000, checked there to 5 decimals.
    bounds = epsilon_bounds(
        composition(sigma, q, steps), delta=1e-6, eps_error=0.01, delta_error=1e-9
    )
    assert bounds[2] == pytest.approx(expected, abs=1e-6)


def test_opacus_prv_value_and_the_three_bounds_of_its_rdp_vector():
    # Opacus accountants_test.py: PRV upper bound 6.777395712150674 at 2249 steps; accountants.md
    # §5: (6.7584, 6.7688, 6.7791) at 2250 steps; both σ = 1.5, q = 0.04, δ = 1e-5.
    bounds = dict(delta=1e-5, eps_error=0.01, delta_error=1e-8)
    assert epsilon_bounds(composition(1.5, 0.04, 2249), **bounds)[2] == pytest.approx(
        6.777395712150674, abs=1e-7
    )
    assert epsilon_bounds(composition(1.5, 0.04, 2250), **bounds) == pytest.approx(
        (6.7584, 6.7688, 6.7791), abs=1e-4
    )


def test_bounds_match_prv_accountants_own_accountant():
    prv = PoissonSubsampledGaussianMechanism(sampling_probability=0.02, noise_multiplier=1.2)
    library = PRVAccountant(prvs=prv, max_self_compositions=500, eps_error=0.01, delta_error=1e-9)
    expected = library.compute_epsilon(delta=1e-6, num_self_compositions=500)
    ours = epsilon_bounds(composition(1.2, 0.02, 500), delta=1e-6, eps_error=0.01, delta_error=1e-9)
    assert ours == pytest.approx(expected, abs=1e-7)


@pytest.mark.parametrize(("sigma", "steps"), [(10.0, 100), (2.0, 1), (50.0, 10_000)])
def test_gaussian_bounds_contain_the_exact_epsilon(sigma, steps):
    # For q = 1 the composition is one Gaussian with μ = √T/σ, whose δ(ε) is known exactly.
    mu = math.sqrt(steps) / sigma
    event = SelfComposedEvent(GaussianEvent(sigma), steps)
    lo, _, up = epsilon_bounds(
        composition_of(event, ADD_REMOVE), delta=1e-5, eps_error=0.01, delta_error=1e-8
    )
    exact_delta = norm.cdf(-lo / mu + mu / 2) - math.exp(lo) * norm.cdf(-lo / mu - mu / 2)
    assert exact_delta >= 1e-5 >= (
        norm.cdf(-up / mu + mu / 2) - math.exp(up) * norm.cdf(-up / mu - mu / 2)
    )


def test_delta_bound_lies_above_the_exact_gaussian_delta():
    mu, epsilon = 1.0, 3.0
    exact = norm.cdf(-epsilon / mu + mu / 2) - math.exp(epsilon) * norm.cdf(-epsilon / mu - mu / 2)
    bound = delta_upper_bound(
        composition_of(SelfComposedEvent(GaussianEvent(10.0), 100), ADD_REMOVE),
        epsilon=epsilon,
        eps_error=0.01,
        delta_error=1e-10,
    )
    assert exact <= bound <= 1.1 * exact


def test_single_pass_discretisation_gives_the_libraries_masses_and_shift():
    prv = PoissonSubsampledGaussianMechanism(sampling_probability=0.05, noise_multiplier=2.0)
    domain = Domain.create_aligned(-4.0, 4.0, 1e-3)
    truncated = PrivacyRandomVariableTruncated(prv, domain.t_min(), domain.t_max())
    ours = SinglePassCellCentred().discretise(truncated, domain)
    library = CellCentred().discretise(truncated, domain)
    np.testing.assert_allclose(ours.pmf, library.pmf, rtol=1e-9, atol=1e-18)
    assert ours.domain.shifts() == pytest.approx(library.domain.shifts(), rel=1e-9, abs=1e-15)


@pytest.mark.parametrize("n", [2, 7, 2_196_154, 1_000_001])
def test_grid_lengths_are_even_fast_and_no_shorter(n):
    length = fast_even_length(n)
    assert length >= n and length % 2 == 0
    for prime in (2, 3, 5, 7, 11):
        while length % prime == 0:
            length //= prime
    assert length == 1


def test_a_grid_beyond_the_memory_limit_is_refused_before_it_is_built():
    with pytest.raises(UnsupportedEventError, match="pld"):
        epsilon_bounds(
            composition(300.0, 0.1, 10_000), delta=1e-5, eps_error=1e-5, delta_error=1e-8
        )


def test_the_librarys_failure_at_tiny_delta_becomes_a_refusal():
    with pytest.raises(UnsupportedEventError, match="Floating point errors"):
        epsilon_bounds(composition(1.0, 0.01, 100), delta=1e-17, eps_error=0.01, delta_error=1e-20)


def test_the_librarys_mean_check_failure_becomes_a_refusal_naming_pld():
    # prv-accountant issue #36, fixed only after 0.2.0: its own PRVAccountant fails here too.
    with pytest.raises(UnsupportedEventError, match="Discrete mean differs.*pld"):
        epsilon_bounds(composition(1.0, 0.125, 64), delta=1e-6, eps_error=0.01, delta_error=1e-9)
