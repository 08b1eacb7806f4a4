"""The noise-aware post-processing model of the DP-SGD trace (NA-DPVI paper, Algorithm 4).

After the burn-in T*, every noisy gradient is modelled as

    g̃_{t+1} ~ N(κ A (φ_t − φ*), diag(σ C / β)² [+ diag(ς / β)²]),

with a prior on φ* centred on the trace mean φ̄ (the paper's N(φ̄, I), eq. A61, or by default
the unit-information prior below).  The curvature A has diagonal a = exp(v), v_j ~ N(m_j, s_j²).
The likelihood depends on the trace only through a few sums (Σ g̃², Σ g̃, Σ g̃ xᵀ, Σ x xᵀ with
x = φ − φ̄), so evaluating it costs O(d³) however long the trace is.

Departures from the paper, where it is ambiguous or where measurement showed it necessary:

* eq. (A60) writes the noise covariance as (1/β) ⊙ (σ²C² I + Σ_sub); the noisy gradient is
  (sum + σCη)/β, whose variance is σ²C²/β², which is what is used here (as in the reference code);
* The paper maps v to A by softplus and centres v's prior on an estimate of A itself.  Here
  A = exp(v): a log-normal prior, centred on log of the estimate with its relative width as
  standard deviation.  With softplus, a prior wide enough to be honest reaches v < 0, where A → 0
  leaves φ* unidentified, and NUTS diverged in that funnel (tens to hundreds of divergent
  transitions per fit on a 5-parameter logistic regression); on the log scale it does not.
  Appendix H.3's estimate is floored at one standard error so weakly identified coordinates
  keep a wide prior.  That prior is kept as ``curvature_prior="trace"``; the default
  ``"structural"`` prior centres A on the curvature the mean-field ELBO has at its own optimum
  (see :meth:`TraceStatistics.from_trace`): the least-squares slope of an Ornstein–Uhlenbeck trace
  with a few relaxation times overestimates A by a factor 1 + O(1/(rT)), which made the
  posterior over-confident.
* The paper's A is diagonal.  When the model's posterior is correlated, the ELBO's Hessian in μ is
  not, and a diagonal A then mislocates φ* (on simulated traces with correlation −0.78, z-scores of
  φ* had standard deviation 2.9).  ``curvature="full"`` (the default for up to
  ``MAX_FULL_CURVATURE`` parameters) gives the μ-block a full A = D^½ R D^½; the u-block stays
  diagonal.  The trace says little about R (a few relaxation times of μ), so R's prior decides
  how close to singular A may come, and along a nearly singular direction the optimum is held by
  its prior alone.  So by default (NA-DPVI's ``correlation_prior="released-likelihood"``)
  DP-SGD releases the records' Fisher information too, and the release is read as an
  observation of the correlations of the records' share of A (:func:`released_fisher_correlations`)
  beside R's LKJ(η) prior, whose η is learned (:func:`lkj_concentration_centre`), so a noisy
  release cannot centre A on a singular matrix.  Each partial correlation the release observes
  may also, with probability ``CORRELATION_SLAB_WEIGHT`` (less where the release observes more
  than ten, :func:`correlation_slab_weights`), be uniform rather than LKJ's (a
  spike-and-slab prior), so that one strong correlation beside many noise-only ones keeps its
  strength.  With the LKJ prior alone (``"lkj"``) the class
  studies' GLMs were several times too wide at η = 2; with ``"released"`` R's prior is centred on
  the release (:func:`released_correlation_prior`).
* Where the curvature is released, A's μ-block is split by where it comes from:
  A = P + D^½ R D^½, with P the curvature of the model's prior part of the ELBO at φ̄ (public,
  made positive semi-definite) and D^½ R D^½ the records' share, whose correlation R the release
  observes and the LKJ prior holds.  A hierarchical prior couples each group's intercept
  strongly with the group mean and scale, and the records couple the intercepts with the slope
  hardly at all; with one R for the whole of A, LKJ's one η had to allow the first and so could
  not forbid the second, and the centred varying intercepts came out too wide in the intercepts
  and slope (``tutorials/RESULTS.md``, 2026-11-29).  P's correlations are now exact.
* The paper's prior on the optimum, φ* ~ N(φ̄, I), is in whatever units φ has, and is usually
  hundreds of posterior standard deviations wide.  Integrating δ = φ* − φ̄ out of such a prior
  leaves the factor |I + J|^(−½) ∝ 1/|det A| in A's posterior (J = T (κA)ᵀV⁻¹(κA), the
  trace's information about δ): an Occam factor that rewards small curvature (Bartlett's
  paradox).  It shifts each log-normal log A_jj down by its prior variance and cancels the
  LKJ(2) density det R near singular R, so the posterior of A reached nearly singular μ-blocks,
  along which δ was held only by its unit prior: on a 4-parameter Poisson regression the
  posterior's marginal standard deviations were 4–5 times the exact posterior's and its TARP
  RMSE 0.064 (K = 100, floor ≈ 0.04).  ``optimum_prior="unit-information"`` is Zellner's
  g-prior with g = T, δ | A ~ N(0, T J⁻¹): as much as one gradient says, in the problem's own
  units, and the factor it leaves, (1 + T)^(−d/2), does not depend on A (same study: RMSE
  0.038).  ``"model-bounded"`` also holds δ | A by the model's own prior, and is NA-DPVI's
  default where A is diagonal and the model has several parameters.  ``"standard-normal"``
  keeps the paper's prior.
* The paper reads the optimum off the whole trace after the burn-in, which assumes gradients
  linear in φ over the trace's wander.  Where they are not, the wander biases the trace mean:
  in a regression, log σ² tracks the residual variance at the *current* weights, which the
  privacy noise inflates, so the trace mean of log σ² sits several posterior standard
  deviations above the optimum at ε = 1.  With an anchored phase (NA-DPVI's option
  ``anchored``; see :meth:`TraceStatistics.from_trace`) the free steps get an offset of their
  own and inform A only, and gradients released at the fixed anchor locate φ*.
"""

from __future__ import annotations

from collections.abc import Callable, Hashable, Sequence
from dataclasses import dataclass, field, replace
from typing import Any, Literal, NamedTuple, Protocol

import blackjax
import jax
import jax.numpy as jnp
import numpy as np
from blackjax.adaptation.metric_recipes import lookup_recipe

#: Optimum priors under which A's posterior is the unit-information one: ``"model-bounded"``
#: adds the model's prior to the optimum's conditional only (see :class:`ModelStructure`).
MARGINAL_UNIT_INFORMATION = ("unit-information", "model-bounded")

#: Relative prior width of A around its structural value.
STRUCTURAL_PRIOR_WIDTH = 0.5


def lkj_concentration_centre(n: int) -> float:
    """Centre of the hyperprior on η, the concentration of the LKJ prior on the correlation R of
    the n × n μ-block of A (of the records' share of it where the curvature is released, see
    :func:`curvature_blocks`): 0.75 n + 0.5.

    Under LKJ(η) each correlation has variance 1/(2η − 1 + n), so the spectral spread of R − I,
    about 2√(n/(2η − 1 + n)), grows with n at a fixed η: at this centre it stays that of LKJ(2)
    at n = 2, and R stays well conditioned however many parameters the model has.  The trace
    says little about each correlation of R, so where nothing else does η decides how close to
    singular R may come, and along a nearly singular direction the optimum is held only by its
    prior.  NA-DPVI's ``lkj_eta=None`` learns η around this centre, a factor e² either way at
    one standard deviation (:data:`LKJ_CONCENTRATION_WIDTH`): the released correlations inform
    it all together, so it grows where they are all within their noise of 0 and falls to about
    2 where some stand out (a strong correlation is improbable under a large η).

    Measured (TARP, ``tutorials/RESULTS.md``): with LKJ alone a fixed η = 2 made a 10-D
    regression with independent covariates several times too wide (ε = 1, K = 100: 0.116) and
    this centre calibrated it (0.031).  Beside the release, a hyperprior centred on LKJ(2) with
    width 1 drew nearly singular R (smallest eigenvalue median 0.05) at ε = 0.1, where each
    released correlation's noise (0.4–0.5) exceeds its spread under LKJ(2), and the regression
    came out too wide (0.086); this centre with width 2 reads 0.037 (paper 0.036).  With width
    1 the same centre had made the demo's logistic regression over-confident (0.047 at K = 200,
    its strong correlations shrunk); with width 2 it reads 0.042 (0.036 centred on 2).
    """
    return 0.75 * n + 0.5


#: The hyperprior on η: log(η − 1) ~ N(log(centre − 1), ``LKJ_CONCENTRATION_WIDTH``²), so η ≥ 1
#: (below 1 LKJ favours nearly singular R) and one standard deviation is a factor e² either way:
#: wide enough that a few strong released correlations take η down to about 2 from the centre
#: of a dozen parameters.  NUTS samples R non-centred (:func:`_from_sampler`), since a wide η
#: makes a funnel with the correlations it squeezes.
LKJ_CONCENTRATION_WIDTH = 2.0


