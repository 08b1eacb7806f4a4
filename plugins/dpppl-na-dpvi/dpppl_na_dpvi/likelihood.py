"""The noise-aware likelihood model: the DP-SGD release read as a noisy observation of the
records' log-likelihood, and the posterior drawn under the model's own prior.

The paper's post-processing model (:mod:`dpppl_na_dpvi.postprocess`) infers the optimum φ* of
the ELBO from the trace and draws θ from q(θ; φ*) or N(μ*, A_μ⁻¹).  The optimum's prior there
is a generic one (unit information), and the model's prior enters only through the optimum
itself, linearised.  Where the privacy noise leaves the optimum uncertain by as much as the
model's prior allows θ to vary, that posterior is wider than the prior: on the 10-D regression
at ε = 0.1 the weights' noise-aware spread was 360–1,580 posterior sds of q, several times the
prior's (``tutorials/RESULTS.md``, stop 46), and in a hierarchy the group intercepts are spread
independently by the noise where a small group scale would tie them together.

This model reads the release the other way round.  Each released gradient is the ELBO's, and
the ELBO is the records' part, −Σ_i E_q[log p(x_i | θ)], plus a part that reads no record,
E_q[log q(θ) − log p(θ)], whose gradient is public given φ (:meth:`RecordModel.entropy_and_prior`).
Taking it off leaves the records' part, which for a log-likelihood that is quadratic where the
trace moves, −Σ_i log p(x_i | θ) ≈ ½ (θ − θ̂)ᵀ F (θ − θ̂) + const in the coordinates the records
read, has expected noisy gradients (κ the sampling rate)

    r_t,μ = κ F (μ_t − θ̂),        r_t,u = ½ κ diag(F) ⊙ sigmoid(u_t),

each with the release's noise (variance V per coordinate; where the gradients scatter more
about their fit, as the sampling of records makes them at a large ε, the variance they show,
:func:`gradient_scatter`, :func:`u_gradient_scatter`).  The μ-gradients locate θ̂ and, through
the trace's wander, inform F; the u-gradients observe F's diagonal; the released curvature rows
observe F's correlations (:func:`dpppl_na_dpvi.postprocess.released_fisher_correlations`).  And
θ̂ is the centre of the records' likelihood, which given θ is about N(θ, F⁻¹): integrated out
against the trace's Gaussian likelihood of it, the release says of θ and F

    log p(release | θ, F) = −½ zᵀ(F + W)⁻¹z − ½ log|F + W| − ½ RSS(F) + (u-gradients' term),
    z = F (θ_R − μ̄) + r̄/κ,   W = V / (T κ²),

with μ̄ and r̄ the means of μ_t and r_t over the T gradients read and RSS(F) the residual sum of
squares of r_t − r̄ on κF(μ_t − μ̄).  The posterior of θ is then that times the model's own prior
p(θ), exactly, hierarchy and all; θ's coordinates that no record reads (a centred hierarchy's
group mean and scale, :attr:`RecordModel.record_parameters`) are held by the prior alone.

NUTS samples θ, F's log-diagonal v and its correlations y together.  The released correlations
observe the correlations; those the release cannot observe are held at 0
(:data:`UNOBSERVED_CORRELATION_STD`).  Each observed one has LKJ(η)'s prior with η learned, as in
the optimum model, or with probability :func:`~dpppl_na_dpvi.postprocess.correlation_slab_weights`
a prior nearly uniform below about 0.95 (:data:`SLAB_BARRIER`), so that one strong correlation is
not shrunk with the many weak ones.

NUTS sees the records' coordinates of θ whitened by their conditional posterior given the rest,
θ_R = θ* + Q^(−½) ε: Q = H + Σ⁻¹ is the likelihood's precision Σ⁻¹ = F(F + W)⁻¹F plus the
diagonal curvature H of the model's log prior in θ_R, the larger of its values at the trace's
mean μ̄ and at the model's initial point, and θ* one Newton step from μ̄ towards the mode of the
prior times the likelihood, whose centre is m = μ̄ − F⁻¹r̄/κ.  The map is a bijection for each
(θ_F, F), so the target is unchanged, and where the prior of θ_R given the rest is an
independent Gaussian (normal priors, a centred hierarchy's group effects) ε is exactly standard
normal whatever θ_F and F are: no funnel of θ with F along a direction the release leaves weak,
where the posterior is the prior's (θ standardised by the likelihood alone gave divergent
transitions in half the fits of a 4-parameter logistic regression), nor of a group effect with
its group's scale (the map is centred where the records locate the effects, non-centred where
the scale holds them).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import NamedTuple

import jax
import jax.numpy as jnp
import numpy as np

from dpppl_na_dpvi.postprocess import (
    TARGET_ACCEPT,
    UNINFORMATIVE_DEVIATION,
    correlation_cholesky,
    correlation_logp,
    correlation_parameters,
    correlation_scales,
    correlation_slab_weights,
    fitted_prior_curvature,
    laplace_draws,
    laplace_fit,
    lkj_concentration_centre,
    released_fisher_correlations,
    run_nuts,
)

#: Standard deviation with which a correlation of F that the release does not observe (its
#: coordinates' released information within a few noise sds of 0, :func:`released_fisher_
#: correlations`) is held at 0.  Left to LKJ(η), such correlations reached ±0.8 between a noise
#: scale and the group intercepts of a centred hierarchy (whose true cross-information is 0),
#: and through F⁻¹ moved the likelihood's centre by several of its sds: the posterior had two
#: modes, and 19 % of the fits of the class study (K = 200, ε = 1) divergent transitions; held
#: at 0, none of the 8 worst fits diverged again (``tutorials/RESULTS.md``).
UNOBSERVED_CORRELATION_STD = 0.02
#: Standard deviation of the prior of each log F_jj around the curvature the mean-field ELBO has
#: at its trace mean, less the prior's (1/softplus(ū_j) − P_jj): wide, because the u-gradients
#: observe F's diagonal themselves.
INFORMATION_PRIOR_WIDTH = 1.0
#: Width, in Fisher's z = atanh(correlation), of the barrier at ±1 of the prior that an observed
#: correlation of F follows with probability ``correlation_slab_weights`` instead of LKJ(η) with
#: η learned (:func:`~dpppl_na_dpvi.postprocess.barrier_logp`): nearly uniform below about 0.95.
#: One learned η shrinks every correlation alike, and where most are weak it shrank the demo's one
#: strong correlation (intercept and w[male], 0.80 at the true θ, 0.71 as released, 0.63 as
#: drawn), which made the pair's weak direction too stiff: the intercept's TARP marginal was 0.048
#: at K = 200 (z-score sd 1.09 on the first 100 data sets).  With this alternative it is drawn at
#: 0.68 and the demo reads 0.026, intercept 0.035 (z-score sd 0.99).  The uniform alternative, as
#: in the optimum model, calibrated it as well, but its tail in y, exp(−2|y|), let NUTS reach
#: nearly singular F where the release said −0.96 or −0.99 (2 of 200 fits divergent); LKJ(1)'s
#: own partial correlations have a barrier that pulls a correlation of 0.8 down to 0.69 and
#: barely moved the demo (``tutorials/RESULTS.md``, stops 56 and 57).
SLAB_BARRIER = 2.0
#: Scatter (:func:`gradient_scatter`) above which a fit is warned that its records' gradients are
#: far from linear in μ with the release's noise: the posterior then counts the excess as noise,
#: which keeps it honest but wider than it need be, and where the excess is the gradients bending
#: over the span the trace visits the quadratic log-likelihood this model assumes does not hold
#: there.  Measured (2026-12-03, ``tutorials/RESULTS.md``): at most 1.06 on the class studies'
#: fits at ε ≤ 1, the non-centred hierarchy that this model cannot read included; 1.08–1.14 at
#: ε = 30, where the sampling of records adds about a tenth to the privacy noise.
SCATTER_WARNING = 1.5


def gradient_scatter(
    sum_ee: np.ndarray, sum_xe: np.ndarray, sum_xx: np.ndarray, count: int, noise_var: np.ndarray
) -> np.ndarray:
    """Each records' μ-gradient's residual variance about its least-squares linear fit in μ, as a
    multiple of the release's noise variance V (``sum_*`` as in :class:`LikelihoodStatistics`,
    over ``count`` gradients).

    Where the gradients are linear in μ and the release's noise is all their noise, it is about 1,
    with standard deviation √(2/(T − r − 1)).  The privacy noise is not all: the Poisson sampling
    of records adds its own, which the release does not state, and which grows beside the privacy
    noise as ε grows.  It is a function of the release alone.
    """
    slope = np.linalg.lstsq(sum_xx, sum_xe, rcond=None)[0]
    residual_ss = sum_ee - np.sum(sum_xe * slope, axis=0)
    dof = max(count - len(sum_ee) - 1, 1)
    return residual_ss / dof / noise_var


def u_gradient_scatter(
    sum_uu: np.ndarray, sum_us: np.ndarray, sum_ss: np.ndarray, count: int, noise_var_u: np.ndarray
) -> np.ndarray:
    """Each records' u-gradient's residual variance about its least-squares fit through the
    origin on sigmoid(u_t), as a multiple of the release's noise variance (``sum_uu`` = Σ r_t,u²,
    the other sums as in :class:`LikelihoodStatistics`, over ``count`` gradients): the model's
    ½ κ F_jj sigmoid(u_t) with F_jj fitted freely, so about 1 where the model holds.  The
    records' sampling adds more to these than to the μ-gradients: 6–7 times the privacy noise's
    variance on the unknown-scale class at ε = 30, 1.00–1.05 at ε = 1 (2026-12-03)."""
    residual_ss = sum_uu - sum_us**2 / sum_ss
    return residual_ss / max(count - 1, 1) / noise_var_u


def scatter_warning(scatter: np.ndarray, labels: list[str]) -> str | None:
    """The warning a fit gets when a records' gradient scatters more than ``SCATTER_WARNING``
    times the release's noise about its linear fit, naming the worst one and what to change."""
    worst = int(np.argmax(scatter))
    if scatter[worst] <= SCATTER_WARNING:
        return None
    return (
        f"the records' gradient in {labels[worst]} scatters {scatter[worst]:.1f} times as much "
        "about its linear fit in the variational means as the privacy noise explains; the "
        "likelihood model counts the excess as noise, so its posterior is wider than the data "
        "need, and if the excess is the gradient bending over the span the trace visits, the "
        "quadratic log-likelihood it assumes does not hold there: parameters that enter the "
        "likelihood more linearly (a centred hierarchy, log-scales) or "
        "postprocessing='optimum' may read the release better"
    )


