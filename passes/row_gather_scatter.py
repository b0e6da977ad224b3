"""``row-gather-scatter``: one-element-per-row gathers and scatters as row-view ops.

Cross-entropy over integer labels (``take_along_axis(log_softmax(z), y[:, None], -1)``, optax's
``softmax_cross_entropy_with_integer_labels``) is written with a ``gather`` that picks one
element per row of the logits, and its gradient with a ``scatter``-add of one element per row
into zeros. Neither is a row-view op, so ``fuse-reduction`` cuts the loss into pieces around
them and the (rows, vocab) log-probabilities and the scattered one-hot stay in memory. This pass
rewrites them, exactly, into ops on whole rows, after which the forward (logsumexp, once) and
the backward ((softmax - onehot)·g) form one row region:

* **gather** ``x[r, idx[r]]`` (operand ``(R..., V)``, collapsed last dim, leading dims batching,
  one index per row, slice size 1) -> ``sum_j select(j == clamp(idx[r], 0, V-1), x[r, j], -0.0)``
  with init ``-0.0``: a last-dim row reduction. Exact: every added term but one is ``-0.0``
  (``v + -0.0 == v`` for every float ``v``, NaN and signed zeros included), and the clamp is
  gather's own index clamping. Only when the operand is computed by an elementwise op (else it
  exists in memory anyway, and reading one element per row beats a masked pass over the row;
  optax's loss gathers from the logits themselves) and sits in a row computation (it feeds, or
  is computed from, a reduction over the last dim of the same rows within a few elementwise
  hops) that a row kernel takes on the target (``max_tiled_row_elems``: rows longer than a gpu
  row block's 16k elements are walked in column tiles, ``kernels/row_tiled.py``), so that the
  masked sum joins a row region that reads those rows anyway and the (rows, vocab) log-probabilities are never written.
* **scatter**-add into ``x`` (same dimension numbers, update combiner ``add``, one index per
  row) -> ``select(j == idx[r], x + broadcast(upd), x)``. Exact: each element receives at most
  one update (one index per row), combined with the same ``add``; out-of-range indices match
  no column, as scatter skips them.
* **degenerate reduce** (every reduced dim has size 1) with a single binary reducer and a
  scalar init -> ``reducer(reshape(x), init)``, or ``reshape(x)`` when the init is the
  reducer's exact identity (``-0.0`` for add, ``true`` for and, ...): an elementwise op, so it no longer splits a row
  region (log-softmax's backward sums a ``(rows, 1)`` value over its size-1 dim). Exact: a
  reduction of one element is the reducer applied once to it and the init. Boolean ones (the
  label bounds mask) are kept: as i1 logic inside a row kernel Mosaic cannot lane-broadcast
  them; kept outside they enter the kernel as an int32 row input.

Not rewritten: gathers of several elements per row, windows, ``offset_dims``, index vectors
that address more than the last dim, and scatters with another combiner (the statistics count
each refused candidate by reason, ``refused[<reason>]``).

On cpu the pass is off by default (``on_cpu=false``; see :data:`CPU_NOTE` for the measurement).

Preconditions: calls inlined. Runs before the fusion passes. Invariant: bit-exact results, the
module verifies, rerunning changes nothing (the rewritten ops are no longer candidates).
"""

from __future__ import annotations

import dataclasses

import numpy as np

from jaxlib.mlir import ir
from jaxlib.mlir.dialects import stablehlo

from hlofuse.core import ir as hir
from hlofuse.core.ops import OpClass, rule_for
from hlofuse.core.pipeline import Pass
from hlofuse.core.report import Refusals
from hlofuse.passes import graph_util as gu
from hlofuse.passes.fusion.outline import program_blocks
from hlofuse.kernels.tiling import max_tiled_row_elems

