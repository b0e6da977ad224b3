"""``algebraic-simplify``: exact algebraic identities, as a table of patterns.

Rewrites: each row of :data:`PATTERNS` matches one op kind and returns the value that replaces
the op (an existing value, or a new op built right before it), or None with no change. The
pass applies the table to a fixed point (bounded) over every code block and erases what died.

Every pattern is *exact* for all inputs, NaN, infinities and signed zeros included; nothing
reassociates floating point. Hence what is deliberately absent: ``x*0 -> 0`` (NaN, inf),
``x-x -> 0``, ``x + (+0.0) -> x`` (``-0.0 + +0.0`` is ``+0.0``; only ``x + (-0.0)`` is an
identity, and ``x - (+0.0)``), and convert chains that narrow before widening. Those near
misses (:data:`NEAR_MISSES`: ops that match a row's shape but not its exactness condition) are
counted by reason in the statistics (``refused[<reason>]``), once, on the simplified module.
Preconditions: none. Invariant: bit-exact results, module verifies, rerunning changes nothing.
"""

from __future__ import annotations

import dataclasses
from typing import Callable

import numpy as np

from jaxlib.mlir import ir

from hlofuse.core import ir as hir
from hlofuse.core.pipeline import Pass
from hlofuse.core.report import Refusals
from hlofuse.passes import graph_util as gu
from hlofuse.passes.fusion.outline import program_blocks

MAX_SWEEPS = 8


@dataclasses.dataclass(frozen=True)
class Pattern:
    name: str
    op: str
    rewrite: Callable  # (op) -> ir.Value | None
    doc: str


# ---------------------------------------------------------------------------------------------
# Value predicates
# ---------------------------------------------------------------------------------------------

def _is_float(v) -> bool:
    dt = gu.info(v).dtype if gu.info(v) else ""
    return dt.startswith(("f", "bf"))


def _is_zero(v, *, negative: bool | None = None) -> bool:
    """Splat zero. For floats, ``negative`` selects -0.0 (True) or +0.0 (False)."""
    s = gu.splat_value(v)
    if s is None or np.asarray(s).dtype.kind == "c":
        return False
    if s != 0:
        return False
    if _is_float(v) and negative is not None:
        return bool(np.signbit(np.float64(s))) == negative
    return True


def _is_one(v) -> bool:
    # complex excluded: (a + bi) * (1 + 0i) is NaN when b is infinite
    s = gu.splat_value(v)
    return s is not None and np.asarray(s).dtype.kind != "c" and bool(s == 1)


def _is_all_ones_bits(v) -> bool:
    s = gu.splat_value(v)
    if s is None:
        return False
    a = np.asarray(s)
    if a.dtype == np.bool_:
        return bool(a)
    if a.dtype.kind in "iu":
        return int(a.astype(a.dtype).view(np.dtype(f"u{a.dtype.itemsize}"))) == (1 << (8 * a.dtype.itemsize)) - 1
    return False


def _same(a, b) -> bool:
    return a == b


def _other(op, pred) -> ir.Value | None:
    """For a commutative binary op: the operand opposite one satisfying ``pred``."""
    a, b = op.operands[0], op.operands[1]
    if pred(b):
        return a
    if pred(a):
        return b
    return None


def _keep_type(op, v):
    return v if v is not None and v.type == op.results[0].type else None


# ---------------------------------------------------------------------------------------------
# Rewrites: op -> replacement value or None
# ---------------------------------------------------------------------------------------------

def _add_zero(op):
    # x + (-0.0) == x for every float x; x + 0 == x for integers.
    def zero(v):
        return _is_zero(v, negative=True) if _is_float(v) else _is_zero(v)
    return _keep_type(op, _other(op, zero))


def _sub_zero(op):
    b = op.operands[1]
    ok = _is_zero(b, negative=False) if _is_float(b) else _is_zero(b)
    return _keep_type(op, op.operands[0] if ok else None)


def _mul_one(op):
    return _keep_type(op, _other(op, _is_one))


def _div_one(op):
    return _keep_type(op, op.operands[0] if _is_one(op.operands[1]) else None)


def _or_zero(op):
    return _keep_type(op, _other(op, lambda v: not _is_float(v) and _is_zero(v)))


