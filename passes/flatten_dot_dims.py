"""``flatten-dot-dims``: a ``dot_general`` over several contracting dims or several rhs free
dims becomes the one-contracting-dim product the matmul kernels take, with reshapes around it.

Why: multi-head projections are written as tensor contractions: Flax's ``LinearGeneral`` and
``nnx.MultiHeadAttention``, Keras' ``EinsumDense``, Haiku's and Equinox's attention compute Q/K/V
as ``x[B,S,D] . W[D,H,Dh]`` (two rhs free dims) and the output projection as
``a[B,S,H,Dh] . W[H,Dh,D]`` (two contracting dims); their gradients contract ``(B, S)``. The
matmul fusion takes one contracting dim and one rhs free dim (:func:`kernels.support.dot_layout`),
so these products and their bias adds were left to XLA ("dot_general layout not canonical"),
and the Q/K/V siblings could not merge. XLA itself flattens such products the same way
(``DotDecomposer``); the reshapes are bitcasts.

Rewrites, for a product with leading batch dims (the same positions in both operands):
- a run of contracting dims, consecutive and in the same order in both operands, becomes one
  dim (``reshape`` of each operand);
- the rhs free dims, consecutive, become one dim; the lhs free dims too where the lhs holds
  its contracting dims first (a transposed lhs, as in a weight gradient);
- the product of the flattened operands is reshaped back to the original result. The reshape is
  then moved below the elementwise ops that read it, where every other operand is the same
  kind of value (a splat constant, a broadcast whose dims cover whole merged groups, or the
  same reshape of a value of the flat shape): ``reshape(p) + broadcast(b[H,Dh])`` becomes
  ``reshape(p + broadcast(reshape(b, [H*Dh])))``, so the bias and activation fuse as the
  product's epilogue;
- a product whose activation is the rhs, rows before features (Equinox's ``Linear`` under
  ``vmap``: ``W[O,I] . x[B,S,I] -> [O,B,S]``, bias and activation, then a transpose to
  ``[B,S,O]``) becomes ``x . W^T`` with a transpose back, which moves down the same way and
  cancels in the user's transpose. Only where it cancels everywhere (:func:`_sinks_fully`):
  flattening its rows instead made XLA transpose the product's output (eqx_gpt on cpu, 11%
  slower), so otherwise such a product is left as written.

Not rewritten: products whose contracting or free dims are interleaved (flattening would need
a transpose), products already in the kernels' form, hlofuse's outlined regions, dynamic
shapes. In a sharded program (after ``propagate-shardings``) every new op carries a sharding
(a merged dim keeps its major dim's axes); a product whose shardings a reshape cannot keep
(a sharded minor dim) is left as it is, and so is one whose result a ``sdy.sharding_constraint``
reshards (XLA folds that reshard into the product only as written); the report says why. There
the result reshape stays where it is, and a product with its activation on the rhs is left as
written.

Preconditions: calls inlined. After ``fuse-attention`` (whose matches read the products as
written) and ``conv1x1-to-dot``, right before ``fuse-matmul-epilogue``.
Invariant: the module verifies; each output element is the same sum of the same products, but
XLA may block a product of another shape differently (``reassociate`` tolerance); elementwise
ops moved across a reshape or transpose compute the same values (exact). Rerunning changes
nothing. Statistics: ``flattened`` (products rewritten), ``sunk`` (elementwise ops moved above a
reshape or transpose), ``left_sharded`` (products left because of their shardings),
``left_as_written`` (products not in the kernels' form that are left as written: batch dims not
leading, interleaved dims, an activation on the rhs whose transpose would not cancel;
``fuse-matmul-epilogue`` notes them as "not canonical"). ``disable=["flatten-dot-dims"]`` turns it off.
"""

from __future__ import annotations

import dataclasses
import math

from jaxlib.mlir import ir
from jaxlib.mlir.dialects import stablehlo

from hlofuse.core import ir as hir
from hlofuse.core.ops import OpClass, rule_for
from hlofuse.core.pipeline import Pass
from hlofuse.kernels.support import dot_layout
from hlofuse.passes import graph_util as gu
from hlofuse.passes import sharding as shd


def _run(dims: list[int]) -> bool:
    return all(b == a + 1 for a, b in zip(dims, dims[1:]))


@dataclasses.dataclass(frozen=True)
class Plan:
    """How a product flattens: the operands' new shapes, the new dot dims and result shape.
    ``swap``: the new product reads the operands the other way round; a transpose takes its
    result back to the original one (and :func:`sink` cancels it in the user's transpose)."""
    lhs_shape: list
    rhs_shape: list
    lc: int
    rc: int
    nb: int
    out_shape: list
    swap: bool = False