# Why the pass is off on cpu by default (row-gather-scatter{on_cpu=true} turns it on): XLA:CPU
# runs the row "kernel" (interpret mode: plain StableHLO) as its own loop fusions and library
# reductions, which materialize the masked select the gather became; measured interleaved on a
# shared 2-core machine (python -m bench.train_rest, 512x32768 cross-entropy fwd+bwd) the
# rewritten step took 1.09x the time of the unrewritten one (p25 1.00; against jax.jit the two
# were within noise of each other), and XLA's temp bytes barely moved (69.3 -> 69.2 MB; hlofuse
# without the pass already holds 69 MB where jax.jit holds 134). On gpu/tpu the row kernel keeps
# the rows on chip (modeled 240 -> 16 MiB at 512x8192 bf16 on gpu): on by default there.
CPU_NOTE = "off on cpu by default (measured slower there; row-gather-scatter{on_cpu=true})"

# how far (ops visited through elementwise/broadcast/reshape) to look for the row reduction that
# makes a rewritten gather free (it joins that reduction's region)
NEAR_ROW_REDUCTION = 48

_BINARY_REDUCERS = {"stablehlo.add", "stablehlo.multiply", "stablehlo.maximum", "stablehlo.minimum",
                    "stablehlo.and", "stablehlo.or"}


def _dims(x) -> list[int]:
    return [int(d) for d in x]


def _is_float(v) -> bool:
    i = gu.info(v)
    return i is not None and i.dtype.startswith(("f", "bf"))


def _index_ok(idx, rows: list[int]) -> str | None:
    """Indices must be (R..., 1, 1) signed integers: one index per row, the index vector last."""
    i = gu.info(idx)
    if i is None:
        return "dynamic shape"
    if not i.dtype.startswith("i"):
        return f"index dtype {i.dtype}"
    if list(i.shape) != rows + [1, 1]:
        return "not one index per row"
    return None


def gather_match(op) -> str | None:
    """None when ``op`` gathers one element per row along the last dim, else why not."""
    x = gu.info(op.operands[0])
    if x is None or len(x.shape) < 2:
        return "operand is not a batch of rows"
    r = len(x.shape)
    dn = stablehlo.GatherDimensionNumbers(op.attributes["dimension_numbers"])
    rows = list(x.shape[:-1])
    if (_dims(dn.offset_dims) or _dims(dn.collapsed_slice_dims) != [r - 1]
            or _dims(dn.operand_batching_dims) != list(range(r - 1))
            or _dims(dn.start_indices_batching_dims) != list(range(r - 1))
            or _dims(dn.start_index_map) != [r - 1] or int(dn.index_vector_dim) != r):
        return "not a per-row gather along the last dim"
    if gu.i64_array(op, "slice_sizes") != [1] * r:
        return "slice larger than one element"
    why = _index_ok(op.operands[1], rows)
    if why:
        return why
    if list(gu.info(op.results[0]).shape) != rows + [1]:
        return "unexpected result shape"
    return None


def scatter_match(op) -> str | None:
    """None when ``op`` scatter-adds one element per row along the last dim, else why not."""
    if len(op.operands) != 3 or len(op.results) != 1:
        return "variadic scatter"
    x = gu.info(op.operands[0])
    if x is None or len(x.shape) < 2:
        return "operand is not a batch of rows"
    r = len(x.shape)
    rows = list(x.shape[:-1])
    dn = stablehlo.ScatterDimensionNumbers(op.attributes["scatter_dimension_numbers"])
    if (_dims(dn.update_window_dims) or _dims(dn.inserted_window_dims) != [r - 1]
            or _dims(dn.input_batching_dims) != list(range(r - 1))
            or _dims(dn.scatter_indices_batching_dims) != list(range(r - 1))
            or _dims(dn.scattered_dims_to_operand_dims) != [r - 1] or int(dn.index_vector_dim) != r):
        return "not a per-row scatter along the last dim"
    why = _index_ok(op.operands[1], rows)
    if why:
        return why
    if list(gu.info(op.operands[2]).shape) != rows + [1]:
        return "unexpected update shape"
    blk = op.regions[0].blocks[0]
    body = [o.operation for o in blk.operations]
    a, b = blk.arguments[0], blk.arguments[1]
    if (len(body) != 2 or body[0].name != "stablehlo.add" or list(body[0].operands) not in ([a, b], [b, a])
            or list(body[1].operands) != [body[0].results[0]]):
        return "update combiner is not add"
    return None


