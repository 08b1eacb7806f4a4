"""The state one mechanism's conformance checks share: the model, the privacy plan and one fit,
built once (:class:`MechanismHarness`).  :mod:`dpppl.testing.mechanism_suite` and
:mod:`dpppl.testing.noise_audit` run their checks on it."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from functools import cached_property
from typing import Any

import numpy as np
import pymc as pm
import xarray as xr

from dpppl.errors import (
    DPPPLError,
    ModelNotSupportedError,
    PluginError,
    PluginNotFoundError,
)
from dpppl.ledger import PrivacyLedger
from dpppl.model.record_model import RecordModel, record_model
from dpppl.plugin.accountant import Accountant
from dpppl.plugin.mechanism import APPROXIMATE_DP, Mechanism, PrivacyPlan
from dpppl.plugin.registry import get_mechanism, provider
from dpppl.results import FORBIDDEN_GROUPS
from dpppl.testing.checks import (
    ConformanceError,
    describe,
)
from dpppl.testing.leaks import Captured, capture
from dpppl.testing.models import gamma_exponential_data


@dataclass
class SuiteFit:
    """One run of ``dpppl.sample`` and what it said."""

    result: xr.DataTree
    captured: Captured


class MechanismHarness:
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
                happened=f"the constructor raised {describe(error)}",
                fix="pass options the mechanism has (its Options dataclass), valid values only",
            ) from error

    def plan_at(self, epsilon: float) -> tuple[PrivacyPlan, Accountant | None]:
        from dpppl.engine import plan_fit

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

    def sample(self, seed: int, ledger: PrivacyLedger | None = None, model=None) -> SuiteFit:
        import dpppl

        with capture() as captured:
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
                    happened=f"it raised {describe(error)}",
                    fix="fix the exception; if the model is not supported, raise "
                    "ModelNotSupportedError from check_model() and pass model= a supported one",
                ) from error
        return SuiteFit(result, captured)

    @cached_property
    def first(self) -> tuple[SuiteFit, PrivacyLedger | None]:
        """The fit the layout, leak and ledger checks look at (charged to a fresh ledger)."""
        ledger = self.ledger()
        return self.sample(self.seed, ledger), ledger

    # -- checks ---------------------------------------------------------------------------------
