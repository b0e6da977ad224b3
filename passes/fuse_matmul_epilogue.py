"""``fuse-matmul-epilogue``: a ``dot_general`` with its operand prologues and result epilogue.

Rewrites: every ``dot_general`` in canonical form (leading batch dims, one contracting dim, one
rhs free dim; the lhs may be (K, M), the rhs (N, K) or unbatched) anchors a region that grows
over

* *epilogue* users: elementwise ops over the dot's result domain (bias add, relu, gelu exact or
  tanh, silu, sigmoid, residual add, scale, convert, ...), with the broadcasts feeding them
  (bias vectors, per-row and scalar values) pulled in as producers;
* *prologue* producers of either operand: ``convert`` and scaling by a scalar, applied to each
  operand tile inside the kernel (the operand is read once, in its original dtype);
* *column sums* of an epilogue value over every row (the bias gradient in the backward of
  ``act(x @ W + b)``), as region outputs of an unbatched dot: the kernel writes one partial per
  row block, summed after it (``column_reductions``: "auto" = gpu/tpu; on cpu, measured with
  ``python -m bench.train_rest --workloads norm_mlp --variant
  colsum=fuse-matmul-epilogue.column_reductions:on`` on a shared 2-core machine, the step took
  1.12x jax.jit's time against 1.01x without it, so it is off there).

A prologue op also used elsewhere is recomputed per region when
:func:`~hlofuse.passes.fusion.cost.remat_choice` says so, else left outside (materialized once).
Epilogue values used outside become extra kernel outputs. A dot with nothing fused around it is
still outlined (so ``fuse-horizontal`` can merge it with siblings) but left to XLA, whose
library GEMM is at least as fast. The cost model may leave any region to XLA (outlined, marked
``hlofuse.xla``) and says why.

1x1 convolutions become dots before this pass (``conv1x1-to-dot``); a region anchored on such a
dot says so in the report (``extra['conv1x1']``).

Preconditions: calls inlined; after ``fuse-attention`` (which claims attention's two dots).
Invariant: the module verifies; kernels accumulate in f32 (results within ``reassociate``).
"""

from __future__ import annotations

import dataclasses
import math
import typing

from hlofuse.core import ir as hir
from hlofuse.core.ops import OpClass, rule_for
from hlofuse.core.pipeline import Pass
from hlofuse.core.target import Target
from hlofuse.kernels.support import (FULL, ClassError, View, dot_layout, extend_classes, is_column_reduce,
                                     prologue_member, reduce_info, value_info)
from hlofuse.kernels.tiling import matmul_blocks
from hlofuse.passes.op_forms import CONV1X1_ATTR
from hlofuse.passes.fusion import cost as cost_model
from hlofuse.passes.fusion.anchored import Grown, fuse_anchored
from hlofuse.passes.fusion.commit import LeftToXla
from hlofuse.passes.fusion.outline import program_blocks
from hlofuse.passes.fusion.predicates import column_reduce_member, dot_anchor, epilogue_member
from hlofuse.passes.fusion.regions import grow_region, rematerialize

KIND = "matmul_epilogue"
# cpu: a one-step kernel is inlined back into the same library dot + XLA epilogue fusion, so a
# 1x1 convolution's region (a ResNet has one per 1x1 convolution) would only add lowering time
# to the first call (resnet_nhwc: 7 kernels, first call 0.48 -> 0.93 s, same fusions)
CPU_CONV1X1_REASON = ("cost model: a 1x1 convolution's dot on cpu: XLA's library dot and its own "
                      "epilogue fusion, the same code a kernel is inlined into; only lowering time to save")


def take_conv1x1_dots(block) -> list:
    """The dots ``conv1x1-to-dot`` made in ``block``; their marker attribute is dropped (it
    must not reach the outlined region or the output)."""
    dots = [op for op in hir.block_ops(block)
            if op.name == "stablehlo.dot_general" and CONV1X1_ATTR in op.attributes]
    for op in dots:
        del op.attributes[CONV1X1_ATTR]
    return dots


def working_set(anchor, members, target: Target) -> tuple[int, int]:
    """(on-chip bytes per kernel instance, grid steps) of the tiles the family would pick."""
    target = Target.of(target)
    lay = dot_layout(anchor)
    lhs = value_info(anchor.operands[0])
    out = value_info(anchor.results[0])
    nb = lay["nb"]
    batch = int(math.prod(lhs.shape[:nb])) if nb else 1
    k = lhs.shape[nb] if lay["lhs_t"] else lhs.shape[-1]
    m = out.size // (batch * out.shape[-1])
    try:
        b = matmul_blocks(batch, m, out.shape[-1], k, target=target, itemsize=hir.dtype_bytes(lhs.dtype))
    except ValueError:
        return 0, 1
    if target.is_gpu:
        return b.smem_bytes, b.grid_steps
    if target.is_tpu:
        return b.vmem_bytes, b.grid_steps
    return 0, b.grid_steps


