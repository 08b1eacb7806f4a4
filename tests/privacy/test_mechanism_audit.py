"""Statistical audits of what each mechanism's accounting assumes about one step.

Already covered elsewhere, and not repeated here:

* ``tests/privacy/test_noise.py``: ``clip_rows`` norms ≤ C, a 10⁶-scale canary moves the sum by ≤ C,
  ``gaussian_noise`` has the requested std (χ², α = 10⁻⁶), ``poisson_batch`` inclusion rates
  (χ² over records) and Binomial batch sizes (mean and variance).
* ``plugins/dpppl-na-dpvi/tests/test_dpsgd.py``: through the real DP-SGD step, one record moves
  the noise-free sum by ≤ C (with preconditioning; ≤ C√(1 + ρ²) with its curvature row), the
  injected noise has std σC, or σ(C + g√d) for the snapped release on grid g, on every coordinate
  of the release, curvature rows included (χ², 10⁻⁶), and the mean number of included records
  is qN.
* ``plugins/dpppl-swag-ppm/tests/test_ppm.py``: the reported ε is 2 · draws · max |α_i log p|
  over the draws the released ones are among, and never exceeds the request.

This module adds, through the *real* DP-SGD step: every record's inclusion rate is q and batch
sizes are Binomial(N, q) (exact binomial and χ² goodness-of-fit tests), a record's contribution does
not depend on how many others were sampled (no normalisation by the realised batch size), and a
shuffled fixed-size batch accounted as Poisson is caught.  For SWAG-PPM it checks the weighted
log-likelihood bound |α_i log p(x_i | θ)| ≤ Δ on a data set with an extreme record.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pymc as pm
import pytest
from scipy import stats

import dpppl
import dpppl_na_dpvi.dpsgd as dpsgd
from dpppl.model.record_model import record_model
from dpppl.privacy.subsampling import GeometricTable
from dpppl.progress import Progress

SIGNIFICANCE = 1e-6
N_RECORDS, RATE, TRIALS, BOUND = 20, 0.3, 20_000, 0.5


@pytest.fixture(scope="module")
def one_hot_model():
    """y_i ~ N(w_i, 1): record i's gradient lies along w_i, so the released noise-free sum says
    exactly which records a batch held.  Every y_i is 10⁶, so every gradient is clipped to C."""
    with pm.Model(coords={"obs": range(N_RECORDS)}) as model:
        x = pm.Data("x", np.eye(N_RECORDS), dims=("obs", "slot"))
        w = pm.Normal("w", 0, 1, shape=N_RECORDS)
        pm.Normal("y", (x * w).sum(axis=1), 1, observed=np.full(N_RECORDS, 1e6), dims="obs")
    return record_model(model)


def noise_free_sums(model, *, trials=TRIALS, rate=RATE, seed=0):
    """The released gradients (trials, 2 N) of the real step with σ = 0 and q = ``rate``."""
    d = 2 * model.n_params
    step_settings = dpsgd.DPSGDSettings(
        BOUND, 0.0, jnp.ones(d), jnp.zeros(d), GeometricTable.for_rate(rate), N_RECORDS
    )
    step = dpsgd.make_step(model, capacity=N_RECORDS, mc_draws=2)
    data = {k: jnp.asarray(v) for k, v in model.data().items()}
    phi = jnp.zeros(d)
    run = jax.jit(jax.vmap(lambda key: step(phi, key, data, step_settings)[1].noisy_grad))
    return np.asarray(run(jax.random.split(jax.random.key(seed), trials)))


def inclusions(sums: np.ndarray) -> np.ndarray:
    """Which records each step included: their w-coordinate is −C, the others ≈ 0."""
    return sums[:, :N_RECORDS] < -BOUND / 2


@pytest.fixture(scope="module")
def sums(one_hot_model):
    return noise_free_sums(one_hot_model)


class TestPoissonSamplingInTheRealStep:
    def test_every_record_is_included_at_rate_q(self, sums):
        counts = inclusions(sums).sum(axis=0)
        for count in counts:
            # Exact two-sided binomial test per record, Bonferroni over the records.
            assert stats.binomtest(int(count), TRIALS, RATE).pvalue > SIGNIFICANCE / N_RECORDS

    def test_batch_sizes_are_binomial(self, sums):
        sizes = inclusions(sums).sum(axis=1)
        observed = np.bincount(sizes, minlength=N_RECORDS + 1)
        expected = TRIALS * stats.binom.pmf(np.arange(N_RECORDS + 1), N_RECORDS, RATE)
        # Pool the sparse tails so every cell expects at least 5.
        keep = expected >= 5
        observed = np.append(observed[keep], observed[~keep].sum())
        expected = np.append(expected[keep], expected[~keep].sum())
        statistic = np.sum((observed - expected) ** 2 / expected)
        assert stats.chi2.sf(statistic, len(observed) - 1) > SIGNIFICANCE

    def test_a_record_contributes_the_same_whatever_the_batch_size(self, sums):
        """The step releases a sum, never divided by the realised (data-dependent) batch size:
        record i's coordinate is −C when it is in the batch, 0 when not, for every batch size."""
        in_batch = inclusions(sums)
        sizes = in_batch.sum(axis=1)
        assert sizes.min() <= 2 and sizes.max() >= 11  # a wide range of realised sizes
        w = sums[:, :N_RECORDS]
        np.testing.assert_allclose(w[in_batch], -BOUND, rtol=1e-6)
        np.testing.assert_allclose(w[~in_batch], 0.0, atol=1e-6 * BOUND)

    def test_a_shuffled_fixed_size_batch_accounted_as_poisson_is_caught(
        self, one_hot_model, monkeypatch
    ):
        """Shuffling gives each record the right marginal rate, but not Binomial batch sizes."""
        size = round(RATE * N_RECORDS)

        def shuffled(key, n_records, table, capacity):
            order = jax.random.permutation(key, capacity)
            return order, jnp.arange(capacity) < size

        monkeypatch.setattr(dpsgd, "poisson_batch", shuffled)
        sizes = inclusions(noise_free_sums(one_hot_model, trials=2000)).sum(axis=1)
        # Binomial(20, 0.3) sizes have variance 4.2; a sample variance of 0 has probability ~0.
        variance = N_RECORDS * RATE * (1 - RATE)
        statistic = (len(sizes) - 1) * sizes.var(ddof=1) / variance
        assert stats.chi2.cdf(statistic, len(sizes) - 1) < SIGNIFICANCE