class LikelihoodStatistics(NamedTuple):
    """What the likelihood model reads of one fit's trace, in the r coordinates the records read
    (``R``) unless said otherwise; the records' gradients r_t are the noisy gradients less κ times
    the gradient of the part of the ELBO that reads no record."""

    count: jax.Array  # T, the gradients read
    centre: jax.Array  # μ̄_R
    mean_gradient: jax.Array  # r̄ (μ-coordinates)
    sum_ee: jax.Array  # Σ (r_t − r̄)², (r,)
    sum_xe: jax.Array  # Σ x_t (r_t − r̄)ᵀ with x_t = μ_t − μ̄, (r, r)
    sum_xx: jax.Array  # Σ x_t x_tᵀ, (r, r)
    sum_us: jax.Array  # Σ r_t,u sigmoid(u_t), (r,)
    sum_ss: jax.Array  # Σ sigmoid(u_t)², (r,)
    noise_var: jax.Array  # V of the μ-gradients, (r,), or their scatter where larger
    noise_var_u: jax.Array  # V of the u-gradients, (r,), or their scatter where larger
    rate: jax.Array  # κ
    prior_v_mean: jax.Array  # centre of log diag(F)'s prior, (r,)
    prior_v_std: jax.Array
    free_centre: jax.Array  # μ̄ of the coordinates no record reads, where NUTS starts them
    prior_point: jax.Array  # the model's initial point, (r,): where its prior is typical
    #: The released Fisher correlations of the records' coordinates and their standard
    #: deviations (:func:`released_fisher_correlations`, those it does not observe at 0), and
    #: y of the correlation matrix they make, where NUTS starts; empty without the release or
    #: with one record coordinate.
    fisher_correlation: jax.Array = jnp.zeros(0)
    fisher_correlation_std: jax.Array = jnp.zeros(0)
    correlation_start: jax.Array = jnp.zeros(0)
    #: Each correlation's prior weight of the alternative to LKJ(η) (:data:`SLAB_BARRIER`):
    #: :func:`~dpppl_na_dpvi.postprocess.correlation_slab_weights` where the release observes it,
    #: 0 where it does not.
    correlation_slab: jax.Array = jnp.zeros(0)
    #: :func:`gradient_scatter` of each records' μ-gradient; ``noise_var`` is V times it where
    #: it is above 1.
    scatter: jax.Array = jnp.zeros(0)
    #: :func:`u_gradient_scatter`; ``noise_var_u`` is V_u times it where it is above 1.
    scatter_u: jax.Array = jnp.zeros(0)

    @classmethod
    def from_trace(
        cls,
        phi: np.ndarray,
        noisy_grad: np.ndarray,
        *,
        start: int,
        noise_std: np.ndarray,
        rate: float,
        records: np.ndarray,
        prior_part_gradient: Callable[[np.ndarray], np.ndarray],
        prior_curvature: Callable[[np.ndarray], np.ndarray],
        prior_point: np.ndarray,
        released_fisher: tuple[np.ndarray, float] | None = None,
    ) -> LikelihoodStatistics:
        """Statistics of the pairs (φ_t, g̃_{t+1}) for t = ``start`` … T − 1.

        ``noise_std`` is the release's noise per coordinate of φ in units of the noisy gradients,
        ``records`` the mask of θ's coordinates the records read
        (:attr:`RecordModel.record_parameters`), ``prior_part_gradient`` maps iterates (m, 2n)
        to the gradients of the part of the ELBO that reads no record, and ``prior_curvature``
        φ to its curvature in μ (both public); ``prior_point`` is θ (n,) where the model's prior
        is typical, its initial point (public too).  ``released_fisher`` is the released empirical
        Fisher information of the records' μ-gradients (n × n) and its noise's standard
        deviation per entry, or None.
        """
        n = phi.shape[1] // 2
        index = np.flatnonzero(records)
        # The record-free part is evaluated on the whole trace, whose length the schedule fixes,
        # and cut afterwards: cut first, its shape would follow the settled start and make each
        # fit compile it anew.
        iterates = np.asarray(phi[: len(noisy_grad)])
        record_free = np.asarray(prior_part_gradient(iterates))[start:]
        x = iterates[start:]
        residual = np.asarray(noisy_grad[start:]) - rate * record_free
        mu, gradient = x[:, index], residual[:, index]
        centre, mean_gradient = mu.mean(axis=0), gradient.mean(axis=0)
        xc, e = mu - centre, gradient - mean_gradient
        slope_u = 1 / (1 + np.exp(-x[:, n + index]))
        noise_var = np.asarray(noise_std, dtype=float) ** 2
        sums = (e**2).sum(axis=0), xc.T @ e, xc.T @ xc
        scatter = gradient_scatter(*sums, len(x), noise_var[index])
        gradient_u = residual[:, n + index]
        sums_u = (gradient_u * slope_u).sum(axis=0), (slope_u**2).sum(axis=0)
        scatter_u = u_gradient_scatter(
            (gradient_u**2).sum(axis=0), *sums_u, len(x), noise_var[n + index]
        )
        phi_bar = x.mean(axis=0)
        # 1/softplus(ū) is the ELBO's curvature at its optimum in each μ-coordinate; the model's
        # prior takes its share of that, and the records' is what is left.
        diagonal = 1 / np.logaddexp(0.0, phi_bar[n:])
        prior = np.diagonal(fitted_prior_curvature(prior_curvature(phi_bar), diagonal))
        v_mean = np.log((diagonal - prior)[index])
        fisher_correlation = fisher_std = correlation_start = slab = np.zeros(0)
        if released_fisher is not None and len(index) > 1:
            fisher, fisher_noise = released_fisher
            block = np.asarray(fisher)[np.ix_(index, index)]
            fisher_correlation, fisher_std = released_fisher_correlations(block, fisher_noise)
            unobserved = fisher_std >= UNINFORMATIVE_DEVIATION
            slab = np.asarray(correlation_slab_weights(fisher_correlation, fisher_std))
            fisher_correlation = np.where(unobserved, 0.0, fisher_correlation)
            fisher_std = np.where(unobserved, UNOBSERVED_CORRELATION_STD, fisher_std)
            # NUTS starts R at the correlations the model is given, those not observed at 0:
            # started at the released values, pure noise at ε = 0.1 (canonical partial
            # correlations to ±0.85 where the model holds them within 0.02 of 0), a chain's
            # warm-up shrank its step size to 10⁻⁴ and left R singular (``tutorials/RESULTS.md``).
            rows, cols = np.tril_indices(len(index), -1)
            held = np.eye(len(index))
            held[rows, cols] = held[cols, rows] = fisher_correlation
            correlation_start = correlation_parameters(held)
        return cls(
            count=jnp.asarray(float(len(x))),
            centre=jnp.asarray(centre),
            mean_gradient=jnp.asarray(mean_gradient),
            sum_ee=jnp.asarray(sums[0]),
            sum_xe=jnp.asarray(sums[1]),
            sum_xx=jnp.asarray(sums[2]),
            sum_us=jnp.asarray(sums_u[0]),
            sum_ss=jnp.asarray(sums_u[1]),
            # The noise the records' gradients show where it is more than the release states:
            # the sampling of records adds its own, on the unknown-scale class at ε = 30 8–14 %
            # of the privacy noise's variance in the μ-gradients and 6–7 times it in the
            # u-gradients (2026-12-03).
            noise_var=jnp.asarray(noise_var[index] * np.maximum(scatter, 1.0)),
            noise_var_u=jnp.asarray(noise_var[n + index] * np.maximum(scatter_u, 1.0)),
            rate=jnp.asarray(float(rate)),
            prior_v_mean=jnp.asarray(v_mean),
            prior_v_std=jnp.full(len(index), INFORMATION_PRIOR_WIDTH),
            free_centre=jnp.asarray(phi_bar[:n][~np.asarray(records, dtype=bool)]),
            prior_point=jnp.asarray(np.asarray(prior_point, dtype=float)[index]),
            fisher_correlation=jnp.asarray(fisher_correlation),
            fisher_correlation_std=jnp.asarray(fisher_std),
            correlation_start=jnp.asarray(correlation_start),
            correlation_slab=jnp.asarray(slab),
            scatter=jnp.asarray(scatter),
            scatter_u=jnp.asarray(scatter_u),
        )


