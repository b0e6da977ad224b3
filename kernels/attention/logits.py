"""The logit chain (scale, bias, masks, iotas, converts, selects), evaluated blockwise.

Every execution computes the logits of a block by *re-evaluating the region's own ops*
(:attr:`AttentionSpec.steps`) on it: iotas become block positions, broadcasts and transposes
are identities in the label view, every other op is emitted by :func:`hlofuse.core.ops.emit_op`
from the region function's own op. So every mask or bias form the matcher accepts is executed
with the original arithmetic. Also here: facts about the chain that the pass and the kernels
both ask (:func:`mask_select`, :func:`prescale`, :func:`splat_of`), read from the spec's data.
"""

from __future__ import annotations

import functools
import math
from typing import Callable, Sequence

import numpy as np

import jax.numpy as jnp
from jaxlib.mlir import ir

from hlofuse.core import ir as hir
from hlofuse.core.ops import EmitError, const_value, emit_op
from hlofuse.kernels.attention.spec import AttentionSpec, Splat

__all__ = ["F32", "body_ops", "const_arrays", "eval_logits", "splat_of", "mask_select", "prescale",
           "folded_scale"]

F32 = jnp.float32
_LAYOUT_OPS = ("stablehlo.broadcast_in_dim", "stablehlo.transpose", "stablehlo.reshape")


@functools.lru_cache(maxsize=64)
def _parsed(func_text: str):
    module = hir.parse("module {\n" + func_text + "\n}", source="attention region")
    (fn,) = hir.funcs(module)
    return module, tuple(hir.block_ops(fn.regions[0].blocks[0]))


def body_ops(spec: AttentionSpec) -> tuple:
    """The region function's body ops (parsed from ``spec.func_text`` once, in a context of
    their own): what :func:`hlofuse.core.ops.emit_op` and the dense constants are read from."""
    return _parsed(spec.func_text)[1]


def const_arrays(spec: AttentionSpec) -> list:
    """The values of the region's dense constants (``spec.const_sides`` order), numpy."""
    ops = body_ops(spec)
    return [np.asarray(const_value(ops[j])) for j, _ in spec.const_sides]


def splat_of(spec: AttentionSpec, a) -> float | None:
    """The scalar of an operand that is a splat: a literal, or a chain of broadcasts, reshapes
    and converts of a splat constant (the value before any convert)."""
    by_ref = {st.ref: st for st in spec.steps}
    while not isinstance(a, Splat):
        st = by_ref.get(a)
        if st is None or st.name not in _LAYOUT_OPS + ("stablehlo.convert", "stablehlo.constant"):
            return None
        if not st.operands:            # a dense constant
            return None
        a = st.operands[0]
    return a.value


def mask_select(spec: AttentionSpec):
    """(predicate operand, fill) when x == select(pred, logits, fill) (through converts and
    layout ops) with ``pred`` built from iotas and constants only (no region input, not the
    logits): causal and other position masks. Iotas over labels other than Sq and the key are rejected when a table is evaluated."""
    by_ref = {st.ref: st for st in spec.steps}
    x = by_ref.get(spec.x_ref)
    # converts keep -inf / huge fills; layout ops (a transpose of the masked logits, as
    # jax.nn.dot_product_attention's grouped layout has) are identities in the label view
    while x is not None and x.name in ("stablehlo.convert",) + _LAYOUT_OPS:
        x = by_ref.get(x.operands[0])
    if x is None or x.name != "stablehlo.select":
        return None
    pred, _, on_false = x.operands
    fill = splat_of(spec, on_false)
    if fill is None:
        return None
    side_refs = {("arg", i) for i, _ in spec.side_args}
    stack, seen = [pred], set()
    while stack:
        a = stack.pop()
        if isinstance(a, Splat) or a in seen:
            continue
        seen.add(a)
        if a in side_refs or a == spec.s_ref:
            return None
        st = by_ref.get(a)
        if st is None:
            if splat_of(spec, a) is None:
                return None
            continue
        stack.extend(st.operands)
    return pred, fill


def prescale(spec: AttentionSpec):
    """(f, ref) when the logits start with ``s * c`` or ``s / c``, ``c`` a power of two.

    Then ``(f·Q)·Kᵀ`` equals the scaled product bit for bit (scaling by a power of two is exact
    in binary floating point) wherever neither overflows (:func:`folded_scale` says when the
    cpu path scales Q once instead of every logits block); ``ref`` is the scaled product's
    value, seeded into :func:`eval_logits`.
    """
    users = [st for st in spec.steps if spec.s_ref in st.operands]
    if len(users) != 1 or users[0].name not in ("stablehlo.multiply", "stablehlo.divide"):
        return None
    st = users[0]
    a, b = st.operands
    if a == spec.s_ref and b != spec.s_ref:
        c = splat_of(spec, b)
    elif st.name == "stablehlo.multiply" and b == spec.s_ref:
        c = splat_of(spec, a)
    else:
        return None
    if c is None or c == 0 or not math.isfinite(c) or st.dtype != spec.s_dtype:
        return None
    f = c if st.name == "stablehlo.multiply" else 1.0 / c
    if math.frexp(abs(f))[0] != 0.5:
        return None
    return f, st.ref


#: take a power-of-two logit scale of at most 1 into Q (:func:`folded_scale`); off only for an
#: A/B of what the fold saves (``python -m bench.attention_parts --fold``)
CPU_FOLD_SCALE = True


