"""``remat-loop-attention``: attention in a scan over layers, whose forward loop saves its
probabilities for the backward loop, is recomputed in the backward loop instead (what
``jax.checkpoint`` around the scanned layer would make jax write).

Why: ``jax.grad`` of ``lax.scan`` runs the forward in one ``while`` loop and the backward in
another; the forward's intermediates that the backward reads (the softmax probabilities
``[B, H, Sq, Sk]``, their exponentials, row sums) leave the forward loop as stacked residuals,
one ``[L, ...]`` buffer each, written by ``dynamic_update_slice`` at the layer's index and read
back by ``dynamic_slice`` in the backward loop. ``fuse-attention`` cannot outline such a
forward (its intermediates are read outside the region) nor match the backward (its forward is
in another loop): a scanned GPT-2-like step ran 0.96 of jax.jit's time with no attention
kernels, the same step with ``jax.checkpoint`` 0.75 with flash forward and backward kernels.

Rewrites: for each attention candidate in a ``while`` body refused because its intermediates
are read outside it, when every such read is a write of the intermediate (through reshapes)
into a stacked output of the loop, or an op computing another saved value from it (jax's
partial evaluation computes the divide's derivative ``1/sum²`` in the forward loop), and each
stack is read by one ``dynamic_slice``, at one index, in the one later ``while`` that takes it:
those ops (and the attention's output when it is saved too: the backward loop then holds the
whole forward, as under ``jax.checkpoint``) are cloned into the backward loop's body from the
region's inputs and replace the reads; the forward loop no longer writes them (its body returns
the buffer unchanged: XLA's while-loop simplifier drops the element, nothing reads it). The
region's inputs must be available in the backward body at the same layer:

* saved values (Q, K, V, as the products read them or before a reshape), read by a
  ``dynamic_slice`` at the same index as the intermediates. A reshape or convert the backward
  body already applies to such a read is reused (moved up when below), so the forward and the
  backward read one value, as ``fuse-attention``'s backward match requires; a value jax saved
  twice is read once;
* values generated from iotas and constants (a causal mask): generated again;
* values carried unchanged through the forward loop or read from outside it: read from outside
  (from the backward loop's own carried copy when it has one);
* slices of such a value at the forward loop's write index (a layer's parameter): sliced at the
  backward loop's read index;
* layout ops and converts of the above.

Anything else (an input only the forward loop computes, probabilities the program also returns)
leaves the loops as they are, and the report's note says why. Then ``fuse-attention`` finds a
forward whose intermediates stay inside (a forward kernel) and, in the backward loop, a forward
and its backward in one block (flash forward with row statistics and flash backward).

Preconditions: calls inlined; after ``sink-loop-generators`` (masks generated in both bodies),
before ``propagate-shardings`` (sharded programs: the clones get their shardings there) and
``fuse-attention``.
Invariant: the backward reads the same ops applied to the same values it read from the saved
stacks (bit-exact under the reference interpreter; XLA may fuse the recomputed ops differently,
so the jitted numbers agree within ``reassociate``); the module verifies; rerunning changes
nothing (no intermediate leaves the forward loop). Statistics: ``recomputed`` (saved values
recomputed), ``regions``. ``disable=["remat-loop-attention"]`` turns it off.
"""

from __future__ import annotations

import dataclasses

from jaxlib.mlir import ir
from jaxlib.mlir.dialects import stablehlo

from hlofuse.core import ir as hir
from hlofuse.core.pipeline import Pass
from hlofuse.passes import graph_util as gu
from hlofuse.passes.generated import generated_tree

# ops between an intermediate and its write into a stacked output (element order kept)
_RESHAPES = ("stablehlo.reshape", "stablehlo.broadcast_in_dim")
# layout ops between a saved value and an attention input (q = reshape(projection))
_LAYOUT = ("stablehlo.reshape", "stablehlo.transpose", "stablehlo.broadcast_in_dim",
           "stablehlo.convert")
MAX_RECOMPUTE_OPS = 200


class _Skip(Exception):
    """This candidate's intermediates are not recomputable in the backward loop (says why)."""


def _const_zero(v) -> bool:
    return gu.splat_value(v) == 0


def _loop(block):
    owner = getattr(block, "owner", None)
    if owner is None:
        return None
    op = hir.as_op(owner)
    return op if op.name == "stablehlo.while" else None


def _only_user(v):
    us = hir.users(v)
    return us[0] if len(us) == 1 else None


@dataclasses.dataclass
class _Write:
    """``v`` written into the forward loop's stacked output ``k``: ``chain`` (reshapes, in
    order) then ``dus`` at ``index`` along dim 0 (the layer)."""
    chain: list
    dus: object
    k: int
    index: object


