"""Stochastic expectation propagation with DP-SEP's clipping, noise and projection.

One global site f (natural parameters θ_f) stands for each of the N likelihood factors, so
q = p̂₀ f^N.  A step (Algorithm 3 of the DP-SEP paper):

1. cavity q₋₁ = p̂₀ f^(N−1) (natural parameters θ₀ + (N−1)θ_f, :func:`global_natural`);
2. m records drawn uniformly without replacement (:mod:`dpppl_dp_sep.subsets`);
3. for each, the site f_n = proj[p̃_n] / q₋₁ of its tilted distribution
   p̃_n ∝ q₋₁ p(x_n | θ) exp(r(θ)/N) (:mod:`dpppl_dp_sep.moments`, :mod:`dpppl_dp_sep.prior`),
   as a power-EP site of power α_n ≤ 1 when the nodes cannot resolve the full tilt;
4. each natural-parameter block of each f_n clipped to norm C, and the effective site
   g_n = θ_f + α_n (clip(f_n) − θ_f) formed (a point between two points of norm ≤ C per block);
5. SEP's damped update f ← f^(1−γ/N) g_n^(γ/N) for every sampled record, from the same f::

       θ_f' = θ_f + (γ/N) Σ_n (θ_{g_n} − θ_f)

6. the release θ̃_f = θ_f' + noise, N(0, s²) on every coordinate of η and of Λ's upper triangle;
7. post-processing of the release alone: the global precision Λ₀ + NΛ̃_f projected to eigenvalues
   ≥ floor (the larger of the prior's smallest precision and the noise level, see
   :func:`noise_level`); each block of θ_f is clipped to norm C again at the start of the next
   step, before anything else uses it.

Replacing one record changes one θ_{g_n} to another of norm ≤ C per block, so the release moves by
at most 2γC/N per block: the sensitivity the noise s is calibrated against.  The same code runs
plain SEP (s = 0, C = ∞) and clipped SEP (s = 0).
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from functools import partial
from typing import NamedTuple

import jax
import jax.numpy as jnp
import numpy as np

from dpppl.plugin import Progress, RecordModel, gather
from dpppl_dp_sep.families import FAMILIES, Family, Natural, clip_natural
from dpppl_dp_sep.moments import NodeRule, choose_power, tilted_moments
from dpppl_dp_sep.prior import GaussianPrior, gaussian_prior, prior_residual
from dpppl_dp_sep.subsets import uniform_subset


@dataclass(frozen=True)
class SEPSettings:
    """How one SEP run goes.  All of it is public: none of it may depend on the data.

    Attributes
    ----------
    covariance
        ``"full"`` or ``"diagonal"`` (:data:`dpppl_dp_sep.families.FAMILIES`).
    nodes
        The moment-matching node rule (:mod:`dpppl_dp_sep.moments`).
    steps
        Number of steps T.
    batch_size
        m, records drawn uniformly without replacement at each step.
    damping
        γ: each sampled record moves the global site γ/N of the way to its own site.
    clipping_bound
        C, the norm bound of each natural-parameter block (``math.inf``: no clipping).
    noise_std
        Standard deviation of the noise on each released coordinate (0: plain SEP).
    precision_floor
        Eigenvalue floor of the global precision, as a multiple of the smallest eigenvalue of
        the prior site's precision.
    average_last
        Fraction of the steps (at the end) whose released sites are averaged into the result;
        0 keeps the last step's.
    init_jitter
        The initial approximation is N(μ₀ + init_jitter · z, Σ₀), z a standard normal draw in the
        prior site's whitened coordinates: a data-independent start off any symmetric point.
    noise_floor
        Raise the eigenvalue floor of q's precision to ``noise_floor`` times the expected largest
        eigenvalue of the noise accumulated in it so far (:func:`noise_level`); 0 keeps the
        prior floor alone.  A public function of the settings and the step count.
    """

    covariance: str
    nodes: NodeRule
    steps: int
    batch_size: int = 1
    damping: float = 1.0
    clipping_bound: float = math.inf
    noise_std: float = 0.0
    precision_floor: float = 1.0
    average_last: float = 0.0
    init_jitter: float = 0.0
    noise_floor: float = 0.0

    def __post_init__(self) -> None:
        if self.covariance not in FAMILIES:
            raise ValueError(f"covariance must be one of {sorted(FAMILIES)}, got {self.covariance!r}")
        if self.steps < 1 or self.batch_size < 1:
            raise ValueError("steps and batch_size must be positive")
        if not (math.isfinite(self.noise_std) and self.noise_std >= 0):
            raise ValueError(f"noise_std must be finite and non-negative, got {self.noise_std!r}")
        if not (self.clipping_bound > 0 and self.damping > 0 and self.precision_floor > 0):
            raise ValueError("clipping_bound, damping and precision_floor must be positive")
        if not 0 <= self.average_last < 1:
            raise ValueError(f"average_last must be in [0, 1), got {self.average_last!r}")
        if not (math.isfinite(self.noise_floor) and self.noise_floor >= 0):
            raise ValueError(f"noise_floor must be finite and non-negative, got {self.noise_floor!r}")

    @property
    def family(self) -> Family:
        return FAMILIES[self.covariance]


class Constants(NamedTuple):
    """The settings a compiled step takes as (traced) inputs, so changing them compiles nothing."""

    n_records: jax.Array
    damping: jax.Array
    clipping_bound: jax.Array
    noise_std: jax.Array
    floor: jax.Array
    steps: jax.Array
    average_from: jax.Array
    noise_floor: jax.Array
    decay_sq: jax.Array


class State(NamedTuple):
    """The global site θ_f after the last step, and the running sum for the average."""

    site: Natural
    total: Natural
    averaged: jax.Array


@dataclass
class SEPResult:
    """The outcome of a run: only functions of the released sites.

    Attributes
    ----------
    approximation
        Natural parameters of the final Gaussian q = p̂₀ f^N over θ.
    family
        Its family.
    passes
        Natural parameters of q at the end of every chunk of steps (about one pass over the data
        each), stacked on a leading axis.
    min_eigenvalue
        Smallest eigenvalue of q's precision after each step.
    steps_per_chunk
        Number of steps between two entries of ``passes``.
    floor
        The eigenvalue floor the precision was projected to.
    prior
        The Gaussian prior site.
    """

    approximation: Natural
    family: Family
    passes: Natural
    min_eigenvalue: np.ndarray
    steps_per_chunk: int
    floor: float
    prior: GaussianPrior = field(repr=False)


# -- the pieces of a step ---------------------------------------------------------------------------


def global_natural(prior: GaussianPrior, site: Natural, n_records: int | jax.Array) -> Natural:
    """q = p̂₀ f^N."""
    return jax.tree.map(lambda p, f: p + n_records * f, prior.site, site)


def record_sites(
    model: RecordModel,
    family: Family,
    nodes: NodeRule,
    prior: GaussianPrior,
    cavity_site: Natural,
    batch: Mapping[str, jax.Array],
    key: jax.Array,
    n_records: jax.Array,
) -> tuple[Natural, jax.Array]:
    """The (power-EP) site of every record in ``batch``, and its power α_n (leading record axis).

    α_n is the largest power whose tilted distribution the nodes resolve
    (:func:`dpppl_dp_sep.moments.choose_power`); a site that is not finite (no such power, or
    tilted moments that are not those of a Gaussian) gets α_n = 0.
    """
    whitening = family.whiten(cavity_site)
    z, log_weights = nodes.nodes(key, cavity_site.eta.shape[0])
    theta = family.to_theta(whitening, z)
    residual, residual_grad = jax.vmap(
        jax.value_and_grad(partial(prior_residual, model, family, prior))
    )(theta)
    loglik, loglik_grad = jax.vmap(
        jax.vmap(jax.value_and_grad(model.record_loglik), in_axes=(0, None)), in_axes=(None, 0)
    )(theta, batch)
    h = loglik + residual / n_records
    grads = loglik_grad + residual_grad / n_records

    def one(h_n: jax.Array, grads_n: jax.Array) -> tuple[Natural, jax.Array]:
        power = choose_power(log_weights, h_n)
        m, M = tilted_moments(family, whitening, z, log_weights, h_n, grads_n, power)
        site = family.site(whitening, m, M, power)
        finite = jnp.isfinite(site.eta).all() & jnp.isfinite(site.precision).all()
        return site, jnp.where(finite, power, 0.0)

    return jax.vmap(one)(h, grads)


def effective_sites(
    site: Natural, sites: Natural, powers: jax.Array, clipping_bound: jax.Array
) -> Natural:
    """g_n = θ_f + α_n (clip(θ_{f_n}) − θ_f): what each record moves the global site towards.

    Clipping each block of f_n to C (and θ_f being clipped already) keeps every block of g_n
    within norm C, whatever α_n in [0, 1].  A record with α_n = 0 gives g_n = θ_f: no change.
    """
    usable = powers > 0

    def expand(values, block):
        return values.reshape(-1, *([1] * (block.ndim - 1)))

    sites = jax.tree.map(
        lambda s, f: jnp.where(expand(usable, s), s, f[None]), sites, site
    )
    clipped = clip_natural(sites, clipping_bound)
    return jax.tree.map(
        lambda c, f: f[None] + expand(powers, c) * (c - f[None]), clipped, site
    )


def private_release(
    family: Family, site: Natural, effective: Natural, key: jax.Array, constants: Constants
) -> Natural:
    """θ_f + (γ/N) Σ_n (θ_{g_n} − θ_f) + noise: the step's DP release (before projection)."""
    scale = constants.damping / constants.n_records
    noise = family.noise(key, site.eta.shape[0], constants.noise_std)
    return jax.tree.map(
        lambda f, g, e: f + scale * jnp.sum(g - f[None], axis=0) + e, site, effective, noise
    )


