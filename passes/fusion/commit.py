"""Step 3 glue for anchor-based fusion passes: record a region, ask the cost model, outline.

:func:`commit_region` records the region in the report with the cost model's numbers, outlines
it (:func:`~hlofuse.passes.fusion.outline.outline_region`) and, when the cost model says no,
marks the outlined function ``hlofuse.xla`` with the reason: ``kernelize`` skips it, XLA inlines
the call, and no later pass cuts the region into pieces. :class:`LeftToXla` collects ops a pass
looked at but did not outline, for the report's notes.
"""

from __future__ import annotations

from jaxlib.mlir import ir

from hlofuse.core import ir as hir
from hlofuse.core.report import Refusals
from hlofuse.passes.fusion import cost as cost_model
from hlofuse.passes import graph_util as gu
from hlofuse.passes.fusion.outline import XLA_ATTR, outline_region, region_boundary

__all__ = ["record_region", "commit_region", "LeftToXla", "DEAD"]

DEAD = "dead code (no op reads its results): not a region"


class LeftToXla(Refusals):
    """Ops a fusion pass looked at and left to XLA without outlining (an unsupported anchor, a
    lone reduction, a convolution). They go to the report as notes, one per reason with a
    count and the first source lines, not as regions: a second run over the optimized module
    finds the same ops and must not report new regions (idempotence). A
    :class:`~hlofuse.core.report.Refusals` that takes the op and reads its location."""

    def add(self, what: str, op, reason: str) -> None:
        super().add(what, reason, hir.op_location(op) if op is not None else "unknown")


def type_str(v) -> str:
    info = hir.tensor_type_info(v.type)
    if info is None:
        return str(v.type)
    return f"{info.dtype}[{','.join(map(str, info.shape))}]"


def record_region(ctx, kind: str, members: list, boundary, **extra):
    c = cost_model.region_cost(members, boundary.inputs, boundary.outputs)
    locs = []
    for m in members:
        s = hir.op_location(m)
        if s != "unknown" and s not in locs:
            locs.append(s)
    return ctx.report.new_region(
        kind, [m.name for m in members], locations=locs,
        inputs=[type_str(v) for v in boundary.inputs], outputs=[type_str(v) for v in boundary.outputs],
        bytes_unfused=c.bytes_unfused, bytes_fused=c.bytes_fused, flops=c.flops, extra=extra)


def commit_region(module, ctx, kind: str, members: list, *, decision_for, name_prefix: str = "hlofuse_region",
                  **extra):
    """Record the region in the report, outline it, and mark it for XLA when the cost model
    says so. ``decision_for(cost) -> Decision`` gets the region's modeled cost.

    Members no op outside reads are dead code an earlier rewrite left (the row statistics of
    a softmax whose reshapes flatten-dot-dims sank): nothing is outlined or recorded, the
    region-free ones are erased (ops with regions, a ``reduce``, stay for the pipeline's final
    ``canonicalize``: erasing them here would invalidate the handles of their nested blocks),
    and the result is ``(None, Decision(False, DEAD))``."""
    boundary = region_boundary(members)
    if not boundary.outputs:
        gu.erase_if_dead(members)
        return None, cost_model.Decision(False, DEAD)
    cost = cost_model.region_cost(members, boundary.inputs, boundary.outputs)
    decision = decision_for(cost)
    extra.update(cost.as_extra(cost_model.model_for(ctx.target)))
    region = record_region(ctx, kind, members, boundary, **extra)
    _, fn, _ = outline_region(module, members, f"{name_prefix}_{region.id}", region_id=region.id, kind=kind)
    region.extra["func"] = hir.func_name(fn)
    if not decision.fuse:
        region.reason = decision.reason
        with module.context:
            fn.attributes[XLA_ATTR] = ir.StringAttr.get(decision.reason)
    return region, decision
