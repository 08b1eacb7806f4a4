"""Per-example gradient throughput of the compiled record model, beside PyMC's own gradient.

Run with ``pytest tests/benchmarks -m benchmark -s``.  For each model and batch size B, both
sides compute the gradient of every record's log-likelihood with respect to the unconstrained
parameters:

* dpppl: ``jax.jit(jax.vmap(jax.grad(...)))`` over the record model's per-record log-likelihood
  (one call for the whole batch);
* baseline: PyMC's own compiled gradient on the same model and batch — the Jacobian of
  ``model.logp(sum=False)`` with respect to the value variables (``pytensor.gradient.jacobian``,
  vectorised), compiled by ``model.compile_fn`` with PyTensor's default backend (Numba).

Throughput is records per second, best of several repeats after a warm-up; compile time is the
first call's wall time minus a warm call's.
"""

from __future__ import annotations

import time

import jax
import jax.numpy as jnp
import numpy as np
import pymc as pm
import pytensor.gradient
import pytest

from dpppl.model.record_model import RecordModel, per_example_grad
from dpppl.model.record_structure import find_records

BATCHES = (100, 1000)


def logistic_model(n_records: int, n_features: int, seed: int = 0) -> pm.Model:
    rng = np.random.default_rng(seed)
    x = rng.normal(size=(n_records, n_features))
    y = rng.binomial(1, 1 / (1 + np.exp(-x @ rng.normal(size=n_features))))
    with pm.Model(coords={"obs": range(n_records), "feature": range(n_features)}) as model:
        X = pm.Data("X", x, dims=("obs", "feature"))
        Y = pm.Data("Y", y, dims="obs")
        w = pm.Normal("w", 0, 1, dims="feature")
        pm.Bernoulli("y", logit_p=X @ w, observed=Y, dims="obs")
    return model


def regression_model(n_records: int, n_features: int, seed: int = 0) -> pm.Model:
    rng = np.random.default_rng(seed)
    x = rng.normal(size=(n_records, n_features))
    with pm.Model(coords={"obs": range(n_records), "feature": range(n_features)}) as model:
        X = pm.Data("X", x, dims=("obs", "feature"))
        Y = pm.Data("Y", x.sum(axis=1) + rng.normal(size=n_records), dims="obs")
        w = pm.Normal("w", 0, 1, dims="feature")
        sigma = pm.HalfNormal("sigma", 1)
        pm.Normal("y", X @ w, sigma, observed=Y, dims="obs")
    return model


def best_time(fn, repeats: int = 5) -> float:
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return min(times)


def dpppl_side(builder, batch):
    model = builder(batch, 10)
    start = time.perf_counter()
    compiled = RecordModel(model, find_records(model))
    grads = jax.jit(per_example_grad(compiled.loglik))
    theta = jnp.asarray(compiled.initial_point())
    data = {k: jnp.asarray(v) for k, v in compiled.data().items()}
    grads(theta, data).block_until_ready()
    first = time.perf_counter() - start
    seconds = best_time(lambda: grads(theta, data).block_until_ready())
    return first - seconds, batch / seconds


def pymc_side(builder, batch):
    model = builder(batch, 10)
    start = time.perf_counter()
    (loglik,) = model.logp(vars=model.observed_RVs, sum=False)
    jacobians = pytensor.gradient.jacobian(loglik, model.value_vars, vectorize=True)
    grads = model.compile_fn(jacobians, point_fn=True)
    point = model.initial_point()
    grads(point)
    first = time.perf_counter() - start
    seconds = best_time(lambda: grads(point))
    return first - seconds, batch / seconds


@pytest.mark.benchmark
def test_per_example_gradient_throughput_against_pymc(capsys):
    rows = []
    for name, builder in (("logistic, 10 features", logistic_model),
                          ("linear + sigma, 10 features", regression_model)):
        for batch in BATCHES:
            compile_ours, ours = dpppl_side(builder, batch)
            compile_pymc, theirs = pymc_side(builder, batch)
            rows.append((name, batch, ours, theirs, ours / theirs, compile_ours, compile_pymc))
    with capsys.disabled():
        print()
        print(f"{'model':30} {'B':>6} {'dpppl rec/s':>12} {'PyMC rec/s':>11} {'ratio':>7} "
              f"{'compile dpppl s':>16} {'compile PyMC s':>15}")
        for name, batch, ours, theirs, ratio, c_ours, c_pymc in rows:
            print(f"{name:30} {batch:6d} {ours:12.0f} {theirs:11.0f} {ratio:7.1f} "
                  f"{c_ours:16.2f} {c_pymc:15.2f}")
    # Vectorised per-example gradients must beat a per-record loop at the larger batch.
    assert all(ratio > 1 for _, batch, _, _, ratio, _, _ in rows if batch == max(BATCHES))
