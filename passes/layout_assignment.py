"""``layout-assignment``: per-target preferred layouts, with transposes pushed to the boundary.

Rewrites, in order:

1. **Convolutions to the target's preferred layout.** On gpu and tpu (table
   :data:`PREFERRED_CONV_LAYOUT`; pass option ``conv_layout``: ``'channels_last'`` forces it, ``'keep'`` keeps the program's)
   every convolution not already in ``[b, 0, 1, f]x[0, 1, i, o]->[b, 0, 1, f]`` (NHWC/HWIO)
   gets its dimension numbers rewritten to it: the input is transposed (reusing an existing
   transpose of the same value), a constant kernel is transposed on the host, and one
   transpose after the convolution restores the original result layout for its users.
   On cpu (preference ``'from_channels_first'``) only channels-first convolutions (input and
   output ``[b, f, spatial...]``, as NCHW programs write them) move: a 1x1, stride-1,
   unpadded, ungrouped one becomes a *channel dot* ``dot_general(w[O, I], x)`` that reads
   and writes the NCHW activation as it lies (result ``[O, b, spatial...]``, a bitcast of
   the output for batch 1), any other goes NHWC as above. XLA:CPU itself runs every NCHW
   convolution in NHWC, but then transposes the program's output back, and that transpose
   fuses the whole residual chain of the last block in a strided loop (measured: +7 ms on the
   ResNet-50 conv2_x stage, 18.6 -> 26 ms CPU time); with channel dots the activations stay
   NCHW between the 3x3 convolutions and no activation is copied.
2. **Transpose sinking.** A transpose feeding an elementwise op moves below it when every other
   operand is free to re-layout (a rank-0 value, a splat or small constant, a
   ``broadcast_in_dim``) or already has the inverse transpose, and at least as many transposes
   die as are created. A transpose feeding a ``reduce`` is folded into its dimensions (plus a
   transpose of the reduced result when its order changes).
3. **Cancellation.** ``transpose(transpose(x))`` composes, and becomes ``x`` when it is the
   identity; so the restore-transpose of one NCHW convolution meets the input transpose of the
   next one and both disappear: only the boundary transposes remain.
4. **Transposes folded into ``dot_general``** dimension numbers when the order of the free
   dimensions (hence the result layout) does not change. (A transpose stuck before the return
   is not absorbed by swapping a dot's operands: tried, it never fired on the ResNet stages and
   made the zoo's Equinox MLPs slower, 0.77 -> 0.82 of jax.jit in f32, 0.95 -> 1.06 in bf16.)

Steps 2-4 run on every target (they never increase the number of transposes); step 1 only
where preferred.
Statistics (also ``conv1x1_to_channel_dot``): transposes and copies (transposes that are not bitcasts) before/after, plus a
report note. TPU: convolutions whose channel count is not a multiple of 128 (the lane width)
are counted in ``tpu_lane_unaligned``. Refusals are counted by reason (``refused[<reason>]``):
each transpose left with a user it could not move through (other users keep it alive, another
operand would need a new transpose, a non-elementwise user, ...), and each convolution not in
channels-last layout that is kept (the target prefers none, or ``conv_layout='keep'``).
Not done: transposes into Pallas kernel index maps.
Preconditions: calls inlined. Invariant: the same arithmetic on the same values (only data
movement changes), so results are bit-exact except that a backend may pick another convolution,
dot (a channel dot) or reduction algorithm for the new layout
(summation order: ``kernel``/``reassociate`` tolerance; the tests use integer-valued data and
are exact); the module
verifies; rerunning the pass changes nothing.
"""

from __future__ import annotations

import dataclasses
from typing import Literal

import numpy as np

from jaxlib.mlir import ir
from jaxlib.mlir.dialects import stablehlo as shlo

from hlofuse.core import ir as hir
from hlofuse.core.ops import OpClass, rule_for
from hlofuse.core.pipeline import Pass
from hlofuse.core.report import Refusals
from hlofuse.passes import graph_util as gu
from hlofuse.passes.fusion.outline import program_blocks
from hlofuse.passes.op_forms import conv1x1_as_dot_reason

PREFERRED_CONV_LAYOUT = {"cpu": "from_channels_first", "gpu": "channels_last", "tpu": "channels_last"}
SMALL_CONST_BYTES = 1 << 20
MAX_STEPS = 100_000
T_OP = "stablehlo.transpose"


