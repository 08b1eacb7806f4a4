"""DPVI: DP-SGD on the per-record ELBO loss (NA-DPVI paper, Algorithm 3 with Appendix H.2).

Each step Poisson-samples about κN records as a fixed-shape masked batch, takes per-record
gradients of the mean-field ELBO loss (:meth:`~dpppl.plugin.RecordModel.elbo_loss_grads`),
multiplies them by the preconditioning vector β, clips each to norm C and adds noise to their
sum: by default the snapped release (:func:`dpppl.plugin.snapped_gaussian_release`: rows rounded
to a power-of-two grid g, exact discrete-Gaussian noise of std σ(C + g√d), every output exactly
k·g), or N(0, σ²C²) float64 noise.  It divides the noisy sum by β and takes an SGD step with
learning rate λ ⊙ β.  When the model allows only a few distinct records (binary or categorical
observations without covariates), a step instead draws how many copies of each its batch holds,
as independent Binomial(n_u, q) counts (the law of a Poisson batch grouped by value), and takes
one gradient per possible record.  The whole loop runs under ``jax.lax.scan``, in chunks so
that a progress bar can advance between them.  The noisy sums are the DP release; the noisy
gradients and the parameter trace are computed from them and public settings.

With ``curvature`` each step's release also holds the outer products of the records' μ-gradients
(:func:`curvature_rows`): summed over a batch they estimate the empirical Fisher information, whose
correlations the trace alone barely determines (``tutorials/RESULTS.md``, 2026-11-27).  They
travel in the same noisy sum as the gradient, so the step is still one Poisson-subsampled Gaussian
release, of sensitivity C·√(1 + ρ²) instead of C.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import NamedTuple, Protocol

import jax
import jax.numpy as jnp
import numpy as np

from dpppl.plugin import (
    GeometricTable,
    Progress,
    RecordModel,
    binomial_counts,
    binomial_thresholds,
    clip_rows,
    copies_of,
    gather,
    gaussian_noise,
    poisson_batch,
    require_exact,
    snapped_gaussian_release,
    snapped_sensitivity,
)

#: ρ: a record's curvature row has norm at most ρC beside its gradient's C, so the release's
#: sensitivity is C·√(1 + ρ²) and the gradients' noise grows by that factor (12 % at 0.5).
CURVATURE_SHARE = 0.5
#: A record's standardised μ-gradient is clipped to ``CURVATURE_CLIP_SCALE`` · √n before its outer
#: product is taken: its coordinates have unit scale near the optimum (see
#: ``dpppl_na_dpvi.heuristics``), so few records are clipped and a small bound keeps the products'
#: signal large against the noise.
CURVATURE_CLIP_SCALE = 1.25


def clip_mu_first(rows: jax.Array, n_params: int, bound: float | jax.Array) -> jax.Array:
    """Each row within ``bound``, its μ-part (first ``n_params`` columns) clipped to ``bound``
    first and its u-part to what the μ-part leaves, √(bound² − ‖μ‖²); rows that are not finite
    become zero.

    A row within the bound comes through whole, as it does clipped as one vector.  A row over it
    keeps its μ-gradient (up to the bound) where clipping it as one vector shrinks both parts
    alike.  The u-gradient of a record is its curvature's excess over the average (I_i/Ī − 1),
    which the records in a long tail of the outcome make large: a Student-t's outliers, a
    Weibull's long waits.  Their u-parts were 1.7–9 times their μ-parts (N = 1000, at the
    optimum), so clipping the rows whole cut those records' scores, whose tail is one-sided, and
    moved the clipped optimum by 1–1.5 exact posterior sds in a Weibull's log scale and a
    Student-t's log ν; μ first, by 0.02 and 0.19.  The u-parts of rows over the bound keep less,
    and they observe the records' information: a Poisson regression's weights came out wider
    (``tutorials/RESULTS.md``, stop 79)."""
    finite = jnp.all(jnp.isfinite(rows), axis=-1, keepdims=True)
    rows = jnp.where(finite, rows, 0.0)
    mu = clip_rows(rows[:, :n_params], bound)
    spare = jnp.sqrt(jnp.maximum(bound**2 - jnp.sum(mu**2, axis=-1, keepdims=True), 0.0))
    return jnp.concatenate([mu, clip_rows(rows[:, n_params:], spare)], axis=1)


def release_dim(n_params: int, curvature: bool) -> int:
    """Coordinates of one step's release: the 2n gradient coordinates, and the curvature row's
    n(n + 1)/2 (the upper triangle of an n × n outer product, diagonal included)."""
    return 2 * n_params + (n_params * (n_params + 1) // 2 if curvature else 0)


def release_bound(clipping_bound: float | jax.Array, curvature: bool) -> float | jax.Array:
    """The L2 bound of a record's whole row: C, or C·√(1 + ρ²) with the curvature rows."""
    return clipping_bound * (np.sqrt(1 + CURVATURE_SHARE**2) if curvature else 1.0)


