"""The compiled record model agrees with PyMC itself on every kind of model it accepts."""

from __future__ import annotations

import gc
import hashlib
import weakref

import jax
import jax.numpy as jnp
import numpy as np
import pymc as pm
import pytest

import dpppl
import dpppl.model.record_model as record_model_module
from dpppl.model.record_model import (
    compiled_models,
    per_example_grad,
    record_model,
    softplus_inverse,
)


def _point(model, theta):
    """θ as PyMC's dict of value-variable arrays."""
    compiled = record_model(model)
    return {
        block.value_name: np.asarray(value)
        for block, value in zip(compiled.parameters.blocks, compiled.parameters.unflatten(theta))
    }


def _theta(model, seed=0):
    compiled = record_model(model)
    rng = np.random.default_rng(seed)
    return jnp.asarray(compiled.initial_point() + 0.3 * rng.normal(size=compiled.n_params))


def test_per_record_loglik_equals_pymc_elementwise_logp(any_model):
    compiled = record_model(any_model)
    theta = _theta(any_model)
    ours = compiled.loglik(theta, compiled.data())
    terms = any_model.logp(vars=any_model.observed_RVs, sum=False)
    terms += [any_model.replace_rvs_by_values([p])[0] for p in compiled.structure.record_potentials]
    theirs = sum(
        np.asarray(v).reshape(compiled.n_records, -1).sum(axis=1)
        for v in any_model.compile_fn(terms, point_fn=True)(_point(any_model, theta))
    )
    assert ours.shape == (compiled.n_records,)
    np.testing.assert_allclose(ours, theirs, rtol=1e-10, atol=1e-10)


def test_log_prior_with_jacobian_equals_pymc(any_model):
    compiled = record_model(any_model)
    theta = _theta(any_model, seed=1)
    prior_terms = any_model.free_RVs + list(compiled.structure.prior_potentials)
    theirs = any_model.compile_fn(any_model.logp(vars=prior_terms, jacobian=True))(
        _point(any_model, theta)
    )
    np.testing.assert_allclose(compiled.logprior(theta), theirs, rtol=1e-10)


def test_log_prior_and_likelihood_add_up_to_the_model_logp(any_model):
    compiled = record_model(any_model)
    theta = _theta(any_model, seed=2)
    theirs = any_model.compile_logp()(_point(any_model, theta))
    np.testing.assert_allclose(compiled.logp(theta, compiled.data()), theirs, rtol=1e-10)


def test_potential_without_data_is_part_of_the_prior(any_model):
    compiled = record_model(any_model)
    names = [p.name for p in compiled.structure.prior_potentials]
    assert names == [p.name for p in any_model.potentials]


def test_constrained_round_trip_is_exact(any_model):
    compiled = record_model(any_model)
    theta = _theta(any_model, seed=3)
    constrained = compiled.constrain(theta)
    recovered = []
    for block, rv in zip(compiled.parameters.blocks, any_model.free_RVs, strict=True):
        transform = any_model.rvs_to_transforms.get(rv)
        value = np.asarray(constrained[block.name])
        if transform is not None:
            value = transform.forward(value, *rv.owner.op.dist_params(rv.owner)).eval()
        recovered.append(np.asarray(value).reshape(-1))
    np.testing.assert_allclose(np.concatenate(recovered), theta, rtol=1e-12, atol=1e-12)


def test_constrained_values_have_model_shapes(any_model):
    compiled = record_model(any_model)
    constrained = compiled.constrain(_theta(any_model))
    for rv in any_model.free_RVs:
        expected = tuple(any_model.initial_point()[any_model.rvs_to_values[rv].name].shape)
        if any_model.rvs_to_transforms.get(rv) is None:
            assert np.shape(constrained[rv.name]) == expected
    assert set(constrained) >= {rv.name for rv in any_model.free_RVs}


