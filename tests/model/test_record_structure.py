"""Finding the records of a model, and refusing models without per-record structure."""

from __future__ import annotations

import numpy as np
import pymc as pm
import pytensor.tensor as pt
import pytest

from dpppl import InvalidDataError, ModelNotSupportedError
from dpppl.model.record_model import record_model
from dpppl.model.record_structure import find_records


def test_records_are_the_observed_values_and_the_data_they_depend_on(regression_model):
    structure = find_records(regression_model)
    assert structure.dim == "obs"
    assert structure.n_records == 40
    assert structure.names == ("X", "y")


def test_records_can_be_named_explicitly(regression_model):
    assert find_records(regression_model, records="obs").names == ("X", "y")


def test_a_named_record_dimension_must_exist(regression_model):
    with pytest.raises(ModelNotSupportedError, match=r"records='rows' is not a dimension.*'obs'"):
        find_records(regression_model, records="rows")


def test_covariates_given_as_numpy_arrays_are_found():
    x = np.arange(10.0)
    with pm.Model() as model:
        b = pm.Normal("b")
        pm.Normal("y", b * x, 1, observed=x)
    structure = find_records(model)
    assert structure.names == ("covariate_0", "y")
    assert structure.n_records == 10


def test_a_model_without_observed_variables_is_refused():
    with pm.Model() as model:
        pm.Normal("x")
    with pytest.raises(ModelNotSupportedError, match="no observed variable.*observed="):
        find_records(model)


def test_observed_variables_must_agree_on_the_records():
    with pm.Model(coords={"obs": range(5), "group": range(3)}) as model:
        mu = pm.Normal("mu")
        pm.Normal("y", mu, 1, observed=np.zeros(5), dims="obs")
        pm.Normal("z", mu, 1, observed=np.zeros(3), dims="group")
    with pytest.raises(ModelNotSupportedError, match="disagree on the record dimension.*records="):
        find_records(model)


def test_a_likelihood_over_all_records_at_once_is_refused():
    with pm.Model() as model:
        mu = pm.Normal("mu", shape=4)
        pm.MvNormal("y", mu, np.eye(4), observed=np.zeros(4))
    with pytest.raises(ModelNotSupportedError, match="no per-record axis"):
        find_records(model)


def test_discrete_free_variables_are_refused_with_a_way_out():
    with pm.Model() as model:
        k = pm.Categorical("k", p=[0.5, 0.5])
        pm.Normal("y", pt.switch(pt.eq(k, 0), -1.0, 1.0), 1, observed=np.zeros(6))
    with pytest.raises(ModelNotSupportedError, match="'k' is discrete.*pm.NormalMixture"):
        find_records(model)


def test_per_record_latent_variables_are_refused():
    with pm.Model(coords={"obs": range(6)}) as model:
        z = pm.Normal("z", dims="obs")
        pm.Normal("y", z, 1, observed=np.zeros(6), dims="obs")
    with pytest.raises(ModelNotSupportedError, match="'z' has the record dimension 'obs'"):
        find_records(model)


def test_per_record_latent_variables_without_dims_are_refused():
    from dpppl.model.record_model import record_model

    with pm.Model() as model:
        z = pm.Normal("z", shape=6)
        pm.Normal("y", z, 1, observed=np.zeros(6))
    with pytest.raises(ModelNotSupportedError, match=r"does not factorise.*\['z'\]"):
        record_model(model)


def test_a_constant_of_the_datas_length_is_named_as_the_cause():
    """A reference-class column written pt.zeros((N, 1)) keeps N rows whatever the batch; the
    refusal says so, and how to make it follow the records, rather than blaming a potential
    the model does not have."""
    n = 6
    with pm.Model(coords={"cls": range(2)}) as model:
        X = pm.Data("X", np.linspace(-1.0, 1.0, n))
        b = pm.Normal("b", 0, 1, dims="cls")
        eta = pt.concatenate([pt.zeros((n, 1)), b + X[:, None]], axis=1)
        pm.Categorical("y", p=pm.math.softmax(eta, axis=1), observed=np.zeros(n, dtype=int))
    with pytest.raises(ModelNotSupportedError) as refusal:
        record_model(model)
    message = str(refusal.value)
    assert "N = 6 whatever the batch" in message and "pt.zeros_like(X[:, :1])" in message
    assert "Potential" not in message


def test_a_potential_over_all_records_is_refused():
    x = np.ones(5)
    with pm.Model() as model:
        X = pm.Data("X", x)
        mu = pm.Normal("mu")
        pm.Normal("y", mu, 1, observed=X)
        pm.Potential("total", -((X - mu) ** 2).sum())
    with pytest.raises(ModelNotSupportedError, match="Potential 'total'.*per-record axis"):
        find_records(model)


@pytest.mark.parametrize("aggregate", [
    lambda mu, X: (mu * X.sum())[None],
    lambda mu, X: (-((X - mu) ** 2).sum()).reshape((1,)),
])
def test_a_length_one_potential_over_all_records_is_refused(aggregate):
    """A (1,)-shaped aggregate broadcasts against a batch of any size, so the record-axis probe
    of the summed log-likelihood took it for a per-record term, and the model fitted was silently
    another one."""
    with pm.Model(coords={"obs": range(5)}) as model:
        X = pm.Data("X", np.linspace(0.0, 1.0, 5), dims="obs")
        mu = pm.Normal("mu", 0, 1)
        pm.Normal("y", mu * X, 1, observed=np.zeros(5), dims="obs")
        pm.Potential("agg", aggregate(mu, X))
    with pytest.raises(ModelNotSupportedError, match=r"'agg'.*gave \(1,\) instead of shape \(3,\).*pm.Potential"):
        record_model(model)