def curvature_scale(n_params: int, clipping_bound: float | jax.Array) -> float | jax.Array:
    """ρC/B²: the factor from a record's outer product r rᵀ to its curvature row, with
    B = ``CURVATURE_CLIP_SCALE`` · √n the bound on r."""
    return CURVATURE_SHARE * clipping_bound / (CURVATURE_CLIP_SCALE**2 * n_params)


def curvature_rows(rows: jax.Array, n_params: int, clipping_bound: float | jax.Array) -> jax.Array:
    """Each record's outer product r rᵀ of its clipped μ-gradient r (``rows``' first n columns,
    clipped again to B = ``CURVATURE_CLIP_SCALE`` · √n), as its upper triangle, times
    :func:`curvature_scale` so that its norm is at most ρC (the triangle's norm is at most
    ‖r rᵀ‖_F = ‖r‖² ≤ B²)."""
    mu = clip_rows(rows[:, :n_params], CURVATURE_CLIP_SCALE * np.sqrt(n_params))
    upper_rows, upper_cols = np.triu_indices(n_params)
    return mu[:, upper_rows] * mu[:, upper_cols] * curvature_scale(n_params, clipping_bound)


def curvature_matrix(upper: np.ndarray, n_params: int, clipping_bound: float) -> np.ndarray:
    """The symmetric n × n matrices (..., n, n) from released sums of :func:`curvature_rows`
    (..., n(n + 1)/2), in the units of the records' outer products r rᵀ."""
    upper = np.asarray(upper)
    rows, cols = np.triu_indices(n_params)
    out = np.zeros((*upper.shape[:-1], n_params, n_params))
    out[..., rows, cols] = upper
    out[..., cols, rows] = upper
    return out / curvature_scale(n_params, clipping_bound)


class DPSGDSettings(NamedTuple):
    """Per-fit numbers of the DP-SGD loop (traced, so changing them does not recompile)."""

    clipping_bound: float
    noise_multiplier: float
    preconditioner: jax.Array  # β, shape (d,)
    learning_rate: jax.Array  # λ = λ_heur β, shape (d,)
    gaps: GeometricTable  # the Poisson sampler's, at rate q; the same for every replicate
    n_records: int


#: How the vmapped replicate program maps over the settings: every number is per replicate; the
#: sampler's table (the same rate for all, 8.9 · 10⁵ rows at q = 10⁻⁴) is shared.
_SETTINGS_AXES = DPSGDSettings(0, 0, 0, 0, None, 0)


@dataclass(frozen=True)
class Trace:
    """The released trace: φ_0..φ_T, the noisy sums s̃_1..s̃_T of preconditioned clipped
    gradients, and the preconditioner β_t each step used (public: chosen from earlier iterates).

    With the curvature release, ``curvature_sums`` holds the released curvature rows
    (:func:`curvature_rows`) summed over each chunk of steps, and ``curvature_starts`` the first
    step of each chunk: the post-processing reads whole chunks, and storing every step's would
    take n²/4 times the memory of the gradients.
    """

    phi: np.ndarray  # (T + 1, d)
    noisy_sum: np.ndarray  # (T, d)
    preconditioner: np.ndarray  # (T, d)
    curvature_sums: np.ndarray | None = None  # (chunks, n(n + 1)/2)
    curvature_starts: np.ndarray | None = None  # (chunks,)

    @property
    def noisy_grad(self) -> np.ndarray:
        """The noisy gradients g̃_t = s̃_t / β_t the SGD steps took."""
        return self.noisy_sum / self.preconditioner