#: Width of the released-curvature prior on each canonical partial correlation, on the scale
#: y = atanh(z), beside the release's noise: what the Monte Carlo draws, clipping and the gap
#: between the Fisher information and the Hessian leave uncertain.
RELEASED_CORRELATION_WIDTH = 0.1
#: Redraws of the release's noise from which the prior's width takes the noise's share.
RELEASED_CORRELATION_REDRAWS = 200
#: Smallest eigenvalue the centre of that prior may have, as a correlation matrix: a released
#: estimate that noise made indefinite is pulled back to this.
RELEASED_CORRELATION_FLOOR = 0.02
#: Prior probability that a canonical partial correlation of the records' curvature, where the
#: release observes it, is uniform on (−1, 1) rather than LKJ(η)'s (:func:`partial_correlation_logp`).
#: One η shrinks every correlation alike, so it cannot both hold near 0 the correlations that are
#: only the release's noise and leave alone the few strong ones that an intercept beside
#: uncentred covariates gives a GLM.  Under LKJ(η) alone the demo's logistic regression drew A
#: too well conditioned along its strongest correlation (intercept and w[male], about −0.8): over
#: 30 simulated data sets at ε = 1 the true Fisher information's smallest eigenvalue (as a
#: correlation) sat at the 27th percentile of its posterior on average, and below the 5th in a
#: sixth of them, so θ's linear-response draws had a core too narrow and heavy tails.  With η = 1
#: (no shrinkage) it sat at the 53rd, but the weak correlations' noise then made the other
#: weights too wide.  The slab lets each observed correlation escape the shrinkage on its own.
#: 0.5 and 0.2 were tried on the demo (its marginals up to 0.051 and 0.037 at K = 200); the
#: held-out classes were then measured at 0.2 (``tutorials/RESULTS.md``, stop 49).  Correlations
#: the release does not observe (:data:`RELEASED_INFORMATION_Z`) keep LKJ(η) alone: nothing
#: holds them but the prior, and with the slab on them too (and η fixed at its centre) the 10-D
#: regression at ε = 0.1, whose release is mostly below that threshold, read 0.110 at K = 100
#: against 0.037, its weights too wide.
CORRELATION_SLAB_WEIGHT = 0.2
#: How many of the observed correlations the slab expects to be strong at least: with k observed,
#: of which s lie more than :data:`STRONG_CORRELATION_DEVIATIONS` of their standard deviations from
#: 0, each gets the weight min(:data:`CORRELATION_SLAB_WEIGHT`, max(this, s) / k)
#: (:func:`correlation_slab_weights`).  At 0.2 each, the 10-D regression's 55 observed
#: correlations, all near 0 with noise sd ≈ 0.17 at ε = 0.3 and η learned at 10³–10⁴, each had a
#: posterior with two modes, LKJ's narrow spike and the slab's wide one; NUTS then took 137
#: leapfrog steps per draw against 15 without the slab, and its studies ran 9 times longer.  At
#: 2/55 it took 54.  Up to 10 observed correlations (the demo, GLMs of four parameters) keep 0.2.
EXPECTED_STRONG_CORRELATIONS = 2.0
#: Distance from 0, in its standard deviations, beyond which a released correlation counts as
#: strong for :func:`correlation_slab_weights` (a correlation of 0 passes it with probability
#: 0.3 %).  A logistic regression of six covariates correlated 0.7 step to step releases 21
#: correlations, all strong: weighted 2/21, 3 of 100 of its fits had divergent transitions
#: (none at 0.2), the slab's share too small for so many to escape LKJ(η).
STRONG_CORRELATION_DEVIATIONS = 3.0
#: Smallest share of A's μ-diagonal that the records' information is given when the prior's
#: curvature seems to account for all of it (a parameter the records do not inform, such as a
#: group scale, or a prior curvature at φ̄ larger than q's precision).
LIKELIHOOD_SHARE_FLOOR = 0.05


def partial_correlations(correlation: np.ndarray) -> np.ndarray:
    """The canonical partial correlations z of a correlation matrix, row by row below the
    diagonal: the inverse of :func:`correlation_cholesky` (with y = atanh(z))."""
    chol = np.linalg.cholesky(correlation)
    n = chol.shape[0]
    rows, cols = np.tril_indices(n, -1)
    # L_ij = z_ij √(1 − Σ_{k<j} L_ik²): the length left in row i before entry j.
    left = 1 - (np.cumsum(chol**2, axis=1) - chol**2)
    return chol[rows, cols] / np.sqrt(left[rows, cols])


def released_correlation_prior(
    fisher: np.ndarray, noise_std: float
) -> tuple[np.ndarray, np.ndarray]:
    """Centre and width of the prior on y = atanh(z), z the canonical partial correlations of
    the correlation R of the records' share of A's μ-block, from the released curvature.

    A's μ-block is the ELBO's curvature in μ: the curvature of the model's prior part,
    E_q[−∇² log p(θ)], which is public, plus the records' share D^½ R D^½ (see
    :func:`curvature_blocks`).  The release estimates the records' share up to a factor
    (clipping shrinks it) by the empirical Fisher information ``fisher``, the sum of the outer
    products of their μ-gradients, which near the optimum equals it in expectation for a
    well-specified model.  The centre is the Fisher information's correlation with its
    eigenvalues floored at ``RELEASED_CORRELATION_FLOOR``; a coordinate whose released
    information is not positive gets no correlation from it.

    Each width adds ``RELEASED_CORRELATION_WIDTH`` in quadrature to the spread of y over
    ``RELEASED_CORRELATION_REDRAWS`` redraws of the release's noise (``noise_std`` per entry of
    ``fisher``, independent on and above the diagonal) around the released value: the noise is
    public, so this costs no privacy and needs no approximation of the map to y.
    """
    fisher = np.asarray(fisher, dtype=float)
    centre = _released_correlations(fisher)
    redrawn = np.stack(
        [_released_correlations(fisher + e) for e in _noise_redraws(noise_std, fisher.shape[0])]
    )
    width = np.sqrt(redrawn.var(axis=0) + RELEASED_CORRELATION_WIDTH**2)
    return centre, width


def released_fisher_correlations(
    fisher: np.ndarray, noise_std: float
) -> tuple[np.ndarray, np.ndarray]:
    """The released Fisher information's correlations, row by row below the diagonal, and the
    standard deviation each has as an observation of the records' curvature: its spread over
    ``RELEASED_CORRELATION_REDRAWS`` redraws of the release's noise (public), with
    ``RELEASED_CORRELATION_WIDTH`` added in quadrature for what clipping and the gap between the
    Fisher information and the Hessian leave.  A coordinate whose released information is not
    ``RELEASED_INFORMATION_Z`` noise standard deviations above 0 says nothing about its
    correlations (their deviation is ``UNINFORMATIVE_DEVIATION``)."""
    fisher = np.asarray(fisher, dtype=float)
    n = fisher.shape[0]
    rows, cols = np.tril_indices(n, -1)
    redrawn = np.stack(
        [_fisher_correlation(fisher + e)[rows, cols] for e in _noise_redraws(noise_std, n)]
    )
    std = np.sqrt(redrawn.var(axis=0) + RELEASED_CORRELATION_WIDTH**2)
    informative = np.diagonal(fisher) > RELEASED_INFORMATION_Z * noise_std
    std = np.where(informative[rows] & informative[cols], std, UNINFORMATIVE_DEVIATION)
    return _fisher_correlation(fisher)[rows, cols], std


def _noise_redraws(noise_std: float, n: int) -> np.ndarray:
    """``RELEASED_CORRELATION_REDRAWS`` symmetric n × n redraws of the release's noise, with
    independent entries on and above the diagonal (a fixed seed: the noise is public)."""
    noise = np.random.default_rng(0).normal(0.0, noise_std, (RELEASED_CORRELATION_REDRAWS, n, n))
    return np.triu(noise) + np.swapaxes(np.triu(noise, 1), -1, -2)


#: Standard deviation given to a released correlation that carries no information.
UNINFORMATIVE_DEVIATION = 1e6
#: How many of its noise's standard deviations a coordinate's released information must exceed
#: for its correlations to be read.  Below about 3 the redraws understate how far noise moves a
#: correlation (dividing by a diagonal that is mostly noise): with no correlation at all, the
#: squared ratio of each released correlation to its deviation averaged 2.1 at one noise
#: standard deviation of information and 1.5 at two, against 1.1 at three, so pure noise read as
#: correlation and pulled η down (the 10-D regression at ε = 0.1, ``tutorials/RESULTS.md``).
RELEASED_INFORMATION_Z = 3.0


def _fisher_correlation(fisher: np.ndarray) -> np.ndarray:
    information = np.diagonal(fisher)
    scale = np.where(information > 0, np.sqrt(np.abs(information)), np.inf)
    return np.clip(fisher / np.outer(scale, scale), -1.0, 1.0)


def _released_correlations(fisher: np.ndarray) -> np.ndarray:
    """y = atanh(z) of the centre of :func:`released_correlation_prior`."""
    return correlation_parameters(_fisher_correlation(fisher))


def correlation_parameters(correlation: np.ndarray) -> np.ndarray:
    """y = atanh(z) (:func:`correlation_cholesky`) of a symmetric matrix with unit diagonal,
    its eigenvalues first raised to ``RELEASED_CORRELATION_FLOOR`` so that noise which made it
    indefinite, or singular, leaves a correlation matrix with finite y."""
    correlation = _floor_eigenvalues(correlation, RELEASED_CORRELATION_FLOOR)
    root = np.sqrt(np.diagonal(correlation))
    return np.arctanh(partial_correlations(correlation / np.outer(root, root)))


def _floor_eigenvalues(matrix: np.ndarray, floor: float) -> np.ndarray:
    """The symmetric part of ``matrix`` with its eigenvalues raised to at least ``floor``."""
    eigenvalues, eigenvectors = np.linalg.eigh((matrix + matrix.T) / 2)
    return (eigenvectors * np.maximum(eigenvalues, floor)) @ eigenvectors.T


def fitted_prior_curvature(curvature: np.ndarray, diagonal: np.ndarray) -> np.ndarray:
    """The model's prior curvature P as the fixed part of A's μ-block, whose diagonal is centred
    on ``diagonal``: P's nearest positive semi-definite matrix (its negative eigenvalues set to
    0), scaled down coordinate by coordinate where its diagonal would exceed
    1 − ``LIKELIHOOD_SHARE_FLOOR`` of ``diagonal``.

    A = P + D^½ R D^½ must be positive definite, and the prior's curvature E_q[−∇² log p(θ)]
    need not be (a hierarchical prior's funnel is not log-concave); setting its negative
    eigenvalues to 0 raises its diagonal.  The centre of A's diagonal, q's precision at its
    optimum, is exact for a mean-field Gaussian, so P may take most of it, not all: the scaling
    keeps P's correlations and leaves the records' share of every coordinate at least
    ``LIKELIHOOD_SHARE_FLOOR`` of it.
    """
    positive = _floor_eigenvalues(curvature, 0.0)
    room = (1 - LIKELIHOOD_SHARE_FLOOR) * np.asarray(diagonal, dtype=float)
    scale = np.sqrt(room / np.maximum(np.diagonal(positive), room))
    return scale[:, None] * positive * scale[None, :]


