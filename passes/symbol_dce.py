"""``symbol-dce``: jaxlib's upstream dead-symbol elimination.

Rewrites: removes private functions nothing calls (outlined regions replaced by kernels,
callees left after inlining). Invariant: ``@main`` and public symbols are kept.
"""

from hlofuse.core import ir as hir
from hlofuse.core.pipeline import UpstreamPass


class SymbolDCE(UpstreamPass):
    name = "symbol-dce"
    upstream = "symbol-dce"
    stat = "funcs_removed"
    count = staticmethod(lambda module: len(hir.funcs(module)))
