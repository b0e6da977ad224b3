"""The matching behind ``fuse-attention`` and ``remat-loop-attention``: attention (QKᵀ, a
softmax, PV) recognized in StableHLO, its dims, masks, scales and side inputs, as an
:class:`Attention` and the kernel's :class:`~hlofuse.kernels.attention.AttentionSpec`
(:func:`find_attention`, :func:`region_spec`); the rewrites that expose it (row multipliers
moved, shared side computations and generators copied per use). Both passes read it; neither
imports the other. The matching rules are described in :mod:`hlofuse.passes.attention.fuse`.
"""

from __future__ import annotations

import dataclasses
import heapq
import itertools
import math

from jaxlib.mlir import ir
from jaxlib.mlir.dialects import stablehlo

from hlofuse.core import ir as hir
from hlofuse.core.ops import EmitError, OpClass, rule_for, splat_scalar
from hlofuse.kernels.attention import (AttentionSpec, LogitStep, Repeat, Splat, mask_select)
from hlofuse.kernels.support import is_splat_constant
from hlofuse.passes import graph_util as gu

__all__ = ["NoMatch", "Attention", "analyze", "find_attention", "region_spec", "FuseAttention"]

KIND = "attention"
BCAST = "<bcast>"       # a dim produced by broadcasting a unit dim (the key dim of row stats)
FLOAT_TYPES = ("f32", "bf16", "f16")
# Dense constants (a constant-folded tril mask, a captured numpy bias) up to this size are taken
# into the region: the kernel slices them like inputs and can read position masks statically.
MAX_CONST_BYTES = 4 << 20
# Side ops the kernel can evaluate blockwise from labels (plus splat constants and iotas).
_SIDE_SHAPE_OPS = ("stablehlo.broadcast_in_dim", "stablehlo.transpose", "stablehlo.reshape",
                   "stablehlo.iota", "stablehlo.constant")
_LAYOUT_OPS = ("stablehlo.transpose", "stablehlo.reshape", "stablehlo.broadcast_in_dim")


class NoMatch(Exception):
    """The subgraph is not attention the kernel can take; the message says why."""


# Why a dot_general is no P·V candidate at all (its operand is no softmax): not reported per dot,
# most dots of a program are not P·V products.
NOT_SOFTMAX = "P·V operand is not a softmax (no normalizing divide)"
# Why a block with an exp and two dot_generals holds no candidate: reported once per block.
NO_SOFTMAX_DOT = "no dot_general reads a softmax (exp normalized by its sum) of a QKᵀ product"
WHAT = "attention candidate(s)"


# ---------------------------------------------------------------------------------------------
# Small IR helpers
# ---------------------------------------------------------------------------------------------

def _users(v: ir.Value) -> list:
    return [hir.as_op(u) for u in hir.users(v)]


def _splat(v: ir.Value) -> float | None:
    """The scalar of a value that is a splat (constant, or broadcast/convert/reshape of one)."""
    p = hir.defining_op(v)
    while p is not None and p.name in ("stablehlo.broadcast_in_dim", "stablehlo.reshape",
                                        "stablehlo.convert"):
        p = hir.defining_op(p.operands[0])
    if p is None or p.name != "stablehlo.constant":
        return None
    try:
        s = splat_scalar(p)
        return None if s is None else float(s)
    except (EmitError, ValueError, TypeError):
        return None


def shape_of(v: ir.Value) -> tuple:
    info = hir.tensor_type_info(v.type)
    if info is None:
        raise NoMatch("dynamic or unranked shape")
    return info.shape


def dtype_of(v: ir.Value) -> str:
    return hir.tensor_type_info(v.type).dtype


def _i64s(op, key: str) -> list[int]:
    return [int(x) for x in ir.DenseI64ArrayAttr(op.attributes[key])]


def _nonunit(shape) -> list:
    return [s for s in shape if s != 1]



def reducer_kind(op) -> str | None:
    """'add' / 'max' for a single-operand reduce whose body is one add / maximum, else None."""
    if op.name != "stablehlo.reduce" or len(op.operands) != 2 or len(op.results) != 1:
        return None
    body = [o.operation for o in op.regions[0].blocks[0].operations]
    if len(body) != 2 or body[1].name != "stablehlo.return":
        return None
    return {"stablehlo.add": "add", "stablehlo.maximum": "max"}.get(body[0].name)


def precision_of(op) -> tuple:
    if "precision_config" not in op.attributes:
        return ("DEFAULT", "DEFAULT")
    return tuple(str(a).rstrip(">").split()[-1] for a in ir.ArrayAttr(op.attributes["precision_config"]))


# ---------------------------------------------------------------------------------------------
# Dim labels
# ---------------------------------------------------------------------------------------------

def fwd_dims(op, in_dims: tuple) -> tuple:
    """Labels of a one-operand shape op's result from its operand's labels."""
    in_shape, out_shape = shape_of(op.operands[0]), shape_of(op.results[0])
    if op.name == "stablehlo.transpose":
        return tuple(in_dims[p] for p in _i64s(op, "permutation"))
    if op.name == "stablehlo.reshape":
        if _nonunit(in_shape) != _nonunit(out_shape):
            raise NoMatch("reshape that splits or merges dims")
        labs = iter([d for d, s in zip(in_dims, in_shape) if s != 1])
        return tuple(next(labs) if s != 1 else None for s in out_shape)
    if op.name == "stablehlo.broadcast_in_dim":
        bd = _i64s(op, "broadcast_dimensions")
        out = []
        for d, s in enumerate(out_shape):
            if d in bd and in_shape[bd.index(d)] == s:
                out.append(in_dims[bd.index(d)] if s != 1 else None)
            else:
                out.append(None if s == 1 else BCAST)
        return tuple(out)
    return tuple(in_dims)  # convert and other elementwise


def bwd_dims(op, out_dims: tuple, operand: int) -> tuple:
    """Labels an operand must have so that ``op`` produces ``out_dims``."""
    v = op.operands[operand]
    in_shape, out_shape = shape_of(v), shape_of(op.results[0])
    if op.name == "stablehlo.transpose":
        perm = _i64s(op, "permutation")
        res = [None] * len(in_shape)
        for i, p in enumerate(perm):
            res[p] = out_dims[i]
        return tuple(res)
    if op.name == "stablehlo.reshape":
        if _nonunit(in_shape) != _nonunit(out_shape):
            raise NoMatch("reshape that splits or merges dims")
        labs = iter([d for d, s in zip(out_dims, out_shape) if s != 1])
        return tuple(next(labs) if s != 1 else None for s in in_shape)
    if op.name == "stablehlo.broadcast_in_dim":
        bd = _i64s(op, "broadcast_dimensions")
        return tuple(out_dims[bd[k]] if in_shape[k] != 1 else None for k in range(len(in_shape)))
    if len(in_shape) == 0:
        return ()
    if tuple(in_shape) != tuple(out_shape):
        raise NoMatch(f"'{op.name}' with operands of mixed shapes")
    return tuple(out_dims)



