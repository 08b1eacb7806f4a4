"""The statistical audit of the declared noise: a test that tells releases on two neighbouring
data sets apart, and the lower bound on ε its error rates give (Clopper–Pearson bounds).  A bound
above the declared ε means the noise is smaller than declared, absent, or unclipped."""

from __future__ import annotations

import math
import warnings
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING

import numpy as np
from scipy import stats

from dpppl.model.record_model import RecordModel
from dpppl.privacy.events import NeighbourRelation

if TYPE_CHECKING:
    from dpppl.testing.harness import MechanismHarness

#: Confidence level of the statistical checks: a correct plugin fails one with probability at most
#: this (for a fixed ``random_seed`` the outcome is reproducible).
STATISTICAL_ALPHA = 1e-3


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


def check_declared_noise(h: MechanismHarness) -> str | None:
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
    from dpppl.engine import run_mechanism

    if not h.accounted:
        return "the guarantee is not (epsilon, delta)-DP from an accountant"
    plan, _ = h.plan_at(h.noise_epsilon)
    mechanism = h.mechanism()
    data = h.compiled.data()
    neighbour, how = _neighbour(data, h.compiled)
    seeds = np.random.SeedSequence([h.seed, 20240611]).spawn(4 * h.noise_fits)

    def means(dataset: Mapping[str, np.ndarray], batch: Sequence) -> np.ndarray:
        out = []
        for seed in batch:
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                release, _ = run_mechanism(
                    mechanism, h.compiled, dict(dataset), plan,
                    random_seed=seed.generate_state(4), progressbar=False,
                )
            draws = np.asarray(release.draws, dtype=float)
            out.append(draws.reshape(-1, h.compiled.n_params).mean(axis=0))
        return np.array(out)

    k = h.noise_fits
    choose_d, choose_n = means(data, seeds[:k]), means(neighbour, seeds[k : 2 * k])
    direction = choose_d.mean(axis=0) - choose_n.mean(axis=0)
    if not np.any(direction):
        direction = np.eye(h.compiled.n_params)[0]
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
        raise h.fail(
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
