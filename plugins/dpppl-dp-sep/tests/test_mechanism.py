"""The ``"dp-sep"`` mechanism as users meet it: registration, options, the privacy event and
its accounting, and the result of ``dpppl.sample``."""

from __future__ import annotations

import json
import math

import jax.monitoring
import numpy as np
import pytest
import xarray as xr

import dpppl
from dpppl.plugin import (
    GaussianEvent,
    NeighbourRelation,
    SampledWithoutReplacementEvent,
    SelfComposedEvent,
    get_accountant,
    get_mechanism,
)
from dpppl_dp_sep.mechanism import DPSEP

FAST = {"passes": 3.0, "draws": 50, "chains": 2}


def test_registered_as_dp_sep_through_its_entry_point():
    assert get_mechanism("dp-sep") is DPSEP
    assert dpppl.mechanisms()["dp-sep"].distribution == "dpppl-dp-sep"


class TestOptions:
    def test_defaults_follow_the_paper_where_it_fixes_them(self):
        o = DPSEP().options
        assert (o.batch_size, o.damping, o.clipping_bound) == (1, 1.0, 1.0)

    @pytest.mark.parametrize(
        ("options", "message"),
        [
            ({"passes": 0}, "passes must be a positive"),
            ({"clipping_bound": math.inf}, "clipping_bound must be a positive finite"),
            ({"damping": -1.0}, "damping must be a positive"),
            ({"batch_size": 2.5}, "batch_size must be a positive integer"),
            ({"mc_draws": 7}, "must be even"),
            ({"average_last": 1.0}, r"average_last must be in \[0, 1\)"),
            ({"covariance": "block"}, "covariance must be"),
            ({"moment_matching": "laplace"}, "moment_matching must be"),
            ({"init_jitter": -0.1}, "init_jitter must be a non-negative"),
        ],
    )
    def test_invalid_values_are_refused_with_the_reason(self, options, message):
        with pytest.raises(dpppl.InvalidOptionError, match=message):
            DPSEP(**options)

    def test_auto_choices_follow_the_dimension(self):
        mechanism = DPSEP()
        assert [mechanism.covariance(d) for d in (2, 64, 65)] == ["full", "full", "diagonal"]
        assert [mechanism.nodes(d).name for d in (2, 3, 65)] == [
            "cubature", "spherical", "monte-carlo"
        ]


class TestPrivacy:
    """One step releases (η, Λ) of the global site computed from m records drawn uniformly
    without replacement: replace-one neighbours, per-block sensitivity 2γC/N."""

    def test_the_event_is_t_sampled_without_replacement_gaussian_releases(self):
        mechanism = DPSEP(passes=2.0, batch_size=4)
        event = mechanism.privacy_event(n_records=100, noise_multiplier=3.0)
        assert event == SelfComposedEvent(
            SampledWithoutReplacementEvent(100, 4, GaussianEvent(3.0 / math.sqrt(2))), 50
        )
        assert DPSEP.relation is NeighbourRelation.REPLACE_ONE
        assert DPSEP.preferred_accountants == ("rdp",)

    def test_accountants_without_a_bound_for_this_sampling_refuse_it(self):
        event = DPSEP().privacy_event(n_records=100, noise_multiplier=3.0)
        for name in ("pld", "prv"):
            with pytest.raises(dpppl.UnsupportedEventError):
                get_accountant(name)().check(event, NeighbourRelation.REPLACE_ONE)

    def test_the_plan_calibrates_sigma_below_the_target_and_states_the_noise(self):
        mechanism = DPSEP(passes=2.0, damping=0.5, clipping_bound=2.0)
        accountant = get_accountant("rdp")()
        plan = mechanism.plan(n_records=500, epsilon=1.0, delta=1e-5, accountant=accountant)
        assert 0.99 <= plan.epsilon <= 1.0
        assert plan.relation is NeighbourRelation.REPLACE_ONE
        assert plan.event == mechanism.privacy_event(
            n_records=500, noise_multiplier=plan.noise_multiplier
        )
        assert plan.details["block_sensitivity"] == pytest.approx(2 * 0.5 * 2.0 / 500)
        assert plan.details["noise_std"] == pytest.approx(plan.noise_multiplier * 2 * 0.5 * 2 / 500)
        assert plan.details["steps"] == 1000
        assert accountant.epsilon(plan.event, delta=1e-5, relation=plan.relation) <= 1.0


