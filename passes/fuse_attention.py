"""``fuse-attention``: recognize attention in StableHLO and outline it for a flash kernel.

Rewrites: every subgraph of the form

    s = dot_general(Q, K)                   # QKᵀ, any head layout, with or without transposes
    x = chain(s, side values)               # scale (×, ÷), additive bias/mask, select masks
                                            # (iota+compare causal, tril, -inf or finite fill),
                                            # converts, transposes, unit reshapes, clamps, ...
    p = exp(x - max(x)) / sum(exp(...))     # softmax over the key dim (jax.nn.softmax or by hand)
    o = dot_general(p, V)                   # P·V (converts/transposes of p allowed)

becomes ``func.func private @hlofuse_attention_N`` (``hlofuse.kind = "attention"``) plus one
call; ``kernelize`` then turns it into a flash (online-softmax) kernel from
:mod:`hlofuse.kernels.attention`. K/V heads repeated with ``jnp.repeat`` or broadcast from one
head with ``jnp.broadcast_to`` (GQA/MQA) are taken into the region so the kernel reads the
unshared K/V; multi-query attention written with K/V without a head dim and
``jax.nn.dot_product_attention``'s XLA implementation (5-D grouped layout) match natively.

How: the match is anchored at the P·V ``dot_general``. Its probability operand is walked back to
the softmax; the softmax input ``x`` is walked back to the unique full-size ``dot_general`` that
feeds it (QKᵀ). Every dim of every value in between gets a *label* (a batch dim, a query-row
dim, the key dim, or none for unit dims) so layouts, transposes and broadcasts are understood
structurally, never by op order or names. Side values (masks, biases, iotas) are pulled into the
region while they are cheap generators used only inside it, so the region's inputs are the
small pre-broadcast tensors, never a materialized ``[B, H, Sq, Sk]`` mask.

Not matched (left alone, with the reason available from :func:`analyze`): intermediates used
outside the region (returned attention weights; the residuals a backward program keeps, so
attention inside ``jax.grad``'s backward program stays with XLA), dropout (the probabilities
feed a multiply by a random mask, not the P·V product), softmax over a non-key dim, two
candidate QKᵀ products, dynamic shapes.

Preconditions: calls inlined (``inline-calls``); runs after ``cse`` and before the other fusion
passes so it claims its ops first. Invariant: the module verifies; results equal the original
within the ``reassociate`` tolerance (the kernel evaluates the same logit ops, then an online
softmax that reassociates the sums), including fully masked rows, NaN and infinities.
"""

from __future__ import annotations

import dataclasses
import heapq
import itertools
import math

import numpy as np
from jaxlib.mlir import ir
from jaxlib.mlir.dialects import stablehlo

from hlofuse import ir as hir
from hlofuse.ops import EmitError, OpClass, const_value, rule_for
from hlofuse.pipeline import Pass, register_pass

__all__ = ["NoMatch", "Attention", "analyze", "find_attention", "FuseAttention"]

KIND = "attention"
BCAST = "<bcast>"       # a dim produced by broadcasting a unit dim (the key dim of row stats)
FLOAT_TYPES = ("f32", "bf16", "f16")
# Dense constants (a constant-folded tril mask, a captured numpy bias) up to this size are taken
# into the region: the kernel slices them like inputs and can read position masks statically.
MAX_CONST_BYTES = 4 << 20
# Side ops the kernel can evaluate blockwise from labels (plus splat constants and iotas).
_SIDE_SHAPE_OPS = ("stablehlo.broadcast_in_dim", "stablehlo.transpose", "stablehlo.reshape",
                   "stablehlo.iota", "stablehlo.constant")


class NoMatch(Exception):
    """The subgraph is not attention the kernel can take; the message says why."""


# ---------------------------------------------------------------------------------------------
# Small IR helpers
# ---------------------------------------------------------------------------------------------

def producer(v: ir.Value):
    owner = v.owner
    if isinstance(owner, ir.Block):
        return None
    return getattr(owner, "operation", owner)


def vkey(v: ir.Value):
    """A hashable identity for a value (``ir.Value`` objects are not uniqued)."""
    owner = v.owner
    if isinstance(owner, ir.Block):
        return ("arg", owner, ir.BlockArgument(v).arg_number)
    return ("res", getattr(owner, "operation", owner), ir.OpResult(v).result_number)


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


