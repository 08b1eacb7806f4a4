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
"""

from __future__ import annotations

import contextlib
import dataclasses
import io
import json
import logging
import math
import re
import tempfile
import warnings
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from functools import cached_property
from pathlib import Path
from typing import Any

import numpy as np
import pymc as pm
import xarray as xr
from scipy import optimize, special, stats

from dpppl.accounting import Accountant, PrivacyLedger
from dpppl.calibration import CALIBRATION_RTOL
from dpppl.errors import (
    DPPPLError,
    InvalidDataError,
    InvalidPrivacyParameterError,
    ModelNotSupportedError,
    PluginError,
    PluginNotFoundError,
    UnsupportedEventError,
)
from dpppl.events import (
    ComposedEvent,
    GaussianEvent,
    NeighbourRelation,
    PrivacyEvent,
    SelfComposedEvent,
    event_from_json,
    poisson_subsampled_gaussian,
)
from dpppl.mechanism import APPROXIMATE_DP, Mechanism, PrivacyPlan
from dpppl.plugins import get_accountant, get_mechanism, provider, registry
from dpppl.record_model import RecordModel, record_model
from dpppl.results import FORBIDDEN_GROUPS

N = 40


def gamma_exponential(rng):
    with pm.Model(coords={"obs": range(N)}) as model:
        rate = pm.Gamma("rate", 2.0, 2.0)
        pm.Exponential("y", lam=rate, observed=rng.exponential(0.8, N), dims="obs")
    return model


def beta_bernoulli(rng):
    with pm.Model() as model:
        p = pm.Beta("p", 1.0, 1.0)
        pm.Bernoulli("y", p=p, observed=rng.binomial(1, 0.3, N))
    return model


def dirichlet_categorical(rng):
    with pm.Model(coords={"obs": range(N), "category": ["a", "b", "c"]}) as model:
        probs = pm.Dirichlet("probs", np.ones(3), dims="category")
        pm.Categorical("y", p=probs, observed=rng.choice(3, N, p=[0.2, 0.3, 0.5]), dims="obs")
    return model


def linear_regression(rng):
    x = rng.normal(size=N)
    with pm.Model(coords={"obs": range(N)}) as model:
        X = pm.Data("X", x, dims="obs")
        intercept = pm.Normal("intercept", 0, 5)
        slope = pm.Normal("slope", 0, 5)
        sigma = pm.HalfNormal("sigma", 2)
        pm.Normal("y", intercept + slope * X, sigma, observed=1 + 2 * x + rng.normal(size=N), dims="obs")
    return model


def logistic_regression(rng):
    x = rng.normal(size=(N, 3))
    y = rng.binomial(1, 1 / (1 + np.exp(-x @ [1.0, -0.5, 0.2])))
    with pm.Model(coords={"obs": range(N), "feature": ["f0", "f1", "f2"]}) as model:
        X = pm.Data("X", x, dims=("obs", "feature"))
        Y = pm.Data("Y", y, dims="obs")
        w = pm.Normal("w", 0, 1, dims="feature")
        pm.Bernoulli("y", logit_p=X @ w, observed=Y, dims="obs")
    return model


def two_observed(rng):
    with pm.Model(coords={"obs": range(N)}) as model:
        mu = pm.Normal("mu", 0, 3)
        sigma = pm.HalfNormal("sigma", 1)
        pm.Normal("height", mu, sigma, observed=rng.normal(1, 0.5, N), dims="obs")
        pm.Poisson("count", pm.math.exp(mu / 4), observed=rng.poisson(1.5, N), dims="obs")
    return model


def with_potential(rng):
    with pm.Model(coords={"obs": range(N)}) as model:
        mu = pm.Normal("mu", 0, 3)
        sigma = pm.HalfNormal("sigma", 1)
        pm.Potential("soft_constraint", -((mu - sigma) ** 2))
        pm.Normal("y", mu, sigma, observed=rng.normal(0.5, 1, N), dims="obs")
    return model


EXAMPLE_MODELS = {
    f.__name__: f
    for f in (
        gamma_exponential,
        beta_bernoulli,
        dirichlet_categorical,
        linear_regression,
        logistic_regression,
        two_observed,
        with_potential,
    )
}


def example_models() -> dict[str, Callable[[np.random.Generator], pm.Model]]:
    """Builders of small models (N = 40 records), by name, each taking a numpy Generator.

    They cover what the record model must handle: conjugate exponential families
    (Gamma–Exponential, Beta–Bernoulli, Dirichlet–Categorical), linear regression with unknown
    noise, logistic regression with covariates in ``pm.Data``, two observed variables per record
    and a ``pm.Potential`` on the parameters.
    """
    return dict(EXAMPLE_MODELS)


def gamma_exponential_data(rng: np.random.Generator) -> pm.Model:
    """Gamma–Exponential with its observations in ``pm.Data``: the conformance suite's default.

    Its records are distinctive float64 values (they serve as the leak check's sentinels), it
    can be simulated from (TARP), and holding the observations in ``pm.Data`` lets the suite put
    a NaN into them to check that bad data are refused before any budget is spent.
    """
    with pm.Model(coords={"obs": range(N)}) as model:
        y = pm.Data("y_data", rng.exponential(0.8, N), dims="obs")
        rate = pm.Gamma("rate", 2.0, 2.0)
        pm.Exponential("y", lam=rate, observed=y, dims="obs")
    return model


# == the conformance suite ========================================================================

#: Confidence level of the statistical checks: a correct plugin fails one with probability at most
#: this (for a fixed ``random_seed`` the outcome is reproducible).
STATISTICAL_ALPHA = 1e-3
#: Relative slack when comparing two accountant answers that must be ordered.
_ORDER_RTOL = 1e-9
#: The check on the exact Gaussian bound allows this much round-off below the truth.
_EXACT_RTOL = 1e-7
#: A number in text (attributes, messages) is compared with the private values only when it is
#: written with at least this many significant digits: shorter ones match by coincidence.
_TEXT_DIGITS = 8


class ConformanceError(AssertionError):
    """A plugin broke a contract of the conformance suite.

    Attributes
    ----------
    contract
        Which contract (e.g. ``"no leak of private data"``).
    plugin
        The mechanism or accountant checked.
    """

    def __init__(self, contract: str, plugin: str, *, expected: str, happened: str, fix: str):
        self.contract = contract
        self.plugin = plugin
        super().__init__(
            f"[{contract}] {plugin}: expected {expected}; but {happened}.\nWhat to change: {fix}"
        )


@dataclass(frozen=True)
class Check:
    """One contract of the suite, runnable on its own (``check()``); ``str(check)`` is its name,
    usable as a pytest id."""

    name: str
    run: Callable[[], str | None]

    def __call__(self) -> str | None:
        """Run the check; return None when it ran, or why it was skipped."""
        return self.run()

    def __str__(self) -> str:
        return self.name


@dataclass
class ConformanceReport:
    """What :func:`check_mechanism` or :func:`check_accountant` checked.

    Attributes
    ----------
    plugin
        The mechanism or accountant's name.
    passed
        Names of the checks that ran and passed.
    skipped
        Checks that did not apply, with the reason.
    """

    plugin: str
    passed: list[str] = field(default_factory=list)
    skipped: dict[str, str] = field(default_factory=dict)


def _run_all(plugin: str, checks: Sequence[Check]) -> ConformanceReport:
    report = ConformanceReport(plugin)
    for check in checks:
        reason = check()
        if reason is None:
            report.passed.append(check.name)
        else:
            report.skipped[check.name] = reason
    return report


def _describe(error: BaseException) -> str:
    return f"{type(error).__name__}: {error}"


# -- statistics -----------------------------------------------------------------------------------


def clopper_pearson_upper(successes: int, trials: int, alpha: float) -> float:
    """One-sided upper confidence bound, at level 1 − ``alpha``, on a binomial proportion."""
    if successes >= trials:
        return 1.0
    return float(stats.beta.ppf(1 - alpha, successes + 1, trials - successes))


def epsilon_lower_bound(
    scores_d: np.ndarray,
    scores_d_prime: np.ndarray,
    threshold: float,
    delta: float,
    alpha: float = STATISTICAL_ALPHA,
) -> float:
    """A lower bound on ε, valid with confidence 1 − ``alpha``, from the test "score > threshold
    means the data set was D".

    An (ε, δ)-DP mechanism has P(S | D) ≤ e^ε P(S | D′) + δ for every event S, both ways round.
    With S = {score > threshold} and Clopper–Pearson bounds on the four error rates (a union
    bound shares ``alpha`` between them), the largest ε this excludes is returned (−inf when the
    scores give no evidence).  ``threshold`` must not depend on these scores.
    """
    n, m = len(scores_d), len(scores_d_prime)
    fnr_up = clopper_pearson_upper(int(np.sum(scores_d <= threshold)), n, alpha / 4)
    fpr_up = clopper_pearson_upper(int(np.sum(scores_d_prime > threshold)), m, alpha / 4)
    bounds = []
    for hit, miss in ((1 - fnr_up, fpr_up), (1 - fpr_up, fnr_up)):
        ratio = (hit - delta) / miss if miss > 0 else math.inf
        bounds.append(math.log(ratio) if ratio > 0 else -math.inf)
    return max(bounds)


def exact_gaussian_epsilon(noise_multiplier: float, delta: float) -> float:
    """The exact ε at ``delta`` of one Gaussian release with noise multiplier σ (sensitivity 1).

    From the analytic Gaussian mechanism (Balle & Wang 2018):
    δ(ε) = Φ(1/(2σ) − εσ) − e^ε Φ(−1/(2σ) − εσ), solved for ε.
    """
    sigma = float(noise_multiplier)

    def excess(eps: float) -> float:
        a = 1 / (2 * sigma)
        return (
            math.exp(special.log_ndtr(a - eps * sigma))
            - math.exp(eps + special.log_ndtr(-a - eps * sigma))
            - delta
        )

    if excess(0.0) <= 0:
        return 0.0
    return float(optimize.brentq(excess, 0.0, 1e4, xtol=1e-13, rtol=1e-13))


# -- capturing what a fit says ---------------------------------------------------------------------


@dataclass
class _Captured:
    """Warnings, log records and printed output of a block, as text."""

    warnings: list[str] = field(default_factory=list)
    logs: list[str] = field(default_factory=list)
    stdout: str = ""
    stderr: str = ""

    def texts(self) -> dict[str, str]:
        return {
            **{f"warning {i + 1}": text for i, text in enumerate(self.warnings)},
            **{f"log record {i + 1}": text for i, text in enumerate(self.logs)},
            "stdout": self.stdout,
            "stderr": self.stderr,
        }


class _ListHandler(logging.Handler):
    def __init__(self, sink: list[str]):
        super().__init__(logging.INFO)
        self.sink = sink

    def emit(self, record: logging.LogRecord) -> None:
        self.sink.append(f"{record.name}: {record.getMessage()}")


@contextlib.contextmanager
def _capture() -> Iterator[_Captured]:
    """Collect the warnings, log records (INFO and above) and printed output of the block."""
    captured = _Captured()
    out, err = io.StringIO(), io.StringIO()
    handler = _ListHandler(captured.logs)
    root = logging.getLogger()
    level = root.level
    root.addHandler(handler)
    # INFO and above: what a plugin says to its users.  DEBUG would make JAX and PyTensor log
    # every compilation, slowly, and they log no data.
    root.setLevel(min(level, logging.INFO) if level else logging.INFO)
    try:
        with (
            warnings.catch_warnings(record=True) as caught,
            contextlib.redirect_stdout(out),
            contextlib.redirect_stderr(err),
        ):
            warnings.simplefilter("always")
            yield captured
    finally:
        root.removeHandler(handler)
        root.setLevel(level)
        captured.stdout, captured.stderr = out.getvalue(), err.getvalue()
    captured.warnings = [f"{w.category.__name__}: {w.message}" for w in caught]


@contextlib.contextmanager
def _counting_fits(cls: type[Mechanism]) -> Iterator[list[int]]:
    """Count the calls of ``cls.fit`` in the block (the refusal check expects none)."""
    calls: list[int] = []
    original = cls.__dict__.get("fit")
    inherited = cls.fit

    def fit(self, *args, **kwargs):
        calls.append(1)
        return inherited(self, *args, **kwargs)

    cls.fit = fit
    try:
        yield calls
    finally:
        if original is None:
            del cls.fit
        else:
            cls.fit = original


# -- the leak check --------------------------------------------------------------------------------


def _significant_digits(token: str) -> int:
    mantissa = re.split(r"[eE]", token.lstrip("+-"))[0].replace(".", "")
    return len(mantissa.lstrip("0"))


_NUMBER = re.compile(r"[-+]?(?:\d+\.\d*|\.\d+|\d+)(?:[eE][-+]?\d+)?")


@dataclass
class _Sentinels:
    """Private values to look for: the records' distinctive float values and their aggregates.

    The example models' float records are random float64 values, so each one is a sentinel: no
    public quantity equals it by chance.  Aggregates (sums, means, extremes, sums of squares and
    logs: the sufficient statistics of common families) catch a mechanism that releases an
    unnoised statistic.
    """

    values: np.ndarray
    labels: list[str]

    @classmethod
    def of(cls, data: Mapping[str, np.ndarray]) -> _Sentinels:
        values: list[float] = []
        labels: list[str] = []
        for name, array in data.items():
            array = np.asarray(array)
            if array.dtype.kind != "f":
                continue
            flat = array.reshape(array.shape[0], -1)
            for index, value in enumerate(flat[:, 0] if flat.shape[1] == 1 else flat.ravel()):
                values.append(float(value))
                labels.append(f"a value of record array {name!r} (entry {index})")
            aggregates = {
                "sum": flat.sum(axis=0),
                "mean": flat.mean(axis=0),
                "minimum": flat.min(axis=0),
                "maximum": flat.max(axis=0),
                "sum of squares": (flat**2).sum(axis=0),
                "standard deviation": flat.std(axis=0),
            }
            if np.all(flat > 0):
                aggregates["sum of logs"] = np.log(flat).sum(axis=0)
            for what, column_values in aggregates.items():
                for column, value in enumerate(np.atleast_1d(column_values)):
                    values.append(float(value))
                    labels.append(f"the {what} of record array {name!r} (column {column})")
        keep = [
            i
            for i, v in enumerate(values)
            if math.isfinite(v) and _significant_digits(f"{v:.15g}") >= _TEXT_DIGITS
        ]
        return cls(np.array([values[i] for i in keep]), [labels[i] for i in keep])

    def __bool__(self) -> bool:
        return self.values.size > 0

    def match(self, value: float, rtol: float) -> str | None:
        """The label of a sentinel equal to ``value`` within ``rtol``, or None."""
        if not math.isfinite(value) or value == 0:
            return None
        close = np.isclose(self.values, value, rtol=rtol, atol=0.0)
        return self.labels[int(np.argmax(close))] if close.any() else None

    def in_text(self, text: str) -> list[str]:
        """Sentinels written in ``text`` with at least ``_TEXT_DIGITS`` significant digits."""
        found = []
        for token in _NUMBER.findall(text):
            if _significant_digits(token) < _TEXT_DIGITS:
                continue
            label = self.match(float(token), rtol=10.0 ** (1 - _TEXT_DIGITS))
            if label is not None:
                found.append(f"{token} ({label})")
        return found

    def in_array(self, array: np.ndarray) -> list[str]:
        array = np.asarray(array)
        if array.dtype.kind not in "fc" or array.size == 0:
            return []
        flat = np.real(array).astype(float).ravel()
        close = np.isclose(flat[:, None], self.values[None, :], rtol=1e-9, atol=0.0)
        close &= flat[:, None] != 0
        hits = np.argwhere(close)
        return [f"{float(flat[i])!r} ({self.labels[j]})" for i, j in hits[:3]]

    def in_bytes(self, blob: bytes) -> list[str]:
        found = []
        for value, label in zip(self.values, self.labels, strict=True):
            for order in ("<f8", ">f8"):
                if np.array(value, dtype=order).tobytes() in blob:
                    found.append(f"{value!r} as float64 ({label})")
                    break
        return found


def _walk_attr(value: Any, sentinels: _Sentinels) -> list[str]:
    if isinstance(value, str):
        try:
            parsed = json.loads(value)
        except ValueError:
            return sentinels.in_text(value)
        # JSON numbers are compared at full precision; strings inside are searched as text.
        return _walk_attr(parsed, sentinels) if not isinstance(parsed, str) else (
            sentinels.in_text(parsed)
        )
    if isinstance(value, Mapping):
        return [hit for item in value.values() for hit in _walk_attr(item, sentinels)]
    if isinstance(value, (list, tuple)):
        return [hit for item in value for hit in _walk_attr(item, sentinels)]
    if isinstance(value, np.ndarray):
        return sentinels.in_array(value)
    if isinstance(value, (float, np.floating)):
        label = sentinels.match(float(value), rtol=1e-9)
        return [] if label is None else [f"{float(value)!r} ({label})"]
    return []


def find_leaks(
    result: xr.DataTree,
    data: Mapping[str, np.ndarray],
    *,
    texts: Mapping[str, str] | None = None,
    netcdf: bytes | None = None,
) -> list[str]:
    """Where private values of ``data`` appear in a result, outside its released posterior.

    Looks for every distinctive float value of the records and their aggregates (see
    :class:`_Sentinels`) in: the attributes of every group and variable (numbers, JSON and
    numbers written in text with at least 8 significant digits); the values and coordinates of
    every group but ``posterior`` (to 1e-9 relative); the netCDF bytes (exact float64, either
    byte order); and ``texts`` (warnings, log records, printed output).

    Returns
    -------
    list of str
        One line per place a private value was found; empty when none was.
    """
    sentinels = _Sentinels.of(data)
    if not sentinels:
        return []
    found: list[str] = []
    for node in result.subtree:
        where = node.path
        for key, value in node.attrs.items():
            found += [f"attribute {key!r} of {where}: {hit}" for hit in _walk_attr(value, sentinels)]
        dataset = node.to_dataset(inherit=False)
        for name, variable in dataset.variables.items():
            for key, value in variable.attrs.items():
                found += [
                    f"attribute {key!r} of {where}/{name}: {hit}"
                    for hit in _walk_attr(value, sentinels)
                ]
            if node.path != "/posterior":
                found += [
                    f"values of {where}/{name}: {hit}" for hit in sentinels.in_array(variable.values)
                ]
    for where, text in (texts or {}).items():
        found += [f"{where}: {hit}" for hit in sentinels.in_text(text)]
    if netcdf is not None:
        found += [f"the netCDF file: {hit}" for hit in sentinels.in_bytes(netcdf)]
    return found


# -- mechanisms ------------------------------------------------------------------------------------


@dataclass
class _Fit:
    """One run of ``dpppl.sample`` and what it said."""

    result: xr.DataTree
    captured: _Captured


def _neighbour(data: Mapping[str, np.ndarray], model: RecordModel) -> tuple[dict, str]:
    """D′: ``data`` with one record replaced, chosen to move the release as much as possible.

    The replaced record is the one of smallest norm; its replacement is a *canary*, the record
    of largest norm with its float values multiplied by 1000 (a value far outside the rest, which
    a mechanism must clip), when the model's log-likelihood is finite there; otherwise the record
    farthest from the replaced one.
    """
    names = list(data)
    flat = np.concatenate(
        [np.asarray(data[n], dtype=float).reshape(len(data[n]), -1) for n in names], axis=1
    )
    scale = flat.std(axis=0)
    standardised = flat / np.where(scale > 0, scale, 1.0)
    norms = np.linalg.norm(standardised, axis=1)
    low, high = int(np.argmin(norms)), int(np.argmax(norms))
    canary = {
        n: (
            np.asarray(data[n])[high] * 1000.0
            if np.asarray(data[n]).dtype.kind == "f"
            else np.asarray(data[n])[high]
        )
        for n in names
    }
    loglik = model.loglik(model.initial_point(), {n: np.asarray(canary[n])[None] for n in names})
    if np.all(np.isfinite(np.asarray(loglik))) and any(
        np.asarray(data[n]).dtype.kind == "f" for n in names
    ):
        replacement, how = canary, "a canary record (the largest record x 1000)"
    else:
        farthest = int(np.argmax(np.linalg.norm(standardised - standardised[low], axis=1)))
        replacement = {n: np.asarray(data[n])[farthest] for n in names}
        how = "the record farthest from it"
    neighbour = {n: np.array(data[n], copy=True) for n in names}
    for n in names:
        neighbour[n][low] = replacement[n]
    return neighbour, f"record {low} (the smallest) replaced by {how}"


class _MechanismHarness:
    """Shared state of one mechanism's checks: the model, the plan and one fit, built once."""

    def __init__(
        self,
        name_or_class: str | type[Mechanism],
        *,
        options: Mapping[str, Any] | None,
        model: Callable[[np.random.Generator], pm.Model] | None,
        epsilon: float,
        delta: float,
        accountant: str | None,
        noise_epsilon: float,
        noise_fits: int,
        tarp_simulations: int,
        random_seed: int,
    ):
        self.requested = name_or_class
        self.name = name_or_class if isinstance(name_or_class, str) else name_or_class.name
        self.options = dict(options or {})
        self.builder = model or gamma_exponential_data
        self.epsilon, self.delta = float(epsilon), float(delta)
        self.accountant_name = accountant
        self.noise_epsilon = float(noise_epsilon)
        self.noise_fits = int(noise_fits)
        self.tarp_simulations = int(tarp_simulations)
        self.seed = int(random_seed)

    def fail(self, contract: str, *, expected: str, happened: str, fix: str) -> ConformanceError:
        return ConformanceError(
            contract, f"mechanism {self.name!r}", expected=expected, happened=happened, fix=fix
        )

    # -- shared state ---------------------------------------------------------------------------

    @cached_property
    def cls(self) -> type[Mechanism]:
        try:
            registered = get_mechanism(self.name)
        except PluginNotFoundError as error:
            raise self.fail(
                "registration",
                expected=f"a mechanism named {self.name!r} registered through the "
                "register_mechanisms hook",
                happened=f"dpppl does not know it ({error})",
                fix="implement `@dpppl.hookimpl def register_mechanisms(register): "
                "register(YourMechanism)` in your plugin module, name that module in your "
                "pyproject.toml under [project.entry-points.dpppl], and reinstall the "
                "distribution (pip install -e .)",
            ) from None
        if not isinstance(self.requested, str) and registered is not self.requested:
            raise self.fail(
                "registration",
                expected=f"{self.requested.__qualname__} registered under {self.name!r}",
                happened=f"{self.name!r} is registered as {registered.__module__}."
                f"{registered.__qualname__} (by {provider('mechanism', self.name)})",
                fix="register the class you are checking, or give its mechanism a unique `name`",
            )
        return registered

    @cached_property
    def model(self) -> pm.Model:
        return self.builder(np.random.default_rng(self.seed))

    @cached_property
    def compiled(self) -> RecordModel:
        return record_model(self.model)

    def mechanism(self) -> Mechanism:
        try:
            return self.cls(**self.options)
        except Exception as error:
            raise self.fail(
                "options",
                expected=f"the options {self.options} to be accepted",
                happened=f"the constructor raised {_describe(error)}",
                fix="pass options the mechanism has (its Options dataclass), valid values only",
            ) from error

    def plan_at(self, epsilon: float) -> tuple[PrivacyPlan, Accountant | None]:
        from dpppl.sampling import plan_fit

        mechanism = self.mechanism()
        try:
            return plan_fit(
                mechanism,
                self.compiled,
                epsilon=epsilon,
                delta=self.delta,
                accountant=self.accountant_name,
            )
        except ModelNotSupportedError as error:
            raise self.fail(
                "model support",
                expected="the mechanism to accept the suite's model",
                happened=f"it refused it: {error}",
                fix="pass model= a builder (rng -> pm.Model) of a model your mechanism supports, "
                "with float records and no covariates if you can",
            ) from error
        except PluginError as error:
            raise self.fail(
                "declared privacy event",
                expected=f"a plan whose epsilon is at most the requested {epsilon}",
                happened=str(error),
                fix="calibrate the noise with the accountant (implement privacy_event() and "
                "let Mechanism.plan calibrate it), never above the target",
            ) from error

    @cached_property
    def plan(self) -> PrivacyPlan:
        return self.plan_at(self.epsilon)[0]

    @property
    def accounted(self) -> bool:
        """Whether the mechanism's guarantee is (ε, δ)-DP from an accountant."""
        return self.plan.guarantee == APPROXIMATE_DP and self.plan.event is not None

    def ledger(self) -> PrivacyLedger | None:
        if not self.accounted:
            return None
        return PrivacyLedger(
            epsilon=10 * self.epsilon,
            delta=self.delta,
            accountant=self.plan.accountant,
            relation=self.plan.relation,
        )

    def sample(self, seed: int, ledger: PrivacyLedger | None = None, model=None) -> _Fit:
        import dpppl

        with _capture() as captured:
            try:
                result = dpppl.sample(
                    model or self.model,
                    mechanism=self.name,
                    epsilon=self.epsilon,
                    delta=self.delta,
                    accountant=self.accountant_name,
                    ledger=ledger,
                    random_seed=seed,
                    progressbar=False,
                    **self.options,
                )
            except PluginError as error:
                raise self.fail(
                    "result layout",
                    expected="a release dpppl can turn into a result",
                    happened=f"dpppl refused the release: {error}",
                    fix="return a dpppl.Release whose draws have shape (chain, draw, "
                    "model.n_params) and whose groups hold only what the guarantee covers "
                    f"(never {sorted(FORBIDDEN_GROUPS)})",
                ) from error
            except DPPPLError:
                raise
            except Exception as error:
                raise self.fail(
                    "fit",
                    expected="dpppl.sample to run the mechanism on the suite's model",
                    happened=f"it raised {_describe(error)}",
                    fix="fix the exception; if the model is not supported, raise "
                    "ModelNotSupportedError from check_model() and pass model= a supported one",
                ) from error
        return _Fit(result, captured)

    @cached_property
    def first(self) -> tuple[_Fit, PrivacyLedger | None]:
        """The fit the layout, leak and ledger checks look at (charged to a fresh ledger)."""
        ledger = self.ledger()
        return self.sample(self.seed, ledger), ledger

    # -- checks ---------------------------------------------------------------------------------

    def check_registration(self) -> None:
        """The mechanism is registered through the hook under its ``name``, by a known
        provider, and refuses unknown options with TypeError."""
        cls = self.cls
        if not dataclasses.is_dataclass(cls.Options):
            raise self.fail(
                "registration",
                expected="an Options dataclass describing the mechanism's options",
                happened=f"{cls.__qualname__}.Options is not a dataclass",
                fix="decorate Options with @dataclass(frozen=True)",
            )
        try:
            cls(**self.options, conformance_unknown_option=1)
        except TypeError:
            pass
        else:
            raise self.fail(
                "registration",
                expected="an unknown option to be refused with TypeError",
                happened="it was accepted",
                fix="keep Mechanism.__init__'s option check (call super().__init__(**options))",
            )
        if ("mechanism", self.name) not in registry().providers:
            raise self.fail(  # pragma: no cover - the registry records every class it holds
                "registration",
                expected="a provider for the mechanism",
                happened="dpppl does not know who registered it",
                fix="register it through the register_mechanisms hook",
            )

    def check_privacy_event(self) -> str | None:
        """The plan declares an event consistent with itself: the accountant bounds the event
        at the plan's δ by at most the plan's ε (≤ the target, ≥ (1 − CALIBRATION_RTOL) of it);
        the event's Gaussian noise multipliers are at most the plan's σ; ``privacy_event`` at the
        plan's σ gives the plan's event, and more noise gives a smaller ε; the event survives
        JSON; the relation is the mechanism's."""
        plan = self.plan
        mechanism = self.mechanism()
        if plan.relation != mechanism.relation:
            raise self.fail(
                "declared privacy event",
                expected=f"the plan under the mechanism's relation {mechanism.relation.value}",
                happened=f"the plan says {plan.relation.value}",
                fix="build the PrivacyPlan with relation=self.relation",
            )
        if not self.accounted:
            if plan.guarantee == APPROXIMATE_DP:
                raise self.fail(
                    "declared privacy event",
                    expected="an (epsilon, delta)-DP plan to declare its privacy event",
                    happened="the plan has event=None",
                    fix="return the event from privacy_event() (or set PrivacyPlan.event); a "
                    "guarantee no accountant composes must say its kind in `guarantee`",
                )
            if plan.accountant is not None:
                raise self.fail(
                    "declared privacy event",
                    expected="no accountant named for a guarantee no accountant computed",
                    happened=f"the plan names {plan.accountant!r} with event={plan.event}",
                    fix="set accountant=None, or declare the event and an (epsilon, delta)-DP "
                    "guarantee",
                )
            return f"guarantee of another kind ({plan.guarantee!r}): no event to account"
        target = self.epsilon
        if not (1 - CALIBRATION_RTOL) * target <= plan.epsilon <= target * (1 + _ORDER_RTOL):
            raise self.fail(
                "declared privacy event",
                expected=f"a planned epsilon in [{(1 - CALIBRATION_RTOL) * target:.6g}, "
                f"{target:g}] (calibration within {CALIBRATION_RTOL:.0%} below the target)",
                happened=f"the plan says epsilon={plan.epsilon:.6g}",
                fix="let the accountant calibrate the noise (accountant.noise_multiplier or "
                "dpppl.calibrate_noise_multiplier) instead of choosing it by hand",
            )
        accountant = get_accountant(plan.accountant)()
        bound = accountant.epsilon(plan.event, delta=plan.delta, relation=plan.relation)
        if bound > plan.epsilon * (1 + 1e-6):
            raise self.fail(
                "declared privacy event",
                expected=f"the accountant {plan.accountant!r} to bound the declared event by at "
                f"most the planned epsilon={plan.epsilon:.6g} at delta={plan.delta:g}",
                happened=f"it bounds it by {bound:.6g}: the plan claims more privacy than the "
                f"event it declares ({plan.event.to_json()})",
                fix="take the plan's epsilon from the accountant for exactly the declared event",
            )
        if event_from_json(plan.event.to_json()) != plan.event:
            raise self.fail(
                "declared privacy event",
                expected="the event to survive to_json()/event_from_json()",
                happened=f"{plan.event.to_json()} reads back differently",
                fix="build events from dpppl.events classes only",
            )
        sigmas = _gaussian_noise_multipliers(plan.event)
        # A release of several blocks may declare a smaller joint multiplier (its sensitivity is
        # larger), never a larger one: that would claim more noise than fit() adds.
        if plan.noise_multiplier is not None and any(
            s > plan.noise_multiplier * (1 + 1e-9) for s in sigmas
        ):
            raise self.fail(
                "declared privacy event",
                expected=f"the declared event to claim no more noise than the fit adds (noise "
                f"multiplier {plan.noise_multiplier:.6g})",
                happened=f"its Gaussian noise multipliers are {sorted(sigmas)}: the event does "
                "not describe the noise the plan tells fit() to add",
                fix="return GaussianEvent(noise_multiplier) (composed, sampled as the fit does) "
                "from privacy_event(), with the noise_multiplier it is given, relative to the "
                "L2 sensitivity of what fit() releases",
            )
        if type(mechanism).privacy_event is not Mechanism.privacy_event and (
            plan.noise_multiplier is not None
        ):
            n = self.compiled.n_records
            again = mechanism.privacy_event(n_records=n, noise_multiplier=plan.noise_multiplier)
            if again != plan.event:
                raise self.fail(
                    "declared privacy event",
                    expected="privacy_event() at the plan's noise multiplier to give the plan's "
                    "event",
                    happened=f"it gives {again.to_json()}, the plan holds "
                    f"{plan.event.to_json()}",
                    fix="declare in the plan the event privacy_event() returns",
                )
            noisier = mechanism.privacy_event(
                n_records=n, noise_multiplier=2 * plan.noise_multiplier
            )
            eps_noisier = accountant.epsilon(noisier, delta=plan.delta, relation=plan.relation)
            if not eps_noisier < bound:
                raise self.fail(
                    "declared privacy event",
                    expected="twice the noise multiplier to give a smaller epsilon",
                    happened=f"epsilon is {eps_noisier:.6g} at 2 sigma and {bound:.6g} at sigma: "
                    "privacy_event() does not use its noise_multiplier",
                    fix="build the event from the noise_multiplier argument",
                )
        return None

    def check_result_layout(self) -> None:
        """The result is a DataTree with the model's variables in ``posterior`` (chain and
        draw dims, finite values), no forbidden or per-record group, ``dp_*`` attributes that
        agree with the plan, a ledger charged with exactly the declared event, and it survives
        ``to_netcdf`` and ``arviz.summary``."""
        import arviz as az

        fit, ledger = self.first
        result = fit.result
        expect = "a result in the InferenceData layout"
        if not isinstance(result, xr.DataTree) or "posterior" not in result.children:
            raise self.fail(
                "result layout",
                expected=f"{expect} with a 'posterior' group",
                happened=f"dpppl.sample returned {type(result).__name__} with groups "
                f"{sorted(getattr(result, 'children', {}))}",
                fix="return posterior draws in Release.draws; the core builds the posterior",
            )
        posterior = result["posterior"].to_dataset()
        missing = sorted(
            {rv.name for rv in self.model.free_RVs} - set(posterior.data_vars)
        )
        if missing or {"chain", "draw"} - set(posterior.dims):
            raise self.fail(
                "result layout",
                expected=f"{expect}: every free variable in 'posterior' with dims chain, draw",
                happened=f"missing {missing}, dims {dict(posterior.sizes)}",
                fix="release draws of the whole unconstrained vector, shape (chain, draw, "
                "model.n_params)",
            )
        bad = [n for n, v in posterior.data_vars.items() if not np.all(np.isfinite(v.values))]
        if bad:
            raise self.fail(
                "result layout",
                expected="finite posterior draws",
                happened=f"{bad} hold NaN or infinite values",
                fix="check the fit for numerical failures; refuse or warn instead of releasing "
                "non-finite draws",
            )
        forbidden = sorted(FORBIDDEN_GROUPS & set(result.children))
        if forbidden:
            raise self.fail(
                "result layout",
                expected="no observed_data, constant_data, log_likelihood or other per-record "
                "group",
                happened=f"the result has {forbidden}",
                fix="release only what the guarantee covers",
            )
        record_dim = self.compiled.record_dim
        per_record = [
            node.path
            for node in result.subtree
            if record_dim is not None and record_dim in node.to_dataset(inherit=False).dims
        ]
        if per_record:
            raise self.fail(
                "result layout",
                expected=f"no group with the record dimension {record_dim!r}",
                happened=f"{per_record} have it: a value per record is private data",
                fix="release no per-record quantity",
            )
        attrs = result.attrs
        plan = self.plan
        checks = {
            "dp_mechanism": (attrs.get("dp_mechanism"), self.name),
            "dp_neighbour_relation": (attrs.get("dp_neighbour_relation"), plan.relation.value),
            "dp_event": (
                attrs.get("dp_event"),
                plan.event.to_json() if plan.event is not None else "none",
            ),
        }
        wrong = {k: got for k, (got, want) in checks.items() if got != want}
        if wrong:
            raise self.fail(
                "result layout",
                expected=f"privacy attributes that agree with the plan: "
                f"{ {k: want for k, (_, want) in checks.items()} }",
                happened=f"the result says {wrong}",
                fix="keep the plan's event fixed between plan() and fit(); report corrections "
                "in Release.privacy only",
            )
        if self.accounted and float(attrs["dp_epsilon"]) > self.epsilon * (1 + _ORDER_RTOL):
            raise self.fail(
                "result layout",
                expected=f"dp_epsilon at most the requested {self.epsilon}",
                happened=f"dp_epsilon={attrs['dp_epsilon']}",
                fix="never report (or spend) more than the target",
            )
        if ledger is not None:
            charged = [entry.event for entry in ledger.entries]
            if charged != [plan.event]:
                raise self.fail(
                    "declared privacy event",
                    expected=f"the ledger charged once with the declared event "
                    f"{plan.event.to_json()}",
                    happened=f"it holds {[e.to_json() for e in charged]}",
                    fix="do not charge ledgers yourself; the core charges the plan's event",
                )
        with tempfile.TemporaryDirectory() as folder:
            path = Path(folder) / "result.nc"
            try:
                result.to_netcdf(path)
                with xr.open_datatree(path) as stored:
                    stored_epsilon = float(stored.attrs["dp_epsilon"])
                    stored_groups = set(stored.children)
            except Exception as error:
                raise self.fail(
                    "result layout",
                    expected="the result to survive to_netcdf and open_datatree",
                    happened=f"it raised {_describe(error)}",
                    fix="keep group values numeric or string arrays and attributes JSON-like "
                    "(str, int, float): put structured values in Release.attrs, which the core "
                    "serialises",
                ) from error
        if stored_epsilon != float(attrs["dp_epsilon"]) or stored_groups != set(result.children):
            raise self.fail(  # pragma: no cover - xarray's own round trip
                "result layout",
                expected="the netCDF file to keep the groups and dp_epsilon",
                happened=f"it holds {sorted(stored_groups)} and dp_epsilon={stored_epsilon}",
                fix="keep group names and attributes netCDF-compatible",
            )
        try:
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                az.summary(result)
        except Exception as error:
            raise self.fail(
                "result layout",
                expected="arviz.summary to read the result",
                happened=f"it raised {_describe(error)}",
                fix="release draws shaped (chain, draw, n_params) with at least 2 draws",
            ) from error

    def check_no_leak(self) -> str | None:
        """No private value outside the released posterior: the records' float values and their
        aggregates are searched for in every attribute, every non-posterior group, the netCDF
        bytes, and the warnings, log records and output of the fit (see :func:`find_leaks`)."""
        fit, _ = self.first
        data = self.compiled.data()
        if not _Sentinels.of(data):
            return (
                "the model's records hold no distinctive float values to look for; pass "
                "model= a builder with float records (e.g. dpppl.testing.gamma_exponential_data)"
            )
        with tempfile.TemporaryDirectory() as folder:
            path = Path(folder) / "result.nc"
            fit.result.to_netcdf(path)
            blob = path.read_bytes()
        leaks = find_leaks(fit.result, data, texts=fit.captured.texts(), netcdf=blob)
        if leaks:
            shown = "\n  ".join(leaks[:8])
            more = f"\n  ... and {len(leaks) - 8} more" if len(leaks) > 8 else ""
            raise self.fail(
                "no leak of private data",
                expected="no value of the private records, nor a sum, mean, extreme or other "
                "aggregate of them, anywhere outside the released posterior",
                happened=f"found {len(leaks)}:\n  {shown}{more}",
                fix="release only noisy quantities covered by the guarantee: remove the value "
                "from Release.attrs/groups/privacy, and never put data in warnings, log "
                "messages or printed output",
            )
        return None

    def check_seeds(self) -> None:
        """The same ``random_seed`` gives the same result; another seed gives another one."""
        first = self.first[0].result
        same = self.sample(self.seed).result
        other = self.sample(self.seed + 1).result
        if not _same_content(first, same):
            raise self.fail(
                "seeds respected",
                expected="two fits with the same random_seed to release identical results",
                happened="they differ",
                fix="draw every random number from the `seed` SeedSequence fit() receives "
                "(np.random.default_rng(seed), dpppl.privacy.jax_key(seed)), never from global "
                "state (np.random.*, time, os.urandom)",
            )
        if _same_content(first["posterior"], other["posterior"]):
            raise self.fail(
                "seeds respected",
                expected="fits with different seeds to release different posteriors",
                happened="they are identical: the release does not depend on the seed, so "
                "either the mechanism adds no noise or ignores the seed",
                fix="derive the noise (and every other random draw) from the `seed` fit() "
                "receives",
            )

    def check_refusals(self) -> str | None:
        """Bad input is refused with a dpppl error before anything runs: ε ≤ 0 or NaN, δ outside
        (0, 1), an unknown option and NaN data; ``fit`` is never called and the ledger is left
        as it was."""
        import dpppl

        ledger = self.ledger()
        bad_settings = [
            {"epsilon": 0.0},
            {"epsilon": -1.0},
            {"epsilon": math.nan},
            {"delta": 0.0},
            {"delta": 1.0},
        ]
        skipped = None
        with _counting_fits(self.cls) as calls:
            for bad in bad_settings:
                setting = {"epsilon": self.epsilon, "delta": self.delta, **bad}
                self._expect_refusal(
                    f"{bad}",
                    (InvalidPrivacyParameterError,),
                    lambda s=setting: dpppl.sample(
                        self.model, mechanism=self.name, ledger=ledger, progressbar=False,
                        accountant=self.accountant_name, **s, **self.options,
                    ),
                    ledger,
                )
            self._expect_refusal(
                "an unknown option",
                (TypeError,),
                lambda: dpppl.sample(
                    self.model, mechanism=self.name, epsilon=self.epsilon, delta=self.delta,
                    ledger=ledger, progressbar=False, **self.options,
                    conformance_unknown_option=1,
                ),
                ledger,
            )
            shared = [
                v.variable
                for v in self.compiled.structure.variables
                if v.dtype.startswith("float") and hasattr(v.variable, "set_value")
            ]
            if shared:
                original = shared[0].get_value()
                poisoned = np.array(original, copy=True)
                poisoned.flat[0] = np.nan
                shared[0].set_value(poisoned)
                try:
                    self._expect_refusal(
                        "NaN in the data",
                        (InvalidDataError,),
                        lambda: dpppl.sample(
                            self.model, mechanism=self.name, epsilon=self.epsilon,
                            delta=self.delta, ledger=ledger, progressbar=False,
                            accountant=self.accountant_name, **self.options,
                        ),
                        ledger,
                    )
                finally:
                    shared[0].set_value(original)
            else:
                skipped = (
                    "NaN data not tried: the model holds no float records in pm.Data (pass "
                    "model= a builder that does to check it)"
                )
        if calls:
            raise self.fail(
                "bad input refused before budget is spent",
                expected="no call of fit() for refused input",
                happened=f"fit() ran {len(calls)} time(s)",
                fix="validate options in Options.__post_init__ and everything else in "
                "check_model() or plan(), which run before the data are touched",
            )
        return skipped

    def _expect_refusal(
        self,
        what: str,
        errors: tuple[type[BaseException], ...],
        call: Callable[[], Any],
        ledger: PrivacyLedger | None,
    ) -> None:
        before = list(ledger.entries) if ledger is not None else None
        try:
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                call()
        except errors:
            pass
        except Exception as error:
            raise self.fail(
                "bad input refused before budget is spent",
                expected=f"{what} refused with {' or '.join(e.__name__ for e in errors)}",
                happened=f"it raised {_describe(error)}",
                fix="let the core's checks refuse it: do not catch or replace its errors",
            ) from error
        else:
            raise self.fail(
                "bad input refused before budget is spent",
                expected=f"{what} to be refused",
                happened="the fit ran",
                fix="keep the core's validation: call super().__init__(**options) and do not "
                "override dpppl's checks",
            )
        if ledger is not None and ledger.entries != before:
            raise self.fail(
                "bad input refused before budget is spent",
                expected=f"the ledger unchanged after refusing {what}",
                happened=f"it now holds {len(ledger.entries)} entries (it held {len(before)})",
                fix="do not charge a ledger from the mechanism; refuse input before plan()",
            )

    def check_declared_noise(self) -> str | None:
        """The release is no more distinguishable between two neighbouring data sets than the
        declared guarantee allows.

        The plan is made at ``noise_epsilon`` (small, so that a correct mechanism's releases on
        neighbours overlap almost entirely).  D is the model's data; D′ replaces one record by a
        canary (see :func:`_neighbour`).  Each statistic is the mean of a release's draws.
        ``noise_fits`` fits on each of D and D′ choose a direction (difference of the means) and
        a threshold (midpoint); ``noise_fits`` fresh fits on each then give, by
        :func:`epsilon_lower_bound`, a lower bound on ε valid with confidence
        1 − ``STATISTICAL_ALPHA``.  Under replace-one the claim is the plan's ε; under
        add/remove, a replacement is two steps, so the claim is (2ε, (1 + e^ε)δ) by group
        privacy.  A bound above the claim fails: the noise is smaller than declared, absent,
        or added to a statistic whose sensitivity is larger than the event says (no
        clipping).  It catches gross errors only (a lower bound from a few dozen fits), never
        proves a guarantee.
        """
        from dpppl.sampling import run_mechanism

        if not self.accounted:
            return "the guarantee is not (epsilon, delta)-DP from an accountant"
        plan, _ = self.plan_at(self.noise_epsilon)
        mechanism = self.mechanism()
        data = self.compiled.data()
        neighbour, how = _neighbour(data, self.compiled)
        seeds = np.random.SeedSequence([self.seed, 20240611]).spawn(4 * self.noise_fits)

        def means(dataset: Mapping[str, np.ndarray], batch: Sequence) -> np.ndarray:
            out = []
            for seed in batch:
                with warnings.catch_warnings():
                    warnings.simplefilter("ignore")
                    release, _ = run_mechanism(
                        mechanism, self.compiled, dict(dataset), plan,
                        random_seed=seed.generate_state(4), progressbar=False,
                    )
                draws = np.asarray(release.draws, dtype=float)
                out.append(draws.reshape(-1, self.compiled.n_params).mean(axis=0))
            return np.array(out)

        k = self.noise_fits
        choose_d, choose_n = means(data, seeds[:k]), means(neighbour, seeds[k : 2 * k])
        direction = choose_d.mean(axis=0) - choose_n.mean(axis=0)
        if not np.any(direction):
            direction = np.eye(self.compiled.n_params)[0]
        threshold = 0.5 * float((choose_d.mean(axis=0) + choose_n.mean(axis=0)) @ direction)
        scores_d = means(data, seeds[2 * k : 3 * k]) @ direction
        scores_n = means(neighbour, seeds[3 * k :]) @ direction
        if plan.relation is NeighbourRelation.REPLACE_ONE:
            claim, claim_delta = plan.epsilon, plan.delta
        else:
            claim, claim_delta = 2 * plan.epsilon, (1 + math.exp(plan.epsilon)) * plan.delta
        bound = epsilon_lower_bound(scores_d, scores_n, threshold, claim_delta)
        if bound > claim:
            above = int(np.sum(scores_d > threshold)), int(np.sum(scores_n > threshold))
            raise self.fail(
                "declared noise",
                expected=f"releases on neighbouring data sets (D′: {how}) no more "
                f"distinguishable than epsilon={claim:.3g} allows (the plan's "
                f"epsilon={plan.epsilon:.3g}, noise multiplier {plan.noise_multiplier}, for "
                f"{plan.relation.value})",
                happened=f"a threshold on the posterior mean told them apart in {above[0]}/{k} "
                f"fits on D and {k - above[1]}/{k} on D′: epsilon is at least {bound:.3g} with "
                f"confidence {1 - STATISTICAL_ALPHA:g}",
                fix="add the planned noise (noise multiplier x sensitivity) to what you release, "
                "clip each record's contribution to the sensitivity the event assumes, and make "
                "the event describe exactly what fit() does (steps, sampling)",
            )
        return None

    def check_tarp(self) -> str | None:
        """``dpppl.tarp`` runs the mechanism on a few simulated data sets and returns finite
        coverage marked as spending no budget."""
        import dpppl
        from dpppl.simulation import simulator

        try:
            sim = simulator(self.compiled)
        except ModelNotSupportedError as error:
            return f"the model cannot be simulated from ({error})"
        extra: dict[str, Any] = {}
        if sim.covariate_names:
            extra["use_private_covariates"] = True
        try:
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                study = dpppl.tarp(
                    self.model, mechanism=self.name, epsilon=self.epsilon, delta=self.delta,
                    accountant=self.accountant_name, n_simulations=self.tarp_simulations,
                    n_workers=1, progressbar=False, random_seed=self.seed, **extra,
                    **self.options,
                )
        except Exception as error:
            raise self.fail(
                "TARP smoke run",
                expected=f"dpppl.tarp to fit the mechanism on {self.tarp_simulations} simulated "
                "data sets",
                happened=f"it raised {_describe(error)}",
                fix="fit() must work on any data set of the model's shape, given as the `data` "
                "argument (never read model.data() inside fit), and its Release must be "
                "picklable settings-wise",
            ) from error
        if "ecp" not in study or not np.all(np.isfinite(study["ecp"].values)):
            raise self.fail(
                "TARP smoke run",
                expected="finite expected coverage (ecp)",
                happened="the study's ecp is missing or not finite",
                fix="release finite draws of the unconstrained parameters",
            )
        if study.attrs.get("privacy_budget_spent") != ("not private" if extra else "none"):
            raise self.fail(  # pragma: no cover - set by the core
                "TARP smoke run",
                expected="the study marked as spending no budget",
                happened=f"privacy_budget_spent={study.attrs.get('privacy_budget_spent')!r}",
                fix="run the study through dpppl.tarp",
            )
        return None


def _gaussian_noise_multipliers(event: PrivacyEvent) -> list[float]:
    if isinstance(event, GaussianEvent):
        return [event.noise_multiplier]
    children = getattr(event, "events", None) or (
        [event.event] if hasattr(event, "event") else []
    )
    return [s for child in children for s in _gaussian_noise_multipliers(child)]


def _same_content(a: xr.DataTree, b: xr.DataTree) -> bool:
    """Whether two results hold the same groups with identical values (attributes aside)."""
    nodes_a = {node.path: node.to_dataset(inherit=False) for node in a.subtree}
    nodes_b = {node.path: node.to_dataset(inherit=False) for node in b.subtree}
    if set(nodes_a) != set(nodes_b):
        return False
    for path, dataset in nodes_a.items():
        other = nodes_b[path]
        if set(dataset.variables) != set(other.variables):
            return False
        for name, variable in dataset.variables.items():
            values = variable.values
            if not np.array_equal(values, other[name].values, equal_nan=values.dtype.kind in "fc"):
                return False
    return True


def mechanism_checks(
    name_or_class: str | type[Mechanism],
    *,
    options: Mapping[str, Any] | None = None,
    model: Callable[[np.random.Generator], pm.Model] | None = None,
    epsilon: float = 1.0,
    delta: float = 1e-5,
    accountant: str | None = None,
    noise_epsilon: float = 0.1,
    noise_fits: int = 30,
    tarp_simulations: int = 3,
    random_seed: int = 0,
) -> list[Check]:
    """The conformance checks of a mechanism plugin, one :class:`Check` per contract.

    They share one model, plan and fit (built on first use), so running them all costs about
    what :func:`check_mechanism` does.  Parametrise a pytest test over them to see each contract
    pass or fail on its own::

        @pytest.mark.parametrize("check", mechanism_checks("my-mechanism"), ids=str)
        def test_conformance(check):
            check()

    Parameters are those of :func:`check_mechanism`.
    """
    h = _MechanismHarness(
        name_or_class,
        options=options,
        model=model,
        epsilon=epsilon,
        delta=delta,
        accountant=accountant,
        noise_epsilon=noise_epsilon,
        noise_fits=noise_fits,
        tarp_simulations=tarp_simulations,
        random_seed=random_seed,
    )
    return [
        Check("registration", h.check_registration),
        Check("declared privacy event", h.check_privacy_event),
        Check("result layout", h.check_result_layout),
        Check("no leak of private data", h.check_no_leak),
        Check("seeds respected", h.check_seeds),
        Check("bad input refused before budget is spent", h.check_refusals),
        Check("declared noise", h.check_declared_noise),
        Check("TARP smoke run", h.check_tarp),
    ]


def check_mechanism(
    name_or_class: str | type[Mechanism],
    *,
    options: Mapping[str, Any] | None = None,
    model: Callable[[np.random.Generator], pm.Model] | None = None,
    epsilon: float = 1.0,
    delta: float = 1e-5,
    accountant: str | None = None,
    noise_epsilon: float = 0.1,
    noise_fits: int = 30,
    tarp_simulations: int = 3,
    random_seed: int = 0,
) -> ConformanceReport:
    """Check that a mechanism plugin keeps every contract of dpppl; raise on the first broken one.

    The contracts, in order (each is a :class:`Check` of :func:`mechanism_checks`):

    registration
        Registered through the ``register_mechanisms`` hook under its ``name``; options are a
        dataclass; unknown options are refused.
    declared privacy event
        The plan's event, accounted by the plan's accountant at the plan's δ, gives at most the
        plan's ε, which lies within ``CALIBRATION_RTOL`` below the target; the event claims no
        more noise than the plan's noise multiplier and depends on it; it survives JSON.  Mechanisms whose
        guarantee is of another kind (no event) must say so and name no accountant.
    result layout
        ``dpppl.sample`` gives a DataTree whose ``posterior`` holds every free variable with
        ``chain`` and ``draw`` dims and finite values; no ``observed_data`` or other
        per-record group; ``dp_*`` attributes that agree with the plan; a ledger charged once
        with the declared event; it survives ``to_netcdf`` and ``arviz.summary``.
    no leak of private data
        :func:`find_leaks`: no record value or aggregate in attributes, non-posterior groups,
        netCDF bytes, warnings, log records or printed output.
    seeds respected
        The same seed gives the same result; another seed another posterior.
    bad input refused before budget is spent
        ε ≤ 0 or NaN, δ outside (0, 1), unknown options and NaN data are refused with dpppl's
        errors, without calling ``fit`` or charging the ledger.
    declared noise
        A statistical test (``2 · noise_fits`` fits on each of two neighbouring data sets) that
        the release is not more distinguishable than the declared (ε, δ) allows; see
        :meth:`_MechanismHarness.check_declared_noise`.  Only for (ε, δ)-DP mechanisms.
    TARP smoke run
        ``dpppl.tarp`` with ``tarp_simulations`` simulated data sets gives finite coverage.

    Parameters
    ----------
    name_or_class
        The mechanism's name (as users pass ``mechanism=``) or its class; either must be
        registered (installed through its entry point, or ``dpppl.plugins.register_plugin``).
    options
        Mechanism options for every fit: choose fast settings (few steps and draws).
    model
        A builder ``rng -> pm.Model`` of a model the mechanism supports; by default
        :func:`gamma_exponential_data` (float records in ``pm.Data``: the leak and NaN checks
        need both).
    epsilon, delta
        The guarantee of the fits.
    accountant
        The accountant to use; the mechanism's preferred installed one when None.
    noise_epsilon
        ε of the declared-noise test (small ε makes a correct mechanism's releases overlap).
    noise_fits
        Fits per data set and per half of the declared-noise test (4 × this many fits in all).
    tarp_simulations
        Simulated data sets of the TARP smoke run.
    random_seed
        Seed of the data, the fits and the test; the outcome is reproducible.

    Returns
    -------
    ConformanceReport
        The checks that passed and those skipped (with the reason).

    Raises
    ------
    ConformanceError
        At the first broken contract, with a message that says which, what was expected,
        what happened and what to change.
    """
    checks = mechanism_checks(
        name_or_class,
        options=options,
        model=model,
        epsilon=epsilon,
        delta=delta,
        accountant=accountant,
        noise_epsilon=noise_epsilon,
        noise_fits=noise_fits,
        tarp_simulations=tarp_simulations,
        random_seed=random_seed,
    )
    name = name_or_class if isinstance(name_or_class, str) else name_or_class.name
    return _run_all(name, checks)


# -- accountants -----------------------------------------------------------------------------------


class _UnsupportedEvent(PrivacyEvent):
    """An event kind no accountant knows: accountants must refuse it with a dpppl error."""

    kind = "conformance_unsupported"

    def to_dict(self) -> dict[str, Any]:
        return {"kind": self.kind}

    @classmethod
    def _from_dict(cls, data: dict[str, Any]) -> _UnsupportedEvent:
        return cls()

    def __eq__(self, other: object) -> bool:
        return isinstance(other, _UnsupportedEvent)

    def __hash__(self) -> int:
        return hash(self.kind)


#: Events of the accountant checks, as functions of σ: one Gaussian release and DP-SGD's
#: Poisson-subsampled Gaussian (q = 0.1, 10 steps).  The composition check composes them further.
DEFAULT_EVENTS: dict[str, Callable[[float], PrivacyEvent]] = {
    "gaussian": GaussianEvent,
    "poisson_subsampled_gaussian": lambda sigma: poisson_subsampled_gaussian(sigma, 0.1, 10),
}


class _AccountantHarness:
    def __init__(
        self,
        name_or_class: str | type[Accountant],
        *,
        events: Mapping[str, Callable[[float], PrivacyEvent]] | None,
        delta: float,
        noise_multipliers: Sequence[float],
        targets: Sequence[float],
    ):
        self.requested = name_or_class
        self.name = name_or_class if isinstance(name_or_class, str) else name_or_class.name
        self.events = dict(events or DEFAULT_EVENTS)
        self.delta = float(delta)
        self.sigmas = sorted(float(s) for s in noise_multipliers)
        self.targets = [float(t) for t in targets]

    def fail(self, contract: str, *, expected: str, happened: str, fix: str) -> ConformanceError:
        return ConformanceError(
            contract, f"accountant {self.name!r}", expected=expected, happened=happened, fix=fix
        )

    @cached_property
    def accountant(self) -> Accountant:
        try:
            cls = get_accountant(self.name)
        except PluginNotFoundError as error:
            raise self.fail(
                "registration",
                expected=f"an accountant named {self.name!r} registered through the "
                "register_accountants hook",
                happened=f"dpppl does not know it ({error})",
                fix="implement `@dpppl.hookimpl def register_accountants(register): "
                "register(YourAccountant)`, name the module under [project.entry-points.dpppl] "
                "in pyproject.toml and reinstall",
            ) from None
        if not isinstance(self.requested, str) and cls is not self.requested:
            raise self.fail(
                "registration",
                expected=f"{self.requested.__qualname__} registered under {self.name!r}",
                happened=f"{self.name!r} is registered as {cls.__qualname__}",
                fix="give the accountant a unique `name`",
            )
        return cls()

    @cached_property
    def supported(self) -> list[tuple[str, NeighbourRelation]]:
        """(event family, relation) pairs the accountant accepts (``check`` does not refuse)."""
        pairs = []
        for family, event_for in self.events.items():
            for relation in NeighbourRelation:
                try:
                    self.accountant.check(event_for(1.0), relation)
                except UnsupportedEventError:
                    continue
                except Exception as error:
                    raise self.fail(
                        "refusal of unsupported events",
                        expected="check() to return None or raise UnsupportedEventError",
                        happened=f"for {family} under {relation.value} it raised "
                        f"{_describe(error)}",
                        fix="raise dpppl.UnsupportedEventError with the reason",
                    ) from error
                pairs.append((family, relation))
        if not pairs:
            raise self.fail(
                "registration",
                expected=f"support for at least one of the events {sorted(self.events)}",
                happened="check() refuses them all",
                fix="support GaussianEvent at least, or pass events= the kinds you support",
            )
        return pairs

    def epsilon(self, event: PrivacyEvent, relation: NeighbourRelation, what: str) -> float:
        try:
            eps = float(self.accountant.epsilon(event, delta=self.delta, relation=relation))
        except Exception as error:
            raise self.fail(
                "epsilon",
                expected=f"epsilon() of a supported event ({what})",
                happened=f"it raised {_describe(error)}",
                fix="account every event check() accepts",
            ) from error
        if not (math.isfinite(eps) and eps >= 0):
            raise self.fail(
                "epsilon",
                expected=f"a finite epsilon >= 0 ({what})",
                happened=f"epsilon() returned {eps!r}",
                fix="return an upper bound on epsilon as a float",
            )
        return eps

    def check_registration(self) -> None:
        """Registered through the ``register_accountants`` hook under its ``name``."""
        self.accountant  # noqa: B018 - resolving it is the check
        _ = self.supported

    def check_monotone(self) -> None:
        """ε(δ) never increases with σ, for every supported event family and relation."""
        for family, relation in self.supported:
            values = [
                self.epsilon(self.events[family](s), relation, f"{family}, sigma={s:g}")
                for s in self.sigmas
            ]
            for (s1, e1), (s2, e2) in zip(
                zip(self.sigmas, values, strict=True),
                zip(self.sigmas[1:], values[1:], strict=True),
                strict=False,
            ):
                if e2 > e1 * (1 + _ORDER_RTOL):
                    raise self.fail(
                        "epsilon monotone in sigma",
                        expected=f"epsilon at sigma={s2:g} <= epsilon at sigma={s1:g} "
                        f"({family}, {relation.value}, delta={self.delta:g})",
                        happened=f"{e2:.6g} > {e1:.6g}",
                        fix="more noise can only make a release more private: check the "
                        "conversion to (epsilon, delta) and any discretisation",
                    )

    def check_exact_gaussian(self) -> str | None:
        """ε of one Gaussian release is never below the exact ε of the Gaussian mechanism
        (an accountant reports an upper bound, never an estimate below the truth)."""
        relations = [r for f, r in self.supported if f == "gaussian"]
        if "gaussian" not in self.events or not relations:
            return "the accountant does not account GaussianEvent"
        for relation in relations:
            for sigma in self.sigmas:
                eps = self.epsilon(GaussianEvent(sigma), relation, f"gaussian, sigma={sigma:g}")
                exact = exact_gaussian_epsilon(sigma, self.delta)
                if eps < exact * (1 - _EXACT_RTOL):
                    raise self.fail(
                        "upper bound on epsilon",
                        expected=f"epsilon >= the exact {exact:.8g} of one Gaussian release "
                        f"at sigma={sigma:g}, delta={self.delta:g} ({relation.value})",
                        happened=f"it reports {eps:.8g}, below the truth",
                        fix="report a pessimistic bound (round the privacy loss up, add the "
                        "numerical error bound) instead of an estimate; the noise multiplier "
                        "is relative to the L2 sensitivity under the declared relation",
                    )
        return None

    def check_calibration(self) -> None:
        """``noise_multiplier`` finds σ whose ε lies in [(1 − CALIBRATION_RTOL)·target, target]
        for every target and supported event family, never above the target."""
        for family, relation in self.supported:
            event_for = self.events[family]
            for target in self.targets:
                try:
                    sigma = float(
                        self.accountant.noise_multiplier(
                            event_for, epsilon=target, delta=self.delta, relation=relation
                        )
                    )
                except Exception as error:
                    raise self.fail(
                        "calibration",
                        expected=f"a noise multiplier for epsilon={target:g} ({family}, "
                        f"{relation.value})",
                        happened=f"noise_multiplier() raised {_describe(error)}",
                        fix="keep the default noise_multiplier (dpppl.calibrate_noise_multiplier)"
                        " or make yours handle this event",
                    ) from error
                eps = self.epsilon(event_for(sigma), relation, f"{family}, sigma={sigma:g}")
                low = (1 - CALIBRATION_RTOL) * target
                if eps > target * (1 + _ORDER_RTOL):
                    raise self.fail(
                        "calibration",
                        expected=f"epsilon <= the target {target:g} at the calibrated sigma "
                        f"({family}, {relation.value})",
                        happened=f"sigma={sigma:.6g} gives epsilon={eps:.6g}: calibration "
                        "overshoots",
                        fix="return a sigma at which epsilon() itself is at most the target "
                        "(dpppl.calibrate_noise_multiplier does)",
                    )
                if eps < low:
                    raise self.fail(
                        "calibration",
                        expected=f"epsilon within {CALIBRATION_RTOL:.0%} below the target, in "
                        f"[{low:.6g}, {target:g}] ({family}, {relation.value})",
                        happened=f"sigma={sigma:.6g} gives epsilon={eps:.6g}: more noise than "
                        "needed",
                        fix="stop the search only inside the band (dpppl.calibration."
                        "CALIBRATION_RTOL)",
                    )

    def check_composition(self) -> None:
        """Composing never gives less than one part: ε(A then B) ≥ max(ε(A), ε(B)) and
        ε(A three times) ≥ ε(A twice) ≥ ε(A)."""
        for family, relation in self.supported:
            a = self.events[family](self.sigmas[0])
            b = self.events[family](self.sigmas[-1])
            single = {e: self.epsilon(e, relation, f"{family}") for e in (a, b)}
            checks = [
                (ComposedEvent((a, b)), max(single.values()), "A then B", "the larger part"),
                (SelfComposedEvent(a, 2), single[a], "A twice", "A once"),
                (SelfComposedEvent(a, 3), None, "A three times", "A twice"),
            ]
            previous = single[a]
            for event, floor, what, than in checks:
                eps = self.epsilon(event, relation, f"{family}: {what}")
                floor = previous if floor is None else floor
                if eps < floor * (1 - _ORDER_RTOL):
                    raise self.fail(
                        "composition",
                        expected=f"epsilon of {what} >= epsilon of {than} ({family}, "
                        f"{relation.value})",
                        happened=f"{eps:.6g} < {floor:.6g}",
                        fix="compose the parts' privacy loss distributions (or RDP curves); "
                        "never average them",
                    )
                previous = eps

    def check_delta(self) -> None:
        """δ(ε) is in [0, 1], never increases with ε, and δ at the accountant's own ε(δ₀) is at
        most δ₀ (within 1 %)."""
        for family, relation in self.supported:
            event = self.events[family](1.0)
            eps0 = self.epsilon(event, relation, family)
            grid = sorted({0.5 * eps0, eps0, 2 * eps0})
            try:
                deltas = [
                    float(self.accountant.delta(event, epsilon=e, relation=relation)) for e in grid
                ]
            except Exception as error:
                raise self.fail(
                    "delta",
                    expected=f"delta() of a supported event ({family}, {relation.value})",
                    happened=f"it raised {_describe(error)}",
                    fix="account every event check() accepts",
                ) from error
            at_eps0 = deltas[grid.index(eps0)]
            ordered = all(d2 <= d1 * (1 + _ORDER_RTOL) for d1, d2 in zip(deltas, deltas[1:]))
            if not (all(0 <= d <= 1 for d in deltas) and ordered):
                raise self.fail(
                    "delta",
                    expected=f"delta(epsilon) in [0, 1] and non-increasing ({family}, "
                    f"{relation.value})",
                    happened=f"at epsilon={[round(e, 4) for e in grid]} it gives {deltas}",
                    fix="return an upper bound on delta for the given epsilon",
                )
            if at_eps0 > self.delta * 1.01:
                raise self.fail(
                    "delta",
                    expected=f"delta(epsilon(delta0)) <= delta0={self.delta:g} ({family}, "
                    f"{relation.value})",
                    happened=f"delta at epsilon={eps0:.6g} is {at_eps0:.6g}: epsilon() and "
                    "delta() disagree",
                    fix="compute epsilon() and delta() from the same privacy curve",
                )

    def check_refusal(self) -> None:
        """An event kind the accountant does not know, and δ outside (0, 1), are refused with
        dpppl errors (UnsupportedEventError; any DPPPLError for δ), not library exceptions."""
        relation = NeighbourRelation.ADD_OR_REMOVE_ONE
        calls = {
            "check()": lambda: self.accountant.check(_UnsupportedEvent(), relation),
            "epsilon()": lambda: self.accountant.epsilon(
                _UnsupportedEvent(), delta=self.delta, relation=relation
            ),
        }
        for what, call in calls.items():
            try:
                call()
            except UnsupportedEventError:
                continue
            except Exception as error:
                raise self.fail(
                    "refusal of unsupported events",
                    expected=f"{what} of an unknown event kind to raise UnsupportedEventError",
                    happened=f"it raised {_describe(error)}",
                    fix="check the event's type and raise dpppl.UnsupportedEventError saying "
                    "which kinds you account",
                ) from error
            raise self.fail(
                "refusal of unsupported events",
                expected=f"{what} of an unknown event kind to raise UnsupportedEventError",
                happened="it returned normally",
                fix="refuse event kinds you do not know instead of guessing",
            )
        family, rel = self.supported[0]
        for bad in (0.0, 1.0, math.nan):
            try:
                self.accountant.epsilon(self.events[family](1.0), delta=bad, relation=rel)
            except DPPPLError:
                continue
            except Exception as error:
                raise self.fail(
                    "refusal of unsupported events",
                    expected=f"delta={bad} refused with InvalidPrivacyParameterError",
                    happened=f"it raised {_describe(error)}",
                    fix="validate delta (dpppl.accounting.check_epsilon_delta)",
                ) from error
            raise self.fail(
                "refusal of unsupported events",
                expected=f"delta={bad} refused with InvalidPrivacyParameterError",
                happened="epsilon() returned a value",
                fix="validate delta (dpppl.accounting.check_epsilon_delta)",
            )


def accountant_checks(
    name_or_class: str | type[Accountant],
    *,
    events: Mapping[str, Callable[[float], PrivacyEvent]] | None = None,
    delta: float = 1e-5,
    noise_multipliers: Sequence[float] = (1.0, 2.0, 4.0),
    targets: Sequence[float] = (1.0,),
) -> list[Check]:
    """The conformance checks of an accountant plugin, one :class:`Check` per contract
    (parameters as in :func:`check_accountant`)."""
    h = _AccountantHarness(
        name_or_class, events=events, delta=delta, noise_multipliers=noise_multipliers,
        targets=targets,
    )
    return [
        Check("registration", h.check_registration),
        Check("epsilon monotone in sigma", h.check_monotone),
        Check("upper bound on epsilon", h.check_exact_gaussian),
        Check("calibration", h.check_calibration),
        Check("composition", h.check_composition),
        Check("delta", h.check_delta),
        Check("refusal of unsupported events", h.check_refusal),
    ]


def check_accountant(
    name_or_class: str | type[Accountant],
    *,
    events: Mapping[str, Callable[[float], PrivacyEvent]] | None = None,
    delta: float = 1e-5,
    noise_multipliers: Sequence[float] = (1.0, 2.0, 4.0),
    targets: Sequence[float] = (1.0,),
) -> ConformanceReport:
    """Check that an accountant plugin keeps every contract of dpppl; raise on the first broken one.

    Contracts (each a :class:`Check` of :func:`accountant_checks`), on every event family of
    ``events`` and neighbour relation that ``check()`` accepts:

    registration
        Registered through the ``register_accountants`` hook under its ``name``; accepts at
        least one event family.
    epsilon monotone in sigma
        ε at ``delta`` never increases as σ grows over ``noise_multipliers``.
    upper bound on epsilon
        For one Gaussian release, ε is at least the exact ε of the Gaussian mechanism.
    calibration
        ``noise_multiplier()`` for each of ``targets`` gives ε in
        [(1 − ``CALIBRATION_RTOL``)·target, target], never over.
    composition
        ε(A then B) ≥ max(ε(A), ε(B)); ε(3 × A) ≥ ε(2 × A) ≥ ε(A).
    delta
        δ(ε) in [0, 1], non-increasing, and consistent with ε(δ).
    refusal of unsupported events
        An unknown event kind raises ``UnsupportedEventError`` from ``check()`` and
        ``epsilon()``; δ outside (0, 1) raises a dpppl error.

    Parameters
    ----------
    name_or_class
        The accountant's name (as users pass ``accountant=``) or its registered class.
    events
        Event families ``σ -> PrivacyEvent``, by name (default :data:`DEFAULT_EVENTS`).
    delta
        δ of every ε asked for.
    noise_multipliers
        σ grid of the monotonicity, exactness and composition checks.
    targets
        ε targets of the calibration check.

    Returns
    -------
    ConformanceReport

    Raises
    ------
    ConformanceError
        At the first broken contract.
    """
    checks = accountant_checks(
        name_or_class, events=events, delta=delta, noise_multipliers=noise_multipliers,
        targets=targets,
    )
    name = name_or_class if isinstance(name_or_class, str) else name_or_class.name
    return _run_all(name, checks)