def post_process(
    family: Family, prior: GaussianPrior, released: Natural, constants: Constants
) -> tuple[Natural, jax.Array]:
    """Project the released global precision Λ₀ + NΛ̃_f to eigenvalues ≥ ``constants.floor``.

    A function of the release and public settings only (Algorithm 3, line 10).  Line 12, the
    clipping of the global site, is the first thing the next step does (:func:`sep_step`), in
    that step's centred coordinates, which are the ones the sensitivity argument needs; clipping
    here as well would only pull q's precision back below the floor.  Returns the site and the
    smallest eigenvalue of q's precision.
    """
    n = constants.n_records
    projected = family.project(prior.site.precision + n * released.precision, constants.floor)
    site = Natural(released.eta, (projected - prior.site.precision) / n)
    return site, family.min_eigenvalue(projected)


def _clip_one(site: Natural, bound: float | jax.Array) -> Natural:
    """:func:`clip_natural` for a single factor."""
    return jax.tree.map(lambda b: b[0], clip_natural(jax.tree.map(lambda b: b[None], site), bound))


def centred(family: Family, factor: Natural, centre: jax.Array, sign: float = 1.0) -> Natural:
    """The factor's natural parameters for the variable θ − centre: (η − Λ·centre, Λ).

    ``sign=-1`` maps back.  A Gaussian factor exp(ηᵀθ − ½θᵀΛθ) is exp(η_cᵀ(θ − c) − ½(θ − c)ᵀΛ(θ − c))
    up to a constant, with η_c = η − Λc; the last axis of ``factor.eta`` is θ's.
    """
    shift = family.precision_matvec(factor.precision, centre)
    return Natural(factor.eta - sign * shift, factor.precision)