def _uses(v: ir.Value) -> list:
    return [getattr(u.owner, "operation", u.owner) for u in v.uses]


def splat_value(v: ir.Value):
    """The scalar of a value that is a splat (constant, or broadcast/convert/reshape of one)."""
    p = producer(v)
    while p is not None and p.name in ("stablehlo.broadcast_in_dim", "stablehlo.reshape",
                                        "stablehlo.convert"):
        p = producer(p.operands[0])
    if p is None or p.name != "stablehlo.constant":
        return None
    try:
        attr = ir.DenseElementsAttr(p.attributes["value"])
        if not attr.is_splat:
            return None
        s = attr.get_splat_value()
        if isinstance(s, ir.BoolAttr):  # hlofuse.ops.const_value does not read i1 splats
            return float(ir.BoolAttr(s).value)
        return float(np.asarray(const_value(p)).astype(np.float64).flat[0])
    except (EmitError, ValueError, TypeError):
        return None


def reducer_kind(op) -> str | None:
    """'add' / 'max' for a single-operand reduce whose body is one add / maximum, else None."""
    if op.name != "stablehlo.reduce" or len(op.operands) != 2 or len(op.results) != 1:
        return None
    body = [o.operation for o in op.regions[0].blocks[0].operations]
    if len(body) != 2 or body[1].name != "stablehlo.return":
        return None
    return {"stablehlo.add": "add", "stablehlo.maximum": "max"}.get(body[0].name)


def dot_dims(op) -> stablehlo.DotDimensionNumbers:
    return stablehlo.DotDimensionNumbers(op.attributes["dot_dimension_numbers"])


def _dot_parts(op):
    dn = dot_dims(op)
    lb, rb = list(dn.lhs_batching_dimensions), list(dn.rhs_batching_dimensions)
    lc, rc = list(dn.lhs_contracting_dimensions), list(dn.rhs_contracting_dimensions)
    lr, rr = len(shape_of(op.operands[0])), len(shape_of(op.operands[1]))
    lf = [d for d in range(lr) if d not in lb and d not in lc]
    rf = [d for d in range(rr) if d not in rb and d not in rc]
    return lb, rb, lc, rc, lf, rf


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

@dataclasses.dataclass(frozen=True)
class Repeat:
    """GQA: K/V head label ``label`` (size H) is ``jnp.repeat`` of ``H // groups`` kv heads."""
    label: str
    groups: int

    @property
    def kv(self) -> str:
        return self.label + ".kv"

    @property
    def g(self) -> str:
        return self.label + ".g"


