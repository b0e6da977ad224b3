"""``cse``: jaxlib's upstream common-subexpression elimination.

Rewrites: identical side-effect-free ops with identical operands become one.
Preconditions: none. Invariant: results unchanged (bit-exact), module verifies.
"""

from hlofuse.core.pipeline import UpstreamPass


class CSE(UpstreamPass):
    name = "cse"
    upstream = "cse"
