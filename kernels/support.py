"""What the fused kernels can compute: dtypes, block views, reducers, dot layouts, prologues.

These are facts about the kernel families (:mod:`hlofuse.kernels.elementwise`, ``reduction``,
``matmul_epilogue``, ``horizontal``), so they live with the kernels; the fusion passes ask them
(:mod:`hlofuse.passes.fusion.predicates` builds its membership predicates on them) and the
kernels use them to read a region. Nothing here mutates IR; kernels never import passes.

Every fused kernel sees its iteration domain ``D`` through a 2-D view
``(rows, cols) = (prod(D[:-1]), D[-1])`` and every value inside the region has one *view
class*, which fixes its block shape in the kernel:

  full    (rows, cols)   the domain itself                    block (br, bc)
  row     (rows,)        one value per row (reduction result) block (br, 1)
  col     (cols,)        one value per column (a bias)        block (1, bc)
  scalar  ()             one value                            block (1, 1) or ()

:func:`view_classes` assigns classes by propagating them through the region's ops (derivation
first, shapes only for values no op fixes), so ``rows == cols`` never confuses a bias with a
per-row statistic. The passes use it to decide membership, the kernels to build block specs.
"""

from __future__ import annotations

import dataclasses
import math

from jaxlib.mlir import ir
from jaxlib.mlir.dialects import stablehlo

from hlofuse.core import ir as hir
from hlofuse.core.ops import OpClass, rule_for
from hlofuse.core.target import Target

__all__ = ["KERNEL_DTYPES", "FULL", "ROW", "COL", "SCALAR", "REDUCERS", "PROLOGUE_OPS", "View",
           "ClassError", "value_info", "types_ok", "domain_shape", "broadcast_class",
           "is_splat_constant", "size_of", "reduce_info", "is_column_reduce", "dot_layout", "is_scalar_operand",
           "prologue_member", "view_classes", "extend_classes", "classify_op", "matmul_dims"]

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


_INFO_CACHE: dict = {}
_INFO_CTX: list = [None]


def value_info(v: ir.Value) -> hir.TensorInfo | None:
    """Shape and dtype of ``v``, cached per MLIR type (types are uniqued per context; the cache
    holds one context's types at a time so it never keeps an old context alive for long)."""
    t = v.type
    if t.context is not _INFO_CTX[0]:
        _INFO_CACHE.clear()
        _INFO_CTX[0] = t.context
    info = _INFO_CACHE.get(t, _INFO_CTX)
    if info is _INFO_CTX:
        info = hir.tensor_type_info(t)
        if len(_INFO_CACHE) > 4096:
            _INFO_CACHE.clear()
        _INFO_CACHE[t] = info
    return info


def types_ok(op, target: str) -> str | None:
    allowed = KERNEL_DTYPES[Target.of(target).kind]
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


def is_splat_constant(op) -> bool:
    if op.name != "stablehlo.constant":
        return False
    try:
        return ir.DenseElementsAttr(op.attributes["value"]).is_splat
    except (ValueError, TypeError, KeyError):   # no dense value attribute
        return False


FULL, ROW, COL, SCALAR = "full", "row", "col", "scalar"


# reduce body op -> jnp reduction; the identity is the init value for which no combine is needed
REDUCERS = {
    "stablehlo.add": ("sum", 0),
    "stablehlo.maximum": ("max", -math.inf),
    "stablehlo.minimum": ("min", math.inf),
    "stablehlo.multiply": ("prod", 1),
    "stablehlo.and": ("all", True),
    "stablehlo.or": ("any", False),
}

# prologue ops of a matmul operand: the other operands must be scalars (splat constants or
# broadcast scalars), so the op maps each loaded operand block to a block of the same shape.
PROLOGUE_OPS = {"stablehlo.convert", "stablehlo.multiply", "stablehlo.divide", "stablehlo.negate"}


def size_of(shape) -> int:
    return int(math.prod(shape)) if shape else 1