# ---------------------------------------------------------------------------------------------
# The analysis
# ---------------------------------------------------------------------------------------------

@dataclasses.dataclass
class Attention:
    """Everything structural about one matched attention subgraph (see module docstring), with
    the live IR it was read from; :func:`region_spec` turns it into pure data.

    Labels name the logits' non-unit dims: ``batch`` labels (shared by Q, K, V and the output),
    ``rows`` (query-side free dims: query positions, and heads/groups that share K/V) and the
    ``key`` label (the softmax dim). ``dims`` maps a value key to its per-dim labels.
    """
    qk: object                       # the QKᵀ dot_general (ir.Operation)
    pv: object                       # the P·V dot_general
    members: list                    # ops of the region, program order
    sizes: dict                      # label -> size
    batch: list                      # batch labels, QKᵀ order
    rows: list                       # row labels, Q order
    key: str
    q: ir.Value
    k: ir.Value
    v: ir.Value
    q_dims: tuple                    # labels, with 'd' for the contracted head dim
    k_dims: tuple
    v_dims: tuple                    # with 'dv' for V's free dim
    head_dim: int
    v_head_dim: int
    side_inputs: list                # [(value, dims)] region inputs read by the logit chain
    const_sides: list                # [(value, dims)] dense constants inside the region
    steps: list                      # logit-chain ops (main + side), program order
    dims: dict                       # value key -> labels, for every chain value and side input
    s_key: object                    # value key of the QKᵀ result
    x_key: object                    # value key of the softmax input
    m_init: float                    # the max-reduction's initial value (folded with maxima)
    out_dims: tuple                  # labels of the P·V result
    repeat: Repeat | None
    x_dtype: str
    p_dtype: str                     # dtype of P as the P·V product reads it
    out_dtype: str
    precision: tuple                 # (QKᵀ precision, P·V precision)
    softmax: object = None           # the _Softmax ops (set by _analyze)
    repeat_ops: list = dataclasses.field(default_factory=list)   # GQA: the K/V repeat's ops
    # side values read in a second layout: [(value, dims, [(op, operand)])], given values of
    # their own by apply_layout_copies before region_spec
    layout_copies: list = dataclasses.field(default_factory=list)

    def label_sizes(self) -> dict:
        s = dict(self.sizes)
        if self.repeat:
            h = self.sizes[self.repeat.label]
            s[self.repeat.kv] = h // self.repeat.groups
            s[self.repeat.g] = self.repeat.groups
        s["d"], s["dv"] = self.head_dim, self.v_head_dim
        return s


def _same_block(op, block) -> bool:
    try:
        return op.block == block
    except (ValueError, AttributeError):  # a detached op ("no parent"), or no op at all
        return False


def _walk_back(v, allowed: tuple, *, single_use: bool = True):
    """Follow ``v`` back through one-operand ops named in ``allowed``; returns (value, ops)."""
    ops = []
    while True:
        p = hir.defining_op(v)
        if p is None or p.name not in allowed:
            return v, ops
        if single_use and len(_users(v)) != 1:
            raise NoMatch(f"intermediate '{p.name}' result has several users")
        ops.append(p)
        v = p.operands[0]


def _stat_chain(v, kind: str, relaxed: bool = False):
    """Walk a broadcast-back row statistic to its reduce: returns (reduce op, ops, folded init).

    ``kind='max'`` also folds ``maximum(splat, m)`` (``jnp.max(..., initial=-inf)``)."""
    ops, extra = [], []
    while True:
        p = hir.defining_op(v)
        if p is None:
            raise NoMatch("softmax statistic comes from a region input")
        if p.name == "stablehlo.reduce":
            if reducer_kind(p) != kind:
                raise NoMatch(f"softmax {kind} is not a single-op {kind} reduce")
            init = _splat(p.operands[1])
            if init is None:
                raise NoMatch("reduce init is not a constant")
            return p, ops, init if not extra else max([init] + extra)
        if len(_users(v)) != 1 and not relaxed:
            raise NoMatch("softmax statistic has several users")
        if p.name in ("stablehlo.broadcast_in_dim", "stablehlo.reshape", "stablehlo.convert",
                      "stablehlo.transpose"):
            ops.append(p)
            v = p.operands[0]
            continue
        if kind == "max" and p.name == "stablehlo.maximum":
            a, b = p.operands
            ca, cb = _splat(a), _splat(b)
            if (ca is None) == (cb is None):
                raise NoMatch("maximum in the softmax max is not against a constant")
            const_v, other = (a, b) if ca is not None else (b, a)
            extra.append(ca if ca is not None else cb)
            ops.append(p)
            cp = hir.defining_op(const_v)
            if cp is not None and cp.name != "stablehlo.constant":
                if len(_users(const_v)) != 1 and not relaxed:
                    raise NoMatch("shared constant broadcast in the softmax max")
                ops.append(cp)
            v = other
            continue
        raise NoMatch(f"unexpected '{p.name}' in the softmax statistic")


def _row_stat_dims(ops, in_dims, axis, key, want_dims) -> None:
    """Check a statistic reduces ``in_dims`` over its key ``axis`` and is broadcast back along
    the key only, to a value combined with one of layout ``want_dims``."""
    if in_dims[axis] != key:
        raise NoMatch("softmax max and sum reduce different dims")
    dims = tuple(d for i, d in enumerate(in_dims) if i != axis)
    for op in reversed(ops):
        if op.name == "stablehlo.maximum" or (op.name == "stablehlo.broadcast_in_dim"
                                               and _splat(op.results[0]) is not None):
            continue
        dims = fwd_dims(op, dims)
    want = tuple(BCAST if d == key else d for d in want_dims)
    if dims != want:
        raise NoMatch("softmax statistic is not broadcast back along the reduced dim")