def _write_from(u, v, body, ret) -> _Write | None:
    """How ``v``, used by ``u``, reaches a stacked output of the loop whose body is ``body``
    (``ret`` its terminator): through single-use reshapes to a ``dynamic_update_slice`` of one
    layer (start 0 on every other dim) of a body argument the body returns; or None."""
    chain = []
    while u.name in _RESHAPES and gu.info(u.results[0]).size == gu.info(v).size:
        chain.append(u)
        v = u.results[0]
        u = _only_user(v)
        if u is None:
            return None
    if u.name != "stablehlo.dynamic_update_slice" or hir.value_key(u.operands[1]) != hir.value_key(v):
        return None
    buf = u.operands[0]
    if not isinstance(buf.owner, ir.Block) or buf.owner != body:
        return None
    k = ir.BlockArgument(buf).arg_number
    starts = list(u.operands[2:])
    if not starts or not all(_const_zero(x) for x in starts[1:]) or gu.info(v).shape[0] != 1:
        return None
    if _only_user(u.results[0]) != ret or hir.value_key(ret.operands[k]) != hir.value_key(u.results[0]):
        return None
    return _Write(chain, u, k, starts[0])


@dataclasses.dataclass
class _Read:
    """The backward loop's read of a stacked output: its operand ``m`` and ``dynamic_slice``."""
    loop: object
    m: int
    ds: object
    index: object


def _read_of(fwd, k: int) -> _Read | None:
    """The one read, in the one ``while`` that takes result ``k`` of ``fwd``, of that stack:
    a ``dynamic_slice`` of one layer (the body otherwise carries it unchanged)."""
    r = fwd.results[k]
    u = _only_user(r)
    if u is None or u.name != "stablehlo.while" or u.block != fwd.block:
        return None
    ms = [i for i, o in enumerate(u.operands) if hir.value_key(o) == hir.value_key(r)]
    if len(ms) != 1:
        return None
    m = ms[0]
    cond, body = (reg.blocks[0] for reg in u.regions)
    if any(True for _ in cond.arguments[m].uses):
        return None
    ret = hir.block_ops(body)[-1]
    arg = body.arguments[m]
    if hir.value_key(ret.operands[m]) != hir.value_key(arg):
        return None
    reads = [o for o in hir.users(arg) if o != ret]
    if len(reads) != 1 or reads[0].name != "stablehlo.dynamic_slice":
        return None
    ds = reads[0]
    starts = list(ds.operands[1:])
    if not all(_const_zero(s) for s in starts[1:]):
        return None
    sizes = gu.i64_array(ds, "slice_sizes")
    if sizes[0] != 1 or list(sizes[1:]) != list(gu.info(arg).shape[1:]):
        return None
    return _Read(u, m, ds, starts[0])


def _position(op, block) -> int:
    for i, o in enumerate(hir.block_ops(block)):
        if o == op:
            return i
    raise _Skip("an op is not in the backward loop's body")


