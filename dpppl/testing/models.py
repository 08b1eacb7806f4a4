"""Example models for testing dpppl and its plugins: small PyMC models (N = 40 records) that cover
what the record model must handle, and the conformance suite's default model."""

from __future__ import annotations

from collections.abc import Callable

import numpy as np
import pymc as pm

N = 40


def gamma_exponential(rng):
    with pm.Model(coords={"obs": range(N)}) as model:
        rate = pm.Gamma("rate", 2.0, 2.0)
        pm.Exponential("y", lam=rate, observed=rng.exponential(0.8, N), dims="obs")
    return model


def beta_bernoulli(rng):
    with pm.Model() as model:
        p = pm.Beta("p", 1.0, 1.0)
        pm.Bernoulli("y", p=p, observed=rng.binomial(1, 0.3, N))
    return model


def dirichlet_categorical(rng):
    with pm.Model(coords={"obs": range(N), "category": ["a", "b", "c"]}) as model:
        probs = pm.Dirichlet("probs", np.ones(3), dims="category")
        pm.Categorical("y", p=probs, observed=rng.choice(3, N, p=[0.2, 0.3, 0.5]), dims="obs")
    return model


def linear_regression(rng):
    x = rng.normal(size=N)
    with pm.Model(coords={"obs": range(N)}) as model:
        X = pm.Data("X", x, dims="obs")
        intercept = pm.Normal("intercept", 0, 5)
        slope = pm.Normal("slope", 0, 5)
        sigma = pm.HalfNormal("sigma", 2)
        pm.Normal("y", intercept + slope * X, sigma, observed=1 + 2 * x + rng.normal(size=N), dims="obs")
    return model


def logistic_regression(rng):
    x = rng.normal(size=(N, 3))
    y = rng.binomial(1, 1 / (1 + np.exp(-x @ [1.0, -0.5, 0.2])))
    with pm.Model(coords={"obs": range(N), "feature": ["f0", "f1", "f2"]}) as model:
        X = pm.Data("X", x, dims=("obs", "feature"))
        Y = pm.Data("Y", y, dims="obs")
        w = pm.Normal("w", 0, 1, dims="feature")
        pm.Bernoulli("y", logit_p=X @ w, observed=Y, dims="obs")
    return model


def wide_logistic_regression(rng, n_covariates: int = 35, n_records: int = 2000):
    """A logistic regression past NA-DPVI's 30 parameters, where its defaults switch to a diagonal
    curvature: covariates X (``pm.Data``) 0.5 · N(0, 1), w ~ N(0, 0.5²), b0 ~ N(0, 1)."""
    x = 0.5 * rng.standard_normal((n_records, n_covariates))
    with pm.Model(coords={"feature": range(n_covariates)}) as model:
        X = pm.Data("X", x)
        b0 = pm.Normal("b0", 0, 1)
        w = pm.Normal("w", 0, 0.5, dims="feature")
        pm.Bernoulli("y", logit_p=b0 + X @ w, observed=rng.binomial(1, 0.5, n_records))
    return model


def two_observed(rng):
    with pm.Model(coords={"obs": range(N)}) as model:
        mu = pm.Normal("mu", 0, 3)
        sigma = pm.HalfNormal("sigma", 1)
        pm.Normal("height", mu, sigma, observed=rng.normal(1, 0.5, N), dims="obs")
        pm.Poisson("count", pm.math.exp(mu / 4), observed=rng.poisson(1.5, N), dims="obs")
    return model


def with_potential(rng):
    with pm.Model(coords={"obs": range(N)}) as model:
        mu = pm.Normal("mu", 0, 3)
        sigma = pm.HalfNormal("sigma", 1)
        pm.Potential("soft_constraint", -((mu - sigma) ** 2))
        pm.Normal("y", mu, sigma, observed=rng.normal(0.5, 1, N), dims="obs")
    return model


EXAMPLE_MODELS = {
    f.__name__: f
    for f in (
        gamma_exponential,
        beta_bernoulli,
        dirichlet_categorical,
        linear_regression,
        logistic_regression,
        two_observed,
        with_potential,
    )
}


def example_models() -> dict[str, Callable[[np.random.Generator], pm.Model]]:
    """Builders of small models (N = 40 records), by name, each taking a numpy Generator.

    They cover what the record model must handle: conjugate exponential families
    (Gamma–Exponential, Beta–Bernoulli, Dirichlet–Categorical), linear regression with unknown
    noise, logistic regression with covariates in ``pm.Data``, two observed variables per record
    and a ``pm.Potential`` on the parameters.
    """
    return dict(EXAMPLE_MODELS)


def gamma_exponential_data(rng: np.random.Generator) -> pm.Model:
    """Gamma–Exponential with its observations in ``pm.Data``: the conformance suite's default.

    Its records are distinctive float64 values (they serve as the leak check's sentinels), it
    can be simulated from (TARP), and holding the observations in ``pm.Data`` lets the suite put
    a NaN into them to check that bad data are refused before any budget is spent.
    """
    with pm.Model(coords={"obs": range(N)}) as model:
        y = pm.Data("y_data", rng.exponential(0.8, N), dims="obs")
        rate = pm.Gamma("rate", 2.0, 2.0)
        pm.Exponential("y", lam=rate, observed=y, dims="obs")
    return model
