"""Empirical privacy audits of the DP-SGD step of NA-DPVI: a lower bound on ε that must stay
below the claim, and deliberately broken variants of the same code that must be caught.

The audit is the classic single-step, worst-case-canary test (Jagielski et al. 2020; Nasr et al.
2021, 2023): two neighbouring data sets under the add/remove relation, D = {canary} and
D′ = {} (the canary replaced by a record that contributes nothing), are each given to the *real*
``make_step`` of ``dpppl_na_dpvi.dpsgd`` many times; a threshold test on the released noisy
gradient guesses which one it saw.  Any (ε, δ)-DP mechanism forces

    TPR ≤ e^ε · FPR + δ   and   TNR ≤ e^ε · FNR + δ,

so Clopper–Pearson bounds on the four rates give a lower bound on ε that holds with 95 %
confidence.  The threshold is chosen on one half of the trials and the bound computed on the
other, so choosing costs no confidence.  Audits give lower bounds only: they catch gross bugs
(noise at the wrong scale, no clipping, sampling that does not match the accounting), never prove
a guarantee.

Models of the step
------------------
*   A one-parameter model y ~ N(μ, 1): the canary y = 10⁶ has a per-record gradient of norm about
    10⁶ along μ (the antithetic Monte Carlo pair cancels its u-component to ~10⁻⁶ relative), so
    its clipped contribution is exactly C·e_μ up to rounding, the worst case for sensitivity C.
*   The "removed" record is y = NaN: its gradient is not finite, and ``clip_rows`` makes it
    contribute exactly zero (checked below), so D′ is D without the canary at the same public N.
"""

from __future__ import annotations

import math

import jax
import jax.numpy as jnp
import numpy as np
import pymc as pm
import pytest
from scipy import stats

import dpppl_na_dpvi.dpsgd as dpsgd
from dpppl.model.record_model import record_model
from dpppl.plugin.registry import get_accountant
from dpppl.privacy.events import NeighbourRelation, poisson_subsampled_gaussian
from dpppl.privacy.noise import SnappedGaussian, clip_rows, gaussian_noise
from dpppl.privacy.noise_calibration import calibrate_noise_multiplier
from dpppl.privacy.subsampling import GeometricTable, poisson_batch

DELTA = 1e-5
#: Confidence of every ε lower bound (union bound over the four Clopper–Pearson intervals).
CONFIDENCE = 0.95
#: Trials per data set: half choose the threshold, half bound the rates.
TRIALS = 600_000
#: The claimed ε of the single-step audit; σ is calibrated to it by the PLD accountant.
CLAIMED_EPSILON = 2.0
BOUND = 1.0  # C
CANARY = 1e6
REMOVED = float("nan")
RELATION = NeighbourRelation.ADD_OR_REMOVE_ONE

#: Figures of the audits, printed at the end of the module (``pytest -s``) for the report.
FIGURES: dict[str, tuple[float, float]] = {}


# -- the statistics -----------------------------------------------------------------------------


def clopper_pearson_upper(successes: int, trials: int, alpha: float) -> float:
    """One-sided upper bound, at confidence 1 − ``alpha``, on a binomial proportion."""
    if successes >= trials:
        return 1.0
    return float(stats.beta.ppf(1 - alpha, successes + 1, trials - successes))


def _rates_bound(false_negatives, n_in, false_positives, n_out, delta, alpha) -> float:
    fnr_up = clopper_pearson_upper(false_negatives, n_in, alpha / 4)
    fpr_up = clopper_pearson_upper(false_positives, n_out, alpha / 4)
    # TPR ≥ 1 − fnr_up and TNR ≥ 1 − fpr_up with the stated confidence.
    candidates = [(1 - fnr_up - delta) / fpr_up, (1 - fpr_up - delta) / fnr_up]
    return max(math.log(c) if c > 0 else -math.inf for c in candidates)


def _bound_at(s_in: np.ndarray, s_out: np.ndarray, threshold: float, delta: float, alpha: float):
    """ε lower bound of the test "score > threshold means D" on these trials (both inequalities)."""
    false_negatives = int(np.count_nonzero(s_in <= threshold))
    false_positives = int(np.count_nonzero(s_out > threshold))
    return _rates_bound(false_negatives, len(s_in), false_positives, len(s_out), delta, alpha)