@dataclass(frozen=True)
class LikelihoodStructure:
    """The static shape of the likelihood model: which of θ's n coordinates the records read,
    whether F is full (correlations) and read beside the released correlations, and η of their
    LKJ prior (None: learned)."""

    records: tuple[bool, ...]
    full: bool = True
    released: bool = True
    lkj_eta: float | None = None

    @property
    def n(self) -> int:
        return len(self.records)

    @property
    def record_index(self) -> np.ndarray:
        return np.flatnonzero(self.records)

    @property
    def free_index(self) -> np.ndarray:
        return np.flatnonzero(~np.asarray(self.records, dtype=bool))

    @property
    def n_records(self) -> int:
        return int(sum(self.records))

    @property
    def n_correlations(self) -> int:
        r = self.n_records
        return r * (r - 1) // 2 if self.full else 0

    @property
    def n_concentrations(self) -> int:
        return int(self.n_correlations > 0 and self.lkj_eta is None)

    def split(self, position: jax.Array) -> tuple[jax.Array, ...]:
        """(ε, θ_F, v, y, ρ) from NUTS's position."""
        r, n_free, n_corr = self.n_records, self.n - self.n_records, self.n_correlations
        bounds = np.cumsum([r, n_free, r, n_corr])
        return tuple(jnp.split(position, bounds))


