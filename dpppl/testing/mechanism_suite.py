"""The conformance suite of mechanism plugins: :func:`mechanism_checks` (one :class:`Check` per
contract) and :func:`check_mechanism` (all of them in one call)."""

from __future__ import annotations

import contextlib
import dataclasses
import math
import tempfile
import warnings
from collections.abc import Callable, Iterator, Mapping
from functools import partial
from pathlib import Path
from typing import Any

import numpy as np
import pymc as pm
import xarray as xr

from dpppl.errors import (
    InvalidDataError,
    InvalidPrivacyParameterError,
    ModelNotSupportedError,
)
from dpppl.ledger import PrivacyLedger
from dpppl.plugin.mechanism import APPROXIMATE_DP, Mechanism
from dpppl.plugin.registry import get_accountant, registry
from dpppl.privacy.events import GaussianEvent, PrivacyEvent, event_from_json
from dpppl.privacy.noise_calibration import CALIBRATION_RTOL
from dpppl.results import FORBIDDEN_GROUPS, PrivacyMetadata
from dpppl.testing.checks import (
    ORDER_RTOL,
    Check,
    ConformanceReport,
    describe,
    run_all,
)
from dpppl.testing.harness import MechanismHarness
from dpppl.testing.leaks import Sentinels, find_leaks
from dpppl.testing.noise_audit import check_declared_noise


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


