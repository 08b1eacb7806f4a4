"""The fit engine shared by ``dpppl.sample`` and the TARP study: plan a fit from public metadata,
then run the mechanism on the data."""

from __future__ import annotations

import warnings
from typing import Any

import numpy as np

from dpppl.errors import (
    InvalidPrivacyParameterError,
    PluginError,
    PluginNotFoundError,
    PrivacyWarning,
)
from dpppl.model.record_model import RecordModel
from dpppl.plugin.accountant import Accountant
from dpppl.plugin.mechanism import APPROXIMATE_DP, Mechanism, PrivacyPlan, Release
from dpppl.plugin.registry import get_accountant, registry
from dpppl.privacy.budget import check_epsilon_delta
from dpppl.progress import Progress
from dpppl.threads import single_threaded_blas

#: Slack for floating-point round-off when checking a plan against its target.
_EPSILON_SLACK = 1e-9


def choose_accountant(mechanism: Mechanism, name: str | None) -> Accountant | None:
    """The accountant named by the user, or the mechanism's first preferred one installed; None
    for a mechanism that uses no accountant (its guarantee is of another kind)."""
    if not mechanism.preferred_accountants:
        if name is not None:
            raise InvalidPrivacyParameterError(
                f"mechanism {mechanism.name!r} uses no accountant (its guarantee is of another "
                f"kind), so accountant={name!r} would be ignored; leave it out"
            )
        return None
    if name is not None:
        return get_accountant(name)()
    installed = registry().accountants
    for preferred in mechanism.preferred_accountants:
        if preferred in installed:
            return installed[preferred]()
    raise PluginNotFoundError(
        f"mechanism {mechanism.name!r} needs one of the accountants "
        f"{list(mechanism.preferred_accountants)}, and none is installed; installed: "
        f"{sorted(installed) or 'none'}"
    )


def plan_fit(
    mechanism: Mechanism,
    model: RecordModel,
    *,
    epsilon: float,
    delta: float,
    accountant: str | None = None,
) -> tuple[PrivacyPlan, Accountant | None]:
    """Check the model and calibrate the mechanism, touching nothing but public metadata."""
    epsilon, delta = check_epsilon_delta(epsilon, delta)
    mechanism.check_model(model)
    n_records = model.n_records
    if delta >= 1 / n_records:
        warnings.warn(
            f"delta={delta:g} is not below 1/N = {1 / n_records:g}: a mechanism that publishes one "
            "whole record at random would meet this guarantee. Use delta well below 1/N",
            PrivacyWarning,
            stacklevel=3,
        )
    chosen = choose_accountant(mechanism, accountant)
    plan = mechanism.plan(n_records=n_records, epsilon=epsilon, delta=delta, accountant=chosen)
    # Written as "not <=" so that a NaN epsilon is refused too.
    if plan.guarantee == APPROXIMATE_DP and not plan.epsilon <= epsilon * (1 + _EPSILON_SLACK):
        raise PluginError(
            f"mechanism {mechanism.name!r} planned epsilon={plan.epsilon:.6g}, not at or below the "
            f"requested {epsilon:g}: calibration must never overshoot"
        )
    # 0 needs no check: a guarantee of another kind may have no finite delta.
    if plan.extra_delta != 0 and not 0 < plan.extra_delta < plan.delta:
        raise PluginError(
            f"mechanism {mechanism.name!r} planned extra_delta={plan.extra_delta!r}, outside "
            f"[0, delta={plan.delta:g}): it is the part of delta spent outside the event"
        )
    if plan.max_divergence != 0 and not 0 < plan.max_divergence < plan.epsilon / 2:
        raise PluginError(
            f"mechanism {mechanism.name!r} planned max_divergence={plan.max_divergence!r}, outside "
            f"(0, epsilon/2 = {plan.epsilon / 2:g}): 2 max_divergence is part of epsilon"
        )
    return plan, chosen


def run_mechanism(
    mechanism: Mechanism,
    model: RecordModel,
    data: dict[str, np.ndarray],
    plan: PrivacyPlan,
    *,
    random_seed: Any = None,
    progressbar: bool = True,
) -> tuple[Release, bool]:
    """Fit ``mechanism`` on ``data``; returns the release and whether a fixed seed was used."""
    seed = np.random.SeedSequence(random_seed)
    with single_threaded_blas():
        release = mechanism.fit(model, data, plan, seed=seed, progress=Progress(progressbar))
    bad = ~np.isfinite(release.draws).all(axis=-1)
    if bad.any():
        release.warnings.append(_non_finite_draws_message(bad, mechanism.name))
    return release, random_seed is not None


def _non_finite_draws_message(bad: np.ndarray, mechanism: str) -> str:
    """A warning for posterior draws with non-finite values (``bad``: per draw): the budget is
    spent, so the release is kept, but summaries of such draws mean nothing and the user must
    hear why."""
    return (
        f"{int(bad.sum())} of {bad.size} posterior draws of {mechanism!r} have non-finite "
        "values, so summaries and plots of this posterior are not to be trusted. The privacy "
        "budget is spent and the release is kept in the result; the fit's other warnings, if "
        "any, say what went wrong and what to change"
    )