class _Plan:
    """The rewrite of one attention candidate: what the backward loop recomputes."""

    def __init__(self, att, fwd):
        self.att, self.fwd = att, fwd
        self.body = fwd.regions[1].blocks[0]
        self.ret = hir.block_ops(self.body)[-1]
        self.members = set(att.members)

    def build(self):
        """Find the saved intermediates and the ops to recompute; raises :class:`_Skip`."""
        from hlofuse.passes.attention.train import _forward_internal_uses
        escaping = list(_forward_internal_uses(self.att).values())
        if not escaping:
            raise _Skip("no intermediate leaves the attention")
        # jax's partial evaluation also computes residuals *from* the intermediates in the
        # forward loop (the divide's derivative 1/sum²): such ops (``side``) are recomputed too
        self.writes, self.side = [], []      # writes: (value, _Write, _Read)
        inside = set(self.members)
        todo = list(escaping)
        while todo:
            t = todo.pop(0)
            for use in t.uses:
                u = hir.as_op(use.owner)
                if u in inside:
                    continue
                w = _write_from(u, t, self.body, self.ret)
                if w is not None:
                    self.writes.append((t, w, _read_of(self.fwd, w.k)))
                    continue
                if (len(u.regions) or u.name in ("stablehlo.return", "stablehlo.while")
                        or u.block != self.body or len(self.side) >= MAX_RECOMPUTE_OPS):
                    raise _Skip("an intermediate is read outside the attention other than "
                                f"to save it for the backward ({u.name} at {hir.op_location(u)})")
                inside.add(u)
                self.side.append(u)
                todo.extend(u.results)
        # the attention's output, when saved too (jax saves it for the output projection's
        # weight gradient): recomputed with the rest, so the backward loop holds the whole
        # forward, as under jax.checkpoint, and fuse-attention matches forward and backward
        # (through layout ops: the heads merged back, ``[b, s, h·d]``)
        frontier = [(self.att.pv.results[0], [])]
        while frontier:
            x, path = frontier.pop()
            for use in x.uses:
                u = hir.as_op(use.owner)
                w = _write_from(u, x, self.body, self.ret)
                if w is not None:
                    inside.update([self.att.pv, *path])
                    self.side += [p for p in path if p not in self.side]
                    self.writes.append((x, w, _read_of(self.fwd, w.k)))
                elif u.name in _LAYOUT and len(path) < 4 and u.block == self.body:
                    frontier.append((u.results[0], path + [u]))
        bwd = index = w_index = None
        for t, w, rd in self.writes:
            if rd is None:
                raise _Skip("a saved intermediate is not read by one dynamic_slice of one "
                            "later loop")
            if bwd is None:
                bwd, index, w_index = rd.loop, rd.index, w.index
            if (rd.loop != bwd or hir.value_key(rd.index) != hir.value_key(index)
                    or hir.value_key(w.index) != hir.value_key(w_index)):
                raise _Skip("the saved intermediates are read by different loops or at "
                            "different indices")
        if bwd is None:
            raise _Skip("no intermediate is saved for a backward loop")
        self.bwd, self.r_index, self.w_index = bwd, index, w_index
        self.bbody = bwd.regions[1].blocks[0]
        # the ops to clone: those computing the saved values, in program order
        need = set()

        def visit(op):
            if op in need or op not in inside:
                return
            need.add(op)
            for a in op.operands:
                p = hir.defining_op(a)
                if p is not None:
                    visit(p)
        for t, _, _ in self.writes:
            visit(hir.defining_op(t))
        self.order = [o for o in hir.block_ops(self.body) if o in need]
        if len(self.order) > MAX_RECOMPUTE_OPS:
            raise _Skip(f"more than {MAX_RECOMPUTE_OPS} ops to recompute")
        self.leaves = {}
        for op in self.order:
            for a in op.operands:
                p = hir.defining_op(a)
                if p is None or p not in need:
                    self.leaves.setdefault(hir.value_key(a), a)

    # -- the region's inputs in the backward body -----------------------------------------
    def _residual_read(self, v):
        """``v`` saved (as it is, or reshaped) and read back at the same layer: the read.
        jax may save one value in several stacks (Q for dK and again for the product's own
        transpose); the backward's reads of them are the same value, and all but the first
        in the backward body are recorded in ``self.aliases`` to read that one."""
        rds = []
        for use in v.uses:
            w = _write_from(hir.as_op(use.owner), v, self.body, self.ret)
            if w is None or hir.value_key(w.index) != hir.value_key(self.w_index):
                continue
            rd = _read_of(self.fwd, w.k)
            if (rd is not None and rd.loop == self.bwd
                    and hir.value_key(rd.index) == hir.value_key(self.r_index)):
                rds.append((w, rd))
        if not rds:
            return None
        rds.sort(key=lambda wr: _position(wr[1].ds, self.bbody))
        w0, first = rds[0]
        for w, rd in rds[1:]:
            if rd.ds.results[0].type == first.ds.results[0].type and \
                    [o.name for o in w.chain] == [o.name for o in w0.chain]:
                self.aliases[hir.value_key(rd.ds.results[0])] = (w, rd, first)
        return first

    def _above(self, d) -> bool:
        """``d`` is in the loops' block or a block enclosing it (a nested scan: the outer
        body's values, the function's constants): its value is defined for both loops."""
        block = self.fwd.block
        while True:
            if d.block == block:
                return True
            owner = getattr(block, "owner", None)
            if owner is None:
                return False
            op = hir.as_op(owner)
            if op.name == "func.func" or op.block is None:
                return False
            block = op.block

    def _carried_in_bwd(self, x):
        """``x`` (from outside the loops) as the backward body reads it: the argument the
        backward loop carries it in unchanged, if any (the backward's own reads use that one: a
        mask too small for sink-loop-generators), else ``x`` itself."""
        ret = hir.block_ops(self.bbody)[-1]
        for i, o in enumerate(self.bwd.operands):
            arg = self.bbody.arguments[i]
            if (hir.value_key(o) == hir.value_key(x)
                    and hir.value_key(ret.operands[i]) == hir.value_key(arg)):
                return arg
        return x

    def map_leaves(self):
        """A recipe for every leaf (see :meth:`_recipe`); raises :class:`_Skip`."""
        self.recipes = {}
        self.aliases = {}
        for v in self.leaves.values():
            self._recipe(v)

    def _recipe(self, v, depth: int = 0):
        """How the backward body gets ``v`` (a forward-body value at the same layer):
        ``('read', _Read)`` a residual, read back; ``('gen', tree)`` generated from iotas and
        constants; ``('outer', value)`` from outside the loops; ``('slice', op, value)`` the
        layer's slice of a value from outside; ``('op', op)`` a layout op over such values."""
        key = hir.value_key(v)
        if key in self.recipes:
            return self.recipes[key]
        d = hir.defining_op(v)
        in_body = d is not None and d.block == self.body
        r = None
        if in_body and d.name == "stablehlo.constant":
            r = ("gen", [d])
        elif in_body and generated_tree(v) is not None:
            r = ("gen", generated_tree(v))
        elif self._residual_read(v) is not None:
            r = ("read", self._residual_read(v))
        elif d is not None and self._above(d):
            r = ("outer", self._carried_in_bwd(v))
        elif d is None and isinstance(v.owner, ir.Block) and v.owner == self.body:
            i = ir.BlockArgument(v).arg_number
            if hir.value_key(self.ret.operands[i]) == hir.value_key(v):     # carried unchanged
                r = ("outer", self._carried_in_bwd(self.fwd.operands[i]))
        elif (in_body and d.name == "stablehlo.dynamic_slice"
              and hir.value_key(d.operands[1]) == hir.value_key(self.w_index)
              and all(_const_zero(x) for x in d.operands[2:])):
            src = d.operands[0]
            if isinstance(src.owner, ir.Block) and src.owner == self.body:
                i = ir.BlockArgument(src).arg_number
                if hir.value_key(self.ret.operands[i]) == hir.value_key(src):
                    r = ("slice", d, self.fwd.operands[i])
        if r is None and in_body and d.name in _LAYOUT and depth < 8:
            # q = reshape(the saved projection): the layout op again over what it reads
            for a in d.operands:
                self._recipe(a, depth + 1)
            r = ("op", d)
        if r is None:
            where = hir.op_location(d) if d is not None else "a loop argument"
            raise _Skip(f"an input of the attention ({d.name if d is not None else 'argument'} "
                        f"at {where}) is computed only in the forward loop")
        self.recipes[key] = r
        return r

    # -- the rewrite -------------------------------------------------------------------------
    def apply(self) -> int:
        reads = [rd.ds for _, _, rd in self.writes]
        first_use = min(_position(hir.as_op(u.owner), self.bbody)
                        for ds in reads for u in ds.results[0].uses)
        before = hir.block_ops(self.bbody)[first_use]
        for kind, *rest in self.recipes.values():
            # a residual read later in the body moves up (a dynamic_slice of a block argument
            # at the read index, defined before the first read, and constant starts)
            if kind == "read" and _position(rest[0].ds, self.bbody) >= first_use:
                for a in rest[0].ds.operands[1:]:
                    d = hir.defining_op(a)
                    if d is not None and d.block == self.bbody and \
                            _position(d, self.bbody) >= first_use:
                        raise _Skip("a residual's read index is computed after the "
                                    "intermediates are used")
                rest[0].ds.move_before(before)
        mapping: dict = {}

        def read_root(v):
            """The read under ``v`` when ``v`` is a residual or reshapes of one, else None."""
            kind, *rest = self.recipes[hir.value_key(v)]
            if kind == "read":
                return rest[0].ds
            if kind == "op" and rest[0].name == "stablehlo.reshape":
                return read_root(rest[0].operands[0])
            return None

        def as_type(ds, v):
            """The read ``ds`` as ``v``'s type: itself, a reshape of it the backward body
            already has (so the forward and the backward read one value, as fuse-attention's
            backward match requires), or a new reshape."""
            r = ds.results[0]
            if r.type == v.type:
                return r
            for u in hir.users(r):
                if (u.name == "stablehlo.reshape" and u.results[0].type == v.type
                        and u.block == self.bbody):
                    if _position(u, self.bbody) >= first_use:
                        u.move_before(before)     # it reads only the read, which is above
                    return u.results[0]
            with ds.location:
                return _reshape_as(r, v)

        def reuse(c):
            """``c`` (a clone just made, operands set) or the same op the backward body already
            has (same operands and attributes: the backward converts V to f32 for dP = dO·Vᵀ
            as the forward does for P·V), moved above ``before`` when below it (its operands
            are ``c``'s). fuse-attention's backward match needs one value for both."""
            keys = [hir.value_key(a) for a in c.operands]
            if not keys or len(c.regions):
                return c
            for u in hir.users(c.operands[0]):
                if (u == c or u.name != c.name or u.block != self.bbody or len(u.regions)
                        or [hir.value_key(a) for a in u.operands] != keys
                        or [r.type for r in u.results] != [r.type for r in c.results]
                        or hir.op_text(u).split("=", 1)[-1].split(" loc(")[0]
                        != hir.op_text(c).split("=", 1)[-1].split(" loc(")[0]):
                    continue
                if _position(u, self.bbody) > _position(c, self.bbody):
                    u.move_before(c)
                hir.safe_erase(c)
                return u
            return c

        def get(v):
            key = hir.value_key(v)
            if key in mapping:
                return mapping[key]
            kind, *rest = self.recipes[key]
            root = read_root(v)
            if root is not None:
                r = as_type(root, v)
            elif kind == "gen":
                tree = rest[0]
                r = gu.clone_tree(hir.defining_op(v), before, lambda o, t=tree: o in t)
            elif kind == "outer":
                r = rest[0]
            elif kind == "slice":
                d, src = rest
                c = d.clone()
                c.operands[0] = src
                c.operands[1] = self.r_index
                r = c.results[0]
            else:
                d = rest[0]
                args = [get(a) for a in d.operands]
                c = d.clone()
                for i, a in enumerate(args):
                    c.operands[i] = a
                r = reuse(c).results[ir.OpResult(v).result_number]
            mapping[key] = r
            return r

        with ir.InsertionPoint(before):
            for v in self.leaves.values():
                get(v)
            for op in self.order:
                c = op.clone()
                for i, a in enumerate(op.operands):
                    c.operands[i] = mapping[hir.value_key(a)]
                c = reuse(c)
                for r, cr in zip(op.results, c.results):
                    mapping[hir.value_key(r)] = cr
            for t, w, rd in self.writes:
                x = mapping[hir.value_key(t)]
                for op in w.chain:
                    c = op.clone()
                    c.operands[0] = x
                    x = c.results[0]
                rd.ds.results[0].replace_all_uses_with(x)
        # a second copy of a saved input reads the first (same value); its stack goes too
        for w, rd, first in self.aliases.values():
            rd.ds.results[0].replace_all_uses_with(first.ds.results[0])
        # the forward loop returns the stacks unchanged; the reads, the writes and the side
        # ops that computed what was written go (with whatever else only they read)
        dead = list(self.side)
        for _, w, rd in self.writes + [(None, w, rd) for w, rd, _ in self.aliases.values()]:
            self.ret.operands[w.k] = self.body.arguments[w.k]
            dead += [rd.ds, w.dus]
        gu.erase_if_dead(dead)
        return len(self.writes)


