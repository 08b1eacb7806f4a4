"""Record arrays as the compiled passes need them: weighted-out records made harmless, and the
data set cut into equal chunks for passes over every record."""

from __future__ import annotations

from collections.abc import Mapping

import jax
import jax.numpy as jnp
import numpy as np

Data = dict[str, jax.Array]


def neutralise(data: Mapping[str, jax.Array], weights: jax.Array) -> Data:
    """The records of weight 0 replaced by a copy of the first record of positive weight.

    A weight-0 record contributes nothing to a weighted objective, but if its log-likelihood is
    not finite, ``0 · (-inf)`` and the gradient through it are NaN.  Its copy of a record with a
    finite log-likelihood keeps the arithmetic finite and still contributes exactly nothing.
    When no record has positive weight, ``data`` is returned unchanged.
    """
    positive = weights > 0
    if not bool(jnp.any(positive)):
        return dict(data)
    donor = int(jnp.argmax(positive))
    return {
        name: jnp.where(
            positive.reshape((-1,) + (1,) * (array.ndim - 1)), array, array[donor]
        )
        for name, array in data.items()
    }


def in_chunks(
    data: Mapping[str, jax.Array], weights: jax.Array, size: int
) -> tuple[Data, jax.Array]:
    """``data`` and ``weights`` reshaped to (n_chunks, size, ...), padded at the end.

    Padding repeats the first record with weight 0, so a weighted sum over the chunks equals the
    sum over the records; per-record results are the first N entries of the flattened output.
    """
    n_records = weights.shape[0]
    n_chunks = -(-n_records // size)
    pad = n_chunks * size - n_records
    index = jnp.concatenate([jnp.arange(n_records), jnp.zeros(pad, dtype=int)])
    chunked = {
        name: array[index].reshape((n_chunks, size) + array.shape[1:])
        for name, array in data.items()
    }
    padded_weights = jnp.concatenate([weights, jnp.zeros(pad, dtype=weights.dtype)])
    return chunked, padded_weights.reshape(n_chunks, size)


def to_device(data: Mapping[str, np.ndarray]) -> Data:
    """The record arrays as JAX arrays (one transfer per fit)."""
    return {name: jnp.asarray(array) for name, array in data.items()}
