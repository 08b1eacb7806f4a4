"""Moment matching: the node rules, the choice of power, and agreement between backends."""

from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import dpppl
from dpppl.plugin import Progress
from dpppl_dp_sep import SEPSettings, run_sep
from dpppl_dp_sep.families import FAMILIES, Natural, Whitening
from dpppl_dp_sep.moments import (
    MIN_RELATIVE_ESS,
    GaussHermite,
    MonteCarlo,
    Spherical,
    choose_power,
    tilted_moments,
)


def weighted_moments(rule, d: int, key=jax.random.key(0)):
    z, log_weights = rule.nodes(key, d)
    w = np.exp(np.asarray(log_weights))
    z = np.asarray(z)
    return w.sum(), w @ z, (w[:, None] * z).T @ z, w @ z[:, 0] ** 3, w @ z[:, 0] ** 4


@pytest.mark.parametrize("d", [1, 3])
def test_gauss_hermite_integrates_the_standard_normal_moments(d):
    total, mean, second, third, fourth = weighted_moments(GaussHermite(5), d)
    assert total == pytest.approx(1.0)
    np.testing.assert_allclose(mean, 0, atol=1e-12)
    np.testing.assert_allclose(second, np.eye(d), atol=1e-12)
    assert third == pytest.approx(0, abs=1e-12) and fourth == pytest.approx(3.0)


def test_the_spherical_rule_is_exact_to_degree_three_in_any_frame():
    for seed in range(3):
        total, mean, second, third, _ = weighted_moments(Spherical(), 6, jax.random.key(seed))
        assert total == pytest.approx(1.0)
        np.testing.assert_allclose(mean, 0, atol=1e-12)
        np.testing.assert_allclose(second, np.eye(6), atol=1e-12)
        assert third == pytest.approx(0, abs=1e-12)


def test_monte_carlo_nodes_come_in_antithetic_pairs():
    z, log_weights = MonteCarlo(8).nodes(jax.random.key(0), 3)
    np.testing.assert_array_equal(z[:4], -z[4:])
    assert float(jnp.exp(log_weights).sum()) == pytest.approx(1.0)


class TestChoosePower:
    log_weights = jnp.full(64, -jnp.log(64.0))
    z = jax.random.normal(jax.random.key(0), (64,))

    def test_a_mild_tilt_is_matched_in_full(self):
        assert float(choose_power(self.log_weights, 0.1 * self.z)) == 1.0

    def test_a_sharp_tilt_is_matched_at_the_largest_power_the_nodes_resolve(self):
        h = 40.0 * self.z
        power = float(choose_power(self.log_weights, h))
        assert 0 < power < 1
        for alpha, accepted in ((power, True), (2 * power, False)):
            w = jax.nn.softmax(self.log_weights + alpha * h)
            ess = 1 / float(jnp.sum(w**2) * 64)
            assert (ess >= MIN_RELATIVE_ESS) is accepted

    def test_a_record_outside_the_support_everywhere_gets_power_zero(self):
        assert float(choose_power(self.log_weights, jnp.full(64, -jnp.inf))) == 0.0


def test_a_gaussian_likelihood_gives_its_own_natural_parameters_at_any_power():
    """h(θ) = −½(θ − a)ᵀP(θ − a) is its own site: Λ_n = P, η_n = Pa, whatever the cavity and
    the power, when the nodes integrate exactly (Gauss–Hermite, quadratic h)."""
    family = FAMILIES["full"]
    P = np.array([[0.8, 0.3], [0.3, 0.5]])
    a = np.array([0.4, -1.1])
    cavity = family.whiten(Natural(jnp.array([1.0, 2.0]), jnp.array([[3.0, 0.5], [0.5, 2.0]])))
    z, log_weights = GaussHermite(12).nodes(None, 2)
    theta = np.asarray(family.to_theta(cavity, z))
    h = -0.5 * np.einsum("si,ij,sj->s", theta - a, P, theta - a)
    grads = -(theta - a) @ P
    for power in (1.0, 0.25):
        m, M = tilted_moments(family, cavity, z, log_weights, jnp.asarray(h), jnp.asarray(grads),
                              jnp.asarray(power))
        site = family.site(cavity, m, M, jnp.asarray(power))
        np.testing.assert_allclose(site.precision, P, rtol=1e-6)
        np.testing.assert_allclose(site.eta, P @ a, rtol=1e-6)


def test_the_diagonal_site_formula_matches_the_full_one_on_a_diagonal_problem():
    m, M = jnp.array([0.2, -0.1]), jnp.array([-0.05, -0.3])
    full, diagonal = FAMILIES["full"], FAMILIES["diagonal"]
    mean, precision = jnp.array([0.3, 1.0]), jnp.array([4.0, 9.0])
    a = full.site(Whitening(mean, jnp.diag(jnp.sqrt(precision))), m, jnp.diag(M), 0.5)
    b = diagonal.site(Whitening(mean, jnp.sqrt(precision)), m, M, 0.5)
    np.testing.assert_allclose(jnp.diagonal(a.precision), b.precision, rtol=1e-12)
    np.testing.assert_allclose(a.eta, b.eta, rtol=1e-12)


@pytest.mark.parametrize("n_features", [1, 2])
def test_cubature_and_monte_carlo_agree_on_a_non_conjugate_model(
    n_features, logistic_1d, logistic_2d
):
    """Logistic regression in 1-D and 2-D: SEP with Gauss–Hermite cubature and with Monte Carlo
    nodes reach the same Gaussian (up to the Monte Carlo error, averaged over the run)."""
    model = dpppl.record_model(logistic_1d if n_features == 1 else logistic_2d)
    base = SEPSettings(
        covariance="full", nodes=GaussHermite(8), steps=30, batch_size=model.n_records,
        damping=0.5, average_last=0.5,
    )
    results = [
        run_sep(model, model.data(), settings, key=jax.random.key(0), progress=Progress(False))
        for settings in (base, dataclasses.replace(base, nodes=MonteCarlo(256)))
    ]
    (mean_c, cov_c), (mean_m, cov_m) = (r.family.moments(r.approximation) for r in results)
    sd = np.sqrt(np.diag(cov_c))
    np.testing.assert_array_less(np.abs(mean_m - mean_c), 0.05 * sd)
    np.testing.assert_allclose(np.sqrt(np.diag(cov_m)), sd, rtol=0.05)
    # And both are a proper posterior approximation, not the prior (sd 2).
    assert np.all(sd < 1.0)