def _information(
    v: jax.Array, y: jax.Array, structure: LikelihoodStructure
) -> tuple[jax.Array, jax.Array]:
    """F = D^½ R D^½ with D = diag(exp(v)) and R the correlation of y (the identity without),
    and its Cholesky factor D^½ L_R, which is exact and spares a factorisation per gradient."""
    r = structure.n_records
    corr_chol = correlation_cholesky(y, r)[0] if structure.full and r > 1 else jnp.eye(r)
    chol = jnp.exp(0.5 * v)[:, None] * corr_chol
    return chol @ chol.T, chol


def _centre_cholesky(information: jax.Array, stats: LikelihoodStatistics) -> jax.Array:
    """Cholesky factor of F + W, W = diag(V) / (T κ²): the likelihood's centre given θ_R is
    F(θ_R − μ̄) + r̄/κ with covariance F + W."""
    spread = stats.noise_var / (stats.count * stats.rate**2)
    return jnp.linalg.cholesky(information + jnp.diag(spread))


def _release_logp(
    theta_r: jax.Array,
    information: jax.Array,
    stats: LikelihoodStatistics,
    chol: jax.Array | None = None,
) -> jax.Array:
    """log p(release | θ, F): the likelihood's centre given θ_R, the μ-gradients' residuals
    about their slope and the u-gradients' observation of F's diagonal.  ``chol`` is
    :func:`_centre_cholesky`, where the caller has it."""
    kf = stats.rate * information
    if chol is None:
        chol = _centre_cholesky(information, stats)
    located = information @ (theta_r - stats.centre) + stats.mean_gradient / stats.rate
    white = jax.scipy.linalg.solve_triangular(chol, located, lower=True)
    residual_ss = (
        stats.sum_ee
        - 2 * jnp.diagonal(kf @ stats.sum_xe)
        + jnp.sum((kf @ stats.sum_xx) * kf, axis=1)
    )
    half_slope = 0.5 * stats.rate * jnp.diagonal(information)
    u_term = half_slope**2 * stats.sum_ss - 2 * half_slope * stats.sum_us
    return (
        -0.5 * white @ white
        - jnp.sum(jnp.log(jnp.diagonal(chol)))
        - 0.5 * jnp.sum(residual_ss / stats.noise_var)
        - 0.5 * jnp.sum(u_term / stats.noise_var_u)
    )


