"""The exponential families the mechanism supports, read off the model's own log-likelihood.

For each family: the per-record sufficient statistic s(x), bounded so one record moves the sum by
at most the L2 sensitivity Δ, and the mean and covariance of the bounded statistic under the
model's parameters.  The parameters (p, λ or the category probabilities) are recovered from
``RecordModel.loglik`` at fixed probe records, so the PyMC graph stays the one source of truth and
any prior or parametrisation of them works.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import jax
import jax.numpy as jnp
import numpy as np

from dpppl.plugin import ModelNotSupportedError, RecordModel

#: Moments (mean (K,), covariance (K, K)) of the bounded statistic of one record at θ.
Moments = Callable[[jax.Array], tuple[jax.Array, jax.Array]]


@dataclass(frozen=True)
class Family:
    """One supported likelihood, bound to a model.

    Attributes
    ----------
    name
        ``"bernoulli"``, ``"exponential"`` or ``"categorical"``.
    statistic
        Maps the record array (N, ...) to the bounded statistics (N, K), in numpy.
    moments
        Mean and covariance of one record's bounded statistic at θ, in JAX.
    sensitivity
        Δ: the largest L2 norm of one record's bounded statistic.
    labels
        A name per coordinate of the statistic.
    """

    name: str
    statistic: Callable[[np.ndarray], np.ndarray]
    moments: Moments
    sensitivity: float
    labels: tuple[str, ...]


def family_of(model: RecordModel, bound: float) -> Family:
    """The family of ``model``'s likelihood, or ModelNotSupportedError saying why not.

    Parameters
    ----------
    model
        The compiled record model.
    bound
        B: exponential observations are clipped to [0, B] (public, chosen without the data).
    """
    observed = model.structure.observed
    if len(observed) != 1 or len(model.record_names) != 1:
        raise ModelNotSupportedError(
            "bernstein_sheldon supports one observed variable and no covariates (a "
            "Beta-Bernoulli, Gamma-Exponential or Dirichlet-Categorical model); this model has "
            f"record arrays {list(model.record_names)}"
        )
    kind = getattr(observed[0].owner.op, "name", "")
    name = model.record_names[0]
    dtype = model.structure.variables[0].dtype

    def probe(theta: jax.Array, value: float) -> jax.Array:
        """log p(x = value | θ) of one record."""
        return model.loglik(theta, {name: jnp.asarray([value], dtype=dtype)})[0]

    if kind == "bernoulli":
        return _bernoulli(probe)
    if kind == "exponential":
        return _exponential(probe, float(bound))
    if kind == "categorical":
        categories = int(observed[0].owner.inputs[-1].shape[-1].eval())
        return _categorical(probe, categories)
    raise ModelNotSupportedError(
        f"bernstein_sheldon supports Bernoulli, Exponential and Categorical likelihoods; "
        f"{observed[0].name!r} is {kind or type(observed[0].owner.op).__name__}"
    )


def _bernoulli(probe: Callable[[jax.Array, float], jax.Array]) -> Family:
    def moments(theta: jax.Array) -> tuple[jax.Array, jax.Array]:
        p = jnp.exp(probe(theta, 1))
        return p[None], (p * (1 - p))[None, None]

    return Family(
        "bernoulli",
        statistic=lambda y: np.asarray(y, dtype=float).reshape(-1, 1),
        moments=moments,
        sensitivity=1.0,
        labels=("sum of y",),
    )


def _exponential(probe: Callable[[jax.Array, float], jax.Array], bound: float) -> Family:
    def moments(theta: jax.Array) -> tuple[jax.Array, jax.Array]:
        # log p(0 | λ) = log λ.  For S = min(Y, B), Y ~ Exp(λ):
        # E S = (1 - e^{-λB}) / λ,  E S² = 2 (1 - e^{-λB}(1 + λB)) / λ².
        rate = jnp.exp(probe(theta, 0.0))
        tail = jnp.exp(-rate * bound)
        mean = -jnp.expm1(-rate * bound) / rate
        second = 2 * (1 - tail * (1 + rate * bound)) / rate**2
        return mean[None], jnp.maximum(second - mean**2, 0.0)[None, None]

    return Family(
        "exponential",
        statistic=lambda y: np.clip(np.asarray(y, dtype=float), 0.0, bound).reshape(-1, 1),
        moments=moments,
        sensitivity=bound,
        labels=(f"sum of min(y, {bound:g})",),
    )


def _categorical(probe: Callable[[jax.Array, float], jax.Array], categories: int) -> Family:
    def moments(theta: jax.Array) -> tuple[jax.Array, jax.Array]:
        p = jnp.exp(jnp.stack([probe(theta, k) for k in range(categories)]))
        return p, jnp.diag(p) - jnp.outer(p, p)

    def statistic(y: np.ndarray) -> np.ndarray:
        y = np.asarray(y).astype(int).reshape(-1)
        # A value outside 0..K-1 has no category: its row stays zero, inside the sensitivity.
        return (y[:, None] == np.arange(categories)[None, :]).astype(float)

    return Family(
        "categorical",
        statistic=statistic,
        moments=moments,
        sensitivity=1.0,
        labels=tuple(f"count of category {k}" for k in range(categories)),
    )