def epsilon_lower_bound(
    scores_d: np.ndarray, scores_d_prime: np.ndarray, *, delta: float,
    confidence: float = CONFIDENCE,
) -> float:
    """A lower bound on the ε of the mechanism that produced the scores, at ``delta``.

    ``scores_d`` are the test scores of outputs on D (the canary in), ``scores_d_prime`` on D′.
    The threshold that maximises the bound on the first half of each is applied to the second.
    """
    alpha = 1 - confidence
    half_in, half_out = len(scores_d) // 2, len(scores_d_prime) // 2
    pick_in, test_in = np.sort(scores_d[:half_in]), scores_d[half_in:]
    pick_out, test_out = np.sort(scores_d_prime[:half_out]), scores_d_prime[half_out:]
    grid = np.quantile(np.concatenate([pick_in, pick_out]),
                       np.concatenate([np.linspace(0.0, 0.999, 400), 1 - np.logspace(-3, -6, 100)]))
    false_negatives = np.searchsorted(pick_in, grid, side="right")
    false_positives = half_out - np.searchsorted(pick_out, grid, side="right")
    bounds = [_rates_bound(int(fn), half_in, int(fp), half_out, delta, alpha)
              for fn, fp in zip(false_negatives, false_positives, strict=True)]
    return _bound_at(test_in, test_out, grid[int(np.argmax(bounds))], delta, alpha)


def pld_epsilon(noise_multiplier: float, rate: float, steps: int) -> float:
    event = poisson_subsampled_gaussian(noise_multiplier, rate, steps)
    return get_accountant("pld")().epsilon(event, delta=DELTA, relation=RELATION)


def pld_noise_multiplier(epsilon: float, rate: float, steps: int) -> float:
    return calibrate_noise_multiplier(
        lambda sigma: pld_epsilon(sigma, rate, steps), epsilon, initial=2.0
    )


class TestTheStatistics:
    """The audit's own arithmetic, on distributions whose answer is known."""

    def test_a_perfect_distinguisher_is_bounded_only_by_the_number_of_trials(self):
        scores_in, scores_out = np.ones(200_000), np.zeros(200_000)
        bound = epsilon_lower_bound(scores_in, scores_out, delta=DELTA)
        # No error in 100 000 evaluation trials: FPR ≤ −log(α/4)/n.
        assert bound == pytest.approx(math.log(100_000 / -math.log(0.05 / 4)), abs=0.01)

    def test_identical_distributions_give_no_evidence(self):
        rng = np.random.default_rng(0)
        bound = epsilon_lower_bound(rng.normal(size=400_000), rng.normal(size=400_000),
                                    delta=DELTA)
        assert bound <= 0.05

    def test_a_gaussian_mechanism_is_bounded_below_its_exact_epsilon(self):
        rng = np.random.default_rng(1)
        sigma = 1.0
        exact = pld_epsilon(sigma, 1.0, 1)  # ≈ 4.38, tight for one Gaussian release
        bound = epsilon_lower_bound(rng.normal(1, sigma, 10**6), rng.normal(0, sigma, 10**6),
                                    delta=DELTA)
        assert 0.6 * exact < bound <= exact


# -- the mechanism under audit ------------------------------------------------------------------


@pytest.fixture(scope="module")
def canary_model():
    """y ~ N(μ, 1) with μ ~ N(0, 1), one record (its value is replaced in every trial)."""
    with pm.Model() as model:
        mu = pm.Normal("mu", 0, 1)
        pm.Normal("y", mu, 1, observed=np.zeros(1))
    return record_model(model)


def settings(model, *, noise_multiplier, rate=1.0, n_records=1):
    d = 2 * model.n_params
    return dpsgd.DPSGDSettings(
        clipping_bound=BOUND,
        noise_multiplier=noise_multiplier,
        preconditioner=jnp.ones(d),
        learning_rate=jnp.zeros(d),  # φ stays put: every step sees the same canary gradient
        gaps=GeometricTable.for_rate(rate),
        n_records=n_records,
    )


