"""``quantize-matmul``: quantized matmuls as JAX users write them, turned into integer dots.

Recognizes, on every ``dot_general`` of the user's program:

* **fake-quant** (AQT / qwix style, simulated quantization): both operands are dequantized
  integers, ``convert(q) * scale`` or ``convert(q)`` with ``q`` int8 (or int4), where each scale
  is a scalar or varies only along the operand's free (or batch) dims: per-tensor, per-token and
  per-output-channel scales. Rewritten as an integer dot with the scales applied after the exact
  int32 accumulation::

      dot(f32(qa) * sa, f32(qb) * sb)  ->  f32(dot_i32(qa, qb)) * sa' * sb'

  (``sa'``, ``sb'`` the same scale vectors broadcast over the dot's result). The int8 x int8
  products and their int32 sum are exact (K < 2^17, so the sum cannot overflow); the
  dequantization becomes an epilogue that ``fuse-matmul-epilogue`` fuses with the bias,
  activation and requantization that follow.
* **weight-only** quantization (int8/int4 weights, f32 dequantization): one operand is
  ``convert(w_int) * scale`` with the scale along that operand's free dims; the scale moves past
  the dot (``dot(x, cvt(w) * s) -> dot(x, cvt(w)) * s'``), leaving ``convert`` as a dot prologue
  the matmul kernel applies to each weight tile (cpu/gpu: the weights are read as int8, never
  materialized in bf16; tpu kernels take no int8 vectors, so there XLA converts them; int4
  weights are converted by XLA everywhere).
* **int8 dots already in integer form** (``dot_general`` int8 x int8 -> int32, the way
  ``preferred_element_type=jnp.int32`` code and AQT's serving mode write them) are counted
  (``int8-dot``); ``fuse-matmul-epilogue`` takes them as anchors with their dequant-scale,
  bias, activation and requantize epilogue.

Not rewritten (counted by reason, ``refused[<reason>]``, and noted in the report): scales that
vary along the contracting dim (they do not factor out of the sum), asymmetric dequantization
with a zero point (``(convert(q) - zp) * s``: the dot stays float), integer types
other than int8/int4, K >= 2^17 (int32 accumulation could overflow), a dequantized value
with other users (the float copy would stay live), a dequantization ``q * s`` in bf16 or f16
(the program rounds each product to 16 bits; with the scale past the dot it would not be: off
by up to 0.5 on values of 55 in bf16), a weight-only dot with a 16-bit result (its unscaled
dot would overflow f16), and constant scales so large that a product or a sum could overflow
float32 (``128² K max|sa| max|sb|`` within 4x of the maximum). A fake-quant dot with a 16-bit
result is scaled in f32 and rounded once (the exact sum converted to f16 first overflowed).
Fake-quant written without a ``convert`` to an integer type (``clip(round(x / s)) * s`` in
float) is not matched either: a NaN input would turn into an integer there and no longer
propagate. StableHLO's quantized types
(``!quant.uniform``, ``uniform_quantize``/``uniform_dequantize``) cannot be read at all: jaxlib
0.10.2's MLIR bindings do not register the quant dialect, and :func:`hlofuse.core.ir.parse` says so.

Preconditions: ``inline-calls`` (jnp's ``round``/``clip`` are private calls), ``constant-fold``
(scales of frozen parameters are constants). Runs before ``fuse-matmul-epilogue``.
Scales that are not finite: a run-time scale's result gets ``+ (s - s)`` (NaN where the scale
is inf or NaN, as the float dot's ``inf * 0`` and ``inf - inf`` give; +0 elsewhere), a constant
one that is not finite refuses the rewrite. Not exact where every product of a sum is a
same-signed infinity (no zero operand, one sign): the float dot gives ±inf there, this NaN;
and, for run-time scales, where finite scales are so large (about 1e36) that the float dot's
products overflow and the scaled exact sum does not, or the reverse.
Invariant: the module verifies; rerunning changes nothing (the rewritten dots have integer or
undequantized operands). Not bit-exact: the scale is applied once to the exact integer sum
instead of to each product, tolerance category ``quantize`` of ``hlofuse.runtime.testing.TOLERANCES``.
"""

from __future__ import annotations

import dataclasses

import numpy as np

from jaxlib.mlir import ir
from jaxlib.mlir.dialects import stablehlo as shlo

from hlofuse.core import ir as hir
from hlofuse.core.pipeline import Pass
from hlofuse.core.report import Refusals
from hlofuse.passes import graph_util as gu
from hlofuse.passes.fusion.outline import program_blocks

