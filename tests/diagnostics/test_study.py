"""``dpppl.tarp``: noise-aware TARP on simulated data, for any model and mechanism; the ``tarp``
group of a result; the private-covariate opt-in; local, in-process and Dask executors.

The mechanisms below are TEST DOUBLES for the TARP driver, not DP mechanisms: they add no noise
and spend nothing.  ``test-exact-beta-bernoulli`` releases exact conjugate posterior draws of the
Beta(1, 1)–Bernoulli model (optionally shrunk towards their mean, to be detected as
over-confident); ``test-prior-draws`` ignores the data and releases prior draws, which makes
every model calibrated and serves to test the plumbing on models with covariates.
"""

from __future__ import annotations

import re
import sys
import warnings
from dataclasses import dataclass

import cloudpickle
import numpy as np
import pytest
import xarray as xr
from scipy import stats

import dpppl
from dpppl import (
    InvalidDataError,
    InvalidPrivacyParameterError,
    Mechanism,
    PrivacyPlan,
    PrivacyWarning,
    Release,
)
from dpppl.diagnostics.study import NO_BUDGET_SPENT, PRIVATE_DATA_USED
from dpppl.model.simulation import simulator
from dpppl.plugin.registry import register_plugin, unregister_plugin

# Worker processes cannot import this test module by name: ship its classes by value.
cloudpickle.register_pickle_by_value(sys.modules[__name__])

NOT_DP = "none: test double, not a DP mechanism"
#: The success rate of every data set ExactBetaBernoulli fitted in this process, in order.
FITTED: list[float] = []


class _TestDouble(Mechanism):
    preferred_accountants = ()

    def plan(self, *, n_records, epsilon, delta, accountant):
        return PrivacyPlan(
            epsilon=epsilon,
            delta=delta,
            relation=self.relation,
            event=None,
            accountant=None,
            guarantee=NOT_DP,
            details={"n_records": n_records},
        )


class ExactBetaBernoulli(_TestDouble):
    """Exact Beta(1 + Σy, 1 + N − Σy) posterior draws of logit(p); ``shrink`` < 1 narrows them;
    a fit warns where the data's success rate exceeds ``warn_above``."""

    name = "test-exact-beta-bernoulli"

    @dataclass(frozen=True)
    class Options:
        draws: int = 400
        shrink: float = 1.0
        warn_above: float = 1.0

    def fit(self, model, data, plan, *, seed, progress):
        y = data["y"]
        if y.mean() > self.options.warn_above:
            warnings.warn(f"success rate {y.mean():.3f}", UserWarning, stacklevel=2)
        assert len(y) == model.n_records == plan.details["n_records"]
        p = np.random.default_rng(seed).beta(1 + y.sum(), 1 + y.size - y.sum(), self.options.draws)
        theta = np.log(p) - np.log1p(-p)  # logit, PyMC's unconstrained space for p
        theta = theta.mean() + self.options.shrink * (theta - theta.mean())
        return Release(draws=theta[None, :, None])


class NonFiniteAbove(ExactBetaBernoulli):
    """ExactBetaBernoulli, but NaN draws for data whose success rate exceeds ``nan_above``; it
    records every data set's success rate in ``FITTED``."""

    name = "test-non-finite-above"

    @dataclass(frozen=True)
    class Options(ExactBetaBernoulli.Options):
        nan_above: float = 0.8

    def fit(self, model, data, plan, *, seed, progress):
        FITTED.append(data["y"].mean())
        if data["y"].mean() > self.options.nan_above:
            return Release(draws=np.full((1, self.options.draws, 1), np.nan))
        return super().fit(model, data, plan, seed=seed, progress=progress)


#: The size of every batch BatchedExactBetaBernoulli was given in this process, in order.
BATCHES: list[int] = []


class BatchedExactBetaBernoulli(ExactBetaBernoulli):
    """ExactBetaBernoulli that asks for batches of at most 16 and records their sizes in
    ``BATCHES``."""

    name = "test-batched-beta-bernoulli"

    def replicate_batch_size(self, model, plan):
        return 16

    def fit_replicates(self, model, datasets, plan, *, seeds, progress):
        BATCHES.append(len(datasets))
        return super().fit_replicates(model, datasets, plan, seeds=seeds, progress=progress)


class PriorDraws(_TestDouble):
    """Releases draws from the model's prior, whatever the data: calibrated for any model."""

    name = "test-prior-draws"

    @dataclass(frozen=True)
    class Options:
        draws: int = 100

    def fit(self, model, data, plan, *, seed, progress):
        sim = simulator(model)
        theta = np.stack([sim.prior(s).theta for s in seed.spawn(self.options.draws)])
        return Release(draws=theta[None])


