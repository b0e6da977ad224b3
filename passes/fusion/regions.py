"""Step 2 of fusion: form regions inside one block, never creating a cycle.

A region is a set of ops of one block that will run as one kernel. Regions grow greedily
producer→consumer in program order (like torch's CapabilityBasedPartitioner): a member joins
its producer's region when both may join, their ``key`` (iteration domain) matches, and the
merge creates no cycle. A cycle would be a path that leaves the merged region through an
outside op and comes back in: then no single kernel could run both halves.
"""

from __future__ import annotations

from typing import Callable, Hashable

from jaxlib.mlir import ir


def _as_op(owner):
    """Normalize a value's owner: an ``ir.Operation`` for op results, None for block args."""
    if isinstance(owner, ir.Block):
        return None
    return getattr(owner, "operation", owner)


def _block_index(ops) -> dict:
    return {op: i for i, op in enumerate(ops)}


def _top_level_user(op, index: dict):
    """Map a user (possibly nested inside a while/case body) to its ancestor op in the block."""
    cur = op
    while cur is not None and cur not in index:
        parent = cur.parent
        cur = parent if parent is not None and parent.name != "func.func" else None
    return cur


class Partition:
    """Union-find over block ops with cycle-checked merges."""

    def __init__(self, ops: list, index: dict):
        self.ops = ops
        self.index = index
        self.group: dict = {}        # op -> group id
        self.members: dict[int, list] = {}

    def add(self, op) -> None:
        gid = len(self.members)
        self.group[op] = gid
        self.members[gid] = [op]

    def users(self, op) -> list:
        out = []
        for r in op.results:
            for u in r.uses:
                top = _top_level_user(_as_op(u.owner), self.index)
                if top is not None and top is not op:
                    out.append(top)
        return out

    def creates_cycle(self, ga: int, gb: int) -> bool:
        """Is there a path ga -> outside op -> ... -> gb (or gb -> ... -> ga)?"""
        return self._path_outside(ga, gb) or self._path_outside(gb, ga)

    def _path_outside(self, src: int, dst: int) -> bool:
        dst_ops = set(self.members[dst])
        src_ops = set(self.members[src])
        limit = max(self.index[o] for o in dst_ops)
        stack = [u for o in src_ops for u in self.users(o) if u not in src_ops and u not in dst_ops]
        seen = set()
        while stack:
            op = stack.pop()
            if op in seen or self.index[op] > limit:
                continue
            seen.add(op)
            for u in self.users(op):
                if u in dst_ops:
                    return True
                if u not in src_ops:
                    stack.append(u)
        return False

    def merge(self, ga: int, gb: int) -> int:
        keep, drop = (ga, gb) if ga < gb else (gb, ga)
        for op in self.members.pop(drop):
            self.group[op] = keep
            self.members[keep].append(op)
        self.members[keep].sort(key=self.index.__getitem__)
        return keep


def form_regions(ops: list, can_join: Callable[[object], bool],
                 key: Callable[[object], Hashable]) -> list[list]:
    """Group the ops of one block (program order) into cycle-free regions.

    Args:
      ops: the block's operations in order.
      can_join: predicate, may this op be a region member at all.
      key: ops are merged only with equal keys (e.g. the iteration domain shape).
    Returns:
      regions as lists of ops in program order (singletons included).
    """
    index = _block_index(ops)
    part = Partition(ops, index)
    for op in ops:
        if can_join(op):
            part.add(op)
    for op in ops:
        if op not in part.group:
            continue
        for v in op.operands:
            prod = _as_op(v.owner)
            if prod is None or prod not in part.group:
                continue  # block argument or non-member producer
            ga, gb = part.group[prod], part.group[op]
            if ga == gb or key(prod) != key(op):
                continue
            if part.creates_cycle(ga, gb):
                continue
            part.merge(ga, gb)
    return [m for _, m in sorted(part.members.items())]