#: Largest number of model parameters for which ``curvature="auto"`` uses a full μ-block.
MAX_FULL_CURVATURE = 30
#: NUTS target acceptance rate.  The full μ-block's LKJ correlation makes a funnel-like geometry:
#: at blackjax's default 0.8 the 5-parameter logistic regression of ``dpppl demo`` had up to 16
#: divergent transitions per 4000 draws; at 0.95, 0–2 (8 chains), for about 1.4× the time.  The
#: diagonal A has none at 0.8.  The full block is worth it: on that model's TARP study (K = 24)
#: the joint coverage RMSE was 0.075 with it and 0.182 with the diagonal A (over-confident).
TARGET_ACCEPT = {False: 0.8, True: 0.95}
#: NUTS's target acceptance rate for a fit redrawn after its first run diverged
#: (:func:`run_nuts`).  On the three fits of 200 whose likelihood-model NUTS diverged (1–9
#: divergent transitions in 500 draws; held-out Gamma regression and varying intercepts over 20
#: groups, ε = 1, tune 300), three more runs each at 0.95 diverged in 4 of 9, with tune 1000 in
#: 3 of 9, at 0.99 in 1 of 9 (``tutorials/RESULTS.md``, stop 73).
REDRAW_TARGET_ACCEPT = 0.99