@dataclasses.dataclass(frozen=True)
class View:
    """The 2-D (rows, cols) view of an iteration domain."""
    rows: int
    cols: int

    @classmethod
    def of(cls, shape) -> "View":
        shape = tuple(shape)
        return cls(size_of(shape[:-1]), shape[-1] if shape else 1)

    def fits(self, cls: str, shape) -> bool:
        """May a value of ``shape`` have view class ``cls``?"""
        shape = tuple(shape)
        n = size_of(shape)
        if cls == SCALAR:
            return n == 1
        if cls == FULL:
            return len(shape) >= 1 and shape[-1] == self.cols and n == self.rows * self.cols
        if cls == ROW:
            return n == self.rows
        if cls == COL:
            return n == self.cols and all(d == 1 for d in shape[:-1]) and (not shape or shape[-1] == self.cols)
        return False

    def guess(self, shape, prefer_col: bool = False) -> str | None:
        """A class for a value no op fixes: scalar, full, then row or col by shape."""
        shape = tuple(shape)
        order = [SCALAR, FULL, COL, ROW] if prefer_col else [SCALAR, FULL, ROW, COL]
        for c in order:
            if self.fits(c, shape):
                if c == ROW and self.fits(COL, shape) and len(shape) >= 2 and shape[-1] == self.cols \
                        and shape[-1] != 1:
                    return COL  # (1, ..., C): leading unit dims and a full last dim read as a column
                return c
        return None


class ClassError(ValueError):
    """The region's values cannot be given consistent view classes."""


def _dims_attr(op, name: str) -> list[int]:
    return list(ir.DenseI64ArrayAttr(op.attributes[name]))


def reduce_info(op) -> tuple[str, object, list[int]] | None:
    """(jnp reducer name, init constant op or None, dimensions) of a single-operand reduce."""
    if op.name != "stablehlo.reduce" or len(op.operands) != 2 or len(op.results) != 1:
        return None
    body = [o.operation for o in op.regions[0].blocks[0].operations]
    if len(body) != 2 or body[0].name not in REDUCERS:
        return None
    blk = op.regions[0].blocks[0]
    a, b = blk.arguments[0], blk.arguments[1]
    if list(body[0].operands) not in ([a, b], [b, a]) or list(body[1].operands) != [body[0].results[0]]:
        return None
    return REDUCERS[body[0].name][0], hir.defining_op(op.operands[1]), _dims_attr(op, "dimensions")


def is_column_reduce(op) -> bool:
    """A single-operand reduce over every dim but the last of a rank >= 2 value: one value
    per column of the (rows, cols) view."""
    ri = reduce_info(op)
    if ri is None:
        return False
    info = value_info(op.operands[0])
    return info is not None and len(info.shape) >= 2 and ri[2] == list(range(len(info.shape) - 1))


def dot_layout(op) -> dict | None:
    """Canonical form of a ``dot_general`` a matmul kernel handles, or None.

    Leading batch dims (same positions in both operands), one contracting dim, lhs free dims
    contiguous, exactly one rhs free dim. Returns ``dict(nb, lhs_t, rhs_t)``: number of batch
    dims, whether the lhs is (K, M) instead of (M, K) and the rhs (N, K) instead of (K, N).
    """
    if op.name != "stablehlo.dot_general":
        return None
    dn = stablehlo.DotDimensionNumbers(op.attributes["dot_dimension_numbers"])
    lb, rb = list(dn.lhs_batching_dimensions), list(dn.rhs_batching_dimensions)
    lc, rc = list(dn.lhs_contracting_dimensions), list(dn.rhs_contracting_dimensions)
    lhs, rhs = value_info(op.operands[0]), value_info(op.operands[1])
    if lhs is None or rhs is None or len(lc) != 1 or len(rc) != 1:
        return None
    nb = len(lb)
    if lb != list(range(nb)) or rb != list(range(nb)):
        return None
    lrank, rrank = len(lhs.shape), len(rhs.shape)
    if rrank - nb != 2 or lrank - nb < 1:
        return None
    if lc[0] == lrank - 1:
        lhs_t = False
    elif lc[0] == nb and lrank - nb == 2:
        lhs_t = True
    else:
        return None
    if rc[0] == nb:
        rhs_t = False
    elif rc[0] == nb + 1:
        rhs_t = True
    else:
        return None
    return {"nb": nb, "lhs_t": lhs_t, "rhs_t": rhs_t}


