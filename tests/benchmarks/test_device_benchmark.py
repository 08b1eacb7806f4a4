"""DP-SGD's per-example gradients on the CPU against a GPU, for batches of 10³ to 10⁶ records.

Run with ``pytest tests/benchmarks/test_device_benchmark.py -m benchmark -s`` where JAX sees a
GPU; without one the test is skipped.  The work is what one NA-DPVI step does with a batch: each
record's gradient of the mean-field ELBO loss (:meth:`RecordModel.elbo_loss_grads`, M = 10 Monte
Carlo draws), clipped to norm C and summed.  The model is a logistic regression with 10
covariates and an intercept (22 variational parameters).  The same jitted function runs on
the same arrays placed on either device; throughput is records per second, best of five calls
after a warm-up.
"""

from __future__ import annotations

import time

import jax
import jax.numpy as jnp
import numpy as np
import pandas as pd
import pymc as pm
import pytest

from dpppl.model.record_model import RecordModel
from dpppl.model.record_structure import find_records
from dpppl.privacy.noise import clip_rows

pytestmark = pytest.mark.benchmark

BATCHES = (1_000, 10_000, 100_000, 1_000_000)
MC_DRAWS = 10


def gpu_or_skip() -> jax.Device:
    try:
        return jax.devices("gpu")[0]
    except RuntimeError:
        pytest.skip("JAX sees no GPU here")


def logistic_model(n_records: int, n_features: int = 10, seed: int = 0) -> pm.Model:
    rng = np.random.default_rng(seed)
    x = rng.normal(size=(n_records, n_features))
    y = rng.binomial(1, 1 / (1 + np.exp(-x @ rng.normal(size=n_features))))
    with pm.Model(coords={"obs": range(n_records)}) as model:
        X = pm.Data("X", x, dims=("obs", "feature"))
        w = pm.Normal("w", 0, 1, shape=n_features)
        b = pm.Normal("b", 0, 1)
        pm.Bernoulli("y", logit_p=X @ w + b, observed=y, dims="obs")
    return model


def records_per_second(fn, args, batch: int) -> float:
    jax.block_until_ready(fn(*args))
    times = []
    for _ in range(5):
        start = time.perf_counter()
        jax.block_until_ready(fn(*args))
        times.append(time.perf_counter() - start)
    return batch / min(times)


def test_per_example_gradients_on_the_gpu_against_the_cpu(capsys):
    gpu = gpu_or_skip()
    cpu = jax.devices("cpu")[0]
    rows = []
    for batch in BATCHES:
        model = logistic_model(batch)
        compiled = RecordModel(model, find_records(model))
        n = compiled.n_params

        @jax.jit
        def clipped_sum(phi, data, eps, compiled=compiled, batch=batch):
            grads = compiled.elbo_loss_grads(phi, data, eps, batch)
            return jnp.sum(clip_rows(grads, 1.0), axis=0)

        phi = jnp.concatenate([jnp.zeros(n), jnp.full(n, -1.0)])
        eps = jax.random.normal(jax.random.key(0), (MC_DRAWS, n))
        speeds, sums = {}, {}
        for name, device in (("cpu", cpu), ("gpu", gpu)):
            args = jax.device_put((phi, compiled.data(), eps), device)
            speeds[name] = records_per_second(clipped_sum, args, batch)
            sums[name] = np.asarray(clipped_sum(*args))
        np.testing.assert_allclose(sums["gpu"], sums["cpu"], rtol=1e-9, atol=1e-9)
        rows.append({"N": batch, "CPU records/s": speeds["cpu"], "GPU records/s": speeds["gpu"],
                     "GPU / CPU": speeds["gpu"] / speeds["cpu"]})
    table = pd.DataFrame(rows)
    with capsys.disabled():
        print(f"\nper-example clipped ELBO gradients, logistic regression, d = {2 * n}, "
              f"M = {MC_DRAWS}; CPU: {cpu.device_kind}, GPU: {gpu.device_kind}")
        print(table.to_string(index=False, float_format=lambda v: f"{v:,.2f}"))
    # The largest batch is where a GPU must pay for its launches.
    assert table["GPU / CPU"].iloc[-1] > 1
