"""Step 1 of fusion: pure predicates. Can this op join a region of this kind, on this target?

Each predicate returns ``None`` when the op may join, or a short reason when it may not; the
reason ends up in the report for ops that were left alone. Nothing here mutates IR. What a
kernel can compute (dtypes, block views, reducers, dot layouts, prologues) is a fact about the
kernels and lives in :mod:`hlofuse.kernels.support`; the predicates here decide, from those
facts, which ops join which kind of region.
"""

from __future__ import annotations

from jaxlib.mlir import ir

from hlofuse.core.ops import OpClass, rule_for
from hlofuse.core.target import Target
from hlofuse.kernels.support import (broadcast_class, domain_shape, dot_layout, is_column_reduce,
                                     is_splat_constant,
                                     reduce_info, types_ok, value_info)
from hlofuse.kernels.tiling import max_tiled_row_elems

def elementwise_member(op, target: str) -> str | None:
    """May ``op`` be a member of an elementwise (loop) region? None = yes, else the reason."""
    rule = rule_for(op.name)
    if rule.cls not in (OpClass.ELEMENTWISE, OpClass.BROADCAST):
        return f"{rule.cls.value} op"
    if rule.emit is None:
        return "no kernel emitter"
    if len(op.results) != 1 or len(op.regions):
        return "unexpected op structure"
    bad = types_ok(op, target)
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


class Role:
    """What an op may be in a region of a given kind (values of :data:`ROLE_TABLE`)."""
    ANCHOR = "anchor"          # the op the region is built around (reduce, dot_general)
    MEMBER = "member"          # joins on either side of the anchor
    PROLOGUE = "prologue"      # joins only as a producer of the anchor's operands
    EPILOGUE = "epilogue"      # joins only as a consumer of the anchor's result
    NEVER = None


# fusion kind -> op class -> role. Ops of classes not listed never join a region of that kind.
# Per-op refinements (which reducers, which data movement, which prologue ops) follow below.
ROLE_TABLE = {
    "elementwise": {OpClass.ELEMENTWISE: Role.MEMBER, OpClass.BROADCAST: Role.MEMBER},
    "reduction": {OpClass.REDUCTION: Role.ANCHOR, OpClass.ELEMENTWISE: Role.MEMBER,
                  OpClass.BROADCAST: Role.MEMBER, OpClass.DATA_MOVEMENT: Role.MEMBER},
    "matmul_epilogue": {OpClass.DOT: Role.ANCHOR, OpClass.ELEMENTWISE: Role.EPILOGUE,
                        OpClass.BROADCAST: Role.EPILOGUE, OpClass.DATA_MOVEMENT: Role.NEVER},
}

# data-movement ops a reduction region may contain: reshapes that keep the row view
# (e.g. (B,S) -> (B,S,1) for keepdims). Transposes/slices change which element is where.
REDUCTION_DATA_MOVEMENT = {"stablehlo.reshape"}


def role_in(kind: str, op) -> str | None:
    """The role ``op`` may play in a region of ``kind`` (see :data:`ROLE_TABLE`)."""
    cls = rule_for(op.name).cls
    role = ROLE_TABLE.get(kind, {}).get(cls)
    if kind == "reduction" and cls is OpClass.DATA_MOVEMENT and op.name not in REDUCTION_DATA_MOVEMENT:
        return None
    return role


#: why a 16-bit float product stays with XLA: XLA:CPU rounds each partial product to the
#: reduce's own 8 (bf16) or 11 (f16) bits, a kernel's f32 accumulator does not: 0.46 relative
#: for a bf16 product of 1025 values near 1 (adversarial round). 16-bit sums keep their kernel:
#: XLA's is a tree of 32-wide partial sums each rounded to 16 bits, whose error the
#: ``reassociate`` tolerance covers (a bf16 norm backward's d(scale) column sums, from AD).
SIXTEEN_BIT_PRODUCT = "16-bit float product (XLA rounds each partial product to 16 bits)"


def _sixteen_bit_product(op, kind: str) -> str | None:
    info = value_info(op.results[0])
    if kind == "prod" and info is not None and info.dtype in ("bf16", "f16"):
        return SIXTEEN_BIT_PRODUCT
    return None