def conv_groups(op) -> tuple[int, int]:
    """A convolution's ``(feature_group_count, batch_group_count)``, 1 where absent."""
    return tuple(ir.IntegerAttr(op.attributes[k]).value if k in op.attributes else 1
                 for k in ("feature_group_count", "batch_group_count"))


def conv_padding(op) -> list[int]:
    """A convolution's padding as the flat ``[lo, hi, lo, hi, ...]`` list over its spatial dims
    (zeros where absent)."""
    if "padding" in op.attributes:
        return [int(v) for v in ir.DenseIntElementsAttr(op.attributes["padding"])]
    dn = stablehlo.ConvDimensionNumbers(op.attributes["dimension_numbers"])
    return [0] * (2 * len(dn.input_spatial_dimensions))


def conv_filter_size(op) -> tuple | None:
    """A convolution's filter extent along its spatial dims (``(3, 3)``), None if dynamic."""
    w = value_info(op.operands[1])
    if w is None:
        return None
    dn = stablehlo.ConvDimensionNumbers(op.attributes["dimension_numbers"])
    return tuple(w.shape[d] for d in dn.kernel_spatial_dimensions)


def conv_window_reason(op, padding_reason) -> str | None:
    """Why the convolution ``op`` is not a plain sliding window, or None: stride 1, no
    dilation, its padding accepted by ``padding_reason(conv_padding(op)) -> reason | None``,
    one group, no window reversal (checked in that order)."""
    attrs = op.attributes
    for key in ("window_strides", "lhs_dilation", "rhs_dilation"):
        if key in attrs and any(v != 1 for v in ir.DenseI64ArrayAttr(attrs[key])):
            return f"{key} != 1"
    why = padding_reason(conv_padding(op))
    if why is not None:
        return why
    for key, n in zip(("feature_group_count", "batch_group_count"), conv_groups(op)):
        if n != 1:
            return f"{key} != 1"
    if "window_reversal" in attrs and any(bool(v) for v in ir.DenseBoolArrayAttr(attrs["window_reversal"])):
        return "window reversal"
    return None


def matmul_dims(op) -> dict | None:
    """A ``dot_general`` or ``convolution`` as a GEMM: ``dict(batch, m, n, k, dtype)`` (a
    convolution in its im2col view: M = batch x output pixels, N = output features, K = input
    features per group x window), or None for other ops and dynamic shapes."""
    if op.name == "stablehlo.dot_general":
        dn = stablehlo.DotDimensionNumbers(op.attributes["dot_dimension_numbers"])
        lhs, rhs = value_info(op.operands[0]), value_info(op.operands[1])
        if lhs is None or rhs is None:
            return None
        lb, lc = list(dn.lhs_batching_dimensions), list(dn.lhs_contracting_dimensions)
        rb, rc = list(dn.rhs_batching_dimensions), list(dn.rhs_contracting_dimensions)
        return {"batch": size_of([lhs.shape[d] for d in lb]),
                "m": size_of([n for d, n in enumerate(lhs.shape) if d not in lb and d not in lc]),
                "n": size_of([n for d, n in enumerate(rhs.shape) if d not in rb and d not in rc]),
                "k": size_of([lhs.shape[d] for d in lc]), "dtype": lhs.dtype}
    if op.name == "stablehlo.convolution":
        out, ker = value_info(op.results[0]), value_info(op.operands[1])
        if out is None or ker is None:
            return None
        dn = stablehlo.ConvDimensionNumbers(op.attributes["dimension_numbers"])
        cout = ker.shape[dn.kernel_output_feature_dimension]
        return {"batch": 1, "m": out.size // max(cout, 1), "n": cout, "k": ker.size // max(cout, 1),
                "dtype": value_info(op.operands[0]).dtype}
    return None


