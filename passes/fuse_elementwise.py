"""``fuse-elementwise``: group chains of elementwise ops into regions and outline them.

Rewrites: maximal cycle-free groups of elementwise ops (with ``broadcast_in_dim`` of scalars,
bias vectors and per-row values, ``convert``, ``compare``, ``select``, splat constants) that share
one iteration domain become ``func.func private @hlofuse_region_N`` plus one ``func.call``.
Multi-output regions are allowed: a member used outside the region becomes an output.
Preconditions: calls inlined (run ``inline-calls`` first) so chains are visible.
Invariant: bit-exact results (ops are moved, not changed); module verifies. Regions with fewer
than two compute ops are not formed. The ``kernelize`` pass turns regions into kernels.
"""

from hlofuse import ir as hir
from hlofuse.ops import OpClass, rule_for
from hlofuse.pipeline import Pass, register_pass
from hlofuse.passes.fusion import cost as cost_model
from hlofuse.passes.fusion.outline import KIND_ATTR, outline_region
from hlofuse.passes.fusion.predicates import domain_shape, elementwise_member
from hlofuse.passes.fusion.regions import form_regions

MIN_COMPUTE_OPS = 2


# Ops whose regions hold program code (loop bodies, branches). Regions of other ops are
# scalar computations applied per element (reduce/sort/scatter bodies): never fused.
CODE_REGION_OPS = ("func.func", "stablehlo.while", "stablehlo.case", "stablehlo.if")


def fusible_blocks(module) -> list:
    """Blocks of every function body and nested while/case bodies, outlined regions and
    kernel functions excluded."""
    blocks = []
    for f in hir.funcs(module):
        if KIND_ATTR in f.operation.attributes or hir.func_name(f).startswith("hlofuse_k"):
            continue
        stack = [f.operation]
        while stack:
            op = stack.pop()
            if op.name not in CODE_REGION_OPS:
                continue
            for region in op.regions:
                for block in region.blocks:
                    blocks.append(block)
                    stack.extend(o.operation for o in block.operations)
    return blocks


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


@register_pass
class FuseElementwise(Pass):
    name = "fuse-elementwise"

    def run(self, module, ctx):
        from hlofuse.passes.fusion.outline import region_boundary
        n_regions = n_small = 0
        for block in fusible_blocks(module):
            ops = [o for o in hir.block_ops(block) if not o.name.endswith("return")]
            regions = form_regions(
                ops, lambda op: elementwise_member(op, ctx.target) is None, domain_shape)
            for members in regions:
                compute = [m for m in members if rule_for(m.name).cls is OpClass.ELEMENTWISE]
                if len(compute) < MIN_COMPUTE_OPS or domain_shape(members[0]) == ():
                    n_small += 1  # why a group was not outlined, for no-match tests
                    continue  # a lone op or a scalar chain (loop counters): nothing to fuse
                boundary = region_boundary(members)
                region = record_region(ctx, "elementwise", members, boundary)
                outline_region(module, members, f"hlofuse_region_{region.id}",
                               region_id=region.id, kind="elementwise")
                n_regions += 1
        return {"regions": n_regions, "too_small": n_small}