def records(model, values) -> dict[str, jax.Array]:
    """The model's record arrays with the observed y replaced by ``values``."""
    data = {k: jnp.asarray(np.repeat(v[:1], len(values), axis=0)) for k, v in model.data().items()}
    data["y"] = jnp.asarray(values, dtype=jnp.float64)
    return data


def released_gradients(model, values, step_settings, *, trials, steps=1, seed=0, grid=None):
    """The noisy gradients (trials, steps, d) of ``steps`` calls of the real DP-SGD step, with
    float noise or, on ``grid``, the snapped release.

    ``make_step`` is built afresh, so a monkeypatched primitive in ``dpppl_na_dpvi.dpsgd`` (a
    broken variant) is what it calls.
    """
    step = dpsgd.make_step(model, capacity=len(values), mc_draws=2, snapped=grid is not None)
    data = records(model, values)
    phi = jnp.zeros(2 * model.n_params)

    @jax.jit
    def run(keys):
        def one_trial(key):
            def body(phi, k):
                phi, out = step(phi, k, data, step_settings, grid)
                return phi, out.noisy_grad

            return jax.lax.scan(body, phi, jax.random.split(key, steps))[1]

        return jax.vmap(one_trial)(keys)

    keys = jax.random.split(jax.random.key(seed), trials)
    return np.asarray(run(keys))


def single_step_scores(model, values, step_settings, *, seed, grid=None):
    grads = released_gradients(model, values, step_settings, trials=TRIALS, seed=seed, grid=grid)
    # The canary pushes the μ-gradient to −C: score it along that direction, in units of C.
    return -grads[:, 0, 0] / BOUND


def single_step_audit(model, *, noise_multiplier, rate=1.0, grid=None):
    step_settings = settings(model, noise_multiplier=noise_multiplier, rate=rate)
    scores_d = single_step_scores(model, [CANARY], step_settings, seed=1, grid=grid)
    scores_d_prime = single_step_scores(model, [REMOVED], step_settings, seed=2, grid=grid)
    return epsilon_lower_bound(scores_d, scores_d_prime, delta=DELTA)


@pytest.fixture(scope="module")
def sigma():
    """σ for which one full-batch Gaussian step has ε = 2 at δ = 10⁻⁵ (PLD upper bound)."""
    return pld_noise_multiplier(CLAIMED_EPSILON, 1.0, 1)


class TestTheCanary:
    """The audit's premises: the canary is a worst case and the removed record counts for nothing."""

    def test_the_canary_contributes_exactly_the_clipping_bound_along_mu(self, canary_model):
        grads = released_gradients(canary_model, [CANARY], settings(canary_model, noise_multiplier=0.0),
                                   trials=1000)
        np.testing.assert_allclose(np.linalg.norm(grads[:, 0], axis=-1), BOUND, rtol=1e-9)
        np.testing.assert_allclose(grads[:, 0, 0], -BOUND, rtol=1e-9)

    def test_the_removed_record_contributes_nothing(self, canary_model):
        grads = released_gradients(canary_model, [REMOVED], settings(canary_model, noise_multiplier=0.0),
                                   trials=1000)
        assert np.all(grads == 0.0)


