"""``canonicalize``: jaxlib's upstream MLIR canonicalizer.

Rewrites: for StableHLO in jaxlib 0.10.2 it removes dead, side-effect-free ops (it does not
fold ``x+0`` or constants; see the algebraic-simplification pass for that).
Preconditions: none. Invariant: results unchanged, module verifies.
"""

from hlofuse import ir as hir
from hlofuse.pipeline import Pass, register_pass


@register_pass
class Canonicalize(Pass):
    name = "canonicalize"

    def run(self, module, ctx):
        before = len(hir.all_ops(module))
        hir.run_upstream_passes(module, "builtin.module(canonicalize)")
        return {"ops_removed": before - len(hir.all_ops(module))}