class TraceStatistics(NamedTuple):
    """Sufficient statistics of the trace after burn-in, one entry per coordinate of φ.

    ``x_t = φ_t − φ̄`` is the centred trace, so Σ x_t = 0 and φ* = φ̄ + δ.  With an anchored
    phase (:meth:`from_trace`) φ̄ is the anchor, the sums are those of the residuals the
    likelihood keeps after its free offset is integrated out, and ``count`` counts the anchored
    gradients alone.
    """

    count: jax.Array  # gradients that inform δ: T − T*, or the anchored ones
    noise_count: jax.Array  # residual degrees of freedom of the noise: T − T*, or T − T* − 1
    phi_bar: jax.Array  # φ̄
    sum_g2: jax.Array  # Σ g̃², (d,)
    sum_gx: jax.Array  # Σ g̃ xᵀ, (d, d)
    sum_g: jax.Array  # Σ g̃, (d,)
    sum_xx: jax.Array  # Σ x xᵀ, (d, d)
    noise_std: jax.Array  # σ C / β
    rate: jax.Array  # κ
    prior_v_mean: jax.Array
    prior_v_std: jax.Array
    subsampling_scale: jax.Array  # prior scale of ς per coordinate (used when Σ_sub is modelled)
    #: The model's own prior of the optimum, N(φ̄ + b, P_m⁻¹) with P_m diagonal: b (``model_offset``)
    #: is the prior's centre minus φ̄ and P_m (``model_precision``) 1 / scale² of the prior of θ,
    #: for μ; both 0 for u (used by the ``"model-bounded"`` optimum prior).
    model_precision: jax.Array
    model_offset: jax.Array
    #: Prior of the correlation of the records' share of the μ-block from the released curvature
    #: (:func:`released_correlation_prior`): centre and width of each canonical partial
    #: correlation on the unconstrained scale y = atanh(z), row by row below the diagonal; empty
    #: without the release.
    correlation_centre: jax.Array = jnp.zeros(0)
    correlation_width: jax.Array = jnp.zeros(0)
    #: The release read as an observation of the records' share of the μ-block
    #: (:func:`released_fisher_correlations`): its correlations and their standard deviations,
    #: and the model's prior curvature P at φ̄ (n × n, positive semi-definite) that A's μ-block
    #: adds to that share (:func:`curvature_blocks`); empty without the release.
    fisher_correlation: jax.Array = jnp.zeros(0)
    fisher_correlation_std: jax.Array = jnp.zeros(0)
    prior_curvature: jax.Array = jnp.zeros((0, 0))

    @classmethod
    def from_trace(
        cls,
        phi: np.ndarray,
        noisy_grad: np.ndarray,
        *,
        burn_in: int,
        noise_std: np.ndarray,
        rate: float,
        subsampling_scale: np.ndarray,
        curvature_prior: str = "structural",
        anchored: int = 0,
        model_prior: tuple[np.ndarray, np.ndarray] | None = None,
        released_curvature: (
            tuple[np.ndarray, float, Callable[[np.ndarray], np.ndarray]] | None
        ) = None,
    ) -> TraceStatistics:
        """Statistics of the pairs (φ_t, g̃_{t+1}) for t = ``burn_in`` … T − 1.

        With ``anchored`` > 0 the last ``anchored`` gradients were taken at one fixed point, the
        anchor φ_a (see :func:`dpppl_na_dpvi.dpsgd.run_dpsgd`), and the free steps before them
        get a gradient model with an offset of their own, g̃ ~ N(κA(φ − φ*) + b, V) with b
        unknown (flat prior, integrated out): b absorbs the bias that a nonlinear gradient
        averaged over the trace's wander has, so the free steps inform the curvature A only
        (through their centred gradients and iterates) and the anchored ones, g̃ ~ N(κA(φ_a −
        φ*), V), locate φ*.  φ̄ is then the anchor.

        ``curvature_prior`` picks the prior of A: ``"trace"`` is the paper's (Appendix H.3),
        centred on the least-squares slope of g̃ on φ with one standard error as its width;
        ``"structural"`` centres it on the curvature the mean-field Gaussian ELBO has at its
        own optimum, read off the trace mean φ̄ = (μ̄, ū): A_μ = 1/softplus(ū) exactly (the
        optimality condition of the variance), A_u = sigmoid(ū)² / (2 softplus(ū)²) (exact for a
        Gaussian posterior), with a relative width of ``STRUCTURAL_PRIOR_WIDTH``.

        ``model_prior`` is the centre, scale and normality of the model's prior of each
        parameter ((n,) each), public (see :func:`dpppl.plugin.prior_summary`); None leaves the
        optimum without it.

        ``released_curvature`` is the released empirical Fisher information of the records'
        μ-gradients, averaged over the steps read (n × n, any positive scale), the standard
        deviation of its noise per entry, and the curvature of the model's prior part of the
        ELBO in μ as a function of φ (public).  Both readings of it are kept, whichever
        :attr:`ModelStructure.correlation_prior` asks for: the prior of
        :func:`released_correlation_prior` (whose centre also starts NUTS for the likelihood
        reading) and the observations of :func:`released_fisher_correlations`.  The prior's
        curvature at φ̄ becomes the fixed part P of A's μ-block (:func:`curvature_blocks`), and
        the prior of A's diagonal becomes one of the records' share: its centre less P's.
        """
        end = len(noisy_grad) - anchored
        x = phi[burn_in:end]
        g = noisy_grad[burn_in:end]
        if anchored:
            phi_bar = phi[end]
            anchored_g = noisy_grad[end:]
            g = g - g.mean(axis=0)
            x = x - x.mean(axis=0)
            count, noise_count = len(anchored_g), len(x) - 1 + len(anchored_g)
            sum_g2 = (g**2).sum(axis=0) + (anchored_g**2).sum(axis=0)
        else:
            phi_bar = x.mean(axis=0)
            anchored_g = g
            x = x - phi_bar
            count = noise_count = len(x)
            sum_g2 = (g**2).sum(axis=0)
        sum_gx, sum_x2 = (g * x).sum(axis=0), (x**2).sum(axis=0)
        if curvature_prior == "trace":
            # Least-squares slope of g̃ on κ(φ − φ̄) and its standard error under the DP noise.
            slope_std = noise_std / (rate * np.sqrt(sum_x2))
            centre = np.maximum(np.abs(sum_gx) / (rate * sum_x2), slope_std)
            width = slope_std
        elif curvature_prior == "structural":
            u_bar = phi_bar[len(phi_bar) // 2 :]
            variance = np.logaddexp(0.0, u_bar)
            slope_u = 1 / (1 + np.exp(-u_bar))
            centre = np.concatenate([1 / variance, slope_u**2 / (2 * variance**2)])
            width = STRUCTURAL_PRIOR_WIDTH * centre
        else:
            raise ValueError(f"unknown curvature prior {curvature_prior!r}")
        v_mean = np.log(centre)
        v_std = width / centre
        n = len(phi_bar) // 2
        model_precision, model_offset = np.zeros(2 * n), np.zeros(2 * n)
        if model_prior is not None:
            # Only where a normal describes the prior, tails included: a normal summary of a
            # long-tailed prior would pull a small scale parameter's optimum back to the centre
            # (a regression with varying intercepts, whose group scale is small in some
            # simulated data sets, went from a TARP RMSE of 0.049 to 0.124 at K = 40).
            centre, scale, normal = (np.asarray(a, dtype=float) for a in model_prior)
            normal = normal.astype(bool)
            model_precision[:n][normal] = scale[normal] ** -2.0
            model_offset[:n][normal] = (centre - phi_bar[:n])[normal]
        correlation_centre = correlation_width = fisher_correlation = fisher_std = np.zeros(0)
        prior_curvature_mu = np.zeros((0, 0))
        if released_curvature is not None:
            fisher, fisher_noise, prior_curvature = released_curvature
            diagonal = np.exp(v_mean[:n])
            prior_curvature_mu = fitted_prior_curvature(prior_curvature(phi_bar), diagonal)
            # v is then the log of the records' share of A's μ-diagonal: what the model's
            # prior curvature leaves of the centre, so A's diagonal keeps its centre.
            v_mean[:n] = np.log(diagonal - np.diagonal(prior_curvature_mu))
            correlation_centre, correlation_width = released_correlation_prior(
                fisher, fisher_noise
            )
            fisher_correlation, fisher_std = released_fisher_correlations(fisher, fisher_noise)
        return cls(
            count=jnp.asarray(float(count)),
            noise_count=jnp.asarray(float(noise_count)),
            phi_bar=jnp.asarray(phi_bar),
            sum_g2=jnp.asarray(sum_g2),
            sum_gx=jnp.asarray(g.T @ x),
            sum_g=jnp.asarray(anchored_g.sum(axis=0)),
            sum_xx=jnp.asarray(x.T @ x),
            noise_std=jnp.asarray(noise_std, dtype=float),
            rate=jnp.asarray(float(rate)),
            prior_v_mean=jnp.asarray(v_mean),
            prior_v_std=jnp.asarray(v_std),
            subsampling_scale=jnp.asarray(subsampling_scale, dtype=float),
            model_precision=jnp.asarray(model_precision),
            model_offset=jnp.asarray(model_offset),
            correlation_centre=jnp.asarray(correlation_centre),
            correlation_width=jnp.asarray(correlation_width),
            fisher_correlation=jnp.asarray(fisher_correlation),
            fisher_correlation_std=jnp.asarray(fisher_std),
            prior_curvature=jnp.asarray(prior_curvature_mu, dtype=float),
        )


@dataclass(frozen=True)
class ModelStructure:
    """Which optional parts the post-processing model has (static: they change its shape).

    ``integrated_optimum``: given A (and ς), the noisy gradients are linear-Gaussian in the
    optimum, so δ = φ* − φ̄ is integrated out of the density in closed form and drawn exactly
    from its conditional N(P⁻¹h, P⁻¹) after sampling (:func:`draw_optimum`); the sampler then
    sees only A's parameters, without the funnel between φ* and A.

    ``optimum_prior``: ``"unit-information"`` (δ | A ~ N(0, T J⁻¹)), ``"model-bounded"`` or
    ``"standard-normal"`` (δ ~ N(0, I), the paper's); see the module's notes.
    ``"model-bounded"`` (integrated optimum only) draws A from its unit-information posterior
    and δ | A from that prior times the model's own prior of the optimum,
    N(b, P_m⁻¹) (:class:`TraceStatistics`): the optimum of q is about the posterior mean, which
    cannot sit far outside the prior.  In A's posterior the model's prior would bring back the
    Occam factor |P_m + J|^(−½) ∝ 1/|det A| where the trace says little, which the
    unit-information prior was chosen to avoid.
    """

    full_curvature: bool = False
    subsampling: bool = False
    integrated_optimum: bool = False
    optimum_prior: str = "unit-information"
    #: η of the LKJ prior on the μ-block's correlation, or None to learn it under the hyperprior
    #: of :func:`lkj_concentration_centre`.  A Laplace fit needs a fixed η: the joint mode of a
    #: learned one is degenerate (the LKJ density at R = I grows without bound in η).
    lkj_eta: float | None = 2.0
    #: Prior of the μ-block's correlation: ``"lkj"``, LKJ(η); ``"released"``, the
    #: released-curvature prior of :class:`TraceStatistics` instead; ``"released-likelihood"``,
    #: LKJ(η) with the released curvature read as an observation of the correlation
    #: (:func:`_released_likelihood`).  Both released readings start NUTS at the released
    #: prior's centre.
    correlation_prior: Literal["lkj", "released", "released-likelihood"] = "lkj"


def _log_concentration_centre(n: int) -> float:
    """log(η − 1) at the centre of a learned η's hyperprior (:func:`lkj_concentration_centre`)."""
    return float(np.log(lkj_concentration_centre(n) - 1))


def n_correlations(stats: TraceStatistics, full: bool) -> int:
    """Number of free correlation parameters of the μ-block of A."""
    n = stats.phi_bar.shape[0] // 2
    return n * (n - 1) // 2 if full else 0


def _n_concentrations(stats: TraceStatistics, structure: ModelStructure) -> int:
    """1 when η is learned for a full μ-block under the LKJ prior (its log-concentration
    ρ = log(η − 1)), else 0."""
    full = n_correlations(stats, structure.full_curvature) > 0
    return int(full and structure.lkj_eta is None and structure.correlation_prior != "released")


def n_shape_parameters(stats: TraceStatistics, structure: ModelStructure) -> int:
    """Parameters of the μ-block's correlation: its free correlations and, when there are any and
    η is learned, the log-concentration ρ = log(η − 1) of their LKJ prior."""
    return n_correlations(stats, structure.full_curvature) + _n_concentrations(stats, structure)


def _layout(d: int, n_corr: int, n_rho: int = 0) -> tuple[slice, ...]:
    """Where δ, v, y, ρ and ς lie in the flat parameter vector of the post-processing model."""
    end = 2 * d + n_corr + n_rho
    return (
        slice(0, d),
        slice(d, 2 * d),
        slice(2 * d, 2 * d + n_corr),
        slice(2 * d + n_corr, end),
        slice(end, None),
    )


def unpack(params: jax.Array, d: int, n_corr: int, n_rho: int = 0) -> tuple[jax.Array, ...]:
    """(δ, v, y, ρ, ς) from the flat parameter vector of the post-processing model: y holds the
    ``n_corr`` correlations (none for a diagonal A), ρ the ``n_rho`` (0 or 1) log-concentration
    of a learned η.  Only the slices after y depend on ``n_rho``."""
    return tuple(params[part] for part in _layout(d, n_corr, n_rho))


def log_sech_squared(y: jax.Array) -> jax.Array:
    """log(1 − tanh(y)²) = 2 log sech(y), to full relative precision for every y.

    For |y| ≥ 1 it is 2 (log 2 − |y| − log(1 + e^(−2|y|))), where 1 − tanh(y)² underflows; for
    small |y| that form is a difference of numbers near log 2 that should give −y², so it carries
    an absolute error of 10⁻¹⁶, which LKJ(η) multiplies by η: at η ≈ 10¹⁵ the density was rough
    at that scale and NUTS's step size fell to 10⁻¹².  There log1p(−tanh(y)²) is exact.
    """
    magnitude = jnp.abs(y)
    # Each form sees only the y it is used for, so neither's gradient is NaN.
    near = jnp.where(magnitude < 1, y, 0.0)
    far = jnp.where(magnitude < 1, 1.0, magnitude)
    return jnp.where(
        magnitude < 1,
        jnp.log1p(-jnp.tanh(near) ** 2),
        2 * (np.log(2.0) - far - jnp.log1p(jnp.exp(-2 * far))),
    )


def correlation_cholesky(y: jax.Array, n: int) -> tuple[jax.Array, jax.Array]:
    """Cholesky factor of a correlation matrix from unconstrained y, and log|Jacobian|.

    Canonical partial correlations z = tanh(y) fill the strict lower triangle row by row (as in
    Stan's ``cholesky_factor_corr``): L_ij = z_ij √(Π_{k<j} (1 − z_ik²)) and
    L_ii = √(Π_{k<i} (1 − z_ik²)).  The log-Jacobian is that of y ↦ L's free entries.  Written
    with cumulative sums rather than a loop over entries: the unrolled loop made XLA compile
    the Laplace fit's Hessian for 5 minutes at 12 parameters.
    """
    rows, cols = np.tril_indices(n, -1)
    log_one_minus_z2 = log_sech_squared(y)
    log_terms = jnp.zeros((n, n)).at[rows, cols].set(log_one_minus_z2)
    # log of the squared length left for entry (i, j) after the entries before it in row i.
    log_remaining = (jnp.cumsum(log_terms, axis=1) - log_terms)[rows, cols]
    strict = jnp.zeros((n, n)).at[rows, cols].set(jnp.tanh(y) * jnp.exp(0.5 * log_remaining))
    chol = strict + jnp.diag(jnp.exp(0.5 * log_terms.sum(axis=1)))
    log_jac = jnp.sum(log_one_minus_z2) + 0.5 * jnp.sum(log_remaining)
    return chol, log_jac


def correlation_slab_weights(correlation: jax.Array, std: jax.Array) -> jax.Array:
    """Each released correlation's slab weight, given its ``std``: 0 where the release does not
    observe it (:data:`UNINFORMATIVE_DEVIATION`), else :data:`CORRELATION_SLAB_WEIGHT`, or
    max(:data:`EXPECTED_STRONG_CORRELATIONS`, s) / k where that is smaller, for k observed of
    which s lie beyond :data:`STRONG_CORRELATION_DEVIATIONS` standard deviations from 0."""
    observed = std < UNINFORMATIVE_DEVIATION
    strong = jnp.sum(observed & (jnp.abs(correlation) > STRONG_CORRELATION_DEVIATIONS * std))
    expected = jnp.maximum(EXPECTED_STRONG_CORRELATIONS, strong)
    weight = jnp.minimum(CORRELATION_SLAB_WEIGHT, expected / jnp.maximum(jnp.sum(observed), 1))
    return jnp.where(observed, weight, 0.0)


def _slab_weights(stats: TraceStatistics, structure: ModelStructure) -> jax.Array | float:
    """:func:`correlation_slab_weights` where the model has the slab, else 0."""
    if structure.correlation_prior != "released-likelihood":
        return 0.0
    return correlation_slab_weights(stats.fisher_correlation, stats.fisher_correlation_std)


def partial_correlation_logp(
    y: jax.Array,
    n: int,
    eta: jax.Array,
    slab: jax.Array | float = 0.0,
    slab_barrier: float | None = None,
) -> jax.Array:
    """log density of the correlation parameters y of an n × n correlation matrix
    (:func:`correlation_cholesky`): each canonical partial correlation z = tanh(y), in column j,
    is drawn from LKJ(η)'s own Beta((1 + z)/2; b, b), b = η + (n − 2 − j)/2 (Lewandowski,
    Kurowicka & Joe, 2009), with probability 1 − ``slab``, and with probability ``slab`` from
    the alternative: uniform on (−1, 1), or where ``slab_barrier`` is a width s, the density
    ∝ exp(−y²/2s²) in z, flat where |y| ≪ s and falling to 0 at ±1 (:func:`barrier_logp`).
    With ``slab`` = 0 this is the LKJ(η) density of R, normalised."""
    _, cols = np.tril_indices(n, -1)
    b = eta + (n - 2 - cols) / 2
    # (1 − z²) is also dz/dy.
    log_one_minus_z2 = log_sech_squared(y)
    spike = b * log_one_minus_z2 + _symmetric_beta_log_normaliser(b)
    alternative = log_one_minus_z2 - np.log(2.0)
    if slab_barrier is not None:
        alternative = barrier_logp(y, slab_barrier)
    # Where slab = 0 the second term is −inf and logaddexp returns the spike, gradient included.
    return jnp.sum(jnp.logaddexp(jnp.log1p(-slab) + spike, jnp.log(slab) + alternative))


def barrier_logp(y: jax.Array, width: float) -> jax.Array:
    """log density in y = atanh(z) of a correlation z whose density in z is ∝ exp(−y²/2s²), s
    = ``width``: nearly uniform where |z| is well below tanh(s), with a barrier at ±1 whose tail
    in y is Gaussian, thinner than the uniform's exp(−2|y|), which NUTS crossed into nearly
    singular correlation matrices."""
    grid = np.linspace(-12.0 * width, 12.0 * width, 20001)
    density = np.cosh(grid) ** -2.0 * np.exp(-0.5 * (grid / width) ** 2)
    log_normaliser = np.log(np.sum(density) * (grid[1] - grid[0]))
    return log_sech_squared(y) - 0.5 * (y / width) ** 2 - log_normaliser


def curvature_blocks(
    params: jax.Array, stats: TraceStatistics, full: bool
) -> tuple[jax.Array, jax.Array]:
    """The two blocks of the block-diagonal curvature A: the μ-block (n × n; diagonal unless
    ``full``) and the diagonal of the u-block (n,).

    A full μ-block is D^½ R D^½ with D = diag(exp(v)) and R the correlation of y, plus the model's
    prior curvature P where the statistics hold it (the released curvature): v and R are then the
    records' share, and P's correlations are exact rather than held by R's prior.
    """
    d = stats.phi_bar.shape[0]
    n = d // 2
    _, v, y, _, _ = unpack(params, d, n_correlations(stats, full))
    scale = jnp.exp(0.5 * v)
    if not full:
        return jnp.diag(scale[:n] ** 2), scale[n:] ** 2
    chol, _ = correlation_cholesky(y, n)
    records = scale[:n, None] * (chol @ chol.T) * scale[None, :n]
    if not stats.prior_curvature.size:
        return records, scale[n:] ** 2
    return records + stats.prior_curvature, scale[n:] ** 2


def curvature(params: jax.Array, stats: TraceStatistics, full: bool) -> jax.Array:
    """The curvature matrix A (d × d) at the post-processing model's parameters."""
    return _block_matrix(*curvature_blocks(params, stats, full))


def _block_matrix(mu_block: jax.Array, u_diagonal: jax.Array) -> jax.Array:
    return jax.scipy.linalg.block_diag(mu_block, jnp.diag(u_diagonal))


def _residual_ss(
    mu_block: jax.Array, u_diagonal: jax.Array, delta: jax.Array, stats: TraceStatistics
) -> jax.Array:
    """Σ_t (g̃_{t+1} − κA(x_t − δ))², coordinate by coordinate, from the trace's sums.

    A is block diagonal, so only the μμ-blocks and the u-diagonals of the sums are read: at
    d = 24 that makes the sampler's gradient 2.3× faster than products of d × d matrices.
    """
    n = u_diagonal.shape[0]
    spread = stats.sum_xx + stats.count * jnp.outer(delta, delta)
    cross = stats.sum_gx - jnp.outer(stats.sum_g, delta)
    ka_mu, ka_u = stats.rate * mu_block, stats.rate * u_diagonal
    mu = (
        stats.sum_g2[:n]
        - 2 * jnp.sum(ka_mu * cross[:n, :n], axis=1)
        + jnp.sum((ka_mu @ spread[:n, :n]) * ka_mu, axis=1)
    )
    u = (
        stats.sum_g2[n:]
        - 2 * ka_u * jnp.diagonal(cross)[n:]
        + ka_u**2 * jnp.diagonal(spread)[n:]
    )
    return jnp.concatenate([mu, u])


def _full_parameters(params: jax.Array, d: int, structure: ModelStructure) -> jax.Array:
    """(δ, v, y, ς), with δ = 0 in front when the sampler's vector leaves δ out."""
    if structure.integrated_optimum:
        return jnp.concatenate([jnp.zeros(d, dtype=params.dtype), params])
    return params


def _noise_and_prior(
    params: jax.Array, stats: TraceStatistics, structure: ModelStructure
) -> tuple[jax.Array, jax.Array]:
    """The noise variance of each gradient coordinate and the log prior of A and ς."""
    d = stats.phi_bar.shape[0]
    n = d // 2
    n_corr = n_correlations(stats, structure.full_curvature)
    n_rho = _n_concentrations(stats, structure)
    _, v, y, rho, sub = unpack(params, d, n_corr, n_rho)
    variance = stats.noise_std**2
    log_prior = -0.5 * jnp.sum(((v - stats.prior_v_mean) / stats.prior_v_std) ** 2)
    if n_corr and structure.correlation_prior == "released":
        log_prior = log_prior - 0.5 * jnp.sum(
            ((y - stats.correlation_centre) / stats.correlation_width) ** 2
        )
    elif n_corr:
        released = structure.correlation_prior == "released-likelihood"
        log_prior = log_prior + correlation_logp(
            y,
            rho,
            n,
            structure.lkj_eta,
            (stats.fisher_correlation, stats.fisher_correlation_std) if released else None,
            _slab_weights(stats, structure),
        )
    if sub.shape[0]:
        variance = variance + sub**2
        log_prior = log_prior - 0.5 * jnp.sum((sub / stats.subsampling_scale) ** 2)
    return variance, log_prior


#: Shape past which :func:`_symmetric_beta_log_normaliser` takes its asymptotic series, whose
#: first omitted term is below 10⁻¹¹ there.
ASYMPTOTIC_BETA_SHAPE = 100.0


def _symmetric_beta_log_normaliser(b: jax.Array) -> jax.Array:
    """−(2b − 1) log 2 − log B(b, b), the log normaliser of z = 2x − 1 for x ~ Beta(b, b).

    By Legendre's duplication formula it is log Γ(b + ½) − log Γ(b) − ½ log π.  Written as a
    difference of log-gamma values it cancels catastrophically for large b: at η ≈ 10¹⁴, which
    a warm-up trajectory reached where the release holds every correlation near 0, the density
    moved by 12 between points 10⁻⁹ apart in log η and NUTS's step size fell to 10⁻¹³.  Past
    ``ASYMPTOTIC_BETA_SHAPE`` the ratio's asymptotic series is used instead.
    """
    # Each branch sees only the shapes it is used for (jnp.where, unlike jnp.minimum, passes
    # the whole gradient at the threshold itself).
    asymptotic = b > ASYMPTOTIC_BETA_SHAPE
    large = jnp.where(asymptotic, b, ASYMPTOTIC_BETA_SHAPE)
    series = 0.5 * jnp.log(large) - 1 / (8 * large) + 1 / (192 * large**3)
    small = jnp.where(asymptotic, ASYMPTOTIC_BETA_SHAPE, b)
    exact = jax.scipy.special.gammaln(small + 0.5) - jax.scipy.special.gammaln(small)
    return jnp.where(asymptotic, series, exact) - 0.5 * np.log(np.pi)


def correlation_logp(
    y: jax.Array,
    rho: jax.Array,
    n: int,
    lkj_eta: float | None,
    released: tuple[jax.Array, jax.Array] | None = None,
    slab: jax.Array | float = 0.0,
    slab_barrier: float | None = None,
) -> jax.Array:
    """log prior density of the correlation parameters y of an n × n correlation R
    (:func:`correlation_cholesky`) and, when η is learned (``lkj_eta`` None), of its
    log-concentration ρ = log(η − 1) under the hyperprior of :func:`lkj_concentration_centre`;
    with ``released`` (the released Fisher correlations and their standard deviations, from
    :func:`released_fisher_correlations`), also their likelihood given R.  ``slab`` is each
    canonical partial correlation's weight of the alternative to LKJ(η)'s, uniform or with a
    barrier of width ``slab_barrier`` (:func:`partial_correlation_logp`)."""
    log_prior = jnp.zeros(())
    if lkj_eta is None:
        eta = 1 + jnp.exp(rho[0])
        centre = _log_concentration_centre(n)
        log_prior = log_prior - 0.5 * ((rho[0] - centre) / LKJ_CONCENTRATION_WIDTH) ** 2
    else:
        eta = lkj_eta
    log_prior = log_prior + partial_correlation_logp(y, n, eta, slab, slab_barrier)
    if released is not None:
        # Only the released likelihood reads R itself; the prior reads y directly.
        log_prior = log_prior + _released_likelihood(correlation_cholesky(y, n)[0], *released)
    return log_prior


def _released_likelihood(
    chol: jax.Array, correlation: jax.Array, std: jax.Array
) -> jax.Array:
    """log density of the released Fisher ``correlation`` (row by row below the diagonal, each
    with its standard deviation ``std``) given the correlation R = chol cholᵀ of the records'
    share of the μ-block (:func:`curvature_blocks`): they observe it entry by entry."""
    rows, cols = np.tril_indices(chol.shape[0], -1)
    residual = (correlation - (chol @ chol.T)[rows, cols]) / std
    return -0.5 * jnp.sum(residual**2)


def _trace_information(ka: jax.Array, variance: jax.Array, stats: TraceStatistics) -> jax.Array:
    """J = T (κA)ᵀV⁻¹(κA): the information the trace's T gradients carry about δ given A."""
    return stats.count * (ka.T / variance) @ ka


def _optimum_prior_precision(
    ka: jax.Array, variance: jax.Array, stats: TraceStatistics, structure: ModelStructure
) -> jax.Array:
    """Precision of δ's prior given A: I (``"standard-normal"``, the paper's N(φ̄, I)), J / T
    (``"unit-information"``, Zellner's g-prior with g = T: as much as one gradient says), or
    J / T plus the model prior's precision (``"model-bounded"``: never wider than the model's
    own prior of θ)."""
    if structure.optimum_prior == "standard-normal":
        return jnp.eye(ka.shape[0])
    if structure.optimum_prior == "unit-information":
        return _trace_information(ka, variance, stats) / stats.count
    if structure.optimum_prior == "model-bounded":
        unit = _trace_information(ka, variance, stats) / stats.count
        return unit + jnp.diag(stats.model_precision)
    raise ValueError(f"unknown optimum prior {structure.optimum_prior!r}")


def _optimum_precision(
    ka: jax.Array, variance: jax.Array, stats: TraceStatistics, structure: ModelStructure
) -> tuple[jax.Array, jax.Array]:
    """L and z = L⁻¹h for δ | A ~ N(P⁻¹h, P⁻¹): P = LLᵀ = P₀ + T (κA)ᵀV⁻¹(κA) combines δ's
    prior precision P₀ with the trace, h = −(κA)ᵀV⁻¹ Σ g̃ (the centred trace has Σ x = 0),
    plus P_m b for the model's prior N(b, P_m⁻¹) of δ where it is modelled."""
    weighted = ka.T / variance
    precision = _optimum_prior_precision(ka, variance, stats, structure) + (
        stats.count * weighted @ ka
    )
    h = -weighted @ stats.sum_g
    if structure.optimum_prior == "model-bounded":
        h = h + stats.model_precision * stats.model_offset
    chol = jnp.linalg.cholesky(precision)
    z = jax.scipy.linalg.solve_triangular(chol, h, lower=True)
    return chol, z


def log_density(
    params: jax.Array, stats: TraceStatistics, structure: ModelStructure = ModelStructure()
) -> jax.Array:
    """Log posterior density of the post-processing model (up to a constant); with
    ``structure.integrated_optimum`` the marginal density of A's parameters."""
    d = stats.phi_bar.shape[0]
    params = _full_parameters(params, d, structure)
    delta = params[:d]
    blocks = curvature_blocks(params, stats, structure.full_curvature)
    variance, log_prior = _noise_and_prior(params, stats, structure)
    residual_ss = _residual_ss(*blocks, delta, stats)
    log_lik = -0.5 * jnp.sum(residual_ss / variance + stats.noise_count * jnp.log(variance))
    if structure.integrated_optimum and structure.optimum_prior in MARGINAL_UNIT_INFORMATION:
        # P₀ = J/T makes P = (1 + 1/T) J, and with κA invertible (A is positive definite)
        # hᵀP⁻¹h = Σg̃ᵀV⁻¹Σg̃ / (T + 1): the integral below no longer depends on A, and the
        # sampler's gradient needs no Cholesky factor or triangular solve (3–5× faster).
        evidence = 0.5 * jnp.sum(stats.sum_g**2 / variance) / (stats.count + 1)
        return log_lik + evidence - 0.5 * d * jnp.log1p(stats.count) + log_prior
    if structure.optimum_prior == "model-bounded":
        raise ValueError("the model-bounded optimum prior needs the integrated optimum")
    ka = stats.rate * _block_matrix(*blocks)
    prior_precision = _optimum_prior_precision(ka, variance, stats, structure)
    # log √|P₀| of δ's prior N(0, P₀⁻¹); 0 for the standard normal.
    log_root_det = (
        0.0
        if structure.optimum_prior == "standard-normal"
        else jnp.sum(jnp.log(jnp.diagonal(jnp.linalg.cholesky(prior_precision))))
    )
    if structure.integrated_optimum:
        # ∫ exp(−½ δᵀJδ + hᵀδ) N(δ; 0, P₀⁻¹) dδ = √|P₀| exp(½ zᵀz) / √|P|, P = P₀ + J, with
        # residual_ss at δ = 0.  For the unit-information prior √|P₀| / √|P| = (1 + T)^(−d/2)
        # whatever A is.
        chol, z = _optimum_precision(ka, variance, stats, structure)
        log_det = jnp.sum(jnp.log(jnp.diagonal(chol)))
        return log_lik + 0.5 * z @ z - log_det + log_root_det + log_prior
    return log_lik - 0.5 * delta @ prior_precision @ delta + log_root_det + log_prior


def draw_optimum(
    params: jax.Array, stats: TraceStatistics, structure: ModelStructure, key: jax.Array
) -> jax.Array:
    """One exact draw of δ = φ* − φ̄ from its conditional given A's parameters."""
    d = stats.phi_bar.shape[0]
    params = _full_parameters(params, d, structure)
    ka = stats.rate * curvature(params, stats, structure.full_curvature)
    variance, _ = _noise_and_prior(params, stats, structure)
    chol, z = _optimum_precision(ka, variance, stats, structure)
    noise = jax.random.normal(key, (d,), dtype=z.dtype)
    return jax.scipy.linalg.solve_triangular(chol.T, z + noise, lower=False)


def _with_optimum(
    positions: jax.Array, stats: TraceStatistics, structure: ModelStructure, key: jax.Array
) -> jax.Array:
    """Sampled positions (..., p) as full vectors (δ, v, y, ς): δ drawn given each position
    when it was integrated out."""
    if not structure.integrated_optimum:
        return positions
    flat = positions.reshape(-1, positions.shape[-1])
    keys = jax.random.split(key, flat.shape[0])
    delta = jax.vmap(draw_optimum, in_axes=(0, None, None, 0))(flat, stats, structure, keys)
    return jnp.concatenate([delta.reshape(*positions.shape[:-1], -1), positions], axis=-1)


def initial_position(stats: TraceStatistics, structure: ModelStructure) -> jax.Array:
    d = stats.phi_bar.shape[0]
    n_corr = n_correlations(stats, structure.full_curvature)
    n_rho = _n_concentrations(stats, structure)
    parts = [
        jnp.zeros(0 if structure.integrated_optimum else d),
        stats.prior_v_mean,
        (
            stats.correlation_centre
            if structure.correlation_prior != "lkj"
            else jnp.zeros(n_corr)
        ),
        jnp.full(n_rho, _log_concentration_centre(d // 2)),  # η at the centre
    ]
    if structure.subsampling:
        parts.append(jnp.full(d, 0.1) * stats.subsampling_scale)
    return jnp.concatenate(parts)


@dataclass(frozen=True)
class PostProcessingDraws:
    """Draws of φ*, of the curvature A by the numbers that define it, and the sampler's statistics.

    A is stored as its diagonal and the correlations of its μ-block rather than as a d × d matrix
    per draw (with the paper's 8000 draws of a 5-parameter model, 6.4 MB of a 9.6 MB result);
    :func:`curvature_matrices` rebuilds the matrices.
    """

    phi_star: np.ndarray  # (chain, draw, d)
    curvature_diagonal: np.ndarray  # (chain, draw, d)
    mu_correlation: np.ndarray  # (chain, draw, n(n − 1)/2), row by row below the diagonal
    sample_stats: dict[str, np.ndarray]
    #: η of the LKJ prior on the μ-block's correlation, (chain, draw); None for a diagonal A.
    mu_concentration: np.ndarray | None = None
    #: One number per fit about the fit itself (Laplace: see :func:`laplace_convergence`).
    fit_stats: dict[str, float] = field(default_factory=dict)
    #: NUTS's target acceptance rate (:func:`run_nuts`); None for a Laplace fit.
    target_accept: float | None = None


def curvature_matrices(
    diagonal: np.ndarray, mu_correlation: np.ndarray | None = None
) -> np.ndarray:
    """The curvature matrices A, shape (..., d, d), from their diagonal (..., d) and the
    correlations of their μ-block (..., n(n − 1)/2), as :class:`PostProcessingDraws` holds them.

    A is diagonal when there are no correlations (None, or none stored); otherwise its μ-block (the first n = d/2
    coordinates) is D^½ R D^½ with R the correlation matrix, as :func:`curvature` builds it.
    """
    diagonal = np.asarray(diagonal, dtype=float)
    d = diagonal.shape[-1]
    a = diagonal[..., None] * np.eye(d)
    if mu_correlation is None or np.shape(mu_correlation)[-1] == 0:
        return a
    n = d // 2
    rows, cols = np.tril_indices(n, -1)
    scale = np.sqrt(diagonal[..., :n])
    off_diagonal = scale[..., rows] * np.asarray(mu_correlation) * scale[..., cols]
    a[..., rows, cols] = off_diagonal
    a[..., cols, rows] = off_diagonal
    return a


def correlation_scales(eta: jax.Array, n: int) -> jax.Array:
    """Prior standard deviation of each canonical partial correlation of an n × n LKJ(η)
    correlation (row by row below the diagonal): the one in column j has density ∝ (1 − z²)^(b − 1)
    with b = η + (n − 2 − j)/2 (Lewandowski, Kurowicka & Joe, 2009), variance 1/(2η + n − 1 − j)."""
    _, cols = np.tril_indices(n, -1)
    return 1 / jnp.sqrt(2 * eta + n - 1 - cols)


def _sampler_scales(
    vector: jax.Array, stats: TraceStatistics, structure: ModelStructure
) -> tuple[slice, jax.Array] | None:
    """Where y lies in NUTS's position when η is learned, and each y's LKJ(η) prior scale at the
    η that ``vector`` (either parametrisation: ρ, which follows y, is shared) holds; None when η
    is not learned."""
    n_rho = _n_concentrations(stats, structure)
    if not n_rho:
        return None
    d = stats.phi_bar.shape[0]
    _, _, y, rho, _ = _layout(d, n_correlations(stats, structure.full_curvature), n_rho)
    # The sampler's vector leaves δ out where the optimum is integrated.
    shift = d if structure.integrated_optimum else 0
    ys = slice(y.start - shift, y.stop - shift)
    scales = correlation_scales(1 + jnp.exp(vector[rho.start - shift]), d // 2)
    # A correlation the release observes is held by it, not by η: it stays centred.
    return ys, jnp.where(jnp.asarray(_slab_weights(stats, structure)) > 0, 1.0, scales)


def _from_sampler(
    position: jax.Array, stats: TraceStatistics, structure: ModelStructure
) -> tuple[jax.Array, jax.Array]:
    """The post-processing model's parameters from NUTS's position, and log|Jacobian|.

    Where η is learned, NUTS sees each correlation y divided by its LKJ(η) prior scale
    (:func:`correlation_scales`): non-centred, so that a large η, which squeezes every y towards
    0, does not make the funnel that gave 13 of 100 fits of the 10-D regression at ε = 0.1
    divergent transitions with the dimension's hyperprior centre.
    """
    scaled = _sampler_scales(position, stats, structure)
    if scaled is None:
        return position, jnp.zeros(())
    ys, scale = scaled
    return position.at[ys].multiply(scale), jnp.sum(jnp.log(scale))


def _to_sampler(params: jax.Array, stats: TraceStatistics, structure: ModelStructure) -> jax.Array:
    """The inverse of :func:`_from_sampler`."""
    scaled = _sampler_scales(params, stats, structure)
    if scaled is None:
        return params
    ys, scale = scaled
    return params.at[ys].divide(scale)


class SamplerTarget(Protocol):
    """A post-processing model as :func:`run_nuts` samples it, for one fit's statistics."""

    #: NUTS's target acceptance rate.
    target_accept: float

    def logdensity(self, position: jax.Array, stats: Any) -> jax.Array:
        """log density at NUTS's position (up to a constant)."""

    def initial(self, stats: Any) -> jax.Array:
        """Where NUTS starts."""

    def finish(self, positions: jax.Array, stats: Any, key: jax.Array) -> jax.Array:
        """What the draws keep, from NUTS's positions (draws, p) of one chain."""


@dataclass(frozen=True)
class _OptimumTarget:
    """The model of the trace above, sampled with δ integrated out where the structure says so
    and the correlations non-centred where η is learned (:func:`_from_sampler`)."""

    structure: ModelStructure

    @property
    def target_accept(self) -> float:
        return TARGET_ACCEPT[self.structure.full_curvature]

    def logdensity(self, position: jax.Array, stats: TraceStatistics) -> jax.Array:
        params, log_jacobian = _from_sampler(position, stats, self.structure)
        return log_density(params, stats, self.structure) + log_jacobian

    def initial(self, stats: TraceStatistics) -> jax.Array:
        return _to_sampler(initial_position(stats, self.structure), stats, self.structure)

    def finish(self, positions: jax.Array, stats: TraceStatistics, key: jax.Array) -> jax.Array:
        positions = jax.vmap(lambda p: _from_sampler(p, stats, self.structure)[0])(positions)
        return _with_optimum(positions, stats, self.structure, key)


def runs_in_turn() -> bool:
    """Whether NUTS runs its chains, and a batch of replicates, one after another (on a CPU)
    rather than side by side in vmapped lanes (on an accelerator).  Vmapped, every lane waits at
    each draw for the longest trajectory of the batch, and a CPU gains too little from the lanes'
    width to pay for it: on 16 fits × 2 chains of a 5-parameter regression the vmapped NUTS phase
    took 1.2 to 2.4 times as long as the same fits in turn, the more the longer the trajectories
    ranged (at 2.4, 65 leapfrog steps per draw for the longest lane against 21.5 on average;
    ``tutorials/RESULTS.md``, stop 59).  Vmapping NUTS's nested loops also costs tracing time:
    batching them took 4 of the 9 s that tracing a single fit's sampler took under a profiler,
    for the centred varying intercepts' likelihood model (2026-12-05)."""
    return jax.devices()[0].platform == "cpu"


class _Adaptation(NamedTuple):
    """Stan's window adaptation as blackjax's ``window_adaptation`` keeps it: the dual
    averaging's and the mass matrix's states, and the step size and inverse mass matrix that
    the next transition uses."""

    step_size_state: Any
    mass_matrix_state: Any
    step_size: jax.Array
    inverse_mass_matrix: jax.Array


def _curvature_scaled_inverse_mass(
    logdensity: Callable[[jax.Array], jax.Array], position: jax.Array
) -> jax.Array:
    """The first adaptation window's diagonal inverse mass matrix: 1 / the curvature of
    ``logdensity`` along each coordinate at ``position``, 1 where that is not positive.

    The post-processing models' coordinates differ in scale by three to four orders of
    magnitude (these inverse curvatures ran from 1e-4 to 1 on the class studies' models), so
    from the identity the first window's steps shrink to the narrowest coordinate and its
    trajectories run to the tree's depth of 10 on the wide ones: the first 75 transitions of a
    4-parameter logistic regression's post-processing took 13,000-21,000 leapfrog steps, more
    than its 500 draws (about 5,000), and 900-1,500 from the curvature (2026-12-06).  Later
    windows estimate it from their draws and their gradients (:func:`_adapted_nuts`).
    """
    curvature = -jnp.diag(jax.hessian(logdensity)(position))
    return jnp.where(jnp.isfinite(curvature) & (curvature > 0), 1 / curvature, 1.0)


def _adapted_nuts(
    logdensity: Callable[[jax.Array], jax.Array],
    position: jax.Array,
    key: jax.Array,
    *,
    inverse_mass: jax.Array,
    tune: int,
    draws: int,
    target_accept: float,
):
    """NUTS's ``draws`` transitions after ``tune`` of Stan's window adaptation, in one scan over
    one kernel: the positions drawn (draws, p) and the sampler's statistics of each draw.

    The adaptation is blackjax's ``staged_adaptation`` with the Fisher-diagonal metric
    (``metric="fisher_diag"``; Stan's schedule, dual averaging from a step size of 1), step for
    step and with the same random keys, rebuilt from its public parts, its first window starting
    from the diagonal ``inverse_mass`` (:func:`_curvature_scaled_inverse_mass` for the
    post-processing) rather than the identity.  blackjax's warm-up scans a kernel of its own, so
    warming up with it and then sampling traced and compiled NUTS twice: the centred varying
    intercepts' single-fit sampler took 7.1 s to trace and 7.8 s to compile that way (its
    ``window_adaptation``), 5.6 and 6.7 s with one kernel (2026-12-05).

    Each window's diagonal is √(Var x / Var ∇log p) of its draws (the Fisher-divergence
    estimator of Seyboldt et al., nutpie's), not Stan's Var x: for a Gaussian it is the geometric
    mean of each coordinate's marginal and conditional variance, where Stan's marginal variance
    overstates the room of a coordinate that the others pin (the curvature's log-diagonal
    and its correlations, a group effect given its scale), and the steps then shrink to fit.
    On the CI-size class studies (K = 40, ε = 1, 300 warm-up transitions) it took 1.0 to 2.1
    times fewer leapfrog steps per draw than Stan's estimator (summed over the 40 fits: centred
    varying intercepts 2160 → 1020, the demo's model 1286 → 645, unknown scale 1204 → 737,
    logistic 608 → 512, Poisson 689 → 671) at the same TARP RMSE
    (``tutorials/RESULTS.md``, stop 87).
    """
    kernel = blackjax.nuts.build_kernel()
    # blackjax calls its recipe schema provisional: the test that this warm-up matches
    # staged_adaptation(metric="fisher_diag") step for step pins the use made of it here.
    metric = lookup_recipe("fisher_diag").build_core(initial_inverse_mass_matrix=inverse_mass)
    da_init, da_update, da_final = (
        blackjax.adaptation.step_size.dual_averaging_adaptation(target_accept)
    )

    def adapt(adaptation: _Adaptation, stage, window_end, state, acceptance) -> _Adaptation:
        step_size_state = da_update(adaptation.step_size_state, acceptance)
        mass_matrix_state = jax.lax.cond(
            stage == 1,
            lambda m: metric.update(m, state.position, state.logdensity_grad),
            lambda m: m,
            adaptation.mass_matrix_state,
        )
        adaptation = _Adaptation(
            step_size_state,
            mass_matrix_state,
            jnp.exp(step_size_state.log_step_size),
            adaptation.inverse_mass_matrix,
        )
        return jax.lax.cond(window_end, end_window, lambda a: a, adaptation)

    def end_window(adaptation: _Adaptation) -> _Adaptation:
        # The mass matrix from the window's draws; the step size restarts from its average.
        mass_matrix_state = metric.final(adaptation.mass_matrix_state)
        step_size_state = da_init(da_final(adaptation.step_size_state))
        return _Adaptation(
            step_size_state,
            mass_matrix_state,
            jnp.exp(step_size_state.log_step_size),
            mass_matrix_state.inverse_mass_matrix,
        )

    def finish(adaptation: _Adaptation) -> _Adaptation:
        return adaptation._replace(
            step_size=jnp.exp(adaptation.step_size_state.log_step_size_avg),
            inverse_mass_matrix=adaptation.mass_matrix_state.inverse_mass_matrix,
        )

    def step(carry, xs):
        state, adaptation = carry
        index, key, (stage, window_end) = xs
        state, info = kernel(
            key, state, logdensity, adaptation.step_size, adaptation.inverse_mass_matrix
        )
        adaptation = jax.lax.cond(
            index < tune,
            lambda a: adapt(a, stage, window_end, state, info.acceptance_rate),
            lambda a: a,
            adaptation,
        )
        adaptation = jax.lax.cond(index == tune - 1, finish, lambda a: a, adaptation)
        stats = {
            "diverging": info.is_divergent,
            "n_steps": info.num_integration_steps,
            "tree_depth": info.num_trajectory_expansions,
            "acceptance_rate": info.acceptance_rate,
            "energy": info.energy,
            "step_size": adaptation.step_size,
        }
        return (state, adaptation), (state.position, stats)

    mass_matrix_state = metric.init(position.shape[0])
    start = _Adaptation(da_init(1.0), mass_matrix_state, jnp.asarray(1.0), inverse_mass)
    key_warmup, key_sample = jax.random.split(key)
    keys = jnp.concatenate(
        [jax.random.split(key_warmup, tune), jax.random.split(key_sample, draws)]
    )
    schedule = jnp.concatenate(
        [
            jnp.asarray(blackjax.adaptation.window_adaptation.build_schedule(tune), int)
            .reshape(tune, 2),
            jnp.zeros((draws, 2), int),
        ]
    )
    xs = (jnp.arange(tune + draws), keys, (schedule[:, 0], schedule[:, 1].astype(bool)))
    _, (positions, stats) = jax.lax.scan(
        step, (blackjax.nuts.init(position, logdensity), start), xs
    )
    # The warm-up's transitions are not draws.
    return jax.tree.map(lambda a: a[tune:], (positions, stats))


def _nuts_program(
    target: SamplerTarget,
    tune: int,
    draws: int,
    chains: int,
    replicates: bool,
    in_turn: bool,
    target_accept: float,
):
    def one_chain(key, stats, start, inverse_mass):
        positions, stats_out = _adapted_nuts(
            lambda position: target.logdensity(position, stats),
            start,
            key,
            inverse_mass=inverse_mass,
            tune=tune,
            draws=draws,
            target_accept=target_accept,
        )
        return target.finish(positions, stats, jax.random.fold_in(key, 1)), stats_out

    def over(fn, *arrays):
        """fn mapped over the leading axis of ``arrays``, in turn or in vmapped lanes."""
        if in_turn:
            return jax.lax.map(lambda args: fn(*args), arrays)
        return jax.vmap(fn)(*arrays)

    def run(key, stats):
        # Every chain of a fit starts at one point, so the start's curvature is taken once.
        start = target.initial(stats)
        inverse_mass = _curvature_scaled_inverse_mass(
            lambda position: target.logdensity(position, stats), start
        )
        return over(
            lambda chain_key: one_chain(chain_key, stats, start, inverse_mass),
            jax.random.split(key, chains),
        )

    if not replicates:
        return jax.jit(run)
    # Replicates each adapt their own step size and mass matrix, so each maps the whole run.
    return jax.jit(lambda keys, stats: over(run, keys, stats))


class NutsRun(NamedTuple):
    """One fit's NUTS run: what ``target.finish`` kept of the draws (chain, draw, ...), the
    sampler's statistics (chain, draw) and the target acceptance rate it ran at."""

    kept: np.ndarray
    info: dict[str, np.ndarray]
    target_accept: float


def run_nuts(
    target: SamplerTarget,
    stats: Sequence[Any],
    keys: Sequence[jax.Array],
    *,
    tune: int,
    draws: int,
    chains: int,
    cache,
    cache_key: Hashable,
    replicates: bool = False,
) -> list[NutsRun]:
    """NUTS (blackjax, window adaptation) on ``target`` for each fit's statistics.

    One fit (``replicates=False``) runs on its own compiled sampler; with ``replicates`` the
    fits run as one compiled program, each chain adapting on its own.  Chains and fits run one
    after another where :func:`runs_in_turn`, else vmapped.  ``cache(key, factory)``
    stores the compiled sampler under ``cache_key`` (e.g. ``RecordModel.cached``), which must
    name everything the program depends on but the statistics.

    A fit with a divergent transition is drawn again, alone, at
    :data:`REDRAW_TARGET_ACCEPT` (smaller steps), and the second run is kept whatever it
    shows: the post-processing costs no privacy, and keeping only a run that did not diverge
    would favour chains that stayed out of the region where the first one failed.
    """
    in_turn = runs_in_turn()
    run = cache(
        (cache_key, in_turn),
        lambda: _nuts_program(
            target, tune, draws, chains, replicates, in_turn, target.target_accept
        ),
    )
    if replicates:
        kept, info = jax.device_get(run(jnp.stack(keys), stack_statistics(list(stats))))
        runs = [
            NutsRun(kept[r], {k: v[r] for k, v in info.items()}, target.target_accept)
            for r in range(len(stats))
        ]
    else:
        [one], [key] = stats, keys
        runs = [NutsRun(*jax.device_get(run(key, one)), target.target_accept)]

    def redraw(one: Any, key: jax.Array) -> NutsRun:
        careful = cache(
            (cache_key, in_turn, "redraw"),
            lambda: _nuts_program(
                target, tune, draws, chains, False, in_turn, REDRAW_TARGET_ACCEPT
            ),
        )
        drawn = jax.device_get(careful(jax.random.fold_in(key, 1), one))
        return NutsRun(*drawn, REDRAW_TARGET_ACCEPT)

    return [
        redraw(one, key) if done.info["diverging"].any() else done
        for done, one, key in zip(runs, stats, keys, strict=True)
    ]


def _to_draws(
    positions: jax.Array,
    stats: TraceStatistics,
    structure: ModelStructure,
    sample_stats,
    target_accept: float | None = None,
) -> PostProcessingDraws:
    d = stats.phi_bar.shape[0]
    n_corr = n_correlations(stats, structure.full_curvature)
    rows, cols = np.tril_indices(d // 2 if n_corr else 0, -1)

    def diagonal_and_correlations(params: jax.Array) -> tuple[jax.Array, jax.Array]:
        mu_block, u_diagonal = curvature_blocks(params, stats, structure.full_curvature)
        diagonal = jnp.diagonal(mu_block)
        root = jnp.sqrt(diagonal)
        correlation = (mu_block / jnp.outer(root, root))[rows, cols]
        return jnp.concatenate([diagonal, u_diagonal]), correlation

    positions = np.asarray(positions)
    shape = positions.shape[:-1]
    diagonal, correlation = jax.vmap(diagonal_and_correlations)(
        jnp.asarray(positions.reshape(-1, positions.shape[-1]))
    )
    return PostProcessingDraws(
        phi_star=np.asarray(stats.phi_bar) + positions[..., :d],
        curvature_diagonal=np.asarray(diagonal).reshape(*shape, d),
        mu_correlation=np.asarray(correlation).reshape(*shape, n_corr),
        sample_stats={k: np.asarray(v) for k, v in sample_stats.items()},
        mu_concentration=_concentration(positions, d, n_corr, structure),
        target_accept=target_accept,
    )


def _concentration(
    positions: np.ndarray, d: int, n_corr: int, structure: ModelStructure
) -> np.ndarray | None:
    if not n_corr or structure.correlation_prior == "released":
        return None
    if structure.lkj_eta is None:
        return 1 + np.exp(positions[..., 2 * d + n_corr])
    return np.full(positions.shape[:-1], structure.lkj_eta)


def stack_statistics(stats: list[Any]) -> Any:
    """The statistics of several fits as one pytree with a leading replicate axis."""
    return jax.tree.map(lambda *leaves: jnp.stack(leaves), *stats)


def sample_nuts(
    stats: list[TraceStatistics],
    keys: list[jax.Array],
    *,
    tune: int,
    draws: int,
    chains: int,
    structure: ModelStructure,
    cache,
    replicates: bool = False,
) -> list[PostProcessingDraws]:
    """NUTS on the post-processing model of each trace (:func:`run_nuts`), so fits of the same
    sizes reuse the compiled sampler."""
    d = stats[0].phi_bar.shape[0]
    runs = run_nuts(
        _OptimumTarget(structure),
        stats,
        keys,
        tune=tune,
        draws=draws,
        chains=chains,
        cache=cache,
        cache_key=("na-dpvi", "nuts", d, tune, draws, chains, structure, replicates),
        replicates=replicates,
    )
    return [
        _to_draws(run.kept, one, structure, run.info, run.target_accept)
        for run, one in zip(runs, stats, strict=True)
    ]


#: Newton iterations of the Laplace fit, and the step lengths its line search tries.
LAPLACE_ITERATIONS = 60
LAPLACE_STEP_LENGTHS = 2.0 ** -np.arange(12)
#: Largest half Newton decrement ½ gᵀH⁻¹g (nats) at which the Laplace fit counts as converged.
#: Near a mode it estimates how far the log density still is below its maximum: 0.01 nats moves
#: the mode by a small fraction of a posterior sd in every direction.
LAPLACE_TOLERANCE = 0.01


def laplace_convergence(fit_stats: dict[str, float]) -> str | None:
    """Why the Laplace fit whose ``fit_stats`` these are has not converged, or None if it has.

    A Laplace approximation is only meaningful at a maximum of the post-processing density: the
    Hessian there must be negative definite (``min_curvature`` > 0, the smallest eigenvalue of
    the negative Hessian) and the gradient zero (``newton_decrement`` ≤ :data:`LAPLACE_TOLERANCE`).
    """
    problems = []
    if not fit_stats["min_curvature"] > 0:
        problems.append(
            f"the density is not concave there (smallest curvature {fit_stats['min_curvature']:.3g})"
        )
    if not fit_stats["newton_decrement"] <= LAPLACE_TOLERANCE:
        problems.append(
            f"its log density is still about {fit_stats['newton_decrement']:.3g} nats below the "
            "maximum (half the Newton decrement)"
        )
    if not problems:
        return None
    return (
        "the Laplace approximation of the post-processing model has not converged to a mode: "
        + "; ".join(problems)
        + "; a Gaussian there may be off-centre, of the wrong width or not finite"
    )


def laplace_fit(
    logdensity: Callable[[jax.Array, Any], jax.Array],
    initial: Callable[[Any], jax.Array],
    replicates: bool,
):
    """A compiled Laplace fit of ``logdensity(position, stats)`` started at ``initial(stats)``
    (vmapped over stacked statistics with ``replicates``): its mode, a square root ``scale`` of
    the inverse negative Hessian there, half the Newton decrement and the smallest curvature
    (what :func:`laplace_convergence` reads)."""

    def fit(stats):
        def objective(p):
            value = -logdensity(p, stats)
            return jnp.where(jnp.isfinite(value), value, jnp.inf)

        hessian_fn = jax.hessian(objective)

        # Saddle-free Newton with a line search that never accepts a worse or non-finite point:
        # BFGS (jax.scipy.optimize) stepped into overflowing exp(v) and returned NaN modes on
        # 3 of 4 low-noise linear-regression fits, and its Hessian could be indefinite there.
        def newton(position, _):
            value, grad = jax.value_and_grad(objective)(position)
            eigenvalues, eigenvectors = jnp.linalg.eigh(hessian_fn(position))
            curvature = jnp.maximum(jnp.abs(eigenvalues), 1e-6)
            step = eigenvectors @ ((eigenvectors.T @ grad) / curvature)
            candidates = position - LAPLACE_STEP_LENGTHS[:, None] * step
            values = jax.vmap(objective)(candidates)
            # A NaN step gives infinite objectives, so it is never taken either.
            best = jnp.argmin(values)
            return jnp.where(values[best] < value, candidates[best], position), None

        mode, _ = jax.lax.scan(newton, initial(stats), None, length=LAPLACE_ITERATIONS)
        grad = jax.grad(objective)(mode)
        hess = hessian_fn(mode)
        eigenvalues, eigenvectors = jnp.linalg.eigh((hess + hess.T) / 2)
        # The mode of a well-posed model has a positive-definite Hessian; the floor only guards
        # against round-off in flat directions.  laplace_convergence reports when it is not.
        floored = jnp.maximum(eigenvalues, 1e-12)
        scale = eigenvectors / jnp.sqrt(floored)
        decrement = 0.5 * jnp.sum((eigenvectors.T @ grad) ** 2 / floored)
        return mode, scale, decrement, eigenvalues[0]

    return jax.jit(jax.vmap(fit) if replicates else fit)


def laplace_draws(
    fit: Callable[[Any], tuple[jax.Array, ...]],
    stats: list[Any],
    keys: list[jax.Array],
    *,
    draws: int,
    chains: int,
    replicates: bool,
) -> list[tuple[jax.Array, dict[str, float]]]:
    """Each fit's Gaussian draws (chains, draws, p) of a compiled :func:`laplace_fit`, and the
    fit's statistics."""
    if replicates:
        modes, scales, decrements, curvatures = fit(stack_statistics(stats))
    else:
        modes, scales, decrements, curvatures = (x[None] for x in fit(stats[0]))
    results = []
    for key, mode, scale, decrement, curvature in zip(
        keys, modes, scales, decrements, curvatures, strict=True
    ):
        z = jax.random.normal(key, (chains, draws, mode.shape[0]))
        fit_stats = {"newton_decrement": float(decrement), "min_curvature": float(curvature)}
        results.append((mode + z @ scale.T, fit_stats))
    return results


def sample_laplace(
    stats: list[TraceStatistics],
    keys: list[jax.Array],
    *,
    draws: int,
    chains: int,
    structure: ModelStructure,
    cache,
    replicates: bool = False,
) -> list[PostProcessingDraws]:
    """Laplace's approximation of each trace's post-processing model: a Gaussian at the MAP
    with the inverse Hessian as covariance (vmapped over the traces with ``replicates``).  Each
    result's ``fit_stats`` say whether the fit reached a mode (:func:`laplace_convergence`)."""
    fit = cache(
        ("na-dpvi", "laplace", stats[0].phi_bar.shape[0], structure, replicates),
        lambda: laplace_fit(
            lambda p, one: log_density(p, one, structure),
            lambda one: initial_position(one, structure),
            replicates,
        ),
    )
    drawn = laplace_draws(fit, stats, keys, draws=draws, chains=chains, replicates=replicates)
    return [
        replace(
            _to_draws(
                _with_optimum(positions, one, structure, jax.random.fold_in(key, 1)), one,
                structure, {},
            ),
            fit_stats=fit_stats,
        )
        for (positions, fit_stats), one, key in zip(drawn, stats, keys, strict=True)
    ]