def _and_ones(op):
    return _keep_type(op, _other(op, _is_all_ones_bits))


def _idempotent(op):
    a, b = op.operands[0], op.operands[1]
    return _keep_type(op, a) if _same(a, b) else None


def _repeat_same_constant(op):
    """max(max(x, c), c) -> max(x, c) (relu o relu), same for min; any operand order."""
    for inner_v, c in ((op.operands[0], op.operands[1]), (op.operands[1], op.operands[0])):
        inner = gu.is_op(inner_v, op.name)
        cv = gu.splat_value(c)
        if inner is None or cv is None:
            continue
        for x, c2 in ((inner.operands[0], inner.operands[1]), (inner.operands[1], inner.operands[0])):
            c2v = gu.splat_value(c2)
            if c2v is not None and np.asarray(c2v).tobytes() == np.asarray(cv).tobytes():
                return _keep_type(op, inner_v)
    return None


def _involution(op):
    """neg(neg x) -> x, not(not x) -> x."""
    inner = gu.is_op(op.operands[0], op.name)
    return _keep_type(op, inner.operands[0]) if inner is not None else None


def _abs_abs(op):
    inner = gu.is_op(op.operands[0], op.name)
    return _keep_type(op, op.operands[0]) if inner is not None else None


_transpose = gu.compose_transpose


def _transpose_unit_dims(op):
    # a transpose that only moves size-1 dims keeps the element order: it is a reshape (a
    # bitcast for XLA, and a reshape joins reshape chains and fusion regions)
    x = op.operands[0]
    t = gu.info(x)
    if t is None:
        return None
    perm = gu.i64_array(op, "permutation")
    moved = [p for p in perm if t.shape[p] != 1]
    if moved != sorted(moved) or perm == list(range(len(perm))):
        return None
    return gu.create("stablehlo.reshape", [x], [op.results[0].type], before=op).results[0]


def _reshape(op):
    x = op.operands[0]
    inner = gu.is_op(x, "stablehlo.reshape")
    if inner is not None:
        x = inner.operands[0]
    if x.type == op.results[0].type:
        return x
    if inner is not None and gu.info(x) is not None:
        return gu.create("stablehlo.reshape", [x], [op.results[0].type], before=op).results[0]
    return None


def _broadcast(op):
    dims = gu.i64_array(op, "broadcast_dimensions")
    x = op.operands[0]
    inner = gu.is_op(x, "stablehlo.broadcast_in_dim")
    if inner is not None:
        d1 = gu.i64_array(inner, "broadcast_dimensions")
        dims = [dims[d] for d in d1]
        x = inner.operands[0]
    if x.type == op.results[0].type and dims == list(range(len(dims))):
        return x
    if inner is not None:
        return gu.make_broadcast(x, dims, op.results[0].type, before=op)
    return None


def _broadcast_unit_dims(op):
    # a broadcast that only inserts size-1 dims (in order) keeps the element order: it is a
    # reshape (vmapped Equinox convolutions add a unit dim this way and reshape it away, which
    # hid the pair from reshape(reshape(x)) -> x and left layout copies between convolutions)
    x = op.operands[0]
    t, r = gu.info(x), gu.info(op.results[0])
    if t is None or r is None or len(r.shape) == len(t.shape):
        return None
    users = list(hir.users(op.results[0]))
    if users and all(u.name == "stablehlo.broadcast_in_dim" for u in users):
        return None       # B(B(x)) -> B(x) absorbs it (per-channel parameters [C] -> [1, C] -> [N, C])
    dims = gu.i64_array(op, "broadcast_dimensions")
    if dims != sorted(dims) or any(t.shape[i] != r.shape[d] for i, d in enumerate(dims)) or \
            any(r.shape[d] != 1 for d in range(len(r.shape)) if d not in dims):
        return None
    return gu.create("stablehlo.reshape", [x], [op.results[0].type], before=op).results[0]


# Widening conversions that represent every value of the source exactly.
_FLOAT_BITS = {"f16": (11, 5), "bf16": (8, 8), "f32": (24, 8), "f64": (53, 11)}
_INT_BITS = {"i1": (1, False), "i8": (8, True), "i16": (16, True), "i32": (32, True),
             "i64": (64, True), "ui8": (8, False), "ui16": (16, False), "ui32": (32, False),
             "ui64": (64, False)}