def _match_repeat(v: ir.Value, head_axis: int, relaxed: bool = False):
    """K/V heads shared by groups of query heads? -> (unshared x, G, ops) or None.

    ``reshape(broadcast_in_dim(x))`` is ``jnp.repeat(x, G, axis=head_axis)``; a lone
    ``broadcast_in_dim`` from one head (``jnp.broadcast_to``) shares it with all G heads.
    """
    rs = hir.defining_op(v)
    one_use = relaxed or len(_users(v)) == 1      # training: the backward reads it too
    if rs is not None and rs.name == "stablehlo.broadcast_in_dim" and one_use:
        src = rs.operands[0]
        s_in, s_out = shape_of(src), shape_of(v)
        if (_i64s(rs, "broadcast_dimensions") == list(range(len(s_in))) and s_in[head_axis] == 1
                and all(a == b for i, (a, b) in enumerate(zip(s_in, s_out)) if i != head_axis)):
            return src, s_out[head_axis], [rs]
        return None
    if rs is None or rs.name != "stablehlo.reshape" or not one_use:
        return None
    b = hir.defining_op(rs.operands[0])
    if b is None or b.name != "stablehlo.broadcast_in_dim" or len(_users(rs.operands[0])) != 1:
        return None
    src = b.operands[0]
    s_in, s_mid, s_out = shape_of(src), shape_of(b.results[0]), shape_of(v)
    bd = _i64s(b, "broadcast_dimensions")
    if len(s_mid) != len(s_in) + 1 or bd != [d if d <= head_axis else d + 1 for d in range(len(s_in))]:
        return None
    want_out = list(s_in)
    want_out[head_axis] = s_in[head_axis] * s_mid[head_axis + 1]
    if list(s_out) != want_out or s_mid[head_axis] != s_in[head_axis]:
        return None
    return src, s_mid[head_axis + 1], [b, rs]


class _Ctx:
    """Per-analysis state: the block, program order, dims and the growing member set."""

    def __init__(self, block, index: dict | None = None):
        self.block = block
        self.index = index if index is not None else block_index(block)
        self.dims: dict = {}

    def set_dims(self, v, dims) -> None:
        k = hir.value_key(v)
        old = self.dims.get(k)
        if old is not None and old != tuple(dims):
            raise NoMatch(f"value used with conflicting layouts {old} vs {tuple(dims)}")
        self.dims[k] = tuple(dims)


def block_index(block) -> dict:
    """Program position of every op of ``block``."""
    return {op: i for i, op in enumerate(hir.block_ops(block))}



@dataclasses.dataclass
class _Softmax:
    """The softmax of one match: the ops from the logits ``x`` to the probabilities."""
    p_ops: list          # pass-through ops between the divide and P·V
    div: object
    ex: object
    sub: object
    r_sum: object
    sum_ops: list
    e_conv: list         # converts between exp and the sum
    r_max: object
    max_ops: list
    m_init: float
    x_val: ir.Value      # the logits
    x_layout: list       # layout ops between x and the subtract
    key_axis: int        # the reduced axis of x
    e_layout: list = dataclasses.field(default_factory=list)  # layout ops between exp and divide

    @property
    def ops(self) -> set:
        return ({self.div, self.ex, self.sub, self.r_max, self.r_sum} | set(self.max_ops)
                | set(self.sum_ops) | set(self.e_conv) | set(self.p_ops) | set(self.x_layout)
                | set(self.e_layout))


@dataclasses.dataclass
class _Operands:
    """Q, K, V of one match with their labels (GQA: K/V before the repeat)."""
    batch: list
    rows: list
    key: str
    q: ir.Value
    k: ir.Value
    v: ir.Value
    q_dims: tuple
    k_dims: tuple
    v_dims: tuple
    head_dim: int
    v_head_dim: int
    out_dims: tuple
    repeat: Repeat | None = None
    repeat_ops: list = dataclasses.field(default_factory=list)


def analyze(pv, index: dict | None = None) -> Attention:
    """Match attention ending at the P·V ``dot_general`` ``pv``; raises :class:`NoMatch`.

    ``index``: :func:`block_index` of ``pv``'s block, when the caller analyzes many dots."""
    att, reasons = _try_analyze(pv, index)
    if att is None:
        raise NoMatch("; ".join(reasons))
    return att


def _try_analyze(pv, index: dict | None, relaxed: bool = False, gqa: bool = True) -> tuple:
    """(the match, []) or (None, the distinct reasons, one per P·V operand tried)."""
    if pv.name != "stablehlo.dot_general":
        return None, ["not a dot_general"]
    reasons = []
    for p_idx in (0, 1):
        try:
            return _analyze(pv, p_idx, index, relaxed, gqa), []
        except NoMatch as e:
            reasons.append(str(e))
    return None, list(dict.fromkeys(reasons))


def _analyze(pv, p_idx: int, index: dict | None, relaxed: bool = False,
             gqa: bool = True) -> Attention:
    """P·V operand ``p_idx`` as the probabilities: the steps below, in order.

    ``relaxed``: forward intermediates may have users outside the region (a training step's
    backward reads them, the repeated K/V too); :mod:`.attention_train` then matches those users
    as the backward. ``gqa=False``: K/V repeats stay outside the region."""
    sm = _match_softmax(pv, p_idx, relaxed)
    cx = _Ctx(pv.block, index)
    qk, visited = _find_qk(sm.x_val, cx)
    parts, sizes = _label_qk(qk, cx)
    main_ops, side_reqs = _main_chain(qk, visited, sm.x_val, cx)
    key, xs_dims = _softmax_dims(sm, cx)
    ops = _qk_operands(qk, parts, sizes, key)
    _pv_operand(pv, p_idx, sm, xs_dims, ops, cx)
    if gqa:
        _match_gqa(ops, relaxed)
    members = set(main_ops) | {qk, pv} | sm.ops | set(ops.repeat_ops)
    side_inputs, copies = _take_side_values(members, side_reqs, sizes, cx)
    att = _close_region(pv, qk, p_idx, sm, ops, members, sizes, side_inputs, cx, relaxed)
    att.layout_copies = copies
    att.softmax = sm
    att.repeat_ops = list(ops.repeat_ops)
    return att