@pytest.fixture(scope="module")
def result(linear_2d):
    with linear_2d:
        return dpppl.sample(
            mechanism="dp-sep", epsilon=2.0, delta=1e-5, random_seed=3, progressbar=False,
            **FAST,
        )


class TestResult:
    def test_posterior_is_named_and_dimensioned_like_the_model(self, result):
        assert isinstance(result, xr.DataTree)
        w = result["posterior"]["w"]
        assert w.dims == ("chain", "draw", "feature") and w.shape == (2, 50, 2)
        assert list(w["feature"].values) == ["a", "b"]

    def test_attributes_state_the_guarantee_the_event_and_the_noise(self, result):
        attrs = result.attrs
        assert attrs["dp_mechanism"] == "dp-sep"
        assert 0 < attrs["dp_epsilon"] <= 2.0 and attrs["dp_delta"] == 1e-5
        assert attrs["dp_neighbour_relation"] == "replace_one"
        assert attrs["dp_accountant"] == "rdp"
        event = dpppl.PrivacyMetadata.from_result(result).event
        assert event.kind == "self_composed" and event.count == 180
        assert event.event.kind == "sampled_without_replacement"
        details = json.loads(attrs["dp_privacy_details"])
        assert details["noise_std"] == pytest.approx(attrs["dp_noise_multiplier"] * 2 / 60)
        settings = json.loads(attrs["dp_mechanism_settings"])
        assert settings["clipping_bound"] == 1.0

    def test_only_releases_and_their_post_processing_leave(self, result):
        assert set(result.children) == {"posterior", "dpsep_approximation", "dpsep_trace"}
        approximation = result["dpsep_approximation"]
        assert approximation["covariance"].shape == (2, 2)
        assert np.linalg.eigvalsh(approximation["precision"].values)[0] > 0
        trace = result["dpsep_trace"]
        assert trace["precision_min_eigenvalue"].shape == (180,)
        assert (trace["precision_min_eigenvalue"].values > 0).all()

    def test_no_data_value_in_the_result_or_its_netcdf(self, result, linear_2d, tmp_path):
        path = tmp_path / "result.nc"
        result.to_netcdf(path)
        stored = path.read_bytes() + json.dumps(result.attrs, default=str).encode()
        data = dpppl.record_model(linear_2d).data()
        private = np.concatenate([v.ravel() for v in data.values()])
        distinctive = private[np.abs(private - np.round(private)) > 1e-6]
        assert distinctive.size >= 150
        for value in distinctive:
            assert np.float64(value).tobytes() not in stored
            assert np.float32(value).tobytes() not in stored
            assert f"{value:.8g}".encode() not in stored


def test_a_second_fit_compiles_nothing(linear_2d, result):
    """``result`` fitted the model once; a fit with another seed and ε reuses every compilation."""
    compiles = []

    def listener(event, duration, **kwargs):
        if event == "/jax/core/compile/backend_compile_duration":
            compiles.append(event)

    jax.monitoring.register_event_duration_secs_listener(listener)
    try:
        with linear_2d:
            dpppl.sample(
                mechanism="dp-sep", epsilon=4.0, delta=1e-5, random_seed=9, progressbar=False,
                **FAST,
            )
    finally:
        jax.monitoring.unregister_event_duration_listener(listener)
    assert compiles == []


def test_a_model_with_an_improper_prior_is_refused_before_any_noise_is_drawn():
    import pymc as pm

    with pm.Model():
        mu = pm.Flat("mu")
        pm.Normal("y", mu, 1, observed=np.array([0.3, 1.2, -0.4]))
        with pytest.raises(dpppl.ModelNotSupportedError, match="proper prior"):
            dpppl.sample(mechanism="dp-sep", epsilon=1.0, delta=1e-5, progressbar=False, **FAST)
