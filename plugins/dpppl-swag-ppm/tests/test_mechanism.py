"""The ``"swag-ppm"`` mechanism as users meet it: registration, options, plan, and the result of
``dpppl.sample``."""

from __future__ import annotations

import json
import math
from collections.abc import Iterator
from contextlib import contextmanager

import jax.monitoring
import numpy as np
import pytest
import xarray as xr

import dpppl
from dpppl.plugin import Progress, Task, get_mechanism
from dpppl_swag_ppm import GUARANTEE
from dpppl_swag_ppm.fitting import PPMFitter
from dpppl_swag_ppm.mechanism import SwagPPM


def test_registered_as_swag_ppm_through_its_entry_point():
    assert get_mechanism("swag-ppm") is SwagPPM
    assert dpppl.mechanisms()["swag-ppm"].distribution == "dpppl-swag-ppm"


class TestOptions:
    def test_defaults_are_the_papers(self):
        o = SwagPPM().options
        assert (o.rank, o.scale, o.risk_draws) == (20, 0.5, 500)
        assert (o.weight_scale, o.weight_shift, o.reweight_k) == (1.0, 0.0, 0.95)
        assert o.collect_every is None  # once per epoch

    @pytest.mark.parametrize(
        ("options", "message"),
        [
            ({"draws": 0}, "draws must be a positive integer"),
            ({"draws": 600}, "risk_draws .* must be at least draws"),
            ({"rank": 2.5}, "rank must be a positive integer"),
            ({"scale": -0.5}, "scale must be a positive"),
            ({"var_floor": -1.0}, "var_floor"),
            ({"reweight_k": 1.0}, r"reweight_k must be in \(0, 1\)"),
            ({"weight_scale": 0.5, "weight_shift": -0.5}, "every record gets weight 0"),
            ({"preconditioner": "full"}, "preconditioner must be one of"),
            ({"burn_in_epochs": -1}, "burn_in_epochs"),
            ({"calibration_tolerance": 0.0}, "calibration_tolerance"),
        ],
    )
    def test_invalid_values_are_refused_with_the_reason(self, options, message):
        with pytest.raises(dpppl.InvalidOptionError, match=message):
            SwagPPM(**options)

    def test_unknown_options_are_refused(self):
        with pytest.raises(TypeError, match="has no option"):
            SwagPPM(epochs=3)


class TestPlan:
    def test_plan_promises_the_requested_epsilon_of_a_local_asymptotic_kind(self):
        plan = SwagPPM(draws=4).plan(n_records=1000, epsilon=2.0, delta=1e-5, accountant=None)
        assert plan.epsilon == 2.0
        assert math.isnan(plan.delta)
        assert plan.event is None and plan.accountant is None
        assert plan.guarantee == GUARANTEE
        assert "asymptotic" in plan.guarantee and "not (epsilon, delta)-DP" in plan.guarantee
        assert plan.details["per_draw_epsilon_target"] == 0.5
        assert plan.details["requested_delta"] == 1e-5

    @pytest.mark.parametrize(
        ("options", "message"),
        [
            ({"batch_size": 2000}, "exceeds the number of records"),
            ({"swag_epochs": 1}, "SWAG needs at least 2"),
        ],
    )
    def test_impossible_schedules_are_refused_before_the_data_are_read(self, options, message):
        with pytest.raises(dpppl.InvalidOptionError, match=message):
            SwagPPM(**options).plan(n_records=1000, epsilon=1.0, delta=1e-5, accountant=None)

    def test_it_prefers_no_accountant_so_the_core_chooses_none(self):
        """When the user names none, the core then passes ``accountant=None`` to :meth:`plan`;
        the result names none (``dp_accountant``, checked below)."""
        assert SwagPPM.preferred_accountants == ()