def _match_softmax(pv, p_idx: int, relaxed: bool = False) -> _Softmax:
    """1-2: the P·V operand back to the normalizing divide, exp, and the sum and max."""
    through = ("stablehlo.convert", "stablehlo.transpose", "stablehlo.reshape",
               "stablehlo.broadcast_in_dim")
    # no exp normalized by a divide behind the operand (a scaled Q, a gradient divided by a
    # row sum): no candidate at all, whatever the uses on the way
    if not _softmax_behind(pv.operands[p_idx]):
        raise NoMatch(NOT_SOFTMAX)
    p_val, p_ops = _walk_back(pv.operands[p_idx], through, single_use=not relaxed)
    div = hir.defining_op(p_val)
    if len(_users(p_val)) != 1 and not relaxed:
        raise NoMatch("softmax probabilities are used outside the P·V product")
    e_num, den = div.operands
    # layout-assignment may leave a transpose between exp and the divide (the output's layout
    # sunk through the division): the numerator is exp through layout ops
    e_val, e_layout = _walk_back(e_num, ("stablehlo.transpose", "stablehlo.reshape"),
                                 single_use=not relaxed)
    ex = hir.defining_op(e_val)
    if ex is None or ex.name != "stablehlo.exponential":
        raise NoMatch("softmax numerator is not exp")
    r_sum, sum_ops, sum_init = _stat_chain(den, "add", relaxed)
    if sum_init != 0.0:
        raise NoMatch("softmax sum has a non-zero init")
    e_src, e_conv = _walk_back(r_sum.operands[0], ("stablehlo.convert",), single_use=not relaxed)
    if hir.value_key(e_src) != hir.value_key(e_val):
        raise NoMatch("softmax sum is not over the numerator")
    if not relaxed and (len(_users(e_val)) != 2 or len(_users(r_sum.results[0])) != 1):
        raise NoMatch("softmax numerator or sum used outside the softmax")
    sub = hir.defining_op(ex.operands[0])
    if sub is None or sub.name != "stablehlo.subtract" or (len(_users(ex.operands[0])) != 1
                                                            and not relaxed):
        raise NoMatch("exp argument is not x - max(x)")
    x_sub, bm = sub.operands
    r_max, max_ops, m_init = _stat_chain(bm, "max", relaxed)
    x_val = r_max.operands[0]
    # the subtract may see x through layout ops (jax.nn.dot_product_attention transposes it)
    x_layout, v = [], x_sub
    while hir.value_key(v) != hir.value_key(x_val):
        p = hir.defining_op(v)
        if p is None or p.name not in _LAYOUT_OPS or (len(_users(v)) != 1 and not relaxed):
            raise NoMatch("softmax max is not over the same logits")
        x_layout.append(p)
        v = p.operands[0]
    x_user = x_layout[-1] if x_layout else sub
    if not relaxed and (set(_users(x_val)) != {r_max, x_user} or len(_users(x_val)) != 2
                        or len(_users(r_max.results[0])) != 1):
        raise NoMatch("logits or their max used outside the softmax")
    x_shape = shape_of(x_val)
    rdims = _i64s(r_max, "dimensions")
    if len(rdims) != 1 or len(_i64s(r_sum, "dimensions")) != 1 or x_shape[rdims[0]] == 1:
        raise NoMatch("softmax must reduce exactly one (non-unit) dim")
    if dtype_of(x_val) not in FLOAT_TYPES:
        raise NoMatch(f"logits of type {dtype_of(x_val)}")
    return _Softmax(p_ops, div, ex, sub, r_sum, sum_ops, e_conv, r_max, max_ops, m_init, x_val,
                    x_layout, rdims[0], e_layout)


def _find_qk(x_val, cx: "_Ctx"):
    """3: the QKᵀ product, the unique full-size dot_general feeding the logits; and the
    elementwise/layout ops visited on the way (the candidates for the logit chain)."""
    numel = math.prod(shape_of(x_val))
    seen, stack, dots, visited_ops = set(), [x_val], {}, set()
    while stack:
        v = stack.pop()
        p = hir.defining_op(v)
        if p is None or hir.value_key(v) in seen or math.prod(shape_of(v)) != numel:
            continue
        seen.add(hir.value_key(v))
        if not _same_block(p, cx.block):
            continue
        if p.name == "stablehlo.dot_general":
            dots[p] = True
            continue
        rule = rule_for(p.name)
        if len(p.results) != 1 or len(p.regions) or not (
                (rule.cls is OpClass.ELEMENTWISE and rule.emit is not None) or p.name in _LAYOUT_OPS):
            continue
        visited_ops.add(p)
        stack.extend(p.operands)
    if len(dots) != 1:
        raise NoMatch("no unique QKᵀ dot_general feeds the logits" if dots else
                      "logits do not come from a dot_general")
    qk = next(iter(dots))
    if dtype_of(qk.results[0]) not in FLOAT_TYPES:
        raise NoMatch("QKᵀ result is not floating point")
    return qk, visited_ops


def _label_qk(qk, cx: "_Ctx"):
    """Labels of the QKᵀ result: ``b<i>`` batch, ``l<d>``/``r<d>`` free dims of each side."""
    parts = gu.dot_parts(qk)
    lb, _, _, _, lf, rf = parts
    s_shape = shape_of(qk.results[0])
    out_roles = ([("b", i) for i in range(len(lb))] + [("l", d) for d in lf] + [("r", d) for d in rf])
    sizes, s_dims = {}, []
    for (role, i), n in zip(out_roles, s_shape):
        if n == 1:
            s_dims.append(None)
            continue
        name = f"{role}{i}"
        sizes[name] = n
        s_dims.append(name)
    cx.set_dims(qk.results[0], tuple(s_dims))
    return parts, sizes


def _main_chain(qk, visited_ops, x_val, cx: "_Ctx"):
    """4: the ops on paths QKᵀ -> x in program order, labelled; and the side values they read
    as ``(value, dims, op)``."""
    main_vals = {hir.value_key(qk.results[0])}
    main_ops = []
    for op in sorted(visited_ops, key=lambda o: cx.index[o]):
        if any(hir.value_key(a) in main_vals for a in op.operands):
            main_ops.append(op)
            main_vals.add(hir.value_key(op.results[0]))
    if hir.value_key(x_val) not in main_vals and hir.value_key(x_val) != hir.value_key(qk.results[0]):
        raise NoMatch("logits are not computed from QKᵀ")
    side_reqs = []
    for op in main_ops:
        mains = [a for a in op.operands if hir.value_key(a) in main_vals]
        dims0 = cx.dims[hir.value_key(mains[0])]
        if op.name in _LAYOUT_OPS:
            out = fwd_dims(op, dims0)
            if BCAST in out:
                raise NoMatch("logits broadcast along a new dim")
        else:
            for a in mains[1:]:
                if cx.dims[hir.value_key(a)] != dims0:
                    raise NoMatch(f"'{op.name}' combines logits in different layouts")
            out = dims0
        cx.set_dims(op.results[0], out)
        for j, a in enumerate(op.operands):
            if hir.value_key(a) not in main_vals:
                side_reqs.append((a, bwd_dims(op, out, j), op, j))
    return main_ops, side_reqs