def _swap_perm(nb: int, n_rf: int) -> list:
    """The permutation taking a swapped product ``(batch, n..., m)`` to the original result
    ``(batch, m, n...)``."""
    return list(range(nb)) + [nb + n_rf] + [nb + i for i in range(n_rf)]


def plan(dot) -> Plan | None:
    """The flattened form of ``dot``, or None when it has none (or needs none)."""
    if dot_layout(dot) is not None:
        return None
    lhs, rhs, out = (gu.info(v) for v in (*dot.operands[:2], dot.results[0]))
    if lhs is None or rhs is None or out is None:
        return None
    lb, rb, lc, rc, lf, rf = gu.dot_parts(dot)
    nb = len(lb)
    if lb != list(range(nb)) or rb != list(range(nb)) or not lc or not rf:
        return None
    if not (_run(lc) and _run(rc) and _run(rf)) or (lf and not _run(lf)):
        return None
    ls, rs = list(lhs.shape), list(rhs.shape)
    batch = ls[:nb]
    k = math.prod(ls[d] for d in lc)
    if len(lf) == 1 and len(rf) > 1 and rf[0] == nb:
        # the activation is the rhs, its rows before its features (a vmapped ``W @ x``:
        # W[O,I] . x[B,S,I] -> [O,B,S], transposed to [B,S,O] later): the product the other way
        # round, where its transpose back cancels in the user's everywhere. Flattening the rows
        # instead makes XLA transpose the product's output (eqx_gpt on cpu: 11% slower), so
        # such a product is otherwise left as written
        if "algorithm" in dot.attributes or rc[-1] != len(rs) - 1 \
                or not _sinks_fully(dot.results[0], _swap_perm(nb, len(rf))):
            return None
        m = ls[lf[0]]
        n = [rs[d] for d in rf]
        lhs_shape, lcd = batch + n + [k], nb + len(n)
        rhs_shape, rcd = (batch + [m, k], nb + 1) if lc[-1] == len(ls) - 1 else (batch + [k, m], nb)
        return Plan(lhs_shape, rhs_shape, lcd, rcd, nb, batch + n + [m], swap=True)
    n = math.prod(rs[d] for d in rf)
    m = [ls[d] for d in lf]
    if lc[-1] == len(ls) - 1:                  # lhs (batch, free..., K)
        lhs_shape, lcd, out_m = batch + m + [k], nb + len(m), m
    elif lc[0] == nb:                          # lhs (batch, K, free...): one free dim, transposed
        mm = math.prod(m)
        lhs_shape, lcd, out_m = batch + [k, mm], nb, [mm]
    else:
        return None
    if rc[0] == nb:                            # rhs (batch, K, N)
        rhs_shape, rcd = batch + [k, n], nb
    elif rf[0] == nb:                          # rhs (batch, N, K)
        rhs_shape, rcd = batch + [n, k], nb + 1
    else:
        return None
    return Plan(lhs_shape, rhs_shape, lcd, rcd, nb, batch + out_m + [n])


def _operands(dot, p: Plan) -> tuple:
    """(new lhs source, new rhs source, the value the new product replaces)."""
    if p.swap:
        return dot.operands[1], dot.operands[0], dot.results[0]
    return dot.operands[0], dot.operands[1], dot.results[0]


def _shardings(dot, p: Plan, axes: dict) -> tuple | None:
    """Shardings of (new lhs, new rhs, new product) keeping the original ones, or None when a
    reshape cannot keep them."""
    out = []
    for v, shape in zip(_operands(dot, p), (p.lhs_shape, p.rhs_shape, p.out_shape)):
        s = shd.value_sharding(v, replicated_if_open=True)
        if s is None:
            return None
        src = tuple(gu.info(v).shape)
        new = shd.reshaped(src, tuple(shape), s, axes)
        if not shd.reshape_keeps(src, tuple(shape), s, new):
            return None
        out.append(new)
    return tuple(out)


def _resharded(dot) -> bool:
    """Whether a ``sdy.sharding_constraint`` asks for another sharding of ``dot``'s result (a
    Flax NNX ``out_sharding``, jax's Explicit axes). XLA's partitioner moves such a reshard
    into the product's operands when it sees the product's dims; behind the result reshape of a
    flattened product it cannot, and adds an all-to-all (an NNX block on a 2x4 mesh: 3 instead
    of jax.jit's 2)."""
    mine = shd.value_sharding(dot.results[0], replicated_if_open=True)
    for use in dot.results[0].uses:
        user = use.owner
        if user.name == "sdy.sharding_constraint" \
                and shd.value_sharding(user.results[0]) != mine:
            return True
    return False


