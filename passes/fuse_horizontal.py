"""``fuse-horizontal``: independent ops reading the same input, merged into one kernel.

Rewrites two things, both only between ops with no path between them (the merged set must stay
convex, :meth:`~hlofuse.passes.fusion.regions.BlockGraph.is_convex`):

1. *Sibling dots* (Q/K/V projections): calls of ``matmul_epilogue`` regions (fused or left to
   XLA) whose dot reads the same lhs value, with the same lhs prologue, layout and result shape,
   are inlined back and outlined again as one ``horizontal`` region: one kernel that loads each
   lhs tile once for all of them (:mod:`hlofuse.kernels.horizontal`). The merged regions'
   report entries say ``merged into region N`` and carry no bytes (the new entry has them).
2. *Sibling elementwise chains*: cycle-free elementwise groups (as ``fuse-elementwise`` would
   form them) over the same domain that read a common input merge into one multi-output
   ``elementwise`` region (``extra['horizontal']``), read once instead of once per chain.
   Groups that merge with nothing are left for ``fuse-elementwise``.

Refused candidates are counted by reason in the statistics (``refused[<reason>]``) and noted
once per reason in the report: sibling dots (calls reading a common value) with a different lhs,
shape, layout, prologue or dtype, or with a path between them; sibling elementwise groups over
different domains, with a path between them, or sharing only a constant.

Each merged region gets its own cost-model decision (:func:`~hlofuse.passes.fusion.cost.decide`).
Preconditions: after ``fuse-matmul-epilogue`` and ``fuse-reduction``, before
``fuse-elementwise``. Invariant: the module verifies; the same ops run (results within
``reassociate`` for dots, bit-exact for elementwise chains).
"""

from __future__ import annotations

import dataclasses

from jaxlib.mlir import ir

from hlofuse.core import ir as hir
from hlofuse.core.ops import OpClass, rule_for
from hlofuse.core.pipeline import Pass
from hlofuse.passes.fusion.commit import commit_region
from hlofuse.passes.fusion import cost as cost_model
from hlofuse.passes.fusion.outline import KIND_ATTR, REGION_ATTR, program_blocks
from hlofuse.kernels.support import domain_shape
from hlofuse.passes.fusion.predicates import elementwise_member
from hlofuse.passes.fusion.regions import NOT_CONVEX, BlockGraph, form_regions, merge_siblings
from hlofuse.core.report import Refusals

KIND = "horizontal"
MATMUL_KIND = "matmul_epilogue"


def inline_call(call, callee) -> list:
    """Clone ``callee``'s body in front of ``call``, rewire the call's results, erase the call.

    Returns the cloned ops in program order.
    """
    entry = callee.regions[0].blocks[0]
    mapping = {hir.value_key(a): v for a, v in zip(entry.arguments, call.operands)}
    cloned = []
    ret_vals = None
    with call.context, call.location, ir.InsertionPoint(call):
        for op in entry.operations:
            op = op.operation
            if op.name == "func.return":
                ret_vals = [mapping.get(hir.value_key(v), v) for v in op.operands]
                break
            cloned.append(hir.clone_mapped(op, mapping))
    for old, new in zip(call.results, ret_vals):
        old.replace_all_uses_with(new)
    hir.safe_erase(call)
    return cloned


def _matmul_calls(ops, table, ctx) -> list:
    """(call, callee, spec) for every call of a matmul-epilogue region outlined by this run
    (not one an earlier run left to XLA) whose spec the matmul family can build."""
    from hlofuse.kernels.matmul_epilogue import spec_from_func
    out = []
    for op in ops:
        if op.name != "func.call":
            continue
        callee = table[ir.FlatSymbolRefAttr(op.attributes["callee"]).value]
        if KIND_ATTR not in callee.attributes or ir.StringAttr(callee.attributes[KIND_ATTR]).value != MATMUL_KIND:
            continue
        rid = ir.IntegerAttr(callee.attributes[REGION_ATTR]).value
        regions = ctx.report.regions
        if rid >= len(regions) or regions[rid].extra.get("func") != hir.func_name(callee):
            continue  # outlined by an earlier run: its decision stands (idempotence)
        try:
            spec = spec_from_func(callee)
        except NotImplementedError:   # EmitError: a region the matmul family cannot express
            continue
        out.append((op, callee, spec))
    return out


def _group_key(call, spec) -> tuple:
    lhs = call.operands[spec.lhs_arg]
    prologue = hir.ops_text(spec.lhs_prologue)
    return (lhs, spec.lhs_t, spec.batch, spec.m, spec.n, spec.k, prologue,
            tuple(str(d.out_dtype) for d in spec.dots))


DOTS = "sibling dot(s)"
ELEMENTWISE = "sibling elementwise group(s)"
DIFFERENT_LHS = "sibling dots share an operand but not the lhs"
# _group_key parts after the lhs value -> why two dots reading the same lhs cannot merge
_KEY_PARTS = ("lhs layout differs", "different shapes", "different shapes", "different shapes",
              "different shapes", "different lhs prologues", "different result dtypes")


def _why_apart(key, other) -> str:
    """Why two matmul calls with these group keys are not merged (they differ)."""
    if key[0] != other[0]:
        return DIFFERENT_LHS
    return "sibling dots with " + next(
        why for why, a, b in zip(_KEY_PARTS, key[1:], other[1:]) if a != b)