@dataclasses.dataclass
class Attention:
    """Everything structural about one matched attention subgraph (see module docstring).

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
    dims: dict                       # vkey -> labels, for every chain value and side input
    s_key: object                    # vkey of the QKᵀ result
    x_key: object                    # vkey of the softmax input
    m_init: float                    # the max-reduction's initial value (folded with maxima)
    out_dims: tuple                  # labels of the P·V result
    repeat: Repeat | None
    x_dtype: str
    p_dtype: str                     # dtype of P as the P·V product reads it
    out_dtype: str
    precision: tuple                 # (QKᵀ precision, P·V precision)
    causal_like: bool = False        # a select against an iota-only predicate feeds x

    @property
    def all_sides(self) -> list:
        """Blockwise-sliced operands of the logit ops: region inputs, then dense constants."""
        return list(self.side_inputs) + list(self.const_sides)

    @property
    def sq(self) -> str:
        """The row label tiled as the query sequence: the largest row (last on ties)."""
        rows, sizes = self.canonical_rows, self.label_sizes()
        return max(reversed(rows), key=lambda r: sizes[r])

    @property
    def canonical_batch(self) -> list:
        if self.repeat is None:
            return list(self.batch)
        return [self.repeat.kv if b == self.repeat.label else b for b in self.batch]

    @property
    def canonical_rows(self) -> list:
        rows = list(self.rows)
        return ([self.repeat.g] if self.repeat else []) + rows

    @property
    def rows_other(self) -> list:
        sq = self.sq
        return [r for r in self.canonical_rows if r != sq]

    @property
    def order(self) -> list:
        """Canonical label order of the logits: batch..., other rows..., sq, key."""
        return self.canonical_batch + self.rows_other + [self.sq, self.key]

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
    except Exception:
        return False


def _walk_back(v, allowed: tuple, *, single_use: bool = True):
    """Follow ``v`` back through one-operand ops named in ``allowed``; returns (value, ops)."""
    ops = []
    while True:
        p = producer(v)
        if p is None or p.name not in allowed:
            return v, ops
        if single_use and len(_uses(v)) != 1:
            raise NoMatch(f"intermediate '{p.name}' result has several users")
        ops.append(p)
        v = p.operands[0]


def _stat_chain(v, kind: str):
    """Walk a broadcast-back row statistic to its reduce: returns (reduce op, ops, folded init).

    ``kind='max'`` also folds ``maximum(splat, m)`` (``jnp.max(..., initial=-inf)``)."""
    ops, extra = [], []
    while True:
        p = producer(v)
        if p is None:
            raise NoMatch("softmax statistic comes from a region input")
        if p.name == "stablehlo.reduce":
            if reducer_kind(p) != kind:
                raise NoMatch(f"softmax {kind} is not a single-op {kind} reduce")
            init = splat_value(p.operands[1])
            if init is None:
                raise NoMatch("reduce init is not a constant")
            return p, ops, init if not extra else max([init] + extra)
        if len(_uses(v)) != 1:
            raise NoMatch("softmax statistic has several users")
        if p.name in ("stablehlo.broadcast_in_dim", "stablehlo.reshape", "stablehlo.convert",
                      "stablehlo.transpose"):
            ops.append(p)
            v = p.operands[0]
            continue
        if kind == "max" and p.name == "stablehlo.maximum":
            a, b = p.operands
            ca, cb = splat_value(a), splat_value(b)
            if (ca is None) == (cb is None):
                raise NoMatch("maximum in the softmax max is not against a constant")
            const_v, other = (a, b) if ca is not None else (b, a)
            extra.append(ca if ca is not None else cb)
            ops.append(p)
            cp = producer(const_v)
            if cp is not None and cp.name != "stablehlo.constant":
                if len(_uses(const_v)) != 1:
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
                                               and splat_value(op.results[0]) is not None):
            continue
        dims = fwd_dims(op, dims)
    want = tuple(BCAST if d == key else d for d in want_dims)
    if dims != want:
        raise NoMatch("softmax statistic is not broadcast back along the reduced dim")


def _match_repeat(v: ir.Value, head_axis: int):
    """K/V heads shared by groups of query heads? -> (unshared x, G, ops) or None.

    ``reshape(broadcast_in_dim(x))`` is ``jnp.repeat(x, G, axis=head_axis)``; a lone
    ``broadcast_in_dim`` from one head (``jnp.broadcast_to``) shares it with all G heads.
    """
    rs = producer(v)
    if rs is not None and rs.name == "stablehlo.broadcast_in_dim" and len(_uses(v)) == 1:
        src = rs.operands[0]
        s_in, s_out = shape_of(src), shape_of(v)
        if (_i64s(rs, "broadcast_dimensions") == list(range(len(s_in))) and s_in[head_axis] == 1
                and all(a == b for i, (a, b) in enumerate(zip(s_in, s_out)) if i != head_axis)):
            return src, s_out[head_axis], [rs]
        return None
    if rs is None or rs.name != "stablehlo.reshape" or len(_uses(v)) != 1:
        return None
    b = producer(rs.operands[0])
    if b is None or b.name != "stablehlo.broadcast_in_dim" or len(_uses(rs.operands[0])) != 1:
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
        k = vkey(v)
        old = self.dims.get(k)
        if old is not None and old != tuple(dims):
            raise NoMatch(f"value used with conflicting layouts {old} vs {tuple(dims)}")
        self.dims[k] = tuple(dims)


def block_index(block) -> dict:
    """Program position of every op of ``block``."""
    return {op: i for i, op in enumerate(hir.block_ops(block))}


def analyze(pv, index: dict | None = None) -> Attention:
    """Match attention ending at the P·V ``dot_general`` ``pv``; raises :class:`NoMatch`.

    ``index``: :func:`block_index` of ``pv``'s block, when the caller analyzes many dots."""
    if pv.name != "stablehlo.dot_general":
        raise NoMatch("not a dot_general")
    reasons = []
    for p_idx in (0, 1):
        try:
            return _analyze(pv, p_idx, index)
        except NoMatch as e:
            reasons.append(str(e))
    raise NoMatch("; ".join(dict.fromkeys(reasons)))


