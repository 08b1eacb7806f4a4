"""The data-independent hyperparameter rules: standardising preconditioner, eq. A58 learning
rate, annealed burn-in."""

from __future__ import annotations

import json
import math

import numpy as np
import pymc as pm
import pytest

import dpppl
from dpppl import record_model
from dpppl_na_dpvi import heuristics
from dpppl_na_dpvi.heuristics import StandardisedSchedule


@pytest.fixture(scope="module")
def model():
    with pm.Model() as m:
        p = pm.Beta("p", 1, 1)
        pm.Bernoulli("y", p=p, observed=np.random.default_rng(0).binomial(1, 0.3, 400))
    return record_model(m)


def schedule(model, **overrides):
    options = dict(noise_multiplier=30.0, sampling_rate=0.1, steps=1000, burn_in_steps=200)
    options.update(overrides)
    return StandardisedSchedule(model, **options)


def test_the_learning_rate_follows_eq_a58_times_beta(model):
    s = schedule(model, learning_rate_scale=0.7, clipping_bound=2.0)
    phi = s.initial_phi()[None]
    settings = s.settings(phi, progress=1.0)
    d = 2 * model.n_params
    lr_heur = math.sqrt(2) * 0.7 / (30.0 * 2.0 * math.sqrt(1000 * d))
    np.testing.assert_allclose(settings.learning_rate, lr_heur * np.asarray(settings.preconditioner))
    # Wander-bounded rates step μ by λ_heur β_μ² instead.
    equal = schedule(model, learning_rate_scale=0.7, clipping_bound=2.0, equal_rates=True)
    beta_mu, beta_u = np.asarray(equal.settings(phi, progress=1.0).preconditioner)
    np.testing.assert_allclose(
        equal.last.learning_rate, lr_heur * np.array([beta_mu**2, beta_u])
    )


def test_with_equal_rates_mu_relaxes_at_the_rate_u_relaxes_at(model):
    s = schedule(model, equal_rates=True)
    variance = 4e-4
    settings = s.settings(np.array([[0.0, np.log(np.expm1(variance))]]), progress=1.0)
    kappa = s.sampling_rate
    # The ELBO's curvature is 1/variance in μ and 1/2 in u (per unit of the noisy gradient).
    mu_rate = float(settings.learning_rate[0]) * kappa / variance
    u_rate = float(settings.learning_rate[1]) * kappa / 2
    assert mu_rate == pytest.approx(u_rate)
    assert u_rate == pytest.approx(heuristics.FINAL_RATE)


def test_the_preconditioner_standardises_the_gradients(model):
    s = schedule(model)
    variance = 4e-4
    u = np.log(np.expm1(variance))
    settings = s.settings(np.array([[0.0, u]]), progress=0.5)
    beta = np.asarray(settings.preconditioner)
    np.testing.assert_allclose(beta[0], math.sqrt(variance) * math.sqrt(model.n_records))
    assert beta[1] == 2 * model.n_records


def test_the_default_clipping_bound_grows_with_the_dimension(model):
    assert schedule(model).clipping_bound == pytest.approx(heuristics.CLIP_SCALE * math.sqrt(2))


@pytest.mark.parametrize("noise_multiplier", [0.3, 1.0, 3.0])
def test_where_the_privacy_noise_is_weak_the_clipping_bound_grows_until_it_adds_its_share(
    model, noise_multiplier
):
    # Weak noise: the standard bound would let it add less than MIN_NOISE_SHARE of q's variance
    # to the optimum's estimate, so C grows to the bound at which it adds exactly that.
    s = schedule(model, noise_multiplier=noise_multiplier)
    standard = heuristics.CLIP_SCALE * math.sqrt(2)
    assert s.clipping_bound > standard
    assert s.privacy_noise_share() == pytest.approx(heuristics.MIN_NOISE_SHARE)
    # Strong noise (the schedule's default σ = 30): the standard bound adds more than that.
    assert schedule(model).privacy_noise_share() > heuristics.MIN_NOISE_SHARE


def test_the_u_coordinates_relax_at_the_target_rate_after_the_burn_in(model):
    s = schedule(model)
    settings = s.settings(s.initial_phi()[None], progress=1.0)
    n = model.n_params
    # Curvature of the ELBO in u is 1/2, so one step contracts u by λ κ / 2.
    rate = float(settings.learning_rate[n]) * 0.1 / 2
    assert rate == pytest.approx(heuristics.FINAL_RATE)
    burn = s.settings(s.initial_phi()[None], progress=0.0)
    assert float(burn.learning_rate[n]) * 0.1 / 2 == pytest.approx(heuristics.BURN_IN_RATE)