def degenerate_reduce(op) -> str | None:
    """None when ``op`` reduces only size-1 dims with one binary reducer and a scalar init."""
    if op.name != "stablehlo.reduce" or len(op.operands) != 2 or len(op.results) != 1:
        return "variadic reduce"
    x = gu.info(op.operands[0])
    if x is None:
        return "dynamic shape"
    dims = gu.i64_array(op, "dimensions")
    if not dims or any(x.shape[d] != 1 for d in dims):
        return "reduces a dim longer than 1"
    if x.dtype == "i1":
        # take_along_axis's bounds mask: pulled into a row kernel as i1 logic, Mosaic cannot
        # lane-broadcast it (TPU v5e/v6e); left as a tiny reduce, it enters as an int32 row input
        return "boolean"
    blk = op.regions[0].blocks[0]
    body = [o.operation for o in blk.operations]
    a, b = blk.arguments[0], blk.arguments[1]
    if (len(body) != 2 or body[0].name not in _BINARY_REDUCERS or list(body[0].operands) not in ([a, b], [b, a])
            or list(body[1].operands) != [body[0].results[0]]):
        return "reducer is not one binary op"
    return None


def near_row_reduction(v, last: int, rows: list[int]) -> bool:
    """Does ``v`` (shape rows + [last]) feed, or come from, a reduction over the last dim of
    the same rows, within :data:`NEAR_ROW_REDUCTION` elementwise/broadcast/reshape hops?"""
    domain = rows + [last]
    seen: set = set()
    todo = [v]
    while todo and len(seen) < NEAR_ROW_REDUCTION:
        w = todo.pop()
        ops = [u for u in hir.users(w)]
        d = hir.defining_op(w)
        if d is not None:
            ops.append(d)
        for op in ops:
            k = gu.op_key(op)
            if k in seen:
                continue
            seen.add(k)
            if op.name == "stablehlo.reduce":
                xi = gu.info(op.operands[0])
                if (xi is not None and list(xi.shape) == domain
                        and gu.i64_array(op, "dimensions") == [len(domain) - 1]):
                    return True
                continue
            cls = rule_for(op.name).cls
            if cls not in (OpClass.ELEMENTWISE, OpClass.BROADCAST) and op.name != "stablehlo.reshape":
                continue
            todo.extend(op.operands)
            todo.extend(op.results)
    return False


# ---------------------------------------------------------------------------------------------
# Building the row-view replacements
# ---------------------------------------------------------------------------------------------

def _splat(value, like_type, shape, *, before) -> ir.Value:
    """A splat constant of ``like_type``'s element type and ``shape``."""
    return gu.make_splat(value, ir.RankedTensorType(like_type).element_type, shape, before=before)


