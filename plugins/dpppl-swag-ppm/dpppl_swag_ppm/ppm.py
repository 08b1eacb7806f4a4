"""Per-record quantities of the pseudo posterior mechanism (Savitsky et al. 2022; SWAG-PPM §2.1).

Every array here is private: risks, weights and log-likelihoods are per record and never leave the
mechanism.  The functions are pure, so they can be tested on their own:

* :func:`record_risks`: r_i = max over posterior draws θ_s of |log p(x_i | θ_s)|, +inf where a
  log-likelihood is not finite; computed in chunks of records, so N × S is never held at once.
* :func:`risk_weights`: α_i = c(1 - r̃_i) + g on the min-max scaled risk r̃, kept in [0, 1];
  records of infinite risk get 0.
* :func:`local_sensitivity`: Δ_α,D = max over draws and records of |α_i log p(x_i | θ_s)|, the
  Monte Carlo local sensitivity; one released draw is 2Δ_α,D-private in the PPM's sense.
* :func:`reweight`: α_i^w = k α_i Δ_α,D / Δ_α,D,i, kept in [0, 1] (SWAG-PPM eq. 7).
"""

from __future__ import annotations

from collections.abc import Callable

import jax
import jax.numpy as jnp
import numpy as np

from dpppl.plugin import RecordModel
from dpppl_swag_ppm.batches import Data, in_chunks

#: Upper bound on draws × records of log-likelihood held at once in :func:`record_risks`.
RISK_BLOCK = 1 << 18


def _compile_risks(model: RecordModel) -> Callable[[jax.Array, Data], jax.Array]:
    @jax.jit
    def risks(draws, chunks):
        def chunk_risks(batch):
            loglik = jax.vmap(model.loglik, in_axes=(0, None))(draws, batch)  # (S, chunk)
            finite = jnp.all(jnp.isfinite(loglik), axis=0)
            return jnp.where(finite, jnp.max(jnp.abs(loglik), axis=0), jnp.inf)

        return jax.lax.map(chunk_risks, chunks).reshape(-1)

    return risks


def record_risks(model: RecordModel, data: Data, draws: jax.Array) -> np.ndarray:
    """r_i = max_s |log p(x_i | θ_s)| for every record, +inf if any of them is not finite.

    Parameters
    ----------
    model
        The record model.
    data
        All N records.
    draws
        Posterior draws θ_s, shape (S, P).

    Returns
    -------
    numpy.ndarray
        Shape (N,); private.
    """
    n_records = next(iter(data.values())).shape[0]
    chunk = max(1, min(n_records, RISK_BLOCK // draws.shape[0]))
    chunks, _ = in_chunks(data, jnp.ones(n_records), chunk)
    compiled = model.cached("dpppl_swag_ppm.record_risks", lambda: _compile_risks(model))
    return np.asarray(compiled(draws, chunks))[:n_records]


def risk_weights(risks: np.ndarray, scale: float = 1.0, shift: float = 0.0) -> np.ndarray:
    """PPM weights α_i = clip(c(1 - r̃_i) + g, 0, 1) from the risks, 0 where the risk is infinite.

    r̃ is the risk min-max scaled over the records of finite risk (all 0 when they are equal), so
    with c = 1, g = 0 the least risky record gets weight 1 and the riskiest weight 0.

    Parameters
    ----------
    risks
        r_i, shape (N,).
    scale, shift
        c > 0 and g of the linear map.
    """
    risks = np.asarray(risks, dtype=float)
    weights = np.zeros_like(risks)
    finite = np.isfinite(risks)
    if finite.any():
        low, high = risks[finite].min(), risks[finite].max()
        scaled = (risks[finite] - low) / (high - low) if high > low else np.zeros(finite.sum())
        weights[finite] = np.clip(scale * (1.0 - scaled) + shift, 0.0, 1.0)
    return weights


def record_sensitivities(weights: np.ndarray, risks: np.ndarray) -> np.ndarray:
    """Δ_α,D,i = α_i r_i, with records of weight 0 contributing 0 whatever their risk.

    A weight-0 record is out of the pseudo likelihood (p^0 = 1), even if its log-likelihood is
    infinite somewhere.
    """
    weights = np.asarray(weights, dtype=float)
    risks = np.asarray(risks, dtype=float)
    return np.where(weights > 0, weights * np.where(weights > 0, risks, 0.0), 0.0)


def local_sensitivity(weights: np.ndarray, risks: np.ndarray) -> float:
    """Δ_α,D = max_i α_i r_i = max over draws and records of |α_i log p(x_i | θ_s)|."""
    return float(np.max(record_sensitivities(weights, risks), initial=0.0))


def reweight(weights: np.ndarray, risks: np.ndarray, k: float) -> np.ndarray:
    """Re-weighted α_i^w = k α_i Δ_α,D / Δ_α,D,i, kept in [0, 1]; weight-0 records stay at 0.

    Every record of positive weight is brought towards the same sensitivity k·Δ_α,D, so records
    far below the maximum are no longer over-penalised (SWAG-PPM eq. 7).

    Parameters
    ----------
    weights
        α_i of the weighted fit.
    risks
        r_i from that fit's draws.
    k
        0 < k < 1.
    """
    per_record = record_sensitivities(weights, risks)
    total = per_record.max(initial=0.0)
    positive = per_record > 0
    with np.errstate(over="ignore"):  # a tiny Δ_i overflows to +inf and is clipped to 1 below
        ratio = np.divide(total, per_record, out=np.ones_like(per_record), where=positive)
    # A positive weight whose records never risk anything (r_i = 0) can rise to 1.
    ratio = np.where(positive | (weights <= 0), ratio, np.inf)
    return np.where(weights > 0, np.clip(k * weights * ratio, 0.0, 1.0), 0.0)