INT_TYPES = ("i8", "i4")            # quantized storage types a dequant may start from
FLOAT_TYPES = ("f32", "bf16", "f16")
MAX_K = 1 << 17                     # K * 128 * 128 must stay below 2^31 (int32 accumulation)
HALF_TYPES = ("bf16", "f16")


@dataclasses.dataclass
class Dequant:
    """``convert(q) [* scale]`` feeding one dot operand."""
    q: ir.Value                     # the integer tensor
    convert: object                 # the convert op
    mul: object | None              # the scale multiply (None: no scale)
    scale: ir.Value | None          # the scale operand of ``mul`` (same shape as the operand)
    src: ir.Value | None            # the scale's source (scalar or vector) before broadcasting
    dims: tuple                     # operand dims the source varies along (empty: scalar)


def _dims(op) -> dict:
    dn = shlo.DotDimensionNumbers(op.attributes["dot_dimension_numbers"])
    return {"lb": list(dn.lhs_batching_dimensions), "rb": list(dn.rhs_batching_dimensions),
            "lc": list(dn.lhs_contracting_dimensions), "rc": list(dn.rhs_contracting_dimensions)}


def _scale_source(s: ir.Value):
    """(source, operand dims it varies along) of a scale, or a reason string."""
    info = gu.info(s)
    if info is None:
        return "dynamic shape"
    if info.size == 1:
        return s, ()
    op = hir.defining_op(s)
    if op is not None and op.name == "stablehlo.constant" and gu.is_splat_const(s):
        return s, ()
    if op is None or op.name != "stablehlo.broadcast_in_dim":
        return "scale is not a broadcast scalar or vector"
    src = op.operands[0]
    sinfo = gu.info(src)
    bdims = gu.i64_array(op, "broadcast_dimensions")
    varying = [(d, n) for d, n in zip(bdims, sinfo.shape) if n != 1]
    if [d for d, _ in varying] != sorted(d for d, _ in varying):
        return "transposing scale broadcast"
    if any(info.shape[d] != n for d, n in varying):
        return "scale broadcast expands a dim"
    return src, tuple(d for d, _ in varying)


def _is_zero_point(v: ir.Value) -> bool:
    """``convert(q) - zp`` with ``q`` an integer: the asymmetric dequantization form."""
    op = hir.defining_op(v)
    if op is None or op.name != "stablehlo.subtract":
        return False
    c = hir.defining_op(op.operands[0])
    return c is not None and c.name == "stablehlo.convert" and gu.info(c.operands[0]).dtype in INT_TYPES


def match_dequant(v: ir.Value):
    """The :class:`Dequant` feeding ``v``, None when ``v`` is not a dequantized integer, or a
    reason string when it is one that cannot be rewritten."""
    op = hir.defining_op(v)
    if op is None:
        return None
    mul, scale = None, None
    if op.name == "stablehlo.multiply":
        for a, b in ((op.operands[0], op.operands[1]), (op.operands[1], op.operands[0])):
            p = hir.defining_op(a)
            if p is not None and p.name == "stablehlo.convert":
                mul, scale, op = op, b, p
                break
        else:
            if any(_is_zero_point(x) for x in op.operands):
                return "zero-point (asymmetric) dequantization"
            return None
    if op.name != "stablehlo.convert":
        return None
    q = op.operands[0]
    qdt = gu.info(q).dtype
    if qdt.startswith("f") or qdt.startswith("bf") or qdt == "i1":
        return None
    if qdt not in INT_TYPES:
        return f"{qdt} dequantization (only int8/int4)"
    src, dims = None, ()
    if scale is not None:
        got = _scale_source(scale)
        if isinstance(got, str):
            return got
        src, dims = got
    return Dequant(q, op, mul, scale, src, dims)


def _out_dim(d: int, side: int, dn: dict, ranks: tuple) -> int | None:
    """The result dim of operand ``side``'s dim ``d`` (None: contracting)."""
    b, c = (dn["lb"], dn["lc"]) if side == 0 else (dn["rb"], dn["rc"])
    if d in b:
        return b.index(d)
    if d in c:
        return None
    nb = len(dn["lb"])
    lfree = [i for i in range(ranks[0]) if i not in dn["lb"] and i not in dn["lc"]]
    rfree = [i for i in range(ranks[1]) if i not in dn["rb"] and i not in dn["rc"]]
    return nb + lfree.index(d) if side == 0 else nb + len(lfree) + rfree.index(d)