def sep_step(
    model: RecordModel,
    family: Family,
    nodes: NodeRule,
    batch_size: int,
    prior: GaussianPrior,
    data: Mapping[str, jax.Array],
    constants: Constants,
    key: jax.Array,
    site: Natural,
) -> tuple[Natural, jax.Array]:
    """One step from the global site ``site``; returns the new site and q's smallest precision
    eigenvalue.

    Sites are clipped, updated, noised and projected in coordinates centred at q's current mean c
    (public: a function of the previous releases).  There η_c = η − Λc is about the record's
    log-likelihood gradient at c, which averages to zero at SEP's fixed point, instead of Λ
    times wherever the posterior happens to lie: clipping then costs the mean far less, and the
    positive definite projection adds its precision at c instead of moving the mean.
    """
    key_batch, key_nodes, key_noise = jax.random.split(key, 3)
    centre = family.whiten(global_natural(prior, site, constants.n_records)).mean
    site = _clip_one(centred(family, site, centre), constants.clipping_bound)
    indices = uniform_subset(key_batch, constants.n_records, batch_size)
    sites, powers = record_sites(
        model,
        family,
        nodes,
        prior,
        global_natural(prior, centred(family, site, centre, -1.0), constants.n_records - 1),
        gather(data, indices),
        key_nodes,
        constants.n_records,
    )
    effective = effective_sites(
        site, centred(family, sites, centre), powers, constants.clipping_bound
    )
    released = private_release(family, site, effective, key_noise, constants)
    new_site, min_eigenvalue = post_process(family, prior, released, constants)
    return centred(family, new_site, centre, -1.0), min_eigenvalue


