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

from hlofuse.core import ir as hir
from hlofuse.core.ops import OpClass, rule_for
from hlofuse.passes.fusion.cost import remat_choice


def _top_level_user(op, index: dict):
    """Map a user (possibly nested inside a while/case body) to its ancestor op in the block."""
    cur = op
    while cur is not None and cur not in index:
        parent = cur.parent
        cur = parent if parent is not None and parent.name != "func.func" else None
    return cur


class Partition:
    """Union-find over block ops with cycle-checked merges (def-use from a :class:`BlockGraph`)."""

    def __init__(self, graph: "BlockGraph"):
        self.graph = graph
        self.index = graph.index
        self.users = graph.users
        self.group: dict = {}        # op -> group id
        self.members: dict[int, list] = {}
        self.spans: dict[int, tuple[int, int]] = {}   # multi-member group -> first, last index

    def add(self, op) -> None:
        gid = len(self.members)
        self.group[op] = gid
        self.members[gid] = [op]

    def creates_cycle(self, ga: int, gb: int) -> bool:
        """Would merging groups ga and gb make the graph of regions cyclic?

        True when a path leaves one group and reaches the other through at least one node
        outside both. Other groups count as single nodes (they will be one kernel each): entering
        any member of a group reaches the users of all its members.
        """
        return self._path_outside(ga, gb) or self._path_outside(gb, ga)

    def _horizon(self, dst_ops) -> int:
        """The program index past which no path reaches ``dst_ops``.

        Def-use edges go forward in program order; only a jump inside a merged group (entering
        one member reaches the users of all) can come back. From index ``t`` on, nothing at or
        before ``t`` is reachable once no multi-member group straddles ``t`` (a member at or
        before it and one after it): sweep the groups by their first member, pushing ``t`` past
        every group that straddles it. Without this bound every failed query walked everything
        downstream of ``src`` (to the end of the function): most of fuse-elementwise's time in
        a training step."""
        t = max(self.index[o] for o in dst_ops)
        for lo, hi in sorted(self.spans.values()):
            if lo > t:
                break
            t = max(t, hi)
        return t

    def _path_outside(self, src: int, dst: int) -> bool:
        src_ops = set(self.members[src])
        dst_ops = set(self.members[dst])
        horizon = self._horizon(dst_ops)
        index = self.index
        stack = [u for o in src_ops for u in self.users(o)
                 if u not in src_ops and u not in dst_ops and index[u] <= horizon]
        seen: set = set()
        seen_groups: set = set()
        while stack:
            op = stack.pop()
            if op in seen:
                continue
            seen.add(op)
            nodes = [op]
            g = self.group.get(op)
            if g is not None and g not in seen_groups and len(self.members[g]) > 1:
                seen_groups.add(g)
                nodes = self.members[g]
                seen.update(nodes)
            for n in nodes:
                for u in self.users(n):
                    if u in dst_ops:
                        return True
                    if u not in src_ops and u not in seen and index[u] <= horizon:
                        stack.append(u)
        return False

    def merge(self, ga: int, gb: int) -> int:
        keep, drop = (ga, gb) if ga < gb else (gb, ga)
        for op in self.members.pop(drop):
            self.group[op] = keep
            self.members[keep].append(op)
        self.members[keep].sort(key=self.index.__getitem__)
        self.spans.pop(drop, None)
        m = self.members[keep]
        self.spans[keep] = (self.index[m[0]], self.index[m[-1]])
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
    part = Partition(BlockGraph(ops))
    for op in ops:
        if can_join(op):
            part.add(op)
    for op in ops:
        if op not in part.group:
            continue
        for v in op.operands:
            prod = hir.defining_op(v)
            if prod is None or prod not in part.group:
                continue  # block argument or non-member producer
            ga, gb = part.group[prod], part.group[op]
            if ga == gb or key(prod) != key(op):
                continue
            if part.creates_cycle(ga, gb):
                continue
            part.merge(ga, gb)
    return [m for _, m in sorted(part.members.items())]