def folded_scale(spec: AttentionSpec):
    """:func:`prescale`'s ``(c, ref)`` where the cpu kernels take the scale into Q once: a
    power of two ``c <= 1`` (``1/sqrt(64)``, say); None where they scale every logits block as
    the program does.

    ``(c·Q)·Kᵀ`` equals ``c·(Q·Kᵀ)`` bit for bit wherever neither overflows. A scale above 1
    is not folded: ``(c·Q)`` or its products can overflow where the program's logits do not
    (×4 on logits of 1e38 - 1e38 = 0 gave NaN for jax.jit's finite output; adversarial round).
    With ``c <= 1`` the folded logits overflow only where the program's do; the one difference
    left is the reverse, where ``Q·Kᵀ`` itself overflows float32 (``D·max|q|·max|k|`` near
    3.4e38) and jax.jit's logits are ±inf (its outputs NaN) while the folded ones are the
    finite products. Guarding that edge exactly (a ``lax.cond`` between a folded and an
    unfolded build) cost 23% more peak memory in a training step's flash forward, scaling every
    logits block 13% and 1.044-1.048x the time (both branches, or the scaled block, held as
    buffers by XLA:CPU; measured, 2-core Zen 4, jax 0.12.1), so it is not done."""
    pre = prescale(spec) if CPU_FOLD_SCALE else None
    return pre if pre is not None and abs(pre[0]) <= 1.0 else None


def _slice_steps(spec: AttentionSpec, ref) -> list:
    """The logit steps ``ref`` depends on, program order."""
    by_ref = {st.ref: st for st in spec.steps}
    need, stack = set(), [ref]
    while stack:
        st = by_ref.get(stack.pop())
        if st is None or st.ref in need:
            continue
        need.add(st.ref)
        stack.extend(a for a in st.operands if not isinstance(a, Splat))
    return [st for st in spec.steps if st.ref in need]


def _side_is_bool(spec: AttentionSpec) -> list:
    ins = [np.dtype(spec.in_dtypes[i]) == np.bool_ for i, _ in spec.side_args]
    ops = body_ops(spec)
    return ins + [hir.tensor_type_info(ops[j].results[0].type).dtype == "i1"
                  for j, _ in spec.const_sides]


def eval_logits(spec: AttentionSpec, s, sides: Sequence, index: Callable[[str], object],
                *, upto=None, upcast_half: bool = False, seed: dict | None = None):
    """Evaluate the region's logit ops on one block.

    ``s``: the QKᵀ block (f32), ``sides``: side blocks (``spec.side_args`` then
    ``spec.const_sides``; None for one not needed), ``index(label)``: positions of ``label`` in
    the block (broadcastable). Every value is an array broadcastable to the block; layout ops
    are identities. Returns the softmax input ``x`` (or the value ``upto``). ``upcast_half``:
    compute 16-bit float ops in f32 and round back (Triton has no bf16 division, for instance).
    ``seed``: values already known (ref -> block), e.g. a scaled QKᵀ (see :func:`prescale`).
    """
    ops = body_ops(spec)
    env = {spec.s_ref: s.astype(hir.np_dtype(spec.s_dtype))}
    side_refs = [("arg", i) for i, _ in spec.side_args] + [("op", j) for j, _ in spec.const_sides]
    for ref, is_bool, blk in zip(side_refs, _side_is_bool(spec), sides):
        if blk is None:
            continue
        if blk.dtype == np.int32 and is_bool:
            blk = blk != 0
        env[ref] = blk

    def value(a):
        if isinstance(a, Splat):
            return jnp.asarray(a.value, hir.np_dtype(a.dtype))
        if a in env:
            return env[a]
        raise EmitError(f"internal: logit operand {a} has no value")

    target = spec.x_ref if upto is None else upto
    if target in env:
        return env[target]
    steps = spec.steps if upto is None else _slice_steps(spec, upto)
    env.update(seed or {})
    for st in steps:
        r, name = st.ref, st.name
        if r in env and name != "stablehlo.constant":
            if r == target:
                return env[target]
            continue
        if name in _LAYOUT_OPS:
            res = value(st.operands[0])
        elif name == "stablehlo.iota":
            op = ops[r[1]]
            d = ir.IntegerAttr(op.attributes["iota_dimension"]).value
            lab = st.dims[d]
            dt = hir.np_dtype(st.dtype)
            res = jnp.zeros((), dt) if lab is None else jnp.asarray(index(lab)).astype(dt)
        elif name == "stablehlo.constant":   # a dense one is a side block; a splat, a literal
            if r not in env and not st.operands:
                raise EmitError(f"internal: dense constant {r} has no block")
            res = env[r] if r in env else value(st.operands[0])
        elif name == "stablehlo.select" and st.dtype == "i1":
            # a select of booleans (jnp.tril of a bool mask) as logic ops, exactly: Mosaic on
            # v5e cannot relayout an i1 select's (bq, bk) vectors ("Invalid relayout")
            p_, a_, b_ = [jnp.asarray(value(a)).astype(bool) for a in st.operands]
            res = (p_ & a_) | (~p_ & b_)
        else:
            args = [value(a) for a in st.operands]
            shape = jnp.broadcast_shapes(*[jnp.shape(a) for a in args])
            args = [jnp.broadcast_to(a, shape) for a in args]
            half = [a.dtype in (jnp.bfloat16, jnp.float16) for a in args]
            op = ops[r[1]]
            if upcast_half and any(half) and name != "stablehlo.convert":
                args = [a.astype(F32) if h else a for a, h in zip(args, half)]
                res = emit_op(op, args)[0].astype(hir.np_dtype(st.dtype))
            else:
                res = emit_op(op, args)[0]
        env[r] = res
        if r == target:
            return res
    raise EmitError("internal: logits not produced by the region's ops")
