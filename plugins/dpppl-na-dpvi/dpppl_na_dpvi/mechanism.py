"""The NA-DPVI mechanism: DPVI by DP-SGD, then a noise-aware posterior from its released trace.

Reference: Ahmed, Jälkö, Honkela et al., "Noise-aware differentially private variational
inference", AISTATS 2025 (Algorithms 3 and 4, Appendices C, D and H).
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Annotated, Any, Literal

import jax
import numpy as np
import xarray as xr

from dpppl.plugin import (
    POSITIVE,
    Accountant,
    Interval,
    InvalidOptionError,
    InvalidPrivacyParameterError,
    Mechanism,
    ModelNotSupportedError,
    NeighbourRelation,
    PoissonSampler,
    PrivacyEvent,
    PrivacyPlan,
    Progress,
    RecordModel,
    Release,
    SnappedGaussian,
    jax_key,
    poisson_subsampled_gaussian,
    prior_summary,
    warn_user,
)
from dpppl_na_dpvi.convergence import drift_scores, drift_warning
from dpppl_na_dpvi.dpsgd import (
    MAX_COUNTED_RECORDS,
    DPSGDSettings,
    Trace,
    curvature_matrix,
    curvature_scale,
    noise_std,
    release_bound,
    release_dim,
    run_dpsgd_replicates,
)
from dpppl_na_dpvi.heuristics import StandardisedSchedule, default_clipping_bound
from dpppl_na_dpvi.likelihood import (
    LikelihoodDraws,
    LikelihoodStatistics,
    LikelihoodStructure,
    sample_likelihood,
    sample_likelihood_laplace,
    scatter_warning,
)
from dpppl_na_dpvi.postprocess import (
    MAX_FULL_CURVATURE,
    ModelStructure,
    PostProcessingDraws,
    TraceStatistics,
    curvature_matrices,
    laplace_convergence,
    lkj_concentration_centre,
    sample_laplace,
    sample_nuts,
)

#: DP-SGD draws the count of every record the model allows instead of sampling a batch record by
#: record when there are at most this fraction of the batch capacity of them (binary or
#: categorical observations without covariates).  The counts have the law of a Poisson batch
#: grouped by value, and a step then takes one gradient per possible record.
COUNTED_SHARE = 0.5

#: Memory a vmapped batch of replicate fits may take (see :meth:`NADPVI.replicate_batch_size`).
REPLICATE_MEMORY = 2**30
#: Per-record entries (capacity × (Monte Carlo draws × 2n gradient entries, and the curvature
#: rows' n(n + 1)/2 where they are released)) of one DP-SGD step of a whole batch.  Past about
#: this many, a step no longer fits the CPU's caches and a replicate gets slower, not faster
#: (2026-11-25, 2 cores: Beta–Bernoulli, 12 000 per replicate, took 0.60 / 0.47 / 0.38 s per
#: replicate at 16 / 32 / 64; a 4-parameter Poisson regression, about 30 000, 1.76 s at 16 and
#: 2.82 s at 64).
REPLICATE_STEP_ELEMENTS = 2**20
#: Fewest replicates a batch holds where memory allows, whatever the step limit.
MIN_REPLICATE_BATCH = 16
#: Most replicates in one vmapped program: beyond this, batches gain little and compile slowly.
MAX_REPLICATE_BATCH = 128
#: Share of an accelerator's memory pool that a vmapped batch of replicate fits may take.
ACCELERATOR_MEMORY_SHARE = 4


def replicate_limits(device: jax.Device) -> tuple[int, int | None]:
    """Memory a vmapped batch of replicates may take on ``device``, and the per-step gradient
    entries of the batch past which a larger batch gets slower (None: no such limit).

    On a CPU a step that outgrows the caches slows every replicate down.  A GPU is the other way
    round: the post-processing sampler's loops run one short kernel sequence per gradient, about
    50 µs on an H100 whether it holds 2 chains or 256 (2026-11-26), so a batch gets faster per
    replicate up to ``MAX_REPLICATE_BATCH``, within a share of the device's memory.
    """
    if device.platform == "cpu":
        return REPLICATE_MEMORY, REPLICATE_STEP_ELEMENTS
    pool = (device.memory_stats() or {}).get("bytes_limit")
    return (pool // ACCELERATOR_MEMORY_SHARE if pool else REPLICATE_MEMORY), None


class NADPVI(Mechanism):
    """Noise-aware DP variational inference (NA-DPVI).

    DP-SGD optimises a mean-field Gaussian q(θ; μ, softplus(u)) (variances softplus(u)) over the
    model's unconstrained parameters; its noisy gradient sums, and the parameter trace computed
    from them, are the DP release.
    A Bayesian model of that trace (g̃_{t+1} ~ N(κA(φ_t − φ*), σ²Δ²/β²)) gives a posterior over the
    optimum φ*, and the result's posterior is the mixture (1/M) Σ q(θ; φ*_i): uncertain by as much
    as the privacy noise makes it.

    Options
    -------
    steps
        T, DP-SGD steps (paper: 10⁴).
    sampling_rate
        κ, Poisson inclusion probability per step (paper: 0.1).
    mc_draws
        Monte Carlo draws of θ per step in the ELBO (paper: 10).
    clipping_bound
        C; None chooses it by rule (see ``dpppl_na_dpvi.heuristics``).
    preconditioning
        β for the u-coordinates (β = 1 for μ); None chooses it by rule.
    learning_rate_scale
        λ_c of the learning-rate heuristic λ = √2 λ_c β / (σ C √(T d)) (eq. A58); None chooses
        it by rule (see ``dpppl_na_dpvi.heuristics``).
    rates
        ``"auto"`` (default): ``"wander-bounded"`` where DP-SGD releases the curvature (option
        ``correlation_prior``), ``"standardised"`` elsewhere; the result's
        ``dp_mechanism_attrs`` say which ran (``rates``).  ``"standardised"``: λ = λ_heur β,
        the μ-coordinates relaxing √Ī times as fast as the u-coordinates; their wander is what
        informs the curvature's correlations when nothing else does.  ``"wander-bounded"``:
        λ_μ = λ_heur β_μ², so every coordinate relaxes at one rate, lowered under strong privacy
        noise so that the trace's wander shifts it by at most about one posterior sd
        (``dpppl_na_dpvi.heuristics``): the trace mean of a noise scale is then not biased by
        the weights' wander (10-D regression, ε = 1, with the released curvature: log σ²
        over-confident with standardised rates, calibrated with these; ``tutorials/RESULTS.md``).
        Past 30 parameters, in a GLM whose records read only coefficients, ``"wander-bounded"``
        keeps the weights where the gradients are linear, which standardised rates do not:
        measured calibrated on three held-out logistic and Poisson regressions of 33–36
        parameters (TARP 0.039–0.060 at K = 100, ε = 1; the defaults, with ``burn_in_start``'s
        capped start, calibrate the two logistic ones too but leave the Poisson's intercept
        biased) and a 35-parameter probit regression's intercept, not its weights, which
        past 30 parameters are about 10 % too narrow wherever the covariates correlate (0.104;
        mean-field q's conditional variances), but on UCI Adult the trace then locates the
        weights less, better calibrated at ε = 1 and worse at ε = 0.3; where the records also
        read a noise scale it biases the scale (the weights do not arrive within the trace and
        the scale reports their residuals; ``tutorials/RESULTS.md``, stops 80 to 82).
    burn_in
        T* as a fraction of T (paper's code: 0.2).
    burn_in_start
        How fast μ starts the burn-in.  ``"fast"``: at ``BURN_IN_FACTOR`` times the final rate,
        like u.  ``"capped"``: also at most ``BURN_IN_FACTOR`` times the wander bound
        (:meth:`dpppl_na_dpvi.heuristics.StandardisedSchedule.start_rate`); u keeps its fast
        start.  ``"auto"`` (default): ``"capped"`` under standardised rates where the records
        read only parameters on the real line (the coefficients of a GLM without a scale,
        shape or dispersion), ``"fast"`` elsewhere; the result's ``dp_mechanism_attrs`` say
        which ran (``burn_in_start``).  Under strong noise and standardised rates a fast start
        throws μ tens of posterior sds off, which those rates undo only √Ī times as fast as
        u, and the trace's curvature is then read where the weights wandered, too low.  Where
        the records read a scale the fast start is needed: a slow approach leaves the residuals
        inflated, the scale runs up and the weights' curvature falls, which slows them further.
        Measured at K = 100, ε = 1: held-out logistic regressions of 36 and 33 parameters
        0.149 → 0.047 and 0.053 → 0.036 (calibrated), a 33-parameter Poisson regression 0.053
        → 0.062 (its intercept less biased, still not calibrated), a 35-parameter probit
        regression, held out, not calibrated either way (0.117 → 0.112); UCI Adult's
        calibration RMSE 82 → 61 at ε = 0.1 (the paper's 61), 27 and 24 at ε = 0.3 and 1
        (``tutorials/RESULTS.md``, stops 63 and 81).
    anchored
        Fraction of the steps after the burn-in that DP-SGD takes at one fixed point, the mean
        of the free steps before them (after any left out by ``settle``), releasing noisy
        gradients there without moving (see
        :func:`dpppl_na_dpvi.dpsgd.run_dpsgd`).  The post-processing model then reads the
        optimum off the anchored gradients and the curvature off the free steps, so the bias a
        nonlinear gradient has when averaged over the trace's wander does not reach the
        optimum.  0 (default) is the paper's model, in which every step after the burn-in
        moves and the trace mean is taken as linear-regime evidence about the optimum.
        Experimental: on the 10-D regression (TARP, K = 100, ``lkj_eta=None``) 0.5 took the
        joint RMSE at ε = 1 from 0.182 to 0.053 (log σ² calibrated), but at ε = 0.3, where
        the anchor lies outside the linear regime, its one linear extrapolation overshoots
        (0.241).  With ``inference="laplace"`` (η = 2) it took the joint RMSE from 0.240 to
        0.051 at ε = 1 and gave 0.086 at ε = 0.1, but at ε = 0.3 a Laplace draw overflowed
        (``tutorials/RESULTS.md``).  Past 30 parameters (ε = 1) 0.5 calibrated a
        35-parameter probit regression that the defaults do not (TARP, K = 100: 0.112 →
        0.039) and put a 33-parameter Poisson regression's weights at their intervals'
        nominal coverage, but doubled UCI Adult's calibration RMSE at ε = 0.3
        (``tutorials/RESULTS.md``, stop 83).  Ignored by ``posterior="naive"``, the last iterate.
    settle
        Leave out the first tenths of the free steps while they still drift (at most half of
        them; see :func:`dpppl_na_dpvi.convergence.settled_start`): the noise-aware posterior
        and the anchor read the rest.  Where no cut settles the trace, wander-bounded rates
        leave out half and standardised rates none (their drifting coordinates are slow ones
        that no cut settles; :meth:`dpppl_na_dpvi.heuristics.StandardisedSchedule.
        settled_start`).  The released trace decides, so this costs no privacy; the step it
        chose is published as ``settled_step``.  False reads every step after the burn-in, as
        the paper does.
    posterior
        ``"noise-aware"`` (the paper's method) or ``"naive"`` (q(θ; φ_T), the last iterate, for
        comparison: it ignores the privacy noise).
    inference
        ``"nuts"`` (blackjax NUTS with window adaptation) or ``"laplace"`` for the
        post-processing model.  Where a Laplace fit has not reached a mode, that fit's
        posterior is drawn with NUTS instead, with a warning; the group
        ``postprocessing_posterior`` says which ran (attribute ``inference``) and how far the
        Laplace fit was from a mode (``laplace_newton_decrement``, ``laplace_min_curvature``).
    tune, draws, chains
        NUTS warm-up and kept draws per chain (paper: 1000 and 4000); the posterior has
        chains × draws θ draws, one from q(θ; φ*) per draw of φ*.  A fit whose NUTS run has a
        divergent transition is drawn once more with smaller steps (target acceptance 0.99,
        which the group ``postprocessing_sample_stats`` records as its attribute
        ``target_accept``), at no privacy cost; a warning remains if that run diverges too.
    subsampling_noise
        Model the subsampling noise Σ_sub too (paper: off, the DP noise dominates).
    curvature_prior
        Prior of the curvature A: ``"structural"`` (default; centred on the curvature the
        mean-field ELBO has at its optimum) or ``"trace"`` (the paper's Appendix H.3: centred on
        the least-squares slope of the trace).
    optimum
        ``"integrated"`` (default): the optimum φ* is integrated out of the post-processing
        model in closed form (given A the noisy gradients are linear-Gaussian in it) and drawn
        exactly from its conditional after sampling, so NUTS samples A alone; ``"sampled"``:
        NUTS samples φ* and A jointly, as the paper does.  Both give the same posterior; on a
        4-parameter Poisson regression (K = 100 TARP study) the integrated model gave the same
        coverage in half the time, without divergent transitions.
    optimum_prior
        Prior of the optimum's offset δ = φ* − φ̄ from the trace mean.  ``"unit-information"``:
        given A, δ ~ N(0, T J⁻¹) with J = T (κA)ᵀV⁻¹(κA) the information of the
        trace's T gradients (Zellner's g-prior with g = T: as much as one gradient says).
        ``"standard-normal"``: the paper's N(0, I), in whatever units φ has.  The latter is
        usually far wider than δ's posterior, and integrating it out then leaves a factor
        1/|det A| in A's posterior that pulls A towards singular (it cancels the LKJ(2) prior's
        det R): on a 4-parameter Poisson regression that made the posterior several times too
        wide (TARP K = 100: RMSE 0.064 against 0.038 with the unit-information prior).
        ``"model-bounded"``: the curvature's posterior is the unit-information one, and the
        optimum given the curvature is also held by the model's own prior of θ (its centre and
        scale from prior draws, public: :func:`dpppl.plugin.prior_summary`; only coordinates
        whose prior a normal describes), so a coordinate the privacy noise leaves almost
        unlocated is never wider than the model's prior allows: the optimum of a data set drawn
        from the model lies about where θ does.  ``"auto"`` (default): ``"model-bounded"``
        where the curvature is diagonal (``curvature``) and the model has several parameters,
        so that nothing but each coordinate's own trace locates it, ``"unit-information"``
        elsewhere; the choice is published as ``optimum_prior``.  On UCI Adult (57 parameters,
        R = 20 fits, with the ``settle`` rule above) it took the predictive calibration RMSE
        from 58 ± 20 to 29 ± 8 at ε = 0.3 (paper 26 ± 5) and from 159 ± 42 to 82 ± 28 at
        ε = 0.1 (paper 61 ± 31).  Where a full curvature block is released it is not the
        default: on the CI-size class studies it changed little (K = 40, joint RMSE
        0.054–0.061 against 0.059–0.061), but on the 10-D regression at ε = 0.1 (K = 100) the
        joint TARP RMSE went from 0.082 to 0.170, the weights jointly wider still
        (``tutorials/RESULTS.md``).
    curvature
        ``"full"``: a full curvature matrix for the μ-coordinates (needed when the posterior is
        correlated), with a prior on its correlation (option ``correlation_prior``);
        ``"diagonal"``: the paper's diagonal A; ``"auto"`` (default): full for 2 to 30 model
        parameters.  ``"full"`` past 30 parameters (the likelihood model) is told, before any
        budget is spent, that it was measured miscalibrated there (``tutorials/RESULTS.md``,
        stop 68).
    correlation_prior
        What informs the correlation R of the full μ-block of A (``curvature``).  The trace alone
        barely does (a few relaxation times of μ), so without more R is left to its prior, and
        along a nearly singular direction the optimum is held by its prior alone.
        ``"released-likelihood"`` (default): every DP-SGD step also releases the outer products
        of its records' standardised μ-gradients (clipped to 1.25√n) in the same noisy sum as the
        gradients, each record's share of norm at most ρC with ρ = 0.5, so the step stays one
        Poisson-subsampled Gaussian release of sensitivity C√(1 + ρ²) at the same σ and the
        gradients' noise grows by √(1 + ρ²) = 1.12 (:func:`dpppl_na_dpvi.dpsgd.curvature_rows`).
        Averaged over the steps read they estimate the records' Fisher information.  A's
        μ-block is then the model's prior curvature P (public, and exact: a hierarchical
        prior's coupling of each group's intercept with the group mean is not shrunk) plus the
        records' share D^½ R D^½, whose correlation R the released correlations observe, each
        with the standard deviation its noise gives it
        (:func:`dpppl_na_dpvi.postprocess.released_fisher_correlations`), beside R's
        LKJ(``lkj_eta``) prior, which keeps A away from singular where the release is noisy.
        ``"lkj"``: the LKJ(``lkj_eta``) prior alone, and no extra release.  ``"released"``
        (experimental): R's prior centred on the release, as wide as its noise
        (:func:`dpppl_na_dpvi.postprocess.released_correlation_prior`); it has no barrier at
        singular R, and at ε = 0.1 a fit's posterior draws were not finite.  Measured
        (``tutorials/RESULTS.md``, 2026-11-29; joint TARP RMSE, class studies K = 200 at ε = 1,
        floor 0.026 ± 0.011; 10-D regression K = 100, floor 0.037 ± 0.015): the defaults give
        logistic / Poisson / unknown-scale regressions 0.028 / 0.032 / 0.032, the demo's model
        0.042 and the 10-D regression 0.044 / 0.035 / 0.037 at ε = 1 / 0.3 / 0.1 (paper 0.027 /
        0.035 / 0.036), against 0.050 / 0.029 / 0.038 / 0.041 and 0.040–0.044 / 0.122 / 0.045
        with the former defaults (``"lkj"``, η = 2, standardised rates); at ε = 0.1 the weights
        are still too wide one at a time.  Varying intercepts written centred read 0.029;
        written non-centred they stay miscalibrated with every choice (0.113: the group mean,
        scale and offsets over-confident, the slope too wide), as mean-field q is without
        privacy noise (ε = 30: 0.437).
        The released readings need a full μ-block; a diagonal A releases nothing extra.
    lkj_eta
        η of R's LKJ prior (``correlation_prior`` ``"lkj"`` or ``"released-likelihood"``).  None
        (default) learns η under a hyperprior (``dpppl_na_dpvi.postprocess.
        lkj_concentration_centre``; Laplace, whose joint mode of a learned η is degenerate, then
        fixes η at its centre), centred where R stays as well conditioned as LKJ(2) keeps a 2 × 2
        correlation whatever the number of parameters, and wide: the release moves η, all
        correlations together (it grows where they are all within their noise of 0, as on a
        regression with independent covariates, and falls to about 2 where some stand out).
        A fixed η decides how close to singular A may come: η = 2 is several times too wide on a
        10-D regression with independent covariates, and a larger η over-confident where the
        curvature is strongly correlated (``tutorials/RESULTS.md``).  The likelihood model
        (``postprocessing``) gives each correlation the release observes a prior nearly uniform
        below 0.95 instead with probability 0.2, so that one strong correlation is not shrunk
        with the many weak ones (:data:`dpppl_na_dpvi.likelihood.SLAB_BARRIER`).
    covariance
        The covariance of θ given each draw of the optimum.  ``"auto"`` (default): the
        linear-response one where the curvature is released (``correlation_prior``), the
        mean-field one elsewhere.  ``"mean-field"`` (the paper's): θ ~ q(θ; φ*), variances
        softplus(u*).  ``"linear-response"``: θ ~ N(μ*, A_μ⁻¹)
        with A_μ the drawn curvature of the ELBO in μ, which is E_q[−∇² log p(θ | x)] at the
        optimum: the linear-response correction of mean-field VI (Giordano, Broderick & Jordan,
        NeurIPS 2015), exact for a Gaussian posterior, where the mean-field variances
        1/A_jj are too small whenever the parameters are correlated.  On a 4-parameter Poisson
        regression with correlated covariates (K = 100 simulated data sets), q at the exact ELBO
        optimum gave a joint TARP RMSE of 0.094, N(μ_opt, A_μ⁻¹) 0.033, the exact posterior
        0.034.  Beside the release it calibrates what mean-field q cannot: the demo's
        intercept and w[male], correlated about −0.8, whose 90 % intervals held the truth 78–80 %
        of the time with mean-field q (69 % even without privacy noise), 81–82 % with the
        linear-response covariance under LKJ(η) alone and 86–87 % beside the correlations'
        spike-and-slab prior (TARP, K = 200, ε = 1, ``tutorials/RESULTS.md``, stop 49).
        It needs the noise-aware posterior (the naive one has no A) and is exact only with a
        full μ-block of A (``curvature``).  Past 30 parameters, where ``"auto"`` gives a
        diagonal A and mean-field q, coefficients of correlated covariates are too narrow by
        their marginal over conditional sd: about 10 % in held-out probit and Poisson
        regressions of 33–35 parameters (covariates correlated 0.3^|i−j|; 90 % intervals held
        85 %, at ε = 1 and ε = 30 alike; ``tutorials/RESULTS.md``, stop 82).  Releasing the
        curvature there for a linear-response covariance did not help at ε = 1: a released
        correlation's noise grows as n/(Nε), about 0.4 for that probit regression (stop 83).
    noise
        How the noisy gradient sums are released.  ``"snapped"`` (default): hardened against
        floating-point attacks; each clipped gradient is rounded to a power-of-two grid g, the
        noise is exact discrete-Gaussian on that grid with std σ(C + g√d), and every released
        sum is exactly k·g (see :class:`dpppl.plugin.SnappedGaussian`; it costs an extra δ of
        (1 + e^ε)·T·d·3.6·10⁻¹⁵, in the plan's ``snapping_delta``, so a plan whose δ cannot
        cover that, at large ε, is refused).  ``"float"``: float64 Gaussian noise of std σC,
        as in the paper; the low bits of its outputs can depend on the data (Jin et al. 2022).
    clipping
        ``"joint"`` (default): each record's standardised gradient is clipped to C as one
        vector.  ``"mu-first"``: its μ-part is clipped to C first and its u-part to what the
        μ-part leaves, so the sensitivity is still C and a row within C is unchanged
        (:func:`dpppl_na_dpvi.dpsgd.clip_mu_first`).  A record in a long tail of the outcome has
        a large u-gradient, and clipped whole it loses its μ-gradient with it; where the
        μ-gradient's tail is one-sided (a scale's or a shape's score) that moves the optimum:
        a Weibull regression's log scale, biased low at ε = 1 under ``"joint"``, is calibrated
        under ``"mu-first"``.  Not the default: those rows' u-gradients, which observe the
        records' information, keep less, and the weights of a Poisson and a heteroscedastic
        regression came out wider (``tutorials/RESULTS.md``, stop 79).
    relation
        The neighbour relation of the guarantee.  ``"add_or_remove_one"`` (default, the papers'):
        N, which sizes the batches and weights the prior, is treated as a public constant, so the
        guarantee is strictly one for neighbours of equal N.  ``"replace_one"``: data sets of the
        same N that differ in one record, under which N is public by definition; the sensitivity
        doubles, so about twice the noise is needed for the same ε.  Accounted by ``pld`` only
        (Poisson subsampling under replace-one, with per-record contributions in the ball of
        radius C).
    postprocessing
        How the release is read.  ``"optimum"`` (the paper's): the posterior of the ELBO's
        optimum φ* from the trace (:mod:`dpppl_na_dpvi.postprocess`), θ drawn from q(θ; φ*) or
        N(μ*, A_μ⁻¹) (``covariance``).  ``"likelihood"``: the release read as a noisy
        observation of the records' log-likelihood, −½(θ − θ̂)ᵀF(θ − θ̂) in the parameters the
        records read, with the part of each gradient that reads no record (public) taken off,
        and θ drawn under the model's own prior (:mod:`dpppl_na_dpvi.likelihood`; by NUTS, or
        by Laplace's approximation with ``inference="laplace"``): a hierarchy's group mean and
        scale, which no record reads, by their prior given the group effects, and nothing wider
        than the prior where the privacy noise leaves θ unlocated.  ``"auto"`` (default):
        ``"likelihood"`` where the curvature is released (``correlation_prior``) and the records
        read each parameter they read apart (:attr:`dpppl.RecordModel.record_parameter_rank`),
        ``"optimum"`` elsewhere; the choice is published as ``postprocessing``.  A non-centred
        hierarchy fails the last test: its records read ``mu_a + tau * z``, along whose level
        sets the likelihood's curvature is not constant, and the likelihood model, which takes
        it to be, is several times further from calibrated there than the optimum model
        (``tutorials/RESULTS.md``, stop 52), which reads it from mean-field q, over-confident
        there too: such a fit warns and says to write the hierarchy centred.  The likelihood
        model reads no option of the optimum model (``optimum``, ``optimum_prior``,
        ``covariance``, ``curvature_prior``, ``anchored``, ``subsampling_noise``).  Measured in
        ``tutorials/RESULTS.md`` (stop 51; with ``inference="laplace"``, stop 75).
    """

    name = "na-dpvi"
    description = "noise-aware DP variational inference (DP-SGD + Bayesian model of its trace)"

    @dataclass(frozen=True)
    class Options:
        steps: Annotated[int, POSITIVE] = 10_000
        sampling_rate: Annotated[float, Interval(0, 1, low_open=True)] = 0.1
        mc_draws: Annotated[int, POSITIVE] = 10
        clipping_bound: Annotated[float, POSITIVE] | None = None
        preconditioning: Annotated[float, POSITIVE] | None = None
        learning_rate_scale: Annotated[float, POSITIVE] | None = None
        burn_in: Annotated[float, Interval(0, 1, high_open=True)] = 0.2
        anchored: Annotated[float, Interval(0, 1, high_open=True)] = 0.0
        settle: bool = True
        rates: Literal["auto", "standardised", "wander-bounded"] = "auto"
        burn_in_start: Literal["auto", "fast", "capped"] = "auto"
        posterior: Literal["noise-aware", "naive"] = "noise-aware"
        inference: Literal["nuts", "laplace"] = "nuts"
        tune: Annotated[int, POSITIVE] = 1000
        draws: Annotated[int, POSITIVE] = 4000
        chains: Annotated[int, POSITIVE] = 2
        subsampling_noise: bool = False
        curvature_prior: Literal["structural", "trace"] = "structural"
        curvature: Literal["auto", "full", "diagonal"] = "auto"
        optimum: Literal["integrated", "sampled"] = "integrated"
        optimum_prior: Literal[
            "auto", "unit-information", "model-bounded", "standard-normal"
        ] = "auto"
        covariance: Literal["auto", "mean-field", "linear-response"] = "auto"
        lkj_eta: Annotated[float, POSITIVE] | None = None
        correlation_prior: Literal["lkj", "released", "released-likelihood"] = (
            "released-likelihood"
        )
        noise: Literal["snapped", "float"] = "snapped"
        clipping: Literal["joint", "mu-first"] = "joint"
        relation: Literal["add_or_remove_one", "replace_one"] = "add_or_remove_one"
        postprocessing: Literal["auto", "optimum", "likelihood"] = "auto"

        def __post_init__(self) -> None:
            if int(self.steps * (1 - self.burn_in)) < 10:
                raise InvalidOptionError("na-dpvi needs at least 10 steps after the burn-in")
            if self.anchored_steps and self.free_steps < 10:
                raise InvalidOptionError(
                    "na-dpvi needs at least 10 free steps between the burn-in and the anchored "
                    "phase; lower the option anchored or raise steps"
                )
            if self.optimum_prior == "model-bounded" and self.optimum != "integrated":
                raise InvalidOptionError(
                    "na-dpvi's optimum_prior='model-bounded' draws the optimum given the "
                    "curvature; use optimum='integrated'"
                )
            if self.lkj_eta is not None and self.correlation_prior == "released":
                raise InvalidOptionError(
                    "na-dpvi's lkj_eta sets the LKJ prior of correlation_prior='lkj' and "
                    "'released-likelihood'; correlation_prior='released' does not read it"
                )
            named = self._optimum_only_options()
            if self.postprocessing == "likelihood" and named:
                raise InvalidOptionError(
                    f"na-dpvi's postprocessing='likelihood' draws θ under the model's prior "
                    f"and has no use for the option(s) {', '.join(named)} as given; leave "
                    f"them at their defaults or use postprocessing='optimum'"
                )
            if self.covariance == "linear-response" and self.posterior == "naive":
                raise InvalidOptionError(
                    "na-dpvi's covariance='linear-response' reads the curvature of the "
                    "noise-aware posterior; use posterior='noise-aware' or "
                    "covariance='mean-field'"
                )

        def _optimum_only_options(self) -> list[str]:
            """The options given away from their defaults that only the optimum model reads."""
            unused = {
                "posterior": self.posterior != "noise-aware",
                "anchored": self.anchored > 0,
                "subsampling_noise": self.subsampling_noise,
                "optimum": self.optimum != "integrated",
                "optimum_prior": self.optimum_prior != "auto",
                "covariance": self.covariance != "auto",
                "curvature_prior": self.curvature_prior != "structural",
                "correlation_prior": self.correlation_prior == "released",
            }
            return [name for name, set_ in unused.items() if set_]

        def resolved_lkj_eta(self, dimension: int) -> float | None:
            """η of the LKJ prior on a ``dimension``-square curvature's correlation:
            ``lkj_eta``, or where it is learned (None) and Laplace runs, the centre of its
            hyperprior: a Gaussian at the joint mode of η and the correlations would sit at the
            neck of their funnel."""
            if self.lkj_eta is not None or self.inference == "nuts":
                return self.lkj_eta
            return lkj_concentration_centre(dimension)

        def resolved_postprocessing(
            self, n_params: int, reads_records: bool = True, reads_apart: bool = True
        ) -> str:
            """How the release is read: with ``"auto"`` by the likelihood model where the
            curvature is released and no option of the optimum model is set, and by
            the optimum model elsewhere, or where no parameter is ``reads_records``, or where
            the records do not read their parameters apart (``reads_apart``, a record rank
            below their number)."""
            if self.postprocessing != "auto":
                return self.postprocessing
            likely = (
                self.releases_curvature(n_params)
                and reads_records
                and reads_apart
                and not self._optimum_only_options()
            )
            return "likelihood" if likely else "optimum"

        @property
        def burn_in_steps(self) -> int:
            return int(self.burn_in * self.steps)

        @property
        def anchored_steps(self) -> int:
            # The naive posterior is the paper's baseline, DP-SGD's last iterate: no anchor.
            if self.posterior == "naive":
                return 0
            return int(self.anchored * (self.steps - self.burn_in_steps))

        @property
        def free_steps(self) -> int:
            return self.steps - self.burn_in_steps - self.anchored_steps

        def full_curvature(self, n_params: int) -> bool:
            """Whether the post-processing model's curvature has a full μ-block."""
            return self.curvature == "full" or (
                self.curvature == "auto" and 2 <= n_params <= MAX_FULL_CURVATURE
            )

        def resolved_optimum_prior(self, n_params: int) -> str:
            """The optimum's prior: with ``"auto"`` the model's own prior bounds it where a
            diagonal curvature leaves each coordinate of a model of several parameters to its
            own trace, and the unit-information prior serves everywhere else."""
            if self.optimum_prior != "auto":
                return self.optimum_prior
            bounded = (
                self.optimum == "integrated"
                and n_params >= 2
                and not self.full_curvature(n_params)
            )
            return "model-bounded" if bounded else "unit-information"

        def resolved_covariance(self, n_params: int) -> str:
            """θ's covariance given the optimum: with ``"auto"`` the linear-response one where
            the curvature is released (a full μ-block whose correlations the release observes),
            mean-field q's elsewhere."""
            if self.covariance != "auto":
                return self.covariance
            return "linear-response" if self.releases_curvature(n_params) else "mean-field"

        def wander_bounded_rates(self, n_params: int) -> bool:
            """Whether every coordinate relaxes at one wander-bounded rate: by default where the
            curvature is released, so the trace need not wander to inform its correlations."""
            if self.rates == "auto":
                return self.releases_curvature(n_params)
            return self.rates == "wander-bounded"

        def capped_start(self, model: RecordModel) -> bool:
            """Whether μ's burn-in starts no faster than the wander bound allows: with
            ``"auto"`` under standardised rates where the records read only parameters on the
            real line (coefficients), which no transform makes a scale, shape or dispersion."""
            if self.burn_in_start != "auto":
                return self.burn_in_start == "capped"
            if self.wander_bounded_rates(model.n_params):
                return False
            read = model.record_parameters
            return all(
                block.transform is None
                for block in model.parameters.blocks
                if read[block.start : block.stop].any()
            )

        def releases_curvature(self, n_params: int) -> bool:
            """Whether DP-SGD also releases the records' curvature rows: for the released prior
            on a full μ-block's correlation, which only the noise-aware posterior reads."""
            return (
                self.posterior == "noise-aware"
                and self.correlation_prior in ("released", "released-likelihood")
                and n_params >= 2
                and self.full_curvature(n_params)
            )

    #: The model's number of parameters, recorded by :meth:`check_model` for :meth:`plan`.
    _n_params: int | None = None
    #: How many records the model allows, when it alone makes them few (see :meth:`check_model`).
    _n_possible: int | None = None

    # -- privacy ----------------------------------------------------------------------------------

    @property
    def relation(self) -> NeighbourRelation:  # type: ignore[override]
        return NeighbourRelation(self.options.relation)

    def check_model(self, model: RecordModel) -> None:
        """Record the model's size (the snapped release's grid and δ depend on its dimension)
        and how many records it allows when they are few (DP-SGD then counts copies of each,
        :func:`dpppl_na_dpvi.dpsgd.run_dpsgd_replicates`): both public.

        ``dpppl.engine.plan_fit`` calls this before :meth:`plan`, as it does for every
        mechanism.
        """
        self._n_params = model.n_params
        if self.options.postprocessing == "likelihood" and not model.record_parameters.any():
            raise ModelNotSupportedError(
                "no parameter of the model is read by its records' log-likelihood, so "
                "na-dpvi's postprocessing='likelihood' has nothing to learn from them; give the "
                "likelihood a parameter"
            )
        rows = model.possible_records(limit=MAX_COUNTED_RECORDS)
        self._n_possible = None if rows is None else len(next(iter(rows.values())))
        if not _reads_apart(model):
            # Said here, before any budget is spent, so that the user can stop and rewrite the
            # model; what the fit would release is known from the model's structure alone.
            warn_user(self._hierarchy_warning(model))
        if self._wide_likelihood(model):
            warn_user(
                f"the likelihood model past {MAX_FULL_CURVATURE} parameters ({model.n_params} "
                "here, curvature='full') is not calibrated: under its wander-bounded rates "
                "DP-SGD barely leaves its start, and the quadratic log-likelihood extrapolated "
                "from there pulled a 36-parameter logistic regression's intercept towards the "
                "marginal log-odds and put a 42-parameter regression's log noise scale about 15 "
                "posterior sds above the truth (tutorials/RESULTS.md, stop 68); the default "
                "curvature='auto' reads this model with a diagonal curvature"
            )

    def _wide_likelihood(self, model: RecordModel) -> bool:
        """Whether the likelihood model would read a trace of more than ``MAX_FULL_CURVATURE``
        parameters at wander-bounded rates: measured miscalibrated (stop 68)."""
        n = model.n_params
        return (
            n > MAX_FULL_CURVATURE
            and self._postprocessing(model) == "likelihood"
            and self.options.wander_bounded_rates(n)
        )

    def _hierarchy_warning(self, model: RecordModel) -> str:
        """What a model whose records read its parameters through fewer functions of them
        (:func:`_reads_apart`) is told, by the post-processing that will read it."""
        if self._postprocessing(model) == "likelihood":
            # Only an explicit postprocessing='likelihood' gets here (auto reads such a model
            # with the optimum model).
            return (
                f"{_fewer_functions(model)}, along whose level sets the likelihood model's "
                "constant curvature does not hold, so the posterior may be miscalibrated; "
                "write the hierarchy centred or use postprocessing='auto'"
            )
        return (
            f"{_fewer_functions(model)}; mean-field q, which this posterior is drawn from, is "
            "over-confident along the directions that leave those functions fixed (varying "
            "intercepts written non-centred: the group mean's, scale's and offsets' 90 % "
            "intervals held the truth 69-76 % of the time, also without privacy noise); "
            "write the hierarchy centred, a ~ Normal(mu_a, tau), which the default "
            "postprocessing='auto' reads with the likelihood model"
        )

    def privacy_event(self, *, n_records: int, noise_multiplier: float) -> PrivacyEvent:
        # noise_multiplier is relative to the clipping bound C under either relation; the event
        # builder halves it under replace-one, whose sensitivity is 2C.
        return poisson_subsampled_gaussian(
            noise_multiplier, self.options.sampling_rate, self.options.steps, self.relation
        )

    def noise_multiplier_guess(self, *, n_records: int, epsilon: float, delta: float) -> float:
        # The moments-accountant scaling σ ≈ q √(T log(1/δ)) / ε, within ~10 % at the papers'
        # settings; the accountant refines it.
        o = self.options
        return max(o.sampling_rate * math.sqrt(o.steps * math.log(1 / delta)) / epsilon, 0.5)

    def _count_length(self, sampler: PoissonSampler) -> int | None:
        """The length of the tables from which each step draws the count of every possible
        record (:func:`dpppl.plugin.binomial_counts`), or None to sample the batch record by
        record: counts need few possible records and fit within the sampler's charged δ."""
        if self._n_possible is None or self._n_possible > COUNTED_SHARE * sampler.capacity:
            return None
        return sampler.count_length(self._n_possible)

    def _sampler(self, n_records: int, epsilon: float, delta: float) -> PoissonSampler:
        o = self.options
        return PoissonSampler.for_target(n_records, o.sampling_rate, o.steps, epsilon, delta)

    def _release_dim(self) -> int:
        """Coordinates of one step's release for the model :meth:`check_model` recorded."""
        n = self._n_params
        return release_dim(n, self.options.releases_curvature(n))

    def plan(
        self, *, n_records: int, epsilon: float, delta: float, accountant: Accountant
    ) -> PrivacyPlan:
        """Calibrate σ for T Poisson-subsampled Gaussian steps.

        Tiny shares of δ pay for what the accounted event leaves out, and the accountant is asked
        for the rest: batches larger than the sampler's capacity are truncated (probability
        below 10⁻⁴ δ over the whole run), the sampler's gap law is rounded to multiples of
        2⁻¹²⁸ (:class:`dpppl.plugin.PoissonSampler`), and the snapped release's discrete-Gaussian noise is
        within a total variation of 1.9·10⁻¹⁷ per coordinate and step of a law within a factor
        e^(±2⁻⁴³) of the rounded continuous Gaussian the event describes
        (:class:`dpppl.plugin.SnappedGaussian`).  The total variations are charged (1 + e^ε)
        times; the factor, over T steps of d coordinates, is a max-divergence γ = T d 2⁻⁴³, for
        which the accountant is asked for ε − 2γ at δ scaled by e^(−γ).
        """
        o = self.options
        sampler = self._sampler(n_records, epsilon, delta)
        truncation = sampler.delta_cost(o.steps, epsilon)
        snapping = divergence = 0.0
        if o.noise == "snapped":
            if self._n_params is None:
                raise RuntimeError(
                    "na-dpvi's plan needs the model's dimension: call check_model(model) first "
                    "(dpppl.engine.plan_fit does)"
                )
            dim = self._release_dim()
            snapping = SnappedGaussian.delta_cost(steps=o.steps, dim=dim, epsilon=epsilon)
            divergence = SnappedGaussian.max_divergence(steps=o.steps, dim=dim)
        extra_delta = truncation + snapping
        if extra_delta >= delta:
            remedy = "a larger delta or the option noise='float'" if snapping >= truncation else (
                "a smaller epsilon or a larger delta"
            )
            raise InvalidPrivacyParameterError(
                f"delta={delta:g} does not cover what the accounting leaves out at "
                f"epsilon={epsilon:g} and {o.steps} steps, each charged (1 + e^epsilon) times its "
                f"total variation: the Poisson sampler's truncation and rounding "
                f"({truncation:.3g}) and the snapped release's share ({snapping:.3g}); use "
                f"{remedy}"
            )
        if 2 * divergence >= epsilon / 2:
            raise InvalidPrivacyParameterError(
                f"epsilon={epsilon:g} is too small for the snapped release's float error over "
                f"{o.steps} steps, which alone costs {2 * divergence:.3g} of it; use a larger "
                "epsilon or the option noise='float'"
            )
        # The snapped noise's relative error (a max-divergence γ) costs 2γ of ε and a factor
        # e^γ on the accounted δ (γ = T d 2⁻⁴³: 6·10⁻⁷ at 30 parameters and 10,000 steps).
        accounted = super().plan(
            n_records=n_records,
            epsilon=epsilon - 2 * divergence,
            delta=(delta - extra_delta) * math.exp(-divergence),
            accountant=accountant,
        )
        curvature = o.releases_curvature(self._n_params or 0)
        releases = "DP-SGD parameter trace and noisy gradient sums" + (
            ", each sum also holding the outer products of the records' mu-gradients (curvature "
            "rows, dpppl_na_dpvi.dpsgd.curvature_rows)" if curvature else ""
        )
        details = {
            "steps": o.steps,
            "sampling": "poisson",
            "sampling_rate": o.sampling_rate,
            "batch_capacity": sampler.capacity,
            "count_length": self._count_length(sampler),
            "accountant_delta": accounted.delta,
            "truncation_delta": truncation,
            "noise": o.noise,
            "releases": releases,
            "curvature_release": curvature,
            # Under replace-one the sensitivity is twice this, and the event's multiplier half σ.
            "noise_std": "noise_multiplier x the sensitivity of one record (B = C, or "
            "C sqrt(1 + rho^2) with the curvature release; B + grid x sqrt(d) snapped)",
        }
        if o.noise == "snapped":
            # The grid depends on public quantities only: the batch capacity, C (the option or
            # the rule the schedule applies), σ and d.
            bound = self._clipping_bound(self._n_params, n_records, accounted.noise_multiplier)
            release = SnappedGaussian.for_sum(
                capacity=sampler.capacity,
                clipping_bound=release_bound(bound, curvature),
                noise_multiplier=accounted.noise_multiplier,
                dim=dim,
            )
            details.update(
                grid=release.grid,
                sensitivity=release.sensitivity,
                snapping_delta=snapping,
                snapping_max_divergence=divergence,
                releases=f"{releases}; the sums exactly on the grid",
            )
        return dataclasses.replace(
            accounted,
            epsilon=accounted.epsilon + 2 * divergence,
            delta=delta,
            extra_delta=extra_delta,
            max_divergence=divergence,
            details=details,
        )

    # -- fitting ----------------------------------------------------------------------------------

    def fit(
        self,
        model: RecordModel,
        data: dict[str, np.ndarray],
        plan: PrivacyPlan,
        *,
        seed: np.random.SeedSequence,
        progress: Progress,
    ) -> Release:
        [release] = self._fit(model, [data], plan, [seed], progress, replicates=False)
        return release

    def replicate_batch_size(self, model: RecordModel, plan: PrivacyPlan) -> int:
        """Replicates per vmapped program on JAX's default device: as many as fit in its memory
        limit (the trace, the post-processing draws and a DP-SGD step's per-record gradients of
        each) and, on a CPU, keep one step's per-record gradients of the whole batch within
        ``REPLICATE_STEP_ELEMENTS``, but at least ``MIN_REPLICATE_BATCH`` where memory allows
        (see :func:`replicate_limits`)."""
        o = self.options
        d = 2 * model.n_params
        post = 2 * d + d * d // 8 + 8  # φ*, v, μ-correlations (at most (d/2)²/2), statistics
        # A record's Monte Carlo gradients, and its curvature row where one is released (n(n + 1)/2
        # entries: at 36 parameters 666, beside the default 10 draws × 72 gradient coordinates).
        n = model.n_params
        per_record = o.mc_draws * d + release_dim(n, o.releases_curvature(n)) - d
        per_replicate = 8 * (
            3 * o.steps * d
            + o.chains * o.draws * post
            + 4 * plan.details["batch_capacity"] * per_record
        )
        per_step = plan.details["batch_capacity"] * per_record
        memory, step_elements = replicate_limits(jax.devices()[0])
        fits_memory = memory // per_replicate
        fits_step = fits_memory if step_elements is None else step_elements // per_step
        # One replicate at a time is slower than a batch whose step outgrows the caches (10-D
        # regression, d = 24: 215 µs per step one at a time, 146 per replicate-step at 16,
        # 2026-11-26), so memory alone caps the floor MIN_REPLICATE_BATCH.
        batch = max(
            min(fits_memory, fits_step),
            min(fits_memory, MIN_REPLICATE_BATCH),
        )
        return int(np.clip(batch, 1, MAX_REPLICATE_BATCH))

    def fit_replicates(
        self,
        model: RecordModel,
        datasets: Sequence[Mapping[str, np.ndarray]],
        plan: PrivacyPlan,
        *,
        seeds: Sequence[np.random.SeedSequence],
        progress: Progress,
    ) -> list[Release]:
        """The replicates as one vmapped program; a single replicate on the single-fit program.

        :func:`dpppl.tarp` hands every batch of a study over at one size, so a study compiles
        one program.
        """
        return self._fit(
            model, list(datasets), plan, list(seeds), progress, replicates=len(datasets) > 1
        )

    def _clipping_bound(self, n_params: int, n_records: int, noise_multiplier: float) -> float:
        """C: the option, or :func:`~dpppl_na_dpvi.heuristics.default_clipping_bound`.  The plan
        (the snapped release's grid) and the run both take it from here, so they cannot
        disagree on the sensitivity."""
        o = self.options
        if o.clipping_bound is not None:
            return o.clipping_bound
        return default_clipping_bound(
            n_params,
            noise_multiplier=noise_multiplier,
            n_records=n_records,
            sampling_rate=o.sampling_rate,
            steps=o.steps,
        )

    def _fit(
        self,
        model: RecordModel,
        datasets: Sequence[Mapping[str, np.ndarray]],
        plan: PrivacyPlan,
        seeds: Sequence[np.random.SeedSequence],
        progress: Progress,
        *,
        replicates: bool,
    ) -> list[Release]:
        """Fits of ``datasets``: one at a time, or vmapped over them with ``replicates``."""
        o = self.options
        grid = plan.details["grid"] if o.noise == "snapped" else None
        keys = [jax.random.split(jax_key(seed), 3) for seed in seeds]
        # Every data set shares the model's structure, so the rules are decided once.
        rules = {
            "clipping_bound": self._clipping_bound(
                model.n_params, model.n_records, plan.noise_multiplier
            ),
            "equal_rates": o.wander_bounded_rates(model.n_params),
            "capped_start": o.capped_start(model),
        }
        schedules = [
            StandardisedSchedule(
                model,
                noise_multiplier=plan.noise_multiplier,
                sampling_rate=o.sampling_rate,
                steps=o.steps,
                burn_in_steps=o.burn_in_steps,
                u_preconditioning=o.preconditioning,
                learning_rate_scale=o.learning_rate_scale,
                settle=o.settle,
                **rules,
            )
            for _ in datasets
        ]
        phi0 = np.stack([schedule.initial_phi() for schedule in schedules])
        traces, finals = run_dpsgd_replicates(
            model,
            datasets,
            phi0,
            schedules,
            [k[0] for k in keys],
            steps=o.steps,
            capacity=plan.details["batch_capacity"],
            count_length=plan.details.get("count_length"),
            mc_draws=o.mc_draws,
            progress=progress,
            grid=grid,
            vectorised=replicates,
            anchored_steps=o.anchored_steps,
            curvature=o.releases_curvature(model.n_params),
            mu_first=o.clipping == "mu-first",
        )
        read = self._read_coordinates(model)
        starts = [
            self._settled_step(trace, schedule, read)
            for trace, schedule in zip(traces, schedules, strict=True)
        ]
        if o.posterior == "naive":
            posts = [None] * len(traces)
        else:
            posts = self._post_process(
                model, traces, starts, finals, grid, [k[1] for k in keys], progress, replicates
            )
        return [
            self._release(model, trace, post, schedule, start, read, key[2])
            for trace, post, schedule, start, key in zip(
                traces, posts, schedules, starts, keys, strict=True
            )
        ]

    def _postprocessing(self, model: RecordModel) -> str:
        """How this model's release is read (:meth:`Options.resolved_postprocessing`)."""
        return self.options.resolved_postprocessing(
            model.n_params, bool(model.record_parameters.any()), _reads_apart(model)
        )

    def _read_coordinates(self, model: RecordModel) -> np.ndarray:
        """The coordinates of φ whose trace the noise-aware posterior reads: all of them, or for
        the likelihood model those of the parameters the records read (the records' gradients
        do not depend on the others, whose posterior given the rest is their prior's)."""
        if self._postprocessing(model) != "likelihood":
            return np.arange(2 * model.n_params)
        records = model.record_parameters
        return np.flatnonzero(np.concatenate([records, records]))

    def _settled_step(
        self, trace: Trace, schedule: StandardisedSchedule, read: np.ndarray
    ) -> int:
        """The first step the noise-aware posterior reads: the burn-in's end, or later where the
        free steps of the coordinates it reads still drift (the choice the schedule's anchor
        made)."""
        o = self.options
        free = trace.phi[o.burn_in_steps : o.steps - o.anchored_steps, read]
        return o.burn_in_steps + schedule.settled_start(free)

    def _release(
        self,
        model: RecordModel,
        trace: Trace,
        post: PostProcessingDraws | LikelihoodDraws | None,
        schedule: StandardisedSchedule,
        settled_step: int,
        read: np.ndarray,
        key: jax.Array,
    ) -> Release:
        """One fit's release; ``read`` are the coordinates of φ whose drift the posterior reads
        (:meth:`_read_coordinates`)."""
        o = self.options
        # The anchored phase does not move (its first iterate is the anchor), so only the moving
        # steps can drift.
        moving = trace.phi[: o.steps - o.anchored_steps] if o.anchored_steps else trace.phi
        scores = drift_scores(moving, settled_step)
        groups = {
            "dpvi_trace": _trace_dataset(model, trace, scores, schedule.last.clipping_bound)
        }
        attrs = {
            **schedule.public(),
            "anchored_steps": o.anchored_steps,
            "settled_step": settled_step,
            "clipping": o.clipping,
            "rates": "wander-bounded" if schedule.equal_rates else "standardised",
            "burn_in_start": "capped" if schedule.capped_start else "fast",
        }
        if isinstance(post, LikelihoodDraws):
            # The likelihood model regresses the gradients on the iterates and assumes no
            # stationarity, so a drift is no reason to doubt it (the drift warning fired on 194
            # of 200 calibrated fits of the 10-D regression at ε = 0.1); its own check is how
            # much the gradients scatter about that regression.
            names = _record_labels(model)
            groups["dpvi_trace"] = groups["dpvi_trace"].assign(
                gradient_scatter=(("record_param",), post.gradient_scatter),
                u_gradient_scatter=(("record_param",), post.u_gradient_scatter),
            ).assign_coords(record_param=names)
            labels = _vi_labels(model)
            mu_labels = [labels[i] for i in np.flatnonzero(model.record_parameters)]
            scattering = scatter_warning(post.gradient_scatter, mu_labels)
            messages = [] if scattering is None else [scattering]
            groups.update(_likelihood_groups(model, post))
            messages += _laplace_warning(post.fit_stats)
            messages += _divergence_warning(
                post.sample_stats,
                post.target_accept,
                "more tune steps; a hierarchy written non-centred, mu + tau * z, is better "
                "written centred, or read with postprocessing='optimum'",
            )
            attrs["postprocessing"] = "likelihood"
            # A writable copy, as the optimum model's draws are: NumPy views of JAX arrays are
            # read-only.
            draws = np.array(post.theta)
            return Release(draws=draws, groups=groups, attrs=attrs, warnings=messages)
        labels = _vi_labels(model)
        drifting = drift_warning(
            scores[read],
            [labels[i] for i in read],
            schedule.bounded_relaxations(len(moving) - 1 - settled_step),
        )
        messages = [] if drifting is None else [drifting]
        if post is None:
            phi_star = trace.phi[-1][None, None, :].repeat(o.chains, 0).repeat(o.draws, 1)
        else:
            phi_star = post.phi_star
            groups.update(_postprocessing_groups(model, post))
            messages += _laplace_warning(post.fit_stats)
            messages += _divergence_warning(
                post.sample_stats, post.target_accept, "inference='laplace' or more tune steps"
            )
        curvature = None
        if post is not None and o.resolved_covariance(model.n_params) == "linear-response":
            n = model.n_params
            curvature = curvature_matrices(post.curvature_diagonal, post.mu_correlation)[
                ..., :n, :n
            ]
        draws = _mixture_draws(model, phi_star, key, curvature)
        if post is not None:
            attrs["postprocessing"] = "optimum"
            attrs["optimum_prior"] = o.resolved_optimum_prior(model.n_params)
            attrs["covariance"] = o.resolved_covariance(model.n_params)
        return Release(draws=draws, groups=groups, attrs=attrs, warnings=messages)

    def _post_process(
        self,
        model: RecordModel,
        traces: list[Trace],
        starts: list[int],
        finals: list[DPSGDSettings],
        grid: float | None,
        keys: list[jax.Array],
        progress: Progress,
        replicates: bool,
    ) -> list[PostProcessingDraws] | list[LikelihoodDraws]:
        o = self.options
        if self._postprocessing(model) == "likelihood":
            return self._likelihood_posterior(
                model, traces, starts, finals, grid, keys, progress, replicates
            )
        stats = [
            self._statistics(model, trace, start, settings, grid)
            for trace, start, settings in zip(traces, starts, finals, strict=True)
        ]
        correlation_prior = o.correlation_prior if o.releases_curvature(model.n_params) else "lkj"
        structure = ModelStructure(
            full_curvature=o.full_curvature(model.n_params),
            subsampling=o.subsampling_noise,
            integrated_optimum=o.optimum == "integrated",
            optimum_prior=o.resolved_optimum_prior(model.n_params),
            lkj_eta=o.resolved_lkj_eta(model.n_params),
            correlation_prior=correlation_prior,
        )
        options = dict(draws=o.draws, chains=o.chains, structure=structure, cache=model.cached)
        with progress.task(f"noise-aware posterior ({o.inference})", total=1) as bar:
            if o.inference == "nuts":
                posts = sample_nuts(stats, keys, tune=o.tune, replicates=replicates, **options)
            else:
                posts = self._redraw_unconverged(
                    sample_laplace(stats, keys, replicates=replicates, **options),
                    stats,
                    keys,
                    lambda one, key: sample_nuts([one], [key], tune=o.tune, **options)[0],
                )
            bar.advance(1)
        return posts

    def _likelihood_posterior(
        self,
        model: RecordModel,
        traces: list[Trace],
        starts: list[int],
        finals: list[DPSGDSettings],
        grid: float | None,
        keys: list[jax.Array],
        progress: Progress,
        replicates: bool,
    ) -> list[LikelihoodDraws]:
        """The likelihood model's posterior of each fit (:mod:`dpppl_na_dpvi.likelihood`)."""
        o = self.options
        n = model.n_params
        released = o.releases_curvature(n)
        records = model.record_parameters
        prior_part = _prior_part_gradient(model)
        prior_curvature = _prior_curvature(model)
        prior_point = model.initial_point()
        stats = []
        for trace, start, settings in zip(traces, starts, finals, strict=True):
            beta = np.asarray(settings.preconditioner)
            stats.append(
                LikelihoodStatistics.from_trace(
                    trace.phi,
                    trace.noisy_grad,
                    start=start,
                    noise_std=noise_std(settings, grid, n, released) / beta,
                    rate=o.sampling_rate,
                    records=records,
                    prior_part_gradient=prior_part,
                    prior_curvature=prior_curvature,
                    prior_point=prior_point,
                    released_fisher=(
                        _released_fisher(model, trace, start, settings, grid) if released else None
                    ),
                )
            )
        structure = LikelihoodStructure(
            records=tuple(bool(b) for b in records),
            full=o.full_curvature(n),
            released=released,
            lkj_eta=o.resolved_lkj_eta(int(records.sum())),
        )
        options = dict(
            draws=o.draws, chains=o.chains, structure=structure, logprior=model.logprior,
            cache=model.cached,
        )
        with progress.task(f"noise-aware posterior (likelihood, {o.inference})", total=1) as bar:
            if o.inference == "nuts":
                posts = sample_likelihood(
                    stats, keys, tune=o.tune, replicates=replicates, **options
                )
            else:
                posts = self._redraw_unconverged(
                    sample_likelihood_laplace(stats, keys, replicates=replicates, **options),
                    stats,
                    keys,
                    lambda one, key: sample_likelihood([one], [key], tune=o.tune, **options)[0],
                )
            bar.advance(1)
        return posts

    @staticmethod
    def _redraw_unconverged(
        posts: list[PostProcessingDraws] | list[LikelihoodDraws],
        stats: list[TraceStatistics] | list[LikelihoodStatistics],
        keys: list[jax.Array],
        nuts: Callable[[Any, jax.Array], PostProcessingDraws | LikelihoodDraws],
    ) -> list[PostProcessingDraws] | list[LikelihoodDraws]:
        """NUTS draws for the fits whose Laplace fit did not reach a mode, keeping the Laplace
        fit's statistics: a Gaussian at a point that is no mode is off-centre or of the wrong
        width, or not finite at all where the density is not concave (one fit in 100 of the
        10-D regression at ε = 0.3 drew 79 % non-finite values).  Post-processing costs no
        privacy, so the release is kept and only its posterior is redrawn."""
        for i, (post, one, key) in enumerate(zip(posts, stats, keys, strict=True)):
            if laplace_convergence(post.fit_stats) is not None:
                posts[i] = dataclasses.replace(nuts(one, key), fit_stats=post.fit_stats)
        return posts

    def _statistics(
        self,
        model: RecordModel,
        trace: Trace,
        start: int,
        settings: DPSGDSettings,
        grid: float | None,
    ) -> TraceStatistics:
        o = self.options
        beta = np.asarray(settings.preconditioner)
        bound = settings.clipping_bound
        # A Poisson batch of clipped gradients varies by at most √(κN)·C per coordinate: the
        # prior scale of the subsampling noise, in units of the noisy gradients (divided by β).
        subsampling_scale = math.sqrt(o.sampling_rate * model.n_records) * bound / beta
        curvature = o.releases_curvature(model.n_params)
        return TraceStatistics.from_trace(
            trace.phi,
            trace.noisy_grad,
            burn_in=start,
            noise_std=noise_std(settings, grid, model.n_params, curvature) / beta,
            rate=o.sampling_rate,
            subsampling_scale=subsampling_scale,
            curvature_prior=o.curvature_prior,
            anchored=o.anchored_steps,
            model_prior=(
                prior_summary(model)
                if o.resolved_optimum_prior(model.n_params) == "model-bounded"
                else None
            ),
            released_curvature=(
                (*_released_fisher(model, trace, start, settings, grid), _prior_curvature(model))
                if curvature
                else None
            ),
        )


#: Monte Carlo draws of q for the curvature of the model's prior (fixed: the draws are public and
#: the same for every fit, so the curvature is a function of φ alone).
PRIOR_CURVATURE_DRAWS = 64


def _prior_curvature(model: RecordModel):
    """φ ↦ E_q[−∇² log p(θ)] (n × n), the curvature in μ of the ELBO's prior part, jitted once per
    model structure."""

    def build():
        def curvature(phi):
            draws = model.draw_variational(phi, jax.random.key(0), PRIOR_CURVATURE_DRAWS)
            return -jax.vmap(jax.hessian(model.logprior))(draws).mean(axis=0)

        return jax.jit(curvature)

    compiled = model.cached(("na-dpvi", "prior-curvature"), build)
    return lambda phi: np.asarray(compiled(jax.numpy.asarray(phi)))


def _prior_part_gradient(model: RecordModel):
    """Iterates (m, 2n) ↦ the gradients of the part of the negative ELBO that reads no record,
    E_q[log q(θ) − log p(θ)], at each (:meth:`RecordModel.entropy_and_prior` over
    ``PRIOR_CURVATURE_DRAWS`` fixed draws: public, the same for every fit), jitted once per model
    structure."""

    def build():
        eps = jax.random.normal(jax.random.key(0), (PRIOR_CURVATURE_DRAWS, model.n_params))
        gradient = jax.grad(model.entropy_and_prior)
        return jax.jit(jax.vmap(lambda phi: gradient(phi, eps)))

    compiled = model.cached(("na-dpvi", "prior-part-gradient"), build)
    return lambda phis: np.asarray(compiled(jax.numpy.asarray(phis)))


def _released_fisher(
    model: RecordModel, trace: Trace, start: int, settings: DPSGDSettings, grid: float | None
) -> tuple[np.ndarray, float]:
    """The released curvature rows averaged over the chunks that end after ``start`` (the first
    of them may begin a little before it): the empirical Fisher information of the records'
    standardised μ-gradients, per step (see :func:`dpppl_na_dpvi.dpsgd.curvature_rows`), and
    its noise's standard deviation per entry."""
    n = model.n_params
    ends = np.append(trace.curvature_starts[1:], len(trace.noisy_sum))
    read = ends > start
    steps = int((ends - trace.curvature_starts)[read].sum())
    total = trace.curvature_sums[read].sum(axis=0)
    bound = settings.clipping_bound
    noise = float(noise_std(settings, grid, n, curvature=True)) / curvature_scale(n, bound)
    return curvature_matrix(total, n, bound) / steps, noise / math.sqrt(steps)


def _vi_labels(model: RecordModel) -> list[str]:
    labels = model.parameters.labels()
    return [f"mu[{label}]" for label in labels] + [f"u[{label}]" for label in labels]


def _trace_dataset(
    model: RecordModel, trace: Trace, drift: np.ndarray, clipping_bound: float
) -> xr.Dataset:
    labels = _vi_labels(model)
    variables = {
        "phi": (("step", "vi_param"), trace.phi),
        "noisy_sum": (("iteration", "vi_param"), trace.noisy_sum),
        "preconditioner": (("iteration", "vi_param"), trace.preconditioner),
        "drift_score": (("vi_param",), drift),
    }
    coords = {
        "step": np.arange(trace.phi.shape[0]),
        "iteration": np.arange(1, trace.noisy_grad.shape[0] + 1),
        "vi_param": labels,
    }
    if trace.curvature_sums is not None:
        n = model.n_params
        names = model.parameters.labels()
        variables["curvature_sum"] = (
            ("chunk", "mu_row", "mu_column"),
            curvature_matrix(trace.curvature_sums, n, clipping_bound),
        )
        variables["chunk_start"] = (("chunk",), trace.curvature_starts + 1)
        coords.update(chunk=np.arange(len(trace.curvature_starts)), mu_row=names, mu_column=names)
    return xr.Dataset(
        variables,
        coords=coords,
        attrs={
            "description": "DP-SGD release: noisy sums s_t (t = 1..T) of the clipped, "
            "preconditioned per-record gradients of the variational objective (exactly on the "
            "plan's grid with noise='snapped'), the public preconditioner beta_t of each step "
            "(the noisy gradients are s_t / beta_t), and parameters phi_t (t = 0..T), the "
            "last anchored_steps of which (in the result's dp_mechanism_attrs) stay at the "
            "mean of the moving steps from settled_step on; phi = (mu, u), variances "
            "softplus(u); drift_score: Geweke z-score of each coordinate between the first and "
            "last third of the moving steps from settled_step on, the steps the posterior reads "
            "(|z| > 4: the trace has not settled, see dpppl_na_dpvi.convergence); "
            "gradient_scatter (with the likelihood model): the residual variance of the "
            "records' gradient in each mu-coordinate they read about its linear fit in mu over "
            "those steps, as a multiple of the privacy noise's (about 1 where the gradients are "
            "linear and the privacy noise is all their noise, see "
            "dpppl_na_dpvi.likelihood.gradient_scatter), and u_gradient_scatter the same of "
            "the u-gradients about their fit through 0 on sigmoid(u) "
            "(dpppl_na_dpvi.likelihood.u_gradient_scatter); "
            "curvature_sum (with the curvature release): noisy sums, over the iterations of "
            "each chunk from chunk_start on, of the outer products of the clipped, "
            "preconditioned per-record mu-gradients (dpppl_na_dpvi.dpsgd.curvature_rows)",
        },
    )


def _postprocessing_groups(model: RecordModel, post: PostProcessingDraws) -> dict[str, xr.Dataset]:
    labels = _vi_labels(model)
    chains, draws = post.phi_star.shape[:2]
    coords = {"chain": np.arange(chains), "draw": np.arange(draws), "vi_param": labels}
    variables = {
        "phi_star": (("chain", "draw", "vi_param"), post.phi_star),
        "A_diagonal": (("chain", "draw", "vi_param"), post.curvature_diagonal),
    }
    if post.mu_correlation.shape[-1]:
        coords["mu_pair"] = _pair_labels(model.parameters.labels())
        variables["A_mu_correlation"] = (("chain", "draw", "mu_pair"), post.mu_correlation)
        if post.mu_concentration is not None:
            variables["A_mu_lkj_concentration"] = (("chain", "draw"), post.mu_concentration)
    posterior = xr.Dataset(
        variables,
        coords=coords,
        attrs={
            "description": "posterior of the post-processing model: optimum phi*, and the "
            "curvature A of the variational objective by its diagonal and, when A is full, the "
            "correlations of its mu-block (with the concentration of the LKJ prior on the "
            "correlation of the records' share of it, learned); "
            "dpppl_na_dpvi.postprocess.curvature_matrices(A_diagonal, "
            "A_mu_correlation) rebuilds the matrices",
            **_inference_attrs(post.sample_stats, post.fit_stats),
        },
    )
    return _posterior_groups(posterior, post.sample_stats, coords, post.target_accept)


def _reads_apart(model: RecordModel) -> bool:
    """Whether the records read each parameter they read apart from the others
    (:attr:`RecordModel.record_parameter_rank`), as the likelihood model assumes."""
    return model.record_parameter_rank == model.record_parameters.sum()


def _fewer_functions(model: RecordModel) -> str:
    """What :func:`_reads_apart` found, in words, for a warning."""
    return (
        f"the records read the model's {model.record_parameters.sum()} parameters they depend "
        f"on through {model.record_parameter_rank} functions of them (a non-centred "
        "hierarchy's mu + tau * z, say)"
    )


def _pair_labels(names: list[str]) -> list[str]:
    """Labels of the pairs of ``names`` row by row below the diagonal, as correlations are kept."""
    rows, cols = np.tril_indices(len(names), -1)
    return [f"{names[i]}, {names[j]}" for i, j in zip(rows, cols, strict=True)]


def _sample_stats_dataset(
    sample_stats: dict[str, np.ndarray], coords: dict, target_accept: float
) -> xr.Dataset:
    """The post-processing NUTS run's statistics per (chain, draw), and the target acceptance
    rate it ran at (higher where a first run diverged and the fit was drawn again)."""
    return xr.Dataset(
        {k: (("chain", "draw"), v) for k, v in sample_stats.items()},
        coords={"chain": coords["chain"], "draw": coords["draw"]},
        attrs={"target_accept": target_accept},
    )


def _posterior_groups(
    posterior: xr.Dataset,
    sample_stats: dict[str, np.ndarray],
    coords: dict[str, np.ndarray],
    target_accept: float | None,
) -> dict[str, xr.Dataset]:
    """The post-processing posterior's group, and NUTS's statistics beside it where NUTS ran."""
    groups = {"postprocessing_posterior": posterior}
    if sample_stats:
        groups["postprocessing_sample_stats"] = _sample_stats_dataset(
            sample_stats, coords, target_accept
        )
    return groups


def _laplace_warning(fit_stats: dict[str, float]) -> list[str]:
    """What a user is told where a Laplace fit (``fit_stats``; empty: NUTS ran) did not reach a
    mode and its posterior was drawn with NUTS."""
    unconverged = laplace_convergence(fit_stats) if fit_stats else None
    return [f"{unconverged}; it was drawn with NUTS instead"] if unconverged else []


def _divergence_warning(
    sample_stats: dict[str, np.ndarray], target_accept: float | None, remedy: str
) -> list[str]:
    diverging = int(sample_stats.get("diverging", np.zeros(1)).sum())
    if not diverging:
        return []
    return [
        f"{diverging} divergent transitions in the NUTS run of the post-processing model, at "
        f"target acceptance rate {target_accept}; its posterior may be biased (try {remedy})"
    ]


def _record_labels(model: RecordModel) -> list[str]:
    """The labels of the parameters the records read (:attr:`RecordModel.record_parameters`)."""
    return [n for n, read in zip(model.parameters.labels(), model.record_parameters) if read]


def _inference_attrs(
    sample_stats: dict[str, np.ndarray], fit_stats: dict[str, float]
) -> dict[str, str | float]:
    """Which inference drew a post-processing posterior (NUTS also where a Laplace fit was asked
    for and did not reach a mode), and a Laplace fit's half Newton decrement and smallest
    curvature at its mode."""
    return {
        "inference": "nuts" if sample_stats else "laplace",
        **{f"laplace_{k}": v for k, v in fit_stats.items()},
    }


def _likelihood_groups(model: RecordModel, post: LikelihoodDraws) -> dict[str, xr.Dataset]:
    """The likelihood model's draws of the records' information F, and NUTS's statistics."""
    names = _record_labels(model)
    chains, draws = post.theta.shape[:2]
    coords = {"chain": np.arange(chains), "draw": np.arange(draws), "record_param": names}
    variables = {
        "F_diagonal": (("chain", "draw", "record_param"), post.information_diagonal),
    }
    if post.information_correlation.shape[-1]:
        coords["record_pair"] = _pair_labels(names)
        variables["F_correlation"] = (
            ("chain", "draw", "record_pair"), post.information_correlation
        )
    posterior = xr.Dataset(
        variables,
        coords=coords,
        attrs={
            "description": "posterior of the likelihood model (dpppl_na_dpvi.likelihood): the "
            "information F of the records' log-likelihood about the parameters they read, by "
            "its diagonal and its correlations, drawn jointly with the parameters",
            **_inference_attrs(post.sample_stats, post.fit_stats),
        },
    )
    return _posterior_groups(posterior, post.sample_stats, coords, post.target_accept)


def _mixture_draws(
    model: RecordModel, phi_star: np.ndarray, key: jax.Array, curvature: np.ndarray | None = None
) -> np.ndarray:
    """One θ per draw of φ* = (μ*, u*): from q(θ; φ*) (the mixture (1/M) Σ q(θ; φ*_i)), or, given
    the μ-block of the curvature drawn with it (..., n, n), from N(μ*, A_μ⁻¹) (linear response)."""
    n = model.n_params
    mu = phi_star[..., :n]
    z = np.asarray(jax.random.normal(key, mu.shape))
    if curvature is None:
        return mu + np.sqrt(np.asarray(jax.nn.softplus(phi_star[..., n:]))) * z
    # θ = μ + L⁻ᵀz with A_μ = LLᵀ has covariance (LLᵀ)⁻¹.
    chol = np.linalg.cholesky(curvature)
    return mu + np.linalg.solve(np.swapaxes(chol, -1, -2), z[..., None])[..., 0]
