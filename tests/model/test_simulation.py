"""The simulator: parameters from the model's prior, data sets from its likelihood given θ and
covariates of any length, compiled once per model."""

from __future__ import annotations

import numpy as np
import pymc as pm
import pytest
from scipy import stats

import dpppl.model.simulation
from dpppl import InvalidDataError, ModelNotSupportedError, record_model
from dpppl.model.simulation import prior_summary, simulator

SIMULABLE = [
    "beta_bernoulli",
    "dirichlet_categorical",
    "gamma_exponential",
    "linear_regression",
    "logistic_regression",
    "two_observed",
]


def seeds(n, entropy=0):
    return np.random.SeedSequence(entropy).spawn(n)


@pytest.fixture(scope="module")
def models(model_factories):
    return {name: model_factories[name](np.random.default_rng(0)) for name in SIMULABLE}


@pytest.mark.parametrize("name", SIMULABLE)
def test_theta_is_the_prior_draw_in_pymcs_unconstrained_space(models, name):
    compiled = record_model(models[name])
    draw = simulator(compiled).prior(np.random.SeedSequence(1))
    assert draw.theta.shape == (compiled.n_params,)
    back = compiled.constrain(draw.theta)
    for variable, value in draw.values.items():
        np.testing.assert_allclose(back[variable], value, rtol=1e-10)


def test_prior_draws_have_the_priors_moments(models):
    # rate ~ Gamma(2, 2): mean 1, variance 1/2.
    sim = simulator(record_model(models["gamma_exponential"]))
    rates = np.array([sim.prior(s).values["rate"] for s in seeds(4000)])
    assert stats.kstest(rates, stats.gamma(a=2.0, scale=0.5).cdf).pvalue > 1e-3
    assert abs(rates.mean() - 1.0) < 4 * np.sqrt(0.5 / rates.size)


def test_dirichlet_prior_draws_are_on_the_simplex_with_the_priors_mean(models):
    sim = simulator(record_model(models["dirichlet_categorical"]))
    probs = np.array([sim.prior(s).values["probs"] for s in seeds(3000)])
    np.testing.assert_allclose(probs.sum(axis=1), 1.0)
    # Dirichlet(1, 1, 1): each component has mean 1/3 and variance 1/18.
    np.testing.assert_allclose(probs.mean(axis=0), 1 / 3, atol=4 * np.sqrt(1 / 18 / 3000))


def test_the_same_seed_gives_the_same_draws(models):
    sim = simulator(record_model(models["two_observed"]))
    first, again, other = (sim.prior(np.random.SeedSequence(s)) for s in (5, 5, 6))
    np.testing.assert_array_equal(first.theta, again.theta)
    assert not np.array_equal(first.theta, other.theta)
    data = [sim.data(first.theta, np.random.SeedSequence(s), n_records=50) for s in (1, 1, 2)]
    np.testing.assert_array_equal(data[0]["height"], data[1]["height"])
    assert not np.array_equal(data[0]["height"], data[2]["height"])


def test_data_given_theta_follow_the_likelihood_with_the_users_covariates(models):
    compiled = record_model(models["linear_regression"])
    sim = simulator(compiled)
    assert sim.covariate_names == ("X",) and sim.observed_names == ("y",)
    theta = compiled.parameters.flatten(
        {"intercept": 1.5, "slope": -2.0, "sigma_log__": np.log(0.7)}
    )
    x = np.linspace(-3, 3, 5000)  # another length than the model's 40 records
    data = sim.data(theta, np.random.SeedSequence(0), covariates={"X": x})
    np.testing.assert_array_equal(data["X"], x)
    residual = data["y"] - (1.5 - 2.0 * x)
    assert abs(residual.mean()) < 4 * 0.7 / np.sqrt(x.size)
    assert stats.kstest(residual, stats.norm(0, 0.7).cdf).pvalue > 1e-3
    compiled.check_data(data)


def test_discrete_observations_follow_the_likelihood_in_the_models_dtypes(models):
    compiled = record_model(models["logistic_regression"])
    sim = simulator(compiled)
    x = np.random.default_rng(1).normal(size=(20000, 3))
    w = np.array([1.0, -0.5, 0.2])
    data = sim.data(w, np.random.SeedSequence(0), covariates={"X": x})
    p = 1 / (1 + np.exp(-x @ w))
    assert data["Y"].dtype == compiled.data()["Y"].dtype
    assert set(np.unique(data["Y"])) <= {0, 1}
    # The sum of independent Bernoulli(p_i) has mean Σp_i and variance Σp_i(1 − p_i).
    assert abs(data["Y"].sum() - p.sum()) < 4 * np.sqrt((p * (1 - p)).sum())


def test_a_model_without_covariates_takes_the_number_of_records(models):
    compiled = record_model(models["beta_bernoulli"])
    sim = simulator(compiled)
    theta = np.array([0.0])  # p = 1/2
    data = sim.data(theta, np.random.SeedSequence(0), n_records=4000)
    assert data["y"].shape == (4000,)
    assert abs(data["y"].mean() - 0.5) < 4 * 0.5 / np.sqrt(4000)
    with pytest.raises(InvalidDataError, match="n_records"):
        sim.data(theta, np.random.SeedSequence(0))


