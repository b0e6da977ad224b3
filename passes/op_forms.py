"""Which forms of dots and convolutions the rewrites produce and XLA runs well: shared by the
passes that widen, pad and convert them (``dot-f32-accumulate``, ``int8-dot-unsigned``,
``conv1x1-to-dot``, ``layout-assignment``, ``fuse-matmul-epilogue``), so that no pass imports
another."""

from __future__ import annotations

from jaxlib.mlir import ir
from jaxlib.mlir.dialects import stablehlo

from hlofuse.core import ir as hir
from hlofuse.kernels.support import conv_window_reason, value_info
from hlofuse.passes import graph_util as gu


def form_reason(op) -> str | None:
    """None when XLA:CPU is known to run this dot's operand layout with an f32 result, else why
    not.

    A bf16 x bf16 -> f32 dot runs only inside XLA:CPU's library (YNNPACK) kernel; a dot XLA
    sends to its own Eigen dot instead fails at run time ("Unsupported element type for
    DotThunk::Execute: BF16 x BF16 = F32"), where the bf16 -> bf16 dot it was would have run.
    Which dots reach the library depends on how XLA transposes the operands, so the forms
    allowed here are the ones measured to reach it (tests/passes/test_dot_f32_accumulate.py
    sweeps them): batch dimensions leading both operands in the same order, and, when the
    lhs is one contracting then one free dimension (a transposed matrix), an rhs of one
    contracting and at most one free dimension."""
    lb, rb, lc, rc, _, _ = gu.dot_parts(op)
    nb = len(lb)
    if lb != list(range(nb)) or rb != list(range(nb)):
        return "batch dimensions do not lead both operands in the same order"
    lrank, rrank = (len(hir.tensor_type_info(v.type).shape) for v in op.operands[:2])
    if lrank - nb == 2 and lc == [nb] and rrank - nb > 2:
        return "a transposed lhs matrix with an rhs of several free dimensions"
    return None


def vector_side(op, min_elems: int) -> int | None:
    """0 or 1 when that operand of the dot is a vector (one contracting dim, every other dim
    of size 1, no batch dims) and the other operand is a matrix of at least ``min_elems``
    elements with free dims of its own; None otherwise."""
    lb, rb, lc, rc, _, _ = gu.dot_parts(op)
    if lb or rb or len(lc) != 1 or len(rc) != 1:
        return None
    shapes = [hir.tensor_type_info(v.type).shape for v in op.operands[:2]]
    free = [[d for i, d in enumerate(sh) if i != c[0]] for sh, c in zip(shapes, (lc, rc))]
    for side in (0, 1):
        other = 1 - side
        size = 1
        for d in shapes[other]:
            size *= d
        if all(d == 1 for d in free[side]) and any(d > 1 for d in free[other]) and size >= min_elems:
            return side
    return None


def padded_dot(op, side: int, lhs, rhs, result_element_type, rows: int = 2, **kw):
    """A dot with ``op``'s dimension numbers over ``lhs``/``rhs`` (``op``'s operands or
    same-shaped replacements) whose operand ``side`` (a vector, see :func:`vector_side`) is
    computed as a ``rows``-row (lhs) or ``rows``-column (rhs) matrix, the rows after the first
    zeros; returns ``(dot, value)``: the new dot op and the first row/column reshaped to
    ``op``'s result shape with ``result_element_type``. XLA:CPU runs matrix-vector dots in a
    slow loop and small matrix products in its library GEMM (:func:`hlofuse.core.hostcpu.gemv_rows`
    says how many rows are fastest on this CPU); the first row's sums are the same dot
    products. Inserts before ``op``: call with an insertion point there and a location active."""
    _, _, lc, rc, _, _ = gu.dot_parts(op)
    v, m = (lhs, rhs) if side == 0 else (rhs, lhs)
    vt = ir.RankedTensorType(v.type)
    k = vt.shape[(lc if side == 0 else rc)[0]]
    shape1 = [1, k] if side == 0 else [k, 1]
    v1 = stablehlo.ReshapeOp(ir.RankedTensorType.get(shape1, vt.element_type), v)
    zero = gu.make_splat(0, vt.element_type, [], before=op)
    high = [rows - 1, 0] if side == 0 else [0, rows - 1]
    v2 = stablehlo.PadOp(v1.result, zero, [0, 0], high, [0, 0])
    m_shape = list(ir.RankedTensorType(m.type).shape)
    mc = (rc if side == 0 else lc)[0]
    m_free = [d for i, d in enumerate(m_shape) if i != mc]
    if side == 0:
        dn = stablehlo.DotDimensionNumbers.get(
            lhs_batching_dimensions=[], rhs_batching_dimensions=[],
            lhs_contracting_dimensions=[1], rhs_contracting_dimensions=[mc])
        out2, lo, hi = [rows] + m_free, [0] * (1 + len(m_free)), [1] + m_free
        dot = stablehlo.DotGeneralOp(ir.RankedTensorType.get(out2, result_element_type), v2.result, m, dn, **kw)
    else:
        dn = stablehlo.DotDimensionNumbers.get(
            lhs_batching_dimensions=[], rhs_batching_dimensions=[],
            lhs_contracting_dimensions=[mc], rhs_contracting_dimensions=[0])
        out2, lo, hi = m_free + [rows], [0] * (1 + len(m_free)), m_free + [1]
        dot = stablehlo.DotGeneralOp(ir.RankedTensorType.get(out2, result_element_type), m, v2.result, dn, **kw)
    first = stablehlo.SliceOp(dot.result, lo, hi, [1] * len(hi))
    shape = ir.RankedTensorType(op.results[0].type).shape
    back = stablehlo.ReshapeOp(ir.RankedTensorType.get(shape, result_element_type), first.result)
    return dot, back.result


def precision_kw(op) -> dict:
    return {"precision_config": op.attributes["precision_config"]} if "precision_config" in op.attributes else {}


CONV1X1_ATTR = "hlofuse.conv1x1"   # on a dot made from a 1x1 convolution, until the next pass


def conv1x1_as_dot_reason(op, any_layout: bool = False) -> str | None:
    """None when ``op`` is a convolution that is exactly a matmul over channels (1x1 kernel,
    stride 1, no padding/dilation, one group, NHWC input/output and HWIO kernel; any layout
    with ``any_layout``)."""
    x, w = value_info(op.operands[0]), value_info(op.operands[1])
    if x is None or w is None:
        return "dynamic shape"
    dn = stablehlo.ConvDimensionNumbers(op.attributes["dimension_numbers"])
    rank = len(x.shape)
    spatial = list(range(1, rank - 1))
    if any_layout:
        if any(w.shape[d] != 1 for d in dn.kernel_spatial_dimensions):
            return "not a 1x1 kernel"
    elif not (dn.input_batch_dimension == 0 and dn.input_feature_dimension == rank - 1
            and list(dn.input_spatial_dimensions) == spatial and dn.output_batch_dimension == 0
            and dn.output_feature_dimension == rank - 1 and list(dn.output_spatial_dimensions) == spatial
            and list(dn.kernel_spatial_dimensions) == list(range(rank - 2))
            and dn.kernel_input_feature_dimension == rank - 2 and dn.kernel_output_feature_dimension == rank - 1):
        return "layout is not NHWC/HWIO"
    elif any(d != 1 for d in w.shape[:rank - 2]):
        return f"{'x'.join(map(str, w.shape[:rank - 2]))} kernel (only 1x1 convolutions are matmuls)"
    return conv_window_reason(op, lambda pad: "padded" if any(pad) else None)
