"""``split-reduce``: on cpu, a reduction over dims that are not adjacent becomes a chain of
reductions over one run of adjacent dims each, the largest run first.

Why: GroupNorm. Flax, Haiku, Equinox and Keras reshape ``x[B, H, W, C]`` to ``[B, H, W, G,
C/G]`` and reduce dims ``(1, 2, 4)``: a run of ``H*W``, then, behind the kept ``G``, a run of
``C/G`` (2-16 elements in a diffusion UNet). XLA:CPU is slow at such reductions with its default
library (YNNPACK) fusions and with them off. One f32 sum, jax.jit, 2-core host, interleaved
medians of 80 rounds (default options | library fusions off), as written -> split:
``[4, 32, 32, 32, 2]`` 600 -> 111 us | 260 -> 117 us; ``[4, 16, 16, 32, 4]`` 182 -> 83 |
186 -> 67; ``[2, 32, 32, 8, 32]`` 111 -> 94 | 497 -> 90; ``[8, 64, 64, 32, 4]`` 4266 -> 1079 |
2149 -> 544; ``[1, 64, 64, 32, 10]`` 334 -> 131 | 617 -> 123. Where the innermost reduced run
is long or the innermost run is kept, splitting is not reliably faster (BatchNorm's ``(0, 2,
3)`` of NCHW ``[16, 256, 8, 8]``: 49 -> 54 | 83 -> 80 us; ``[16, 32, 64, 8]`` over ``(0, 2)``:
179 -> 177 | 233 -> 257), so those stay as written. XLA:GPU runs the same rewrite itself (its
``ReductionSplitter``); XLA:CPU has none, and its algebraic simplifier merges
``reduce(reduce(x))`` back into one reduce, so every step here reads a *reshape* of the
previous step's result (dims merged), which it leaves alone.

Rewrites (target cpu; every ``stablehlo.reduce`` of the user's program outside hlofuse's
outlined regions): the operand's dims, unit dims dropped, are grouped into maximal runs of
reduced and of kept dims. With two or more reduced runs, the largest run is reduced first, on a
reshape of the value to ``[dims before it, the run, dims after it]`` (each merged), and so on
until no reduced run is left; a last reshape gives the original result shape. The reducer and
the init value are the original's. Only where the innermost run is reduced and shorter than
``inner_run_below`` (64) elements (the measurements above).

Not rewritten: variadic reduces (argmax), complex elements, bodies other than one
add/multiply/max/min/and/or, an init the reducer is not idempotent on (a sum starting at 1:
applied once per step it would count twice), float sums and products narrower than f32 (every step would round its partial
results to that type: more rounding than one reduce; jnp upcasts such sums to f32 first, so
they are rare), reductions of fewer than ``min_split_elements`` elements (two loops cost more
than one there: 16 vs 33 us at 1K elements), a kept or long innermost run (above), other
targets (XLA:GPU splits itself; TPU's layouts are its own).

Preconditions: calls inlined; before ``propagate-shardings`` (which annotates the new ops) and
the fusion passes (which see the row reductions it leaves).
Invariant: the module verifies; every output is the same reduction of the same elements, in
another order: exact for max/min/and/or and integers, ``reassociate`` for float sums and
products. Idempotent: every reduce it makes has one run of reduced dims.
Statistics: ``split`` (reduces rewritten), ``split_float`` (of those, float sums/products,
whose order changed); ``disable=["split-reduce"]`` turns the pass off.
"""

from __future__ import annotations

import dataclasses
import math

import numpy as np
from jaxlib.mlir import ir

from hlofuse.core import ir as hir
from hlofuse.core.pipeline import Pass
from hlofuse.kernels.support import reduce_info
from hlofuse.passes import graph_util as gu
from hlofuse.passes.fusion.outline import program_blocks

_REASSOCIATES = ("stablehlo.add", "stablehlo.multiply")


def runs(shape, dims) -> list[tuple[int, bool]]:
    """``shape``'s dims as maximal runs ``(size, reduced)`` of adjacent reduced / kept dims,
    unit dims dropped (a reshape merges each run into one dim)."""
    out: list[tuple[int, bool]] = []
    for d, n in enumerate(shape):
        if n == 1:
            continue
        red = d in dims
        if out and out[-1][1] == red:
            out[-1] = (out[-1][0] * n, red)
        else:
            out.append((n, red))
    return out


def plan(shape, dims) -> list[tuple[list[int], int]]:
    """The steps of the split: per step, the shape the value is reshaped to and the dim of it
    that is reduced (the largest reduced run, the outer one on a tie). Empty when the reduced
    dims form one run (or none)."""
    groups = runs(shape, dims)
    if sum(red for _, red in groups) < 2:
        return []
    steps = []
    while any(red for _, red in groups):
        j = max((i for i, (_, red) in enumerate(groups) if red), key=lambda i: (groups[i][0], -i))
        before = math.prod(n for n, _ in groups[:j])
        after = math.prod(n for n, _ in groups[j + 1:])
        view = ([before] if j else []) + [groups[j][0]] + ([after] if j < len(groups) - 1 else [])
        steps.append((view, 1 if j else 0))
        rest = groups[:j] + groups[j + 1:]
        groups = runs([n for n, _ in rest], {i for i, (_, red) in enumerate(rest) if red})
    return steps