@pytest.mark.parametrize("holder", ["numpy", "pm.Data"])
@pytest.mark.parametrize("likelihood", ["Normal", "MvNormal"])
def test_records_with_several_values_are_simulated_in_their_shape(holder, likelihood):
    # Each record holds a pair, from two independent normals or one bivariate normal: the
    # simulated pairs have the model's shape and the likelihood's means and scale.
    observed = np.zeros((50, 2))
    with pm.Model() as model:
        mu = pm.Normal("mu", [-3.0, 3.0], 0.01, shape=2)
        values = pm.Data("y_data", observed) if holder == "pm.Data" else observed
        if likelihood == "Normal":
            pm.Normal("y", mu, 0.5, observed=values)
        else:
            pm.MvNormal("y", mu, 0.25 * np.eye(2), observed=values)
    sim = simulator(record_model(model))
    draw = sim.prior(np.random.SeedSequence(0))
    [name] = sim.observed_names
    data = sim.data(draw.theta, np.random.SeedSequence(1), n_records=4000)[name]
    assert data.shape == (4000, 2)
    np.testing.assert_allclose(data.mean(axis=0), draw.values["mu"], atol=4 * 0.5 / np.sqrt(4000))
    np.testing.assert_allclose(data.std(axis=0), 0.5, rtol=0.05)


def test_covariates_must_fit_the_model(models):
    sim = simulator(record_model(models["logistic_regression"]))
    theta = np.zeros(3)
    seed = np.random.SeedSequence(0)
    with pytest.raises(InvalidDataError, match="missing"):
        sim.data(theta, seed)
    with pytest.raises(InvalidDataError, match="unexpected"):
        sim.data(theta, seed, covariates={"X": np.zeros((5, 3)), "Z": np.zeros(5)})
    with pytest.raises(InvalidDataError, match="shape"):
        sim.data(theta, seed, covariates={"X": np.zeros((5, 2))})
    with pytest.raises(InvalidDataError, match="NaN"):
        sim.data(theta, seed, covariates={"X": np.full((5, 3), np.nan)})
    with pytest.raises(InvalidDataError, match="n_records=6"):
        sim.data(theta, seed, covariates={"X": np.zeros((5, 3))}, n_records=6)


def test_the_simulator_is_compiled_once_per_model(models, monkeypatch):
    compiled = record_model(models["two_observed"])
    sim = simulator(compiled)
    compiles = []
    original = pm.compile
    monkeypatch.setattr(
        dpppl.model.simulation.pm, "compile", lambda *a, **k: compiles.append(1) or original(*a, **k)
    )
    assert simulator(compiled) is sim
    for n in (3, 30, 300):
        theta = sim.prior(np.random.SeedSequence(n)).theta
        assert sim.data(theta, np.random.SeedSequence(n), n_records=n)["count"].shape == (n,)
    assert compiles == []


def test_models_with_a_potential_cannot_be_simulated(model_factories):
    model = model_factories["with_potential"](np.random.default_rng(0))
    with pytest.raises(ModelNotSupportedError, match="Potential"):
        simulator(record_model(model))


def test_observations_computed_from_data_cannot_be_simulated():
    with pm.Model() as model:
        Y = pm.Data("Y", np.array([0.5, 1.5, 2.5]))
        mu = pm.Normal("mu")
        pm.Normal("y", mu, 1, observed=2 * Y)
    with pytest.raises(ModelNotSupportedError, match="expression of data"):
        simulator(record_model(model))


# -- the prior summarised per unconstrained coordinate ------------------------------------------


def test_the_summary_is_the_centre_and_scale_of_each_unconstrained_coordinate():
    with pm.Model() as model:
        pm.Normal("w", 1.5, 2.0, shape=2)
        pm.HalfNormal("s", 1.0)
        pm.Normal("y", 0.0, 1.0, observed=np.zeros(50))
    summary = prior_summary(record_model(model))
    # w is unconstrained: its normal prior's median and sd.  s is log-transformed: log|Z| for
    # Z ~ N(0, 1) has median log 0.674 and 16th/84th percentiles log 0.200 and log 1.410.
    np.testing.assert_allclose(summary.centre, [1.5, 1.5, np.log(0.674)], atol=0.15)
    expected_scale = (np.log(1.410) - np.log(0.2)) / 2
    np.testing.assert_allclose(summary.scale, [2.0, 2.0, expected_scale], rtol=0.08)
    # log|Z| has a long left tail: a normal with that centre and scale misdescribes it.
    np.testing.assert_array_equal(summary.normal, [True, True, False])


def test_the_summary_does_not_read_the_data():
    def model_of(y):
        with pm.Model() as model:
            mu = pm.Normal("mu", 0.0, 1.0)
            pm.Normal("y", mu, 1.0, observed=y)
        return model

    first = prior_summary(record_model(model_of(np.zeros(30))))
    second = prior_summary(record_model(model_of(np.full(30, 100.0))))
    np.testing.assert_array_equal(first.centre, second.centre)
    np.testing.assert_array_equal(first.scale, second.scale)


def test_a_model_that_cannot_be_simulated_has_no_summary():
    with pm.Model() as model:
        mu = pm.Normal("mu", 0.0, 1.0)
        pm.Potential("pull", -(mu**2))
        pm.Normal("y", mu, 1.0, observed=np.zeros(30))
    assert prior_summary(record_model(model)) is None