def test_the_fixed_phase_restarts_from_the_average_of_the_late_burn_in(model):
    s = schedule(model)
    burn_in = np.vstack([np.full((300, 2), 5.0), np.full((100, 2), 1.0)])
    np.testing.assert_allclose(s.restart(burn_in), [1.0, 1.0])


def test_the_start_has_variance_one_over_n(model):
    phi0 = schedule(model).initial_phi()
    assert np.log1p(np.exp(phi0[1])) == pytest.approx(1 / model.n_records)


def test_the_anchor_is_the_mean_of_the_free_steps_after_their_drift(model):
    rng = np.random.default_rng(0)
    # Half the free steps still come down from 40 noise sds away, the rest sit around 1.
    approach = np.linspace(40.0, 1.0, 2000)[:, None] + rng.normal(size=(2000, 2))
    settled = 1.0 + rng.normal(size=(2000, 2))
    free = np.vstack([approach, settled])
    np.testing.assert_allclose(schedule(model).anchor(free), [1.0, 1.0], atol=0.15)
    np.testing.assert_allclose(schedule(model, settle=False).anchor(free), free.mean(axis=0))


def test_a_trace_no_cut_settles_loses_half_under_equal_rates_and_nothing_under_standardised(
    model,
):
    """Under standardised rates what still drifts is a slow coordinate that no cut settles, so
    the cut would only halve what the others tell; under equal rates every coordinate is still
    on its way and the early half is the most biased."""
    rng = np.random.default_rng(1)
    free = np.linspace(0.0, 40.0, 4000)[:, None] + rng.normal(size=(4000, 2))
    assert schedule(model, equal_rates=True).settled_start(free) == 2000
    assert schedule(model).settled_start(free) == 0
    steady = np.vstack([np.linspace(40.0, 1.0, 1000)[:, None], np.ones((3000, 1))])
    settling = steady + rng.normal(size=(4000, 2))
    assert 0 < schedule(model).settled_start(settling) == schedule(
        model, equal_rates=True
    ).settled_start(settling)


def test_under_strong_noise_the_final_rate_keeps_the_wander_within_its_bound(model):
    weak = schedule(model, noise_multiplier=1.0, equal_rates=True)
    strong = schedule(model, noise_multiplier=3000.0, equal_rates=True)
    assert weak.final_rate() == heuristics.FINAL_RATE
    assert schedule(model, noise_multiplier=3000.0).final_rate() == heuristics.FINAL_RATE
    rate, share = strong.final_rate(), strong.privacy_noise_share()
    assert rate < heuristics.FINAL_RATE
    n, n_records = model.n_params, model.n_records
    shift = n * (rate * strong.steps / 2) * share / n_records
    assert shift == pytest.approx(heuristics.WANDER_SCALE * math.sqrt((1 + share) / n_records))
    settings = strong.settings(strong.initial_phi()[None], progress=0.0)
    first_mu = float(settings.learning_rate[0]) * strong.sampling_rate / strong.init_variance
    first_u = float(settings.learning_rate[n]) * strong.sampling_rate / 2
    assert first_mu == pytest.approx(heuristics.BURN_IN_FACTOR * rate)
    assert first_u == pytest.approx(heuristics.BURN_IN_U_FACTOR * first_mu)


def test_a_capped_start_holds_mu_to_ten_times_the_wander_bound_and_leaves_u_fast(model):
    """Under strong noise the fast start throws μ far off and standardised rates are slow to
    bring it back; the capped start keeps μ's first rate near the wander bound, never below the
    final rate, while u keeps its fast start (q's scale is what the start does not know)."""
    strong = schedule(model, noise_multiplier=300.0, capped_start=True)
    fast = schedule(model, noise_multiplier=300.0)
    phi = strong.initial_phi()[None]
    capped_lr = np.asarray(strong.settings(phi, progress=0.0).learning_rate)
    fast_lr = np.asarray(fast.settings(phi, progress=0.0).learning_rate)
    n = model.n_params
    bound = strong.wander_bound()
    assert heuristics.FINAL_RATE < bound * heuristics.BURN_IN_FACTOR < heuristics.BURN_IN_RATE
    assert capped_lr[:n] / fast_lr[:n] == pytest.approx(
        heuristics.BURN_IN_FACTOR * bound / heuristics.BURN_IN_RATE
    )
    np.testing.assert_allclose(capped_lr[n:], fast_lr[n:])
    # After the burn-in both run at the final rate; under weak noise the cap does not bind.
    np.testing.assert_allclose(
        strong.settings(phi, progress=1.0).learning_rate,
        fast.settings(phi, progress=1.0).learning_rate,
    )
    weak = schedule(model, noise_multiplier=1.0, capped_start=True)
    np.testing.assert_allclose(
        weak.settings(phi, progress=0.0).learning_rate,
        schedule(model, noise_multiplier=1.0).settings(phi, progress=0.0).learning_rate,
    )
    # Where the bound lies below the final rate, μ starts at the final rate.
    tight = schedule(model, noise_multiplier=3000.0, capped_start=True)
    assert tight.wander_bound() * heuristics.BURN_IN_FACTOR < heuristics.FINAL_RATE
    assert tight.start_rate(mu=True) == heuristics.FINAL_RATE