class _Plugin:
    @dpppl.hookimpl
    def register_mechanisms(self, register):
        register(ExactBetaBernoulli)
        register(NonFiniteAbove)
        register(BatchedExactBetaBernoulli)
        register(PriorDraws)


@pytest.fixture(scope="module", autouse=True)
def test_doubles():
    register_plugin(_Plugin(), name="tarp-test-doubles")
    yield
    unregister_plugin("tarp-test-doubles")


@pytest.fixture(scope="module")
def beta_bernoulli(model_factories):
    return model_factories["beta_bernoulli"](np.random.default_rng(0))


@pytest.fixture(scope="module")
def regression(model_factories):
    return model_factories["linear_regression"](np.random.default_rng(0))


def exact_study(model, **kwargs):
    options = {
        "mechanism": "test-exact-beta-bernoulli",
        "epsilon": 1.0,
        "delta": 1e-5,
        "n_simulations": 300,
        "n_workers": 1,
        "random_seed": 0,
        "progressbar": False,
    }
    return dpppl.tarp(model, **{**options, **kwargs})


def fit_with_tarp_doubles(model, mechanism="test-exact-beta-bernoulli", **kwargs):
    with model:
        return dpppl.sample(
            mechanism=mechanism, epsilon=1.0, delta=1e-5, random_seed=1, progressbar=False,
            **kwargs,
        )


# -- calibration ----------------------------------------------------------------------------


def test_an_exact_posterior_is_calibrated(beta_bernoulli):
    study = exact_study(beta_bernoulli)
    # f_k is uniform on [0, 1] for an exact posterior (up to the 1/S grid of the draws).
    assert stats.kstest(study["ball_mass"].isel(repeat=0), "uniform").pvalue > 1e-3
    assert float(study["rmse"].mean()) < 0.05
    assert study["parameter"].values.tolist() == ["p_logodds__"]


def test_a_shrunken_posterior_is_detected_as_over_confident(beta_bernoulli):
    study = exact_study(beta_bernoulli, shrink=0.4)
    assert float(study["rmse"].mean()) > 0.15
    # Over-confident: the truth falls outside the high-credibility balls too often.
    high = study["coverage_error"].sel(alpha=0.05).mean("repeat")
    assert float(high) < -0.2


def test_simulated_data_sets_have_the_requested_size(beta_bernoulli):
    study = exact_study(beta_bernoulli, n_records=500, n_simulations=20)
    assert study.attrs["n_records"] == 500
    assert study.attrs["covariates"] == "none"
    default = exact_study(beta_bernoulli, n_simulations=20)
    assert default.attrs["n_records"] == 40  # the model's N: public metadata


def test_the_study_records_its_settings_and_spends_no_budget(beta_bernoulli):
    study = exact_study(beta_bernoulli, n_simulations=10, n_repeats=3, n_posterior_draws=50)
    attrs = study.attrs
    assert attrs["mechanism"] == "test-exact-beta-bernoulli"
    assert attrs["mechanism_settings"] == '{"draws": 400, "shrink": 1.0, "warn_above": 1.0}'
    assert (attrs["epsilon"], attrs["delta"]) == (1.0, 1e-5)
    assert (attrs["n_simulations"], attrs["n_draws"], attrs["n_repeats"]) == (10, 50, 3)
    assert attrs["reference_rule"] == "posterior_uniform"
    assert attrs["privacy_budget_spent"] == "none" and attrs["privacy_note"] == NO_BUDGET_SPENT
    assert attrs["uses_private_data"] == 0
    assert attrs["seed_entropy"] == "0" and attrs["seeded"] == 1
    assert attrs["fits_with_warnings"] == 0


def test_the_same_seed_reproduces_the_study_and_another_changes_it(beta_bernoulli):
    first, again, other = (
        exact_study(beta_bernoulli, n_simulations=10, random_seed=s) for s in (3, 3, 4)
    )
    xr.testing.assert_identical(first.drop_attrs(), again.drop_attrs())
    assert not np.array_equal(first["ball_mass"], other["ball_mass"])


def test_fit_warnings_are_reported_once_for_the_study(beta_bernoulli):
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        study = exact_study(beta_bernoulli, n_simulations=5, warn_above=-1.0)
    [message] = [str(w.message) for w in caught]
    assert message.startswith(
        "5 of 5 fits of the TARP study warned; the first said: UserWarning: success rate 0."
    )
    assert study.attrs["fits_with_warnings"] == 5


