"""``fuse-elementwise``: group chains of elementwise ops into regions and outline them.

Rewrites: maximal cycle-free groups of elementwise ops (with ``broadcast_in_dim`` of scalars,
bias vectors and per-row values, ``convert``, ``compare``, ``select``, splat constants) that share
one iteration domain become ``func.func private @hlofuse_region_N`` plus one ``func.call``.
Multi-output regions are allowed: a member used outside the region becomes an output.
Preconditions: calls inlined (run ``inline-calls`` first) so chains are visible.
Invariant: bit-exact results (ops are moved, not changed); module verifies. Regions with fewer
than two compute ops are not formed. Elementwise ops the predicate refuses (e.g. complex
dtypes) are counted by reason (``refused[<reason>]``) and noted once per reason. The ``kernelize`` pass turns regions into kernels.
"""

from hlofuse import ir as hir
from hlofuse.ops import OpClass, rule_for
from hlofuse.pipeline import Pass, register_pass
from hlofuse.passes.fusion.commit import LeftToXla, record_region
from hlofuse.passes.fusion.outline import outline_region, program_blocks, region_boundary
from hlofuse.kernels.support import domain_shape
from hlofuse.passes.fusion.predicates import elementwise_member
from hlofuse.passes.fusion.regions import form_regions

MIN_COMPUTE_OPS = 2


@register_pass
class FuseElementwise(Pass):
    name = "fuse-elementwise"

    def run(self, module, ctx):
        n_regions = n_small = 0
        left = LeftToXla(self.name)

        def member(op) -> bool:
            why = elementwise_member(op, ctx.target)
            if why is not None and rule_for(op.name).cls is OpClass.ELEMENTWISE:
                left.add("elementwise op(s)", op, why)  # an op of the kind, refused: say why
            return why is None

        for block in program_blocks(module):
            ops = [o for o in hir.block_ops(block) if not o.name.endswith("return")]
            regions = form_regions(ops, member, domain_shape)
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
        left.flush(ctx)
        return {"regions": n_regions, "too_small": n_small, **left.stats()}
