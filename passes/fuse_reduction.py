"""``fuse-reduction``: row reductions with their elementwise producers and epilogue, one kernel.

Rewrites: every ``stablehlo.reduce`` over the last dim (add/max/min/mul/and/or reducer, constant
init) anchors a region that grows over producers and users which stay in the anchor's row view
(elementwise ops on whole rows or on per-row values, broadcasts between them, keepdims reshapes,
further row reductions over the same rows, and column reductions of its full rows as
outputs: a norm backward's d(scale)/d(bias), a bias gradient; the kernel writes one partial per
row block and the partials are combined after it; by default on gpu/tpu only, option
``column_reductions``). Softmax, log-softmax, layernorm, rmsnorm, sum of
squares and mean/variance are found this way *structurally* — whatever order, helper ops or
keepdims style the user wrote them in — and the report labels them (``extra['pattern']``).
A producer that also feeds ops outside the region is recomputed inside or materialized as an
extra output, as :func:`~hlofuse.passes.fusion.cost.remat_choice` decides. Scalar arithmetic
whose result is also read outside (a loss's count, a mean's divisor) leaves the region, which
reads it as an input: kernels write rows, per-row values and column partials, never a scalar. The cost model
(:func:`~hlofuse.passes.fusion.cost.decide`) may leave a region to XLA: it is then still
outlined (XLA inlines it) but marked ``hlofuse.xla`` so no later pass cuts it into pieces.

Preconditions: calls inlined; runs after ``fuse-attention`` (which claims attention softmax)
and ``fuse-matmul-epilogue``. Invariant: the module verifies; kernels compute the same ops per
row (results within the ``reassociate`` tolerance: a backend may sum a row in another order).
"""

from __future__ import annotations

import dataclasses
import typing

from hlofuse.core import ir as hir
from hlofuse.core.ops import OpClass, rule_for
from hlofuse.core.pipeline import Pass
from hlofuse.core.target import Target
from hlofuse.passes.fusion import cost as cost_model
from hlofuse.kernels.reduction import pattern_name
from hlofuse.kernels.tiling import row_blocks, tiled_row_blocks
from hlofuse.passes.fusion.anchored import Grown, fuse_anchored
from hlofuse.passes.fusion.commit import LeftToXla
from hlofuse.kernels.support import (SCALAR, ClassError, View, extend_classes, is_column_reduce,
                                     view_classes)
from hlofuse.passes.fusion.predicates import reduction_anchor, reduction_member
from hlofuse.passes.fusion.regions import grow_region, rematerialize

KIND = "reduction"


def _working_set(view: View, members: list, target: Target) -> tuple[int, int]:
    """(bytes one kernel instance keeps on chip, grid steps) for the region's row blocks.

    gpu: a row block lives in registers; modeled as three live f32 blocks (the loaded rows, one
    intermediate, the result) -- Triton reuses registers across the chain. tpu: the
    double-buffered VMEM blocks :func:`~hlofuse.kernels.tiling.row_blocks` picked.
    """
    target = Target.of(target)
    n_full = 1 + sum(1 for m in members if m.name != "stablehlo.reduce")
    try:
        b = row_blocks(view.rows, view.cols, target=target, itemsize=4, n_arrays=min(n_full, 4))
    except ValueError:
        if target.is_cpu:
            return view.cols * 4 * 3 * 8, 1
        # a row longer than a row block: the kernel walks it in column tiles (kernels.row_tiled)
        b = tiled_row_blocks(view.rows, view.cols, target=target, itemsize=4, n_arrays=min(n_full, 4))
    if target.is_tpu:
        return b.vmem_bytes, b.grid[0]
    if target.is_gpu:
        return b.br * b.bc * 4 * 3, b.grid[0]
    return 0, b.grid[0]


SCALAR_OUTSIDE = ("scalar read outside the region: XLA computes it (a kernel writes rows, per-row "
                  "values and column partials; the region reads the scalar as an input)")


def _without_scalar_outputs(graph, members: list, classes: dict, refused: dict) -> list:
    """``members`` without the scalar ops whose results are read outside the region (a loss's
    count, a mean's divisor: outputs no kernel writes) and the scalar members they read; the
    region reads those results as inputs. Scalar ops read only inside (``negate`` of a splat
    constant) stay. Unchanged when a scalar op to remove reads a value of the remaining
    region (then the region could not take it as an input without a cycle)."""
    inside = set(members)

    def scalar(op):
        return op.name != "stablehlo.constant" and any(classes.get(r) == SCALAR for r in op.results)

    def read_outside(op):        # by an op outside the region, the block's return included
        return any(hir.as_op(u.owner) not in inside for r in op.results for u in r.uses)
    out = {m for m in members if scalar(m) and read_outside(m)}
    todo = list(out)
    while todo:
        for p in graph.producers(todo.pop()):
            if p in inside and p not in out and scalar(p):
                out.add(p)
                todo.append(p)
    if not out or any(p in inside and p not in out for m in out for p in graph.producers(m)
                      if p.name != "stablehlo.constant"):
        return members
    for m in out:
        refused[m] = SCALAR_OUTSIDE
    return [m for m in members if m not in out]


