"""The posterior of the optimum φ* stays calibrated, and about as narrow as the trace allows, when
the trace pins a correlated curvature A only loosely.

This is the regime of NA-DPVI's own traces: the schedule relaxes the trace at about 0.2 % per
step, so after the burn-in it spreads over a few posterior standard deviations of φ* and its
slope determines each entry of A to within about 25 %.  The paper's prior φ* ~ N(φ̄, I) is then
hundreds of posterior standard deviations wide, and integrating it out leaves a factor
1/|det A| in A's posterior that pulls A's μ-block towards singular; along the weak direction
φ* was held only by that unit prior.  Here that prior gave 90 % intervals 1.9–2.7 times as wide
as the exact conditional given the true A, holding the truth 97.5 % of the time.
"""

from __future__ import annotations

import jax
import numpy as np

from dpppl.plugin import softplus_inverse
from dpppl_na_dpvi.postprocess import ModelStructure, TraceStatistics, sample_nuts

KAPPA = 0.1
VARIANCE = 1e-3
#: Correlation of the μ-block of A: the posterior precision of a regression whose covariates
#: are correlated.
CORRELATION = np.array([[1.0, 0.6, 0.3], [0.6, 1.0, 0.5], [0.3, 0.5, 1.0]])
STEPS, BURN_IN = 6000, 1000
REPLICATES = 40


def curvature() -> np.ndarray:
    """A of a mean-field ELBO at its optimum with variances ``VARIANCE``: A_μ = R / v, A_u ≈ ½."""
    n = len(CORRELATION)
    a = np.diag(np.r_[np.zeros(n), np.full(n, 0.5)])
    a[:n, :n] = CORRELATION / VARIANCE
    return a


def simulate(rng, phi_star, a, noise_std):
    """DP-SGD on an exactly quadratic objective, each coordinate relaxing at 0.2 % per step."""
    lr = 0.002 / (KAPPA * np.diag(a))
    phi = np.zeros((STEPS + 1, len(phi_star)))
    grads = np.zeros((STEPS, len(phi_star)))
    phi[0] = phi_star
    for t in range(STEPS):
        grads[t] = KAPPA * a @ (phi[t] - phi_star) + noise_std * rng.normal(size=len(phi_star))
        phi[t + 1] = phi[t] - lr * grads[t]
    return phi, grads


def cache():
    store = {}

    def get(key, factory):
        if key not in store:
            store[key] = factory()
        return store[key]

    return get


def test_a_loosely_identified_correlated_curvature_gives_calibrated_and_narrow_intervals():
    rng = np.random.default_rng(21)
    a = curvature()
    n = len(CORRELATION)
    noise_std = np.r_[np.full(n, 150.0), np.full(n, 0.4)]
    truths, stats = [], []
    for _ in range(REPLICATES):
        phi_star = np.r_[0.1 * rng.normal(size=n), np.full(n, float(softplus_inverse(VARIANCE)))]
        phi, grads = simulate(rng, phi_star, a, noise_std)
        truths.append(phi_star)
        stats.append(TraceStatistics.from_trace(phi, grads, burn_in=BURN_IN, noise_std=noise_std,
                                                rate=KAPPA, subsampling_scale=np.zeros(2 * n)))
    # The mechanism's default post-processing model for a few correlated parameters.
    structure = ModelStructure(full_curvature=True, integrated_optimum=True)
    draws = sample_nuts(stats, [jax.random.key(k) for k in range(REPLICATES)], tune=300,
                        draws=500, chains=1, structure=structure, cache=cache(), replicates=True)
    # The narrowest honest posterior: δ's conditional given the true A, (T κ² A V⁻¹ A)⁻¹.
    count = STEPS - BURN_IN
    exact_sd = np.sqrt(np.diag(np.linalg.inv(count * KAPPA**2 * a @ np.diag(noise_std**-2) @ a)))
    inside50, inside90, width = [], [], []
    for one, phi_star in zip(draws, truths, strict=True):
        mu = one.phi_star.reshape(-1, 2 * n)[:, :n]
        q05, q25, q75, q95 = np.quantile(mu, [0.05, 0.25, 0.75, 0.95], axis=0)
        inside50.append((q25 < phi_star[:n]) & (phi_star[:n] < q75))
        inside90.append((q05 < phi_star[:n]) & (phi_star[:n] < q95))
        width.append((q95 - q05) / (2 * 1.645 * exact_sd[:n]))
    # 120 intervals of each level: binomial standard errors 0.046 and 0.027.
    assert 0.38 < np.mean(inside50) < 0.62
    assert 0.83 < np.mean(inside90) < 0.96
    # Not knowing A exactly costs some width (measured: 1.0–1.4), not a factor of 2 or more.
    assert np.all(np.median(width, axis=0) < 1.6)
