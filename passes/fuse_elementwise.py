"""``fuse-elementwise``: group chains of elementwise ops into regions and outline them.

Rewrites: maximal cycle-free groups of elementwise ops (with ``broadcast_in_dim`` of scalars,
bias vectors and per-row values, ``convert``, ``compare``, ``select``, splat constants) that share
one iteration domain become ``func.func private @hlofuse_region_N`` plus one ``func.call``.
Multi-output regions are allowed: a member used outside the region becomes an output.
Preconditions: calls inlined (run ``inline-calls`` first) so chains are visible.
Invariant: bit-exact results (ops are moved, not changed); module verifies. Regions with fewer
than two compute ops are not formed. Elementwise ops the predicate refuses (e.g. complex
dtypes) are counted by reason (``refused[<reason>]``) and noted once per reason. The ``kernelize`` pass turns regions into kernels.

Each region asks the cost model (:func:`hlofuse.passes.fusion.cost.decide`, kind
``elementwise``). On cpu the answer is no (:data:`~hlofuse.passes.fusion.cost.CPU_RULES`): the
interpret-mode kernel is plain StableHLO that XLA:CPU inlines and fuses exactly as it fuses the
ops without it, so the kernel can only add reshapes (its 2-D block view) and lowering time. A
refused region is still outlined, marked ``hlofuse.xla`` with the reason (``kernelize`` skips it,
XLA inlines it) and counted in ``left_to_xla``; option ``cpu_kernels`` (or
``HLOFUSE_CPU_ELEMENTWISE_KERNELS=1``) builds them anyway.
"""

import dataclasses

from hlofuse.core import ir as hir
from hlofuse.core.ops import OpClass, rule_for
from hlofuse.core.pipeline import Pass
from hlofuse.passes.fusion import cost as cost_model
from hlofuse.passes.fusion.commit import LeftToXla, commit_region
from hlofuse.passes.fusion.outline import program_blocks
from hlofuse.kernels.support import domain_shape
from hlofuse.passes.fusion.predicates import elementwise_member
from hlofuse.passes.fusion.regions import form_regions

MIN_COMPUTE_OPS = 2


class FuseElementwise(Pass):
    name = "fuse-elementwise"

    @dataclasses.dataclass(frozen=True)
    class Options:
        # build elementwise kernels on cpu although the cost model's cpu rule says XLA:CPU
        # fuses the same loop itself (tests and experiments; no effect on gpu/tpu)
        cpu_kernels: bool = False

    def _decision(self, cost, ctx):
        if ctx.target.is_cpu and cost_model.cpu_elementwise_kernels(self.options.cpu_kernels):
            return cost_model.Decision(True)
        return cost_model.decide("elementwise", cost, ctx.target, grid_steps=1)

    def run(self, module, ctx):
        n_regions = n_small = n_xla = 0
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
                region, decision = commit_region(module, ctx, "elementwise", members,
                                                 decision_for=lambda c: self._decision(c, ctx))
                if region is None:
                    continue                # dead code, erased
                n_regions += 1
                n_xla += not decision.fuse
        left.flush(ctx)
        xla = {"left_to_xla": n_xla} if n_xla else {}
        return {"regions": n_regions, "too_small": n_small, **xla, **left.stats()}