class TestSingleStepAudit:
    """One step, q = 1: the ε lower bound of the real step stays below the accountant's claim."""

    @pytest.mark.parametrize("noise", ["float", "snapped"])
    def test_the_lower_bound_stays_below_the_claim(self, canary_model, sigma, noise):
        claim = pld_epsilon(sigma, 1.0, 1)
        assert claim <= CLAIMED_EPSILON
        grid = None
        if noise == "snapped":
            grid = SnappedGaussian.for_sum(capacity=1, clipping_bound=BOUND,
                                           noise_multiplier=sigma, dim=2).grid
        bound = single_step_audit(canary_model, noise_multiplier=sigma, grid=grid)
        FIGURES[f"single step, correct, {noise} noise"] = (bound, claim)
        assert bound <= claim
        # The audit has power: it gets within a factor of 1.6 of a tight claim.
        assert bound >= claim / 1.6

    def test_halved_noise_is_caught(self, canary_model, sigma, monkeypatch):
        monkeypatch.setattr(
            dpsgd, "gaussian_noise", lambda key, shape, std: gaussian_noise(key, shape, std / 2)
        )
        bound = single_step_audit(canary_model, noise_multiplier=sigma)
        FIGURES["single step, noise halved"] = (bound, CLAIMED_EPSILON)
        assert bound > CLAIMED_EPSILON

    def test_missing_clipping_is_caught(self, canary_model, sigma, monkeypatch):
        # Non-finite rows still count for nothing, so D′ is unchanged; only the bound is gone.
        monkeypatch.setattr(dpsgd, "clip_rows", lambda rows, bound: clip_rows(rows, jnp.inf))
        bound = single_step_audit(canary_model, noise_multiplier=sigma)
        FIGURES["single step, clipping off"] = (bound, CLAIMED_EPSILON)
        assert bound > CLAIMED_EPSILON

    def test_sampling_that_does_not_match_the_accounting_is_caught(
        self, canary_model, sigma, monkeypatch
    ):
        """Accounted as Poisson with q = 0.01, but every record is in every batch."""
        rate = 0.01
        claim = pld_epsilon(sigma, rate, 1)  # ≈ 0.03: amplification by subsampling
        monkeypatch.setattr(
            dpsgd, "poisson_batch",
            lambda key, n_records, table, capacity: poisson_batch(
                key, n_records, GeometricTable.for_rate(1.0), capacity
            ),
        )
        broken = single_step_audit(canary_model, noise_multiplier=sigma, rate=rate)
        FIGURES["single step q=0.01, every record taken"] = (broken, claim)
        assert broken > claim


# -- a few steps with Poisson subsampling ---------------------------------------------------------

FEW_STEPS, FEW_RATE, FEW_RECORDS, FEW_TRIALS = 8, 0.25, 4, 400_000


def few_step_scores(model, step_settings, sigma, *, canary, seed):
    """The log-likelihood ratio of the Poisson mixture, summed over the steps: the most powerful
    score for "the canary is in the data" when each step includes it with probability q."""
    values = [CANARY if canary else REMOVED] + [REMOVED] * (FEW_RECORDS - 1)
    grads = released_gradients(model, values, step_settings, trials=FEW_TRIALS,
                               steps=FEW_STEPS, seed=seed)
    s = -grads[..., 0] / BOUND
    log_ratio = (s - 0.5) / sigma**2
    return np.sum(np.logaddexp(np.log1p(-FEW_RATE), np.log(FEW_RATE) + log_ratio), axis=1)


def few_step_audit(model, sigma):
    step_settings = settings(model, noise_multiplier=sigma, rate=FEW_RATE, n_records=FEW_RECORDS)
    scores_d = few_step_scores(model, step_settings, sigma, canary=True, seed=3)
    scores_d_prime = few_step_scores(model, step_settings, sigma, canary=False, seed=4)
    return epsilon_lower_bound(scores_d, scores_d_prime, delta=DELTA)


@pytest.fixture(scope="module")
def few_sigma():
    return pld_noise_multiplier(CLAIMED_EPSILON, FEW_RATE, FEW_STEPS)


@pytest.mark.slow
class TestFewStepAudit:
    """T = 8 Poisson-subsampled steps (q = 1/4): the canary is in each step with probability q."""

    def test_the_lower_bound_stays_below_the_claim(self, canary_model, few_sigma):
        claim = pld_epsilon(few_sigma, FEW_RATE, FEW_STEPS)
        bound = few_step_audit(canary_model, few_sigma)
        FIGURES[f"{FEW_STEPS} steps q={FEW_RATE}, correct"] = (bound, claim)
        assert bound <= claim

    def test_halved_noise_is_caught(self, canary_model, few_sigma, monkeypatch):
        monkeypatch.setattr(
            dpsgd, "gaussian_noise", lambda key, shape, std: gaussian_noise(key, shape, std / 2)
        )
        bound = few_step_audit(canary_model, few_sigma / 2)  # the score knows the real noise
        FIGURES[f"{FEW_STEPS} steps q={FEW_RATE}, noise halved"] = (bound, CLAIMED_EPSILON)
        assert bound > CLAIMED_EPSILON


@pytest.fixture(scope="module", autouse=True)
def _print_figures():
    yield
    for name, (bound, claim) in FIGURES.items():
        print(f"\naudit {name}: epsilon lower bound {bound:.3f}, claimed {claim:.3f}")