def test_with_equal_rates_u_relaxes_faster_than_mu_only_in_the_burn_in_of_the_rule(model):
    """From below its optimum q's log-variance climbs at most r/2 a step (see the module's
    docstring), so the rule's burn-in gives u ``BURN_IN_U_FACTOR`` times μ's rate."""
    variance = 4e-4
    phi = np.array([[0.0, np.log(np.expm1(variance))]])

    def rates(s, progress):
        lr = np.asarray(s.settings(phi, progress=progress).learning_rate)
        return lr[0] * s.sampling_rate / variance, lr[1] * s.sampling_rate / 2

    rule = schedule(model, equal_rates=True)
    mu, u = rates(rule, 0.5)
    assert u == pytest.approx(heuristics.BURN_IN_U_FACTOR * mu)
    mu, u = rates(rule, 1.0)
    assert u == pytest.approx(mu)
    user = schedule(model, equal_rates=True, learning_rate_scale=0.7)
    mu, u = rates(user, 0.5)
    assert u == pytest.approx(mu)


def test_with_wander_bounded_rates_a_regression_trace_wanders_as_predicted_and_is_unbiased():
    """Under strong privacy noise the weights' wander inflates the residuals, and so the trace of
    log σ²: wander-bounded rates keep the wander at (rT/2)·D variances of q and the bias small.
    (With the standardised rates this trace's log σ² sat 3 to 6.5 posterior sds above its
    optimum on seeds 12 to 14.)"""
    rng = np.random.default_rng(11)
    n_records, k = 3000, 6
    x = rng.normal(size=(n_records, k))
    y = x @ rng.normal(0, 0.5, k) + rng.normal(0, 0.2, n_records)
    with pm.Model() as regression:
        w = pm.Normal("w", 0, 1, shape=k)
        sigma2 = pm.InverseGamma("sigma2", 2, 0.1)
        pm.Normal("y", x @ w, pm.math.sqrt(sigma2), observed=y)
    result = dpppl.sample(regression, mechanism="na-dpvi", epsilon=0.3, delta=1e-5, steps=6000,
                          posterior="naive", rates="wander-bounded", random_seed=12,
                          progressbar=False)
    attrs = json.loads(result.attrs["dp_mechanism_attrs"])
    phi = result["dpvi_trace"]["phi"].values[attrs["settled_step"]:]
    n = phi.shape[1] // 2
    q_variance = np.log1p(np.exp(phi[:, n:].mean(axis=0)))
    wander = phi[:, :n].var(axis=0) / q_variance
    compiled = record_model(regression)
    rule = StandardisedSchedule(
        compiled, noise_multiplier=result.attrs["dp_noise_multiplier"], sampling_rate=0.1,
        steps=6000, burn_in_steps=attrs["burn_in_steps"], equal_rates=True,
    )
    predicted = rule.final_rate() * 6000 / 2 * rule.privacy_noise_share()
    weights = [i for i, label in enumerate(compiled.parameters.labels()) if label.startswith("w")]
    # A trace of a few relaxation times shows somewhat less than the stationary wander.
    assert 0.25 < np.median(wander[weights]) / predicted < 2
    least_squares = np.linalg.lstsq(x, y, rcond=None)[0]
    log_sigma2 = np.log(np.mean((y - x @ least_squares) ** 2))
    noise_scale = compiled.parameters.labels().index("sigma2_log__")
    posterior_sd = math.sqrt(2 * (1 + rule.privacy_noise_share()) / n_records)
    assert abs(phi[:, noise_scale].mean() - log_sigma2) < 2 * posterior_sd