def inverse(perm) -> list[int]:
    inv = [0] * len(perm)
    for i, p in enumerate(perm):
        inv[p] = i
    return inv


def is_identity(perm) -> bool:
    return list(perm) == list(range(len(perm)))


def perm_of(op) -> list[int]:
    return gu.i64_array(op, "permutation")


def is_bitcast_transpose(op) -> bool:
    """A transpose that only moves size-1 dims is a free relabeling, not a copy."""
    shape = gu.info(op.operands[0]).shape
    moved = [p for p in perm_of(op) if shape[p] != 1]
    return moved == sorted(moved)


def count_transposes(module) -> tuple[int, int]:
    ts = [op for op in hir.all_ops(module) if op.name == T_OP]
    return len(ts), sum(1 for t in ts if gu.info(t.operands[0]) and not is_bitcast_transpose(t))



def _block_of(v: ir.Value):
    op = hir.defining_op(v)
    return v.owner if op is None else op.block


class _Layout:
    def __init__(self):
        self.worklist: list = []
        self.stats = {"convs_to_channels_last": 0, "sunk_elementwise": 0, "sunk_reduce": 0,
                      "folded_into_dot": 0, "cancelled": 0,
                      "conv1x1_to_channel_dot": 0}
        self.why: dict = {}  # transpose key -> (transpose, why its last attempted move failed)

    def refuse(self, t, why: str) -> bool:
        self.why[gu.op_key(t)] = (t, why)
        return False

    def refusals(self, refused: Refusals) -> None:
        """Add each transpose still alive with the reason its last move failed."""
        for t, why in self.why.values():
            if gu.alive(t) and t.name == T_OP:
                refused.add("transpose", why, hir.op_location(t))

    # -- transposes of a value, reused when one exists ---------------------------------------
    def transpose_of(self, v: ir.Value, perm, anchor) -> ir.Value:
        """``transpose(v, perm)`` usable at ``anchor``: folded for constants, else an existing
        transpose of ``v`` (hoisted next to ``v``) or a new one placed right after ``v``."""
        if is_identity(perm):
            return v
        arr = gu.constant_array(v)
        if arr is not None and gu.info(v).nbytes <= SMALL_CONST_BYTES * 64:
            shape = [gu.info(v).shape[p] for p in perm]
            return gu.make_constant(np.transpose(arr, perm),
                                    gu.tensor_type(shape, gu.element_type(v)), before=anchor)
        existing = self.find_transpose(v, perm, anchor)
        if existing is not None:
            return existing
        where = gu.after_def(v) if _block_of(v) == anchor.block else {"before": anchor}
        t = gu.make_transpose(v, perm, **where)
        self.worklist.append(hir.defining_op(t))
        return t

    def find_transpose(self, v: ir.Value, perm, anchor) -> ir.Value | None:
        for u in hir.users(v):
            if u.name != T_OP or perm_of(u) != list(perm) or u.block != anchor.block:
                continue
            if u.is_before_in_block(anchor):
                return u.results[0]
            if _block_of(v) == anchor.block:  # hoist it next to v: it only needs v
                d = hir.defining_op(v)
                if d is None:
                    first = hir.as_op(list(anchor.block.operations)[0])
                    if first != u:
                        u.move_before(first)
                else:
                    u.move_after(d)
                return u.results[0]
        return None

    # -- 1. convolutions ---------------------------------------------------------------------
    @staticmethod
    def is_channels_last(op) -> bool:
        dn = shlo.ConvDimensionNumbers(op.attributes["dimension_numbers"])
        return is_identity([dn.input_batch_dimension, *dn.input_spatial_dimensions,
                            dn.input_feature_dimension]) and \
            is_identity([*dn.kernel_spatial_dimensions, dn.kernel_input_feature_dimension,
                         dn.kernel_output_feature_dimension]) and \
            is_identity([dn.output_batch_dimension, *dn.output_spatial_dimensions,
                         dn.output_feature_dimension])

    def convert_conv(self, op) -> bool:
        dn = shlo.ConvDimensionNumbers(op.attributes["dimension_numbers"])
        out = gu.info(op.results[0])
        if out is None or gu.info(op.operands[0]) is None or gu.info(op.operands[1]) is None:
            return False
        n = len(out.shape)
        sp = list(range(1, n - 1))
        perm_in = [dn.input_batch_dimension, *dn.input_spatial_dimensions, dn.input_feature_dimension]
        perm_k = [*dn.kernel_spatial_dimensions, dn.kernel_input_feature_dimension,
                  dn.kernel_output_feature_dimension]
        out_layout = [dn.output_batch_dimension, *dn.output_spatial_dimensions, dn.output_feature_dimension]
        if is_identity(perm_in) and is_identity(perm_k) and is_identity(out_layout):
            return False
        x, w = op.operands[0], op.operands[1]
        op.operands[0] = self.transpose_of(x, perm_in, op)
        op.operands[1] = self.transpose_of(w, perm_k, op)
        op.attributes["dimension_numbers"] = shlo.ConvDimensionNumbers.get(
            input_batch_dimension=0, input_feature_dimension=n - 1, input_spatial_dimensions=sp,
            kernel_input_feature_dimension=n - 2, kernel_output_feature_dimension=n - 1,
            kernel_spatial_dimensions=list(range(n - 2)), output_batch_dimension=0,
            output_feature_dimension=n - 1, output_spatial_dimensions=sp)
        for old in (x, w):
            d = hir.defining_op(old)
            if d is not None:
                gu.erase_if_dead([d])
        if not is_identity(out_layout):
            self.retype_and_restore(op, [out.shape[d] for d in out_layout], inverse(out_layout))
        self.stats["convs_to_channels_last"] += 1
        return True

    @staticmethod
    def is_channels_first(op) -> bool:
        """Input and output ``[b, f, spatial...]`` (NCHW-like; any kernel layout)."""
        dn = shlo.ConvDimensionNumbers(op.attributes["dimension_numbers"])
        n = len(gu.info(op.results[0]).shape)
        return ([dn.input_batch_dimension, dn.input_feature_dimension, *dn.input_spatial_dimensions]
                == list(range(n)) == [dn.output_batch_dimension, dn.output_feature_dimension,
                                      *dn.output_spatial_dimensions])

    def conv1x1_to_channel_dot(self, op) -> bool:
        """A 1x1, stride-1, unpadded, ungrouped convolution in any layout as
        ``dot_general(w[O, I], x)`` contracting x's feature dim: the result
        ``[O, x's other dims in order]`` is the output layout up to one transpose, which moves
        only the size-1 batch dim of an NCHW batch-1 program (a bitcast) and else sinks and
        folds into the neighbouring dots like any other."""
        x, w = op.operands[0], op.operands[1]
        xi, wi, out = gu.info(x), gu.info(w), gu.info(op.results[0])
        if xi is None or wi is None or out is None or conv1x1_as_dot_reason(op, any_layout=True):
            return False
        dn = shlo.ConvDimensionNumbers(op.attributes["dimension_numbers"])
        n = len(out.shape)
        ko, ki = dn.kernel_output_feature_dimension, dn.kernel_input_feature_dimension
        w_perm = [ko, ki, *dn.kernel_spatial_dimensions]
        w_oi = self.transpose_of(w, w_perm, op)
        et = gu.element_type(w)
        w2 = gu.create("stablehlo.reshape", [w_oi], [gu.tensor_type([wi.shape[ko], wi.shape[ki]], et)],
                       before=op).results[0]
        fi = dn.input_feature_dimension
        x_free = [d for d in range(n) if d != fi]
        attrs = {"dot_dimension_numbers": shlo.DotDimensionNumbers.get(
            lhs_batching_dimensions=[], rhs_batching_dimensions=[],
            lhs_contracting_dimensions=[1], rhs_contracting_dimensions=[fi])}
        if "precision_config" in op.attributes:
            attrs["precision_config"] = op.attributes["precision_config"]
        shape = [wi.shape[ko]] + [xi.shape[d] for d in x_free]
        dot = gu.create("stablehlo.dot_general", [w2, x], [gu.tensor_type(shape, gu.element_type(op.results[0]))],
                        attrs, before=op)
        # result dim j of the dot: 0 = output feature, 1.. = x's dims x_free[j-1] in order
        x_dim_to_out = {dn.input_batch_dimension: dn.output_batch_dimension}
        for a, b in zip(dn.input_spatial_dimensions, dn.output_spatial_dimensions):
            x_dim_to_out[a] = b
        dot_dims_in_out = [dn.output_feature_dimension] + [x_dim_to_out[d] for d in x_free]
        restore = inverse(dot_dims_in_out)  # out[k] = dot[restore[k]]
        new = dot.results[0] if is_identity(restore) else self.transpose_of(dot.results[0], restore, op)
        op.results[0].replace_all_uses_with(new)
        gu.erase_if_dead([op])
        for old in (w,):
            d = hir.defining_op(old)
            if d is not None:
                gu.erase_if_dead([d])
        self.stats["conv1x1_to_channel_dot"] += 1
        return True

    def retype_and_restore(self, op, new_shape, restore_perm) -> None:
        """Give ``op``'s results ``new_shape`` and put ``transpose(result, restore_perm)``
        in front of every old user."""
        for r in op.results:
            r.set_type(gu.tensor_type(new_shape, gu.element_type(r)))
        last = op
        for r in op.results:
            if not any(True for _ in r.uses):
                continue
            t = gu.make_transpose(r, restore_perm, after=last)
            last = hir.defining_op(t)
            r.replace_all_uses_except(t, last)
            self.worklist.append(last)

    # -- 2. sinking ----------------------------------------------------------------------------
    def try_sink_elementwise(self, e, t) -> bool:
        if len(e.results) != 1 or len(e.regions) or rule_for(e.name).cls is not OpClass.ELEMENTWISE:
            return False
        p = perm_of(t)
        pinv = inverse(p)
        post = gu.info(e.results[0])
        pre_shape = list(gu.info(t.operands[0]).shape)
        if post is None or list(post.shape) != [pre_shape[i] for i in p]:
            return self.refuse(t, "elementwise user changes the shape")
        plan, dying, cost = [], set(), 1
        for o in e.operands:
            d = hir.defining_op(o)
            oi = gu.info(o)
            if oi is None:
                return False
            if d is not None and d.name == T_OP and perm_of(d) == p:
                plan.append(("use", d.operands[0]))
                if all(u == e for u in hir.users(o)):
                    dying.add(d)
            elif len(oi.shape) == 0:
                plan.append(("keep", o))
            elif gu.is_splat_const(o):
                plan.append(("const", gu.constant_array(o).reshape(-1)[:1]))
            elif d is not None and d.name == "stablehlo.broadcast_in_dim":
                dims = [p[k] for k in gu.i64_array(d, "broadcast_dimensions")]
                src = d.operands[0]
                keep = [k for k, n in enumerate(gu.info(src).shape) if n != 1]
                if dims == sorted(dims):
                    plan.append(("bcast", src, dims))
                elif [dims[k] for k in keep] == sorted(dims[k] for k in keep):
                    # unit dims out of order ([1, C, 1, 1] per-channel BatchNorm parameters of
                    # an NCHW program): a reshape drops them, the rest keeps its order
                    plan.append(("bcast_squeezed", src, [dims[k] for k in keep]))
                elif gu.constant_array(src) is not None:
                    order = list(np.argsort(dims))
                    plan.append(("bcast_const", np.transpose(gu.constant_array(src), order),
                                 sorted(dims), gu.element_type(src)))
                else:
                    plan.append(("other", o))
            elif d is not None and d.name == "stablehlo.constant" and oi.nbytes <= SMALL_CONST_BYTES:
                plan.append(("const", np.transpose(gu.constant_array(o), pinv)))
            else:
                plan.append(("other", o))
        # an "other" operand costs a new transpose unless one survives to be reused; a dying
        # one does not (when p is its own inverse, `t` itself would otherwise look reusable and
        # lt(x, T(x)) flipped to T(lt(T(x), x)) and back on every run: fuzz-found)
        cost += sum(1 for step in plan if step[0] == "other"
                    and not self._has_transpose(step[1], pinv, e, exclude=dying))
        if len(dying) < cost:
            if t not in dying:
                return self.refuse(t, "transpose has other users")
            return self.refuse(t, "another operand of its elementwise user would need a new transpose")
        old_producers = [hir.defining_op(o) for o in e.operands]
        for i, step in enumerate(plan):
            kind = step[0]
            et = gu.element_type(e.operands[i])
            if kind == "use" or kind == "keep":
                new = step[1]
            elif kind == "const":
                new = gu.make_constant(step[1], gu.tensor_type(pre_shape, et), before=e)
            elif kind == "bcast":
                new = gu.make_broadcast(step[1], step[2], gu.tensor_type(pre_shape, et), before=e)
            elif kind == "bcast_squeezed":
                src, dims = step[1], step[2]
                sq = gu.create("stablehlo.reshape", [src], [gu.tensor_type(
                    [n for n in gu.info(src).shape if n != 1], gu.element_type(src))],
                    before=e).results[0]
                new = gu.make_broadcast(sq, dims, gu.tensor_type(pre_shape, et), before=e)
            elif kind == "bcast_const":
                arr, dims, sel = step[1], step[2], step[3]
                c = gu.make_constant(arr, gu.tensor_type(arr.shape, sel), before=e)
                new = gu.make_broadcast(c, dims, gu.tensor_type(pre_shape, et), before=e)
            else:
                new = self.transpose_of(step[1], pinv, e)
            e.operands[i] = new
        self.retype_and_restore(e, pre_shape, p)
        gu.erase_if_dead([d for d in old_producers if d is not None])
        self.stats["sunk_elementwise"] += 1
        return True

    def _has_transpose(self, v, perm, anchor, exclude=()) -> bool:
        return any(u.name == T_OP and perm_of(u) == list(perm) and u.block == anchor.block
                   and u not in exclude
                   and (u.is_before_in_block(anchor) or _block_of(v) == anchor.block)
                   for u in hir.users(v))

    def try_sink_reduce(self, r, t) -> bool:
        n = len(r.results)
        ins = list(r.operands)[:n]
        p = perm_of(t)
        if any(hir.defining_op(v) is None or hir.defining_op(v).name != T_OP
               or perm_of(hir.defining_op(v)) != p for v in ins):
            return self.refuse(t, "reduce inputs are not transposed alike")
        ts = [hir.defining_op(v) for v in ins]
        dying = {x for x in ts if all(u == r for u in hir.users(x.results[0]))}
        dims = gu.i64_array(r, "dimensions")
        kept = [p[j] for j in range(len(p)) if j not in dims]
        order = sorted(kept)
        q = [order.index(s) for s in kept]
        if not dying:  # at least one transpose dies; at most one (smaller) is added
            return self.refuse(t, "transpose has other users")
        pre_shape = gu.info(ts[0].operands[0]).shape
        for i, x in enumerate(ts):
            r.operands[i] = x.operands[0]
        r.attributes["dimensions"] = ir.DenseI64ArrayAttr.get(sorted(p[d] for d in dims))
        new_shape = [pre_shape[s] for s in order]
        if is_identity(q):
            for res in r.results:
                res.set_type(gu.tensor_type(new_shape, gu.element_type(res)))
        else:
            self.retype_and_restore(r, new_shape, q)
        gu.erase_if_dead(ts)
        self.stats["sunk_reduce"] += 1
        return True

    # -- 4. dot_general ----------------------------------------------------------------------
    def try_fold_dot(self, dot, t) -> bool:
        dn = shlo.DotDimensionNumbers(dot.attributes["dot_dimension_numbers"])
        dims = {"lb": list(dn.lhs_batching_dimensions), "lc": list(dn.lhs_contracting_dimensions),
                "rb": list(dn.rhs_batching_dimensions), "rc": list(dn.rhs_contracting_dimensions)}
        done = False
        for side, (b, c) in ((0, ("lb", "lc")), (1, ("rb", "rc"))):
            if dot.operands[side] != t.results[0]:
                continue
            p = perm_of(t)
            free = [d for d in range(len(p)) if d not in dims[b] + dims[c]]
            mapped = [p[f] for f in free]
            if mapped != sorted(mapped):
                continue
            dims[b] = [p[d] for d in dims[b]]
            dims[c] = [p[d] for d in dims[c]]
            dot.operands[side] = t.operands[0]
            done = True
        if not done:
            return self.refuse(t, "folding it into dot_general would change the result layout")
        dot.attributes["dot_dimension_numbers"] = shlo.DotDimensionNumbers.get(
            lhs_batching_dimensions=dims["lb"], rhs_batching_dimensions=dims["rb"],
            lhs_contracting_dimensions=dims["lc"], rhs_contracting_dimensions=dims["rc"])
        gu.erase_if_dead([t])
        self.stats["folded_into_dot"] += 1
        return True

    # -- driver --------------------------------------------------------------------------------
    def visit(self, t) -> None:
        new = gu.compose_transpose(t)
        if new is not None:
            t.results[0].replace_all_uses_with(new)
            gu.erase_if_dead([t])
            self.stats["cancelled"] += 1
            d = hir.defining_op(new)
            if d is not None and d.name == T_OP:
                self.worklist.append(d)
            for u in hir.users(new):
                if u.name == T_OP:
                    self.worklist.append(u)
            return
        for u in hir.users(t.results[0]):
            if not gu.alive(t):
                return
            if u.block != t.block:
                continue
            if u.name == T_OP:
                self.worklist.append(u)  # composes with t when visited
            elif u.name == "stablehlo.reduce":
                self.try_sink_reduce(u, t)
            elif u.name == "stablehlo.dot_general":
                self.try_fold_dot(u, t)
            elif rule_for(u.name).cls is OpClass.ELEMENTWISE:
                self.try_sink_elementwise(u, t)
            elif u.name not in ("func.return", "stablehlo.return"):  # a boundary is no refusal
                self.refuse(t, f"used by {u.name}, which it cannot move through")