def _softmax_dims(sm: _Softmax, cx: "_Ctx"):
    """The key label (the reduced dim of x), and labels through the softmax: x - max must be
    broadcast along the key only, the row statistics reduce the key."""
    x_dims = cx.dims[hir.value_key(sm.x_val)]
    key = x_dims[sm.key_axis]
    if key is None or key[0] not in "lr":
        raise NoMatch("softmax is not over a free dim of QKᵀ")
    xs_dims = x_dims
    for op in reversed(sm.x_layout):
        xs_dims = fwd_dims(op, xs_dims)
        if BCAST in xs_dims:
            raise NoMatch("logits broadcast inside the softmax")
        cx.set_dims(op.results[0], xs_dims)
    e_dims = xs_dims
    for op in reversed(sm.e_layout):
        e_dims = fwd_dims(op, e_dims)
        if BCAST in e_dims:
            raise NoMatch("exp broadcast inside the softmax")
        cx.set_dims(op.results[0], e_dims)
    _row_stat_dims(sm.max_ops, x_dims, sm.key_axis, key, xs_dims)
    # the sum reduces exp (layout xs) and is broadcast back to the divide's layout (e_dims)
    _row_stat_dims(sm.sum_ops, xs_dims, _i64s(sm.r_sum, "dimensions")[0], key, e_dims)
    for v in (sm.sub.results[0], sm.ex.results[0]):
        cx.set_dims(v, xs_dims)
    cx.set_dims(sm.div.results[0], e_dims)
    return key, e_dims


def _qk_operands(qk, parts, sizes: dict, key: str) -> _Operands:
    """Q / K roles: K is the side whose free dim is the key; labels of both operands."""
    lb, rb, lc, rc, lf, rf = parts
    k_side = 0 if key[0] == "l" else 1
    q_side = 1 - k_side
    k_free = [f"{'lr'[k_side]}{d}" for d in (lf, rf)[k_side]]
    if any(f in sizes and f != key for f in k_free):
        raise NoMatch("K has free dims besides the key")
    batch = [f"b{i}" for i in range(len(lb)) if f"b{i}" in sizes]
    rows = [f"{'lr'[q_side]}{d}" for d in (lf, rf)[q_side] if f"{'lr'[q_side]}{d}" in sizes]
    if not rows:
        raise NoMatch("one query row (e.g. a decode step): the kernels tile query rows, XLA keeps the "
                      "two products (fold-dot-repeats reads a repeated K/V unrepeated)")
    qc, kc = (lc, rc) if q_side == 0 else (rc, lc)
    q_val, k_val = qk.operands[q_side], qk.operands[k_side]
    q_shape, k_shape = shape_of(q_val), shape_of(k_val)
    real_c = [(a, b) for a, b in zip(qc, kc) if q_shape[a] != 1]
    if len(real_c) > 1:
        raise NoMatch("QKᵀ contracts several dims")
    head_dim = q_shape[real_c[0][0]] if real_c else 1

    def operand_dims(shape, bdims, cdims, fdims, side):
        d = [None] * len(shape)
        for i, a in enumerate(bdims):
            d[a] = f"b{i}" if shape[a] != 1 else None
        for a in cdims:
            d[a] = "d" if shape[a] != 1 else None
        for a in fdims:
            d[a] = f"{side}{a}" if shape[a] != 1 else None
        return tuple(d)

    q_b, k_b = (lb, rb) if q_side == 0 else (rb, lb)
    q_f, k_f = (lf, rf) if q_side == 0 else (rf, lf)
    return _Operands(batch, rows, key, q_val, k_val, None,
                     operand_dims(q_shape, q_b, qc, q_f, "lr"[q_side]),
                     operand_dims(k_shape, k_b, kc, k_f, "lr"[k_side]), (), head_dim, 1, ())


def _pv_operand(pv, p_idx: int, sm: _Softmax, xs_dims, ops: _Operands, cx: "_Ctx") -> None:
    """5: the probabilities through their pass-through ops to P·V; V and the output labels."""
    pd = xs_dims
    for op in reversed(sm.p_ops):
        pd = fwd_dims(op, pd)
        if BCAST in pd:
            raise NoMatch("probabilities broadcast before P·V")
        cx.set_dims(op.results[0], pd)
    plb, prb, plc, prc, plf, prf = gu.dot_parts(pv)
    pb, vb_, pc, vc, pf, vf = (plb, prb, plc, prc, plf, prf) if p_idx == 0 else (prb, plb, prc, plc, prf, plf)
    v_val = pv.operands[1 - p_idx]
    v_shape = shape_of(v_val)
    if [pd[a] for a in pc if pd[a] is not None] != [ops.key]:
        raise NoMatch("P·V does not contract the key dim")
    if sorted(pd[a] for a in pb if pd[a] is not None) != sorted(ops.batch):
        raise NoMatch("P·V batch dims differ from QKᵀ batch dims")
    if sorted(pd[a] for a in pf if pd[a] is not None) != sorted(ops.rows):
        raise NoMatch("P·V rows differ from QKᵀ rows")
    v_dims = [None] * len(v_shape)
    for a, b in zip(pb, vb_):
        v_dims[b] = pd[a]
    for a, b in zip(pc, vc):
        v_dims[b] = pd[a]
    if len([a for a in vf if v_shape[a] != 1]) > 1:
        raise NoMatch("V has several free dims")
    v_head = 1
    for a in vf:
        if v_shape[a] != 1:
            v_dims[a], v_head = "dv", v_shape[a]
    ops.v, ops.v_dims, ops.v_head_dim = v_val, tuple(v_dims), v_head
    ops.out_dims = tuple([pd[a] for a in pb] + ([pd[a] for a in pf] + [v_dims[a] for a in vf] if p_idx == 0
                                                else [v_dims[a] for a in vf] + [pd[a] for a in pf]))


def _match_gqa(ops: _Operands, relaxed: bool = False) -> None:
    """6: K and V repeated along the same batch label (GQA/MQA): read the unrepeated ones."""
    for lab in ops.batch:
        kax, vax = ops.k_dims.index(lab), ops.v_dims.index(lab)
        mk, mv = _match_repeat(ops.k, kax, relaxed), _match_repeat(ops.v, vax, relaxed)
        if mk and mv and mk[1] == mv[1] and hir.value_key(ops.k) != hir.value_key(ops.v):
            rep = Repeat(lab, mk[1])
            ops.repeat, ops.repeat_ops = rep, mk[2] + mv[2]
            ops.k, ops.v = mk[0], mv[0]
            ops.k_dims = tuple(rep.kv if d == lab else d for d in ops.k_dims)
            ops.v_dims = tuple(rep.kv if d == lab else d for d in ops.v_dims)
            return