@dataclass(frozen=True)
class LikelihoodTarget:
    """The likelihood model as :func:`dpppl_na_dpvi.postprocess.run_nuts` samples it, with the
    model's log prior density ``logprior`` (θ ↦ log p(θ), unconstrained).

    Where η is learned, NUTS sees each correlation divided by its scale given η: its LKJ(η)
    prior scale (:func:`dpppl_na_dpvi.postprocess.correlation_scales`) combined in precision with
    its observation's standard deviation where the release observes it.  A large η squeezes the
    correlations the release leaves weak towards 0, which centred makes a funnel, while one the
    release holds tightly would, divided by the prior's scale alone, make the opposite one.
    """

    structure: LikelihoodStructure
    logprior: Callable[[jax.Array], jax.Array]

    @property
    def target_accept(self) -> float:
        return TARGET_ACCEPT[self.structure.n_correlations > 0]

    def _correlation_scale(self, rho: jax.Array, stats: LikelihoodStatistics) -> jax.Array:
        """Each correlation's scale in NUTS's position (1 where η is fixed)."""
        structure = self.structure
        if not structure.n_concentrations:
            return jnp.ones(structure.n_correlations)
        prior = correlation_scales(1 + jnp.exp(rho[0]), structure.n_records)
        if not structure.released:
            return prior
        return 1 / jnp.sqrt(prior**-2 + stats.fisher_correlation_std**-2)

    def _parameters(
        self, position: jax.Array, stats: LikelihoodStatistics
    ) -> tuple[jax.Array, jax.Array]:
        """The model's parameters (ε, θ_F, v, y, ρ) from NUTS's position, and log|Jacobian|."""
        eps, free, v, y, rho = self.structure.split(position)
        scale = self._correlation_scale(rho, stats)
        return jnp.concatenate([eps, free, v, y * scale, rho]), jnp.sum(jnp.log(scale))

    def _theta(
        self, params: jax.Array, stats: LikelihoodStatistics
    ) -> tuple[jax.Array, jax.Array, jax.Array, jax.Array]:
        """θ (n,) at the parameters (ε, θ_F, v, y, ρ), θ_R = θ* + Q^(−½)ε, F there, the
        map's log|Jacobian| −½ log|Q| and :func:`_centre_cholesky` of F."""
        structure = self.structure
        eps, free, v, y, _ = structure.split(params)
        information, chol_f = _information(v, y, structure)
        centre = stats.centre - jax.scipy.linalg.cho_solve(
            (chol_f, True), stats.mean_gradient / stats.rate
        )
        chol_w = _centre_cholesky(information, stats)
        half = jax.scipy.linalg.solve_triangular(chol_w, information, lower=True)
        base = jnp.zeros(structure.n, dtype=params.dtype).at[structure.free_index].set(free)

        def logprior_r(theta_r):
            return self.logprior(base.at[structure.record_index].set(theta_r))

        precision = half.T @ half
        # The Newton step starts at the trace's mean μ̄, not at the likelihood's centre m: where
        # the release says little of a coordinate (log σ² of the 10-D regression at ε = 0.1,
        # W/F ≈ 500), m = μ̄ − F⁻¹r̄/κ lies many prior sds away for a small F, the prior's
        # curvature there is near 0, and a step from m fell short: ε had to reach 30 to bring θ
        # back to where the prior holds it, a ridge on which 9 of 20 fits diverged (none from μ̄).
        start = stats.centre
        gradient = jax.grad(logprior_r)(start) - precision @ (start - centre)
        # The prior's curvature coordinate by coordinate, floored at 0: exact for independent
        # priors and for group effects given their group's mean and scale, and a precision
        # whatever the prior (an eigenvalue floor of the whole matrix has no derivative where
        # eigenvalues repeat, as a hierarchy's do).  It is the larger of its values at μ̄ and at
        # the model's initial point.  At μ̄ alone it fails where the data put θ in a tail of its
        # prior and F leaves a direction to that prior: a small noise scale, log s = −3.3 under
        # s ~ HalfNormal(1), has curvature 0.003 there against 2 at log s = 0, so the whitening
        # stretched one unit of ε over 19 units of log s, where the posterior's tail towards
        # the prior is about one wide and steep beyond it (s²/2): 11 of 12 replays of the
        # unknown-scale class's divergent fits diverged, none with the floor
        # (``tutorials/RESULTS.md``, stop 54).
        points = jnp.stack([start, stats.prior_point])
        hessians = jax.vmap(jax.hessian(logprior_r))(points)
        curvature = jnp.maximum(jnp.max(-jnp.diagonal(hessians, axis1=1, axis2=2), axis=0), 0.0)
        chol_q = jnp.linalg.cholesky(jnp.diag(curvature) + precision)
        newton = jax.scipy.linalg.cho_solve((chol_q, True), gradient)
        theta_r = start + newton + jax.scipy.linalg.solve_triangular(chol_q.T, eps, lower=False)
        log_jacobian = -jnp.sum(jnp.log(jnp.diagonal(chol_q)))
        return base.at[structure.record_index].set(theta_r), information, log_jacobian, chol_w

    def logdensity(self, position: jax.Array, stats: LikelihoodStatistics) -> jax.Array:
        params, log_jacobian = self._parameters(position, stats)
        _, _, v, y, rho = self.structure.split(params)
        theta, information, whitening, chol_w = self._theta(params, stats)
        log_prior_v = -0.5 * jnp.sum(((v - stats.prior_v_mean) / stats.prior_v_std) ** 2)
        log_prior_y = 0.0
        if self.structure.n_correlations:
            released, slab = None, 0.0
            if self.structure.released:
                released = (stats.fisher_correlation, stats.fisher_correlation_std)
                slab = stats.correlation_slab
            log_prior_y = correlation_logp(
                y, rho, self.structure.n_records, self.structure.lkj_eta, released, slab,
                SLAB_BARRIER,
            )
        return (
            self.logprior(theta)
            + _release_logp(theta[self.structure.record_index], information, stats, chol_w)
            + log_prior_v
            + log_prior_y
            + log_jacobian
            + whitening
        )

    def initial(self, stats: LikelihoodStatistics) -> jax.Array:
        structure = self.structure
        rho = jnp.full(structure.n_concentrations, np.log(
            lkj_concentration_centre(structure.n_records) - 1
        ))
        y = jnp.zeros(structure.n_correlations)
        if structure.n_correlations and structure.released:
            y = stats.correlation_start
        y = y / self._correlation_scale(rho, stats)
        r = structure.n_records
        return jnp.concatenate([jnp.zeros(r), stats.free_centre, stats.prior_v_mean, y, rho])

    def finish(
        self, positions: jax.Array, stats: LikelihoodStatistics, key: jax.Array
    ) -> jax.Array:
        """θ, F's diagonal and F's correlations (row by row below the diagonal) per draw."""
        rows, cols = np.tril_indices(self.structure.n_records, -1)

        def one(position):
            theta, information, *_ = self._theta(self._parameters(position, stats)[0], stats)
            diagonal = jnp.diagonal(information)
            root = jnp.sqrt(diagonal)
            correlation = (information / jnp.outer(root, root))[rows, cols]
            return jnp.concatenate([theta, diagonal, correlation])

        return jax.vmap(one)(positions)


