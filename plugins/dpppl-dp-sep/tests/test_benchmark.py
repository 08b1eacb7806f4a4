"""Time per pass over the data against the number of records N and the parameter dimension d.

Run with ``pytest plugins/dpppl-dp-sep -m benchmark -s``; prints a table.  The model is logistic
regression on d − 1 features plus an intercept (d parameters), with the mechanism's defaults:
one record per step (a pass is N steps), full covariance and the spherical rule (2d nodes) up to
d = 64, diagonal covariance and 32 Monte Carlo nodes above.  Compilation is excluded (a first
run compiles; the timed runs reuse it).
"""

from __future__ import annotations

import time

import jax
import numpy as np
import pymc as pm
import pytest

import dpppl
from dpppl.plugin import Progress
from dpppl_dp_sep import DPSEP, run_sep

pytestmark = pytest.mark.benchmark

SIZES = [(1_000, 4), (4_000, 4), (16_000, 4), (4_000, 16), (4_000, 64), (4_000, 256)]
PASSES = 2


def logistic(n_records: int, d: int) -> pm.Model:
    rng = np.random.default_rng(0)
    x = rng.normal(size=(n_records, d - 1))
    y = (rng.random(n_records) < 1 / (1 + np.exp(-x @ rng.normal(size=d - 1) / np.sqrt(d)))).astype(int)
    with pm.Model() as model:
        features = pm.Data("x", x)
        w = pm.Normal("w", 0, 1, shape=d - 1)
        b = pm.Normal("b", 0, 1)
        pm.Bernoulli("y", logit_p=features @ w + b, observed=y)
    return model


def seconds_per_pass(n_records: int, d: int) -> tuple[float, str]:
    compiled = dpppl.record_model(logistic(n_records, d))
    mechanism = DPSEP(passes=PASSES)
    settings = mechanism.engine_settings(compiled, noise_std=1e-3)
    data = compiled.data()
    run_sep(compiled, data, settings, key=jax.random.key(0), progress=Progress(False))
    start = time.perf_counter()
    run_sep(compiled, data, settings, key=jax.random.key(1), progress=Progress(False))
    label = f"{settings.covariance}, {settings.nodes.name} ({settings.nodes.n_nodes(d)} nodes)"
    return (time.perf_counter() - start) / PASSES, label


def test_time_per_pass_grows_linearly_in_n():
    rows = [(n, d, *seconds_per_pass(n, d)) for n, d in SIZES]
    print(f"\n{'N':>7} {'d':>5} {'s / pass':>10} {'us / record':>12}  family, nodes")
    for n, d, seconds, label in rows:
        print(f"{n:>7} {d:>5} {seconds:>10.3f} {1e6 * seconds / n:>12.1f}  {label}")
    by_n = {n: s for n, d, s, _ in rows if d == 4}
    # Cost per record does not grow with N (one record per step, O(1) sampling).  A pass over
    # 1000 records takes a few hundredths of a second, too short to time on a shared machine,
    # so the comparison is between the two longer passes.
    assert by_n[16_000] / 16_000 < 2 * by_n[4_000] / 4_000
