"""``int8-dot-unsigned``: on cpu, an int8 x int8 -> int32 dot runs in the form this CPU
multiplies fastest: XLA:CPU's unsigned x signed int8 dot with the exact correction for the
shift (x86 VNNI), or signed x signed as written (AMX-INT8, AVX-VNNI-INT8, Arm); large
matrix-vector dots as small matrix products either way.

Why: x86 int8 dot instructions (AVX512-VNNI ``vpdpbusd``, AVX-VNNI) multiply an *unsigned*
8-bit operand by a signed one. XLA:CPU's library (YNNPACK) takes both ``s8 x s8 -> s32`` and
``u8 x s8 -> s32`` dots, and the second runs 2.2-2.7x faster on a 2-core Zen 4 (256x1024 @
1024x4096: 8.7 ms as s8 x s8, 3.2 ms as u8 x s8; the same for batched, transposed-rhs and
8-row forms; ``python -m bench.int8_cpu`` measures it). JAX cannot write that dot (its
lowering converts mixed integer operands to int32 first, which runs at 33 ms), but StableHLO
can. The identity, in int32 arithmetic::

    dot(a, b) = dot(a + 128, b) - 128 * sum_k(b)       a + 128 = bitcast<u8>(a) xor 0x80

is exact: both sides are the same integer sum, and int32 wraps identically on either side.
The correction ``128 * sum_k(b)`` (a vector per output channel) is itself a two-row
``u8 x s8`` dot of a constant against ``b``: it reads the weights once more at memory speed
(XLA folds it for constant weights).

CPUs that multiply signed x signed int8 themselves run the program's dot fastest as written:
on a 2-core Sapphire Rapids (AMX-INT8) the same 256x1024 @ 1024x4096 took 1.36 ms as s8 x s8
and 2.11 ms as u8 x s8. ``shift="auto"`` (the default) therefore shifts only where
:func:`hlofuse.core.hostcpu.int8_signed_native` finds no such feature on the host (XLA:CPU compiles
for the machine it runs on), and says in the report when it kept the signed form;
``"always"``/``"never"`` decide for another machine.

Rewrites (target cpu only; every ``dot_general`` of the module, hlofuse's kernels included,
since a cpu kernel computes its int8 product with the program's own dot): ``dot_general(a: i8,
b: i8) -> i32`` becomes ``dot_general(xor(bitcast_convert(a) -> ui8, 0x80), b) -> i32`` minus
the broadcast correction, keeping the dimension numbers and the precision config. A
matrix-vector dot (one contracting dim, every other dim of one operand of size 1, no batch
dims; the matrix at least ``int8_gemv_pad_min_elems`` elements) is also computed as a product
of ``int8_gemv_rows`` rows whose rows after the first are zeros (XLA:CPU runs an int8
matrix-vector dot in a slow loop: 1x4096 @ 4096x4096 took 26.6 ms on a Zen 4, the two-row
u8 x s8 product 1.6 ms; 15.8 ms on a Sapphire Rapids, the eight-row s8 x s8 product 1.9 ms).
Shifted, only a vector lhs is padded (the shift is the lhs's); kept signed, either side.

Not rewritten: other targets (GPU int8 dots are signed x signed on tensor cores; TPU MXUs
take int8 directly), dots with other operand or result types (u8 operands already are the
fast form; int4, int16), dots carrying an ``algorithm``, and, for the shift, operand forms
XLA:CPU does not give its library kernel (batch dims not leading both operands in the same
order; a transposed lhs matrix against an rhs with several free dims: XLA's own dot requires
equal operand types and fails to compile the mixed dot,
:func:`~hlofuse.passes.dot_f32_accumulate.form_reason`). ``disable=["int8-dot-unsigned"]`` turns it off.

Preconditions: after ``kernelize`` (a cpu kernel's int8 product is a ``dot_general`` in its
function by then) and ``symbol-dce`` (the region functions kernels replaced are gone). The
regions' original functions kernelize keeps for verification and rollback
(kept in the module, :mod:`hlofuse.passes.kernel_table`) are rewritten too (not counted), so a region rolled back to XLA runs
the same fast dot. Invariant: the module verifies; results bit-identical (integer
arithmetic, tolerance category ``exact``). Idempotent: the dots it makes have a ``ui8`` lhs
or a padded vector operand that is no longer a vector.

Statistics: ``rewritten`` (dots shifted), ``matrix_vector_padded`` (dots computed as a few
rows, shifted or not), ``kept_signed`` (when > 0: dots left signed x signed because the host
multiplies them natively), ``refused[<reason>]`` per int8 x int8 dot the shift left as it was
(also a report note).
"""

from __future__ import annotations

import dataclasses
import typing

from jaxlib.mlir import ir
from jaxlib.mlir.dialects import stablehlo