def test_elbo_matches_pymc_advi_objective_for_the_same_q(any_model):
    """Σ_i ℓ_i is minus the ELBO; PyMC's ADVI computes the same objective (std = softplus(ρ))."""
    compiled = record_model(any_model)
    n = compiled.n_params
    rng = np.random.default_rng(4)
    mu = compiled.initial_point() + 0.1 * rng.normal(size=n)
    rho = np.full(n, -1.5) + 0.2 * rng.normal(size=n)
    advi = pm.ADVI(model=any_model, random_seed=5)
    advi.approx.shared_params["mu"].set_value(mu)
    advi.approx.shared_params["rho"].set_value(rho)
    draws = 20_000
    theirs = np.mean([advi.objective.score_function(sc_n_mc=draws)() for _ in range(3)])

    std = np.log1p(np.exp(rho))
    phi = jnp.asarray(np.concatenate([mu, softplus_inverse(std**2)]))
    eps = jax.random.normal(jax.random.key(6), (draws, n))
    ours = jnp.sum(compiled.elbo_loss(phi, compiled.data(), eps, compiled.n_records))
    # Both are Monte Carlo estimates of the same number; their errors are independent.
    per_draw = jax.vmap(
        lambda e: jnp.sum(compiled.elbo_loss(phi, compiled.data(), e[None], compiled.n_records))
    )(eps[:2000])
    mc_error = float(jnp.std(per_draw)) / np.sqrt(draws)
    assert abs(float(ours) - theirs) < 5 * mc_error + 1e-6 * abs(theirs)


def test_per_example_gradients_agree_with_finite_differences(any_model):
    compiled = record_model(any_model)
    n = compiled.n_params
    phi = jnp.concatenate([jnp.asarray(compiled.initial_point()), jnp.full(n, -2.0)])
    eps = jax.random.normal(jax.random.key(7), (4, n))
    batch = {k: v[:5] for k, v in compiled.data().items()}
    grads = per_example_grad(compiled.elbo_loss, n_args=2)(phi, batch, eps, compiled.n_records)
    assert grads.shape == (5, 2 * n)
    h = 1e-6
    for j in range(2 * n):
        step = jnp.zeros(2 * n).at[j].set(h)
        numeric = (
            compiled.elbo_loss(phi + step, batch, eps, compiled.n_records)
            - compiled.elbo_loss(phi - step, batch, eps, compiled.n_records)
        ) / (2 * h)
        np.testing.assert_allclose(grads[:, j], numeric, rtol=1e-5, atol=1e-6)


@pytest.fixture
def chain_rule_always(monkeypatch):
    """The chain rule of ``elbo_loss_grads`` on every model, however few its parameters."""
    monkeypatch.setattr(record_model_module, "CHAIN_RULE_MIN_PARAMS", 1)


def test_elbo_loss_grads_are_the_per_record_gradients_of_the_elbo_loss(
    any_model, chain_rule_always
):
    compiled = record_model(any_model)
    n = compiled.n_params
    rng = np.random.default_rng(8)
    phi = jnp.asarray(np.concatenate([compiled.initial_point() + 0.1 * rng.normal(size=n),
                                      rng.normal(-2.0, 0.3, size=n)]))
    eps = jax.random.normal(jax.random.key(9), (6, n))
    batch = {k: v[:7] for k, v in compiled.data().items()}
    ours = jax.jit(compiled.elbo_loss_grads)(phi, batch, eps, compiled.n_records)
    autodiff = per_example_grad(compiled.elbo_loss, n_args=2)(phi, batch, eps, compiled.n_records)
    assert ours.shape == (7, 2 * n)
    np.testing.assert_allclose(ours, autodiff, rtol=1e-10, atol=1e-12)


def test_elbo_loss_grads_row_i_reads_record_i_alone(regression_model, chain_rule_always):
    compiled = record_model(regression_model)
    n = compiled.n_params
    phi = jnp.concatenate([jnp.asarray(compiled.initial_point()), jnp.full(n, -2.0)])
    eps = jax.random.normal(jax.random.key(10), (4, n))
    batch = {k: jnp.asarray(v[:6]) for k, v in compiled.data().items()}
    changed = {k: v.at[3].set(v[3] + 1.0) for k, v in batch.items()}
    before = compiled.elbo_loss_grads(phi, batch, eps, compiled.n_records)
    after = compiled.elbo_loss_grads(phi, changed, eps, compiled.n_records)
    moved = np.any(np.asarray(before != after), axis=1)
    assert moved.tolist() == [False, False, False, True, False, False]


