"""``fold-dot-repeats``: a ``dot_general`` operand repeated along a batch dim (grouped-query
attention's K and V, repeated to the query heads) is read unrepeated; the repeat becomes a free
dim of the other operand.

Why: ``jnp.repeat(k, g, axis=heads)`` (Flax, Transformers, Equinox GQA layers: KV heads repeated
to the query heads) is a ``broadcast_in_dim`` + ``reshape``, and XLA materializes it before the
dot: a decode step with a 4096-token KV cache, 32 query heads over 8 KV heads, copies K and V
four times (512 MiB of temporaries at B=4) and runs 128 one-row products where 32 four-row ones
do. Folded, the same step ran 6.9x faster on cpu, with 136 MiB of temporaries instead of 539.
fuse-attention builds GQA into its kernels where it matches (prefill, training); this pass
covers what it leaves to XLA: decode steps (one query row), attention with dropout, any
batched product of a repeated operand.

Rewrites: ``dot_general(X, O)`` (either side) where ``X = reshape(broadcast_in_dim(Y))``, the
broadcast repeats ``Y`` ``G`` times along one new (or size-1) dim, and the reshape merges that
dim with its neighbour ``a`` into a batch dim of the product (or ``X = broadcast_in_dim(Y)``
growing one size-1 dim: ``jnp.broadcast_to`` of a single KV head, ``a = 1``) (``a*G``: ``repeat`` order,
index ``i*G + g``; ``G*a``: ``tile`` order, ``g*a + i``). Then ``O``'s paired batch dim is
split into ``(a, G)`` (resp. ``(G, a)``), the product reads ``Y`` with ``a`` as that batch dim
and ``G`` as a free dim of ``O``, and a transpose (when ``G`` does not land next to ``a``) and
a reshape give the original result. The repeat stays for its other users.

Not rewritten: a repeat along a contracting or free dim (different rewrites); a broadcast that
repeats more than one dim or permutes dims; hlofuse's outlined regions (fuse-attention's
kernels handle GQA themselves).

Preconditions: calls inlined. After ``fuse-attention``, whose GQA match reads the repeat, and
before the matmul fusions, which then see the smaller product.
Sharded programs (after ``propagate-shardings``): the new ops carry shardings, the merged
dim's axes on its major factor (kernelize reads them for per-shard kernels); a product whose
shardings cannot be kept so (the axes do not divide that factor) is left as it is.
Invariant: the module verifies; each output element is the same sum of the same products, but
XLA may block a product of other shapes differently, so results may reassociate
(``reassociate`` tolerance). Rerunning changes nothing (the new product reads ``Y``).
Statistics: ``folded`` (products rewritten). ``disable=["fold-dot-repeats"]`` turns it off; off on tpu unless
``on_tpu=true`` (more memory there in training, see ``Options``).
"""

from __future__ import annotations

import dataclasses
import math

from jaxlib.mlir import ir
from jaxlib.mlir.dialects import stablehlo

from hlofuse.core import ir as hir
from hlofuse.core.pipeline import Pass
from hlofuse.passes import graph_util as gu
from hlofuse.passes import sharding as shd


@dataclasses.dataclass(frozen=True)
class Repeat:
    """``X = reshape(broadcast_in_dim(y))``: ``y`` repeated ``g`` times, merged with its
    neighbour into ``X``'s dim ``m``; ``interleave``: ``repeat`` order (``a*G``)."""
    y: ir.Value
    m: int
    a: int
    g: int
    interleave: bool

    def unrepeated(self, shape) -> list:
        """``shape`` (the repeated operand's) with dim ``m`` of size ``a``: ``y`` in its dims."""
        return list(shape[:self.m]) + [self.a] + list(shape[self.m + 1:])


