"""Speed of SWAG collection next to plain SGD epochs, and of a whole SWAG-PPM fit.

Run with ``pytest plugins/dpppl-swag-ppm -m benchmark -s``; prints a table.  The model has the
shape of the UCI Adult logistic regression (N = 30,000 records, 90 features), on synthetic data.
"""

from __future__ import annotations

import time

import jax
import jax.numpy as jnp
import numpy as np
import pymc as pm
import pytest

import dpppl
from dpppl.plugin import Progress
from dpppl_swag_ppm.batches import neutralise, to_device
from dpppl_swag_ppm.mechanism import SwagPPM
from dpppl_swag_ppm.sgd import SwagTrainer

pytestmark = pytest.mark.benchmark

N_RECORDS, N_FEATURES, EPOCHS, REPEATS = 30_000, 90, 20, 3


@pytest.fixture(scope="module")
def adult_shaped():
    rng = np.random.default_rng(0)
    x = (rng.random((N_RECORDS, N_FEATURES)) < 0.2).astype(float)
    logits = x @ rng.normal(size=N_FEATURES) - 1
    y = (rng.random(N_RECORDS) < 1 / (1 + np.exp(-logits))).astype(int)
    with pm.Model(coords={"obs": range(N_RECORDS), "feature": range(N_FEATURES)}) as model:
        features = pm.Data("x", x, dims=("obs", "feature"))
        w = pm.Normal("w", 0, 1, dims="feature")
        b = pm.Normal("b", 0, 2)
        pm.Bernoulli("y", logit_p=features @ w + b, observed=y, dims="obs")
    return model


def seconds_per_epoch(trainer, data, weights, precond, collect):
    """Best of ``REPEATS`` runs of ``EPOCHS`` compiled SGD epochs, per epoch."""
    theta = jnp.zeros(precond.shape[0])
    keys = jax.random.split(jax.random.key(0), (REPEATS + 1, EPOCHS))

    def run(epoch_keys):
        return trainer.sgd_epochs(data, weights, theta, precond, epoch_keys, collect=collect)

    jax.block_until_ready(run(keys[0]))  # compiles
    best = np.inf
    for repeat_keys in keys[1:]:
        start = time.perf_counter()
        jax.block_until_ready(run(repeat_keys))
        best = min(best, (time.perf_counter() - start) / EPOCHS)
    return best


def trainer_for(model, **options):
    return SwagTrainer(model, SwagPPM(**options).schedule(model.n_records, model.n_params))


def test_swag_collection_costs_at_most_half_a_plain_sgd_epoch_more(adult_shaped):
    """Plain SGD: one learning rate for every coordinate, nothing collected.  SWAG: the rule's
    dense preconditioner and a collection per epoch (or per step)."""
    model = dpppl.record_model(adult_shaped)
    weights = jnp.ones(model.n_records)
    data = neutralise(to_device(model.data()), weights)
    p = model.n_params
    plain = seconds_per_epoch(
        trainer_for(model, preconditioner="diagonal"), data, weights, jnp.full(p, 1e-4), False
    )
    dense = jnp.eye(p) * 1e-4
    preconditioned = seconds_per_epoch(trainer_for(model), data, weights, dense, False)
    rows = [("plain SGD", plain), ("preconditioned SGD, not collected", preconditioned)]
    for label, every in [("SWAG, collected per epoch", None), ("SWAG, collected per step", 1)]:
        trainer = trainer_for(model, collect_every=every)
        rows.append((label, seconds_per_epoch(trainer, data, weights, dense, True)))
    print(f"\n{'epoch of':<36}{'time':>10}{'vs plain SGD':>14}")
    for label, seconds in rows:
        print(f"{label:<36}{seconds * 1e3:>7.2f} ms{seconds / plain:>14.2f}")
    assert rows[2][1] / plain <= 1.5


def test_whole_swag_ppm_fit_time(adult_shaped):
    model = dpppl.record_model(adult_shaped)
    mechanism = SwagPPM()
    plan = mechanism.plan(n_records=N_RECORDS, epsilon=4.0, delta=1e-5, accountant=None)
    timings = []
    for seed in (0, 1):  # the first includes compilation
        start = time.perf_counter()
        release = mechanism.fit(
            model, model.data(), plan, seed=np.random.SeedSequence(seed), progress=Progress(False)
        )
        timings.append(time.perf_counter() - start)
    print(
        f"\nwhole SWAG-PPM fit (N={N_RECORDS}, P={model.n_params}, defaults, epsilon=4): "
        f"{timings[0]:.1f} s with compilation, {timings[1]:.1f} s without; "
        f"achieved epsilon {release.privacy['epsilon']:.3f}"
    )
    assert release.privacy["epsilon"] <= 4.0
