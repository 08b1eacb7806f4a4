"""Compile PyTensor graphs to pure JAX functions.

PyMC's own ``pymc.sampling.jax.get_jaxified_graph`` does the same, but importing that module
rewrites ``XLA_FLAGS`` process-wide; this is the few lines of it dpppl needs, without that side
effect.  All dpppl graphs run in 64-bit precision: calibrated privacy noise and the noise-aware
post-processing are not accurate enough in 32-bit floats.
"""

from __future__ import annotations

import warnings
from collections.abc import Callable, Sequence

import jax
import pytensor.tensor as pt
from pytensor.compile.mode import JAX as JAX_MODE
from pytensor.compile.sharedvalue import SharedVariable
from pytensor.graph.basic import Variable
from pytensor.graph.fg import FunctionGraph
from pytensor.graph.replace import graph_replace
from pytensor.graph.traversal import graph_inputs
from pytensor.link.jax.dispatch import jax_funcify

jax.config.update("jax_enable_x64", True)


def _freeze_shared_variables(outputs: list[Variable], inputs: list[Variable]) -> list[Variable]:
    """Replace the shared variables ``outputs`` depend on by constants holding their values."""
    shared = [
        v
        for v in graph_inputs(outputs, blockers=inputs)
        if isinstance(v, SharedVariable) and v not in inputs
    ]
    if not shared:
        return outputs
    return graph_replace(
        outputs, {v: pt.constant(v.get_value(borrow=False), name=v.name) for v in shared}
    )


def jaxify(inputs: Sequence[Variable], outputs: Sequence[Variable]) -> Callable[..., list]:
    """A JAX function computing ``outputs`` from ``inputs`` (positional arrays in, list out).

    Shared variables left in the graph are compiled in as constants, so every value that changes
    between calls (record data above all) must be among ``inputs``.
    """
    outputs = _freeze_shared_variables(list(outputs), list(inputs))
    fgraph = FunctionGraph(inputs=list(inputs), outputs=outputs, clone=True)
    with warnings.catch_warnings():
        # JAX cannot raise inside traced code, so PyTensor drops parameter checks with a warning;
        # dpppl validates parameters and data before compiling instead.
        warnings.filterwarnings("ignore", message=".*as JAX tracing would remove it.*")
        JAX_MODE.optimizer.rewrite(fgraph)
        return jax_funcify(fgraph)