class MechanismChecks(MechanismHarness):
    """The contracts of a mechanism plugin, one ``check_*`` method each, on the shared state."""

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
        at the plan's :attr:`~dpppl.plugin.mechanism.PrivacyPlan.event_delta`, plus twice its
        ``max_divergence``, by at most the plan's ε (≤ the target, ≥ (1 − CALIBRATION_RTOL) of it);
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
        if not (1 - CALIBRATION_RTOL) * target <= plan.epsilon <= target * (1 + ORDER_RTOL):
            raise self.fail(
                "declared privacy event",
                expected=f"a planned epsilon in [{(1 - CALIBRATION_RTOL) * target:.6g}, "
                f"{target:g}] (calibration within {CALIBRATION_RTOL:.0%} below the target)",
                happened=f"the plan says epsilon={plan.epsilon:.6g}",
                fix="let the accountant calibrate the noise (accountant.noise_multiplier or "
                "dpppl.calibrate_noise_multiplier) instead of choosing it by hand",
            )
        accountant = get_accountant(plan.accountant)()
        # δ spent outside the event (extra_delta) is not the event's to use, and a
        # max-divergence γ takes a factor e^γ of the rest and 2γ of ε.
        event_delta = plan.event_delta
        bound = accountant.epsilon(plan.event, delta=event_delta, relation=plan.relation)
        bound += 2 * plan.max_divergence
        if bound > plan.epsilon * (1 + 1e-6):
            raise self.fail(
                "declared privacy event",
                expected=f"the accountant {plan.accountant!r} to bound the declared event by at "
                f"most the planned epsilon={plan.epsilon:.6g} at delta={event_delta:g} (the "
                "plan's delta less its extra_delta, times e^-max_divergence; plus "
                "2 max_divergence)",
                happened=f"it bounds it by {bound:.6g}: the plan claims more privacy than the "
                f"event it declares ({plan.event.to_json()})",
                fix="take the plan's epsilon from the accountant for exactly the declared event",
            )
        if event_from_json(plan.event.to_json()) != plan.event:
            raise self.fail(
                "declared privacy event",
                expected="the event to survive to_json()/event_from_json()",
                happened=f"{plan.event.to_json()} reads back differently",
                fix="build events from dpppl.privacy.events classes only",
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
                    happened=f"it gives {again.to_json()}, the plan holds {plan.event.to_json()}",
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
        missing = sorted({rv.name for rv in self.model.free_RVs} - set(posterior.data_vars))
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
        plan = self.plan
        try:
            meta = PrivacyMetadata.from_result(result)
        except (KeyError, TypeError, ValueError) as error:
            raise self.fail(
                "result layout",
                expected="the dp_* privacy attributes dpppl.sample writes",
                happened=f"they cannot be read: {describe(error)}",
                fix="report corrections in Release.privacy and Release.attrs only; the core "
                "writes the attributes",
            ) from error
        checks = {
            "dp_mechanism": (meta.mechanism, self.name),
            "dp_neighbour_relation": (meta.neighbour_relation.value, plan.relation.value),
            "dp_event": (
                meta.event.to_json() if meta.event is not None else "none",
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
        if self.accounted and meta.epsilon > self.epsilon * (1 + ORDER_RTOL):
            raise self.fail(
                "result layout",
                expected=f"dp_epsilon at most the requested {self.epsilon}",
                happened=f"dp_epsilon={meta.epsilon}",
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
                    stored_epsilon = PrivacyMetadata.from_result(stored).epsilon
                    stored_groups = set(stored.children)
            except Exception as error:
                raise self.fail(
                    "result layout",
                    expected="the result to survive to_netcdf and open_datatree",
                    happened=f"it raised {describe(error)}",
                    fix="keep group values numeric or string arrays and attributes JSON-like "
                    "(str, int, float): put structured values in Release.attrs, which the core "
                    "serialises",
                ) from error
        if stored_epsilon != meta.epsilon or stored_groups != set(result.children):
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
                happened=f"it raised {describe(error)}",
                fix="release draws shaped (chain, draw, n_params) with at least 2 draws",
            ) from error

    def check_no_leak(self) -> str | None:
        """No private value outside the released posterior: the records' float values and their
        aggregates are searched for in every attribute, every non-posterior group, the netCDF
        bytes, and the warnings, log records and output of the fit (see :func:`find_leaks`)."""
        fit, _ = self.first
        data = self.compiled.data()
        if not Sentinels.of(data):
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
                "(np.random.default_rng(seed), dpppl.plugin.jax_key(seed)), never from global "
                "state (np.random.*, time, os.urandom)",
            )
        if _same_content(first["posterior"], other["posterior"]):
            raise self.fail(
                "seeds respected",
                expected="fits with different seeds to release different posteriors",
                happened="they are identical: the release does not depend on the seed, so "
                "either the mechanism adds no noise or ignores the seed",
                fix="derive the noise (and every other random draw) from the `seed` fit() receives",
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
                        self.model,
                        mechanism=self.name,
                        ledger=ledger,
                        progressbar=False,
                        accountant=self.accountant_name,
                        **s,
                        **self.options,
                    ),
                    ledger,
                )
            self._expect_refusal(
                "an unknown option",
                (TypeError,),
                lambda: dpppl.sample(
                    self.model,
                    mechanism=self.name,
                    epsilon=self.epsilon,
                    delta=self.delta,
                    ledger=ledger,
                    progressbar=False,
                    **self.options,
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
                            self.model,
                            mechanism=self.name,
                            epsilon=self.epsilon,
                            delta=self.delta,
                            ledger=ledger,
                            progressbar=False,
                            accountant=self.accountant_name,
                            **self.options,
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
                happened=f"it raised {describe(error)}",
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

    def check_tarp(self) -> str | None:
        """``dpppl.tarp`` runs the mechanism on a few simulated data sets and returns finite
        coverage marked as spending no budget."""
        import dpppl
        from dpppl.model.simulation import simulator

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
                    self.model,
                    mechanism=self.name,
                    epsilon=self.epsilon,
                    delta=self.delta,
                    accountant=self.accountant_name,
                    n_simulations=self.tarp_simulations,
                    n_workers=1,
                    progressbar=False,
                    random_seed=self.seed,
                    **extra,
                    **self.options,
                )
        except Exception as error:
            raise self.fail(
                "TARP smoke run",
                expected=f"dpppl.tarp to fit the mechanism on {self.tarp_simulations} simulated "
                "data sets",
                happened=f"it raised {describe(error)}",
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
    children = getattr(event, "events", None) or ([event.event] if hasattr(event, "event") else [])
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
    h = MechanismChecks(
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
        Check("declared noise", partial(check_declared_noise, h)),
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
        The plan's event, accounted by the plan's accountant at the plan's δ less its
        ``extra_delta`` (times e^(−``max_divergence``), plus 2 ``max_divergence``), gives at most
        the plan's ε, which lies within ``CALIBRATION_RTOL`` below the target; the event claims no
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
        :func:`dpppl.testing.noise_audit._check_declared_noise`.  Only for (ε, δ)-DP mechanisms.
    TARP smoke run
        ``dpppl.tarp`` with ``tarp_simulations`` simulated data sets gives finite coverage.

    Parameters
    ----------
    name_or_class
        The mechanism's name (as users pass ``mechanism=``) or its class; either must be
        registered (installed through its entry point, or ``dpppl.plugin.registry.register_plugin``).
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
    return run_all(name, checks)
