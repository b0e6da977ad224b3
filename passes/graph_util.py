"""Small IR helpers shared by the cleanup and layout passes (not a pass).

Def-use navigation, constants as numpy values, building ops next to an existing one, and
dead-op removal. Everything crash-prone still goes through :mod:`hlofuse.core.ir` (``safe_erase``).
"""

from __future__ import annotations

import ctypes
import threading
from typing import Iterable, Sequence

import numpy as np

from jaxlib.mlir import ir
from jaxlib.mlir.dialects import stablehlo

from hlofuse.core import ir as hir
from hlofuse.core.ir import as_op, defining_op
from hlofuse.core.ops import EmitError, OpClass, const_value, rule_for

# Op classes whose ops have no side effects: erasable once their results are unused.
_PURE_CLASSES = {OpClass.ELEMENTWISE, OpClass.BROADCAST, OpClass.CONSTANT, OpClass.IOTA,
                 OpClass.DATA_MOVEMENT, OpClass.REDUCTION, OpClass.DOT, OpClass.CONVOLUTION}
_PURE_EXTRA = {"stablehlo.gather", "stablehlo.sort"}



# Python handles of MLIR ops are not unique: erasing an op through one handle leaves other
# handles to it dangling (using them, even ``hash(op)``, which hashes the op's contents, reads
# freed memory). Every erase in these passes goes through :func:`erase_if_dead`, which records
# the op's address here; :func:`alive` consults it before touching the op. Ops created by
# :func:`create` are removed from it (the allocator may reuse an address). Per thread:
# optimizations may run concurrently.
_STATE = threading.local()
_capsule_ptr = ctypes.pythonapi.PyCapsule_GetPointer
_capsule_ptr.restype = ctypes.c_void_p
_capsule_ptr.argtypes = [ctypes.py_object, ctypes.c_char_p]
_CAPSULE_NAME = b"jaxlib.mlir.ir.Operation._CAPIPtr"


def op_key(op) -> int:
    """The address of the ``mlir::Operation`` behind a handle (no dereference)."""
    return _capsule_ptr(as_op(op)._CAPIPtr, _CAPSULE_NAME)


def _erased() -> set:
    if not hasattr(_STATE, "erased"):
        _STATE.erased = set()
    return _STATE.erased


def reset_tracking() -> None:
    """Forget erased ops (call at the start of a pass)."""
    _erased().clear()


def alive(op) -> bool:
    """False for an op erased by these helpers (through any handle)."""
    op = as_op(op)
    try:
        key = op_key(op)
    except RuntimeError:  # the handle itself was invalidated (its op erased through it)
        return False
    if key in _erased():  # check first: reading a dangling handle is undefined
        return False
    try:
        op.name
    except RuntimeError:  # erased through this very handle
        return False
    return True


def is_op(v: ir.Value, name: str) -> ir.Operation | None:
    op = defining_op(v)
    return op if op is not None and op.name == name else None


def info(v: ir.Value) -> hir.TensorInfo | None:
    return hir.tensor_type_info(v.type)


def n_uses(v: ir.Value) -> int:
    return sum(1 for _ in v.uses)


def is_pure(op) -> bool:
    """Side-effect free and region-free (erasing an op with regions would invalidate the
    Python handles of its nested blocks, so those are left to ``canonicalize``)."""
    op = as_op(op)
    if len(op.regions):
        return False
    return rule_for(op.name).cls in _PURE_CLASSES or op.name in _PURE_EXTRA


def count_ops(module: ir.Module, name: str) -> int:
    return sum(1 for op in hir.all_ops(module) if op.name == name)


# ---------------------------------------------------------------------------------------------
# Constants
# ---------------------------------------------------------------------------------------------

def constant_array(v: ir.Value) -> np.ndarray | None:
    """numpy value of ``v`` when it is produced by ``stablehlo.constant`` (else None)."""
    op = is_op(v, "stablehlo.constant")
    if op is None:
        return None
    try:
        return const_value(op)
    except (EmitError, ValueError, TypeError, KeyError):   # not a readable dense constant
        pass
    try:  # i1 splats hold a BoolAttr, which hlofuse.core.ops.const_value does not read
        attr = ir.DenseElementsAttr(op.attributes["value"])
        if attr.is_splat and isinstance(attr.get_splat_value(), ir.BoolAttr):
            t = ir.RankedTensorType(v.type)
            return np.full(tuple(t.shape), ir.BoolAttr(attr.get_splat_value()).value, np.bool_)
    except (ValueError, TypeError, KeyError):   # not a DenseElementsAttr of bools
        pass
    return None


def is_splat_const(v: ir.Value) -> bool:
    op = is_op(v, "stablehlo.constant")
    if op is None:
        return False
    try:
        return ir.DenseElementsAttr(op.attributes["value"]).is_splat
    except (ValueError, TypeError, KeyError):   # no dense value attribute
        return False


