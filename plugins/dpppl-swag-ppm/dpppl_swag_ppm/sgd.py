"""SGD on a record model's weighted (pseudo) posterior, collected by SWAG.

The objective is the negative log pseudo posterior

    U(θ) = -log p(θ) - Σ_i w_i log p(x_i | θ),

estimated on minibatches of B records drawn uniformly with replacement, independently at every
step; an epoch is N // B steps.  (The pseudo posterior mechanism's guarantee does not rest on
subsampling.  Shuffling once per epoch would be cheaper to explain but its minibatch noise cancels
over an epoch, which made SGD's spread, and so SWAG's variances, about three times too small on a
conjugate model; independent minibatches make the noise the rule below assumes.)  A fit has three
phases, each a ``jax.lax.scan`` over one epoch's minibatches, jitted once per model and schedule
through ``RecordModel.cached``:

1. *Warm-up*: Adam with a cosine-decayed learning rate, to a good point (from the model's
   initial point in the first fit, from the previous fit's mean in later ones).
2. *Burn-in*: constant-learning-rate SGD, not collected, to reach SGD's stationary distribution.
3. *Collection*: the same SGD; SWAG collects an iterate every ``collect_every`` steps (once per
   epoch by default).

The learning-rate rule.  Near a mode, U ≈ ½ θᵀΛθ and the minibatch gradient has noise covariance
Q = (N²/B)·Cov_i(w_i ∇log p(x_i | θ)).  Preconditioned SGD θ ← θ - H ĝ then has stationary
covariance Λ⁻¹ exactly, the posterior's, when H = 2(Q + Λ)⁻¹: the stationary covariance Σ solves
Σ = (I - HΛ) Σ (I - ΛH) + HQH, which Σ = Λ⁻¹ does for that H (the discrete-time form of Mandt,
Hoffman & Blei 2017, Thm. 1).  The rule takes Q and the Hessian Λ of U at the end of the warm-up,
from N, B and the data, so it needs no tuning.  Λ is inflated by a margin (1 + γ) so that
directions the data hardly inform, where Q ≪ Λ, contract by at least |1 - 2/(1 + γ)| per step
instead of oscillating; elsewhere this costs a fraction ≈ γB/N of the variance.  Up to
``DENSE_PRECONDITIONER_LIMIT`` parameters H is a dense matrix, which also gets the posterior's
correlations right; above it H is diagonal.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp

from dpppl.plugin import RecordModel, Task, gather, per_example_grad
from dpppl_swag_ppm.batches import Data, in_chunks, neutralise
from dpppl_swag_ppm.errors import TrainingDivergedError
from dpppl_swag_ppm.swag import SwagState, swag_collect, swag_init

#: γ: the preconditioner uses (1 + γ)Λ for Λ (see the module docstring).
CURVATURE_MARGIN = 0.25
#: Up to this many parameters the preconditioner is dense, above it diagonal.
DENSE_PRECONDITIONER_LIMIT = 1000
#: Default batch size: N // 10, at most this (a small B/N keeps each step's contraction HΛ ≈ 2B/N
#: small, near the continuous-time limit and with nearly independent per-epoch iterates).
MAX_DEFAULT_BATCH_SIZE = 256
#: Default warm-up: this many epochs, and at least ``MIN_WARMUP_STEPS`` Adam steps.
MIN_WARMUP_EPOCHS = 20
MIN_WARMUP_STEPS = 2000
#: Eigenvalues of Q + (1 + γ)Λ below this fraction of the largest are raised to it.
RELATIVE_EIGENVALUE_FLOOR = 1e-10
#: Rademacher probes of the Hutchinson estimate of the Hessian's diagonal (diagonal preconditioner).
HUTCHINSON_PROBES = 8
#: Records per chunk in passes over the whole data set, and bound on P × records per chunk.
CHUNK_RECORDS = 512
HESSIAN_BLOCK = 1 << 17
_ADAM_BETA1, _ADAM_BETA2, _ADAM_EPS = 0.9, 0.999, 1e-8


def default_batch_size(n_records: int) -> int:
    """B = N // 10, between 1 and ``MAX_DEFAULT_BATCH_SIZE``."""
    return max(1, min(MAX_DEFAULT_BATCH_SIZE, n_records // 10))


def default_warmup_epochs(steps_per_epoch: int) -> int:
    """At least ``MIN_WARMUP_EPOCHS`` epochs and ``MIN_WARMUP_STEPS`` Adam steps."""
    return max(MIN_WARMUP_EPOCHS, math.ceil(MIN_WARMUP_STEPS / steps_per_epoch))


@dataclass(frozen=True)
class Schedule:
    """The public settings of one SWAG fit, all fixed from options and N before any data is read.

    Attributes
    ----------
    n_records
        N.
    batch_size
        B, records per SGD step.
    warmup_epochs, warmup_lr
        Adam phase at the start of every fit: its length and initial learning rate.
    burn_in_epochs, swag_epochs
        Uncollected and collected constant-learning-rate SGD epochs.
    collect_every
        SGD steps between two SWAG collections.
    rank
        K, the deviations kept for the low-rank part.
    preconditioner
        ``"dense"`` or ``"diagonal"``.
    """

    n_records: int
    batch_size: int
    warmup_epochs: int
    warmup_lr: float
    burn_in_epochs: int
    swag_epochs: int
    collect_every: int
    rank: int
    preconditioner: str

    @property
    def steps_per_epoch(self) -> int:
        """SGD steps per epoch, N // B."""
        return self.n_records // self.batch_size

    @property
    def epochs_per_fit(self) -> int:
        """Warm-up, burn-in and collected epochs of one fit."""
        return self.warmup_epochs + self.burn_in_epochs + self.swag_epochs

    @property
    def collections(self) -> int:
        """Iterates SWAG collects per fit."""
        return self.swag_epochs * self.steps_per_epoch // self.collect_every

    def chunk_records(self, n_params: int) -> int:
        """Records per chunk in passes over all records (the dense Hessian holds P × chunk)."""
        return max(1, min(self.n_records, CHUNK_RECORDS, HESSIAN_BLOCK // max(n_params, 1)))

    def compile_key(self) -> tuple[str | int, ...]:
        """What the compiled functions depend on (everything else is a traced argument)."""
        return (
            "dpppl_swag_ppm.sgd",
            self.n_records,
            self.batch_size,
            self.collect_every,
            self.rank,
            self.preconditioner,
        )


class _Compiled(NamedTuple):
    adam_epoch: Callable[..., Any]
    sgd_epoch: Callable[..., Any]
    preconditioner: Callable[..., jax.Array]


def _compile(model: RecordModel, schedule: Schedule) -> _Compiled:
    n, b, steps = schedule.n_records, schedule.batch_size, schedule.steps_per_epoch
    dense = schedule.preconditioner == "dense"

    def neg_logprior(theta):
        return -model.logprior(theta)

    def weighted_nll(theta, batch, weights):
        # Records of weight 0 are masked out, so 0 · (-inf) never turns the sum into NaN.
        return -jnp.sum(jnp.where(weights > 0, weights * model.loglik(theta, batch), 0.0))

    def grad_u(theta, batch, weights):
        def u(th):
            return neg_logprior(th) + (n / b) * weighted_nll(th, batch, weights)

        return jax.grad(u)(theta)

    def minibatches(key):
        return jax.random.randint(key, (steps, b), 0, n)

    def finite_or_zero(g):
        ok = jnp.all(jnp.isfinite(g))
        return ok, jnp.where(ok, g, 0.0)

    @jax.jit
    def adam_epoch(carry, key, data, weights, lr, total_steps):
        def step(carry, idx):
            theta, m, v, t, bad = carry
            ok, g = finite_or_zero(grad_u(theta, gather(data, idx), weights[idx]))
            t = t + 1
            m = jnp.where(ok, _ADAM_BETA1 * m + (1 - _ADAM_BETA1) * g, m)
            v = jnp.where(ok, _ADAM_BETA2 * v + (1 - _ADAM_BETA2) * g**2, v)
            m_hat = m / (1 - _ADAM_BETA1**t)
            v_hat = v / (1 - _ADAM_BETA2**t)
            rate = lr * 0.5 * (1 + jnp.cos(jnp.pi * jnp.minimum(t / total_steps, 1.0)))
            theta = jnp.where(ok, theta - rate * m_hat / (jnp.sqrt(v_hat) + _ADAM_EPS), theta)
            return (theta, m, v, t, bad + (~ok)), None

        carry, _ = jax.lax.scan(step, carry, minibatches(key))
        return carry

    @jax.jit
    def sgd_epoch(carry, key, data, weights, precond, collect):
        def step(carry, idx):
            theta, swag, t, bad = carry
            ok, g = finite_or_zero(grad_u(theta, gather(data, idx), weights[idx]))
            theta = theta - (precond @ g if dense else precond * g)
            t = t + 1
            swag = jax.lax.cond(
                collect & (t % schedule.collect_every == 0),
                swag_collect,
                lambda state, _: state,
                swag,
                theta,
            )
            return (theta, swag, t, bad + (~ok)), None

        carry, _ = jax.lax.scan(step, carry, minibatches(key))
        return carry

    per_record_grad = per_example_grad(model.loglik)

    def gradient_noise(theta, chunks, weight_chunks):
        """Q: covariance of the minibatch estimate of ∇U (B records drawn with replacement)."""

        def body(acc, xs):
            batch, w = xs
            grads = per_record_grad(theta, batch)
            v = jnp.where(jnp.isfinite(grads) & (w[:, None] > 0), w[:, None] * grads, 0.0)
            sum_v, sum_vv = acc
            squares = v.T @ v if dense else jnp.sum(v * v, axis=0)
            return (sum_v + v.sum(axis=0), sum_vv + squares), None

        p = theta.shape[0]
        init = (jnp.zeros(p), jnp.zeros((p, p) if dense else p))
        (sum_v, sum_vv), _ = jax.lax.scan(body, init, (chunks, weight_chunks))
        mean_v = sum_v / n
        cov = sum_vv / n - (jnp.outer(mean_v, mean_v) if dense else mean_v**2)
        return (n**2 / b) * cov

    def curvature(theta, chunks, weight_chunks, key):
        """Λ: the Hessian of U, its positive part (dense) or a Hutchinson estimate of its diagonal.

        The Hessian, not the empirical Fisher information: PPM's weights favour the records the
        model fits well, whose squared scores are far below their curvature, so the Fisher
        information underestimates Λ and the steps it gives diverge.
        """
        if dense:

            def body(acc, xs):
                return acc + jax.hessian(weighted_nll)(theta, *xs), None

            p = theta.shape[0]
            likelihood, _ = jax.lax.scan(body, jnp.zeros((p, p)), (chunks, weight_chunks))
            hessian = likelihood + jax.hessian(neg_logprior)(theta)
            return _psd_part((hessian + hessian.T) / 2)

        def u(th):
            def body(acc, xs):
                return acc + weighted_nll(th, *xs), None

            return neg_logprior(th) + jax.lax.scan(body, 0.0, (chunks, weight_chunks))[0]

        def hvp(z):
            return jax.jvp(jax.grad(u), (theta,), (z,))[1]

        probes = jax.random.rademacher(key, (HUTCHINSON_PROBES, theta.shape[0]), dtype=theta.dtype)
        return jnp.maximum(jnp.mean(probes * jax.vmap(hvp)(probes), axis=0), 0.0)

    @jax.jit
    def preconditioner(theta, chunks, weight_chunks, key):
        noise = gradient_noise(theta, chunks, weight_chunks)
        a = noise + (1 + CURVATURE_MARGIN) * curvature(theta, chunks, weight_chunks, key)
        if dense:
            values, vectors = jnp.linalg.eigh(a)
            values = jnp.maximum(values, RELATIVE_EIGENVALUE_FLOOR * jnp.max(values))
            return (vectors * (2.0 / values)) @ vectors.T
        return 2.0 / jnp.maximum(a, RELATIVE_EIGENVALUE_FLOOR * jnp.max(a))

    return _Compiled(adam_epoch, sgd_epoch, preconditioner)


def _psd_part(matrix: jax.Array) -> jax.Array:
    """The symmetric matrix with its negative eigenvalues set to 0."""
    values, vectors = jnp.linalg.eigh(matrix)
    return (vectors * jnp.maximum(values, 0.0)) @ vectors.T


class SGDRun(NamedTuple):
    """Where a run of :meth:`SwagTrainer.sgd_epochs` ended.

    Attributes
    ----------
    theta
        The last iterate, shape (P,).
    swag
        SWAG's state: empty unless the run collected.
    bad_steps
        Steps whose minibatch gradient was not finite (they left θ unchanged).
    """

    theta: jax.Array
    swag: SwagState
    bad_steps: jax.Array


class SwagTrainer:
    """Runs SWAG fits of one record model under one :class:`Schedule`.

    The compiled functions live in ``model.cached``, so every fit of the model with the same
    schedule (calibration rounds, repeated ``dpppl.sample`` calls) reuses one compilation.

    Parameters
    ----------
    model
        The record model whose (pseudo) posterior is fitted.
    schedule
        The public settings of every fit.
    """

    def __init__(self, model: RecordModel, schedule: Schedule) -> None:
        self.model = model
        self.schedule = schedule
        self._compiled: _Compiled = model.cached(
            schedule.compile_key(), lambda: _compile(model, schedule)
        )

    def fit(
        self,
        data: Data,
        weights: jax.Array,
        start: jax.Array,
        key: jax.Array,
        *,
        bar: Task | None = None,
    ) -> SwagState:
        """One SWAG fit of the pseudo posterior with record ``weights``, from θ = ``start``.

        Parameters
        ----------
        data
            All N records.
        weights
            w_i, shape (N,); records of weight 0 take no part.
        start
            Starting point of the Adam warm-up, shape (P,).
        key
            Entropy for the fit's minibatches and curvature probes.
        bar
            Progress bar advanced once per epoch (``schedule.epochs_per_fit`` in all).

        Returns
        -------
        SwagState
            The iterates collected in the last ``swag_epochs`` epochs.

        Raises
        ------
        TrainingDivergedError
            If most steps of a phase had non-finite gradients, or the collected mean is not finite.
        """
        s = self.schedule
        train = neutralise(data, weights)
        keys = jax.random.split(key, s.epochs_per_fit + 1)
        theta = self._warm_up(
            train, weights, jnp.asarray(start, dtype=jnp.float64), keys[: s.warmup_epochs], bar
        )
        chunks, weight_chunks = in_chunks(train, weights, s.chunk_records(theta.shape[0]))
        precond = self._compiled.preconditioner(theta, chunks, weight_chunks, keys[-1])
        collect_from = s.warmup_epochs + s.burn_in_epochs
        burn_in = self.sgd_epochs(
            train, weights, theta, precond, keys[s.warmup_epochs : collect_from],
            collect=False, bar=bar,
        )
        collected = self.sgd_epochs(
            train, weights, burn_in.theta, precond, keys[collect_from : s.epochs_per_fit],
            collect=True, bar=bar,
        )
        _check_steps(
            burn_in.bad_steps + collected.bad_steps,
            (s.burn_in_epochs + s.swag_epochs) * s.steps_per_epoch,
            "SGD",
        )
        if not bool(jnp.all(jnp.isfinite(collected.swag.mean))):
            raise TrainingDivergedError(
                "SWAG's mean is not finite: SGD diverged. Lower batch_size (a smaller batch gives "
                "smaller steps) or use preconditioner='dense'"
            )
        return collected.swag

    def sgd_epochs(
        self,
        data: Data,
        weights: jax.Array,
        theta: jax.Array,
        preconditioner: jax.Array,
        keys: jax.Array,
        *,
        collect: bool,
        bar: Task | None = None,
    ) -> SGDRun:
        """Preconditioned SGD θ ← θ - H ĝ for one epoch per key, SWAG collecting if ``collect``.

        Parameters
        ----------
        data
            All N records, those of weight 0 made harmless
            (:func:`~dpppl_swag_ppm.batches.neutralise`).
        weights
            w_i, shape (N,).
        theta
            Starting point, shape (P,).
        preconditioner
            H: shape (P, P) under a dense schedule, (P,) under a diagonal one.
        keys
            One PRNG key per epoch; each draws that epoch's minibatches.
        collect
            Whether SWAG collects an iterate every ``collect_every`` steps.  Steps are counted from
            the first step of this call, so a collecting call of ``swag_epochs`` epochs collects
            exactly ``schedule.collections`` iterates however long the burn-in was.
        bar
            Progress bar advanced once per epoch.

        Returns
        -------
        SGDRun
            The last iterate, SWAG's state (fresh at the start of the call) and the count of
            steps with non-finite gradients.
        """
        zero = jnp.zeros((), dtype=jnp.int64)
        carry = (theta, swag_init(theta.shape[0], self.schedule.rank), zero, zero)
        for key in keys:
            carry = self._compiled.sgd_epoch(carry, key, data, weights, preconditioner, collect)
            if bar is not None:
                bar.advance()
        theta, swag, _, bad_steps = carry
        return SGDRun(theta, swag, bad_steps)

    def _warm_up(
        self, data: Data, weights: jax.Array, theta: jax.Array, keys: jax.Array, bar: Task | None
    ) -> jax.Array:
        """Adam with a cosine-decayed learning rate, one epoch per key; returns the last iterate."""
        s = self.schedule
        zero = jnp.zeros((), dtype=jnp.int64)
        carry = (theta, jnp.zeros_like(theta), jnp.zeros_like(theta), zero, zero)
        warmup_steps = s.warmup_epochs * s.steps_per_epoch
        for key in keys:
            carry = self._compiled.adam_epoch(carry, key, data, weights, s.warmup_lr, warmup_steps)
            if bar is not None:
                bar.advance()
        _check_steps(carry[-1], warmup_steps, "Adam warm-up")
        return carry[0]


def _check_steps(bad_steps: jax.Array, steps: int, phase: str) -> None:
    if int(bad_steps) * 2 > steps:
        raise TrainingDivergedError(
            f"most steps of the {phase} had non-finite gradients, so SGD could not make progress; "
            "check that the model's initial point has a finite log density and its priors are "
            "proper, or lower warmup_lr"
        )
