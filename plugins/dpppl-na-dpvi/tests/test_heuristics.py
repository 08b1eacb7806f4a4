"""The data-independent hyperparameter rules: standardising preconditioner, eq. A58 learning
rate, annealed burn-in."""

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


def test_the_fixed_phase_restarts_from_the_average_of_the_late_burn_in(model):
    s = schedule(model)
    burn_in = np.vstack([np.full((300, 2), 5.0), np.full((100, 2), 1.0)])
    np.testing.assert_allclose(s.restart(burn_in), [1.0, 1.0])


def test_the_start_has_variance_one_over_n(model):
    phi0 = schedule(model).initial_phi()
    assert np.log1p(np.exp(phi0[1])) == pytest.approx(1 / model.n_records)