from hlofuse.core import hostcpu
from hlofuse.core import ir as hir
from hlofuse.core.pipeline import Pass
from hlofuse.core.report import Refusals
from hlofuse.passes import graph_util as gu
from hlofuse.passes import kernel_table
from hlofuse.passes.op_forms import form_reason, padded_dot, precision_kw, vector_side

SHIFT = 128   # a + 128 maps int8 [-128, 127] onto uint8 [0, 255]


def is_candidate(op) -> bool:
    """An int8 x int8 ``dot_general`` (whatever its result): the dots this pass looks at."""
    if op.name != "stablehlo.dot_general":
        return False
    types = [hir.tensor_type_info(v.type) for v in (op.operands[0], op.operands[1])]
    return all(t is not None and t.dtype == "i8" for t in types)


def signed_pad_reason(op) -> str | None:
    """None when ``op`` (a candidate) may be computed as a padded signed product: an int32
    result and no ``algorithm``; else why not."""
    out = hir.tensor_type_info(op.results[0].type)
    if out is None or out.dtype != "i32":
        return "result is not int32"
    if "algorithm" in op.attributes:
        return "the dot names its algorithm"
    return None


def rewrite_reason(op) -> str | None:
    """None when ``op`` is an ``i8 x i8 -> i32`` ``dot_general`` the shift rewrites, else why
    not."""
    if not is_candidate(op):
        return "not an int8 x int8 dot_general"
    why = signed_pad_reason(op)
    if why is not None:
        return why
    # a mixed u8 x s8 dot runs only inside XLA:CPU's library kernel; the forms XLA sends to its
    # own dot fail to compile ("SameElementType"), the same forms as for a bf16 x bf16 -> f32 dot
    return form_reason(op)


def _correction(op, rhs, before, kw):
    """``SHIFT * sum_k(rhs)`` as int32, broadcast to ``op``'s result shape.

    Computed as a two-row u8 x s8 dot of a constant lhs filled with ``SHIFT`` against ``rhs``
    (first row kept): XLA:CPU's library runs it at memory speed (0.63 ms for a 1024x4096
    rhs on a 2-core Zen 4), where its int32 column-sum reduce took 4.4 ms."""
    _, rb, _, rc, _, free = gu.dot_parts(op)
    nb = len(rb)
    i32 = ir.IntegerType.get_signless(32)
    u8 = ir.IntegerType.get_unsigned(8)
    r_shape = list(gu.info(rhs).shape)
    c_shape = [r_shape[d] for d in rb] + [2] + [r_shape[d] for d in rc]
    ones = gu.make_splat(SHIFT, u8, c_shape, before=before)
    dn = stablehlo.DotDimensionNumbers.get(
        lhs_batching_dimensions=list(range(nb)), rhs_batching_dimensions=rb,
        lhs_contracting_dimensions=list(range(nb + 1, nb + 1 + len(rc))), rhs_contracting_dimensions=rc)
    p_shape = [r_shape[d] for d in rb] + [2] + [r_shape[d] for d in free]
    with ir.InsertionPoint(hir.as_op(before)):
        sums = stablehlo.DotGeneralOp(gu.tensor_type(p_shape, i32), ones, rhs, dn, **kw).result
    lo = [0] * len(p_shape)
    hi = list(p_shape)
    hi[nb] = 1
    first = gu.create("stablehlo.slice", [sums],
                      [gu.tensor_type(hi, i32)],
                      {"start_indices": ir.DenseI64ArrayAttr.get(lo),
                       "limit_indices": ir.DenseI64ArrayAttr.get(hi),
                       "strides": ir.DenseI64ArrayAttr.get([1] * len(hi))}, before=before).results[0]
    k_shape = [r_shape[d] for d in rb] + [r_shape[d] for d in free]
    row = gu.create("stablehlo.reshape", [first], [gu.tensor_type(k_shape, i32)], before=before).results[0]
    # batch dims lead the result (in rb's order), the rhs free dims end it
    out_rank = len(gu.info(op.results[0]).shape)
    dims = list(range(nb)) + list(range(out_rank - len(free), out_rank))
    return gu.make_broadcast(row, dims, op.results[0].type, before=before)


def rewrite_dot(op, pad_vector: bool, rows: int = 2) -> None:
    """Replace ``op`` (see :func:`rewrite_reason`) by the unsigned-lhs dot minus the correction;
    with ``pad_vector``, its vector lhs computed as ``rows`` rows."""
    with op.context, op.location:
        _rewrite(op, pad_vector, rows)


def pad_signed_dot(op, side: int, rows: int) -> None:
    """Replace the matrix-vector dot ``op`` (operand ``side`` the vector) by the same signed
    dot computed as a ``rows``-row (column) product, sliced back to the first row."""
    with op.context, op.location, ir.InsertionPoint(op):
        i32 = ir.IntegerType.get_signless(32)
        dot, value = padded_dot(op, side, op.operands[0], op.operands[1], i32, rows=rows,
                                **precision_kw(op))
        gu.copy_dialect_attrs(op, [hir.defining_op(value)])
    op.results[0].replace_all_uses_with(value)
    hir.safe_erase(op)