class LayoutAssignment(Pass):
    """See the module docstring."""
    name = "layout-assignment"

    @dataclasses.dataclass(frozen=True)
    class Options:
        # convolution layout: None = the target's preference (PREFERRED_CONV_LAYOUT)
        conv_layout: Literal["channels_last", "from_channels_first", "keep"] | None = None

    def run(self, module, ctx):
        prefer = self.options.conv_layout or PREFERRED_CONV_LAYOUT[ctx.target.kind]
        t_before, c_before = count_transposes(module)
        lay = _Layout()
        refused = Refusals(self.name, outcome="kept")
        unaligned = 0
        gu.reset_tracking()
        with module.context, ir.Location.unknown():
            blocks = program_blocks(module)
            for block in blocks:
                for op in hir.block_ops(block):
                    if not gu.alive(op) or op.name != "stablehlo.convolution":
                        continue
                    if prefer == "channels_last":
                        lay.convert_conv(op)
                    elif prefer == "from_channels_first" and lay.is_channels_first(op):
                        if not lay.conv1x1_to_channel_dot(op):
                            lay.convert_conv(op)
                    elif not lay.is_channels_last(op):
                        refused.add("convolution",
                                    "conv_layout='keep'" if prefer == "keep" else
                                    f"target {ctx.target.kind} has no preferred convolution layout",
                                    hir.op_location(op))
                    if ctx.target.is_tpu:
                        dn = shlo.ConvDimensionNumbers(op.attributes["dimension_numbers"])
                        if gu.info(op.results[0]).shape[dn.output_feature_dimension] % 128:
                            unaligned += 1
            lay.worklist.extend(op for b in blocks for op in hir.block_ops(b) if op.name == T_OP)
            steps = 0
            while lay.worklist and steps < MAX_STEPS:
                t = lay.worklist.pop(0)
                steps += 1
                if gu.alive(t) and t.name == T_OP:
                    lay.visit(t)
            gu.erase_dead_in(program_blocks(module))
            lay.refusals(refused)
        t_after, c_after = count_transposes(module)
        stats = {"transposes_before": t_before, "transposes_after": t_after,
                 "copies_before": c_before, "copies_after": c_after, **lay.stats, **refused.stats()}
        if ctx.target.is_tpu:
            stats["tpu_lane_unaligned"] = unaligned
        if t_before != t_after or lay.stats["convs_to_channels_last"] or lay.stats["conv1x1_to_channel_dot"]:
            dots = lay.stats["conv1x1_to_channel_dot"]
            ctx.report.note(f"layout-assignment ({ctx.target}): {lay.stats['convs_to_channels_last']} "
                            f"convolution(s) to channels-last"
                            + (f", {dots} channels-first 1x1 convolution(s) as channel dots" if dots else "")
                            + f"; transposes {t_before} -> {t_after}, copies {c_before} -> {c_after}")
        return stats