# -- compiled runs ----------------------------------------------------------------------------------


def _compile_chunk(
    model: RecordModel, family: Family, nodes: NodeRule, batch_size: int, length: int
):
    """A jitted run of ``length`` steps; steps at or past ``constants.steps`` change nothing."""
    step = partial(sep_step, model, family, nodes, batch_size)

    def run(state: State, start, prior, data, constants: Constants, key):
        def body(state: State, t):
            # The noise in q's precision after t + 1 releases: Σ_k decay^k · (fresh noise).
            accumulated = jnp.sqrt((1 - constants.decay_sq ** (t + 1)) / (1 - constants.decay_sq))
            floor = jnp.maximum(constants.floor, constants.noise_floor * accumulated)
            site, min_eigenvalue = step(
                prior, data, constants._replace(floor=floor), jax.random.fold_in(key, t), state.site
            )
            active = t < constants.steps
            averaged = active & (t >= constants.average_from)
            site = jax.tree.map(lambda new, old: jnp.where(active, new, old), site, state.site)
            total = jax.tree.map(
                lambda acc, s: acc + jnp.where(averaged, s, 0.0), state.total, site
            )
            count = state.averaged + averaged.astype(state.averaged.dtype)
            return State(site, total, count), jnp.where(active, min_eigenvalue, jnp.nan)

        return jax.lax.scan(body, state, start + jnp.arange(length))

    return jax.jit(run)


def chunk_runner(
    model: RecordModel, family: Family, nodes: NodeRule, batch_size: int, length: int
):
    """The compiled chunk for these sizes, kept with the model so later fits reuse it."""
    key = ("dp-sep/chunk", family.name, nodes, int(batch_size), int(length))
    return model.cached(key, lambda: _compile_chunk(model, family, nodes, batch_size, length))


def noise_level(
    family: Family, settings: SEPSettings, n_records: int, n_params: int
) -> tuple[float, float]:
    """The noise floor's scale and the per-step decay of earlier noise in the global site.

    A step adds noise of standard deviation N·s to each entry of q's precision (s on the site's)
    and shrinks the site's earlier noise by ρ = 1 − γm/N, so after t releases each entry carries
    noise of standard deviation N·s·√(Σ_{k<t} ρ^{2k}).  The largest eigenvalue of such noise is
    about ``family.noise_spread(d)`` times that (2√d for a symmetric d×d Gaussian matrix).  Below
    that level the released precision cannot tell data from noise; flooring there keeps a noisy
    η from throwing q's mean far away along a direction whose precision is mostly noise.
    Returns (``noise_floor`` · spread · N·s, ρ); all public.
    """
    decay = max(0.0, 1.0 - settings.damping * settings.batch_size / n_records)
    scale = settings.noise_floor * family.noise_spread(n_params) * n_records * settings.noise_std
    return scale, decay


