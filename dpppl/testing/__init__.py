"""Helpers for testing dpppl and its plugins: example models, and the conformance suite that
every mechanism and accountant plugin runs in its own tests.

The conformance suite works like scikit-learn's ``check_estimator``::

    from dpppl.testing import check_mechanism, check_accountant

    check_mechanism("my-mechanism", options={"draws": 200})   # raises ConformanceError
    check_accountant("my-accountant")

or one pytest test per contract::

    @pytest.mark.parametrize("check", mechanism_checks("my-mechanism"), ids=str)
    def test_conformance(check):
        check()

A failure raises :class:`ConformanceError` (an ``AssertionError``) whose message names the
contract, what was expected, what happened and what to change.

Modules
-------
models
    The example models (:func:`example_models`) and the suite's default model
    (:func:`gamma_exponential_data`).
calibration_models
    One model of each class users fit, with its simulated data sets' covariates
    (:func:`model_classes`), for calibration studies.
checks
    :class:`Check`, :class:`ConformanceError` and :class:`ConformanceReport`, shared by both
    suites.
mechanism_suite
    The contracts of mechanism plugins (:func:`mechanism_checks`, :func:`check_mechanism`).
accountant_suite
    The contracts of accountant plugins (:func:`accountant_checks`, :func:`check_accountant`).
leaks
    The search for private data in a result (:func:`find_leaks`) or in bytes
    (:func:`find_in_bytes`).
noise_audit
    The statistical test of the declared noise (:func:`epsilon_lower_bound`).
loss_distribution
    An independent bracket of the exact ε of composed Poisson-subsampled Gaussian releases
    (:func:`subsampled_gaussian_epsilon_bounds`), which the accountant suite checks against.
harness
    The state a mechanism's checks share (the model, the plan, one fit).
"""

from dpppl.testing.accountant_suite import (
    DEFAULT_EVENTS,
    accountant_checks,
    check_accountant,
    exact_gaussian_epsilon,
)
from dpppl.testing.calibration_models import ModelClass, model_classes
from dpppl.testing.checks import Check, ConformanceError, ConformanceReport
from dpppl.testing.leaks import find_in_bytes, find_leaks
from dpppl.testing.loss_distribution import subsampled_gaussian_epsilon_bounds
from dpppl.testing.mechanism_suite import check_mechanism, mechanism_checks
from dpppl.testing.models import (
    EXAMPLE_MODELS,
    N,
    beta_bernoulli,
    dirichlet_categorical,
    example_models,
    gamma_exponential,
    gamma_exponential_data,
    linear_regression,
    logistic_regression,
    two_observed,
    wide_logistic_regression,
    with_potential,
)
from dpppl.testing.noise_audit import (
    STATISTICAL_ALPHA,
    clopper_pearson_upper,
    epsilon_lower_bound,
)

__all__ = [
    "DEFAULT_EVENTS",
    "EXAMPLE_MODELS",
    "N",
    "STATISTICAL_ALPHA",
    "Check",
    "ConformanceError",
    "ConformanceReport",
    "ModelClass",
    "accountant_checks",
    "beta_bernoulli",
    "check_accountant",
    "check_mechanism",
    "clopper_pearson_upper",
    "dirichlet_categorical",
    "epsilon_lower_bound",
    "exact_gaussian_epsilon",
    "example_models",
    "find_in_bytes",
    "find_leaks",
    "gamma_exponential",
    "gamma_exponential_data",
    "linear_regression",
    "logistic_regression",
    "mechanism_checks",
    "model_classes",
    "subsampled_gaussian_epsilon_bounds",
    "two_observed",
    "wide_logistic_regression",
    "with_potential",
]