def _reshape(v: ir.Value, shape: list, before, mesh: str | None, sharding) -> ir.Value:
    inner = gu.is_op(v, "stablehlo.reshape")
    if inner is not None and (mesh is None
                              or list(gu.info(inner.operands[0]).shape) == list(shape)):
        v = inner.operands[0]                     # reshape(reshape(y)) is reshape(y)
    if list(gu.info(v).shape) == list(shape):
        return v
    op = gu.create("stablehlo.reshape", [v], [gu.tensor_type(shape, gu.element_type(v))],
                   before=before)
    if mesh is not None:
        shd.set_shardings(op, mesh, [sharding])
    return op.results[0]


def flatten(dot, p: Plan, mesh: str | None = None, sh: tuple = (None, None, None)) -> ir.Value:
    """Rewrite ``dot`` as planned; returns the value that replaced its result. In a sharded
    program ``mesh`` is the mesh's name and ``sh`` the new ops' shardings (:func:`_shardings`)."""
    batch = list(range(p.nb))
    a, b, old = _operands(dot, p)
    with dot.context, dot.location:
        lhs = _reshape(a, p.lhs_shape, dot, mesh, sh[0])
        rhs = _reshape(b, p.rhs_shape, dot, mesh, sh[1])
        dn = stablehlo.DotDimensionNumbers.get(
            lhs_batching_dimensions=batch, rhs_batching_dimensions=batch,
            lhs_contracting_dimensions=[p.lc], rhs_contracting_dimensions=[p.rc])
        attrs = gu.attributes(dot, drop=(shd.SHARDING_ATTR, "mhlo.sharding"))
        attrs["dot_dimension_numbers"] = dn
        if p.swap and "precision_config" in attrs:     # per operand: swapped with them
            swapped = list(ir.ArrayAttr(attrs["precision_config"]))[::-1]
            attrs["precision_config"] = ir.ArrayAttr.get(swapped)
        ety = gu.element_type(dot.results[0])
        new = gu.create("stablehlo.dot_general", [lhs, rhs], [gu.tensor_type(p.out_shape, ety)],
                        attrs, before=dot)
        if mesh is not None:
            shd.set_shardings(new, mesh, [sh[2]])
        if p.swap:          # transposed back to the original result, moved down by sink()
            res = gu.make_transpose(new.results[0], _swap_perm(p.nb, len(p.out_shape) - p.nb - 1),
                                    before=dot)
        else:
            res = _reshape(new.results[0], list(gu.info(old).shape), dot, mesh,
                           shd.value_sharding(old, replicated_if_open=True) if mesh is not None
                           else None)
    old.replace_all_uses_with(res)
    hir.safe_erase(dot)
    return res


# -- moving a reshape or transpose below the elementwise ops that read it ---------------------
def _groups(src: list, dst: list) -> list[tuple[list, list]] | None:
    """A reshape that only merges or splits runs of dims, as (src dims, dst dims) groups of
    equal size; None when the shapes do not group so."""
    out, i, j = [], 0, 0
    while i < len(src) or j < len(dst):
        gi, gj = [], []
        pi = pj = 1
        if i < len(src):
            gi.append(i); pi *= src[i]; i += 1
        if j < len(dst):
            gj.append(j); pj *= dst[j]; j += 1
        while pi != pj:
            if pi < pj and i < len(src):
                gi.append(i); pi *= src[i]; i += 1
            elif pj < pi and j < len(dst):
                gj.append(j); pj *= dst[j]; j += 1
            else:
                return None
        out.append((gi, gj))
    return out


