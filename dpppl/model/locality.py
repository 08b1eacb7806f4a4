"""Proof that a batch computation is record-local: row i of its output reads record i alone.

Per-record gradients bound a record's influence only if each row is computed from that record
alone.  ``vmap`` over single records guarantees it by construction; differentiating the whole
batch at once (forward mode over the batch, several times faster for models with few
parameters) guarantees it only if the computation never mixes records.  :func:`is_record_local`
decides that from the jaxpr of the exact computation that will run, by tracking where each
intermediate array keeps the record axis:

* ``FREE``: the value does not depend on the records at all;
* an axis k: element i along axis k depends on record i only (and on record-free values);
* ``MIXED``: anything else.

Only primitives whose record-locality is certain are followed (elementwise arithmetic,
broadcasting, reshapes that keep the record axis, reductions and contractions over other axes,
gathers from record-free arrays at record-aligned indices, and calls into sub-jaxprs); every
other primitive that reads record data makes the value ``MIXED``.  The test is conservative:
``False`` only means the batch path is not proved safe, and callers then fall back to ``vmap``.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from typing import Any

import jax
from jax.extend.core import Var

#: The value does not depend on any record.
FREE = "free"
#: The value mixes records, or the analysis could not follow it.
MIXED = "mixed"

#: Primitives that act element by element on operands of one shape (scalars broadcast).
ELEMENTWISE = frozenset(
    """
    abs acos acosh add add_any and asin asinh atan atan2 atanh bessel_i0e bessel_i1e cbrt ceil clamp
    conj convert_element_type copy copy_p cos cosh digamma div eq erf erf_inv erfc exp exp2
    expm1 floor ge gt igamma igamma_grad_a igammac imag integer_pow is_finite le lgamma log
    log1p logistic lt max min mul ne neg nextafter not or polygamma pow random_gamma_grad real
    reduce_precision rem round rsqrt select_n sign sin sinh sqrt square stop_gradient sub tan
    tanh xor zeta
    """.split()
)
REDUCTIONS = frozenset(
    "reduce_sum reduce_max reduce_min reduce_prod reduce_and reduce_or argmax argmin".split()
)
CUMULATIVE = frozenset("cumsum cumprod cummax cummin cumlogsumexp".split())


def is_record_local(
    fn: Callable[..., Any], args: Sequence[Any], record_args: Sequence[bool]
) -> bool:
    """Whether row i of every output of ``fn(*args)`` depends on record i only.

    Parameters
    ----------
    fn
        The function, traced at the given arguments (arrays or ``jax.ShapeDtypeStruct``).
    args
        Its positional arguments; each may be a pytree.
    record_args
        For each argument, whether its leaves carry the records on their leading axis (the
        others must not depend on the records).
    """
    closed = jax.make_jaxpr(fn)(*args)
    states = []
    for arg, is_record in zip(args, record_args, strict=True):
        states += [0 if is_record else FREE for _ in jax.tree.leaves(arg)]
    outputs = _propagate(closed.jaxpr, states)
    return all(state == 0 or state == FREE for state in outputs)


def _propagate(jaxpr: Any, states: Sequence[Any]) -> list[Any]:
    env: dict[Any, Any] = {}
    for var, state in zip(jaxpr.invars, states, strict=True):
        env[var] = state
    for var in jaxpr.constvars:
        env[var] = FREE

    def read(atom: Any) -> Any:
        return env.get(atom, FREE) if isinstance(atom, Var) else FREE

    for eqn in jaxpr.eqns:
        ins = [read(v) for v in eqn.invars]
        if all(s == FREE for s in ins):
            outs = [FREE] * len(eqn.outvars)
        else:
            outs = _rule(eqn, ins)
        for var, state in zip(eqn.outvars, outs, strict=True):
            env[var] = state
    return [read(v) for v in jaxpr.outvars]


def _shape(atom: Any) -> tuple[int, ...]:
    return tuple(getattr(atom.aval, "shape", ()))


def _rule(eqn: Any, ins: list[Any]) -> list[Any]:
    """Output states of one equation some of whose inputs depend on the records."""
    name = eqn.primitive.name
    n_out = len(eqn.outvars)
    if MIXED in ins:
        return [MIXED] * n_out
    sub = _sub_jaxpr(eqn)
    if sub is not None:
        return _propagate(sub, ins)
    aligned = [(s, v) for s, v in zip(ins, eqn.invars, strict=True) if s != FREE]
    out_shape = _shape(eqn.outvars[0])
    p = eqn.params
    if name in ELEMENTWISE:
        axis = aligned[0][0]
        size = _shape(aligned[0][1])[axis]
        same = all(s == axis and _shape(v)[axis] == size for s, v in aligned)
        fits = len(out_shape) > axis and out_shape[axis] == size
        return [axis if same and fits else MIXED] * n_out
    if name == "concatenate":
        axis = aligned[0][0]
        same = all(s == axis for s, _ in aligned) and p["dimension"] != axis
        return [axis if same else MIXED]
    if name == "split":
        return [MIXED if p["axis"] == ins[0] else ins[0]] * n_out
    [(axis, var)] = aligned if len(aligned) == 1 else [(MIXED, None)]
    if axis == MIXED:
        return _two_aligned(eqn, ins) if name == "dot_general" else [MIXED] * n_out
    shape = _shape(var)
    if name == "broadcast_in_dim":
        target = p["broadcast_dimensions"][axis]
        return [target if out_shape[target] == shape[axis] else MIXED]
    if name == "reshape":
        return [_reshaped_axis(shape, out_shape, axis)]
    if name == "squeeze":
        dims = [d % len(shape) for d in p["dimensions"]]
        return [MIXED if axis in dims else axis - sum(d < axis for d in dims)]
    if name == "transpose":
        return [list(p["permutation"]).index(axis)]
    if name in REDUCTIONS:
        axes = p["axes"]
        return [MIXED if axis in axes else axis - sum(a < axis for a in axes)] * n_out
    if name in CUMULATIVE:
        return [MIXED if p["axis"] == axis else axis]
    if name == "pad":
        low, high, interior = p["padding_config"][axis]
        return [axis if (low, high, interior) == (0, 0, 0) else MIXED]
    if name == "slice":
        full = p["start_indices"][axis] == 0 and p["limit_indices"][axis] == shape[axis]
        strided = p["strides"] is not None and p["strides"][axis] != 1
        return [axis if full and not strided else MIXED]
    if name == "dot_general":
        return [_dot_axis(eqn, ins)]
    if name == "gather":
        return [_gather_axis(eqn, ins)]
    return [MIXED] * n_out


def _sub_jaxpr(eqn: Any) -> Any:
    """The body of a call-like primitive (``pjit``, ``custom_jvp_call``...), else None."""
    if eqn.primitive.name in ("pjit", "jit", "closed_call", "core_call", "remat", "checkpoint",
                              "custom_jvp_call", "custom_vjp_call", "custom_vjp_call_jaxpr"):
        for key in ("jaxpr", "call_jaxpr", "fun_jaxpr"):
            body = eqn.params.get(key)
            if body is not None:
                return getattr(body, "jaxpr", body)
    return None


def _reshaped_axis(old: tuple[int, ...], new: tuple[int, ...], axis: int) -> Any:
    """Where the record axis lands in a row-major reshape, if it survives as one axis."""
    before, after = math.prod(old[:axis]), math.prod(old[axis + 1 :])
    for j, size in enumerate(new):
        if size == old[axis] and math.prod(new[:j]) == before and math.prod(new[j + 1 :]) == after:
            return j
    return MIXED


def _dot_axis(eqn: Any, ins: list[Any]) -> Any:
    (lc, rc), (lb, rb) = eqn.params["dimension_numbers"]
    lhs_rank, rhs_rank = len(_shape(eqn.invars[0])), len(_shape(eqn.invars[1]))
    lhs_free = [d for d in range(lhs_rank) if d not in lc and d not in lb]
    rhs_free = [d for d in range(rhs_rank) if d not in rc and d not in rb]
    if ins[0] != FREE:
        axis = ins[0]
        if axis in lc:
            return MIXED
        if axis in lb:
            return list(lb).index(axis)
        return len(lb) + lhs_free.index(axis)
    axis = ins[1]
    if axis in rc:
        return MIXED
    if axis in rb:
        return list(rb).index(axis)
    return len(lb) + len(lhs_free) + rhs_free.index(axis)


def _two_aligned(eqn: Any, ins: list[Any]) -> list[Any]:
    """A contraction of two record-aligned operands is local only along a shared batch axis."""
    (lc, rc), (lb, rb) = eqn.params["dimension_numbers"]
    left, right = ins
    if left in lb and right in rb and list(lb).index(left) == list(rb).index(right):
        return [list(lb).index(left)]
    return [MIXED]


def _gather_axis(eqn: Any, ins: list[Any]) -> Any:
    """Rows of a record-free table picked by record-aligned indices stay aligned."""
    operand, indices = ins[:2]
    dims = eqn.params["dimension_numbers"]
    if operand != FREE or getattr(dims, "operand_batching_dims", ()):
        return MIXED
    index_vector_dim = len(_shape(eqn.invars[1])) - 1
    if indices == index_vector_dim:
        return MIXED
    out_rank = len(_shape(eqn.outvars[0]))
    batch_positions = [d for d in range(out_rank) if d not in dims.offset_dims]
    index_axes = [a for a in range(len(_shape(eqn.invars[1]))) if a != index_vector_dim]
    return batch_positions[index_axes.index(indices)]