def _take_side_values(members: set, side_reqs: list, sizes: dict, cx: "_Ctx") -> tuple:
    """7: pull cheap generators (iotas, constants, broadcasts, elementwise ops used only inside)
    into ``members``, latest first; what stays outside is a region input. Returns the side
    inputs ``[(value, dims)]`` and the layout copies ``[(value, dims, uses)]``.

    A value the chain reads in several layouts (a ``[B, S]`` padding mask broadcast along the
    query rows and along the key, as ``mask[:, None, :, None] * mask[:, None, None, :]`` makes
    it) stays outside and is a region input once per layout: the first layout is a side input,
    each other one a *layout copy*, its uses (``(op, operand index)``) read by a function
    argument of its own (:func:`apply_layout_copies`), so every argument has one layout."""
    reqs: dict = {}
    heap, tick = [], itertools.count()

    def require(v, dims, user, j):
        k = hir.value_key(v)
        reqs.setdefault(k, (v, []))[1].append((tuple(dims), user, j))
        p = hir.defining_op(v)
        if p is not None and _same_block(p, cx.block) and p not in members:
            heapq.heappush(heap, (-cx.index[p], next(tick), p))

    for v, dims, user, j in side_reqs:
        require(v, dims, user, j)
    done = set()
    while heap:
        _, _, p = heapq.heappop(heap)
        if p in done:
            continue
        done.add(p)
        r = p.results[0] if len(p.results) == 1 else None
        ok = (r is not None and not len(p.regions) and _side_op_ok(p)
              and all(u in members for u in _users(r))
              and len(_layouts(reqs[hir.value_key(r)][1])) == 1)
        if not ok:
            continue  # its result stays a region input
        dims = _layouts(reqs[hir.value_key(r)][1])[0]
        members.add(p)
        cx.set_dims(r, dims)
        for j, a in enumerate(p.operands):
            require(a, bwd_dims(p, dims, j), p, j)
    side_inputs, copies = [], []
    for k, (v, dl) in reqs.items():
        p = hir.defining_op(v)
        layouts = _layouts(dl)
        if p is None or p not in members:
            if p is not None and p.name == "stablehlo.constant" and _splat(v) is not None:
                continue   # splat constants are cloned into the region, in any layout
            cx.set_dims(v, layouts[0])
            side_inputs.append((v, layouts[0]))
            for dims in layouts[1:]:
                copies.append((v, dims, [(u, j) for d, u, j in dl if d == dims]))
    # every side input's labels must be known logits labels
    for v, dims in side_inputs + [(v, d) for v, d, _ in copies] + [
            (op.results[0], cx.dims[hir.value_key(op.results[0])]) for op in members
            if op.name == "stablehlo.constant"]:
        for d, n in zip(dims, shape_of(v)):
            if d is not None and sizes.get(d) != n:
                raise NoMatch("side input does not line up with the logits")
    return side_inputs, copies


def _layouts(reqs: list) -> list:
    """The distinct layouts of a value's requirements ``[(dims, user, operand)]``, first use
    first."""
    return list(dict.fromkeys(d for d, _, _ in reqs))


def apply_layout_copies(att: "Attention") -> list:
    """Give each extra layout of a side value (:attr:`Attention.layout_copies`) a value of its
    own before the region is outlined: an identity ``reshape`` of it, placed before its first
    use, read by that layout's uses; the copy becomes a side input with that layout, so the
    region function takes the value once per layout. Returns the copy ops, for
    :func:`drop_layout_copies` once the region is outlined (or the match given up)."""
    if not att.layout_copies:
        return []
    # an operation's hash changes with its operands: value keys are taken again afterwards
    dims_by_value = [(_value_of(k), d) for k, d in att.dims.items()]
    s_val, x_val = _value_of(att.s_key), _value_of(att.x_key)
    made = []
    for v, dims, uses in att.layout_copies:
        first = min((u for u, _ in uses), key=lambda o: att.members.index(o))
        with first.location, ir.InsertionPoint(first):
            cp = stablehlo.ReshapeOp(v.type, v).operation
        for u, j in uses:
            u.operands[j] = cp.results[0]
        att.side_inputs.append((cp.results[0], tuple(dims)))
        dims_by_value.append((cp.results[0], tuple(dims)))
        made.append(cp)
    att.dims = {hir.value_key(v): d for v, d in dims_by_value}
    att.s_key, att.x_key = hir.value_key(s_val), hir.value_key(x_val)
    att.layout_copies = []
    return made


def _value_of(key) -> ir.Value:
    """The value a :func:`hlofuse.core.ir.value_key` names."""
    kind, owner, i = key
    return owner.arguments[i] if kind == "arg" else owner.results[i]


def drop_layout_copies(copies: list) -> None:
    """Replace each identity copy of :func:`apply_layout_copies` by its source again (after
    outlining only the call reads it: the call then passes the same value twice)."""
    for cp in copies:
        cp.results[0].replace_all_uses_with(cp.operands[0])
        hir.safe_erase(cp)


def _close_region(pv, qk, p_idx: int, sm: _Softmax, ops: _Operands, members: set, sizes: dict,
                  side_inputs: list, cx: "_Ctx", relaxed: bool = False) -> Attention:
    """8: the region is closed (only the P·V result leaves it); the logit chain in order."""
    for op in members:
        for r in op.results:
            if op is pv:
                continue
            if any(u not in members for u in _users(r)) and not relaxed:
                raise NoMatch(f"intermediate '{op.name}' is used outside the attention")
    ordered = sorted(members, key=lambda o: cx.index[o])
    if ordered[-1] is not pv:
        raise NoMatch("internal: P·V is not the last op of the region")
    not_chain = {qk, pv} | sm.ops | set(ops.repeat_ops)
    steps = [op for op in ordered if op not in not_chain]
    for d in cx.dims[hir.value_key(sm.x_val)]:
        if d is not None and d not in set(ops.batch) | set(ops.rows) | {ops.key}:
            raise NoMatch("logits carry a dim that is not batch/row/key")
    return Attention(
        qk=qk, pv=pv, members=ordered, sizes=sizes, batch=ops.batch, rows=ops.rows, key=ops.key,
        q=ops.q, k=ops.k, v=ops.v, q_dims=ops.q_dims, k_dims=ops.k_dims, v_dims=ops.v_dims,
        head_dim=ops.head_dim, v_head_dim=ops.v_head_dim, side_inputs=side_inputs, steps=steps,
        dims=cx.dims,
        const_sides=[(op.results[0], cx.dims[hir.value_key(op.results[0])]) for op in steps
                     if op.name == "stablehlo.constant" and _splat(op.results[0]) is None],
        s_key=hir.value_key(qk.results[0]), x_key=hir.value_key(sm.x_val), m_init=sm.m_init,
        out_dims=ops.out_dims, repeat=ops.repeat, x_dtype=dtype_of(sm.x_val),
        p_dtype=dtype_of(pv.operands[p_idx]), out_dtype=dtype_of(pv.results[0]),
        precision=(precision_of(qk), precision_of(pv)))