def _flat_operand(v: ir.Value, r_shape: list, d_shape: list, groups, before):
    """``v`` (an operand of an elementwise op over the reshaped shape ``r_shape``) as a value of
    the flat shape ``d_shape``, built before ``before``; None when it has no such form."""
    ety = gu.element_type(v)
    if gu.is_splat_const(v):
        return gu.make_splat(gu.splat_value(v), ety, d_shape, before=before)
    bc = gu.is_op(v, "stablehlo.broadcast_in_dim")
    if bc is None:
        return None
    c = bc.operands[0]
    ci = gu.info(c)
    dims = gu.i64_array(bc, "broadcast_dimensions")
    if ci is None or dims != sorted(dims):
        return None
    ex = [1] * len(r_shape)
    for k, d in enumerate(dims):
        ex[d] = ci.shape[k]
    ex_d = []
    for gi, gj in groups:
        if all(ex[j] == r_shape[j] for j in gj):
            ex_d.extend(d_shape[i] for i in gi)
        elif all(ex[j] == 1 for j in gj):
            ex_d.extend(1 for _ in gi)
        else:
            return None
    keep = [j for j, n in enumerate(ex_d) if n != 1]
    c2 = _reshape(c, [ex_d[j] for j in keep], before, None, None)
    return gu.make_broadcast(c2, keep, gu.tensor_type(d_shape, ety), before=before)


def _dims_through(bc, perm: list) -> list | None:
    """The dims of broadcast ``bc``, read through ``transpose(., perm)`` (result dim ``i`` is
    operand dim ``perm[i]``); None when they come out of order (a transposing broadcast, which
    no kernel reads)."""
    dims = [perm[k] for k in gu.i64_array(bc, "broadcast_dimensions")]
    return dims if dims == sorted(dims) else None


def _moved_operand(v: ir.Value, rs, before) -> ir.Value | None:
    """``v``, an operand of an elementwise op over the result of the reshape or transpose
    ``rs``, as a value of ``rs``'s operand shape (built before ``before``), or None."""
    r, d = rs.results[0], rs.operands[0]
    if v == r:
        return d
    d_shape = list(gu.info(d).shape)
    same = gu.is_op(v, rs.name)
    if same is not None and list(gu.info(same.operands[0]).shape) == d_shape and (
            rs.name == "stablehlo.reshape"
            or gu.i64_array(same, "permutation") == gu.i64_array(rs, "permutation")):
        return same.operands[0]
    if gu.is_splat_const(v):
        return gu.make_splat(gu.splat_value(v), gu.element_type(v), d_shape, before=before)
    if rs.name == "stablehlo.reshape":
        groups = _groups(d_shape, list(gu.info(r).shape))
        return None if groups is None else _flat_operand(v, list(gu.info(r).shape), d_shape,
                                                          groups, before)
    bc = gu.is_op(v, "stablehlo.broadcast_in_dim")     # through a transpose
    dims = None if bc is None else _dims_through(bc, gu.i64_array(rs, "permutation"))
    if dims is None:
        return None
    return gu.make_broadcast(bc.operands[0], dims, gu.tensor_type(d_shape, gu.element_type(v)),
                             before=before)


def _sinks_fully(v: ir.Value, perm: list, limit: int = 256) -> bool:
    """Would ``transpose(p, perm)`` in place of ``v`` move below every elementwise op it
    reaches and cancel in transposes back? (Then a swapped product leaves no transpose.) The
    ops reached form a closure: each reads only values of the closure, splat constants and
    broadcasts that stay non-transposing; each value of it is read only by ops of the
    closure and by transposes back."""
    identity = list(range(len(perm)))
    block = hir.as_op(v.owner).block
    seen, ops, work = {hir.value_key(v)}, [], [v]
    while work:
        x = work.pop()
        users = [hir.as_op(u) for u in hir.users(x)]
        if not users:
            return False        # a result of the function: it would stay transposed
        for u in users:
            if u.name == "stablehlo.transpose":
                if [perm[i] for i in gu.i64_array(u, "permutation")] != identity:
                    return False
                continue
            if rule_for(u.name).cls != OpClass.ELEMENTWISE or len(u.results) != 1 \
                    or u.block != block:
                return False
            k = hir.value_key(u.results[0])
            if k not in seen:
                seen.add(k)
                ops.append(u)
                work.append(u.results[0])
                if len(ops) > limit:
                    return False
    for u in ops:
        for w in u.operands:
            if hir.value_key(w) in seen or gu.is_splat_const(w):
                continue
            bc = gu.is_op(w, "stablehlo.broadcast_in_dim")
            if bc is None or _dims_through(bc, perm) is None:
                return False
    return True