def exact_conversion(src: str, dst: str) -> bool:
    """Does every value of ``src`` convert to ``dst`` exactly (so converting back restores it)?"""
    if src == dst:
        return True
    if src in _FLOAT_BITS and dst in _FLOAT_BITS:
        (ms, es), (md, ed) = _FLOAT_BITS[src], _FLOAT_BITS[dst]
        return md >= ms and ed >= es
    if src in _INT_BITS and dst in _INT_BITS:
        (bs, ss), (bd, sd) = _INT_BITS[src], _INT_BITS[dst]
        if src == "i1":
            return True
        if ss and not sd:
            return False
        return bd > bs if (sd and not ss) else bd >= bs
    if src in _INT_BITS and dst in _FLOAT_BITS:
        bits, signed = _INT_BITS[src]
        magnitude_bits = bits - 1 if signed else bits
        return _FLOAT_BITS[dst][0] >= magnitude_bits
    return False


def _convert(op):
    x = op.operands[0]
    if x.type == op.results[0].type:
        return x
    inner = gu.is_op(x, "stablehlo.convert")
    if inner is None:
        return None
    a, b = gu.info(inner.operands[0]), gu.info(x)
    c = gu.info(op.results[0])
    if a is None or b is None or c is None or not exact_conversion(a.dtype, b.dtype):
        return None
    src = inner.operands[0]
    if src.type == op.results[0].type:
        return src
    return gu.create("stablehlo.convert", [src], [op.results[0].type], before=op).results[0]


#: (exponent bits, mantissa bits) of each IEEE float type (not ml_dtypes' finfo: the f8 "fn"
#: types have no infinity, so reduce_precision to their own bits would round their largest
#: values to inf)
FLOAT_FORMATS = {"f64": (11, 52), "f32": (8, 23), "bf16": (8, 7), "f16": (5, 10)}


def _reduce_precision(op):
    """``reduce_precision`` to a format with at least the operand type's exponent and mantissa
    bits rounds nothing (every value, NaN and denormals included, is representable): jax 0.12.1
    writes ``reduce_precision[8, 23]`` of f32 values at ``jax.checkpoint``'s boundaries."""
    info = gu.info(op.operands[0])
    own = FLOAT_FORMATS.get(info.dtype) if info is not None else None
    if own is None:
        return None
    bits = (ir.IntegerAttr(op.attributes["exponent_bits"]).value,
            ir.IntegerAttr(op.attributes["mantissa_bits"]).value)
    return op.operands[0] if bits[0] >= own[0] and bits[1] >= own[1] else None


def _select(op):
    p, a, b = op.operands
    if a == b:
        return _keep_type(op, a)
    s = gu.splat_value(p)
    if s is None:
        return None
    return _keep_type(op, a if bool(s) else b)


def _slice(op):
    t = gu.info(op.operands[0])
    if t is None or op.operands[0].type != op.results[0].type:
        return None
    if gu.i64_array(op, "strides") == [1] * len(t.shape) and \
            gu.i64_array(op, "start_indices") == [0] * len(t.shape):
        return op.operands[0]
    return None


def _pad(op):
    if op.operands[0].type != op.results[0].type:
        return None
    if all(v == 0 for k in ("edge_padding_low", "edge_padding_high", "interior_padding")
           for v in gu.i64_array(op, k)):
        return op.operands[0]
    return None


def _concatenate(op):
    return _keep_type(op, op.operands[0]) if len(op.operands) == 1 else None


def _reverse(op):
    t = gu.info(op.operands[0])
    dims = gu.i64_array(op, "dimensions")
    if t is not None and all(t.shape[d] == 1 for d in dims):
        return _keep_type(op, op.operands[0])
    inner = gu.is_op(op.operands[0], "stablehlo.reverse")
    if inner is not None and sorted(gu.i64_array(inner, "dimensions")) == sorted(dims):
        return _keep_type(op, inner.operands[0])
    return None