def _reshape_as(r, like):
    """``r`` reshaped to ``like``'s type (at the current insertion point)."""
    return stablehlo.ReshapeOp(like.type, r).result


def recompute_in_backward(block) -> tuple[int, int, list]:
    """Rewrite the attention candidates of the loop body ``block`` (see the module docstring).
    Returns (intermediates recomputed, regions, [(op, why not)])."""
    from hlofuse.passes.attention import train as at
    from hlofuse.passes.attention import match as fa
    fwd = _loop(block)
    if fwd is None:
        return 0, 0, []
    ops = hir.block_ops(block)
    if not any(o.name == "stablehlo.exponential" for o in ops):
        return 0, 0, []
    refused = []
    fa.find_attention(block, refused)
    cands = [op for op, r in refused if op.name == "stablehlo.dot_general"
             and any(w in r for w in fa._USED_OUTSIDE)]
    n = regions = 0
    why = []
    for op in cands:
        index = fa.block_index(block)
        att, _ = fa._try_analyze(op, index, relaxed=True)
        if att is None or not at._saved_across_loop(block, att):
            continue
        plan = _Plan(att, fwd)
        try:
            plan.build()
            plan.map_leaves()
            n += plan.apply()
            regions += 1
        except _Skip as e:
            why.append((op, str(e)))
    return n, regions, why


class RematLoopAttention(Pass):
    name = "remat-loop-attention"

    def run(self, module, ctx):
        from hlofuse.passes.fusion.outline import program_blocks
        n = regions = 0
        for block in program_blocks(module):
            with module.context:
                k, r, why = recompute_in_backward(block)
            n += k
            regions += r
            for op, reason in why:
                ctx.report.note(f"{self.name}: attention at {hir.op_location(op)} left as jax "
                                f"saved it (its probabilities stay stacked between the loops): "
                                f"{reason}")
        return {"recomputed": n, "regions": regions}