def _apply_scale(y: ir.Value, dq: Dequant, out_dims: tuple, dot) -> ir.Value:
    """``y * broadcast(scale)`` right after ``y``'s definition, in ``y``'s type."""
    out = ir.RankedTensorType(y.type)
    et = out.element_type
    src = dq.src
    sinfo = gu.info(src)
    at = {"before": dot}
    if sinfo.size != 1 and not out_dims:  # a splat constant of the operand's shape
        src = gu.make_constant(np.asarray(gu.splat_value(src)), gu.tensor_type([], gu.element_type(src)), **at)
        sinfo = gu.info(src)
    if sinfo.size != 1 or len(sinfo.shape) != 0:
        if not out_dims:  # a scalar held in a tensor<1x..x1>: make it rank 0
            src = gu.create("stablehlo.reshape", [src], [gu.tensor_type([], gu.element_type(src))], **at).results[0]
        else:
            keep = [n for n in sinfo.shape if n != 1]
            if list(sinfo.shape) != keep:
                src = gu.create("stablehlo.reshape", [src], [gu.tensor_type(keep, gu.element_type(src))],
                                **at).results[0]
    if gu.element_type(src) != et:
        src = gu.create("stablehlo.convert", [src], [gu.tensor_type(gu.info(src).shape, et)], **at).results[0]
    b = gu.make_broadcast(src, list(out_dims), out, **at)
    y = gu.create("stablehlo.multiply", [y, b], [out], **at).results[0]
    if gu.constant_array(src) is None:
        # + (s - s): NaN where a run-time scale is inf or NaN, +0 elsewhere. The float dot
        # multiplies an inf scale by the operand's zeros and sums infinities of both signs
        # (NaN); the exact integer sum times inf does not (±inf; adversarial round). The +0
        # also gives the float dot's +0 where the integer sum is negative and the scale 0.
        # Elementwise on the result, so it joins the matmul's epilogue (constant scales are
        # checked when the dot is rewritten)
        z = gu.create("stablehlo.subtract", [b, b], [out], **at).results[0]
        y = gu.create("stablehlo.add", [y, z], [out], **at).results[0]
    return y


def _scales_bounded(dqs, k: int) -> bool:
    """Whether no product ``(qa·sa)(qb·sb)`` nor any sum of ``k`` of them can overflow float32,
    in either form, where every scale is a constant (run-time scales cannot be bounded here;
    the module docstring says what then differs). A 4x margin below the float32 maximum."""
    bound = 128.0 * 128.0 * k
    for d in dqs:
        if d.mul is None:
            continue
        scale = gu.constant_array(d.src)
        if scale is None:
            return True
        bound *= float(np.max(np.abs(np.asarray(scale, np.float64)), initial=0.0))
    return bound < float(np.finfo(np.float32).max) / 4


def _to_i8(q: ir.Value, before) -> ir.Value:
    if gu.info(q).dtype == "i8":
        return q
    t = gu.tensor_type(gu.info(q).shape, ir.IntegerType.get_signless(8))
    return gu.create("stablehlo.convert", [q], [t], before=before).results[0]


def _single_use(dq: Dequant, dot) -> bool:
    last = dq.mul if dq.mul is not None else dq.convert
    return all(hir.as_op(u.owner) == hir.as_op(dot) for u in last.results[0].uses) and \
        (dq.mul is None or len(list(dq.convert.results[0].uses)) == 1)