def initial_site(
    family: Family, prior: GaussianPrior, jitter: float, key: jax.Array, n_records: int
) -> Natural:
    """The global site whose q is N(μ₀ + jitter·S₀z, Σ₀), S₀S₀ᵀ = Σ₀: η_f = Λ₀(μ_init − μ₀)/N,
    Λ_f = 0."""
    d = prior.mean.shape[0]
    z = jitter * jax.random.normal(key, (1, d), dtype=jnp.float64)
    offset = family.to_theta(family.whiten(prior.site), z)[0] - prior.mean
    return Natural(
        family.precision_matvec(prior.site.precision, offset) / n_records,
        jnp.zeros_like(prior.site.precision),
    )


def run_sep(
    model: RecordModel,
    data: Mapping[str, np.ndarray],
    settings: SEPSettings,
    *,
    key: jax.Array,
    progress: Progress,
    label: str = "SEP",
) -> SEPResult:
    """Run (DP-)SEP on ``data`` and return the final Gaussian and the released trace.

    Parameters
    ----------
    model
        The record model; its per-record log-likelihood defines the sites.
    data
        The record arrays, keyed by ``model.record_names``.
    settings
        Everything else (public).
    key
        JAX PRNG key for the record samples, the nodes, the noise and the start.
    progress
        Progress reporting; ``label`` names the bar (it shows no data-dependent value).
    """
    family = settings.family
    n = model.n_records
    prior = gaussian_prior(model, family)
    key_init, key_steps = jax.random.split(key)
    site = initial_site(family, prior, settings.init_jitter, key_init, n)
    length = min(settings.steps, math.ceil(n / settings.batch_size))
    runner = chunk_runner(model, family, settings.nodes, settings.batch_size, length)
    averaged_steps = max(1, round(settings.average_last * settings.steps))
    floor = settings.precision_floor * float(family.min_eigenvalue(prior.site.precision))
    noise_floor, decay = noise_level(family, settings, n, prior.mean.shape[0])
    constants = Constants(
        *(
            jnp.asarray(v, dtype=jnp.float64)
            for v in (
                n,
                settings.damping,
                settings.clipping_bound,
                settings.noise_std,
                floor,
            )
        ),
        jnp.asarray(settings.steps),
        jnp.asarray(settings.steps - averaged_steps),
        jnp.asarray(noise_floor, dtype=jnp.float64),
        jnp.asarray(decay**2, dtype=jnp.float64),
    )
    zeros = jax.tree.map(jnp.zeros_like, site)
    state = State(site, zeros, jnp.asarray(0.0))
    device_data = {name: jnp.asarray(data[name]) for name in model.record_names}
    passes, eigenvalues = [], []
    with progress.task(label, total=settings.steps) as bar:
        for start in range(0, settings.steps, length):
            state, min_eigenvalue = runner(
                state, jnp.asarray(start), prior, device_data, constants, key_steps
            )
            passes.append(jax.tree.map(np.asarray, global_natural(prior, state.site, n)))
            eigenvalues.append(np.asarray(min_eigenvalue))
            bar.advance(min(length, settings.steps - start))
    final = jax.tree.map(lambda total: total / state.averaged, state.total)
    return SEPResult(
        approximation=jax.tree.map(np.asarray, global_natural(prior, final, n)),
        family=family,
        passes=Natural(*(np.stack(b) for b in zip(*passes, strict=True))),
        min_eigenvalue=np.concatenate(eigenvalues)[: settings.steps],
        steps_per_chunk=length,
        floor=floor,
        prior=prior,
    )