def _column_match(idx, domain: list[int], *, clamp: bool, before) -> ir.Value:
    """``j == idx[r]`` over ``domain`` (a bool tensor), from indices of shape (R..., 1, 1)."""
    r = len(domain)
    it = ir.RankedTensorType(idx.type).element_type
    idx_row = gu.create("stablehlo.reshape", [idx], [gu.tensor_type(domain[:-1] + [1], it)],
                        before=before).results[0]
    # the column iota and the clamp bound V-1 are built in the index type: widen narrow
    # indices first (in i8, iota 0..199 and the bound 199 wrapped; the value is kept)
    width = max(ir.IntegerType(it).width, 32 if domain[-1] - 1 < 2 ** 31 else 64)
    if width != ir.IntegerType(it).width:
        it = ir.IntegerType.get_signless(width)
        idx_row = gu.create("stablehlo.convert", [idx_row],
                            [gu.tensor_type(domain[:-1] + [1], it)], before=before).results[0]
    if clamp:
        lo = _splat(0, idx_row.type, [], before=before)
        hi = _splat(domain[-1] - 1, idx_row.type, [], before=before)
        idx_row = gu.create("stablehlo.clamp", [lo, idx_row, hi], [idx_row.type], before=before).results[0]
    full = gu.tensor_type(domain, it)
    idx_b = gu.make_broadcast(idx_row, list(range(r)), full, before=before)
    iota = gu.create("stablehlo.iota", [], [gu.tensor_type([domain[-1]], it)],
                     {"iota_dimension": ir.IntegerAttr.get(ir.IntegerType.get_signless(64), 0)},
                     before=before).results[0]
    iota_b = gu.make_broadcast(iota, [r - 1], full, before=before)
    bool_t = gu.tensor_type(domain, ir.IntegerType.get_signless(1))
    return gu.create("stablehlo.compare", [iota_b, idx_b], [bool_t],
                     {"comparison_direction": ir.Attribute.parse("#stablehlo<comparison_direction EQ>"),
                      "compare_type": ir.Attribute.parse("#stablehlo<comparison_type SIGNED>")},
                     before=before).results[0]


def rewrite_gather(op) -> ir.Value:
    x, idx = op.operands[0], op.operands[1]
    domain = list(gu.info(x).shape)
    eq = _column_match(idx, domain, clamp=True, before=op)
    fill = -0.0 if _is_float(x) else 0
    fill_full = _splat(fill, x.type, domain, before=op)
    sel = gu.create("stablehlo.select", [eq, x, fill_full], [x.type], before=op).results[0]
    init = _splat(fill, x.type, [], before=op)
    red = gu.make_add_reduce(sel, init, [len(domain) - 1], gu.tensor_type(domain[:-1], gu.element_type(x)), before=op)
    return gu.create("stablehlo.reshape", [red], [op.results[0].type], before=op).results[0]


def rewrite_scatter(op) -> ir.Value:
    x, idx, upd = op.operands[0], op.operands[1], op.operands[2]
    domain = list(gu.info(x).shape)
    eq = _column_match(idx, domain, clamp=False, before=op)
    upd_b = gu.make_broadcast(upd, list(range(len(domain))), x.type, before=op)
    added = gu.create("stablehlo.add", [x, upd_b], [x.type], before=op).results[0]
    return gu.create("stablehlo.select", [eq, added, x], [x.type], before=op).results[0]


def _exact_identity(reducer: str, init) -> bool:
    """Is ``init`` a value the reducer leaves every element unchanged with, bit for bit
    (``x + -0.0``, ``x * 1``, ``max(x, -inf)``, ``x & ~0``, ...; not ``x + 0.0``: -0.0)?"""
    v = gu.splat_value(init)
    if v is None:
        return False
    a = np.asarray(v)
    if a.dtype.kind == "c":
        return False
    if a.dtype == np.bool_:
        return bool(a) == (reducer == "stablehlo.and") and reducer in ("stablehlo.and", "stablehlo.or")
    if reducer == "stablehlo.add":
        return bool(a == 0) and (a.dtype.kind in "iu" or bool(np.signbit(a.astype(np.float64))))
    if reducer == "stablehlo.multiply":
        return bool(a == 1)
    if a.dtype.kind in "iu":
        info = np.iinfo(a.dtype)
        return bool(a == {"stablehlo.maximum": info.min, "stablehlo.minimum": info.max}.get(reducer, None))
    if reducer in ("stablehlo.maximum", "stablehlo.minimum"):
        return bool(a == (-np.inf if reducer == "stablehlo.maximum" else np.inf))
    return False