def sink(res: ir.Value) -> int:
    """Move the reshape or transpose defining ``res`` below its elementwise users, repeatedly
    (a reshape or transpose reading it composes with it); returns how many elementwise ops
    were moved."""
    moved = 0
    first = hir.defining_op(res)
    work = [first] if first is not None and first.name in (
        "stablehlo.reshape", "stablehlo.transpose") else []
    while work:
        rs = work.pop()     # ops, not values: a moved chain may erase an op queued here
        if not gu.alive(rs) or shd.SHARDING_ATTR in rs.attributes:
            continue
        r, d = rs.results[0], rs.operands[0]
        r_shape, d_shape = list(gu.info(r).shape), list(gu.info(d).shape)
        is_transpose = rs.name == "stablehlo.transpose"
        for e in hir.users(r):
            e = hir.as_op(e)
            if not gu.alive(e) or len(e.results) != 1:
                continue
            if e.name == rs.name:       # reshape(reshape(d)), transpose(transpose(d))
                shape = list(gu.info(e.results[0]).shape)
                if is_transpose:
                    outer = gu.i64_array(rs, "permutation")
                    perm = [outer[i] for i in gu.i64_array(e, "permutation")]
                    identity = perm == list(range(len(perm)))
                else:
                    identity = shape == d_shape
                if identity:
                    e.results[0].replace_all_uses_with(d)
                    gu.erase_if_dead([e])
                    continue
                e.operands[0] = d
                if is_transpose:
                    with e.context:
                        e.attributes["permutation"] = ir.DenseI64ArrayAttr.get(perm)
                gu.erase_if_dead([rs])
                continue
            if rule_for(e.name).cls != OpClass.ELEMENTWISE:
                continue
            if e.block != rs.block or any(gu.info(v) is None or list(gu.info(v).shape) != r_shape
                                          for v in (*e.operands, e.results[0])):
                continue   # a scalar operand (clamp's bounds) or another shape
            with e.context, e.location:
                ops = []
                for v in e.operands:
                    ops.append(_moved_operand(v, rs, e))
                    if ops[-1] is None:
                        break
                if any(o is None for o in ops):
                    continue
                ety = gu.element_type(e.results[0])
                flat = gu.create(e.name, ops, [gu.tensor_type(d_shape, ety)], gu.attributes(e),
                                 before=e)
                again = {"permutation": rs.attributes["permutation"]} if is_transpose else {}
                back = gu.create(rs.name, [flat.results[0]], [e.results[0].type], again,
                                 before=e).results[0]
            e.results[0].replace_all_uses_with(back)
            gu.erase_if_dead([e])
            moved += 1
            work.append(hir.defining_op(back))
    return moved


class FlattenDotDims(Pass):
    """See the module docstring."""
    name = "flatten-dot-dims"

    @dataclasses.dataclass(frozen=True)
    class Options:
        # tpu: off unless asked. Compiled for TPU v5e (bench --memory), the BERT-base training
        # step (S=512, batch 32) needed 2237 MiB with the products flattened and 2119 without
        # (jax.jit 2119); on H100 the same 2338 either way
        on_tpu: bool = False

    def run(self, module, ctx):
        stats = {"flattened": 0, "sunk": 0, "left_sharded": 0, "left_as_written": 0}
        if ctx.target.is_tpu and not self.options.on_tpu:
            return dict(stats, skipped="tpu (on_tpu=true flattens there)")
        from hlofuse.passes.fusion.outline import program_blocks
        gu.reset_tracking()
        mesh = None
        if shd.is_propagated(module):
            name, _, axes = shd.mesh_of(module)
            mesh = (name, axes)
        made = []
        for block in program_blocks(module):
            for op in [o for o in hir.block_ops(block) if o.name == "stablehlo.dot_general"]:
                p = plan(op)
                if p is None:
                    if dot_layout(op) is None and gu.info(op.results[0]) is not None:
                        stats["left_as_written"] += 1
                    continue
                sh, why = (None, None, None), None
                if mesh is not None:
                    if p.swap:
                        why = "the product the other way round would leave a transpose to shard"
                    elif _resharded(op):
                        why = ("a sharding constraint reshards its result (the partitioner folds "
                               "that reshard into the product only as written)")
                    elif (sh := _shardings(op, p, mesh[1])) is None:
                        why = "its shardings do not survive flattening (a sharded minor dim)"
                if why is not None:
                    stats["left_sharded"] += 1
                    ctx.report.note(f"{self.name}: a dot_general at {hir.op_location(op)} "
                                    f"keeps its dims: {why}")
                    continue
                made.append(hir.defining_op(flatten(op, p, mesh and mesh[0], sh)))
                stats["flattened"] += 1
        if mesh is None:     # (the moved ops would need shardings of their own)
            for op in made:  # ops, not values: an earlier move may have erased one
                if gu.alive(op):
                    stats["sunk"] += sink(op.results[0])
            # a reshape sunk below its users' reshapes can leave the old one unread
            gu.erase_dead_in(program_blocks(module))
        return stats
