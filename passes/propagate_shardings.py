"""``propagate-shardings``: Shardy's sharding propagation over a sharded program.

Rewrites: in a module with an ``sdy.mesh`` of more than one device and sharded ``@main``
arguments (jax.export of a ``jax.jit`` with shardings), runs Shardy's ``sdy-aggressive-propagate``
so every op carries the ``sdy.sharding`` XLA's partitioner would start from, and marks the
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


@register_pass
class PropagateShardings(Pass):
    name = "propagate-shardings"

    def run(self, module, ctx):
        if not shd.is_sharded_module(module):
            return {"annotated_ops": 0}
        before = sum(1 for op in hir.all_ops(module) if shd.SHARDING_ATTR in op.attributes)
        hir.run_upstream_passes(module, "builtin.module(sdy-aggressive-propagate)")
        with module.context:   # kernelize builds per-shard kernels only after propagation
            module.operation.attributes[shd.PROPAGATED_ATTR] = ir.UnitAttr.get()
        after = sum(1 for op in hir.all_ops(module) if shd.SHARDING_ATTR in op.attributes)
        return {"annotated_ops": after - before}
