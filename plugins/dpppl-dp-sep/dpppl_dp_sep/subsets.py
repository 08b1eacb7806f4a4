"""Uniform sampling of a fixed number of records without replacement, inside ``jit``.

DP-SEP's steps each draw ``m`` records uniformly without replacement, independently of the other
steps: the sampling that the subsampled-RDP bound for sampling without replacement (Wang, Balle &
Kasiviswanathan 2019), and so ``SampledWithoutReplacementEvent`` under replace-one, describes.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp


def uniform_subset(key: jax.Array, n_records: jax.Array | int, size: int) -> jax.Array:
    """``size`` distinct indices drawn uniformly from range(n_records) (Floyd's algorithm).

    Every subset of ``size`` records is equally likely.  Costs O(size²) whatever N is, and N may
    be a traced value, so one compilation serves every data set size.
    """
    n = jnp.asarray(n_records, dtype=jnp.int64)
    keys = jax.random.split(key, size)

    def pick(j, chosen):
        # Floyd: for j = N − size + i, draw t in [0, j]; take t unless already taken, else j.
        upper = n - size + j
        t = jax.random.randint(keys[j], (), 0, upper + 1, dtype=jnp.int64)
        taken = jnp.any((chosen == t) & (jnp.arange(size) < j))
        return chosen.at[j].set(jnp.where(taken, upper, t))

    return jax.lax.fori_loop(0, size, pick, jnp.zeros(size, dtype=jnp.int64))