# ---------------------------------------------------------------------------------------------
# Anchor-based regions (reduction, matmul epilogue) and sibling merging (horizontal fusion).
#
# Those regions grow from one anchor op (a reduce, a dot_general) instead of merging groups,
# so the test is on a set of ops: a set is *convex* when no path leaves it and comes back in
# (``members -> outside op -> ... -> members``). Only convex sets can run as one kernel: the
# kernel needs all its inputs before it starts and produces all outputs when it ends. Regions
# outlined earlier are single call ops here, so checking each new region against the current
# block keeps the graph of kernels acyclic as well.
# ---------------------------------------------------------------------------------------------


class BlockGraph:
    """Def-use of one block's ops (program order), users mapped to their top-level ancestor."""

    def __init__(self, ops: list):
        self.ops = list(ops)
        self.index = {op: i for i, op in enumerate(self.ops)}
        self._users: dict = {}
        self._preds: dict = {}

    def users(self, op) -> list:
        cached = self._users.get(op)
        if cached is not None:
            return cached
        out = []
        for r in op.results:
            for u in r.uses:
                top = _top_level_user(hir.as_op(u.owner), self.index)
                if top is not None and top != op and top not in out:
                    out.append(top)
        self._users[op] = out
        return out

    def producers(self, op) -> list:
        out = []
        for v in op.operands:
            p = hir.defining_op(v)
            if p is not None and p in self.index and p not in out:
                out.append(p)
        return out

    def is_convex(self, members) -> bool:
        """No path leaves ``members`` through an outside op and re-enters them."""
        mset = set(members)
        last = max(self.index[m] for m in mset)
        stack = [u for m in mset for u in self.users(m) if u not in mset and self.index[u] < last]
        seen: set = set()
        while stack:
            op = stack.pop()
            if op in seen:
                continue
            seen.add(op)
            for u in self.users(op):
                if u in mset:
                    return False
                if u not in seen and self.index[u] < last:
                    stack.append(u)
        return True

    def preds(self, op) -> list:
        """The block ops ``op`` is a user of (:meth:`users` reversed): producers of its
        operands and of values read inside its regions."""
        cached = self._preds.get(op)
        if cached is not None:
            return cached
        inner = []
        if len(op.regions):
            hir.walk(op, inner.append)
        out = []
        for o in inner or [op]:
            for v in o.operands:
                p = hir.defining_op(v)
                if p is not None and p != op and p in self.index and p not in out:
                    out.append(p)
        self._preds[op] = out
        return out

    def stays_convex(self, members, c, bounds: tuple[int, int] | None = None) -> bool:
        """``is_convex(members | {c})`` for a convex ``members`` (growing a region one op at a
        time): only paths through ``c`` can newly leave and re-enter, so only ``c``'s
        neighbourhood is searched (not every member's users again): no path
        ``c -> outside.. -> member`` (forwards) and no ``member -> outside.. -> c``
        (backwards, over :meth:`preds`). ``bounds``: the members' (lowest, highest) index
        when the caller keeps them."""
        mset = members if isinstance(members, (set, frozenset)) else set(members)
        index = self.index
        lo, hi = bounds if bounds is not None else (min(index[m] for m in mset),
                                                    max(index[m] for m in mset))
        last, first = max(index[c], hi), min(index[c], lo)
        for step, bound_ok in ((self.users, lambda i: i < last), (self.preds, lambda i: i > first)):
            stack = [u for u in step(c) if u not in mset and bound_ok(index[u])]
            seen: set = set()
            while stack:
                op = stack.pop()
                if op in seen:
                    continue
                seen.add(op)
                for u in step(op):
                    if u in mset:
                        return False
                    if u != c and u not in seen and bound_ok(index[u]):
                        stack.append(u)
        return True

    def outside_users(self, op, members) -> list:
        mset = set(members)
        return [u for u in self.users(op) if u not in mset]


