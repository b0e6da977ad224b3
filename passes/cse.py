"""``cse``: jaxlib's upstream common-subexpression elimination.

Rewrites: identical side-effect-free ops with identical operands become one.

Except, on TPU, large elementwise ops and broadcasts (results of at least ``recompute_bytes``;
default 1 MiB there, 0 = merge everything, the default elsewhere): a training step computes
BatchNorm's ``x - mean`` once for the variance and once for the normalization, and XLA:TPU
fuses each copy into its consumer. Merged, the difference is one buffer both consumers read,
which XLA:TPU keeps live: a ResNet bottleneck stage's training step (batch 64, 56x56x256, f32)
peaked 196 MiB (one activation) above ``jax.jit``'s on TPU v5e with only this pass enabled
(``python -m bench --memory --chips v5e --steps resnet``: 2612 -> 2416 MiB, as jax.jit). H100 and CPU showed no
such cost, so they merge everything. Those ops are tagged with a unique attribute for the
upstream pass (MLIR's CSE compares attributes), which is removed afterwards.

Preconditions: none. Invariant: results unchanged (bit-exact), module verifies; the module
after it carries no tag.
"""

from __future__ import annotations

import dataclasses

from hlofuse.core import ir as hir
from hlofuse.core.pipeline import UpstreamPass
from hlofuse.passes import graph_util as gu


class CSE(UpstreamPass):
    name = "cse"
    upstream = "cse"

    @dataclasses.dataclass(frozen=True)
    class Options:
        # elementwise ops and broadcasts with results of at least this many bytes are not
        # merged (XLA recomputes them in each consumer's fusion); 0: merge everything; -1: the
        # target's default (graph_util.CSE_RECOMPUTE_BYTES: 1 MiB on tpu, else 0)
        recompute_bytes: int = -1

    def run(self, module, ctx):
        before = len(hir.all_ops(module))
        kept = gu.cse(module, ctx.target.kind, self.options.recompute_bytes)
        stats = {self.stat: before - len(hir.all_ops(module))}
        if kept:
            stats["large_elementwise_kept"] = kept
        return stats
