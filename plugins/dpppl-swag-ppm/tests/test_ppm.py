"""The pseudo posterior mechanism: risks, weights, sensitivity, re-weighting and calibration."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pymc as pm
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from hypothesis.extra.numpy import arrays

import dpppl
from dpppl.plugin import Progress
from dpppl_swag_ppm import ppm
from dpppl_swag_ppm.batches import to_device
from dpppl_swag_ppm.fitting import PPMFitter
from dpppl_swag_ppm.mechanism import SwagPPM
from dpppl_swag_ppm.ppm import local_sensitivity, record_risks, reweight, risk_weights
from dpppl_swag_ppm.sgd import SwagTrainer

risks_arrays = arrays(
    np.float64,
    st.integers(2, 40),
    elements=st.one_of(st.floats(0, 50), st.just(np.inf)),
)


class TestWeights:
    @given(risks=risks_arrays, scale=st.floats(0.1, 3), shift=st.floats(-1, 1))
    @settings(max_examples=200, deadline=None)
    def test_weights_lie_in_unit_interval_and_do_not_increase_with_risk(self, risks, scale, shift):
        weights = risk_weights(risks, scale, shift)
        assert np.all((weights >= 0) & (weights <= 1))
        order = np.argsort(risks, kind="stable")
        assert np.all(np.diff(weights[order]) <= 1e-12)

    @given(risks=risks_arrays)
    def test_infinite_risk_gives_weight_zero(self, risks):
        assert np.all(risk_weights(risks, 1.0, 0.5)[np.isinf(risks)] == 0)

    def test_least_risky_record_gets_one_and_riskiest_zero_with_paper_defaults(self):
        weights = risk_weights(np.array([2.0, 5.0, 3.5, 8.0]), scale=1.0, shift=0.0)
        np.testing.assert_allclose(weights, [1.0, 0.5, 0.75, 0.0])

    def test_equal_risks_give_equal_weights(self):
        np.testing.assert_allclose(risk_weights(np.full(4, 3.0), 0.8, 0.1), 0.9)


class TestSensitivity:
    def test_is_the_largest_weighted_risk(self):
        assert local_sensitivity(np.array([0.5, 1.0, 0.2]), np.array([4.0, 1.0, 9.0])) == 2.0

    def test_records_of_weight_zero_count_for_nothing_even_at_infinite_risk(self):
        assert local_sensitivity(np.array([0.0, 0.5]), np.array([np.inf, 3.0])) == 1.5


class TestReweighting:
    @given(
        risks=arrays(np.float64, st.integers(2, 40), elements=st.floats(0, 50)),
        k=st.floats(0.05, 0.99),
    )
    @settings(max_examples=200, deadline=None)
    def test_brings_every_record_to_at_most_k_times_the_sensitivity(self, risks, k):
        weights = risk_weights(risks)
        new = reweight(weights, risks, k)
        assert np.all((new >= 0) & (new <= 1))
        assert np.all(new[weights == 0] == 0)
        assert local_sensitivity(new, risks) <= k * local_sensitivity(weights, risks) + 1e-12

    def test_follows_equation_seven(self):
        weights, risks = np.array([0.8, 0.5, 0.1, 0.0]), np.array([5.0, 2.0, 1.0, 7.0])
        # Δ_i = (4, 1, 0.1, 0), Δ = 4: α^w = 0.9·α·4/Δ_i, clipped to 1.
        np.testing.assert_allclose(reweight(weights, risks, 0.9), [0.72, 1.0, 1.0, 0.0])


class TestRecordRisks:
    def test_equal_the_largest_absolute_log_likelihood_over_draws(self, logistic, monkeypatch):
        model = dpppl.record_model(logistic)
        data = to_device(model.data())
        draws = jnp.asarray(np.random.default_rng(0).normal(size=(7, model.n_params)))
        loglik = np.stack([np.asarray(model.loglik(theta, data)) for theta in draws])
        # Chunks of 3 records: many chunks and a padded last one.
        monkeypatch.setattr(ppm, "RISK_BLOCK", 21)
        np.testing.assert_allclose(
            record_risks(model, data, draws), np.abs(loglik).max(axis=0), rtol=1e-12
        )


def normal_model_with_overflowing_record():
    """A normal likelihood with one observation so large that its log-likelihood overflows to
    -inf at every θ.  dpppl accepts finite values however extreme (it refuses only observations
    that no parameter makes possible, such as a negative exponential one, before the fit)."""
    rng = np.random.default_rng(1)
    y = rng.normal(1.0, 1.0, size=300)
    y[17] = 1e200
    with pm.Model(coords={"obs": range(300)}) as model:
        mu = pm.Normal("mu", 0.0, 5.0)
        pm.Normal("y", mu, 1.0, observed=y, dims="obs")
    return model


def run_ppm(pymc_model, epsilon, seed=0, **options):
    """A whole SWAG-PPM run, returning its private outcome (for tests only)."""
    model = dpppl.record_model(pymc_model)
    mechanism = SwagPPM(**options)
    fitter = PPMFitter(
        model,
        to_device(model.data()),
        SwagTrainer(model, mechanism.schedule(model.n_records, model.n_params)),
        mechanism.options,
        jax.random.key(seed),
        Progress(False),
    )
    return model, fitter.run(epsilon)


class TestMechanismRun:
    def test_record_with_infinite_log_likelihood_gets_weight_zero(self, fast):
        model, outcome = run_ppm(normal_model_with_overflowing_record(), epsilon=2.0, **fast)
        assert outcome.risk_weights[17] == 0
        assert outcome.final.weights[17] == 0
        assert np.isfinite(outcome.epsilon)
        assert np.all(np.isfinite(np.asarray(outcome.released)))
        # Everyone else keeps a positive weight.
        assert np.count_nonzero(outcome.final.weights) >= 298

    @pytest.mark.parametrize("reweighted", [False, True])
    def test_reported_epsilon_is_twice_the_sensitivity_over_the_draws_used(
        self, logistic, fast, reweighted
    ):
        model, outcome = run_ppm(logistic, epsilon=3.0, draws=4, reweight=reweighted, **fast)
        final = outcome.final
        data = to_device(model.data())
        loglik = np.stack([np.asarray(model.loglik(theta, data)) for theta in final.draws])
        delta = np.max(np.abs(final.weights[None, :] * loglik))
        assert outcome.epsilon == pytest.approx(4 * 2 * delta, rel=1e-12)
        # The released draws are among those the sensitivity was taken over.
        np.testing.assert_array_equal(outcome.released, final.draws[:4])

    @pytest.mark.parametrize(
        ("epsilon", "draws", "reweighted"),
        [(0.3, 1, False), (2.0, 5, False), (8.0, 10, False), (2.0, 5, True)],
    )
    def test_achieved_epsilon_never_exceeds_the_request(
        self, logistic, fast, epsilon, draws, reweighted
    ):
        _, outcome = run_ppm(
            logistic, epsilon=epsilon, draws=draws, reweight=reweighted, seed=3, **fast
        )
        assert 0 < outcome.epsilon <= epsilon

    def test_reweighting_raises_the_weights_at_the_same_budget(self, logistic, fast):
        _, plain = run_ppm(logistic, epsilon=2.0, draws=5, **fast)
        _, reweighted = run_ppm(logistic, epsilon=2.0, draws=5, reweight=True, **fast)
        assert reweighted.final.weights.mean() > plain.final.weights.mean()
