"""The model classes that calibration studies run: each builds a fresh PyMC model whose
covariates, as TARP draws them for a simulated data set, fit its ``pm.Data`` containers."""

from __future__ import annotations

import numpy as np
import pymc as pm
import pytest

from dpppl.testing import model_classes
from dpppl.testing.calibration_models import CORRELATION, GROUPS


@pytest.mark.parametrize("name", model_classes())
def test_each_class_simulates_a_data_set_from_covariates_drawn_for_it(name):
    chosen = model_classes()[name]
    model = chosen.build()
    covariates = chosen.covariates(np.random.default_rng(1))
    data = {d.name: d for d in model.data_vars}
    assert set(covariates) <= set(data)
    with model:
        pm.set_data(covariates)
    (observed,) = model.observed_RVs
    draw = pm.draw(observed, random_seed=2)
    assert np.all(np.isfinite(draw))
    assert draw.shape[0] == next(iter(covariates.values())).shape[0]


def test_each_build_is_a_new_model():
    chosen = model_classes()["logistic"]
    assert chosen.build() is not chosen.build()


def test_the_glms_covariates_have_the_stated_correlation():
    X = model_classes()["logistic"].covariates(np.random.default_rng(3))["X"]
    assert np.abs(np.corrcoef(X, rowvar=False) - CORRELATION).max() < 0.1


def test_the_groups_are_public_indices_into_the_intercepts():
    groups = model_classes()["varying_intercepts_centred"].covariates(np.random.default_rng(4))
    assert set(np.unique(groups["group_index"])) == set(range(GROUPS))
