"""Shared fixtures for the core's tests: the example models of :mod:`dpppl.testing`."""

from __future__ import annotations

import numpy as np
import pytest

from dpppl.testing import example_models

MODELS = example_models()


@pytest.fixture(params=sorted(MODELS), scope="module")
def any_model(request):
    """Each of the seven example models in turn."""
    return MODELS[request.param](np.random.default_rng(0))


@pytest.fixture
def regression_model():
    return MODELS["linear_regression"](np.random.default_rng(1))


@pytest.fixture(scope="session")
def model_factories():
    """The model builders by name, each taking a numpy Generator."""
    return MODELS