def _analyze(pv, p_idx: int, index: dict | None) -> Attention:
    block = pv.block
    # --- 1. probabilities: P·V operand back to the normalizing divide ---------------------
    p_val, p_ops = _walk_back(pv.operands[p_idx], ("stablehlo.convert", "stablehlo.transpose",
                                                   "stablehlo.reshape", "stablehlo.broadcast_in_dim"))
    div = producer(p_val)
    if div is None or div.name != "stablehlo.divide":
        raise NoMatch("P·V operand is not a softmax (no normalizing divide)")
    if len(_uses(p_val)) != 1:
        raise NoMatch("softmax probabilities are used outside the P·V product")
    e_val, den = div.operands
    ex = producer(e_val)
    if ex is None or ex.name != "stablehlo.exponential":
        raise NoMatch("softmax numerator is not exp")
    # --- 2. softmax sum and max ----------------------------------------------------------
    r_sum, sum_ops, sum_init = _stat_chain(den, "add")
    if sum_init != 0.0:
        raise NoMatch("softmax sum has a non-zero init")
    e_src, e_conv = _walk_back(r_sum.operands[0], ("stablehlo.convert",))
    if vkey(e_src) != vkey(e_val):
        raise NoMatch("softmax sum is not over the numerator")
    if len(_uses(e_val)) != 2 or len(_uses(r_sum.results[0])) != 1:
        raise NoMatch("softmax numerator or sum used outside the softmax")
    sub = producer(ex.operands[0])
    if sub is None or sub.name != "stablehlo.subtract" or len(_uses(ex.operands[0])) != 1:
        raise NoMatch("exp argument is not x - max(x)")
    x_sub, bm = sub.operands
    r_max, max_ops, m_init = _stat_chain(bm, "max")
    x_val = r_max.operands[0]
    # the subtract may see x through layout ops (jax.nn.dot_product_attention transposes it)
    x_layout, v = [], x_sub
    while vkey(v) != vkey(x_val):
        p = producer(v)
        if p is None or p.name not in ("stablehlo.transpose", "stablehlo.reshape",
                                       "stablehlo.broadcast_in_dim") or len(_uses(v)) != 1:
            raise NoMatch("softmax max is not over the same logits")
        x_layout.append(p)
        v = p.operands[0]
    x_user = x_layout[-1] if x_layout else sub
    if set(_uses(x_val)) != {r_max, x_user} or len(_uses(x_val)) != 2 or len(_uses(r_max.results[0])) != 1:
        raise NoMatch("logits or their max used outside the softmax")
    x_shape = shape_of(x_val)
    rdims = _i64s(r_max, "dimensions")
    if len(rdims) != 1 or len(_i64s(r_sum, "dimensions")) != 1 or x_shape[rdims[0]] == 1:
        raise NoMatch("softmax must reduce exactly one (non-unit) dim")
    key_axis = rdims[0]
    if dtype_of(x_val) not in FLOAT_TYPES:
        raise NoMatch(f"logits of type {dtype_of(x_val)}")

    cx = _Ctx(block, index)
    # --- 3. the QKᵀ product: the unique full-size dot feeding x ---------------------------
    numel = math.prod(x_shape)
    seen, stack, dots, visited_ops = set(), [x_val], {}, set()
    while stack:
        v = stack.pop()
        p = producer(v)
        if p is None or vkey(v) in seen or math.prod(shape_of(v)) != numel:
            continue
        seen.add(vkey(v))
        if not _same_block(p, block):
            continue
        if p.name == "stablehlo.dot_general":
            dots[p] = True
            continue
        rule = rule_for(p.name)
        if len(p.results) != 1 or len(p.regions) or not (
                (rule.cls is OpClass.ELEMENTWISE and rule.emit is not None)
                or p.name in ("stablehlo.transpose", "stablehlo.reshape", "stablehlo.broadcast_in_dim")):
            continue
        visited_ops.add(p)
        stack.extend(p.operands)
    if len(dots) != 1:
        raise NoMatch("no unique QKᵀ dot_general feeds the logits" if dots else
                      "logits do not come from a dot_general")
    qk = next(iter(dots))
    if dtype_of(qk.results[0]) not in FLOAT_TYPES:
        raise NoMatch("QKᵀ result is not floating point")

    # labels of the QKᵀ result
    lb, rb, lc, rc, lf, rf = _dot_parts(qk)
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
    s_dims = tuple(s_dims)
    cx.set_dims(qk.results[0], s_dims)

    # --- 4. main chain: ops on paths QKᵀ -> x, in program order ------------------------------
    main_vals = {vkey(qk.results[0])}
    main_ops = []
    for op in sorted(visited_ops, key=lambda o: cx.index[o]):
        if any(vkey(a) in main_vals for a in op.operands):
            main_ops.append(op)
            main_vals.add(vkey(op.results[0]))
    if vkey(x_val) not in main_vals and vkey(x_val) != vkey(qk.results[0]):
        raise NoMatch("logits are not computed from QKᵀ")
    side_reqs = []  # (value, dims) required by a member
    for op in main_ops:
        mains = [a for a in op.operands if vkey(a) in main_vals]
        dims0 = cx.dims[vkey(mains[0])]
        if op.name in ("stablehlo.transpose", "stablehlo.reshape", "stablehlo.broadcast_in_dim"):
            out = fwd_dims(op, dims0)
            if BCAST in out:
                raise NoMatch("logits broadcast along a new dim")
        else:
            for a in mains[1:]:
                if cx.dims[vkey(a)] != dims0:
                    raise NoMatch(f"'{op.name}' combines logits in different layouts")
            out = dims0
        cx.set_dims(op.results[0], out)
        for j, a in enumerate(op.operands):
            if vkey(a) not in main_vals:
                side_reqs.append((a, bwd_dims(op, out, j), op))
    x_dims = cx.dims[vkey(x_val)]
    key = x_dims[key_axis]
    if key is None or key[0] not in "lr":
        raise NoMatch("softmax is not over a free dim of QKᵀ")
    # x - max must be broadcast along the key only
    xs_dims = x_dims
    for op in reversed(x_layout):
        xs_dims = fwd_dims(op, xs_dims)
        if BCAST in xs_dims:
            raise NoMatch("logits broadcast inside the softmax")
        cx.set_dims(op.results[0], xs_dims)
    _row_stat_dims(max_ops, x_dims, key_axis, key, xs_dims)
    _row_stat_dims(sum_ops, xs_dims, _i64s(r_sum, "dimensions")[0], key, xs_dims)
    for v in (sub.results[0], ex.results[0], div.results[0]):
        cx.set_dims(v, xs_dims)

    # Q / K roles
    k_side = 0 if key[0] == "l" else 1
    q_side = 1 - k_side
    k_free = [f"{'lr'[k_side]}{d}" for d in (lf, rf)[k_side]]
    if any(f in sizes and f != key for f in k_free):
        raise NoMatch("K has free dims besides the key")
    batch = [f"b{i}" for i in range(len(lb)) if f"b{i}" in sizes]
    rows = [f"{'lr'[q_side]}{d}" for d in (lf, rf)[q_side] if f"{'lr'[q_side]}{d}" in sizes]
    if not rows:
        raise NoMatch("no query rows")
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
    q_dims = operand_dims(q_shape, q_b, qc, q_f, "lr"[q_side])
    k_dims = operand_dims(k_shape, k_b, kc, k_f, "lr"[k_side])

    # --- 5. probabilities through their pass-through ops to P·V -------------------------------
    pd = xs_dims
    for op in reversed(p_ops):
        pd = fwd_dims(op, pd)
        if BCAST in pd:
            raise NoMatch("probabilities broadcast before P·V")
        cx.set_dims(op.results[0], pd)
    plb, prb, plc, prc, plf, prf = _dot_parts(pv)
    pb, vb_, pc, vc, pf, vf = (plb, prb, plc, prc, plf, prf) if p_idx == 0 else (prb, plb, prc, plc, prf, plf)
    v_val = pv.operands[1 - p_idx]
    v_shape = shape_of(v_val)
    if [pd[a] for a in pc if pd[a] is not None] != [key]:
        raise NoMatch("P·V does not contract the key dim")
    if sorted(pd[a] for a in pb if pd[a] is not None) != sorted(batch):
        raise NoMatch("P·V batch dims differ from QKᵀ batch dims")
    if sorted(pd[a] for a in pf if pd[a] is not None) != sorted(rows):
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
    v_dims = tuple(v_dims)
    pv_out = ([pd[a] for a in pb] + ([pd[a] for a in pf] + [v_dims[a] for a in vf] if p_idx == 0
                                     else [v_dims[a] for a in vf] + [pd[a] for a in pf]))
    out_dims = tuple(pv_out)

    # --- 6. GQA: K and V repeated along the same batch label ------------------------------------
    repeat, repeat_ops = None, []
    for lab in batch:
        kax, vax = k_dims.index(lab), v_dims.index(lab)
        mk, mv = _match_repeat(k_val, kax), _match_repeat(v_val, vax)
        if mk and mv and mk[1] == mv[1] and vkey(k_val) != vkey(v_val):
            repeat = Repeat(lab, mk[1])
            repeat_ops = mk[2] + mv[2]
            k_val, v_val = mk[0], mv[0]
            k_dims = tuple(repeat.kv if d == lab else d for d in k_dims)
            v_dims = tuple(repeat.kv if d == lab else d for d in v_dims)
            break

    # --- 7. side values: pull cheap generators into the region ------------------------------
    members = set(main_ops) | {qk, pv, div, ex, sub, r_max, r_sum} | set(max_ops) | set(sum_ops) \
        | set(e_conv) | set(p_ops) | set(repeat_ops) | set(x_layout)
    reqs: dict = {}
    heap, tick = [], itertools.count()
    side_inputs = []

    def require(v, dims):
        k = vkey(v)
        reqs.setdefault(k, (v, []))[1].append(tuple(dims))
        p = producer(v)
        if p is not None and _same_block(p, block) and p not in members:
            heapq.heappush(heap, (-cx.index[p], next(tick), p))

    for v, dims, _ in side_reqs:
        require(v, dims)
    done = set()
    while heap:
        _, _, p = heapq.heappop(heap)
        if p in done:
            continue
        done.add(p)
        r = p.results[0] if len(p.results) == 1 else None
        ok = (r is not None and not len(p.regions) and _side_op_ok(p)
              and all(u in members for u in _uses(r)))
        if not ok:
            continue  # its result stays a region input
        dims = _merge(reqs[vkey(r)][1])
        members.add(p)
        cx.set_dims(r, dims)
        for j, a in enumerate(p.operands):
            require(a, bwd_dims(p, dims, j))
    for k, (v, dl) in reqs.items():
        p = producer(v)
        dims = _merge(dl)
        if p is None or p not in members:
            if p is not None and p.name == "stablehlo.constant" and splat_value(v) is not None:
                cx.set_dims(v, dims)   # splat constants are cloned into the region
                continue
            cx.set_dims(v, dims)
            side_inputs.append((v, dims))
    # every side input's labels must be known logits labels
    for v, dims in side_inputs + [(op.results[0], cx.dims[vkey(op.results[0])]) for op in members
                                  if op.name == "stablehlo.constant"]:
        for d, n in zip(dims, shape_of(v)):
            if d is not None and sizes.get(d) != n:
                raise NoMatch("side input does not line up with the logits")

    # --- 8. the region is closed: only the P·V result leaves it ----------------------------
    for op in members:
        for r in op.results:
            if op is pv:
                continue
            if any(u not in members for u in _uses(r)):
                raise NoMatch(f"intermediate '{op.name}' is used outside the attention")
    ordered = sorted(members, key=lambda o: cx.index[o])
    if ordered[-1] is not pv:
        raise NoMatch("internal: P·V is not the last op of the region")
    not_chain = {qk, pv, div, ex, sub, r_max, r_sum} | set(max_ops) | set(sum_ops) | set(e_conv) \
        | set(p_ops) | set(repeat_ops) | set(x_layout)
    steps = [op for op in ordered if op not in not_chain]
    for d in x_dims:
        if d is not None and d not in set(batch) | set(rows) | {key}:
            raise NoMatch("logits carry a dim that is not batch/row/key")
    att = Attention(
        qk=qk, pv=pv, members=ordered, sizes=sizes, batch=batch, rows=rows, key=key,
        q=q_val, k=k_val, v=v_val, q_dims=q_dims, k_dims=k_dims, v_dims=v_dims,
        head_dim=head_dim, v_head_dim=v_head, side_inputs=side_inputs, steps=steps, dims=cx.dims,
        const_sides=[(op.results[0], cx.dims[vkey(op.results[0])]) for op in steps
                     if op.name == "stablehlo.constant" and splat_value(op.results[0]) is None],
        s_key=vkey(qk.results[0]), x_key=vkey(x_val), m_init=m_init, out_dims=out_dims,
        repeat=repeat, x_dtype=dtype_of(x_val), p_dtype=dtype_of(pv.operands[p_idx]),
        out_dtype=dtype_of(pv.results[0]), precision=(precision_of(qk), precision_of(pv)))
    att.causal_like = _has_iota_select(att)
    return att


