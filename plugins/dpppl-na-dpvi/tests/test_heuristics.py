"""The data-independent hyperparameter rules: standardising preconditioner, eq. A58 learning
rate capped at the u-coordinates' relaxation rate, annealed burn-in."""

from __future__ import annotations

import math

import numpy as np
import pymc as pm
import pytest

from dpppl import record_model
from dpppl_na_dpvi import heuristics
from dpppl_na_dpvi.heuristics import StandardisedSchedule


@pytest.fixture(scope="module")
def model():
    with pm.Model() as m:
        p = pm.Beta("p", 1, 1)
        pm.Bernoulli("y", p=p, observed=np.random.default_rng(0).binomial(1, 0.3, 400))
    return record_model(m)


def schedule(model, **overrides):
    options = dict(noise_multiplier=30.0, sampling_rate=0.1, steps=1000, burn_in_steps=200)
    options.update(overrides)
    return StandardisedSchedule(model, **options)


def test_the_learning_rate_follows_eq_a58_times_beta(model):
    s = schedule(model, learning_rate_scale=0.7, clipping_bound=2.0)
    phi = s.initial_phi()[None]
    settings = s.settings(phi, progress=1.0)
    d = 2 * model.n_params
    lr_heur = math.sqrt(2) * 0.7 / (30.0 * 2.0 * math.sqrt(1000 * d))
    np.testing.assert_allclose(settings.learning_rate, lr_heur * np.asarray(settings.preconditioner))


def test_the_preconditioner_standardises_the_gradients(model):
    s = schedule(model)
    variance = 4e-4
    u = np.log(np.expm1(variance))
    settings = s.settings(np.array([[0.0, u]]), progress=0.5)
    beta = np.asarray(settings.preconditioner)
    np.testing.assert_allclose(beta[0], math.sqrt(variance) * math.sqrt(model.n_records))
    assert beta[1] == 2 * model.n_records


def test_the_default_clipping_bound_grows_with_the_dimension(model):
    assert schedule(model).clipping_bound == pytest.approx(heuristics.CLIP_SCALE * math.sqrt(2))


def test_the_u_coordinates_relax_at_the_target_rate_after_the_burn_in(model):
    s = schedule(model)
    settings = s.settings(s.initial_phi()[None], progress=1.0)
    n = model.n_params
    # Curvature of the ELBO in u is 1/2, so one step contracts u by λ κ / 2.
    rate = float(settings.learning_rate[n]) * 0.1 / 2
    assert rate == pytest.approx(heuristics.FINAL_RATE)
    burn = s.settings(s.initial_phi()[None], progress=0.0)
    assert float(burn.learning_rate[n]) * 0.1 / 2 == pytest.approx(heuristics.BURN_IN_RATE)


def phi_at_posterior_variance(model, fisher_per_record):
    """φ with q's variance at 1/(N Ī), where the ELBO's optimum puts it."""
    variance = 1.0 / (model.n_records * fisher_per_record)
    return np.array([[0.0, np.log(np.expm1(variance))]])


def mu_relaxation_rate(model, settings, fisher_per_record):
    # The ELBO's curvature in μ is N Ī; one step contracts μ by λ κ N Ī.
    return float(settings.learning_rate[0]) * 0.1 * model.n_records * fisher_per_record


@pytest.fixture(scope="module")
def informative_model():
    """A normal mean with σ = 0.1: Ī = 100 per record in μ's units."""
    with pm.Model() as m:
        mu = pm.Normal("mu", 0, 1)
        pm.Normal("y", mu, 0.1, observed=np.random.default_rng(0).normal(0.3, 0.1, 400))
    return record_model(m)


def test_no_mu_coordinate_relaxes_faster_than_the_u_coordinates(informative_model):
    s = schedule(informative_model)
    settings = s.settings(phi_at_posterior_variance(informative_model, 100.0), progress=1.0)
    rate = mu_relaxation_rate(informative_model, settings, 100.0)
    assert rate == pytest.approx(heuristics.FINAL_RATE, rel=1e-6)


def test_a_coordinate_with_little_information_per_record_keeps_its_slower_rate(model):
    # Bernoulli at p = 0.3 in the logit: Ī = p(1 - p) = 0.21 < 1, rate √Ī · r.
    s = schedule(model)
    settings = s.settings(phi_at_posterior_variance(model, 0.21), progress=1.0)
    rate = mu_relaxation_rate(model, settings, 0.21)
    assert rate == pytest.approx(math.sqrt(0.21) * heuristics.FINAL_RATE, rel=1e-6)


def test_the_fixed_phase_restarts_from_the_average_of_the_late_burn_in(model):
    s = schedule(model)
    burn_in = np.vstack([np.full((300, 2), 5.0), np.full((100, 2), 1.0)])
    np.testing.assert_allclose(s.restart(burn_in), [1.0, 1.0])


def test_the_start_has_variance_one_over_n(model):
    phi0 = schedule(model).initial_phi()
    assert np.log1p(np.exp(phi0[1])) == pytest.approx(1 / model.n_records)