def is_scalar_operand(v: ir.Value) -> bool:
    """A splat constant, a rank-0 value, or a broadcast of one."""
    info = value_info(v)
    if info is not None and size_of(info.shape) == 1:
        return True
    p = hir.defining_op(v)
    if p is None:
        return False
    if is_splat_constant(p):
        return True
    if p.name == "stablehlo.broadcast_in_dim":
        src = value_info(p.operands[0])
        return src is not None and size_of(src.shape) == 1
    return False


def prologue_member(op, target: str) -> str | None:
    """May ``op`` be a matmul operand prologue (convert, or scaling by a scalar)?"""
    if op.name not in PROLOGUE_OPS:
        return f"'{op.name}' is not a prologue op (convert, scalar multiply/divide, negate)"
    bad = types_ok(op, target)
    if bad:
        return bad
    if op.name in ("stablehlo.multiply", "stablehlo.divide"):
        a, b = op.operands
        if op.name == "stablehlo.divide" and not is_scalar_operand(b):
            return "divide by a non-scalar"
        if not (is_scalar_operand(a) or is_scalar_operand(b)):
            return "scaling by a non-scalar"
    return None


def view_classes(ops: list, view: View, *, seeds: dict | None = None) -> dict:
    """Assign a view class to every value the region's ``ops`` (program order) read or define.

    Args:
      ops: region members (outlined-function body ops or main-body ops), program order.
      view: the (rows, cols) view of the region's domain.
      seeds: classes already known (e.g. dot results: ``full``).
    Returns:
      ``{ir.Value: class}`` for results and for inputs (values defined outside ``ops``).
    Raises:
      ClassError: when no consistent assignment exists (the region must not be formed).
    """
    cls: dict = dict(seeds or {})
    for op in ops:
        classify_op(op, cls, view)
    return cls


def extend_classes(classes: dict, op, view: View) -> dict:
    """``classes`` plus the classes ``op`` fixes (a new dict); raises :class:`ClassError`.

    Used to grow a region one op at a time without re-deriving every class.
    """
    cls = dict(classes)
    classify_op(op, cls, view)
    return cls


def _shape(v) -> tuple:
    info = value_info(v)
    if info is None:
        raise ClassError("dynamic shape")
    return info.shape