def grow_region(graph: BlockGraph, anchor, admit: Callable, *, claimed=frozenset(),
                max_ops: int = 4096, on_admit: Callable | None = None) -> tuple[list, dict]:
    """Grow a convex region from ``anchor`` over producers and users, greedily, to a fixpoint.

    Args:
      graph: the block's :class:`BlockGraph`.
      anchor: the op the region starts from.
      admit: ``admit(candidate, members: set, direction: 'producer'|'user') -> reason | None``;
        None admits the op (before the convexity check).
      claimed: ops that belong to other regions of this pass and must not join.
      on_admit: called with each op once it joined (e.g. to commit state ``admit`` prepared).
    Returns:
      (members in program order, {op: reason} for neighbours that were refused).
    """
    members = {anchor}
    bounds = (graph.index[anchor], graph.index[anchor])   # lowest and highest member index
    refused: dict = {}
    changed = True
    while changed and len(members) < max_ops:
        changed = False
        for m in sorted(members, key=graph.index.__getitem__):
            cands = [(p, "producer") for p in graph.producers(m)] + [(u, "user") for u in graph.users(m)]
            for c, direction in cands:
                if c in members or c in claimed:
                    continue
                reason = admit(c, members, direction)
                if reason is None and not graph.stays_convex(members, c, bounds):
                    reason = "joining would create a cycle (a path leaves the region and re-enters it)"
                if reason is not None:
                    refused[c] = reason
                    continue
                refused.pop(c, None)
                members.add(c)
                bounds = (min(bounds[0], graph.index[c]), max(bounds[1], graph.index[c]))
                if on_admit is not None:
                    on_admit(c)
                changed = True
    return sorted(members, key=graph.index.__getitem__), refused


NOT_CONVEX = "a path between the siblings through other ops (one depends on the other)"
OTHER_DOMAIN = "siblings over different iteration domains"
ONLY_CONSTANT = "siblings share only a constant"


def merge_siblings(graph: BlockGraph, groups: list[list], key: Callable[[list], Hashable],
                   refused: Callable[[int, str], None] | None = None) -> list[list]:
    """Horizontal merging: groups that read a common input value and share ``key`` merge when
    the union stays convex (no path between them through outside ops or each other).

    Args:
      graph: the block's :class:`BlockGraph`.
      groups: disjoint op groups (e.g. elementwise regions), each convex.
      key: groups merge only with equal keys (e.g. iteration domain).
      refused: called ``(group index, reason)`` for each group that merged with nothing
        although it had a sibling: one reading a common input (:data:`NOT_CONVEX`,
        :data:`OTHER_DOMAIN`) or, with an equal key, a common constant (:data:`ONLY_CONSTANT`).
    Returns:
      the merged groups (only those made of two or more input groups), each in program order.
    """
    def inputs(g):
        gs = set(g)
        vals = set()
        for op in g:
            for v in op.operands:
                p = hir.defining_op(v)
                if p is not None and (p in gs or p.name == "stablehlo.constant"):
                    continue  # internal, or a constant (sharing one is no reason to merge)
                vals.add(v)
        return vals

    def constants(g):
        return {v for op in g for v in op.operands
                if (p := hir.defining_op(v)) is not None and p.name == "stablehlo.constant"}

    reads = [inputs(g) for g in groups]
    consts: dict[int, set] = {}           # group index -> its constants (when asked)

    def consts_of(gi):
        if gi not in consts:
            consts[gi] = constants(groups[gi])
        return consts[gi]

    # per merged set: the union of its groups' reads and constants and its key, kept up to
    # date on every merge (recomputing them per pair was quadratic: 0.55 s of a UNet step's)
    merged: list[set] = []
    reads_m: list[set] = []
    consts_m: list[set | None] = []       # None: not computed yet
    groups_m: list[list[int]] = []
    key_m: list = []
    origin: list[int] = []
    where: list[int] = []                 # group index -> index of its merged set
    why: dict[int, str] = {}              # group index -> why it joined no earlier set
    rank = {NOT_CONVEX: 0, OTHER_DOMAIN: 1, ONLY_CONSTANT: 2}
    for gi, g in enumerate(groups):
        placed = False
        kg = key(g)
        for mi, m in enumerate(merged):
            shared = reads[gi] & reads_m[mi]
            same_key = kg == key_m[mi]
            reason = None
            if not same_key:
                reason = OTHER_DOMAIN if shared else None
            elif not shared:
                if refused is not None:
                    if consts_m[mi] is None:
                        consts_m[mi] = set().union(*(consts_of(j) for j in groups_m[mi]))
                    if consts_of(gi) & consts_m[mi]:
                        reason = ONLY_CONSTANT
            elif graph.is_convex(m | set(g)):
                m.update(g)
                reads_m[mi] |= reads[gi]
                groups_m[mi].append(gi)
                consts_m[mi] = None
                key_m[mi] = key(sorted(m, key=graph.index.__getitem__))
                origin[mi] += 1
                where.append(mi)
                placed = True
                break
            else:
                reason = NOT_CONVEX
            if reason is not None and rank[reason] < rank.get(why.get(gi), 3):
                why[gi] = reason
        if not placed:
            merged.append(set(g))
            reads_m.append(set(reads[gi]))
            consts_m.append(None)
            groups_m.append([gi])
            key_m.append(kg)
            origin.append(1)
            where.append(len(merged) - 1)
    if refused is not None:
        for gi, reason in why.items():
            if origin[where[gi]] == 1:  # a later group may still have joined it
                refused(gi, reason)
    return [sorted(m, key=graph.index.__getitem__) for m, n in zip(merged, origin) if n > 1]


