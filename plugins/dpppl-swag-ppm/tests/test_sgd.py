"""SGD under the learning-rate rule: SWAG's moments approach the exact posterior's on a conjugate
linear-Gaussian model."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pymc as pm
import pytest

import dpppl
from dpppl_swag_ppm.batches import to_device
from dpppl_swag_ppm.mechanism import SwagPPM
from dpppl_swag_ppm.sgd import SwagTrainer
from dpppl_swag_ppm.swag import swag_variance

NOISE_SD, PRIOR_SD = 1.0, 1.0


def conjugate(correlated: bool, n_records: int = 2000):
    """y ~ N(X β, 1), β ~ N(0, I): the model and its exact posterior mean and covariance."""
    rng = np.random.default_rng(7)
    x = rng.normal(size=(n_records, 3))
    if correlated:  # a posterior correlation of about -0.9, and an off-centre column
        x[:, 1] = 0.9 * x[:, 0] + 0.44 * x[:, 1]
        x[:, 2] += 2.0
    y = x @ np.array([0.5, -1.0, 2.0]) + NOISE_SD * rng.normal(size=n_records)
    with pm.Model(coords={"obs": range(n_records), "feature": range(3)}) as model:
        features = pm.Data("x", x, dims=("obs", "feature"))
        beta = pm.Normal("beta", 0, PRIOR_SD, dims="feature")
        pm.Normal("y", features @ beta, NOISE_SD, observed=y, dims="obs")
    precision = x.T @ x / NOISE_SD**2 + np.eye(3) / PRIOR_SD**2
    covariance = np.linalg.inv(precision)
    return model, covariance @ x.T @ y / NOISE_SD**2, covariance


def swag_moments(model, swag_epochs: int, preconditioner: str = "auto"):
    compiled = dpppl.record_model(model)
    mechanism = SwagPPM(swag_epochs=swag_epochs, preconditioner=preconditioner)
    trainer = SwagTrainer(compiled, mechanism.schedule(compiled.n_records, compiled.n_params))
    state = trainer.fit(
        to_device(compiled.data()),
        jnp.ones(compiled.n_records),
        compiled.initial_point(),
        jax.random.key(0),
    )
    return np.asarray(state.mean), np.asarray(swag_variance(state))


def errors(moments, mean, covariance):
    """Largest error of the mean in posterior sds, and of the variance relative to the exact."""
    swag_mean, swag_var = moments
    sd = np.sqrt(np.diag(covariance))
    return np.max(np.abs(swag_mean - mean) / sd), np.max(np.abs(swag_var / sd**2 - 1))


@pytest.fixture(scope="module")
def correlated():
    return conjugate(correlated=True)


def test_swag_moments_approach_the_exact_posterior_as_iterates_grow(correlated):
    model, mean, covariance = correlated
    few = errors(swag_moments(model, swag_epochs=10), mean, covariance)
    many = errors(swag_moments(model, swag_epochs=400), mean, covariance)
    assert many[0] < few[0] and many[1] < few[1]
    # 400 nearly independent iterates: mean to within 0.15 sd, variance to within 20 %.
    assert many[0] < 0.15
    assert many[1] < 0.2


def test_diagonal_preconditioner_gets_the_variances_of_an_uncorrelated_posterior():
    model, mean, covariance = conjugate(correlated=False)
    mean_error, variance_error = errors(
        swag_moments(model, swag_epochs=400, preconditioner="diagonal"), mean, covariance
    )
    assert mean_error < 0.15
    assert variance_error < 0.2