def test_record_data_are_inputs_not_constants(regression_model):
    compiled = record_model(regression_model)
    theta = _theta(regression_model)
    new_x = np.linspace(-1, 1, compiled.n_records)
    new_y = 3 - new_x
    with regression_model:
        pm.set_data({"X": new_x})
    regression_model.rvs_to_values[regression_model["y"]]  # observed numpy stays in the graph
    batch = {"X": new_x, "y": new_y}
    ours = compiled.loglik(theta, batch)
    point = _point(regression_model, theta)
    expected = pm.logp(pm.Normal.dist(point["intercept"] + point["slope"] * new_x,
                                      np.exp(point["sigma_log__"])), new_y).eval()
    np.testing.assert_allclose(ours, expected, rtol=1e-10)
    assert record_model(regression_model).compiled is compiled.compiled  # nothing recompiled


def test_batches_of_any_size_share_one_compilation(regression_model):
    compiled = record_model(regression_model)
    theta = _theta(regression_model)
    fn = jax.jit(compiled.loglik)
    data = compiled.data()
    first = fn(theta, {k: v[:7] for k, v in data.items()})
    second = fn(theta, {k: v[7:14] for k, v in data.items()})
    np.testing.assert_allclose(
        np.concatenate([first, second]), compiled.loglik(theta, data)[:14], rtol=1e-12
    )
    assert fn._cache_size() == 1


def test_weighted_loglik_is_the_weighted_sum(regression_model):
    compiled = record_model(regression_model)
    theta = _theta(regression_model)
    data = compiled.data()
    weights = jnp.linspace(0, 1, compiled.n_records)
    np.testing.assert_allclose(
        compiled.weighted_loglik(theta, data, weights),
        jnp.sum(weights * compiled.loglik(theta, data)),
    )


def test_record_loglik_is_one_entry_of_the_batch(regression_model):
    compiled = record_model(regression_model)
    theta = _theta(regression_model)
    data = compiled.data()
    one = {k: v[3] for k, v in data.items()}
    np.testing.assert_allclose(compiled.record_loglik(theta, one), compiled.loglik(theta, data)[3])


def test_deterministics_that_read_data_stay_out_of_the_posterior():
    rng = np.random.default_rng(0)
    x = rng.normal(size=30)
    with pm.Model() as model:
        a = pm.Normal("a")
        b = pm.Normal("b")
        pm.Deterministic("ab", a * b)
        pm.Deterministic("mean_per_record", a + b * x)
        pm.Normal("y", a + b * x, 1, observed=x + rng.normal(size=30))
    compiled = record_model(model)
    assert compiled.constrained_names == ["a", "b", "ab"]


def _group_model(centred: bool) -> pm.Model:
    rng = np.random.default_rng(0)
    group, x = rng.integers(0, 3, 60), rng.normal(size=60)
    with pm.Model(coords={"group": range(3)}) as model:
        mu_a = pm.Normal("mu_a")
        tau = pm.HalfNormal("tau")
        if centred:
            a = pm.Normal("a", mu_a, tau, dims="group")
        else:
            a = mu_a + tau * pm.Normal("z", dims="group")
        w = pm.Normal("w")
        pm.Normal("y", a[group] + w * x, 1.0, observed=rng.normal(size=60))
    return model


def test_the_parameters_only_the_prior_reads_are_not_record_parameters():
    compiled = record_model(_group_model(centred=True))
    read = dict(zip(compiled.parameters.labels(), compiled.record_parameters, strict=True))
    assert read == {
        "mu_a": False, "tau_log__": False, "a[0]": True, "a[1]": True, "a[2]": True, "w": True
    }