def test_dpppl_sample_runs_end_to_end_with_its_defaults(logistic):
    """The README's call, as a user makes it: defaults, progress bars on, no accountant."""
    with logistic:
        result = dpppl.sample(mechanism="swag-ppm", epsilon=3.0, delta=1e-5, random_seed=0)
    assert isinstance(result, xr.DataTree)
    posterior = result["posterior"]
    assert set(posterior.data_vars) == {"w", "b"}
    assert posterior["w"].dims == ("chain", "draw", "feature")
    assert posterior["w"].shape == (1, SwagPPM().options.draws, 2)
    assert list(posterior["feature"].values) == ["a", "b"]
    assert posterior["b"].dims == ("chain", "draw")
    attrs = result.attrs
    assert attrs["dp_mechanism"] == "swag-ppm"
    assert attrs["dp_guarantee"] == GUARANTEE
    assert 0 < attrs["dp_epsilon"] <= 3.0
    assert math.isnan(attrs["dp_delta"])
    assert attrs["dp_accountant"] == "none" and attrs["dp_event"] == "none"
    assert attrs["dp_neighbour_relation"] == "add_or_remove_one"
    assert set(json.loads(attrs["dp_plugins"])) == {"mechanism"}
    statement = dpppl.privacy_statement(result)
    assert statement.startswith(GUARANTEE)
    assert "(no finite-sample delta)" in statement and "delta = nan" not in statement


def test_a_ledger_refuses_it_before_the_data_are_read(logistic):
    """Its epsilon is not an accountable event, so it cannot be composed with charged fits."""
    ledger = dpppl.PrivacyLedger(epsilon=10.0, delta=1e-5)
    with logistic, pytest.raises(dpppl.PrivacyBudgetExceededError, match="no accountable"):
        dpppl.sample(
            mechanism="swag-ppm", epsilon=1.0, delta=1e-5, ledger=ledger, progressbar=False
        )
    assert ledger.entries == []


EPSILON = 2.0
DRAWS = 4


@pytest.fixture(scope="module")
def fitted(logistic, fast):
    """A result of ``dpppl.sample`` and the private outcome behind it (captured for the tests)."""
    captured = []
    original = PPMFitter.run

    def capturing_run(self, epsilon):
        captured.append(original(self, epsilon))
        return captured[-1]

    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(PPMFitter, "run", capturing_run)
        with logistic:
            result = dpppl.sample(
                mechanism="swag-ppm", epsilon=EPSILON, delta=1e-5, random_seed=11,
                progressbar=False, draws=DRAWS, **fast,
            )
    return result, captured[0]