@dataclass(frozen=True)
class LikelihoodDraws:
    """Draws of θ from the likelihood model, of the records' information F beside them, and the
    sampler's statistics (NUTS's) or the fit's (Laplace's)."""

    theta: np.ndarray  # (chain, draw, n)
    information_diagonal: np.ndarray  # (chain, draw, r)
    information_correlation: np.ndarray  # (chain, draw, r(r − 1)/2)
    sample_stats: dict[str, np.ndarray]
    gradient_scatter: np.ndarray  # (r,), :func:`gradient_scatter`
    u_gradient_scatter: np.ndarray  # (r,), :func:`u_gradient_scatter`
    #: NUTS's target acceptance rate (:func:`dpppl_na_dpvi.postprocess.run_nuts`); None for
    #: Laplace's draws.
    target_accept: float | None
    #: Laplace's fit (:func:`dpppl_na_dpvi.postprocess.laplace_convergence`); empty for NUTS's.
    fit_stats: dict[str, float] = field(default_factory=dict)


def sample_likelihood(
    stats: list[LikelihoodStatistics],
    keys: list[jax.Array],
    *,
    tune: int,
    draws: int,
    chains: int,
    structure: LikelihoodStructure,
    logprior: Callable[[jax.Array], jax.Array],
    cache,
    replicates: bool = False,
) -> list[LikelihoodDraws]:
    """NUTS on the likelihood model of each fit.  ``cache`` is the model's (one compiled sampler
    per model structure and sizes: ``logprior`` is the model's, the same function for every
    model of that structure)."""
    runs = run_nuts(
        LikelihoodTarget(structure, logprior),
        stats,
        keys,
        tune=tune,
        draws=draws,
        chains=chains,
        cache=cache,
        cache_key=("na-dpvi", "likelihood-nuts", tune, draws, chains, structure, replicates),
        replicates=replicates,
    )
    return [
        _draws(run.kept, one, structure, run.info, run.target_accept)
        for run, one in zip(runs, stats, strict=True)
    ]


