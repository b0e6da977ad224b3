"""Step 1 of fusion: pure predicates. Can this op join a region of this kind, on this target?

Each predicate returns ``None`` when the op may join, or a short reason when it may not; the
reason ends up in the report for ops that were left alone. Nothing here mutates IR.
"""

from __future__ import annotations

from jaxlib.mlir import ir

from hlofuse import ir as hir
from hlofuse.ops import OpClass, rule_for

# Element types a kernel may read or write, per target. 64-bit types are absent because
# TPU has none and jax disables them by default; complex and f8 have no portable kernel path.
KERNEL_DTYPES = {
    "cpu": {"f32", "bf16", "f16", "i32", "i16", "i8", "ui8", "ui16", "ui32", "i1"},
    "gpu": {"f32", "bf16", "f16", "i32", "i16", "i8", "ui8", "ui16", "ui32", "i1"},
    "tpu": {"f32", "bf16", "i32", "i1"},
}

# broadcast_in_dim operand classes an elementwise kernel handles through its 2-D (rows, cols)
# view of the domain: a scalar, a vector along the last dim (bias), a vector along the leading
# dims (per-row statistics), or the full domain.
BCAST_CLASSES = ("scalar", "col", "row", "full")


def value_info(v: ir.Value) -> hir.TensorInfo | None:
    return hir.tensor_type_info(v.type)


def _types_ok(op, target: str) -> str | None:
    allowed = KERNEL_DTYPES[target]
    for v in list(op.operands) + list(op.results):
        info = value_info(v)
        if info is None:
            return "dynamic or unranked shape"
        if info.dtype not in allowed:
            return f"dtype {info.dtype} not supported by {target} kernels"
    return None


def domain_shape(op) -> tuple | None:
    """The iteration domain of an elementwise-region member: its (first) result shape."""
    info = value_info(op.results[0]) if len(op.results) else None
    return info.shape if info else None


def broadcast_class(op) -> str | None:
    """Classify a ``broadcast_in_dim`` against its result's (rows, cols) view, or None."""
    src = value_info(op.operands[0])
    dst = value_info(op.results[0])
    if src is None or dst is None:
        return None
    dims = list(ir.DenseI64ArrayAttr(op.attributes["broadcast_dimensions"]))
    if dims != sorted(dims):
        return None  # a transposing broadcast: leave it to XLA
    rank = len(dst.shape)
    expanded = [1] * rank
    for k, d in enumerate(dims):
        expanded[d] = src.shape[k]
    if any(e not in (1, s) for e, s in zip(expanded, dst.shape)):
        return None
    if all(e == 1 for e in expanded):
        return "scalar"
    if list(expanded) == list(dst.shape):
        return "full"
    if rank >= 1 and all(e == 1 for e in expanded[:-1]) and expanded[-1] == dst.shape[-1]:
        return "col"
    if rank >= 2 and expanded[-1] == 1 and expanded[:-1] == list(dst.shape[:-1]):
        return "row"
    return None


def elementwise_member(op, target: str) -> str | None:
    """May ``op`` be a member of an elementwise (loop) region? None = yes, else the reason."""
    rule = rule_for(op.name)
    if rule.cls not in (OpClass.ELEMENTWISE, OpClass.BROADCAST):
        return f"{rule.cls.value} op"
    if rule.emit is None:
        return "no kernel emitter"
    if len(op.results) != 1 or len(op.regions):
        return "unexpected op structure"
    bad = _types_ok(op, target)
    if bad:
        return bad
    shape = domain_shape(op)
    if shape is None:
        return "dynamic shape"
    if 0 in shape:
        return "zero-size"
    if op.name == "stablehlo.compare" and "compare_type" in op.attributes \
            and "TOTALORDER" in str(op.attributes["compare_type"]):
        return "total-order compare"
    if rule.cls is OpClass.BROADCAST and broadcast_class(op) is None:
        return "broadcast pattern not expressible in the kernel's block view"
    # every operand must be the domain shape, a scalar (select/clamp), or feed a broadcast
    if rule.cls is OpClass.ELEMENTWISE:
        for v in op.operands:
            s = value_info(v).shape
            if s != shape and s != ():
                return "operands of mixed shapes"
    return None


def is_splat_constant(op) -> bool:
    if op.name != "stablehlo.constant":
        return False
    try:
        return ir.DenseElementsAttr(op.attributes["value"]).is_splat
    except Exception:
        return False
