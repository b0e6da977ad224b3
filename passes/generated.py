"""Values generated from iotas and constants alone (masks, position tables): how large
``constant-fold`` materializes them, and the ops that compute one, which the loop passes
(``sink-loop-generators``, ``remat-loop-attention``) copy into a loop body. Shared so that no
pass imports another."""

from __future__ import annotations

from hlofuse.core import ir as hir
from hlofuse.kernels.support import is_splat_constant
from hlofuse.passes import graph_util as gu

# largest value generated from iotas alone (no dense constant data) that is materialized (a
# small table; a 64x64 mask): a
# GPT-2 training step at S=1024 with its causal mask folded to a 1 MiB i1 constant ran its
# attention kernels without block skipping (bench.attribute: the step ~10% slower than with
# constant-fold disabled, two runs on the shared 2-core host)
GENERATED_MAX_BYTES = 4 * 1024

# pure generator ops: their results depend only on their operands and attributes
GENERATOR_OPS = ("stablehlo.iota", "stablehlo.constant", "stablehlo.broadcast_in_dim",
                 "stablehlo.reshape", "stablehlo.transpose", "stablehlo.compare", "stablehlo.and",
                 "stablehlo.or", "stablehlo.not", "stablehlo.convert", "stablehlo.select",
                 "stablehlo.add", "stablehlo.subtract", "stablehlo.multiply",
                 "stablehlo.minimum", "stablehlo.maximum")
MAX_TREE_OPS = 64
# a dense constant up to this size may be a mask constant-fold materialized from its iotas; a
# larger one is data (frozen weights), and copying it would duplicate it in the module
MAX_CONSTANT_BYTES = GENERATED_MAX_BYTES


def generated_tree(v, limit: int = MAX_TREE_OPS) -> list | None:
    """The ops computing ``v`` from iotas and constants alone (splats, or dense ones of at most
    ``MAX_CONSTANT_BYTES``; producers first), or None when ``v`` reads anything else (a
    block argument, another op, a larger constant: copying it would duplicate data in the
    module) or the tree is larger than ``limit`` ops."""
    order, seen = [], set()

    def go(x) -> bool:
        op = hir.defining_op(x)
        if op is None or op.name not in GENERATOR_OPS or len(op.results) != 1 or len(op.regions):
            return False
        if (op.name == "stablehlo.constant" and not is_splat_constant(op)
                and gu.info(op.results[0]).nbytes > MAX_CONSTANT_BYTES):
            return False
        if op in seen:
            return True
        seen.add(op)
        if len(seen) > limit or not all(go(a) for a in op.operands):
            return False
        order.append(op)
        return True
    return order if go(v) else None