def reduction_anchor(op, target: str) -> str | None:
    """May ``op`` anchor a reduction region (a row reduction over the last dim)? None = yes."""
    if op.name != "stablehlo.reduce":
        return "not a reduce"
    ri = reduce_info(op)
    if ri is None:
        return "variadic reduce or reducer body is not one add/max/min/mul/and/or"
    _, init, dims = ri
    src = value_info(op.operands[0])
    if src is None:
        return "dynamic shape"
    bad = types_ok(op, target)
    if bad:
        return bad
    if init is None or not is_splat_constant(init):
        return "init value is not a constant"
    if _sixteen_bit_product(op, ri[0]):
        return SIXTEEN_BIT_PRODUCT
    if dims != [len(src.shape) - 1]:
        return f"reduces dims {dims}, not the last dim only (not a row reduction)"
    if src.shape[-1] < 2 or 0 in src.shape:
        return "degenerate row"
    if src.shape[-1] > max_tiled_row_elems(target):
        # (rows longer than max_row_elems are walked in column tiles: kernels.row_tiled)
        return f"row of {src.shape[-1]} elements exceeds the on-chip row limit for {target}"
    return None


def reduction_member(op, target: str) -> str | None:
    """May a non-anchor ``op`` join a reduction region? None = yes (class checks come later)."""
    role = role_in("reduction", op)
    if role is None:
        return f"{rule_for(op.name).cls.value} op"
    if role == Role.ANCHOR:
        if is_column_reduce(op):
            return column_reduce_member(op, target)
        return reduction_anchor(op, target)
    if op.name == "stablehlo.reshape":
        return types_ok(op, target)
    if op.name == "stablehlo.broadcast_in_dim":
        dims = list(ir.DenseI64ArrayAttr(op.attributes["broadcast_dimensions"]))
        if dims != sorted(dims):
            return "transposing broadcast"
        return types_ok(op, target)
    return elementwise_member(op, target)


def column_reduce_member(op, target: str) -> str | None:
    """May a column reduction (over every row: a norm's d(scale)/d(bias), a bias gradient) join
    a reduction region as one of its outputs? None = yes. Never an anchor: it joins the row
    region that computes its operand, whose kernel writes one partial per row block."""
    bad = types_ok(op, target)
    if bad:
        return bad
    ri = reduce_info(op)
    if ri is None or ri[1] is None or not is_splat_constant(ri[1]):
        return "column reduction with a non-constant init"
    if not value_info(op.results[0]).dtype.startswith(("f", "bf")):
        return "column reduction of a non-float value"
    return _sixteen_bit_product(op, ri[0])


def dot_anchor(op, target: str) -> str | None:
    """May ``op`` anchor a matmul-epilogue region? None = yes, else the reason."""
    if op.name != "stablehlo.dot_general":
        return "not a dot_general"
    if dot_layout(op) is None:
        return "dot_general layout not canonical (batch dims leading, one contracting dim, one rhs free dim)"
    out = value_info(op.results[0])
    if 0 in out.shape:
        return "zero-size"
    dts = [value_info(v).dtype for v in op.operands]
    if dts == ["i8", "i8"]:
        # a quantized matmul: int8 operands, exact int32 accumulation (tensor cores and the
        # v5e/v6e MXU take int8; the i8 operands are read by the dot only, so tpu needs no i8
        # vectors)
        t = Target.of(target)
        if t.is_tpu and not t.chip.int8_matmul:
            return (f"int8 matmul: the {t.chip.name} MXU has no int8 mode (Mosaic: unsupported "
                    "matmul RHS type vector<..xi8>)")
        return None if out.dtype == "i32" else f"int8 matmul with a {out.dtype} result (only i32)"
    bad = types_ok(op, target)
    if bad:
        return bad
    for dt in dts:
        if dt not in ("f32", "bf16", "f16"):
            return f"integer or boolean matmul ({dt}; int8 x int8 -> int32 is supported)"
    return None


def epilogue_member(op, target: str) -> str | None:
    """May ``op`` be a matmul epilogue op (elementwise/broadcast over the dot's domain)?"""
    role = role_in("matmul_epilogue", op)
    if role != Role.EPILOGUE:
        return f"{rule_for(op.name).cls.value} op"
    t = Target.of(target)
    if t.is_tpu and t.chip.int8_matmul and op.name == "stablehlo.convert" \
            and value_info(op.results[0]).dtype == "i8" and value_info(op.operands[0]).dtype in ("f32", "i32"):
        # requantization for the next int8 layer: the kernel stores int8 tiles (32-row int8
        # blocks; the matmul family refuses it unless the dot is an int8 dot)
        return None
    return elementwise_member(op, target)