def _side_op_ok(op) -> bool:
    if op.name == "stablehlo.constant":
        info = hir.tensor_type_info(op.results[0].type)
        return splat_value(op.results[0]) is not None or (
            info is not None and info.nbytes <= MAX_CONST_BYTES)
    if op.name == "stablehlo.reshape":
        return _nonunit(shape_of(op.operands[0])) == _nonunit(shape_of(op.results[0]))
    if op.name in _SIDE_SHAPE_OPS:
        return True
    rule = rule_for(op.name)
    return rule.cls is OpClass.ELEMENTWISE and rule.emit is not None


def _merge(dl: list) -> tuple:
    first = dl[0]
    for d in dl[1:]:
        if d != first:
            raise NoMatch(f"side value used with conflicting layouts {first} vs {d}")
    return first


def _has_iota_select(att: Attention) -> bool:
    """A select whose predicate is built from iotas/constants only (causal and friends)."""
    from hlofuse.kernels.attention import AttentionSpec, _x_select
    return _x_select(AttentionSpec(att)) is not None


def find_attention(block) -> list[Attention]:
    """Every non-overlapping attention match in ``block``, program order of the P·V products."""
    found, taken = [], set()
    index = block_index(block)
    for op in hir.block_ops(block):
        if op.name != "stablehlo.dot_general":
            continue
        try:
            att = analyze(op, index)
        except NoMatch:
            continue
        if any(m in taken for m in att.members):
            continue
        taken.update(att.members)
        found.append(att)
    return found


