"""The one region interpreter: walk a region's ops in program order and emit each with jax.

Every kernel family evaluates its region by re-running the region's own StableHLO ops
(:func:`hlofuse.core.ops.emit_op`). What differs between a Pallas block and a plain-jnp reference is
only how a few ops see their values (broadcasts, splat constants, reshapes, reductions, dots),
so the walk is written once, here, and each caller passes that difference in:

* ``env``: the values known before the walk, keyed by :func:`hlofuse.core.ir.value_key` (build it
  from a region's block arguments with :func:`bind`); it is updated in place.
* ``rules``: ``{op name: rule(op, args) -> [results]}`` for the ops the view changes.
* ``emit``: how every other op is emitted (default :func:`~hlofuse.core.ops.emit_op`; blocks
  broadcast operands to the block shape first, see :mod:`hlofuse.kernels.blockeval`).

Views in use: :data:`REFERENCE_RULES` (whole arrays, the references of every family),
:func:`hlofuse.kernels.elementwise.block_rules` (an elementwise block) and
:func:`hlofuse.kernels.blockeval.block_rules` (the view classes of reduction, matmul-epilogue
and horizontal blocks).
"""

from __future__ import annotations

from typing import Callable, Mapping, Sequence

import numpy as np

import jax.numpy as jnp
from jax import lax
from jaxlib.mlir.dialects import stablehlo

from hlofuse.core import ir as hir
from hlofuse.core.ir import value_key
from hlofuse.core.ops import EmitError, const_value, emit_op, splat_scalar
from hlofuse.kernels.support import REDUCERS, reduce_info

__all__ = ["RETURNS", "Rule", "bind", "interpret", "run_region", "eval_reference", "REFERENCE_RULES",
           "reduce_init", "reduce_with_init"]

RETURNS = ("func.return", "stablehlo.return")

Rule = Callable[[object, list], list]
"""``rule(op, args) -> results``: how one op is evaluated in a view (``args``: operand values)."""


def bind(block, values: Sequence) -> dict:
    """An interpreter environment with ``block``'s arguments bound to ``values`` (in order)."""
    return {value_key(a): x for a, x in zip(block.arguments, values)}


def interpret(ops, env: dict, *, rules: Mapping[str, Rule] | None = None,
              emit: Rule = emit_op) -> list | None:
    """Evaluate ``ops`` (program order) on the values in ``env``.

    Ops whose first result is already in ``env`` are skipped (callers seed values they computed
    themselves, e.g. a matmul's accumulator). Every result is stored in ``env`` under its
    :func:`~hlofuse.core.ir.value_key`.

    Returns:
      the values of the first ``func.return``/``stablehlo.return`` met, or None when ``ops``
      end without one.
    """
    rules = rules or {}
    for op in ops:
        op = op.operation
        if op.name in RETURNS:
            return [env[value_key(v)] for v in op.operands]
        if len(op.results) and value_key(op.results[0]) in env:
            continue
        args = [env[value_key(v)] for v in op.operands]
        rule = rules.get(op.name)
        for r, val in zip(op.results, rule(op, args) if rule else emit(op, args)):
            env[value_key(r)] = val
    return None


def run_region(fn_op, args: Sequence, *, rules: Mapping[str, Rule] | None = None,
               emit: Rule = emit_op) -> list:
    """Evaluate an outlined region function (``func.func``) on ``args``; its returned values."""
    entry = fn_op.regions[0].blocks[0]
    outs = interpret(entry.operations, bind(entry, args), rules=rules, emit=emit)
    if outs is None:
        raise EmitError("region has no return")
    return outs


# ---- reductions with their init value -------------------------------------------------------

_JNP_REDUCE = {"sum": jnp.sum, "max": jnp.max, "min": jnp.min, "prod": jnp.prod,
               "all": jnp.all, "any": jnp.any}
_COMBINE = {"sum": jnp.add, "max": jnp.maximum, "min": jnp.minimum, "prod": jnp.multiply,
            "all": jnp.logical_and, "any": jnp.logical_or}


def reduce_init(op):
    """A ``stablehlo.reduce``'s init value (a 0-d numpy array)."""
    _, init_op, _ = reduce_info(op)
    return const_value(init_op).reshape(())


def _is_identity(kind: str, init) -> bool:
    ident = {k: v for k, v in REDUCERS.values()}[kind]
    v = np.asarray(init)
    if v.dtype == np.bool_:
        return bool(v) == bool(ident)
    with np.errstate(invalid="ignore"):
        return bool(v.astype(np.float64) == ident)


def reduce_with_init(op, x, *, axis, keepdims: bool = False):
    """``x`` reduced over ``axis`` with the reduce's reducer, then combined with its init value
    unless the init is the reducer's identity (the result keeps the reducer's dtype)."""
    kind, _, _ = reduce_info(op)
    init = reduce_init(op)
    r = _JNP_REDUCE[kind](x, axis=axis, keepdims=keepdims)
    if not _is_identity(kind, init):
        r = _COMBINE[kind](jnp.asarray(init, x.dtype), r)
    return r


# ---- the plain-jnp view: whole arrays at their IR shapes -------------------------------------

def _shape(v) -> tuple:
    return hir.tensor_type_info(v.type).shape


def _ref_constant(op, args):
    c = splat_scalar(op)   # read as one scalar, never materialized at the IR shape on the host
    return emit_op(op, args) if c is None else [jnp.full(_shape(op.results[0]), c)]


def _ref_reduce(op, args):
    x = args[0]
    return [reduce_with_init(op, x, axis=tuple(reduce_info(op)[2])).astype(x.dtype)]


def _ref_dot(op, args):
    """A dot on whole arrays, accumulated in f32 and rounded to the result type."""
    dn = stablehlo.DotDimensionNumbers(op.attributes["dot_dimension_numbers"])
    dims = ((tuple(dn.lhs_contracting_dimensions), tuple(dn.rhs_contracting_dimensions)),
            (tuple(dn.lhs_batching_dimensions), tuple(dn.rhs_batching_dimensions)))
    out_dt = hir.np_dtype(hir.tensor_type_info(op.results[0].type).dtype)
    return [lax.dot_general(args[0], args[1], dims, preferred_element_type=jnp.float32).astype(out_dt)]


def _ref_reshape(op, args):
    return [jnp.reshape(args[0], _shape(op.results[0]))]


REFERENCE_RULES: Mapping[str, Rule] = {
    "stablehlo.constant": _ref_constant,
    "stablehlo.reduce": _ref_reduce,
    "stablehlo.dot_general": _ref_dot,
    "stablehlo.reshape": _ref_reshape,
}
"""The reference view: every family's plain-jnp reference evaluates its region with these."""


def eval_reference(fn_op, args: Sequence) -> list:
    """Evaluate an outlined region function on whole arrays with plain jnp (every family's
    reference)."""
    return run_region(fn_op, [jnp.asarray(x) for x in args], rules=REFERENCE_RULES)