def rewrite_dot(dot, refused: Refusals, counts: dict) -> bool:
    """Rewrite one ``dot_general`` if it is a fake-quant or weight-only quantized matmul."""
    where = hir.op_location(dot)
    ops = [gu.info(v) for v in dot.operands]
    out = gu.info(dot.results[0])
    if any(i is None for i in ops) or out is None:
        return False
    if ops[0].dtype == "i8" and ops[1].dtype == "i8" and out.dtype == "i32":
        counts["int8-dot"] = counts.get("int8-dot", 0) + 1
        return False
    if out.dtype not in FLOAT_TYPES:
        return False
    dqs = [match_dequant(v) for v in dot.operands]
    if all(d is None for d in dqs):
        return False
    if "algorithm" in dot.attributes:
        refused.add("quantized dot_general", "dot algorithm set (precision contract of a float dot)", where)
        return False
    for d in dqs:
        if isinstance(d, str):
            refused.add("quantized dot_general", d, where)
            return False
        if d is not None and d.mul is not None and gu.info(d.mul.results[0]).dtype in HALF_TYPES:
            refused.add("quantized dot_general",
                        f"{gu.info(d.mul.results[0]).dtype} dequantization (each q·s is rounded "
                        "to 16 bits, which a scale moved past the dot would not be)", where)
            return False
        scale = gu.constant_array(d.src) if d is not None and d.src is not None else None
        if scale is not None and not np.all(np.isfinite(np.asarray(scale, np.float64))):
            refused.add("quantized dot_general", "scale is not finite (the float dot gives NaN)", where)
            return False
    dn = _dims(dot)
    ranks = (len(ops[0].shape), len(ops[1].shape))
    out_dims = []
    for side, d in enumerate(dqs):
        if d is None:
            out_dims.append(None)
            continue
        mapped = tuple(_out_dim(x, side, dn, ranks) for x in d.dims)
        if any(m is None for m in mapped):
            refused.add("quantized dot_general", "scale varies along the contracting dim", where)
            return False
        if not _single_use(d, dot):
            refused.add("quantized dot_general", "dequantized operand has other users", where)
            return False
        out_dims.append(mapped)
    k = 1
    for x in dn["lc"]:
        k *= ops[0].shape[x]
    both = all(d is not None for d in dqs)
    scaled = any(d is not None and d.mul is not None for d in dqs)
    if not both and scaled and out.dtype in HALF_TYPES:
        refused.add("quantized dot_general", f"{out.dtype} result (the unscaled dot would be "
                    f"rounded, or overflow, in {out.dtype} before its scale)", where)
        return False
    if both and scaled and not _scales_bounded(dqs, k):
        refused.add("quantized dot_general", "constant scales so large that a product or sum "
                    "could overflow float32 (it would in one form and not the other)", where)
        return False
    if both and k >= MAX_K:
        refused.add("quantized dot_general", f"K={k} could overflow int32 accumulation", where)
        return False
    if not both and all(d.mul is None for d in dqs if d is not None):
        return False  # weight-only without a scale: already the prologue form
    if both:
        qa, qb = (_to_i8(d.q, dot) for d in dqs)
        i32 = gu.tensor_type(out.shape, ir.IntegerType.get_signless(32))
        attrs = dict(dot.attributes.items()) if hasattr(dot.attributes, "items") else {a.name: a.attr for a in dot.attributes}
        new = gu.create("stablehlo.dot_general", [qa, qb], [i32], attrs, before=dot).results[0]
        # a 16-bit result is scaled in f32 and rounded once: the exact sum converted to f16
        # first overflowed (65504) where the program's scaled products did not
        wide = gu.tensor_type(out.shape, ir.F32Type.get()) if scaled and out.dtype in HALF_TYPES \
            else dot.results[0].type
        y = gu.create("stablehlo.convert", [new], [wide], before=dot).results[0]
        name = "fake-quant-dot"
    else:
        side = 0 if dqs[0] is not None else 1
        d = dqs[side]
        operands = list(dot.operands)
        operands[side] = d.convert.results[0]
        attrs = dict(dot.attributes.items()) if hasattr(dot.attributes, "items") else {a.name: a.attr for a in dot.attributes}
        y = gu.create("stablehlo.dot_general", operands, [dot.results[0].type], attrs, before=dot).results[0]
        name = "weight-only-scale"
    for d, od in zip(dqs, out_dims):
        if d is not None and d.mul is not None:
            y = _apply_scale(y, d, od, dot)
    if y.type != dot.results[0].type:
        y = gu.create("stablehlo.convert", [y], [dot.results[0].type], before=dot).results[0]
    gu.replace_op(dot, [y])
    counts[name] = counts.get(name, 0) + 1
    return True


class QuantizeMatmul(Pass):
    """See the module docstring."""
    name = "quantize-matmul"

    @dataclasses.dataclass(frozen=True)
    class Options:
        fake_quant: bool = True     # rewrite dots of two dequantized int8 operands as int8 dots
        weight_only: bool = True    # move weight-only dequant scales past the dot

    def run(self, module, ctx):
        gu.reset_tracking()
        counts: dict = {}
        refused = Refusals(self.name, outcome="left in float")
        with module.context, ir.Location.unknown():
            for block in program_blocks(module):
                for op in hir.block_ops(block):
                    if op.name != "stablehlo.dot_general" or not gu.alive(op):
                        continue
                    dqs = [isinstance(match_dequant(v), Dequant) for v in op.operands]
                    off = not self.options.fake_quant if all(dqs) else not self.options.weight_only
                    if any(dqs) and off:
                        refused.add("quantized dot_general", "disabled by option", hir.op_location(op))
                        continue
                    rewrite_dot(op, refused, counts)
        refused.flush(ctx)
        stats = {"rewrites": counts.get("fake-quant-dot", 0) + counts.get("weight-only-scale", 0)}
        stats.update(sorted(counts.items()))
        stats.update(refused.stats())
        return stats
