"""``cse``: jaxlib's upstream common-subexpression elimination.

Rewrites: identical side-effect-free ops with identical operands become one.
Preconditions: none. Invariant: results unchanged (bit-exact), module verifies.
"""

from hlofuse import ir as hir
from hlofuse.pipeline import Pass, register_pass


@register_pass
class CSE(Pass):
    name = "cse"

    def run(self, module, ctx):
        before = len(hir.all_ops(module))
        hir.run_upstream_passes(module, "builtin.module(cse)")
        return {"ops_removed": before - len(hir.all_ops(module))}
