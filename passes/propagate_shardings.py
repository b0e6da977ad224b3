"""``propagate-shardings``: Shardy's sharding propagation over a sharded program.

Rewrites: in a module with an ``sdy.mesh`` of more than one device and sharded ``@main``
arguments (jax.export of a ``jax.jit`` with shardings), runs Shardy's ``sdy-aggressive-propagate``
(between adding and sinking the data-flow edges of while loops, :data:`PIPELINE`) so every op,
loop bodies included, carries the ``sdy.sharding`` XLA's partitioner would start from, and marks the
module ``hlofuse.shardings_propagated``. Then an ``sdy.sharding_constraint`` that asks for
the sharding its operand already has is dropped, its sharding written (closed) on the op that
makes the operand: on a mesh with ``Explicit`` axes (sharding in types) jax puts one after
nearly every op, and each one would cut a fusion region in two. Only attributes change, and
those no-op constraints: the ops that compute, and so the numbers, are the same. ``kernelize`` reads them to build kernels that
run per shard, or to leave a region that is not shard-local with XLA (and say why). Modules
without shardings are left as they are. Preconditions: calls inlined (Shardy does not look into
``func.call``). Invariant: results bit-identical.
"""

from __future__ import annotations

from jaxlib.mlir import ir
from jaxlib.mlir.dialects import stablehlo

from hlofuse.core import ir as hir
from hlofuse.kernels.support import is_splat_constant
from hlofuse.core.pipeline import Pass
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
        dropped = _drop_kept_constraints(module)
        return {"annotated_ops": after - before, "constraints_dropped": dropped,
                "splats_folded": _fold_splat_layouts(module) if dropped else 0}


def _drop_kept_constraints(module) -> int:
    """Erase each ``sdy.sharding_constraint`` whose sharding its operand already has after
    propagation (an ``Explicit`` mesh's per-op constraints), moving its sharding, closed, onto
    the single-result op that makes the operand (a function argument keeps its own). Returns
    how many were dropped."""
    n = 0
    with module.context:
        for op in [o for o in hir.all_ops(module) if o.name == "sdy.sharding_constraint"]:
            v = op.operands[0]
            if "?" in str(op.attributes["sharding"]):
                # an open dim (P.UNCONSTRAINED) reads as replicated here: moved onto the
                # producer, closed, the other dims' axes were lost ('model' of P(UNCONSTRAINED,
                # 'model'): outputs P('data') where jax.jit's are P('data', 'model'))
                continue
            want = shd.value_sharding(op.results[0])   # the sharding it asks for
            if want is None or shd.value_sharding(v) != want:
                continue
            producer = hir.defining_op(v)
            if producer is not None and producer.name != "stablehlo.constant":
                # (a constant stays unannotated: kernelize gives a splat its per-shard shape)
                if len(producer.results) != 1 or producer.name == "sdy.manual_computation":
                    continue
                producer.attributes[shd.SHARDING_ATTR] = ir.Attribute.parse(
                    f"#sdy.sharding_per_value<[{op.attributes['sharding']}]>")
            op.results[0].replace_all_uses_with(v)
            hir.safe_erase(op)
            n += 1
    return n


def _fold_splat_layouts(module) -> int:
    """A reshape, transpose or broadcast of a splat constant becomes a splat constant of its
    result type (exact). ``canonicalize`` does this before propagation, but a dropped
    constraint between them hid the pair from it; a region's per-shard copy gives a splat its
    users' local shape, which it cannot do through a reshape."""
    n = 0
    with module.context:
        for op in [o for o in hir.all_ops(module) if o.name in (
                "stablehlo.reshape", "stablehlo.transpose", "stablehlo.broadcast_in_dim")]:
            src = hir.defining_op(op.operands[0])
            if src is None or not is_splat_constant(src):
                continue
            value = ir.DenseElementsAttr(src.attributes["value"]).get_splat_value()
            with ir.InsertionPoint(op), op.location:
                c = stablehlo.ConstantOp(ir.DenseElementsAttr.get_splat(op.results[0].type, value))
            op.results[0].replace_all_uses_with(c.result)
            hir.safe_erase(op)
            n += 1
    return n