def _note_dot_siblings(calls: list, refused: Refusals) -> None:
    """Refusals for calls in different groups that read a common value: each call that shares
    a value with a call of an earlier group, once, with the first difference of their keys."""
    seen: list = []                               # (operand keys, group key) of earlier groups
    by_key: dict = {}
    for call, key in calls:
        by_key.setdefault(key, []).append(call)
    for key, members in by_key.items():
        reads = {hir.value_key(v) for c in members for v in c.operands}
        other = next((k for r, k in seen if r & reads), None)
        if other is not None:
            refused.add(DOTS, _why_apart(key, other), hir.op_location(members[0]))
        seen.append((reads, key))


def merge_sibling_dots(module, ctx, block, refused: Refusals) -> int:
    table = ir.SymbolTable(module.operation)
    ops = [o for o in hir.block_ops(block) if not o.name.endswith("return")]
    groups: dict = {}
    keyed = []
    for call, callee, spec in _matmul_calls(ops, table, ctx):
        groups.setdefault(_group_key(call, spec), []).append((call, callee))
        keyed.append((call, _group_key(call, spec)))
    _note_dot_siblings(keyed, refused)
    merged = 0
    for members in groups.values():
        if len(members) < 2:
            continue
        # the block changed if an earlier group was merged: rebuild its def-use view
        graph = BlockGraph([o for o in hir.block_ops(block) if not o.name.endswith("return")])
        chosen = []
        for call, callee in members:  # greedily keep the calls whose union stays convex
            if graph.is_convex({c for c, _ in chosen} | {call}):
                chosen.append((call, callee))
            else:
                refused.add(DOTS, NOT_CONVEX, hir.op_location(call))
        if len(chosen) < 2:
            continue
        old_ids = [ir.IntegerAttr(callee.attributes[REGION_ATTR]).value for _, callee in chosen]
        body = []
        for call, callee in chosen:
            body += inline_call(call, callee)
        block_index = {o: i for i, o in enumerate(hir.block_ops(block))}
        body.sort(key=block_index.__getitem__)
        n_dots = sum(1 for o in body if o.name == "stablehlo.dot_general")

        def decision_for(cost):
            return cost_model.decide(KIND, cost, ctx.target, grid_steps=1)

        region, _ = commit_region(module, ctx, KIND, body, decision_for=decision_for,
                                  dots=n_dots, merged_regions=old_ids, tolerance="reassociate")
        for rid in old_ids:
            if rid < len(ctx.report.regions):
                old = ctx.report.region(rid)
                old.reason = f"merged into horizontal region {region.id}"
                old.kernel = None
                old.bytes_unfused = old.bytes_fused = 0
                old.extra["merged_into"] = region.id
        merged += 1
        table = ir.SymbolTable(module.operation)
    return merged


def merge_sibling_elementwise(module, ctx, block, refused: Refusals, cpu_kernels: bool = False) -> int:
    ops = [o for o in hir.block_ops(block) if not o.name.endswith("return")]
    groups = form_regions(ops, lambda op: elementwise_member(op, ctx.target) is None, domain_shape)
    groups = [g for g in groups if any(rule_for(m.name).cls is OpClass.ELEMENTWISE for m in g)
              and domain_shape(g[0]) not in ((), None)]
    graph = BlockGraph(ops)
    merged = merge_siblings(graph, groups, key=lambda g: domain_shape(g[-1]),
                            refused=lambda gi, why: refused.add(ELEMENTWISE, why,
                                                               hir.op_location(groups[gi][0])))
    done = 0
    for members in merged:
        # an earlier group is one call now: re-check on the current block (two groups, each
        # convex, may still feed each other both ways, which one kernel each cannot express)
        now = BlockGraph([o for o in hir.block_ops(block) if not o.name.endswith("return")])
        if not now.is_convex(members):
            refused.add(ELEMENTWISE, "sibling groups feed each other both ways through merged regions",
                        hir.op_location(members[0]))
            continue

        def decision_for(cost):
            if ctx.target.is_cpu and cost_model.cpu_elementwise_kernels(cpu_kernels):
                return cost_model.Decision(True)
            return cost_model.decide("elementwise", cost, ctx.target, grid_steps=1)
        commit_region(module, ctx, "elementwise", members, decision_for=decision_for, horizontal=True)
        done += 1
    return done


class FuseHorizontal(Pass):
    name = "fuse-horizontal"

    @dataclasses.dataclass(frozen=True)
    class Options:
        # merged sibling elementwise chains become kernels on cpu although the cost model's cpu
        # rule leaves elementwise loops to XLA:CPU (tests and experiments; no effect on gpu/tpu)
        cpu_kernels: bool = False

    def run(self, module, ctx):
        dots = elementwise = 0
        refused = Refusals(self.name, outcome="not merged")
        for block in program_blocks(module):
            dots += merge_sibling_dots(module, ctx, block, refused)
        for block in program_blocks(module):
            elementwise += merge_sibling_elementwise(module, ctx, block, refused,
                                                     self.options.cpu_kernels)
        refused.flush(ctx)
        return {"dot_groups": dots, "elementwise_groups": elementwise, **refused.stats()}
