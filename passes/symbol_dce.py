"""``symbol-dce``: jaxlib's upstream dead-symbol elimination.

Rewrites: removes private functions nothing calls (outlined regions replaced by kernels,
callees left after inlining). Invariant: ``@main`` and public symbols are kept.
"""

from hlofuse import ir as hir
from hlofuse.pipeline import Pass, register_pass


@register_pass
class SymbolDCE(Pass):
    name = "symbol-dce"

    def run(self, module, ctx):
        before = len(hir.funcs(module))
        hir.run_upstream_passes(module, "builtin.module(symbol-dce)")
        return {"funcs_removed": before - len(hir.funcs(module))}
