"""One model of each class users fit, for calibration studies of a mechanism.

Each :class:`ModelClass` is a PyMC model with placeholder observations (a TARP study simulates
every data set from the model's prior) and the public covariates the study draws for each data
set.  NA-DPVI's CI-size calibration tests and ``tutorials/model_classes.py`` (the K = 200
studies in ``tutorials/RESULTS.md``) run these; a third-party mechanism can run the same::

    from dpppl.testing import model_classes

    logistic = model_classes()["logistic"]
    study = dpppl.tarp(logistic.build(), mechanism="my-mechanism", epsilon=1.0, delta=1e-5,
                       n_simulations=200, covariates=logistic.covariates)
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from functools import cache

import numpy as np
import pymc as pm

from dpppl.app.demo import demo_features, demo_model
from dpppl.datasets import load_adult_sample

#: Records per simulated data set in the generated classes (the demo has the Adult sample's).
N_RECORDS = 1000
#: The correlation of the GLMs' three covariates.
CORRELATION = np.array([[1.0, 0.6, 0.3], [0.6, 1.0, 0.5], [0.3, 0.5, 1.0]])
#: Public groups of the varying-intercepts models.
GROUPS = 5


@dataclass(frozen=True)
class ModelClass:
    """A model of one class and the covariates of its simulated data sets.

    Attributes
    ----------
    build
        Builds the model afresh (placeholder observations; covariates in ``pm.Data``).
    covariates
        ``rng -> {name: array}``: the public covariates of one simulated data set, for
        :func:`dpppl.tarp`'s ``covariates``.
    description
        What the class is, in words.
    """

    build: Callable[[], pm.Model]
    covariates: Callable[[np.random.Generator], dict[str, np.ndarray]]
    description: str


def correlated_covariates(
    rng: np.random.Generator, n_records: int = N_RECORDS
) -> dict[str, np.ndarray]:
    """Three standard normal covariates ``X`` with correlation :data:`CORRELATION`."""
    return {"X": rng.multivariate_normal(np.zeros(3), CORRELATION, n_records)}


def grouped_covariates(
    rng: np.random.Generator, n_records: int = N_RECORDS
) -> dict[str, np.ndarray]:
    """A standard normal covariate ``x`` and each record's public group ``group_index``."""
    return {"x": rng.standard_normal(n_records), "group_index": rng.integers(0, GROUPS, n_records)}


def glm(likelihood: str, n_records: int = N_RECORDS) -> pm.Model:
    """A logistic (``likelihood="logistic"``) or Poisson regression on three correlated
    covariates: ``b0 ~ N(0, 1)``, ``w ~ N(0, 0.5²)``."""
    X = correlated_covariates(np.random.default_rng(0), n_records)["X"]
    with pm.Model(coords={"feature": range(3)}) as model:
        x = pm.Data("X", X)
        b0 = pm.Normal("b0", 0.0, 1.0)
        w = pm.Normal("w", 0.0, 0.5, dims="feature")
        eta = b0 + x @ w
        if likelihood == "logistic":
            pm.Bernoulli("y", logit_p=eta, observed=np.zeros(n_records, dtype=int))
        else:
            pm.Poisson("y", mu=pm.math.exp(eta), observed=np.zeros(n_records, dtype=int))
    return model


def unknown_scale_regression(n_records: int = N_RECORDS) -> pm.Model:
    """A normal regression on three correlated covariates with an unknown noise scale."""
    X = correlated_covariates(np.random.default_rng(0), n_records)["X"]
    with pm.Model(coords={"feature": range(3)}) as model:
        x = pm.Data("X", X)
        b0 = pm.Normal("b0", 0.0, 1.0)
        w = pm.Normal("w", 0.0, 1.0, dims="feature")
        s = pm.HalfNormal("s", 1.0)
        pm.Normal("y", b0 + x @ w, s, observed=np.zeros(n_records))
    return model


def varying_intercepts(n_records: int = N_RECORDS, *, centred: bool = False) -> pm.Model:
    """Intercepts of public groups drawn around a common mean, and a common slope.

    Non-centred (``mu_a + tau * z``) as often written, or centred (``a ~ N(mu_a, tau)``), as
    groups of many records call for: the data then fix each group's intercept without the
    funnel of (mu_a, tau, z).
    """
    data = grouped_covariates(np.random.default_rng(0), n_records)
    with pm.Model(coords={"group": range(GROUPS)}) as model:
        x = pm.Data("x", data["x"])
        group = pm.Data("group_index", data["group_index"])
        mu_a = pm.Normal("mu_a", 0.0, 1.0)
        tau = pm.HalfNormal("tau", 1.0)
        if centred:
            intercept = pm.Normal("a", mu_a, tau, dims="group")
        else:
            intercept = mu_a + tau * pm.Normal("z", 0.0, 1.0, dims="group")
        w = pm.Normal("w", 0.0, 1.0)
        s = pm.HalfNormal("s", 1.0)
        pm.Normal("y", intercept[group] + w * x, s, observed=np.zeros(n_records))
    return model


@cache
def _demo_features() -> np.ndarray:
    return demo_features(load_adult_sample())[0].to_numpy()


def demo_covariates(rng: np.random.Generator) -> dict[str, np.ndarray]:
    """The demo's features of the bundled (public) Adult sample, the same for every data set."""
    return {"X": _demo_features()}


MODEL_CLASSES = {
    "logistic": ModelClass(
        lambda: glm("logistic"), correlated_covariates,
        "logistic regression, correlated covariates",
    ),
    "poisson": ModelClass(
        lambda: glm("poisson"), correlated_covariates, "Poisson regression, correlated covariates"
    ),
    "unknown_scale": ModelClass(
        unknown_scale_regression, correlated_covariates,
        "regression with an unknown noise scale",
    ),
    "varying_intercepts": ModelClass(
        varying_intercepts, grouped_covariates,
        "varying intercepts over public groups, non-centred",
    ),
    "varying_intercepts_centred": ModelClass(
        lambda: varying_intercepts(centred=True), grouped_covariates,
        "varying intercepts over public groups, centred",
    ),
    "demo": ModelClass(
        demo_model, demo_covariates,
        "the demo's logistic regression on the bundled Adult sample's features",
    ),
}


def model_classes() -> dict[str, ModelClass]:
    """The model classes, by name: ``logistic``, ``poisson``, ``unknown_scale``,
    ``varying_intercepts`` (non-centred), ``varying_intercepts_centred`` and ``demo``.

    Returns
    -------
    dict[str, ModelClass]
        A new dict each call; the classes themselves are immutable.
    """
    return dict(MODEL_CLASSES)