def const_array(v) -> np.ndarray:
    """The value of a (dense or splat) ``stablehlo.constant`` result as numpy."""
    return np.asarray(const_value(producer(v)))


def _unshare_generators(block) -> int:
    """Give each user of a shared iota / splat broadcast its own copy (CSE merged them).

    A shared generator would otherwise become a materialized region input. Bit-exact.
    """
    n = 0
    for op in hir.block_ops(block):
        is_gen = op.name == "stablehlo.iota" or (
            op.name == "stablehlo.broadcast_in_dim" and splat_value(op.results[0]) is not None)
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


@register_pass
class FuseAttention(Pass):
    """See the module docstring."""
    name = "fuse-attention"

    def run(self, module, ctx):
        from hlofuse.passes.fusion.commit import record_region
        from hlofuse.passes.fusion.outline import outline_region, program_blocks, region_boundary
        n = 0
        for block in program_blocks(module):
            ops = hir.block_ops(block)
            if not any(o.name == "stablehlo.exponential" for o in ops) or \
                    sum(o.name == "stablehlo.dot_general" for o in ops) < 2:
                continue
            with module.context:
                _unshare_generators(block)
            for att in find_attention(block):
                boundary = region_boundary(att.members)
                region = record_region(
                    ctx, KIND, att.members, boundary,
                    layout=_layout_str(att), mask=_mask_kind(att),
                    gqa_groups=att.repeat.groups if att.repeat else 1,
                    seq_q=att.label_sizes()[att.sq], seq_k=att.sizes[att.key])
                outline_region(module, att.members, f"hlofuse_attention_{region.id}",
                               region_id=region.id, kind=KIND)
                n += 1
        return {"attention_regions": n}


def _mask_kind(att: Attention) -> str:
    names = {op.name for op in att.steps}
    kinds = []
    if "stablehlo.select" in names:
        kinds.append("select(" + ("positions" if att.causal_like else "mask") + ")")
    if names & {"stablehlo.add", "stablehlo.subtract"} and att.all_sides:
        kinds.append("additive")
    return "+".join(kinds) or "none"


def _layout_str(att: Attention) -> str:
    def name(d):
        if d is None:
            return "1"
        if d in ("d", "dv"):
            return "D"
        if d == att.key:
            return "K"
        if d == att.sq:
            return "S"
        if att.repeat and d == att.repeat.kv:
            return "Hkv"
        if d in att.batch:
            return "B"
        return "H"
    return "q:" + "".join(name(d) for d in att.q_dims) + " k:" + "".join(
        name(d) for d in att.k_dims)