class StepOutput(NamedTuple):
    """What one step emits: the iterate it started from, its noisy gradient and noisy sum, its
    noisy curvature rows' sum (empty without the curvature release), and whether a snapped
    release was exact (always true for the float release)."""

    phi: jax.Array
    noisy_grad: jax.Array
    noisy_sum: jax.Array
    curvature: jax.Array
    exact: jax.Array


def noise_std(
    settings: DPSGDSettings, grid: float | None, n_params: int, curvature: bool = False
) -> float | jax.Array:
    """The noise standard deviation in preconditioned units: σΔ with Δ = C (or C·√(1 + ρ²) with
    the curvature release, :func:`release_bound`) for the float release and Δ + g√d on grid g
    for the snapped one (the sensitivity of a sum of grid-rounded rows of d coordinates)."""
    bound = release_bound(settings.clipping_bound, curvature)
    if grid is None:
        return settings.noise_multiplier * bound
    dim = release_dim(n_params, curvature)
    return settings.noise_multiplier * snapped_sensitivity(bound, grid, dim)


def make_step(
    model: RecordModel,
    capacity: int,
    mc_draws: int,
    snapped: bool = False,
    counted: bool = False,
    curvature: bool = False,
    mu_first: bool = False,
):
    """One DP-SGD step ``step(phi, key, data, settings, grid) -> (new_phi, StepOutput)``.

    ``snapped`` (static) chooses the snapped release on the (traced) ``grid``; the float release
    ignores ``grid``.  With ``counted`` (static) ``data`` is a :class:`CountedRecords`: the
    step draws how many copies of each record its batch holds and takes one gradient per
    record.  With ``curvature`` (static) every record's row also holds its curvature row
    (:func:`curvature_rows`), released in the same noisy sum.  With ``mu_first`` (static)
    the gradient's μ-part is clipped first and its u-part to what is left (:func:`clip_mu_first`).
    """
    n = model.n_params

    def step(phi, key, data, settings: DPSGDSettings, grid=None):
        key_batch, key_eps, key_noise = jax.random.split(key, 3)
        if counted:
            batch, counts = data.rows, binomial_counts(key_batch, data.thresholds)
        else:
            indices, mask = poisson_batch(
                key_batch, settings.n_records, settings.gaps, capacity
            )
            batch, counts = gather(data, indices), mask
        # Antithetic pairs (ε, −ε): the reparameterisation noise that is odd in ε cancels within
        # each record's gradient, which keeps per-record u-gradients small and rarely clipped.
        half = jax.random.normal(key_eps, ((mc_draws + 1) // 2, n), dtype=phi.dtype)
        eps = jnp.concatenate([half, -half])[:mc_draws]
        per_record = model.elbo_loss_grads(phi, batch, eps, settings.n_records)
        rows = per_record * settings.preconditioner
        if mu_first:
            rows = clip_mu_first(rows, n, settings.clipping_bound)
        else:
            rows = clip_rows(rows, settings.clipping_bound)
        if curvature:
            rows = jnp.concatenate(
                [rows, curvature_rows(rows, n, settings.clipping_bound)], axis=1
            )
        if snapped:
            released, exact = snapped_gaussian_release(
                key_noise, rows, noise_std(settings, grid, n, curvature), grid, counts
            )
        else:
            summed = jnp.sum(rows * counts[:, None], axis=0)
            std = noise_std(settings, None, n, curvature)
            released = summed + gaussian_noise(key_noise, summed.shape, std)
            exact = jnp.array(True)
        noisy_sum, noisy_curvature = released[: 2 * n], released[2 * n :]
        noisy_grad = noisy_sum / settings.preconditioner
        return phi - settings.learning_rate * noisy_grad, StepOutput(
            phi, noisy_grad, noisy_sum, noisy_curvature, exact
        )

    return step


def _chunk_runner(
    model: RecordModel,
    capacity: int,
    mc_draws: int,
    chunk: int,
    snapped: bool,
    replicates: bool,
    counted: bool = False,
    curvature: bool = False,
    mu_first: bool = False,
):
    """Up to ``chunk`` steps under ``jax.lax.fori_loop``, jitted; with ``replicates``, vmapped
    over a leading replicate axis of the iterate, key, data and settings (the grid is shared).

    The number of steps is a traced argument ``length`` ≤ ``chunk``: the steps past it do not
    run (no batch is drawn and nothing is released), and their outputs are zeros for the caller
    to drop.  So a run whose phases are not multiples of ``chunk`` compiles one program, not one
    per remainder.  The curvature releases come out summed over the chunk."""
    step = make_step(model, capacity, mc_draws, snapped, counted, curvature, mu_first)

    def run(phi, key, data, settings, grid, length):
        keys = jax.random.split(key, chunk)
        shapes = jax.eval_shape(step, phi, keys[0], data, settings, grid)[1]
        # The steps' outputs go into buffers of the chunk's size; the loop stops at ``length``.
        buffers = jax.tree.map(lambda a: jnp.zeros((chunk, *a.shape), a.dtype), shapes)

        def one(i, state):
            phi, buffers = state
            phi, out = step(phi, keys[i], data, settings, grid)
            return phi, jax.tree.map(lambda b, o: b.at[i].set(o), buffers, out)

        phi, out = jax.lax.fori_loop(0, length, one, (phi, buffers))
        ran = jnp.arange(chunk) < length
        return phi, out._replace(
            exact=jnp.all(out.exact | ~ran), curvature=jnp.sum(out.curvature, axis=0)
        )

    return jax.jit(
        jax.vmap(run, in_axes=(0, 0, 0, _SETTINGS_AXES, None, None)) if replicates else run
    )


class Schedule(Protocol):
    """Chooses the DP-SGD settings from the released trace (so choosing costs no privacy)."""

    burn_in_steps: int

    def settings(self, recent_phi: np.ndarray, *, progress: float) -> DPSGDSettings:
        """Settings for the next steps, given the last released iterates; ``progress`` is the
        fraction of the burn-in done (1 for the settings kept fixed after it)."""

    def restart(self, burn_in_phi: np.ndarray) -> np.ndarray:
        """Where the fixed phase starts, given every iterate of the burn-in."""

    def anchor(self, free_phi: np.ndarray) -> np.ndarray:
        """Where the anchored phase stays, given every iterate of the free steps before it."""


def _chunks(total: int, size: int) -> list[int]:
    full, rest = divmod(total, size)
    return [size] * full + ([rest] if rest else [])


def run_dpsgd(
    model: RecordModel,
    data: dict[str, np.ndarray],
    phi0: np.ndarray,
    schedule: Schedule,
    *,
    steps: int,
    capacity: int,
    mc_draws: int,
    key: jax.Array,
    progress: Progress,
    grid: float | None = None,
    chunk: int = 250,
    anchored_steps: int = 0,
    curvature: bool = False,
    mu_first: bool = False,
) -> tuple[Trace, DPSGDSettings]:
    """Run ``steps`` DP-SGD steps from ``phi0``; return the released trace and the final settings.

    ``grid``: the power-of-two grid of the snapped release (see
    :class:`dpppl.plugin.SnappedGaussian`), or None for float64 Gaussian noise.  Every chunk's
    snapped releases are checked to be exact before the next chunk runs, and
    :class:`~dpppl.errors.InexactReleaseError` is raised, returning nothing, if one is not.

    During the burn-in the schedule may change the settings after every ``chunk`` steps, from
    the iterates released so far; after it they stay fixed, so the post-processing model sees
    one noise level, and the fixed phase starts where the schedule's ``restart`` says (a
    function of released iterates only, so it costs no privacy).  Compiled loops are cached on
    ``model`` by their static shapes, so a second fit of the same model and sizes does not
    recompile.

    The last ``anchored_steps`` steps (the anchored phase) do not move: they start from the point
    the schedule's ``anchor`` picks from the fixed phase's iterates before them (their mean, say),
    and release noisy gradients there with learning rate 0.  Under the noise of DP-SGD a trace
    wanders around the optimum, and where the gradient is not linear the mean of that wander is not
    the optimum (the gradient of log σ² in a regression grows with the squared wander of the
    weights).  Gradients released at one fixed point carry no such bias, so the post-processing
    model can read the optimum off them and use the moving part of the trace for the curvature alone
    (see :meth:`dpppl_na_dpvi.postprocess.TraceStatistics.from_trace`).

    ``curvature``: every step also releases its batch's curvature rows (:func:`curvature_rows`),
    kept as sums per chunk in the trace.  ``mu_first``: each gradient's μ-part is
    clipped first and its u-part to what is left (:func:`clip_mu_first`).
    """
    traces, settings = run_dpsgd_replicates(
        model, [data], np.asarray(phi0)[None], [schedule], [key],
        steps=steps, capacity=capacity, mc_draws=mc_draws, progress=progress, grid=grid,
        chunk=chunk, vectorised=False, anchored_steps=anchored_steps, curvature=curvature,
        mu_first=mu_first,
    )
    return traces[0], settings[0]


def _stack(trees):
    return jax.tree.map(lambda *leaves: jnp.stack([jnp.asarray(x) for x in leaves]), *trees)


def _stack_settings(settings: Sequence[DPSGDSettings]) -> DPSGDSettings:
    """The replicates' settings for the vmapped program (see ``_SETTINGS_AXES``)."""
    shared = settings[0].gaps
    if any(s.gaps.rate != shared.rate for s in settings):
        raise ValueError("replicates of one DP-SGD run must share the sampling rate")
    return _stack([s._replace(gaps=None) for s in settings])._replace(gaps=shared)


#: Most records a model may allow for steps that count them (the plan decides whether they do).
MAX_COUNTED_RECORDS = 4096


class CountedRecords(NamedTuple):
    """A data set for steps that count records: the records the model allows, and per record
    the thresholds from which a step draws how many copies its batch holds
    (:func:`~dpppl.plugin.binomial_thresholds`, (U, 2, L))."""

    rows: dict[str, np.ndarray | jax.Array]
    thresholds: np.ndarray | jax.Array


def _device_data(
    model: RecordModel,
    data: Sequence[Mapping[str, np.ndarray]],
    rate: float,
    count_length: int | None,
) -> dict | CountedRecords:
    """The replicates' data sets stacked for the vmapped program: as they are, or with
    ``count_length`` as the counts of the records the model allows."""
    if count_length is None:
        return _stack(data)
    rows = model.possible_records(limit=MAX_COUNTED_RECORDS)
    counted = []
    for one in data:
        copies = copies_of(rows, dict(one))
        thresholds = np.stack([binomial_thresholds(int(n), rate, count_length) for n in copies])
        counted.append(CountedRecords(rows, thresholds))
    return _stack(counted)


def _first_steps(out: StepOutput, length: int) -> StepOutput:
    """A chunk's per-step outputs (replicate, step, ...) cut to the ``length`` steps it ran."""
    return out._replace(
        phi=out.phi[:, :length],
        noisy_grad=out.noisy_grad[:, :length],
        noisy_sum=out.noisy_sum[:, :length],
    )


def run_dpsgd_replicates(
    model: RecordModel,
    data: Sequence[Mapping[str, np.ndarray]],
    phi0: np.ndarray,
    schedules: Sequence[Schedule],
    keys: Sequence[jax.Array],
    *,
    steps: int,
    capacity: int,
    mc_draws: int,
    progress: Progress,
    grid: float | None = None,
    chunk: int = 250,
    vectorised: bool = True,
    anchored_steps: int = 0,
    count_length: int | None = None,
    curvature: bool = False,
    mu_first: bool = False,
) -> tuple[list[Trace], list[DPSGDSettings]]:
    """:func:`run_dpsgd` on R independent replicates at once, as one vmapped program.

    ``data``, ``phi0`` (R × d), ``schedules`` and ``keys`` hold one entry per replicate; every
    schedule must have the same burn-in length.  Each replicate follows exactly the algorithm of
    a single fit, its own schedule included; only its random stream differs (JAX's ``rbg``
    generator is not vmap-invariant).  ``vectorised=False`` runs one replicate on the
    single-fit program (what :func:`run_dpsgd` does).
    """
    snapped = grid is not None
    burn_in_steps = schedules[0].burn_in_steps
    if any(s.burn_in_steps != burn_in_steps for s in schedules):
        raise ValueError("replicates of one DP-SGD run must share the burn-in length")
    if not 0 <= anchored_steps < steps - burn_in_steps:
        raise ValueError("the anchored phase must leave some steps after the burn-in free")
    burn_in = _chunks(burn_in_steps, chunk)
    free = _chunks(steps - burn_in_steps - anchored_steps, chunk)
    anchored = _chunks(anchored_steps, chunk)
    lengths = burn_in + free + anchored
    # (replicate, chunk): one key per chunk of each replicate, split as a single fit splits it.
    chunk_keys = jnp.stack([jax.random.split(key, len(lengths)) for key in keys])
    counted = count_length is not None
    phi = jnp.asarray(phi0, dtype=jnp.float64)
    settings = [
        s.settings(np.asarray(p)[None], progress=0.0 if burn_in else 1.0)
        for s, p in zip(schedules, phi0, strict=True)
    ]
    stacked = _stack_settings(settings) if vectorised else None
    device_data = _device_data(model, data, float(settings[0].gaps.rate), count_length)
    if not vectorised:
        device_data = jax.tree.map(lambda a: a[0], device_data)
    outputs: list[StepOutput] = []
    preconditioners = []
    size = max(lengths)
    run = model.cached(
        (
            "na-dpvi", "dpsgd", capacity, mc_draws, size, snapped, vectorised, counted,
            curvature, mu_first,
        ),
        lambda: _chunk_runner(
            model, capacity, mc_draws, size, snapped, vectorised, counted, curvature,
            mu_first,
        ),
    )
    with progress.task("DP-SGD", total=steps) as bar:
        for i, length in enumerate(lengths):
            grid_value = grid if snapped else 0.0
            if vectorised:
                phi, out = run(phi, chunk_keys[:, i], device_data, stacked, grid_value, length)
            else:
                last, out = run(
                    phi[0], chunk_keys[0, i], device_data, settings[0], grid_value, length
                )
                phi, out = last[None], jax.tree.map(lambda x: x[None], out)
            out = _first_steps(out, length)
            require_exact(jnp.all(out.exact))
            outputs.append(out)
            preconditioners.append(
                np.stack([np.broadcast_to(s.preconditioner, (length, phi.shape[1])) for s in settings])
            )
            bar.advance(length)
            if i < len(burn_in):
                settings = [
                    s.settings(np.asarray(p), progress=(i + 1) / len(burn_in))
                    for s, p in zip(schedules, np.asarray(out.phi), strict=True)
                ]
                stacked = _stack_settings(settings) if vectorised else None
            if i == len(burn_in) - 1:
                burn_in_phi = np.asarray(jnp.concatenate([o.phi for o in outputs], axis=1))
                phi = jnp.asarray(
                    np.stack([s.restart(p) for s, p in zip(schedules, burn_in_phi, strict=True)])
                )
            if anchored and i == len(burn_in) + len(free) - 1:
                free_phi = np.asarray(
                    jnp.concatenate([o.phi for o in outputs[len(burn_in) :]], axis=1)
                )
                phi = jnp.asarray(
                    np.stack([s.anchor(p) for s, p in zip(schedules, free_phi, strict=True)])
                )
                settings = [
                    s._replace(learning_rate=jnp.zeros_like(s.learning_rate)) for s in settings
                ]
                stacked = _stack_settings(settings) if vectorised else None
    phi_trace = np.asarray(jnp.concatenate([o.phi for o in outputs] + [phi[:, None]], axis=1))
    sums = np.asarray(jnp.concatenate([o.noisy_sum for o in outputs], axis=1))
    beta = np.concatenate(preconditioners, axis=1)
    curvature_sums = (
        np.asarray(jnp.stack([o.curvature for o in outputs], axis=1)) if curvature else None
    )
    starts = np.cumsum([0, *lengths[:-1]]) if curvature else None
    traces = [
        Trace(
            phi=phi_trace[r],
            noisy_sum=sums[r],
            preconditioner=beta[r],
            curvature_sums=None if curvature_sums is None else curvature_sums[r],
            curvature_starts=starts,
        )
        for r in range(len(schedules))
    ]
    return traces, settings
