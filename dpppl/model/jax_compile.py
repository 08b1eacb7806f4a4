"""Compile PyTensor graphs to pure JAX functions.

PyMC's own ``pymc.sampling.jax.get_jaxified_graph`` does the same, but importing that module
rewrites ``XLA_FLAGS`` process-wide; this is the few lines of it dpppl needs, without that side
effect.  All dpppl graphs run in 64-bit precision: calibrated privacy noise and the noise-aware
post-processing are not accurate enough in 32-bit floats.
"""

from __future__ import annotations

import os
import warnings
from collections.abc import Callable, Sequence
from pathlib import Path

import jax
import pytensor
import pytensor.tensor as pt
from pytensor.compile.mode import JAX as JAX_MODE
from pytensor.compile.sharedvalue import SharedVariable
from pytensor.graph.basic import Variable
from pytensor.graph.fg import FunctionGraph
from pytensor.graph.replace import graph_replace
from pytensor.graph.traversal import graph_inputs
from pytensor.link.jax.dispatch import jax_funcify

from dpppl.user_cache import cache_dir

jax.config.update("jax_enable_x64", True)

#: Compilations shorter than this are not written to the persistent cache (JAX's default: 1 s).
PERSISTENT_CACHE_MIN_COMPILE_SECONDS = 0.0


def enable_compilation_cache(directory: str | os.PathLike | None = None) -> Path | None:
    """Keep compiled XLA programs on disk, so that a new process (the ``dpppl`` command, a TARP
    worker, a notebook kernel) does not compile a model structure again.

    The programs hold the model's structure only: record data are inputs of every compiled
    function, never constants in it.  Called before dpppl compiles its first graph, with the folder
    ``DPPPL_COMPILATION_CACHE`` names, else ``compilation/`` in the user cache folder
    (:func:`dpppl.user_cache.cache_dir`); ``DPPPL_COMPILATION_CACHE=off`` turns it off.  A folder
    the user already gave JAX (``jax_compilation_cache_dir``) is left as it is.

    Parameters
    ----------
    directory
        Where to keep the programs; None for the default above.

    Returns
    -------
    pathlib.Path or None
        The folder in use, or None when the cache is off.
    """
    if jax.config.jax_compilation_cache_dir:
        return Path(jax.config.jax_compilation_cache_dir)
    setting = os.environ.get("DPPPL_COMPILATION_CACHE", "")
    if directory is None and setting.lower() in ("off", "0", "false", "no"):
        return None
    path = Path(directory or setting or cache_dir() / "compilation")
    try:
        path.mkdir(parents=True, exist_ok=True)
    except OSError:
        return None  # a read-only home: run without the cache rather than fail
    jax.config.update("jax_compilation_cache_dir", str(path))
    jax.config.update(
        "jax_persistent_cache_min_compile_time_secs", PERSISTENT_CACHE_MIN_COMPILE_SECONDS
    )
    return path


enable_compilation_cache()


def keep_generated_source(directory: str | os.PathLike | None = None) -> Path | None:
    """Keep the Python source PyTensor generates for each compiled graph in one folder, one file
    per distinct source.

    Left to itself, PyTensor writes that source to a new file in the temporary folder for every
    graph it compiles, and never removes it: a simulation study leaves thousands.  In a folder of
    its own the files are named by their content, so a structure compiled again reuses its file,
    and PyTensor removes files unused for over a month.  Like the compiled programs, the source
    holds the model's structure only (its comments quote constants, and record data are never
    constants).  Called before dpppl compiles its first graph, with ``generated_source/`` in the
    user cache folder; a folder the user already gave PyTensor (``generated_src_dir``) is left as
    it is.

    Parameters
    ----------
    directory
        Where to keep the source; None for the default above.

    Returns
    -------
    pathlib.Path or None
        The folder in use, or None when PyTensor writes temporary files (a PyTensor without the
        option, or a folder that cannot be created).
    """
    current = getattr(pytensor.config, "generated_src_dir", None)
    if current is None:
        return None
    if current:
        return Path(current)
    path = Path(directory or cache_dir() / "generated_source")
    try:
        path.mkdir(parents=True, exist_ok=True)
    except OSError:
        return None
    pytensor.config.generated_src_dir = str(path)
    return path


keep_generated_source()


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