def _dot_no_contraction(op):
    # every output element of a dot_general that contracts nothing is one product, so it is a
    # multiply of the operands broadcast to the output (XLA's own simplifier does the same).
    # Flax's and Transformers' attention scale probabilities by a per-head mask this way
    # (einsum "...hqk,h->...hqk" with a mask of ones): as a multiply, x * 1 removes it and
    # the attention matcher sees softmax -> P·V
    if "algorithm" in op.attributes:
        return None
    lb, rb, lc, rc, lf, rf = gu.dot_parts(op)
    if lc or rc:
        return None
    a, b, r = (gu.info(v) for v in (op.operands[0], op.operands[1], op.results[0]))
    if a is None or b is None or r is None or a.dtype != b.dtype or a.dtype.startswith("complex") \
            or not exact_conversion(a.dtype, r.dtype) or (a.dtype in _FLOAT_BITS) != (r.dtype in _FLOAT_BITS):
        return None
    out_of = [{d: i for i, d in enumerate(lb)} | {d: len(lb) + k for k, d in enumerate(lf)},
              {d: i for i, d in enumerate(rb)} | {d: len(lb) + len(lf) + k for k, d in enumerate(rf)}]
    et = gu.element_type(op.results[0])
    sides = []
    for v, where in zip(op.operands, out_of):
        if gu.element_type(v) != et:
            v = gu.create("stablehlo.convert", [v], [gu.tensor_type(gu.info(v).shape, et)],
                          before=op).results[0]
        dims = [where[d] for d in range(len(gu.info(v).shape))]
        if dims != sorted(dims):
            perm = sorted(range(len(dims)), key=dims.__getitem__)
            v, dims = gu.make_transpose(v, perm, before=op), sorted(dims)
        sides.append(gu.make_broadcast(v, dims, op.results[0].type, before=op))
    return gu.create("stablehlo.multiply", sides, [op.results[0].type], before=op).results[0]


S = "stablehlo."
PATTERNS: list[Pattern] = [
    Pattern("add-neg-zero", S + "add", _add_zero, "x + (-0.0) -> x; integer x + 0 -> x"),
    Pattern("sub-pos-zero", S + "subtract", _sub_zero, "x - (+0.0) -> x; integer x - 0 -> x"),
    Pattern("mul-one", S + "multiply", _mul_one, "x * 1 -> x"),
    Pattern("div-one", S + "divide", _div_one, "x / 1 -> x"),
    Pattern("or-zero", S + "or", _or_zero, "x | 0 -> x"),
    Pattern("xor-zero", S + "xor", _or_zero, "x ^ 0 -> x"),
    Pattern("and-ones", S + "and", _and_ones, "x & ~0 -> x"),
    Pattern("max-self", S + "maximum", _idempotent, "max(x, x) -> x"),
    Pattern("min-self", S + "minimum", _idempotent, "min(x, x) -> x"),
    Pattern("and-self", S + "and", _idempotent, "x & x -> x"),
    Pattern("or-self", S + "or", _idempotent, "x | x -> x"),
    Pattern("max-max-const", S + "maximum", _repeat_same_constant, "max(max(x,c),c) -> max(x,c): relu o relu"),
    Pattern("min-min-const", S + "minimum", _repeat_same_constant, "min(min(x,c),c) -> min(x,c)"),
    Pattern("neg-neg", S + "negate", _involution, "-(-x) -> x"),
    Pattern("not-not", S + "not", _involution, "~~x -> x"),
    Pattern("abs-abs", S + "abs", _abs_abs, "|(|x|)| -> |x|"),
    Pattern("transpose", S + "transpose", _transpose, "identity transpose -> x; T(T(x)) -> one T"),
    Pattern("transpose-unit-dims", S + "transpose", _transpose_unit_dims,
            "transpose moving only size-1 dims -> reshape (e.g. [1,S,D] -> [S,1,D])"),
    Pattern("reshape", S + "reshape", _reshape, "no-op reshape -> x; reshape(reshape(x)) -> reshape(x)"),
    Pattern("broadcast", S + "broadcast_in_dim", _broadcast, "no-op broadcast -> x; B(B(x)) -> B(x)"),
    Pattern("broadcast-unit-dims", S + "broadcast_in_dim", _broadcast_unit_dims,
            "broadcast inserting only size-1 dims -> reshape (e.g. [B,C,H,W] -> [B,1,C,H,W])"),
    Pattern("convert", S + "convert", _convert, "no-op convert -> x; exact widening chain -> one convert"),
    Pattern("reduce-precision-noop", S + "reduce_precision", _reduce_precision,
            "reduce_precision to the operand's own format (or wider) -> x"),
    Pattern("select", S + "select", _select, "select(const p, a, b) -> a|b; select(p, x, x) -> x"),
    Pattern("slice-noop", S + "slice", _slice, "full slice -> x"),
    Pattern("pad-noop", S + "pad", _pad, "zero padding -> x"),
    Pattern("concat-single", S + "concatenate", _concatenate, "concatenate(x) -> x"),
    Pattern("reverse", S + "reverse", _reverse, "reverse of size-1 dims -> x; rev(rev(x)) -> x"),
    Pattern("dot-no-contraction", S + "dot_general", _dot_no_contraction,
            "dot_general contracting nothing -> multiply of broadcasts (one product each)"),
]