def repeat_of(x: ir.Value) -> Repeat | None:
    """``x`` as a repeat of a smaller value along one dim, or None. The reshape may also add
    or drop unit dims (``jnp.tile`` makes ``[1, b, 1, s, G, kv, 1, d]``): the non-unit dims of
    the broadcast must group, in order, into ``x``'s dims, the repeated one first (``tile``)
    or last (``repeat``) in its group."""
    bc = gu.is_op(x, "stablehlo.broadcast_in_dim")
    if bc is not None:      # broadcast_to of one KV head (multi-query attention)
        y, yi, xi = bc.operands[0], gu.info(bc.operands[0]), gu.info(x)
        if yi is None or xi is None or len(yi.shape) != len(xi.shape):
            return None
        grown = [d for d, (m, n) in enumerate(zip(yi.shape, xi.shape)) if m != n]
        if gu.i64_array(bc, "broadcast_dimensions") != list(range(len(xi.shape))) or len(grown) != 1:
            return None
        return Repeat(y, grown[0], 1, xi.shape[grown[0]], True)
    rs = gu.is_op(x, "stablehlo.reshape")
    if rs is None:
        return None
    bc = gu.is_op(rs.operands[0], "stablehlo.broadcast_in_dim")
    if bc is None:
        return None
    y = bc.operands[0]
    yi, bi, xi = gu.info(y), gu.info(bc.results[0]), gu.info(x)
    if yi is None or bi is None or xi is None:   # dynamic shapes
        return None
    dims = gu.i64_array(bc, "broadcast_dimensions")
    if any(b <= a for a, b in zip(dims, dims[1:])):
        return None                       # permutes dims
    bs, xs = list(bi.shape), list(xi.shape)
    repeated = [j for j in range(len(bs))
                if bs[j] > 1 and (j not in dims or yi.shape[dims.index(j)] == 1)]
    if len(repeated) != 1:
        return None
    j = repeated[0]
    g = bs[j]
    # group the broadcast's non-unit dims into x's non-unit dims (a reshape that only merges)
    src = [(i, n) for i, n in enumerate(bs) if n > 1]
    pos = 0
    for m, n in enumerate(xs):
        if n == 1:
            continue
        group, prod = [], 1
        while prod < n and pos < len(src):
            group.append(src[pos])
            prod *= src[pos][1]
            pos += 1
        if prod != n:
            return None                   # the reshape splits a dim
        idx = [i for i, _ in group]
        if j in idx:
            a = n // g
            if idx[-1] == j:
                return Repeat(y, m, a, g, True)
            if idx[0] == j:
                return Repeat(y, m, a, g, False)
            return None
    return None


@dataclasses.dataclass(frozen=True)
class _Shardings:
    """A propagated sharded module's shardings for the ops a fold makes: the merged dim's axes
    go to its major factor (``a`` in ``repeat`` order, ``G`` in ``tile`` order)."""
    mesh: str
    a_axes: tuple
    g_axes: tuple
    other: tuple       # the other operand's
    out: tuple         # the product's
    y: tuple           # the unrepeated operand's, in the repeated operand's dims


def _shardings(dot, s: int, rep: Repeat, m_o: int, k: int, mesh) -> _Shardings | None:
    """The shardings a fold keeps, or None when it cannot keep them (unknown, inconsistent, or
    the merged dim's axes do not divide its major factor): then the product is left as it is."""
    name, axes = mesh
    s_x, s_o = shd.value_sharding(dot.operands[s]), shd.value_sharding(dot.operands[1 - s])
    s_out, s_y = shd.value_sharding(dot.results[0]), shd.value_sharding(rep.y)
    if None in (s_x, s_o, s_out, s_y):
        return None
    merged = s_o[m_o]
    if s_x[rep.m] != merged or s_out[k] != merged:
        return None
    major = rep.a if rep.interleave else rep.g
    if major % math.prod(axes[x] for x in merged):
        return None
    a_axes, g_axes = (merged, ()) if rep.interleave else ((), merged)
    y = s_x[:rep.m] + (a_axes,) + s_x[rep.m + 1:]
    y_shape = rep.unrepeated(gu.info(dot.operands[s]).shape)
    if not shd.reshape_keeps(tuple(gu.info(rep.y).shape), tuple(y_shape), s_y, y):
        return None
    return _Shardings(name, a_axes, g_axes, s_o, s_out, y)


def fold(dot, mesh=None) -> bool:
    """Rewrite ``dot`` to read a repeated batch operand unrepeated; True when it did.
    ``mesh``: ``(name, axis sizes)`` of a propagated sharded module (the new ops get
    shardings)."""
    lb, rb, lc, rc, _, _ = gu.dot_parts(dot)
    for s in (0, 1):
        rep = repeat_of(dot.operands[s])
        batch_s, batch_o = (lb, rb) if s == 0 else (rb, lb)
        if rep is None or rep.m not in batch_s:
            continue
        k = batch_s.index(rep.m)
        sh = None
        if mesh is not None:
            sh = _shardings(dot, s, rep, batch_o[k], k, mesh)
            if sh is None:
                continue
        _rewrite(dot, s, rep, k, (lb, rb, lc, rc), sh)
        return True
    return False


