"""``inline-calls``: inline every ``func.call`` into its caller.

jax wraps ``jax.jit``-decorated helpers (``relu``, ``_where``, ``clip``...) in private
functions; fusion works on one flat body. jaxlib's upstream ``inline`` pass does not inline
``func.call`` (facts §2), so this uses :func:`hlofuse.ir.inline_all_calls`.
Preconditions: no recursion. Invariant: results unchanged (bit-exact); callees left unused
are removed later by ``symbol-dce``.
"""

from hlofuse import ir as hir
from hlofuse.pipeline import Pass, register_pass


@register_pass
class InlineCalls(Pass):
    name = "inline-calls"

    def run(self, module, ctx):
        return {"calls_inlined": hir.inline_all_calls(module)}