def grow(graph, anchor, target: Target, conv_dots: list, column_reductions: bool = False) -> Grown:
    """The matmul region around ``anchor``: epilogue users and operand prologues; with
    ``column_reductions``, column sums of epilogue values (a bias gradient) as outputs."""
    target = Target.of(target)
    result = anchor.results[0]
    domain = value_info(result).shape
    view = View.of(domain)
    prologue: set = set()
    state = {"classes": {result: FULL}, "pending": {}, "pending_prologue": set()}

    def feeds_operands(c):
        return any(u == anchor or u in prologue for u in graph.users(c))

    lay = dot_layout(anchor)
    unbatched = lay is not None and math.prod(value_info(anchor.operands[0]).shape[:lay["nb"]]) == 1

    def column_sum(c):
        """Why the column reduce ``c`` may not join as an output (None: it may)."""
        if not column_reductions:
            return ("column reductions off on this target (fuse-matmul-epilogue{column_reductions=on}; "
                    "auto: gpu/tpu only)")
        if not unbatched:
            return "column reduction of a batched matmul"
        if value_info(c.operands[0]).shape != domain or reduce_info(c)[0] != "sum":
            return "column reduction not a sum over the dot's result domain"
        if any(p in prologue or p in state["pending_prologue"] for p in graph.producers(c)):
            # an operand's (M, K) value with K == N has the result's shape, not its view: the
            # kernel refused it ('a prologue value is also used by the epilogue'), a GPT-2
            # step's dropout-scaled input and its bias-gradient sum (adversarial round)
            return "column reduction of a prologue value"
        return column_reduce_member(c, target)

    def admit(c, members, direction):
        if direction == "user" and c.name == "stablehlo.reduce" and is_column_reduce(c):
            why = column_sum(c)
            if why is not None:
                return f"epilogue: {why}"
            try:
                state["pending"][c] = extend_classes(state["classes"], c, view)
            except ClassError as e:
                return f"leaves the dot's block view: {e}"
            return None
        if direction == "producer" and feeds_operands(c):
            scalar_bcast = (c.name == "stablehlo.broadcast_in_dim"
                            and value_info(c.operands[0]).size == 1)
            why = None if scalar_bcast else prologue_member(c, target)
            if why is not None:
                return f"prologue: {why}"
            others = [u for u in graph.users(c) if u != anchor and u not in prologue]
            if any(u in members for u in others):
                return "prologue value also used by the epilogue"
            if others:
                if any(p in members for p in graph.producers(c)):
                    return "shared prologue op with computed operands"
                choice, why = cost_model.remat_choice(c, others, target)
                if choice != "recompute":
                    return f"shared prologue op left outside ({why})"
            state["pending_prologue"].add(c)
            return None
        if direction == "producer":
            if rule_for(c.name).cls is not OpClass.BROADCAST:
                return "only broadcasts join as epilogue producers"
        else:
            why = epilogue_member(c, target)
            if why is not None:
                return f"epilogue: {why}"
            if rule_for(c.name).cls is not OpClass.ELEMENTWISE or value_info(c.results[0]).shape != domain:
                return "not elementwise over the dot's result"
            if any(p in prologue for p in graph.producers(c)):
                return "reads a prologue value"
        try:
            state["pending"][c] = extend_classes(state["classes"], c, view)
        except ClassError as e:
            return f"leaves the dot's block view: {e}"
        return None

    def on_admit(c):
        if c in state["pending_prologue"]:
            prologue.add(c)  # only once it joined (the convexity check may refuse it)
        elif c in state["pending"]:
            state["classes"] = state["pending"].pop(c)

    members, refused = grow_region(graph, anchor, admit, on_admit=on_admit)
    fused_ops = sum(1 for m in members if rule_for(m.name).cls is OpClass.ELEMENTWISE)
    epilogue_ops = sum(1 for m in members if rule_for(m.name).cls is OpClass.ELEMENTWISE
                       and m not in prologue)
    members, remat = rematerialize(graph, members, target, keep=[anchor])
    ws, steps = working_set(anchor, members, target)

    def decision_for(cost):
        cost.working_set_bytes = ws
        if target.is_cpu and anchor in conv_dots:
            return cost_model.Decision(False, CPU_CONV1X1_REASON)
        return cost_model.decide(KIND, cost, target, grid_steps=steps if target.is_cpu else 1,
                                 fused_ops=fused_ops)

    return Grown(members, decision_for, dict(
        prologue=sorted(o.name for o in prologue if rule_for(o.name).cls is OpClass.ELEMENTWISE),
        epilogue_ops=epilogue_ops,
        conv1x1=any(anchor == d for d in conv_dots),
        tolerance="reassociate", remat=remat,
        refused={n.name: r for n, r in list(refused.items())[:4]}))


class FuseMatmulEpilogue(Pass):
    name = "fuse-matmul-epilogue"

    @dataclasses.dataclass(frozen=True)
    class Options:
        # column sums of an epilogue value (the bias gradient of gelu(x @ W + b) in its
        # backward) join the region as per-row-block partial outputs: "auto" = gpu/tpu only
        # (cpu: no measurement shows it faster there), "on", "off"
        column_reductions: typing.Literal["auto", "on", "off"] = "auto"

    def run(self, module, ctx):
        mode = self.options.column_reductions
        cols = mode == "on" or (mode == "auto" and not ctx.target.is_cpu)
        conv_dots = [d for block in program_blocks(module) for d in take_conv1x1_dots(block)]
        left = LeftToXla(self.name)
        counts = fuse_anchored(module, ctx, kind=KIND, anchor_name="stablehlo.dot_general",
                               check_anchor=dot_anchor, left=left, what="dot_general(s)",
                               grow=lambda graph, anchor, tried: grow(graph, anchor, ctx.target, conv_dots,
                                                                      cols))
        left.flush(ctx)
        return counts