def splat_value(v: ir.Value):
    """The scalar every element of ``v`` equals, when ``v`` is a splat constant, a rank-0
    constant, or a ``broadcast_in_dim`` of one; else None. Returned as a numpy scalar."""
    op = defining_op(v)
    if op is None:
        return None
    if op.name == "stablehlo.broadcast_in_dim":
        return splat_value(op.operands[0])
    if op.name != "stablehlo.constant":
        return None
    t = info(v)
    if t is None:
        return None
    if t.size == 1 or is_splat_const(v):
        arr = constant_array(v)
        if arr is None or arr.size == 0:
            return None
        return arr.reshape(-1)[0]
    return None


def dense_attr(arr: np.ndarray, type_: ir.Type) -> ir.DenseElementsAttr:
    """A ``DenseElementsAttr`` of ``type_`` holding ``arr`` (compact splat when uniform)."""
    et = str(ir.RankedTensorType(type_).element_type)
    dt = hir.np_dtype(et)
    arr = np.asarray(arr).astype(dt, copy=False)
    flat = arr.reshape(-1)
    if flat.size > 1 and _uniform(flat):
        flat = flat[:1]
    buf = np.ascontiguousarray(flat if flat.size == 1 else arr)
    if et == "bf16" or et.startswith("f8"):
        buf = buf.view(np.uint16 if buf.dtype.itemsize == 2 else np.uint8)
    return ir.DenseElementsAttr.get(buf, type=type_)


def _uniform(flat: np.ndarray) -> bool:
    first = flat[:1]
    if flat.dtype.kind in "fc" or flat.dtype.name in ("bfloat16",) or flat.dtype.name.startswith("float8"):
        # bitwise comparison: keeps -0.0 vs 0.0 and NaN payloads apart
        b = flat.view(np.dtype(f"u{flat.dtype.itemsize}")) if flat.dtype.kind != "c" else None
        if b is None:
            return bool(np.all(flat.view(np.uint8).reshape(flat.size, -1) ==
                               flat[:1].view(np.uint8).reshape(1, -1)))
        return bool(np.all(b == b[:1]))
    return bool(np.all(flat == first))


def tensor_type(shape: Sequence[int], element_type: ir.Type) -> ir.RankedTensorType:
    return ir.RankedTensorType.get(list(shape), element_type)


def element_type(v: ir.Value) -> ir.Type:
    return ir.RankedTensorType(v.type).element_type


# ---------------------------------------------------------------------------------------------
# Building ops
# ---------------------------------------------------------------------------------------------

def create(name: str, operands: Sequence[ir.Value], result_types: Sequence[ir.Type],
           attributes: dict | None = None, *, before=None, after=None, loc=None) -> ir.Operation:
    """Create an op right before ``before`` or right after ``after`` (an op), or at the start
    of ``after`` when it is a block."""
    if after is not None:
        if isinstance(after, ir.Block):
            ops = list(after.operations)
            ip = ir.InsertionPoint(as_op(ops[0])) if ops else ir.InsertionPoint(after)
        else:
            ip = ir.InsertionPoint.after(as_op(after))
    else:
        ip = ir.InsertionPoint(as_op(before))
    anchor = after if after is not None and not isinstance(after, ir.Block) else before
    if loc is None:
        loc = as_op(anchor).location if anchor is not None else ir.Location.unknown()
    op = ir.Operation.create(name, results=list(result_types), operands=list(operands),
                             attributes=attributes or {}, loc=loc, ip=ip)
    _erased().discard(op_key(op))
    return op


def make_constant(arr: np.ndarray, type_: ir.Type, *, before=None, after=None, loc=None) -> ir.Value:
    return create("stablehlo.constant", [], [type_], {"value": dense_attr(arr, type_)},
                  before=before, after=after, loc=loc).results[0]


def make_splat(value, element_type: ir.Type, shape: Sequence[int], *, before) -> ir.Value:
    """A splat ``stablehlo.constant`` of ``shape`` and ``element_type`` (int or float) holding
    ``value``, built as a splat attribute (no array of its size)."""
    t = tensor_type(shape, element_type)
    scalar = (ir.IntegerAttr.get(element_type, int(value)) if isinstance(element_type, ir.IntegerType)
              else ir.FloatAttr.get(element_type, float(value)))
    return create("stablehlo.constant", [], [t], {"value": ir.DenseElementsAttr.get_splat(t, scalar)},
                  before=before).results[0]


