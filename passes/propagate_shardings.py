"""``propagate-shardings``: Shardy's sharding propagation over a sharded program.

Rewrites: in a module with an ``sdy.mesh`` of more than one device and sharded ``@main``
arguments (jax.export of a ``jax.jit`` with shardings), runs Shardy's ``sdy-aggressive-propagate``
(between adding and sinking the data-flow edges of while loops, :data:`PIPELINE`) so every op,
loop bodies included, carries the ``sdy.sharding`` XLA's partitioner would start from, and marks the
module ``hlofuse.shardings_propagated``. Only attributes
change: the ops, and so the numbers, are the same. ``kernelize`` reads them to build kernels that
run per shard, or to leave a region that is not shard-local with XLA (and say why). Modules
without shardings are left as they are. Preconditions: calls inlined (Shardy does not look into
``func.call``). Invariant: results bit-identical.
"""

from __future__ import annotations

from jaxlib.mlir import ir

from hlofuse import ir as hir
from hlofuse.pipeline import Pass, register_pass
from hlofuse.passes import sharding as shd


# Shardy propagates through a while loop along its data-flow edges (one per carried value): the
# import step that adds them comes first, and the export step sinks the loop's shardings back
# onto the while op, from where they move to ``hlofuse.loop_shardings`` (kernelize reads a body
# argument's sharding there; XLA's import cannot take a while's ``sdy.sharding``, see
# ``sharding.LOOP_SHARDING_ATTR``). Without them nothing
# inside a loop body (a scan over layers) was annotated, its regions read as replicated, and
# their per-shard kernels made XLA all-gather the loop's batch-sharded activations.
PIPELINE = ("builtin.module(sdy-add-data-flow-edges, sdy-aggressive-propagate, "
            "func.func(sdy-sink-data-flow-edges))")


@register_pass
class PropagateShardings(Pass):
    name = "propagate-shardings"

    def run(self, module, ctx):
        if not shd.is_sharded_module(module):
            return {"annotated_ops": 0}
        before = sum(1 for op in hir.all_ops(module) if shd.SHARDING_ATTR in op.attributes)
        hir.run_upstream_passes(module, PIPELINE)
        with module.context:   # kernelize builds per-shard kernels only after propagation
            module.operation.attributes[shd.PROPAGATED_ATTR] = ir.UnitAttr.get()
            for op in hir.all_ops(module):
                if op.name == "stablehlo.while" and shd.SHARDING_ATTR in op.attributes:
                    op.attributes[shd.LOOP_SHARDING_ATTR] = op.attributes[shd.SHARDING_ATTR]
                    del op.attributes[shd.SHARDING_ATTR]
        after = sum(1 for op in hir.all_ops(module) if shd.SHARDING_ATTR in op.attributes)
        return {"annotated_ops": after - before}
