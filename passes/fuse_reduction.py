"""``fuse-reduction``: row reductions with their elementwise producers and epilogue, one kernel.

Rewrites: every ``stablehlo.reduce`` over the last dim (add/max/min/mul/and/or reducer, constant
init) anchors a region that grows over producers and users which stay in the anchor's row view
(elementwise ops on whole rows or on per-row values, broadcasts between them, keepdims reshapes,
further row reductions over the same rows). Softmax, log-softmax, layernorm, rmsnorm, sum of
squares and mean/variance are found this way *structurally* — whatever order, helper ops or
keepdims style the user wrote them in — and the report labels them (``extra['pattern']``).
A producer that also feeds ops outside the region is recomputed inside or materialized as an
extra output, as :func:`~hlofuse.passes.fusion.cost.remat_choice` decides. The cost model
(:func:`~hlofuse.passes.fusion.cost.decide`) may leave a region to XLA: it is then still
outlined (XLA inlines it) but marked ``hlofuse.xla`` so no later pass cuts it into pieces.

Preconditions: calls inlined; runs after ``fuse-attention`` (which claims attention softmax)
and ``fuse-matmul-epilogue``. Invariant: the module verifies; kernels compute the same ops per
row (results within the ``reassociate`` tolerance: a backend may sum a row in another order).
"""

from __future__ import annotations

from hlofuse import ir as hir
from hlofuse.ops import OpClass, rule_for
from hlofuse.pipeline import Pass, register_pass
from hlofuse.passes.fusion import cost as cost_model
from hlofuse.passes.fusion.commit import LeftToXla, commit_region
from hlofuse.passes.fusion.outline import program_blocks
from hlofuse.kernels.support import ClassError, View, extend_classes, view_classes
from hlofuse.passes.fusion.predicates import reduction_anchor, reduction_member
from hlofuse.passes.fusion.regions import BlockGraph, grow_region, rematerialize

KIND = "reduction"


def _working_set(view: View, members: list, target: str) -> tuple[int, int]:
    """(bytes one kernel instance keeps on chip, grid steps) for the region's row blocks.

    gpu: a row block lives in registers; modeled as three live f32 blocks (the loaded rows, one
    intermediate, the result) -- Triton reuses registers across the chain. tpu: the
    double-buffered VMEM blocks :func:`~hlofuse.kernels.tiling.row_blocks` picked.
    """
    from hlofuse.kernels.tiling import row_blocks
    n_full = 1 + sum(1 for m in members if m.name != "stablehlo.reduce")
    try:
        b = row_blocks(view.rows, view.cols, target=target, itemsize=4, n_arrays=min(n_full, 4))
    except ValueError:
        return view.cols * 4 * 3 * 8, 1
    if target == "tpu":
        return b.vmem_bytes, b.grid[0]
    if target == "gpu":
        return b.br * b.bc * 4 * 3, b.grid[0]
    return 0, b.grid[0]


@register_pass
class FuseReduction(Pass):
    name = "fuse-reduction"

    def run(self, module, ctx):
        target = ctx.target
        n_kernels = n_left = 0
        left = LeftToXla(self.name)
        for block in program_blocks(module):
            tried: set = set()
            while True:
                ops = [o for o in hir.block_ops(block) if not o.name.endswith("return")]
                anchors = [o for o in ops if o.name == "stablehlo.reduce" and o not in tried]
                if not anchors:
                    break
                anchor = anchors[0]
                tried.add(anchor)
                reason = reduction_anchor(anchor, target)
                if reason is not None:
                    left.add("reduction(s)", anchor, reason)
                    continue
                graph = BlockGraph(ops)
                src_shape = hir.tensor_type_info(anchor.operands[0].type).shape
                view = View.of(src_shape)

                state = {"classes": view_classes([anchor], view), "pending": {}}

                def admit(c, members, direction, view=view, state=state):
                    why = reduction_member(c, target)
                    if why is not None:
                        return why
                    try:
                        state["pending"][c] = extend_classes(state["classes"], c, view)
                    except ClassError as e:
                        return f"leaves the row view: {e}"
                    return None

                def on_admit(c, state=state):
                    state["classes"] = state["pending"].pop(c)

                members, refused = grow_region(graph, anchor, admit, on_admit=on_admit)
                compute = [m for m in members if rule_for(m.name).cls in (OpClass.ELEMENTWISE, OpClass.REDUCTION)]
                tried.update(m for m in members if m.name == "stablehlo.reduce")
                if len(compute) < 2:
                    left.add("reduction(s)", anchor, "nothing to fuse around it (XLA's own reduction "
                                                     "moves the same bytes)")
                    continue
                members, remat = rematerialize(graph, members, target,
                                               keep=[m for m in members if m.name == "stablehlo.reduce"])
                from hlofuse.kernels.reduction import pattern_name
                ws, steps = _working_set(view, members, target)

                def decision_for(cost, ws=ws, steps=steps):
                    cost.working_set_bytes = ws
                    return cost_model.decide(KIND, cost, target, grid_steps=steps if target == "cpu" else 1)

                region, decision = commit_region(
                    module, ctx, KIND, members, decision_for=decision_for,
                    pattern=pattern_name(members), view=f"{view.rows}x{view.cols}",
                    tolerance="reassociate", remat=remat,
                    refused={n.name: r for n, r in list(refused.items())[:4]})
                if decision.fuse:
                    n_kernels += 1
                else:
                    n_left += 1
        unfused = left.flush(ctx)
        return {"regions": n_kernels, "left_to_xla": n_left, "not_fused": unfused}