def test_the_study_keeps_what_each_fit_warned_of_through_netcdf(beta_bernoulli, tmp_path):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        study = exact_study(beta_bernoulli, n_simulations=40, warn_above=0.5)
    messages = study["fit_warnings"].values
    assert messages.shape == (40,)
    warned = [m for m in messages if m]
    assert 0 < len(warned) == study.attrs["fits_with_warnings"] < 40
    rates = [float(re.fullmatch(r"UserWarning: success rate (\S+)", m).group(1)) for m in warned]
    assert min(rates) > 0.5
    study.to_netcdf(tmp_path / "study.nc")
    with xr.open_dataset(tmp_path / "study.nc") as loaded:
        assert loaded["fit_warnings"].values.tolist() == messages.tolist()


def test_a_fit_with_non_finite_draws_stops_the_study_there(beta_bernoulli):
    FITTED.clear()
    with pytest.raises(InvalidDataError, match=r"fit of simulation (\d+) .*non-finite") as error:
        exact_study(beta_bernoulli, n_simulations=100, mechanism="test-non-finite-above")
    failed = int(re.search(r"simulation (\d+)", str(error.value)).group(1))
    # The simulations run in order in this process: the failed one was the last fitted and the
    # first whose data crossed the line.
    assert len(FITTED) == failed + 1 < 100
    assert FITTED[-1] > 0.8 and max(FITTED[:-1], default=0) <= 0.8


def test_too_many_posterior_draws_are_refused(beta_bernoulli):
    with pytest.raises(ValueError, match="released only 400"):
        exact_study(beta_bernoulli, n_simulations=2, n_posterior_draws=1000)


# -- covariates are private data --------------------------------------------------------------


def test_a_model_with_covariates_needs_public_ones(regression):
    with pytest.raises(InvalidDataError, match="use_private_covariates=True"):
        dpppl.tarp(regression, mechanism="test-prior-draws", epsilon=1.0, delta=1e-5)


def test_public_or_simulated_covariates_are_used(regression):
    options = dict(mechanism="test-prior-draws", epsilon=1.0, delta=1e-5, n_simulations=4,
                   n_repeats=2, n_workers=1, progressbar=False, random_seed=0)
    given = dpppl.tarp(regression, covariates={"X": np.linspace(0, 1, 25)}, **options)
    assert (given.attrs["n_records"], given.attrs["covariates"]) == (25, "given")
    simulated = dpppl.tarp(regression, covariates=lambda rng: {"X": rng.normal(size=30)}, **options)
    assert (simulated.attrs["n_records"], simulated.attrs["covariates"]) == (30, "simulated")
    assert simulated.attrs["privacy_note"] == NO_BUDGET_SPENT


def test_private_covariates_need_an_opt_in_and_mark_the_study(regression):
    with pytest.warns(PrivacyWarning, match="not private"):
        study = dpppl.tarp(
            regression, mechanism="test-prior-draws", epsilon=1.0, delta=1e-5, n_simulations=4,
            n_repeats=2, use_private_covariates=True, n_workers=1, progressbar=False,
        )
    assert study.attrs["uses_private_data"] == 1
    assert study.attrs["privacy_budget_spent"] == "not private"
    assert study.attrs["privacy_note"] == PRIVATE_DATA_USED
    assert (study.attrs["covariates"], study.attrs["n_records"]) == ("private", 40)

    result = fit_with_tarp_doubles(regression, mechanism="test-prior-draws")
    with pytest.raises(InvalidPrivacyParameterError, match="not private"):
        dpppl.add_tarp(result, regression, coverage=study)
    with pytest.raises(InvalidPrivacyParameterError, match="not private"):
        dpppl.add_tarp(result, regression, use_private_covariates=True)
    assert "tarp" not in result.children


# -- the tarp group of a result ---------------------------------------------------------------


def test_sample_adds_a_tarp_group_that_survives_netcdf(beta_bernoulli, tmp_path):
    result = fit_with_tarp_doubles(
        beta_bernoulli, tarp={"n_simulations": 20, "n_repeats": 4, "n_workers": 1}
    )
    path = result.to_netcdf(tmp_path / "result.nc") or tmp_path / "result.nc"
    loaded = xr.open_datatree(path)
    tarp = loaded["tarp"]
    xr.testing.assert_allclose(tarp.to_dataset(), result["tarp"].to_dataset())
    assert tarp.attrs["mechanism"] == "test-exact-beta-bernoulli"
    assert tarp.attrs["privacy_note"] == NO_BUDGET_SPENT
    assert tarp.attrs["n_simulations"] == 20 and tarp.sizes["repeat"] == 4
    assert loaded.attrs["dp_mechanism"] == "test-exact-beta-bernoulli"