def classify_op(op, cls: dict, view: View) -> None:
    """Propagate view classes through one op (updates ``cls`` in place)."""

    def need(v, c):
        have = cls.get(v)
        if have is None:
            s = _shape(v)
            if not view.fits(c, s):
                raise ClassError(f"value of shape {s} cannot be {c}")
            cls[v] = c
        elif have != c and not (have == SCALAR and size_of(_shape(v)) == 1):
            raise ClassError(f"value is both {have} and {c}")

    name = op.name
    if name in ("func.return", "stablehlo.return"):
        return
    if len(op.results) != 1:
        raise ClassError(f"'{name}' has {len(op.results)} results")
    res = op.results[0]
    rshape = _shape(res)
    if name == "stablehlo.constant":
        if not is_splat_constant(op):
            raise ClassError("non-splat constant inside the region")
        r = SCALAR if size_of(rshape) == 1 else view.guess(rshape)
        if r is None:
            raise ClassError("constant shape fits no class")
        _set_result(cls, res, r, rshape)
        return
    if name == "stablehlo.reduce":
        ri = reduce_info(op)
        src = op.operands[0]
        if ri is not None and is_column_reduce(op):
            # over every row: one value per column (e.g. a norm's d(scale), a bias gradient),
            # complete only after the last row block (kernels emit per-block partials)
            need(src, FULL)
            if not view.fits(COL, rshape):
                raise ClassError("column reduction result is not one value per column")
            _set_result(cls, res, COL, rshape)
            return
        if ri is None or ri[2] != [len(_shape(src)) - 1]:
            raise ClassError("not a row reduction")
        need(src, FULL)
        if not view.fits(ROW, rshape):
            raise ClassError("reduction result is not one value per row")
        _set_result(cls, res, ROW, rshape)
        return
    if name == "stablehlo.broadcast_in_dim":
        src = op.operands[0]
        sshape = _shape(src)
        if view.fits(FULL, rshape):
            bc = broadcast_class(op)
            if bc is None:
                raise ClassError("broadcast pattern not expressible in the block view")
            if bc == SCALAR:
                if size_of(sshape) != 1:
                    raise ClassError("scalar broadcast of a non-scalar")
                cls.setdefault(src, SCALAR)
            else:
                need(src, bc)
            _set_result(cls, res, FULL, rshape)
            return
        # a broadcast that only adds unit dims (keepdims (B,S)->(B,S,1), bias (C,)->(1,1,C)):
        # a row value must map to the leading dims, a column value to the trailing ones, or
        # the flattened order would change (a transposed use, which no block view expresses)
        dims = _dims_attr(op, "broadcast_dimensions")
        k = cls.get(src)
        if size_of(sshape) == 1:
            k = cls.setdefault(src, SCALAR) if k is None else k
        if k == SCALAR:
            r = view.guess(rshape, prefer_col=True)
        else:
            only_units = all(rshape[d] == sshape[i] for i, d in enumerate(dims)) and \
                all(rshape[d] == 1 for d in range(len(rshape)) if d not in dims)
            lead = dims == list(range(len(sshape)))
            trail = dims == list(range(len(rshape) - len(sshape), len(rshape)))
            if not only_units:
                raise ClassError(f"broadcast {sshape}->{rshape} expands into a partial shape")
            can_row = lead and view.fits(ROW, sshape) and view.fits(ROW, rshape)
            can_col = trail and view.fits(COL, sshape) and view.fits(COL, rshape)
            if k is None:
                if can_row and can_col:
                    k = COL if (len(rshape) >= 2 and rshape[-1] == view.cols and rshape[-1] != 1) else ROW
                else:
                    k = ROW if can_row else COL if can_col else None
                if k is None:
                    raise ClassError(f"broadcast {sshape}->{rshape} fits no class")
                cls[src] = k
            if (k == ROW and not can_row) or (k == COL and not can_col) or k == FULL:
                raise ClassError(f"broadcast turns a {k} value into shape {rshape} (dims {dims})")
            r = k
        if r is None or r == FULL:
            raise ClassError(f"broadcast result shape {rshape} fits no class")
        _set_result(cls, res, r, rshape)
        return
    if name == "stablehlo.reshape":
        src = op.operands[0]
        k = cls.get(src) or view.guess(_shape(src))
        if k is None or not view.fits(k, rshape):
            raise ClassError(f"reshape to {rshape} leaves the {k} view")
        cls.setdefault(src, k)
        _set_result(cls, res, k, rshape)
        return
    if rule_for(name).cls is not OpClass.ELEMENTWISE:
        raise ClassError(f"'{name}' cannot be evaluated in a block view")
    known = {cls[v] for v in op.operands if v in cls and cls[v] != SCALAR}
    if res in cls and cls[res] != SCALAR:
        known.add(cls[res])
    if len(known) > 1:
        raise ClassError(f"operands of '{name}' have classes {sorted(known)}")
    if known:
        r = known.pop()
    elif size_of(rshape) == 1:
        r = SCALAR
    else:
        r = view.guess(rshape)
    if r is None or not (view.fits(r, rshape) or (r == SCALAR and size_of(rshape) == 1)):
        raise ClassError(f"result of '{name}' (shape {rshape}) fits no class")
    for v in op.operands:
        if v not in cls:
            s = _shape(v)
            cls[v] = SCALAR if (size_of(s) == 1 and r == SCALAR) or s == () else r
    _set_result(cls, res, r, rshape)


def _set_result(cls: dict, res, r: str, rshape) -> None:
    """Record a result's class; a value first seen as a region input must agree."""
    have = cls.get(res)
    if have is not None and have != r and not (SCALAR in (have, r) and size_of(rshape) == 1):
        raise ClassError(f"value is both {have} and {r}")
    cls[res] = r

