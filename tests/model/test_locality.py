"""Forward mode over a batch is used only where each row provably reads its own record."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pymc as pm
import pytensor.tensor as pt
import pytest

from dpppl.model.locality import is_record_local
from dpppl.model.record_model import FORWARD_MODE_MAX_PARAMS, per_example_grad, record_model

N = 30


def _abstract(*args):
    return jax.tree.map(lambda x: jax.ShapeDtypeStruct(jnp.shape(x), jnp.result_type(x)), args)


def _elbo_is_local(model) -> bool:
    compiled = record_model(model)
    n = compiled.n_params
    data = {k: jnp.asarray(v) for k, v in compiled.data().items()}
    args = _abstract(jnp.zeros(2 * n), data, jnp.ones((4, n)), N)
    return is_record_local(jax.jacfwd(compiled.elbo_loss), args, [False, True, False, False])


def _regression(transform):
    rng = np.random.default_rng(0)
    x_values = rng.normal(size=N)
    with pm.Model(coords={"obs": range(N)}) as model:
        x = pm.Data("x", x_values, dims="obs")
        w = pm.Normal("w")
        b = pm.Normal("b")
        pm.Normal("y", mu=b + w * transform(x), sigma=1.0, observed=x_values + 1, dims="obs")
    return model


def test_the_example_models_are_proved_record_local(any_model):
    assert _elbo_is_local(any_model)


def test_parameters_picked_by_a_record_index_stay_local():
    rng = np.random.default_rng(1)
    group = rng.integers(0, 4, N)
    with pm.Model(coords={"obs": range(N), "group": range(4)}) as model:
        g = pm.Data("g", group, dims="obs")
        effect = pm.Normal("effect", dims="group")
        pm.Normal("y", mu=effect[g], sigma=1.0, observed=rng.normal(size=N), dims="obs")
    assert _elbo_is_local(model)


@pytest.mark.parametrize(
    "transform",
    [
        lambda x: x - x.mean(),
        lambda x: x / x.max(),
        lambda x: pt.cumsum(x),
        lambda x: pt.sort(x),
        lambda x: x[::-1],
    ],
    ids=["centred by the batch mean", "scaled by the batch max", "cumulative sum", "sorted",
         "reversed"],
)
def test_computations_that_mix_records_are_not_proved_local(transform):
    assert not _elbo_is_local(_regression(transform))


def _rows(model, batch_size=N):
    compiled = record_model(model)
    n = compiled.n_params
    data = {k: jnp.asarray(v)[:batch_size] for k, v in compiled.data().items()}
    phi = jnp.asarray(np.random.default_rng(2).normal(size=2 * n))
    eps = jnp.asarray(np.random.default_rng(3).normal(size=(4, n)))
    return compiled, data, phi, eps


def test_forward_mode_rows_equal_the_gradients_of_each_record_alone(regression_model):
    compiled, data, phi, eps = _rows(regression_model)
    assert 2 * compiled.n_params <= FORWARD_MODE_MAX_PARAMS
    rows = jax.jit(per_example_grad(compiled.elbo_loss, n_args=2))(phi, data, eps, N)
    for i in (0, 7, N - 1):
        alone = {k: v[i : i + 1] for k, v in data.items()}
        expected = jax.grad(lambda p, alone=alone: compiled.elbo_loss(p, alone, eps, N)[0])(phi)
        np.testing.assert_allclose(rows[i], expected, rtol=1e-10, atol=1e-12)


def test_a_model_that_mixes_records_still_gets_rows_that_read_one_record_each():
    """The centred covariate mixes the batch, so the batch path is refused: changing record 0
    changes row 0 only."""
    compiled, data, phi, eps = _rows(_regression(lambda x: x - x.mean()))
    grads = jax.jit(per_example_grad(compiled.elbo_loss, n_args=2))
    before = grads(phi, data, eps, N)
    changed = {k: v.at[0].add(5.0) for k, v in data.items()}
    after = grads(phi, changed, eps, N)
    assert not np.allclose(before[0], after[0])
    np.testing.assert_array_equal(before[1:], after[1:])