def _side_op_ok(op) -> bool:
    if op.name == "stablehlo.constant":
        info = hir.tensor_type_info(op.results[0].type)
        return _splat(op.results[0]) is not None or (
            info is not None and info.nbytes <= MAX_CONST_BYTES)
    if op.name == "stablehlo.reshape":
        return _nonunit(shape_of(op.operands[0])) == _nonunit(shape_of(op.results[0]))
    if op.name in _SIDE_SHAPE_OPS:
        return True
    rule = rule_for(op.name)
    return rule.cls is OpClass.ELEMENTWISE and rule.emit is not None


def find_attention(block, refused: list | None = None) -> list[Attention]:
    """Every non-overlapping attention match in ``block``, program order of the P·V products.

    ``refused``: gets ``(dot, reason)`` for each candidate that did not match, a dot_general
    with a softmax operand (dots whose operands are no softmax are not candidates)."""
    found, taken = [], set()
    index = block_index(block)
    for op in hir.block_ops(block):
        if op.name != "stablehlo.dot_general":
            continue
        att, reasons = _try_analyze(op, index)
        if att is None:
            reasons = [r for r in reasons if r != NOT_SOFTMAX]
            if refused is not None and reasons and op not in taken:
                refused.append((op, "; ".join(reasons)))
            continue
        if any(m in taken for m in att.members):
            if refused is not None:
                refused.append((op, "overlaps an attention matched before it"))
            continue
        taken.update(att.members)
        found.append(att)
    return found


# ---------------------------------------------------------------------------------------------
# The match as data
# ---------------------------------------------------------------------------------------------

def region_spec(att: Attention, boundary) -> AttentionSpec:
    """The match as an :class:`AttentionSpec`, values named by their position in the function
    ``outline_region`` makes of it: arguments are ``boundary.inputs``; the body is
    ``boundary.constants`` (cloned splats), then ``att.members``, in order. Side values read in
    several layouts need their copies first (:func:`apply_layout_copies`)."""
    if att.layout_copies:
        v, dims, _ = att.layout_copies[0]
        first = next(d for w, d in att.side_inputs if hir.value_key(w) == hir.value_key(v))
        raise NoMatch(f"side value used with conflicting layouts {first} vs {tuple(dims)}")
    pos = {hir.value_key(v): ("arg", i) for i, v in enumerate(boundary.inputs)}
    body = list(boundary.constants) + list(att.members)
    for j, op in enumerate(body):
        if len(op.results) == 1:
            pos[hir.value_key(op.results[0])] = ("op", j)

    def ref(v, key=None):
        r = pos.get(key or hir.value_key(v))
        if r is None:
            raise NoMatch("a value the logits read is neither a region input nor a region op")
        return r

    def arg(v, what):
        r = ref(v)
        if r[0] != "arg":
            raise NoMatch(f"{what} is not a region input")
        return r[1]

    evaluated = {att.s_key} | {hir.value_key(v) for v, _ in att.side_inputs} \
        | {hir.value_key(op.results[0]) for op in att.steps}

    def operand(a):
        if hir.value_key(a) not in evaluated and _splat(a) is not None:
            return Splat(_splat(a), dtype_of(a))
        return ref(a)

    steps = []
    for op in att.steps:
        r = op.results[0]
        if op.name == "stablehlo.constant":
            operands = (Splat(_splat(r), dtype_of(r)),) if _splat(r) is not None else ()
        else:
            operands = tuple(operand(a) for a in op.operands)
        steps.append(LogitStep(ref(r), op.name, operands, dtype_of(r), att.dims[hir.value_key(r)]))
    spec = AttentionSpec(
        label_sizes=tuple(att.label_sizes().items()), batch_labels=tuple(att.batch),
        row_labels=tuple(att.rows), key=att.key, repeat=att.repeat, head_dim=att.head_dim,
        v_head_dim=att.v_head_dim, q_arg=arg(att.q, "Q"), k_arg=arg(att.k, "K"),
        v_arg=arg(att.v, "V"), q_dims=att.q_dims, k_dims=att.k_dims, v_dims=att.v_dims,
        out_dims=att.out_dims,
        side_args=tuple((arg(v, "side input"), tuple(d)) for v, d in att.side_inputs),
        const_sides=tuple((ref(v)[1], tuple(d)) for v, d in att.const_sides),
        steps=tuple(steps), s_ref=ref(att.qk.results[0]), s_dtype=dtype_of(att.qk.results[0]),
        x_ref=ref(None, att.x_key), mask_select=None, m_init=att.m_init, x_dtype=att.x_dtype,
        p_dtype=att.p_dtype, out_dtype=att.out_dtype, precision=att.precision)
    return dataclasses.replace(spec, mask_select=mask_select(spec))


def _softmax_behind(v) -> bool:
    """``v`` is (through converts and layout ops) a divide of (a layout of) an exp."""
    v, _ = _walk_back(v, ("stablehlo.convert",) + _LAYOUT_OPS, single_use=False)
    div = hir.defining_op(v)
    if div is None or div.name != "stablehlo.divide":
        return False
    e, _ = _walk_back(div.operands[0], ("stablehlo.transpose", "stablehlo.reshape"), single_use=False)
    ex = hir.defining_op(e)
    return ex is not None and ex.name == "stablehlo.exponential"