def _rewrite(dot, s: int, rep: Repeat, k: int, parts, sh: _Shardings | None) -> None:
    lb, rb, lc, rc = parts
    o = 1 - s
    other, dot_operand = dot.operands[o], dot.operands[s]
    m_o = (rb if s == 0 else lb)[k]
    os_ = list(gu.info(other).shape)
    a, g = rep.a, rep.g
    split = [a, g] if rep.interleave else [g, a]
    a_pos, g_pos = (m_o, m_o + 1) if rep.interleave else (m_o + 1, m_o)

    def shift(d):
        return a_pos if d == m_o else (d if d < m_o else d + 1)

    def annotate(v, sharding):
        if sh is not None:
            shd.set_shardings(hir.defining_op(v), sh.mesh, [tuple(sharding)])

    y_shape = rep.unrepeated(gu.info(dot_operand).shape)
    ob, oc = (rb, rc) if s == 0 else (lb, lc)
    new_ob, new_oc = [shift(d) for d in ob], [shift(d) for d in oc]
    o_shape = os_[:m_o] + split + os_[m_o + 1:]
    out = gu.info(dot.results[0])
    ety = ir.RankedTensorType(dot.results[0].type).element_type
    with dot.context, dot.location, ir.InsertionPoint(dot):
        y = rep.y
        if list(gu.info(y).shape) != y_shape:
            y = stablehlo.ReshapeOp(gu.tensor_type(y_shape, gu.element_type(y)), y).result
            annotate(y, sh and sh.y)
        other2 = stablehlo.ReshapeOp(gu.tensor_type(o_shape, gu.element_type(other)), other).result
        if sh is not None:
            split_axes = [sh.a_axes, sh.g_axes] if rep.interleave else [sh.g_axes, sh.a_axes]
            annotate(other2, sh.other[:m_o] + tuple(split_axes) + sh.other[m_o + 1:])
        operands = [y, other2] if s == 0 else [other2, y]
        shapes = [y_shape, o_shape] if s == 0 else [o_shape, y_shape]
        lb2, rb2 = (lb, new_ob) if s == 0 else (new_ob, rb)
        lc2, rc2 = (lc, new_oc) if s == 0 else (new_oc, rc)
        dn = stablehlo.DotDimensionNumbers.get(
            lhs_batching_dimensions=lb2, rhs_batching_dimensions=rb2,
            lhs_contracting_dimensions=lc2, rhs_contracting_dimensions=rc2)
        free = [[d for d in range(len(shapes[i])) if d not in (lb2, rb2)[i] and d not in (lc2, rc2)[i]]
                for i in (0, 1)]
        new_shape = ([shapes[0][d] for d in lb2] + [shapes[0][d] for d in free[0]]
                     + [shapes[1][d] for d in free[1]])
        # precision and algorithm carry over; a sharding is written for the new rank below
        attrs = gu.attributes(dot, drop=(shd.SHARDING_ATTR, "mhlo.sharding"))
        attrs["dot_dimension_numbers"] = dn
        new = gu.create("stablehlo.dot_general", operands, [gu.tensor_type(new_shape, ety)],
                        attrs, before=dot).results[0]
        # G's place in the new result: among the other side's free dims
        pg = len(lb2) + (len(free[0]) if o == 1 else 0) + free[o].index(g_pos)
        if sh is not None:
            new_s = list(sh.out[:k]) + [sh.a_axes] + list(sh.out[k + 1:])
            new_s.insert(pg, sh.g_axes)
            annotate(new, new_s)
        order = [i for i in range(len(new_shape)) if i != pg]
        order.insert(k + 1 if rep.interleave else k, pg)
        moved = [i for i in order if new_shape[i] != 1]
        if moved != sorted(moved):    # a transpose moving only unit dims is the reshape below
            new = gu.make_transpose(new, order, before=dot)
            if sh is not None:
                annotate(new, [new_s[i] for i in order])
        res = stablehlo.ReshapeOp(gu.tensor_type(list(out.shape), ety), new).result
        annotate(res, sh and sh.out)
    dot.results[0].replace_all_uses_with(res)
    hir.safe_erase(dot)
    op = hir.defining_op(dot_operand)
    while op is not None and op.name in ("stablehlo.reshape", "stablehlo.broadcast_in_dim") \
            and not gu.n_uses(op.results[0]):         # the repeat, now unused
        nxt = hir.defining_op(op.operands[0]) if op.name == "stablehlo.reshape" else None
        hir.safe_erase(op)
        op = nxt


class FoldDotRepeats(Pass):
    """See the module docstring."""
    name = "fold-dot-repeats"

    @dataclasses.dataclass(frozen=True)
    class Options:
        # tpu: off unless asked. Compiled for TPU v5e (bench --memory), the Llama-1B-class
        # training step (GQA, S=2048) needed 5445 MiB with the products folded and 4607 without
        # (jax.jit: 4603): XLA:TPU keeps more of the backward's temporaries around the folded
        # products, and a tpu decode step's gain was never measured
        on_tpu: bool = False

    def run(self, module, ctx):
        if ctx.target.is_tpu and not self.options.on_tpu:
            return {"folded": 0, "skipped": "tpu (on_tpu=true folds there)"}
        from hlofuse.passes.fusion.outline import program_blocks
        mesh = None
        if shd.is_propagated(module):
            name, _, axes = shd.mesh_of(module)
            mesh = (name, axes)
        n = 0
        for block in program_blocks(module):
            for op in [o for o in hir.block_ops(block) if o.name == "stablehlo.dot_general"]:
                if gu.info(op.results[0]) is not None:   # static shapes
                    n += fold(op, mesh)
        return {"folded": n}