def grow(graph, anchor, tried: set, target: Target, column_reductions: bool = True,
         cols_off: set | None = None):
    """The reduction region around ``anchor`` (see the module docstring), or why none.
    ``cols_off`` collects the column reductions refused because ``column_reductions`` is off."""
    target = Target.of(target)
    view = View.of(hir.tensor_type_info(anchor.operands[0].type).shape)
    state = {"classes": view_classes([anchor], view), "pending": {}}

    def admit(c, members, direction):
        why = reduction_member(c, target)
        if why is not None:
            return why
        if is_column_reduce(c) and not column_reductions:
            if cols_off is not None:
                cols_off.add(hir.op_location(c))
            return ("column reductions off on this target (fuse-reduction{column_reductions=on}; "
                    "auto: gpu/tpu only, not faster on cpu)")
        if direction == "producer" and is_column_reduce(c):
            return "a column reduction joins only as an output of the region that computes its operand"
        if is_column_reduce(c) and view.cols > target.max_row_elems:
            return ("column reductions do not join a region whose rows are walked in column tiles "
                    f"(rows of {view.cols} > {target.max_row_elems} on {target.describe()})")
        if any(is_column_reduce(p) for p in graph.producers(c) if p in members):
            return "reads a column reduction (complete only after the last row block)"
        try:
            state["pending"][c] = extend_classes(state["classes"], c, view)
        except ClassError as e:
            return f"leaves the row view: {e}"
        return None

    def on_admit(c):
        state["classes"] = state["pending"].pop(c)

    members, refused = grow_region(graph, anchor, admit, on_admit=on_admit)
    members = _without_scalar_outputs(graph, members, state["classes"], refused)
    compute = [m for m in members if rule_for(m.name).cls in (OpClass.ELEMENTWISE, OpClass.REDUCTION)]
    tried.update(m for m in members if m.name == "stablehlo.reduce")
    if len(compute) < 2:
        return "nothing to fuse around it (XLA's own reduction moves the same bytes)"
    members, remat = rematerialize(graph, members, target,
                                   keep=[m for m in members if m.name == "stablehlo.reduce"])
    ws, steps = _working_set(view, members, target)

    def decision_for(cost):
        cost.working_set_bytes = ws
        return cost_model.decide(KIND, cost, target, grid_steps=steps if target.is_cpu else 1)

    why = {}                       # the first reason per op name (one per constant is noise)
    for n, r in refused.items():
        why.setdefault(n.name, r)
    return Grown(members, decision_for, dict(
        pattern=pattern_name(members), view=f"{view.rows}x{view.cols}", tolerance="reassociate",
        remat=remat, refused=dict(list(why.items())[:4])))


class FuseReduction(Pass):
    name = "fuse-reduction"

    @dataclasses.dataclass(frozen=True)
    class Options:
        # column reductions of a region's rows (a norm's d(scale)/d(bias)) join it as outputs:
        # "auto" = gpu/tpu only (on cpu the interpret kernel is plain StableHLO and XLA:CPU's
        # own fusions were not faster: norm+MLP training step 1.035x, p25 1.00, measured
        # interleaved with python -m bench.train_rest on a shared machine), "on", "off"
        column_reductions: typing.Literal["auto", "on", "off"] = "auto"

    def _columns(self, ctx) -> bool:
        mode = self.options.column_reductions
        return mode == "on" or (mode == "auto" and not ctx.target.is_cpu)

    def run(self, module, ctx):
        left = LeftToXla(self.name)
        cols_off: set = set()
        counts = fuse_anchored(module, ctx, kind=KIND, anchor_name="stablehlo.reduce",
                               check_anchor=reduction_anchor, left=left, what="reduction(s)",
                               grow=lambda graph, anchor, tried: grow(graph, anchor, tried, ctx.target,
                                                                      self._columns(ctx), cols_off))
        unfused = left.flush(ctx)
        if cols_off:
            ctx.report.note(f"{self.name}: {len(cols_off)} column reduction(s) not joined to their row kernel "
                            f"at {', '.join(sorted(cols_off)[:3])}: column_reductions is off on {ctx.target} "
                            "by default (not faster there; fuse-reduction{column_reductions=on})")
        return {"regions": counts["regions"], "left_to_xla": counts["left_to_xla"], "not_fused": unfused,
                **({"column_reductions_off": len(cols_off)} if cols_off else {})}
