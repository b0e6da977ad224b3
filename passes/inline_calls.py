"""``inline-calls``: inline every ``func.call`` into its caller.

jax wraps ``jax.jit``-decorated helpers (``relu``, ``_where``, ``clip``...) in private
functions; fusion works on one flat body. jaxlib's upstream ``inline`` pass does not inline
``func.call`` (facts §2), so this uses :func:`hlofuse.core.ir.inline_all_calls`.
Preconditions: none (recursive or multi-block callees stay calls). Invariant: results unchanged (bit-exact); callees left unused
are removed here (upstream ``symbol-dce``). Functions hlofuse itself made (outlined regions carrying
``hlofuse.kind``, kernels named ``hlofuse_k*``) stay opaque, so re-running the pipeline on its
own output changes nothing (idempotence).
"""

from hlofuse.core import ir as hir
from hlofuse.core.pipeline import Pass


class InlineCalls(Pass):
    name = "inline-calls"

    def run(self, module, ctx):
        n = hir.inline_all_calls(module, keep=is_hlofuse_func)
        # inlined callees are dead now: drop them so later passes never fuse unreachable code
        hir.run_upstream_passes(module, "builtin.module(symbol-dce)")
        return {"calls_inlined": n}


def is_hlofuse_func(f) -> bool:
    """An outlined region or an imported kernel function (left as is by inlining and fusion)."""
    from hlofuse.passes.fusion.outline import is_hlofuse_func as hlofuse_made
    return hlofuse_made(f)
