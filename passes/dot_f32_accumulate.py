"""``dot-f32-accumulate``: on cpu, a bf16 x bf16 -> bf16 dot becomes the same dot with an f32
result, rounded to bf16 by a ``convert`` right after it.

Why: XLA:CPU computes a dot with a bf16 *result* by converting both operands to f32 in memory
and running an f32 matmul (its float-normalization), so every bf16 model pays the f32 matmul
plus two operand conversions. A dot with bf16 operands and an f32 result goes to XLA's
library (YNNPACK) bf16 kernel as it is, which on CPUs with bf16 dot instructions (AVX512-BF16:
Zen 4, Sapphire Rapids) runs about twice as fast (256x768 @ 768x3072 on a 2-core Zen 4:
14.9 ms as a bf16 dot, 7.0 ms as bf16 -> f32; see ``bench`` for the zoo's bf16 models).

Rewrites (target cpu only; every ``dot_general`` of the user's program, outside hlofuse's
outlined regions and kernels): ``dot_general(a: bf16, b: bf16) -> bf16`` becomes
``convert(dot_general(a, b) -> f32) -> bf16``, keeping the dimension numbers and the
precision config. A matrix-vector dot (one operand a vector: one contracting dim, all other
dims of size 1, no batch dims; the other a matrix of at least ``gemv_pad_min_elems``
elements) is also computed as a product of a few rows (or columns) whose rows after the first
are zeros, sliced back to the first: XLA:CPU runs a bf16 matrix-vector dot in a slow loop
whatever its result type (1x1024 @ 1024x32000, a decoder's next-token head: 84 ms under
jax.jit, 13.5 ms as two rows on a Zen 4; 29.9 ms and 6.7 ms as eight rows on a Sapphire
Rapids, whose AMX tiles want more rows: ``gemv_rows``, by default
:func:`hlofuse.core.hostcpu.gemv_rows`). The result's consumers see the same bf16 value as
before: XLA's own path also accumulates in f32 and rounds once at the end, so only the order
of the f32 sums may differ (``reassociate``). A later fusion pass sees an f32 dot with a
``convert`` epilogue (the cpu matmul kernel keeps each dot's own result type, so the kernel's
dot is the f32 one).

Not rewritten: other targets (GPU/TPU matmuls already accumulate bf16 in f32 and write bf16;
an f32 result would only double the bytes written), dots whose operands or result are not
all bf16 (f16 has no faster library path on CPU: 27.8 ms either way at the size above; f32
and integer dots are unchanged), bf16 convolutions (an f32 result made a 3x3 56x56x64 NHWC
convolution slower, 11.1 vs 7.6 ms), dots
carrying a dot ``algorithm`` (the user chose the arithmetic), and dots inside hlofuse-made
functions (attention regions own their dots). ``disable=["dot-f32-accumulate"]`` turns the pass off.

Preconditions: calls inlined; after ``fuse-attention`` (attention subgraphs are outlined as
the user wrote them) and before ``conv1x1-to-dot``/``fuse-matmul-epilogue`` (so a matmul
region holds the f32 dot and its convert).
Invariant: the module verifies; results within ``reassociate`` (f32 accumulation order), NaN
and signed zeros as XLA's own f32 accumulation gives them. Infinities too, except where the f32
sum itself overflows part-way (values near 3e38): the library dot adds in another order, so a
sum that overflows in one order may not in the other, and ``inf - inf`` may become NaN
(228 against jax.jit's 231 infinities in an adversarial test). Idempotent: the dots it
makes have an f32 result and are not matched again.

Statistics: ``widened`` (dots rewritten), ``matrix_vector_padded`` (of those, computed as a
few rows/columns).
"""

from __future__ import annotations

import dataclasses

from jaxlib.mlir import ir
from jaxlib.mlir.dialects import stablehlo

from hlofuse.core import hostcpu
from hlofuse.core import ir as hir
from hlofuse.core.pipeline import Pass
from hlofuse.passes import graph_util as gu
from hlofuse.passes.op_forms import form_reason, padded_dot, precision_kw, vector_side
from hlofuse.passes.fusion.outline import program_blocks


def _is_bf16(v) -> bool:
    info = hir.tensor_type_info(v.type)
    return info is not None and info.dtype == "bf16"


def widen_reason(op) -> str | None:
    """None when ``op`` is a bf16 x bf16 -> bf16 ``dot_general`` this pass rewrites, else why not."""
    if op.name != "stablehlo.dot_general":
        return "not a dot_general"
    if not (_is_bf16(op.operands[0]) and _is_bf16(op.operands[1]) and _is_bf16(op.results[0])):
        return "operands and result are not all bf16"
    if "algorithm" in op.attributes:
        return "the dot names its algorithm"
    return form_reason(op)


def widen_dot(op, pad_vector: int | None = None, rows: int = 2):
    """Replace ``op`` (see :func:`widen_reason`) by ``convert(dot_general(...) -> f32)``.

    With ``pad_vector`` (the operand :func:`vector_side` found), that operand becomes a
    ``rows``-row (lhs) or ``rows``-column (rhs) matrix (:func:`padded_dot`): XLA:CPU sends a
    bf16 matrix-vector dot to a slow loop (46 ms for 1x4096 @ 4096x4096 on a 2-core Zen 4,
    either result type) and a two-row one to its library GEMM (7.2 ms)."""
    with op.context, op.location, ir.InsertionPoint(op):
        rt = ir.RankedTensorType(op.results[0].type)
        f32 = ir.RankedTensorType.get(rt.shape, ir.F32Type.get())
        kw = precision_kw(op)
        if pad_vector is None:
            dot = stablehlo.DotGeneralOp(f32, op.operands[0], op.operands[1],
                                         op.attributes["dot_dimension_numbers"], **kw)
            wide = dot.result
            after_dot = []
        else:
            dot, wide = padded_dot(op, pad_vector, op.operands[0], op.operands[1], ir.F32Type.get(),
                                   rows=rows, **kw)
            after_dot = [hir.defining_op(wide)]
        cvt = stablehlo.ConvertOp(rt, wide)
        gu.copy_dialect_attrs(op, ([dot] if pad_vector is None else after_dot) + [cvt])
    op.results[0].replace_all_uses_with(cvt.result)
    hir.safe_erase(op)
    return dot.operation


class DotF32Accumulate(Pass):
    """See the module docstring."""
    name = "dot-f32-accumulate"

    @dataclasses.dataclass(frozen=True)
    class Options:
        # a matrix-vector dot whose matrix has at least this many elements is computed as a
        # two-row (two-column) matrix product; 0 turns that off
        gemv_pad_min_elems: int = 1 << 16
        # rows (columns) of that product; 0: the host CPU's best (hlofuse.core.hostcpu.gemv_rows:
        # 8 with AMX tiles, else 2)
        gemv_rows: int = 0

        def __post_init__(self):
            hostcpu.check_rows(self.gemv_rows)

    def run(self, module, ctx):
        if not ctx.target.is_cpu:
            return {"widened": 0, "matrix_vector_padded": 0}
        n = padded = 0
        lim = self.options.gemv_pad_min_elems
        rows = hostcpu.rows_option(self.options.gemv_rows)
        for block in program_blocks(module):
            for op in [o for o in hir.block_ops(block) if o.name == "stablehlo.dot_general"]:
                if widen_reason(op) is None:
                    side = vector_side(op, lim) if lim > 0 else None
                    widen_dot(op, side, rows)
                    n += 1
                    padded += side is not None
        return {"widened": n, "matrix_vector_padded": padded}