def dot_parts(op) -> tuple[list[int], ...]:
    """A ``dot_general``'s dims: ``(lhs batch, rhs batch, lhs contracting, rhs contracting,
    lhs free, rhs free)``; free dims in operand order (the result is batch, lhs free, rhs
    free)."""
    dn = stablehlo.DotDimensionNumbers(op.attributes["dot_dimension_numbers"])
    lb, rb = list(dn.lhs_batching_dimensions), list(dn.rhs_batching_dimensions)
    lc, rc = list(dn.lhs_contracting_dimensions), list(dn.rhs_contracting_dimensions)
    lr, rr = (len(ir.RankedTensorType(v.type).shape) for v in op.operands[:2])
    lf = [d for d in range(lr) if d not in lb and d not in lc]
    rf = [d for d in range(rr) if d not in rb and d not in rc]
    return lb, rb, lc, rc, lf, rf


def make_transpose(v: ir.Value, perm: Sequence[int], *, before=None, after=None, loc=None) -> ir.Value:
    t = info(v)
    shape = [t.shape[p] for p in perm]
    return create("stablehlo.transpose", [v], [tensor_type(shape, element_type(v))],
                  {"permutation": ir.DenseI64ArrayAttr.get([int(p) for p in perm])},
                  before=before, after=after, loc=loc).results[0]


def make_broadcast(v: ir.Value, dims: Sequence[int], result_type: ir.Type, *, before=None,
                   after=None, loc=None) -> ir.Value:
    return create("stablehlo.broadcast_in_dim", [v], [result_type],
                  {"broadcast_dimensions": ir.DenseI64ArrayAttr.get([int(d) for d in dims])},
                  before=before, after=after, loc=loc).results[0]


def attributes(op, drop: Sequence[str] = ()) -> dict:
    """``op``'s attributes by name, without those named in ``drop``: the attributes of an op
    made in its place (``create``)."""
    names = [str(getattr(a, "name", a)) for a in op.attributes]
    return {n: op.attributes[n] for n in names if n not in drop}


def copy_dialect_attrs(op, made) -> None:
    """Dialect attributes of ``op`` (Shardy's ``sdy.sharding``, frontend attributes) describe
    its result: put them on the ``made`` ops, which have that result's shape."""
    for i in range(len(op.attributes)):
        na = op.attributes[i]
        if "." in na.name:
            for new in made:
                new.operation.attributes[na.name] = na.attr


def make_reduce(x: ir.Value, init: ir.Value, dims: Sequence[int], result_type: ir.Type, *,
                before, reducer: str = "stablehlo.add") -> ir.Value:
    """``reduce(x, init, dims)`` whose body is the binary op ``reducer``, right before
    ``before`` (at its location)."""
    with ir.InsertionPoint(as_op(before)), as_op(before).location:
        red = stablehlo.ReduceOp([result_type], [x], [init], ir.DenseI64ArrayAttr.get([int(d) for d in dims]))
        scalar = tensor_type([], ir.RankedTensorType(x.type).element_type)
        blk = red.regions[0].blocks.append(scalar, scalar)
        with ir.InsertionPoint(blk):
            s = ir.Operation.create(reducer, results=[scalar],
                                    operands=[blk.arguments[0], blk.arguments[1]]).results[0]
            stablehlo.ReturnOp([s])
    return red.results[0]


def make_add_reduce(x: ir.Value, init: ir.Value, dims: Sequence[int], result_type: ir.Type, *,
                    before) -> ir.Value:
    """``reduce(x, init, dims)`` with an ``add`` body, right before ``before``."""
    return make_reduce(x, init, dims, result_type, before=before)


def clone_tree(op, before, in_tree) -> ir.Value:
    """Clone ``op`` and, recursively, the producers of its operands for which ``in_tree(producer)``
    holds, right before ``before`` (producers first); operands from outside the tree are read as
    they are. Returns the clone of ``op``'s result. The originals stay for their other users."""
    mapping: dict = {}

    def go(o, v):
        if o is None or not in_tree(o):
            return v
        if o in mapping:
            return mapping[o]
        args = [go(defining_op(a), a) for a in o.operands]
        with ir.InsertionPoint(as_op(before)), o.location:
            c = o.clone()
        for i, a in enumerate(args):
            c.operands[i] = a
        mapping[o] = c.results[0]
        return c.results[0]
    return go(op, op.results[0])


def i64_array(op, key: str) -> list[int]:
    return [int(x) for x in ir.DenseI64ArrayAttr(op.attributes[key])]


def after_def(v: ir.Value):
    """Where to insert an op that only needs ``v``: right after its definition."""
    op = defining_op(v)
    if op is None:
        return {"after": v.owner}
    return {"after": op}


# ---------------------------------------------------------------------------------------------
# Replacing and erasing
# ---------------------------------------------------------------------------------------------

