"""The conformance suite of accountant plugins: :func:`accountant_checks` (one :class:`Check` per
contract) and :func:`check_accountant` (all of them in one call)."""

from __future__ import annotations

import copy
import math
from collections.abc import Callable, Mapping, Sequence
from functools import cached_property
from typing import Any

from scipy import optimize, special

from dpppl.errors import DPPPLError, PluginNotFoundError, UnsupportedEventError
from dpppl.plugin.accountant import Accountant
from dpppl.plugin.registry import get_accountant
from dpppl.privacy.events import (
    ComposedEvent,
    GaussianEvent,
    NeighbourRelation,
    PrivacyEvent,
    SelfComposedEvent,
    poisson_subsampled_gaussian,
)
from dpppl.privacy.noise_calibration import CALIBRATION_RTOL
from dpppl.testing.checks import (
    ORDER_RTOL,
    Check,
    ConformanceError,
    ConformanceReport,
    describe,
    run_all,
)
from dpppl.testing.loss_distribution import subsampled_gaussian_epsilon_bounds

#: The check on the exact Gaussian bound allows this much round-off below the truth.
_EXACT_RTOL = 1e-7


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
                        f"{describe(error)}",
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
                happened=f"it raised {describe(error)}",
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
                if e2 > e1 * (1 + ORDER_RTOL):
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

    def check_exact_subsampled_gaussian(self) -> str | None:
        """ε of T Poisson-subsampled Gaussian releases (σ, q = 0.1, T = 10, add-or-remove-one)
        is never below the lower end of an independent bracket of the exact ε
        (:mod:`dpppl.testing.loss_distribution`)."""
        relation = NeighbourRelation.ADD_OR_REMOVE_ONE
        if ("poisson_subsampled_gaussian", relation) not in self.supported:
            return "the accountant does not account the Poisson-subsampled Gaussian"
        for sigma in self.sigmas:
            event = poisson_subsampled_gaussian(sigma, 0.1, 10)
            eps = self.epsilon(event, relation, f"poisson_subsampled_gaussian, sigma={sigma:g}")
            lower, upper = subsampled_gaussian_epsilon_bounds(sigma, 0.1, 10, self.delta)
            if eps < lower * (1 - _EXACT_RTOL):
                raise self.fail(
                    "upper bound on epsilon",
                    expected=f"epsilon >= {lower:.8g}, below which the exact epsilon of 10 "
                    f"Poisson-subsampled Gaussian releases (sigma={sigma:g}, q=0.1, "
                    f"delta={self.delta:g}) cannot lie (it is in [{lower:.6g}, {upper:.6g}])",
                    happened=f"it reports {eps:.8g}, below the truth",
                    fix="report a pessimistic bound (round the privacy loss up, add the "
                    "numerical error bound) instead of an estimate",
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
                        happened=f"noise_multiplier() raised {describe(error)}",
                        fix="keep the default noise_multiplier (dpppl.calibrate_noise_multiplier)"
                        " or make yours handle this event",
                    ) from error
                eps = self.epsilon(event_for(sigma), relation, f"{family}, sigma={sigma:g}")
                low = (1 - CALIBRATION_RTOL) * target
                if eps > target * (1 + ORDER_RTOL):
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
                        fix="stop the search only inside the band (dpppl.privacy.noise_calibration."
                        "CALIBRATION_RTOL)",
                    )
        self._check_a_nan_epsilon_stops_calibration()

    def _check_a_nan_epsilon_stops_calibration(self) -> None:
        """A NaN from ``epsilon()`` fails every comparison, so a search that does not look for it
        takes it for "below the target" and returns a σ with no guarantee."""
        family, relation = self.supported[0]
        broken = copy.copy(self.accountant)
        asked = []

        def nan_epsilon(*args: Any, **kwargs: Any) -> float:
            asked.append(True)
            return math.nan

        broken.epsilon = nan_epsilon
        try:
            sigma = broken.noise_multiplier(
                self.events[family], epsilon=self.targets[0], delta=self.delta, relation=relation
            )
        except DPPPLError:
            return
        if asked:
            raise self.fail(
                "calibration",
                expected="an error when epsilon() returns NaN during calibration",
                happened=f"noise_multiplier() returned sigma={sigma!r} from NaN epsilons",
                fix="treat a NaN epsilon as an accountant failure and raise "
                "(dpppl.calibrate_noise_multiplier does)",
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
                if eps < floor * (1 - ORDER_RTOL):
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
                    happened=f"it raised {describe(error)}",
                    fix="account every event check() accepts",
                ) from error
            at_eps0 = deltas[grid.index(eps0)]
            ordered = all(d2 <= d1 * (1 + ORDER_RTOL) for d1, d2 in zip(deltas, deltas[1:]))
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
                    happened=f"it raised {describe(error)}",
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
                    happened=f"it raised {describe(error)}",
                    fix="validate delta (dpppl.plugin.check_epsilon_delta)",
                ) from error
            raise self.fail(
                "refusal of unsupported events",
                expected=f"delta={bad} refused with InvalidPrivacyParameterError",
                happened="epsilon() returned a value",
                fix="validate delta (dpppl.plugin.check_epsilon_delta)",
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
        Check("upper bound on subsampled epsilon", h.check_exact_subsampled_gaussian),
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
    return run_all(name, checks)