def test_add_tarp_runs_the_results_mechanism_and_setting(beta_bernoulli):
    result = fit_with_tarp_doubles(beta_bernoulli, shrink=0.5)
    dpppl.add_tarp(result, beta_bernoulli, n_simulations=10, n_repeats=2, n_workers=1,
                   progressbar=False)
    attrs = result["tarp"].attrs
    assert attrs["mechanism_settings"] == '{"draws": 400, "shrink": 0.5, "warn_above": 1.0}'
    assert attrs["epsilon"] == result.attrs["dp_epsilon"]


def test_a_study_of_another_setting_cannot_be_attached(beta_bernoulli):
    result = fit_with_tarp_doubles(beta_bernoulli)
    other = exact_study(beta_bernoulli, n_simulations=4, shrink=0.5)
    with pytest.raises(ValueError, match="the result is"):
        dpppl.add_tarp(result, coverage=other)


def test_a_bad_tarp_request_is_refused_before_the_fit(regression):
    with pytest.raises(InvalidDataError, match="covariates"):
        fit_with_tarp_doubles(regression, mechanism="test-prior-draws", tarp=True)
    with pytest.raises(TypeError, match="unknown TARP option"):
        fit_with_tarp_doubles(regression, mechanism="test-prior-draws", tarp={"draws": 3})


def test_a_failed_study_after_the_fit_keeps_the_result(beta_bernoulli):
    with pytest.warns(UserWarning, match="TARP study failed"):
        result = fit_with_tarp_doubles(
            beta_bernoulli, tarp={"n_simulations": 2, "n_posterior_draws": 10_000, "n_workers": 1}
        )
    assert "posterior" in result.children and "tarp" not in result.children


def test_plot_tarp_saves_one_png(beta_bernoulli, tmp_path):
    study = exact_study(beta_bernoulli, n_simulations=10, n_repeats=3)
    fig = dpppl.plot_tarp(study, tmp_path / "tarp.png")
    assert (tmp_path / "tarp.png").read_bytes().startswith(b"\x89PNG")
    assert len([ax for ax in fig.get_axes() if ax.get_visible()]) == 3


# -- executors --------------------------------------------------------------------------------


def test_a_study_is_cut_into_equal_batches_and_drops_the_fits_that_fill_the_last(beta_bernoulli):
    # 40 under a limit of 16: 14 + 14 + 12 filled up to 14, so a vectorised mechanism compiles
    # one program, not one of 16 and another for the last 8.
    BATCHES.clear()
    batched = exact_study(beta_bernoulli, mechanism="test-batched-beta-bernoulli", n_simulations=40)
    assert BATCHES == [14, 14, 14]
    assert batched.attrs["batch_size"] == 14
    one_at_a_time = exact_study(
        beta_bernoulli, mechanism="test-batched-beta-bernoulli", n_simulations=40, batch_size=1
    )
    xr.testing.assert_identical(batched.drop_attrs(), one_at_a_time.drop_attrs())
    # A batch size the user gives is a limit too: 40 at most 64 at a time is one batch of 40.
    BATCHES.clear()
    exact_study(
        beta_bernoulli, mechanism="test-batched-beta-bernoulli", n_simulations=40, batch_size=64
    )
    assert BATCHES == [40]



@pytest.fixture(scope="module")
def in_process(beta_bernoulli):
    return exact_study(beta_bernoulli, n_simulations=12)


def test_local_processes_give_the_in_process_numbers(beta_bernoulli, in_process):
    on_processes = exact_study(beta_bernoulli, n_simulations=12, n_workers=2)
    xr.testing.assert_identical(in_process.drop_attrs(), on_processes.drop_attrs())


def test_a_dask_cluster_gives_the_in_process_numbers(beta_bernoulli, in_process):
    distributed = pytest.importorskip("distributed")
    with distributed.LocalCluster(
        n_workers=2, threads_per_worker=1, processes=True, dashboard_address=None
    ) as cluster, distributed.Client(cluster) as client:
        on_dask = exact_study(beta_bernoulli, n_simulations=12, n_workers=None, client=client)
    xr.testing.assert_identical(in_process.drop_attrs(), on_dask.drop_attrs())