def test_the_records_gradient_is_zero_in_the_parameters_they_do_not_read():
    compiled = record_model(_group_model(centred=True))
    batch = {k: jnp.asarray(v) for k, v in compiled.data().items()}
    scores = per_example_grad(compiled.loglik)(_theta(compiled.model, seed=1), batch)
    assert np.all(np.asarray(scores)[:, ~compiled.record_parameters] == 0)
    assert np.all(np.abs(np.asarray(scores)[:, compiled.record_parameters]).sum(axis=0) > 0)


def test_non_centred_group_effects_are_all_read_by_the_records():
    assert record_model(_group_model(centred=False)).record_parameters.all()


@pytest.mark.parametrize("observed_as", ["numpy", "data"])
def test_numpy_and_pm_data_observations_give_the_same_loglik(observed_as):
    rng = np.random.default_rng(2)
    y = rng.normal(size=25)
    with pm.Model() as model:
        mu = pm.Normal("mu")
        observed = pm.Data("Y", y) if observed_as == "data" else y
        pm.Normal("y", mu, 1, observed=observed, shape=y.shape if observed_as == "data" else None)
    compiled = record_model(model)
    theta = jnp.array([0.4])
    np.testing.assert_allclose(
        compiled.loglik(theta, compiled.data()), pm.logp(pm.Normal.dist(0.4, 1), y).eval()
    )


def test_the_records_read_each_parameter_of_a_centred_hierarchy_apart():
    compiled = record_model(_group_model(centred=True))
    assert compiled.record_parameter_rank == compiled.record_parameters.sum() == 4


def test_a_non_centred_hierarchy_reads_its_offsets_through_fewer_functions_of_them():
    # The records read the 3 intercepts mu_a + tau * z and the slope w: 4 functions of the 6
    # parameters (mu_a, tau, z, w), whatever the data.
    assert record_model(_group_model(centred=False)).record_parameter_rank == 4


def test_a_sum_of_two_parameters_is_one_direction_for_the_records():
    with pm.Model() as model:
        a = pm.Normal("a")
        b = pm.Normal("b")
        pm.Normal("y", a + b, 1.0, observed=np.zeros(10))
    assert record_model(model).record_parameter_rank == 1


def test_a_regression_with_an_unknown_scale_has_full_record_rank():
    rng = np.random.default_rng(4)
    with pm.Model() as model:
        X = pm.Data("X", rng.normal(size=(30, 3)))
        w = pm.Normal("w", shape=3)
        s = pm.HalfNormal("s")
        pm.Normal("y", X @ w, s, observed=rng.normal(size=30))
    assert record_model(model).record_parameter_rank == 4


# -- one compilation per model structure ----------------------------------------------------------


def _beta_bernoulli(y, a=1.0, b=1.0):
    with pm.Model(coords={"obs": range(len(y))}) as model:
        p = pm.Beta("p", a, b)
        pm.Bernoulli("y", p=p, observed=y, dims="obs")
    return model


def test_freshly_built_models_of_one_structure_share_one_compilation():
    """Users rebuild their model for every fit; the data and N are inputs, not structure."""
    rng = np.random.default_rng(0)
    first = record_model(_beta_bernoulli(rng.binomial(1, 0.3, 50)))
    again = record_model(_beta_bernoulli(rng.binomial(1, 0.7, 50)))
    bigger = record_model(_beta_bernoulli(rng.binomial(1, 0.3, 80)))
    assert again is not first
    assert again.compiled is first.compiled and bigger.compiled is first.compiled
    assert (again.n_records, bigger.n_records) == (50, 80)


def test_another_prior_is_another_structure():
    y = np.ones(20, dtype=int)
    assert record_model(_beta_bernoulli(y, 2.0)).compiled is not record_model(
        _beta_bernoulli(y)
    ).compiled


def test_mechanism_caches_are_kept_per_number_of_records():
    """Mechanisms may compile N into what they cache."""
    small = record_model(_beta_bernoulli(np.ones(30, dtype=int)))
    large = record_model(_beta_bernoulli(np.ones(60, dtype=int)))
    small.cached("n", lambda: 30)
    assert large.cached("n", lambda: 60) == 60
    assert record_model(_beta_bernoulli(np.zeros(30, dtype=int))).cached("n", lambda: 0) == 30