_BY_OP: dict[str, list[Pattern]] = {}
for _p in PATTERNS:
    _BY_OP.setdefault(_p.op, []).append(_p)


# ---------------------------------------------------------------------------------------------
# Near misses: the shape of an identity that is not exact for these values or this dtype
# ---------------------------------------------------------------------------------------------

def _near_add(op):
    if _is_float(op.results[0]) and _other(op, lambda v: _is_zero(v, negative=False)) is not None:
        return "x + (+0.0) is not x for x = -0.0"
    return None


def _near_sub(op):
    a, b = op.operands[0], op.operands[1]
    if _is_float(b) and _is_zero(b, negative=True):
        return "x - (-0.0) is not x for x = -0.0"
    if _is_float(a) and _same(a, b):
        return "x - x is not 0 for NaN or infinite x"
    return None


def _near_mul(op):
    if _is_float(op.results[0]) and _other(op, _is_zero) is not None:
        return "x * 0 is not 0 for NaN or infinite x"
    return None


def _near_convert(op):
    inner = gu.is_op(op.operands[0], "stablehlo.convert")
    if inner is None:
        return None
    a, b = gu.info(inner.operands[0]), gu.info(op.operands[0])
    if a is not None and b is not None and not exact_conversion(a.dtype, b.dtype):
        return "convert chain narrows before widening"
    return None


NEAR_MISSES = {S + "add": _near_add, S + "subtract": _near_sub, S + "multiply": _near_mul,
               S + "convert": _near_convert}


def near_misses(module, refused: Refusals) -> None:
    """Add each op left in ``module`` that looks like an identity but is not exact."""
    for block in program_blocks(module, scalar_bodies=True):
        for op in hir.block_ops(block):
            check = NEAR_MISSES.get(op.name)
            if check is None or len(op.results) != 1 or gu.info(op.results[0]) is None:
                continue
            why = check(op)
            if why is not None:
                refused.add("near identity", why, hir.op_location(op))


def simplify(module, counts: dict | None = None) -> int:
    """Apply :data:`PATTERNS` to a fixed point; returns the number of rewrites."""
    counts = counts if counts is not None else {}
    total = 0
    gu.reset_tracking()
    with module.context, ir.Location.unknown():
        for _ in range(MAX_SWEEPS):
            changed = 0
            for block in program_blocks(module, scalar_bodies=True):
                for op in hir.block_ops(block):
                    if not gu.alive(op):
                        continue
                    for pat in _BY_OP.get(op.name, ()):
                        if len(op.results) != 1 or gu.info(op.results[0]) is None:
                            break
                        new = pat.rewrite(op)
                        if new is None:
                            continue
                        if new.type != op.results[0].type:  # never: patterns check types
                            raise hir.IRError(f"pattern {pat.name} changed a type")
                        op.results[0].replace_all_uses_with(new)
                        gu.erase_if_dead([op])
                        counts[pat.name] = counts.get(pat.name, 0) + 1
                        changed += 1
                        break
            total += changed
            if not changed:
                break
        gu.erase_dead_in(program_blocks(module, scalar_bodies=True))
    return total



class AlgebraicSimplify(Pass):
    """See the module docstring."""
    name = "algebraic-simplify"

    def run(self, module, ctx):
        counts: dict = {}
        n = simplify(module, counts)
        refused = Refusals(self.name, outcome="not simplified")
        with module.context:
            near_misses(module, refused)
        return {"rewrites": n, **{k: v for k, v in sorted(counts.items())}, **refused.stats()}
