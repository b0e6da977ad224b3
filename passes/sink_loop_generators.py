"""``sink-loop-generators``: masks generated from iotas and constants, carried unchanged through
a ``while`` loop, are generated again inside the loop body.

Why: ``jax.lax.scan`` over layers hoists what does not depend on the carry out of the loop. A
causal mask (``iota``/``compare`` in ``jnp.tril``, ``jax.nn.dot_product_attention(is_causal=
True)``) then enters the body as a loop-carried ``[.., Sq, Sk]`` tensor, materialized once per
call: 12 MiB of ``i1`` plus 48 MiB of f32 fill values at 12 heads and S=1024. In the body the
attention match sees an opaque input instead of its iotas, so its kernels read the tensors
block by block and cannot skip the blocks above the diagonal (a scanned GPT-2-small-like
training step with remat ran 0.90-0.92 of jax.jit's time, the same blocks unscanned 0.78).
XLA's own loop-invariant code motion leaves such size-inflating ops in the loop for the same
reason; jax's partial evaluation of ``scan`` hoists them before XLA sees the program.

Rewrites: for each ``stablehlo.while`` (outer loops first), each value its body or condition
reads that is computed outside the loop only from ``iota`` and ``constant`` (splat, or of at
most ``MAX_CONSTANT_BYTES``, 4 KiB: what ``constant-fold`` materializes of a mask generated
from iotas; a larger constant is data, and copying it would duplicate it)
by generator ops (broadcasts, reshapes, transposes, compares, logic, converts, selects, adds,
subtracts, multiplies, minimum, maximum), at least ``min_elements`` elements, either carried unchanged
through the loop or read directly from outside (an implicit capture: the upstream ``cse``
replaces a mask generated in the body by an identical one outside): the tree is cloned at the
top of the block and the uses there read the clone. A carried value itself stays (the body
returns it; XLA's while-loop simplifier drops an element nothing reads).

Preconditions: calls inlined. After the last ``cse`` (which would hoist the clones out again),
before ``propagate-shardings`` (sharded programs: the copies get their shardings there) and
``fuse-attention``.
Invariant: bit-exact (the same ops on the same constants compute the same values); the module
verifies; rerunning changes nothing (the body no longer reads the block argument).
Statistics: ``sunk`` (carried values regenerated in a loop), ``loops``.
``disable=["sink-loop-generators"]`` turns it off.
"""

from __future__ import annotations

import dataclasses

from jaxlib.mlir import ir

from hlofuse.core import ir as hir
from hlofuse.core.pipeline import Pass
from hlofuse.passes.generated import generated_tree
from hlofuse.passes import graph_util as gu

def sink_into(loop, min_elements: int) -> int:
    """Regenerate in ``loop``'s regions the generated values they read: operands carried
    unchanged through the body, and values read from outside the loop (implicit captures: the
    upstream ``cse`` replaces a mask generated in the body by an identical one outside).
    Returns how many values were regenerated."""
    cond, body = (r.blocks[0] for r in loop.regions)
    ret = hir.block_ops(body)[-1]
    # (block, uses [(op, operand number)], the value computed outside)
    todo = []
    for i, operand in enumerate(loop.operands):
        if hir.value_key(ret.operands[i]) != hir.value_key(body.arguments[i]):
            continue                      # not carried unchanged
        for block in (body, cond):
            uses = [(hir.as_op(u.owner), u.operand_number) for u in block.arguments[i].uses]
            uses = [(o, k) for o, k in uses if not (block == body and o == ret)]
            if uses:
                todo.append((block, uses, operand))
    for block in (body, cond):
        captured: dict = {}
        for op in hir.block_ops(block):
            for k, v in enumerate(op.operands):
                d = hir.defining_op(v)
                if d is not None and d.block != block:
                    captured.setdefault(hir.value_key(v), (v, []))[1].append((op, k))
        todo += [(block, uses, v) for v, uses in captured.values()]
    n = 0
    for block, uses, v in todo:
        t = gu.info(v)
        if t is None or t.size < min_elements:
            continue                      # a token or dynamic shape; or too small to matter
        tree = generated_tree(v)
        if tree is None:
            continue
        clone = gu.clone_tree(hir.defining_op(v), hir.block_ops(block)[0], lambda o: o in tree)
        for o, k in uses:
            o.operands[k] = clone
        n += 1
    return n


class SinkLoopGenerators(Pass):
    name = "sink-loop-generators"

    @dataclasses.dataclass(frozen=True)
    class Options:
        min_elements: int = 4096     # smaller carried values cost nothing worth a regeneration

    def run(self, module, ctx):
        from hlofuse.passes.fusion.outline import program_blocks
        loops = [op for block in program_blocks(module) for op in hir.block_ops(block)
                 if op.name == "stablehlo.while"]
        sunk = touched = 0
        with module.context, ir.Location.unknown():
            for loop in loops:       # program_blocks lists outer blocks first
                k = sink_into(loop, self.options.min_elements)
                sunk += k
                touched += bool(k)
        return {"sunk": sunk, "loops": touched}