def sample_likelihood_laplace(
    stats: list[LikelihoodStatistics],
    keys: list[jax.Array],
    *,
    draws: int,
    chains: int,
    structure: LikelihoodStructure,
    logprior: Callable[[jax.Array], jax.Array],
    cache,
    replicates: bool = False,
) -> list[LikelihoodDraws]:
    """Laplace's approximation of the likelihood model of each fit: a Gaussian at the mode of
    NUTS's target (:class:`LikelihoodTarget`, whose position is the model's parameters
    unconstrained and whitened), mapped to θ and F draw by draw.  Each result's ``fit_stats`` say
    whether the fit reached a mode (:func:`dpppl_na_dpvi.postprocess.laplace_convergence`)."""
    target = LikelihoodTarget(structure, logprior)
    fit = cache(
        ("na-dpvi", "likelihood-laplace", structure, replicates),
        lambda: laplace_fit(target.logdensity, target.initial, replicates),
    )
    drawn = laplace_draws(fit, stats, keys, draws=draws, chains=chains, replicates=replicates)
    results = []
    for (positions, fit_stats), one, key in zip(drawn, stats, keys, strict=True):
        flat = positions.reshape(chains * draws, -1)
        kept = np.asarray(target.finish(flat, one, key)).reshape(chains, draws, -1)
        results.append(_draws(kept, one, structure, {}, None, fit_stats))
    return results


def _draws(
    kept: np.ndarray,
    stats: LikelihoodStatistics,
    structure: LikelihoodStructure,
    sample_stats: dict[str, np.ndarray],
    target_accept: float | None,
    fit_stats: dict[str, float] | None = None,
) -> LikelihoodDraws:
    """θ, F's diagonal and F's correlations from :meth:`LikelihoodTarget.finish`'s draws."""
    n, r = structure.n, structure.n_records
    return LikelihoodDraws(
        theta=kept[..., :n],
        information_diagonal=kept[..., n : n + r],
        information_correlation=kept[..., n + r :],
        sample_stats=sample_stats,
        gradient_scatter=np.asarray(stats.scatter),
        u_gradient_scatter=np.asarray(stats.scatter_u),
        target_accept=target_accept,
        fit_stats=fit_stats or {},
    )