def replace_op(op, new_values: Sequence[ir.Value]) -> None:
    """Point every use of ``op``'s results at ``new_values``, then erase ``op`` and whatever
    became dead above it."""
    op = as_op(op)
    for old, new in zip(op.results, new_values):
        if old.type != new.type:
            raise hir.IRError(f"internal: replacing {old.type} with {new.type} at {op.name}")
        old.replace_all_uses_with(new)
    erase_if_dead([op])


def erase_if_dead(ops: Iterable) -> int:
    """Erase pure ops without uses, then their operands' producers that became dead."""
    pending = {as_op(o) for o in ops if alive(o)}
    erased = 0
    while pending:
        op = pending.pop()
        if not is_pure(op) or hir.has_uses(op):
            continue
        producers = {defining_op(v) for v in op.operands}
        _erased().add(op_key(op))
        hir.safe_erase(op)
        erased += 1
        pending |= {p for p in producers if p is not None}
    return erased


def erase_dead_in(blocks: Iterable[ir.Block]) -> int:
    """Erase every unused pure op of ``blocks`` (and producers that become dead)."""
    dead = [op for block in blocks for op in hir.block_ops(block)
            if is_pure(op) and not hir.has_uses(op)]
    return erase_if_dead(dead)


def compose_transpose(op):
    """A ``stablehlo.transpose`` of a transpose as one transpose of the inner operand, or that
    operand when the two cancel (same type); None when ``op`` reads no transpose and is not
    the identity. Inserts before ``op``."""
    perm = i64_array(op, "permutation")
    x = op.operands[0]
    inner = is_op(x, "stablehlo.transpose")
    if inner is not None:
        p = i64_array(inner, "permutation")
        perm = [p[q] for q in perm]
        x = inner.operands[0]
    if perm == list(range(len(perm))):
        return (x if x.type == op.results[0].type else None)
    if inner is not None:
        return make_transpose(x, perm, before=op)
    return None


# -- common-subexpression elimination that leaves large recomputable ops alone ------------------
#: attribute that keeps an op out of the upstream CSE (removed before :func:`cse` returns)
CSE_KEEP_ATTR = "hlofuse.cse_keep"
#: :func:`cse`'s ``recompute_bytes`` when left at -1, per target kind (see passes/cse.py)
CSE_RECOMPUTE_BYTES = {"tpu": 1 << 20}


def _recomputable(op) -> bool:
    if op.name == "stablehlo.broadcast_in_dim":
        return True
    try:
        return rule_for(op.name).cls is OpClass.ELEMENTWISE
    except KeyError:
        return False


def _operand_key(v) -> tuple:
    owner = v.owner
    if isinstance(owner, ir.Block):   # a block argument: its block's parent op and position
        return ("arg", as_op(owner.owner), ir.BlockArgument(v).arg_number)
    return ("res", as_op(owner), ir.OpResult(v).result_number)


def cse(module, target_kind: str, recompute_bytes: int = -1, pipeline: str = "cse") -> int:
    """Run the upstream ``pipeline`` (``cse``, or e.g. ``canonicalize,cse``) over ``module``,
    except that elementwise ops and broadcasts with results of at least ``recompute_bytes``
    are not merged (-1: :data:`CSE_RECOMPUTE_BYTES` of ``target_kind``, else 0 = merge
    everything): XLA recomputes such an op in each consumer's fusion, and merged it can be one
    more live buffer (``hlofuse.passes.cse`` has the measurement). They are tagged with a
    unique attribute (MLIR's CSE compares attributes), untagged afterwards. Returns how many
    tagged ops had an identical twin left unmerged."""
    if recompute_bytes < 0:
        recompute_bytes = CSE_RECOMPUTE_BYTES.get(target_kind, 0)
    tagged = 0
    if recompute_bytes > 0:
        with module.context:
            for op in hir.all_ops(module):
                if len(op.results) != 1 or not _recomputable(op):
                    continue
                t = info(op.result)
                if t is not None and t.nbytes >= recompute_bytes:
                    op.attributes[CSE_KEEP_ATTR] = ir.IntegerAttr.get(
                        ir.IntegerType.get_signless(64), tagged)
                    tagged += 1
    hir.run_upstream_passes(module, f"builtin.module({pipeline})")
    if not tagged:
        return 0
    # twins: same op, type and attributes on the same operands, where an operand that is
    # itself a twin counts as its first (what the upstream pass would have merged)
    kept, seen, first = 0, {}, {}
    with module.context:
        for op in hir.all_ops(module):
            if CSE_KEEP_ATTR in op.attributes:
                del op.attributes[CSE_KEEP_ATTR]
                key = (op.name, str(op.result.type),
                       tuple(sorted((n, str(op.attributes[n])) for n in op.attributes)),
                       tuple(first.get(k, k) for k in map(_operand_key, op.operands)))
                me = _operand_key(op.result)
                if key in seen:
                    kept += 1
                    first[me] = seen[key]
                else:
                    seen[key] = me
    return kept