def rewrite_degenerate(op) -> ir.Value:
    x, init = op.operands[0], op.operands[1]
    reducer = [o.operation for o in op.regions[0].blocks[0].operations][0].name
    out_t = op.results[0].type
    shape = list(gu.info(op.results[0]).shape)
    y = gu.create("stablehlo.reshape", [x], [out_t], before=op).results[0]
    if _exact_identity(reducer, init):
        return y   # one element reduced with the identity: the element itself
    init_b = gu.make_broadcast(init, [], out_t, before=op) if shape else init
    return gu.create(reducer, [y, init_b], [out_t], before=op).results[0]


class RowGatherScatter(Pass):
    name = "row-gather-scatter"

    @dataclasses.dataclass(frozen=True)
    class Options:
        gather: bool = True       # rewrite per-row gathers next to a row reduction (masked row sum)
        scatter: bool = True      # rewrite per-row scatter-adds (select over the row)
        degenerate: bool = True   # rewrite reductions over size-1 dims (elementwise)
        on_cpu: bool = False      # also on cpu (off by default: not faster there, see CPU_NOTE)

    def run(self, module, ctx):
        if ctx.target.is_cpu and not self.options.on_cpu:
            if any(op.name in ("stablehlo.gather", "stablehlo.scatter")
                   for block in program_blocks(module) for op in hir.block_ops(block)):
                ctx.report.note(f"{self.name}: {CPU_NOTE}")
            return {"gather": 0, "scatter": 0, "degenerate_reduce": 0, "off_on_cpu": 1}
        with module.context, ir.Location.unknown():
            return self._run(module, ctx)

    def _run(self, module, ctx):
        gu.reset_tracking()
        refused = Refusals(self.name, "not rewritten")
        counts = {"gather": 0, "scatter": 0, "degenerate_reduce": 0}
        for block in program_blocks(module):
            for op in hir.block_ops(block):
                if not gu.alive(op):
                    continue
                new = None
                if op.name == "stablehlo.gather" and self.options.gather:
                    why = gather_match(op)
                    if why is None:
                        x = gu.info(op.operands[0])
                        d = hir.defining_op(op.operands[0])
                        if d is None or rule_for(d.name).cls is not OpClass.ELEMENTWISE:
                            why = ("operand is materialized anyway (one element per row is cheaper "
                                   "than a masked row sum)")
                        elif x.shape[-1] > max_tiled_row_elems(ctx.target):
                            why = (f"row of {x.shape[-1]} elements exceeds the on-chip row limit for "
                                   f"{ctx.target} (no row kernel would read it)")
                        elif not near_row_reduction(op.operands[0], x.shape[-1], list(x.shape[:-1])):
                            why = "no row reduction over the gathered rows (a masked row sum would cost a full read)"
                    if why is None:
                        new, key = rewrite_gather(op), "gather"
                    else:
                        refused.add("per-row gather candidate(s)", why, hir.op_location(op))
                elif op.name == "stablehlo.scatter" and self.options.scatter:
                    why = scatter_match(op)
                    if why is None:
                        new, key = rewrite_scatter(op), "scatter"
                    else:
                        refused.add("per-row scatter candidate(s)", why, hir.op_location(op))
                elif op.name == "stablehlo.reduce" and self.options.degenerate:
                    if degenerate_reduce(op) is None:
                        new, key = rewrite_degenerate(op), "degenerate_reduce"
                if new is not None:
                    gu.replace_op(op, [new])
                    counts[key] += 1
        if any(counts.values()):
            # the replaced gathers/scatters/reduces hold regions, which graph_util leaves to the
            # upstream canonicalizer; cse merges the iotas and splats the rewrites built
            # (as the cse pass: large recomputable ops stay unmerged on tpu)
            gu.cse(module, ctx.target.kind, pipeline="canonicalize,cse")
        refused.flush(ctx)
        return {**counts, **refused.stats()}
