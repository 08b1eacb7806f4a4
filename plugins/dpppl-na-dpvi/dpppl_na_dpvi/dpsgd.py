"""DPVI: DP-SGD on the per-record ELBO loss (NA-DPVI paper, Algorithm 3 with Appendix H.2).

Each step Poisson-samples about κN records as a fixed-shape masked batch, takes per-record
gradients of the mean-field ELBO loss by ``vmap``, multiplies them by the preconditioning vector
β, clips each to norm C, adds N(0, σ²C²) noise to their sum, divides by β and takes an SGD step
with learning rate λ ⊙ β.  The whole loop runs under ``jax.lax.scan``, in chunks so that a progress
bar can advance between them.  The parameter trace and the noisy gradients are the DP release.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import NamedTuple, Protocol

import jax
import jax.numpy as jnp
import numpy as np

from dpppl.privacy import clip_rows, gather, gaussian_noise, poisson_batch
from dpppl.progress import Progress
from dpppl.record_model import RecordModel, per_example_grad


class DPSGDSettings(NamedTuple):
    """Per-fit numbers of the DP-SGD loop (traced, so changing them does not recompile)."""

    clipping_bound: float
    noise_multiplier: float
    preconditioner: jax.Array  # β, shape (d,)
    learning_rate: jax.Array  # λ = λ_heur β, shape (d,)
    sampling_rate: float
    n_records: int


@dataclass(frozen=True)
class Trace:
    """The released trace: φ_0..φ_T and the noisy gradients g̃_1..g̃_T (already divided by β)."""

    phi: np.ndarray  # (T + 1, d)
    noisy_grad: np.ndarray  # (T, d)


def make_step(model: RecordModel, capacity: int, mc_draws: int):
    """One DP-SGD step ``step(phi, key, data, settings) -> (new_phi, (phi, noisy_grad))``."""
    grads = per_example_grad(model.elbo_loss, n_args=2)
    n = model.n_params

    def step(phi, key, data, settings: DPSGDSettings):
        key_batch, key_eps, key_noise = jax.random.split(key, 3)
        indices, mask = poisson_batch(
            key_batch, settings.n_records, settings.sampling_rate, capacity
        )
        batch = gather(data, indices)
        # Antithetic pairs (ε, −ε): the reparameterisation noise that is odd in ε cancels within
        # each record's gradient, which keeps per-record u-gradients small and rarely clipped.
        half = jax.random.normal(key_eps, ((mc_draws + 1) // 2, n), dtype=phi.dtype)
        eps = jnp.concatenate([half, -half])[:mc_draws]
        per_record = grads(phi, batch, eps, settings.n_records)
        clipped = clip_rows(per_record * settings.preconditioner, settings.clipping_bound)
        summed = jnp.sum(clipped * mask[:, None], axis=0)
        noise = gaussian_noise(
            key_noise, summed.shape, settings.noise_multiplier * settings.clipping_bound
        )
        noisy_grad = (summed + noise) / settings.preconditioner
        return phi - settings.learning_rate * noisy_grad, (phi, noisy_grad)

    return step


def _chunk_runner(model: RecordModel, capacity: int, mc_draws: int, chunk: int):
    step = make_step(model, capacity, mc_draws)

    @jax.jit
    def run(phi, key, data, settings):
        keys = jax.random.split(key, chunk)
        phi, (phis, grads) = jax.lax.scan(
            lambda carry, k: step(carry, k, data, settings), phi, keys
        )
        return phi, phis, grads

    return run


class Schedule(Protocol):
    """Chooses the DP-SGD settings from the released trace (so choosing costs no privacy)."""

    burn_in_steps: int

    def settings(self, recent_phi: np.ndarray, *, progress: float) -> DPSGDSettings:
        """Settings for the next steps, given the last released iterates; ``progress`` is the
        fraction of the burn-in done (1 for the settings kept fixed after it)."""

    def restart(self, burn_in_phi: np.ndarray) -> np.ndarray:
        """Where the fixed phase starts, given every iterate of the burn-in."""


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
    chunk: int = 250,
) -> tuple[Trace, DPSGDSettings]:
    """Run ``steps`` DP-SGD steps from ``phi0``; return the released trace and the final settings.

    During the burn-in the schedule may change the settings after every ``chunk`` steps, from
    the iterates released so far; after it they stay fixed, so the post-processing model sees
    one noise level, and the fixed phase starts where the schedule's ``restart`` says (a
    function of released iterates only, so it costs no privacy).  Compiled loops are cached on ``model`` by their static shapes, so a second
    fit of the same model and sizes does not recompile.
    """
    device_data = {k: jnp.asarray(v) for k, v in data.items()}
    phi = jnp.asarray(phi0, dtype=jnp.float64)
    burn_in = _chunks(schedule.burn_in_steps, chunk)
    final = _chunks(steps - schedule.burn_in_steps, chunk)
    keys = jax.random.split(key, len(burn_in) + len(final))
    settings = schedule.settings(np.asarray(phi)[None], progress=0.0 if burn_in else 1.0)
    phis, grads = [], []
    with progress.task("DP-SGD", total=steps) as bar:
        for i, length in enumerate(burn_in + final):
            run = model.cached(
                ("na-dpvi", "dpsgd", capacity, mc_draws, length),
                lambda length=length: _chunk_runner(model, capacity, mc_draws, length),
            )
            phi, chunk_phis, chunk_grads = run(phi, keys[i], device_data, settings)
            phis.append(chunk_phis)
            grads.append(chunk_grads)
            bar.advance(length)
            if i < len(burn_in):
                settings = schedule.settings(
                    np.asarray(chunk_phis), progress=(i + 1) / len(burn_in)
                )
            if i == len(burn_in) - 1:
                phi = jnp.asarray(schedule.restart(np.asarray(jnp.concatenate(phis))))
    phis.append(phi[None])
    trace = Trace(
        phi=np.asarray(jnp.concatenate(phis)), noisy_grad=np.asarray(jnp.concatenate(grads))
    )
    return trace, settings
