"""Anchored growth: one region around each anchor op (a reduce, a dot_general), then commit.

The driver ``fuse-reduction`` and ``fuse-matmul-epilogue`` share. For every block of the
program it takes the first anchor not tried yet, checks it, lets the pass grow a region around
it over the block's current def-use graph (:class:`~hlofuse.passes.fusion.regions.BlockGraph`)
and always ends in the region commit (:func:`~hlofuse.passes.fusion.commit.commit_region`:
report, cost model, outline). The block is read again after every commit: the outlined region
is one call op by then, so later regions see it as such and stay acyclic.
"""

from __future__ import annotations

import dataclasses
from typing import Callable

from hlofuse.core import ir as hir
from hlofuse.passes.fusion.commit import LeftToXla, commit_region
from hlofuse.passes.fusion.outline import program_blocks
from hlofuse.passes.fusion.regions import BlockGraph

__all__ = ["Grown", "fuse_anchored"]


@dataclasses.dataclass
class Grown:
    """A region a pass grew around its anchor, ready to commit."""
    members: list                  # ops of the block, program order
    decision_for: Callable         # cost -> cost_model.Decision
    extra: dict                    # report extras of the region


def fuse_anchored(module, ctx, *, kind: str, anchor_name: str, check_anchor: Callable,
                  grow: Callable, left: LeftToXla, what: str) -> dict:
    """Grow and commit a region of ``kind`` around every ``anchor_name`` op of the program.

    Args:
      check_anchor: ``(op, target) -> reason | None``; an anchor with a reason is left to XLA
        (noted in ``left`` as ``what``).
      grow: ``(graph, anchor, tried) -> Grown | reason``; may add ops to ``tried`` (anchors the
        region absorbed); a reason leaves the anchor to XLA, noted in ``left``.
    Returns:
      counts: ``regions`` (kernels to build), ``left_to_xla`` (committed, cost model said no),
      ``unsupported`` (anchors ``check_anchor`` refused).
    """
    counts = {"regions": 0, "left_to_xla": 0, "unsupported": 0}
    for block in program_blocks(module):
        tried: set = set()
        ops = None                      # the block's ops, listed again only after a change
        while True:
            if ops is None:
                ops = [o for o in hir.block_ops(block) if not o.name.endswith("return")]
            anchor = next((o for o in ops if o.name == anchor_name and o not in tried), None)
            if anchor is None:
                break
            tried.add(anchor)
            reason = check_anchor(anchor, ctx.target)
            if reason is not None:      # nothing changed: the same op list serves the next anchor
                left.add(what, anchor, reason)
                counts["unsupported"] += 1
                continue
            graph, ops = BlockGraph(ops), None     # grow may clone ops (rematerialization)
            grown = grow(graph, anchor, tried)
            if isinstance(grown, str):
                left.add(what, anchor, grown)
                continue
            region, decision = commit_region(module, ctx, kind, grown.members,
                                             decision_for=grown.decision_for, **grown.extra)
            if region is None:
                counts["dead_erased"] = counts.get("dead_erased", 0) + 1
                continue
            counts["regions" if decision.fuse else "left_to_xla"] += 1
    return counts