# -- SWAG-PPM -------------------------------------------------------------------------------------


def test_swag_ppm_bounds_every_weighted_log_likelihood_by_the_claimed_sensitivity():
    """|α_i log p(x_i | θ)| ≤ Δ = ε / (2 · draws) for every record and every released draw, even
    for a record 10⁴ standard deviations out, whose log-likelihood alone is ~10⁸."""
    from dpppl_swag_ppm.batches import to_device
    from dpppl_swag_ppm.fitting import PPMFitter
    from dpppl_swag_ppm.mechanism import SwagPPM
    from dpppl_swag_ppm.sgd import SwagTrainer

    rng = np.random.default_rng(0)
    y = rng.normal(1.0, 1.0, 300)
    y[7] = 1e4
    with pm.Model(coords={"obs": range(300)}) as pymc_model:
        mu = pm.Normal("mu", 0, 10)
        pm.Normal("y", mu, 1, observed=y, dims="obs")
    model = dpppl.record_model(pymc_model)
    mechanism = SwagPPM(draws=4, warmup_epochs=20, swag_epochs=20, risk_draws=200)
    epsilon = 2.0
    outcome = PPMFitter(
        model, to_device(model.data()),
        SwagTrainer(model, mechanism.schedule(model.n_records, model.n_params)),
        mechanism.options, jax.random.key(0), Progress(False),
    ).run(epsilon)
    data = to_device(model.data())
    loglik = np.stack([np.asarray(model.loglik(theta, data)) for theta in outcome.released])
    weighted = np.abs(outcome.final.weights[None, :] * loglik)
    sensitivity = outcome.epsilon / (2 * 4)
    assert outcome.epsilon <= epsilon
    assert np.abs(loglik[:, 7]).min() > 1e7  # the extreme record would dominate unweighted
    assert weighted.max() <= sensitivity * (1 + 1e-12)