def _rewrite(op, pad_vector: bool, rows: int) -> None:
    lhs, rhs = op.operands[0], op.operands[1]
    shape = list(gu.info(lhs).shape)
    u8 = ir.IntegerType.get_unsigned(8)
    ut = gu.tensor_type(shape, u8)
    bits = gu.create("stablehlo.bitcast_convert", [lhs], [ut], before=op).results[0]
    flip = gu.make_splat(0x80, u8, shape, before=op)
    shifted = gu.create("stablehlo.xor", [bits, flip], [ut], before=op).results[0]
    i32 = ir.IntegerType.get_signless(32)
    with ir.InsertionPoint(op):
        kw = precision_kw(op)
        if pad_vector:
            dot, value = padded_dot(op, 0, shifted, rhs, i32, rows=rows, **kw)
        else:
            dot = stablehlo.DotGeneralOp(op.results[0].type, shifted, rhs,
                                         op.attributes["dot_dimension_numbers"], **kw)
            value = dot.result
    corr = _correction(op, rhs, op, kw)
    out = gu.create("stablehlo.subtract", [value, corr], [op.results[0].type], before=op)
    gu.copy_dialect_attrs(op, [out] + ([] if pad_vector else [dot]))
    op.results[0].replace_all_uses_with(out.results[0])
    hir.safe_erase(op)


class Int8DotUnsigned(Pass):
    """See the module docstring."""
    name = "int8-dot-unsigned"

    @dataclasses.dataclass(frozen=True)
    class Options:
        # "auto": the u8 x s8 form unless the host CPU multiplies s8 x s8 natively
        # (hlofuse.core.hostcpu.int8_signed_native); "always" / "never": regardless of the host
        shift: typing.Literal["auto", "always", "never"] = "auto"
        # a matrix-vector dot whose matrix has at least this many elements is computed as a
        # product of int8_gemv_rows rows; 0 turns that off
        int8_gemv_pad_min_elems: int = 1 << 16
        # 0: the host CPU's best (hlofuse.core.hostcpu.gemv_rows: 8 with AMX tiles, else 2)
        int8_gemv_rows: int = 0

        def __post_init__(self):
            hostcpu.check_rows(self.int8_gemv_rows, "int8_gemv_rows")

    def run(self, module, ctx):
        if not ctx.target.is_cpu:
            return {"rewritten": 0, "matrix_vector_padded": 0}
        native = hostcpu.int8_signed_native()
        shift = self.options.shift == "always" or (self.options.shift == "auto" and native is None)
        rows = hostcpu.rows_option(self.options.int8_gemv_rows)
        refused = Refusals(self.name, outcome="left signed x signed")
        n, padded, kept = self._rewrite_all(module, refused, shift, rows)
        # kernelize kept each kernelized region's original function in the module
        # (hlofuse.passes.kernel_table) for verification and rollback: rewrite those too (not
        # counted), so a region rolled back to XLA (a failed check, a measured decision) runs
        # what this pipeline makes of it
        for rid, k in kernel_table.kernel_funcs(module).items():
            if k.original is None or "xi8>" not in k.original:
                continue
            m = hir.parse(k.original, module.context, source=f"kept region {rid}")
            self._rewrite_all(m, Refusals(self.name), shift, rows)
            (fn,) = hir.funcs(m)
            kernel_table.set_original(module, rid, fn.operation.get_asm(
                enable_debug_info=True, assume_verified=True))
        refused.flush(ctx)
        if kept and self.options.shift == "auto":
            ctx.report.note(f"{self.name}: {kept} int8 x int8 dot(s) kept signed x signed: this "
                            f"CPU multiplies them natively ({native}), faster than the u8 x s8 "
                            f"form of VNNI CPUs (options shift='always' forces that)")
        stats = {"rewritten": n, "matrix_vector_padded": padded, **refused.stats()}
        if kept:
            stats["kept_signed"] = kept
        return stats

    def _rewrite_all(self, module, refused: Refusals, shift: bool,
                     rows: int) -> tuple[int, int, int]:
        """Rewrite every candidate dot of ``module``, shifted to u8 x s8 or not;
        ``(rewritten, matrix_vector_padded, kept_signed)``."""
        lim = self.options.int8_gemv_pad_min_elems
        n = padded = kept = 0
        for op in hir.all_ops(module):
            if not is_candidate(op):
                continue
            if not shift:
                kept += 1
                side = vector_side(op, lim) if lim > 0 and signed_pad_reason(op) is None else None
                if side is not None:
                    pad_signed_dot(op, side, rows)
                    padded += 1
                continue
            why = rewrite_reason(op)
            if why is not None:
                refused.add("int8 dot_general", why, hir.op_location(op))
                continue
            pad = lim > 0 and vector_side(op, lim) == 0
            rewrite_dot(op, pad, rows)
            n += 1
            padded += pad
        return n, padded, kept
