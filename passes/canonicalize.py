"""``canonicalize``: jaxlib's upstream MLIR canonicalizer.

Rewrites: for StableHLO in jaxlib 0.10.2 it removes dead, side-effect-free ops (it does not
fold ``x+0`` or constants; see the algebraic-simplification pass for that).
Preconditions: none. Invariant: results unchanged, module verifies.
"""

from hlofuse.core.pipeline import UpstreamPass


class Canonicalize(UpstreamPass):
    name = "canonicalize"
    upstream = "canonicalize"