def test_a_per_record_potential_is_part_of_the_likelihood():
    with pm.Model(coords={"obs": range(5)}) as model:
        X = pm.Data("X", np.linspace(0.0, 1.0, 5), dims="obs")
        mu = pm.Normal("mu", 0, 1)
        pm.Normal("y", mu * X, 1, observed=np.zeros(5), dims="obs")
        pm.Potential("penalty", -((X - mu) ** 2))
    compiled = record_model(model)
    theta = np.array([0.3])
    batch = {name: value[:3] for name, value in compiled.data().items()}
    x = np.linspace(0.0, 1.0, 5)[:3]
    expected = -0.5 * (0.3 * x) ** 2 - 0.5 * np.log(2 * np.pi) - (x - 0.3) ** 2
    np.testing.assert_allclose(np.asarray(compiled.loglik(theta, batch)), expected)


@pytest.mark.parametrize("bad", [np.nan, np.inf])
def test_nan_or_infinite_data_are_refused_without_saying_which_record(bad):
    # pm.Data refuses NaN itself; a covariate given as a numpy array is checked by dpppl.
    x = np.arange(8.0)
    x[3] = bad
    with pm.Model() as model:
        b = pm.Normal("b")
        pm.Normal("y", b * x, 1, observed=np.zeros(8))
    with pytest.raises(InvalidDataError, match="'covariate_0' contain NaN or infinite") as error:
        find_records(model)
    assert "3" not in str(error.value)


def test_missing_observations_are_refused_instead_of_imputed():
    y = np.array([0.1, np.nan, 0.3, 0.2])
    with pytest.warns(Warning):
        with pm.Model() as model:
            mu = pm.Normal("mu")
            pm.Normal("y", mu, 1, observed=y)
    with pytest.raises(InvalidDataError, match="'y' has missing values"):
        find_records(model)


def test_an_empty_data_set_is_refused():
    with pm.Model() as model:
        mu = pm.Normal("mu")
        pm.Normal("y", mu, 1, observed=pm.Data("Y", np.zeros(0)), shape=(0,))
    with pytest.raises((InvalidDataError, ModelNotSupportedError), match="no records|no per-record"):
        find_records(model)


@pytest.mark.parametrize("likelihood", ["bernoulli", "categorical"])
def test_observations_outside_a_finite_support_are_refused_without_saying_which(likelihood):
    y = np.zeros(8, dtype=int)
    y[5] = 3
    with pm.Model() as model:
        if likelihood == "bernoulli":
            pm.Bernoulli("y", p=pm.Beta("p", 1, 1), observed=y)
        else:
            pm.Categorical("y", p=pm.Dirichlet("p", np.ones(3)), observed=y)
    with pytest.raises(InvalidDataError, match="'y' holds values .* probability 0") as error:
        find_records(model)
    assert "5" not in str(error.value) and "3 " not in str(error.value)


def _counts_model(likelihood: str, y) -> pm.Model:
    with pm.Model() as model:
        p = pm.Beta("p", 2, 2)
        values = pm.Data("y_data", y)
        if likelihood == "poisson":
            pm.Poisson("y", pm.Gamma("rate", 2, 1), observed=values)
        elif likelihood == "binomial":
            pm.Binomial("y", n=pm.Data("trials", np.full(len(y), 5)), p=p, observed=values)
        elif likelihood == "geometric":
            pm.Geometric("y", p=p, observed=values)
        elif likelihood == "discrete uniform":
            pm.DiscreteUniform("y", 0, 4, observed=values)
        elif likelihood == "exponential":
            pm.Exponential("y", pm.Gamma("rate", 2, 1), observed=values)
        else:
            pm.Beta("y", p * 4, 2, observed=values)
    return model


# Each likelihood with two data sets that hold an observation it gives probability 0 whatever the
# parameters (different values at different records), and one with observations on the edges of
# what it allows.
OUTSIDE_SUPPORT = {
    "poisson": ([0.0, 3.0, -1.0], [-7.0, 3.0, 0.0], [0.0, 7.0]),
    # 5 trials per record, from pm.Data (a covariate, so the message must not show it either)
    "binomial": ([0.0, 6.0, 2.0], [9.0, 1.0, 2.0], [0.0, 5.0]),
    "geometric": ([1.0, 0.0], [-3.0, 2.0], [1.0, 9.0]),
    "discrete uniform": ([0.0, 5.0], [-1.0, 2.0], [0.0, 4.0]),
    "exponential": ([0.5, -0.1], [-2.0, 1.0], [0.0, 3.0]),
    "beta": ([0.5, 1.2], [-0.5, 0.5], [0.0, 1.0]),
}


@pytest.mark.parametrize("likelihood", OUTSIDE_SUPPORT)
def test_observations_no_parameter_makes_possible_are_refused_without_saying_which(likelihood):
    *outside, edges = OUTSIDE_SUPPORT[likelihood]
    messages = set()
    for y in outside:
        with pytest.raises(InvalidDataError, match="'y' holds values .* probability 0") as error:
            find_records(_counts_model(likelihood, np.array(y)))
        messages.add(str(error.value))
    # The message comes from the model alone: the same whichever value, at whichever record.
    assert len(messages) == 1
    find_records(_counts_model(likelihood, np.array(edges)))


def test_counts_that_are_not_whole_numbers_are_refused_before_pymc_rounds_them():
    # PyMC casts a float pm.Data to the Poisson's integers, which would make 2.5 a 2.
    with pytest.raises(InvalidDataError, match="not whole numbers"):
        find_records(_counts_model("poisson", np.array([1.0, 2.5])))