class TestResult:
    def test_posterior_is_named_and_dimensioned_like_the_model(self, fitted):
        posterior = fitted[0]["posterior"]
        assert posterior["w"].dims == ("chain", "draw", "feature")
        assert posterior["w"].shape == (1, DRAWS, 2)
        assert list(posterior["feature"].values) == ["a", "b"]
        assert posterior["b"].dims == ("chain", "draw")

    def test_attributes_name_the_guarantee_and_the_requested_epsilon(self, fitted):
        result, outcome = fitted
        attrs = result.attrs
        assert attrs["dp_guarantee"] == GUARANTEE
        assert attrs["dp_epsilon"] == EPSILON
        assert 0 < outcome.epsilon <= attrs["dp_epsilon"]
        assert math.isnan(attrs["dp_delta"])
        assert attrs["dp_event"] == "none" and attrs["dp_accountant"] == "none"
        details = json.loads(attrs["dp_privacy_details"])
        assert details["released_draws"] == DRAWS
        assert details["composition"].startswith("basic")
        assert details["per_draw_epsilon_target"] * DRAWS == pytest.approx(EPSILON)
        assert "O(n^-1/2)" in details["delta"]
        assert "SWAG's Gaussian approximation" in attrs["dp_guarantee"]

    def test_the_achieved_epsilon_appears_nowhere_in_the_result(self, fitted, tmp_path):
        """The achieved M·2Δ is a noise-free maximum over the records: 3.677 on one data set and
        3.762 on a neighbour was what the old result published."""
        result, outcome = fitted
        path = tmp_path / "result.nc"
        result.to_netcdf(path)
        for value in (outcome.epsilon, outcome.final.epsilon_per_draw):
            for printed in (repr(value), f"{value:.4g}"):
                assert printed not in _public_text(result)
            assert np.array(value).tobytes() not in path.read_bytes()

    def test_neighbouring_data_sets_publish_the_same_epsilon(self, logistic_of_size, fast):
        """Remove one record: the same seed and settings must publish the same dp_epsilon."""
        published = []
        for n_records in (400, 399):
            model = logistic_of_size(n_records)
            with model:
                result = dpppl.sample(
                    mechanism="swag-ppm", epsilon=EPSILON, delta=1e-5, random_seed=11,
                    progressbar=False, draws=DRAWS, **fast,
                )
            published.append(result.attrs["dp_epsilon"])
        assert published == [EPSILON, EPSILON]

    def test_only_the_posterior_group_is_released(self, fitted):
        assert set(fitted[0].children) == {"posterior"}

    def test_no_per_record_quantity_in_the_result_or_its_netcdf(self, fitted, logistic, tmp_path):
        result, outcome = fitted
        path = tmp_path / "result.nc"
        result.to_netcdf(path)
        stored = path.read_bytes() + json.dumps(result.attrs, default=str).encode()
        data = dpppl.record_model(logistic).data()
        private = np.concatenate(
            [
                data["x"].ravel(),
                outcome.final.weights,
                outcome.final.risks,
                outcome.risk_weights,
            ]
        )
        # Values a release could hold by coincidence (0, 1, small integers) say nothing.
        distinctive = private[np.abs(private - np.round(private)) > 1e-6]
        assert distinctive.size > 400
        for value in distinctive:
            assert np.float64(value).tobytes() not in stored
            assert np.float32(value).tobytes() not in stored
            assert f"{value:.8g}".encode() not in stored

    def test_a_second_fit_does_not_recompile(self, logistic, fast):
        def fit():
            with logistic:
                return dpppl.sample(
                    mechanism="swag-ppm", epsilon=EPSILON, delta=1e-5, random_seed=5,
                    progressbar=False, draws=DRAWS, **fast,
                )

        fit()
        compiles = []

        def listener(event, duration, **kwargs):
            if event == "/jax/core/compile/backend_compile_duration":
                compiles.append(event)

        jax.monitoring.register_event_duration_secs_listener(listener)
        try:
            fit()
        finally:
            jax.monitoring.unregister_event_duration_listener(listener)
        assert compiles == []

    def test_the_same_seed_gives_the_same_draws(self, fitted, logistic, fast):
        with logistic:
            again = dpppl.sample(
                mechanism="swag-ppm", epsilon=EPSILON, delta=1e-5, random_seed=11,
                progressbar=False, draws=DRAWS, **fast,
            )
        np.testing.assert_array_equal(again["posterior"]["w"], fitted[0]["posterior"]["w"])
        assert again.attrs["dp_seeded"] == 1


class _RecordingProgress(Progress):
    """Progress bars off, their labels and sizes recorded."""

    def __init__(self) -> None:
        super().__init__(enabled=False)
        self.bars: list[tuple[str, float]] = []

    @contextmanager
    def task(self, description: str, total: float) -> Iterator[Task]:
        self.bars.append((description, total))
        with super().task(description, total) as bar:
            yield bar


def test_progress_bars_show_nothing_that_depends_on_the_data(logistic, fast):
    """One bar per phase, named and sized from the options only: the number of calibration
    fits depends on the data, so it appears in no label and in no count of bars."""
    model = dpppl.record_model(logistic)
    mechanism = SwagPPM(draws=DRAWS, reweight=True, **fast)
    plan = mechanism.plan(n_records=model.n_records, epsilon=EPSILON, delta=1e-5, accountant=None)
    progress = _RecordingProgress()
    mechanism.fit(model, model.data(), plan, seed=np.random.SeedSequence(2), progress=progress)
    epochs = mechanism.schedule(model.n_records, model.n_params).epochs_per_fit
    rounds = mechanism.options.max_calibration_rounds
    assert progress.bars == [
        ("SWAG-PPM risk fit", epochs),
        ("SWAG-PPM calibration", rounds * epochs),
        ("SWAG-PPM re-weighted calibration", rounds * epochs),
    ]


def _public_text(result: xr.DataTree) -> str:
    """Every attribute of every group, as text."""
    return repr({node.path: dict(node.attrs) for node in result.subtree})