def _move_row_multipliers(block) -> int:
    """``(p * m) · V`` -> ``(p · V) * m`` when ``p`` is a softmax and ``m`` is broadcast along the
    key dim (a head mask, all ones by default, as Transformers' Flax BERT multiplies in): the
    multiplier does not depend on the key, so it scales each output row (reassociates one
    multiply; exact when ``m`` is 1). Then the P·V product reads the softmax and the attention
    kernel is built. Returns the number moved."""
    n = 0
    for dot in hir.block_ops(block):
        if dot.name != "stablehlo.dot_general":
            continue
        lb, rb, lc, rc, lf, rf = gu.dot_parts(dot)
        for pi in (0, 1):
            mul = hir.defining_op(dot.operands[pi])
            if mul is None or mul.name != "stablehlo.multiply" or len(_users(mul.results[0])) != 1:
                continue
            pc = (lc, rc)[pi]
            for mi in (0, 1):
                bc = hir.defining_op(mul.operands[mi])
                if bc is None or bc.name != "stablehlo.broadcast_in_dim" or \
                        not _softmax_behind(mul.operands[1 - mi]):
                    continue
                if _rewrite_row_multiplier(dot, pi, mul, mi, bc, pc, (lb, rb)[pi], (lf, rf)[pi]):
                    n += 1
                    break
            else:
                continue
            break
    return n


def _rewrite_row_multiplier(dot, pi, mul, mi, bc, pc, pb, pf) -> bool:
    src = bc.operands[0]
    s_shape = shape_of(src)
    bd = _i64s(bc, "broadcast_dimensions")
    if len(pc) != 1 or any(n != 1 and bd[i] == pc[0] for i, n in enumerate(s_shape)):
        return False                      # m varies along the key: not a row multiplier
    # output position of each p dim: batch dims first, then lhs free, then rhs free
    out_shape = shape_of(dot.results[0])
    o_free = len(pb) + (0 if pi == 0 else len(out_shape) - len(pb) - len(pf))
    out_pos = {d: i for i, d in enumerate(pb)}
    out_pos.update({d: o_free + i for i, d in enumerate(pf)})
    keep = [i for i, n in enumerate(s_shape) if bd[i] != pc[0]]
    dims = [out_pos[bd[i]] for i in keep]
    if dims != sorted(dims):
        return False
    out_t = dot.results[0].type
    o_dt = ir.RankedTensorType(out_t).element_type
    with dot.location, ir.InsertionPoint(dot):
        m = src
        if len(keep) != len(s_shape):
            m = stablehlo.ReshapeOp(ir.RankedTensorType.get([s_shape[i] for i in keep],
                                                            ir.RankedTensorType(src.type).element_type),
                                    m).result
        if ir.RankedTensorType(m.type).element_type != o_dt:
            m = stablehlo.ConvertOp(ir.RankedTensorType.get(shape_of(m), o_dt), m).result
        new_dot = dot.clone()
        new_dot.operands[pi] = mul.operands[1 - mi]
    with dot.location, ir.InsertionPoint.after(new_dot):
        mb = stablehlo.BroadcastInDimOp(out_t, m, dims).result
        scaled = stablehlo.MulOp(new_dot.results[0], mb).result
    dot.results[0].replace_all_uses_with(scaled)
    hir.safe_erase(dot)
    if not hir.has_uses(mul):
        hir.safe_erase(mul)
        if not hir.has_uses(bc):
            hir.safe_erase(bc)
    return True


# Rounds of rematerializing shared side chains (each round takes one more region's copies).
MAX_REMAT_ROUNDS = 8


def _rematerialize_shared_sides(att: "Attention", block) -> int:
    """Side inputs that are cheap side chains shared with other code (a padding mask broadcast
    to ``[B, H, S, S]`` once and read by every layer's attention, as CSE leaves it): give this
    region its own copy of the chain, so its inputs are the chain's small leaves (the ``[B, S]``
    mask) instead of the materialized result. Only when the leaves are no more bytes than the
    value they replace. Exact: the same ops on the
    same values. Dense constants (a folded causal mask shared by every layer) are copied too:
    the kernel reads them statically. The originals stay for their other users (dead ones are
    removed later).
    Returns the number of side inputs rematerialized."""
    members = set(att.members)
    n = 0
    for v, _ in list(att.side_inputs):
        p = hir.defining_op(v)
        if p is None or not _remat_op_ok(p, block):
            continue
        tree, leaves, stack, seen = [], {}, [p], set()
        while stack:
            op = stack.pop()
            if op in seen:
                continue
            seen.add(op)
            tree.append(op)
            for a in op.operands:
                q = hir.defining_op(a)
                if q is not None and is_splat_constant(q):
                    continue
                if q is not None and _remat_op_ok(q, block):
                    stack.append(q)
                else:
                    leaves[hir.value_key(a)] = a
        info = hir.tensor_type_info(v.type)
        leaf_bytes = sum(hir.tensor_type_info(a.type).nbytes for a in leaves.values())
        if info is None or leaf_bytes > info.nbytes:
            continue
        users = [(hir.as_op(u.owner), u.operand_number) for u in v.uses
                 if hir.as_op(u.owner) in members]
        if not users:
            continue
        first = min((u for u, _ in users), key=att.members.index)   # members: program order
        in_tree = set(tree)
        copy = gu.clone_tree(p, first, lambda o: o in in_tree)
        for u, j in users:
            u.operands[j] = copy
        n += 1
    return n


def _remat_op_ok(op, block) -> bool:
    """A cheap side op that may be copied into a region: a layout op, an elementwise op or a
    dense constant (up to :data:`MAX_CONST_BYTES`: a folded causal mask, which the kernel then
    reads statically and skips masked blocks by), one result, in ``block``."""
    if not _same_block(op, block) or len(op.results) != 1 or len(op.regions):
        return False
    return _side_op_ok(op)


def _unshare_generators(block) -> int:
    """Give each user of a shared iota / splat broadcast its own copy (CSE merged them).

    A shared generator would otherwise become a materialized region input. Bit-exact.
    """
    n = 0
    for op in hir.block_ops(block):
        is_gen = op.name == "stablehlo.iota" or (
            op.name == "stablehlo.broadcast_in_dim" and _splat(op.results[0]) is not None)
        if not is_gen or len(op.results) != 1:
            continue
        uses = list(op.results[0].uses)
        if len(uses) < 2:
            continue
        for u in uses[1:]:
            owner = getattr(u.owner, "operation", u.owner)
            if not _same_block(owner, block):
                continue
            with ir.InsertionPoint(owner), op.location:
                clone = op.clone()
            owner.operands[u.operand_number] = clone.results[0]
            n += 1
    return n


# Reasons a forward match refuses only because a backward reads its intermediates.
_USED_OUTSIDE = ("used outside", "several users", "shared constant")