def _idempotent_init(reducer: str, init) -> bool:
    """Does ``init`` combine with itself to itself (``0 + 0``, ``1 * 1``; any value of
    max/min/and/or)? Then applying it once per step is applying it once."""
    v = gu.splat_value(init)
    if v is None:
        return False
    a = np.asarray(v)
    if reducer == "stablehlo.add":
        return bool(a == 0)
    if reducer == "stablehlo.multiply":
        return bool(a == 1)
    return True


def split_reason(op, min_split_elements: int, inner_run_below: int = 64) -> str | None:
    """None when ``op`` is a reduce this pass splits (see the module docstring), else why not."""
    if reduce_info(op) is None:
        return "variadic reduce, or reducer body not one add/multiply/max/min/and/or"
    reducer = _reducer(op)
    x = gu.info(op.operands[0])
    if x is None:
        return "dynamic shape"
    if isinstance(gu.element_type(op.operands[0]), ir.ComplexType):
        return "complex elements (not measured; GroupNorm's are real)"
    dims = set(gu.i64_array(op, "dimensions"))
    if not plan(x.shape, dims):
        return "reduced dims adjacent"
    inner, reduced = runs(x.shape, dims)[-1]
    if not reduced:
        return "innermost dim kept (XLA:CPU reduces the runs before it well)"
    if inner >= inner_run_below:
        return f"innermost reduced run of {inner} elements (XLA:CPU reduces long runs well)"
    if math.prod(x.shape) < min_split_elements:
        return f"fewer than {min_split_elements} elements"
    if not _idempotent_init(reducer, op.operands[1]):
        return "init value applied once per step would change the result"
    et = gu.element_type(op.operands[0])
    if (reducer in _REASSOCIATES and isinstance(et, ir.FloatType)
            and ir.FloatType(et).width < 32):
        return f"{et} sum/product: every step would round its partial results"
    return None


def _reducer(op) -> str:
    """The name of the one op in a reduce's body (see :func:`reduce_info`)."""
    return hir.as_op(op.regions[0].blocks[0].operations[0]).name


def split(op) -> bool:
    """Replace the reduce ``op`` (see :func:`split_reason`) by its chain; True when the chain
    reassociates floats."""
    x, init = op.operands[0], op.operands[1]
    reducer = _reducer(op)
    et = gu.element_type(x)
    v = x
    with op.context, op.location:
        for view, dim in plan(gu.info(x).shape, set(gu.i64_array(op, "dimensions"))):
            if list(gu.info(v).shape) != view:
                v = gu.create("stablehlo.reshape", [v], [gu.tensor_type(view, et)], before=op).results[0]
            out = view[:dim] + view[dim + 1:]
            v = gu.make_reduce(v, init, [dim], gu.tensor_type(out, et), before=op, reducer=reducer)
        if v.type != op.results[0].type:
            v = gu.create("stablehlo.reshape", [v], [op.results[0].type], before=op).results[0]
        gu.copy_dialect_attrs(op, [hir.defining_op(v)])   # Shardy's sharding of the result
    op.results[0].replace_all_uses_with(v)
    producer = hir.defining_op(x)
    hir.safe_erase(op)        # its body's handles are not held: program_blocks skips reduce bodies
    gu.erase_if_dead([producer] if producer is not None else [])
    return reducer in _REASSOCIATES and isinstance(et, ir.FloatType)


class SplitReduce(Pass):
    """See the module docstring."""
    name = "split-reduce"

    @dataclasses.dataclass(frozen=True)
    class Options:
        # reductions of fewer elements stay one reduce (two small loops cost more than one)
        min_split_elements: int = 1 << 15
        # split only where the innermost run is reduced and shorter than this (longer runs:
        # XLA:CPU's own reduce was as fast, see the module docstring)
        inner_run_below: int = 64

    def run(self, module, ctx):
        if not ctx.target.is_cpu:
            return {"split": 0, "split_float": 0}
        n = floats = 0
        narrow: list[str] = []
        for block in program_blocks(module):
            for op in [o for o in hir.block_ops(block) if o.name == "stablehlo.reduce"]:
                why = split_reason(op, self.options.min_split_elements, self.options.inner_run_below)
                if why is None:
                    floats += split(op)
                    n += 1
                elif "every step would round" in why:
                    narrow.append(hir.op_location(op))
        if narrow:
            ctx.report.note(f"{self.name}: {len(narrow)} reduction(s) over non-adjacent dims left as written at "
                            f"{', '.join(sorted(set(narrow))[:3])}: sums narrower than f32 (each step would round its "
                            "partial sums to that type)")
        return {"split": n, "split_float": floats}