def test_set_data_on_data_that_are_not_records_changes_the_function():
    """Non-record pm.Data are compiled in as constants: a new value must not be served stale."""
    with pm.Model() as model:
        scale = pm.Data("scale", 1.0)
        mu = pm.Normal("mu", 0, scale)
        pm.Normal("y", mu, 1, observed=np.zeros(10))
    theta = np.array([1.0])
    before = float(record_model(model).logprior(theta))
    with model:
        pm.set_data({"scale": 2.0})
    after = float(record_model(model).logprior(theta))
    assert after == pytest.approx(before + np.log(0.5) + 0.5 - 0.125)


def test_a_fitted_model_is_freed_when_its_user_drops_it():
    """What mechanisms cache is shared by structure and keeps the RecordModel it was given; that
    must not keep the model, and with it a data set, alive."""
    model = _beta_bernoulli(np.ones(25, dtype=int))
    with model:
        dpppl.sample(mechanism="na-dpvi", epsilon=1.0, delta=1e-3, progressbar=False,
                     steps=100, burn_in=0.0, inference="laplace", chains=1, draws=20)
    alive = weakref.ref(model)
    del model
    gc.collect()
    assert alive() is None


def test_a_record_model_keeps_its_model_alive_unless_asked_not_to():
    held = record_model(_beta_bernoulli(np.ones(25, dtype=int)))
    gc.collect()
    assert held.data()["y"].shape == (25,)
    weak = record_model(_beta_bernoulli(np.ones(25, dtype=int)), hold_model=False)
    gc.collect()
    with pytest.raises(ReferenceError, match="no longer exists"):
        weak.data()


def test_the_process_keeps_a_bounded_number_of_structures(monkeypatch):
    monkeypatch.setattr(compiled_models(), "size", 3)
    y = np.ones(10, dtype=int)
    for a in np.linspace(1.0, 2.0, 6):
        record_model(_beta_bernoulli(y, a))
    assert len(compiled_models()) <= 3


def test_the_structure_key_holds_no_record_value():
    """Keys are compared and kept in memory: the records are inputs, so none of their values (or
    digests of them) may be part of one."""
    y = np.zeros(40, dtype=int)
    y[7] = 1
    compiled = record_model(_beta_bernoulli(y))
    hashed = hashlib.blake2b(digest_size=16)
    hashed.update(f"{y.dtype.str}{y.shape}".encode())
    hashed.update(y.tobytes())
    key = next(k for k, v in compiled_models()._entries.items() if v is compiled.compiled)
    assert hashed.hexdigest() not in repr(key)


def test_the_possible_records_of_binary_and_categorical_observations_come_from_the_model():
    with pm.Model() as model:
        p = pm.Beta("p", 1.0, 1.0)
        weights = pm.Dirichlet("weights", np.ones(3))
        pm.Bernoulli("pair", p=p, observed=np.ones((20, 2), dtype=int))
        pm.Categorical("choice", p=weights, observed=np.zeros(20, dtype=int))
    rows = record_model(model).possible_records(limit=12)
    records = {
        (tuple(pair.tolist()), int(choice))
        for pair, choice in zip(rows["pair"], rows["choice"], strict=True)
    }
    # Every pair of bits with every category, whatever the data hold (all ones, category 0).
    assert len(rows["pair"]) == 12
    assert records == {((a, b), c) for a in (0, 1) for b in (0, 1) for c in range(3)}
    assert rows["pair"].dtype == record_model(model).data()["pair"].dtype
    assert record_model(model).possible_records(limit=11) is None


def test_a_model_with_covariates_or_continuous_observations_has_no_list_of_possible_records(
    regression_model,
):
    assert record_model(regression_model).possible_records(limit=10**6) is None
    x = np.linspace(0.0, 1.0, 20)
    with pm.Model() as logistic:
        b = pm.Normal("b")
        pm.Bernoulli("y", logit_p=b * x, observed=np.zeros(20, dtype=int))
    assert record_model(logistic).possible_records(limit=10**6) is None