# ---------------------------------------------------------------------------------------------
# Rematerialization: members that are also used outside the region
# ---------------------------------------------------------------------------------------------

def rematerialize(graph: BlockGraph, members: list, target: str, *, keep=()) -> tuple[list, dict]:
    """Decide, for every member also used outside the region, recompute or materialize.

    ``recompute`` clones the op (with the broadcasts/constants it reads from inside the region)
    in front of its first outside user and points the outside users at the clone; the region
    keeps the original, which then has no outside use. ``materialize`` makes it an extra region
    output. Ops reading other computed region values can only be materialized.
    Returns (members, {op name: decision}) -- members unchanged: clones are not members.
    """
    mset = set(members)
    decisions = {}
    for op in members:
        if op in keep or len(op.results) != 1 or len(op.regions):
            continue
        outside = graph.outside_users(op, mset)
        if not outside:
            continue
        chain = _cheap_member_producers(op, mset)
        if chain is None:
            decisions.setdefault(op.name, "materialize (operands computed in the region)")
            continue
        choice, why = remat_choice(op, outside, target)
        decisions[op.name] = why
        if choice != "recompute":
            continue
        first = min(outside, key=graph.index.__getitem__)
        mapping = {}
        with op.context, op.location:
            for p in chain + [op]:
                clone = p.clone(ip=ir.InsertionPoint(first))
                for i, v in enumerate(p.operands):
                    if v in mapping:
                        clone.operands[i] = mapping[v]
                mapping[p.results[0]] = clone.results[0]
        res = op.results[0]
        for use in list(res.uses):
            owner_op = hir.as_op(use.owner)
            if _top_level_user(owner_op, graph.index) in mset:
                continue
            owner_op.operands[use.operand_number] = mapping[res]
    return members, decisions


def _cheap_member_producers(op, mset) -> list | None:
    """The region members ``op`` reads, when all are broadcasts/constants of outside values
    (program order: producers first); None when it reads a computed region value."""
    out = []
    for v in op.operands:
        p = hir.defining_op(v)
        if p is None or p not in mset:
            continue
        if rule_for(p.name).cls not in (OpClass.BROADCAST, OpClass.CONSTANT):
            return None
        sub = _cheap_member_producers(p, mset)
        if sub is None:
            return None
        for q in sub + [p]:
            if q not in out:
                out.append(q)
    return out

