"""Row-reduction regions over rows longer than one block: the row walked in column tiles.

A ``reduction`` region (:mod:`hlofuse.kernels.reduction`) keeps whole rows on chip, so on gpu a
row holds at most ``Target.max_row_elems`` elements (16k on H100) and a 32k-50k vocabulary's
cross-entropy would stay with XLA. This variant runs the same region in passes over ``bc``-wide
column tiles of each row block, with the row statistics carried between tiles:

* **Staging.** Every value gets a depth: the number of row reductions that must finish before
  it is known (a row reduce's result is one deeper than its operand). A reduction whose operand
  has depth ``k`` is accumulated tile by tile in pass ``k``; the region's full outputs are
  written tile by tile in the last pass; its per-row outputs after the last tile. Each pass
  recomputes the region's elementwise ops on the tile from the inputs (nothing of
  (rows, cols) size is written besides the outputs).
* **Online logsumexp.** A sum of ``exp(A - c)`` where ``c`` is a row value computed from the
  max-reduce ``M`` of the same ``A`` (``c = M``, or ``max(M, -inf)``, or jax.nn.logsumexp's
  ``select(isfinite(M), M, 0)``: only constants and ``M`` flow into it) joins ``M``'s pass: per
  tile ``m' = max(m, max(A_tile))``, ``c'`` recomputed from ``m'``, and
  ``l' = l·exp(c - c') + sum(exp(A_tile - c'))`` (the online-softmax update of
  :mod:`hlofuse.kernels.attention.online_softmax`, with the region's own ops computing the
  exponentials). Softmax cross-entropy forward + backward is then two passes: (max, sum of
  exp, the gradient's label term) and (the label logit, the gradient (softmax - onehot)·g).
  Guards: ``l = 0`` (every element so far ``exp(...) = 0``) is not rescaled (an all ``-inf``
  prefix under the isfinite select would otherwise give ``0·inf``); a tile whose ``c'`` is
  ``-inf`` adds 0 and a row whose final ``c`` is ``-inf`` gets NaN, as ``exp(-inf - -inf)``
  gives without tiling.
* **Targets.** gpu (Triton): grid over row blocks, a ``fori_loop`` over the column tiles per
  pass, loads and stores masked at the row and column ends. tpu (Mosaic): grid (row blocks,
  passes x tiles), the second axis sequential ("arbitrary"), the accumulators in VMEM scratch,
  the full outputs' block index advancing only in the last pass (so only that pass writes them
  back). Accumulation is in f32 for 16-bit floats, as the whole-row kernel does.

Not handled (``EmitError``, the region stays with XLA and the report says why): column
reductions (a norm backward's d(scale)) and boolean reductions in a tiled region.
"""

from __future__ import annotations

import copy
import dataclasses
import functools

import numpy as np

import jax
import jax.numpy as jnp
from jax import lax
from jax.experimental import pallas as pl

from hlofuse.core import ir as hir
from hlofuse.core.ir import value_key
from hlofuse.core.ops import EmitError
from hlofuse.core.target import Target
from hlofuse.kernels.blockeval import block_rules
from hlofuse.kernels.common import (boundary, check_tpu_dtypes, from_kernel, int32_bools, kernel_dtypes,
                                    max_itemsize, to_kernel)
from hlofuse.kernels.interpret import interpret as run_ops, reduce_init
from hlofuse.kernels.support import COL, FULL, REDUCERS, ROW, SCALAR, is_column_reduce, reduce_info
from hlofuse.kernels.tiling import TiledRowBlocks, tiled_row_blocks

__all__ = ["TilePlan", "plan", "build_tiled", "is_tiled"]

F32 = jnp.float32
_LOW = (np.dtype(jnp.bfloat16), np.dtype(jnp.float16))
# ops that may carry the max-reduce M into the logsumexp's shift c (c is M or a constant then)
_SHIFT_OPS = {"stablehlo.reshape", "stablehlo.broadcast_in_dim", "stablehlo.convert", "stablehlo.maximum",
              "stablehlo.minimum", "stablehlo.select", "stablehlo.compare", "stablehlo.is_finite",
              "stablehlo.constant", "stablehlo.not", "stablehlo.and", "stablehlo.or"}
_COMBINE = {"sum": jnp.add, "max": jnp.maximum, "min": jnp.minimum, "prod": jnp.multiply}
_PARTIAL = {"sum": jnp.sum, "max": jnp.max, "min": jnp.min, "prod": jnp.prod}


def _entry(fn_op):
    return fn_op.regions[0].blocks[0]


@dataclasses.dataclass
class Red:
    """One row reduction of the region, as the tiles accumulate it."""
    op: object
    key: object               # value_key of its result
    operand: object           # the operand ir.Value
    kind: str                 # sum / max / min / prod
    init: object              # 0-d numpy init
    identity: float
    acc_dtype: object         # accumulator dtype (f32 for 16-bit floats)
    out_dtype: object
    stage: int                # the pass that accumulates it
    shift: object = None      # folded logsumexp sum: the row value c (ir.Value) of exp(A - c)
    shift_of: int = -1        # ... and the index of the max-reduce M it follows
    shift_ops: list = None    # the row ops computing c from M
    fold_ops: list = None     # the ops computing the sum's operand once M is known

    def finalize(self, acc):
        """The reduce's result from its accumulator: the init combined once (unless it is the
        reducer's identity), rounded to the result dtype."""
        init = np.asarray(self.init)
        ident = bool(init.astype(np.float64) == self.identity) if init.dtype != np.bool_ else True
        if not ident:
            acc = _COMBINE[self.kind](jnp.asarray(init, acc.dtype), acc)
        return acc.astype(self.out_dtype)



@dataclasses.dataclass
class TilePlan:
    """How a region runs over column tiles: its reductions by pass, the ops each pass evaluates."""
    reds: list
    passes: int
    pass_ops: list            # per pass: the ops evaluated on each tile (program order, no reduces)
    full_outputs: list        # (output index, ir.Value)
    row_outputs: list
    row_ops: list             # ops evaluated after the last tile for the per-row outputs
    folded: int               # number of sums folded into their max's pass (online logsumexp)


def _okey(o):
    return value_key(o.results[0])


def _cone(targets, ops, stop_keys=frozenset()) -> list:
    """The ops (program order, reduces excluded) needed to compute ``targets``, not crossing
    reduce results or values in ``stop_keys``."""
    need, todo, seen = set(), list(targets), set()
    while todo:
        v = todo.pop()
        k = value_key(v)
        if k in seen or k in stop_keys:
            continue
        seen.add(k)
        d = hir.defining_op(v)
        if d is None or d.name == "stablehlo.reduce":
            continue
        need.add(_okey(d))
        todo.extend(d.operands)
    return [o for o in ops if o.results and _okey(o) in need]


def _strip(v, names):
    d = hir.defining_op(v)
    while d is not None and d.name in names:
        v = d.operands[0]
        d = hir.defining_op(v)
    return v, d


def _fold_shift(red: Red, by_key: dict, classes: dict):
    """For a sum ``red`` of ``exp(A - c)`` with ``c`` computed (through :data:`_SHIFT_OPS` and
    constants only) from the max-reduce of the same ``A``: ``(c, index of that max)``, else None."""
    init = np.asarray(red.init)
    if red.kind != "sum" or init.dtype == np.bool_ or init.astype(np.float64) != 0:
        return None
    _, e = _strip(red.operand, {"stablehlo.convert"})
    if e is None or e.name != "stablehlo.exponential":
        return None
    _, sub = _strip(e.operands[0], {"stablehlo.convert"})
    if sub is None or sub.name != "stablehlo.subtract":
        return None
    a, cb = sub.operands[0], sub.operands[1]
    c, _ = _strip(cb, {"stablehlo.broadcast_in_dim", "stablehlo.reshape"})
    if classes.get(c) not in (ROW, SCALAR):
        return None
    found, todo, seen = None, [c], set()
    while todo:
        v = todo.pop()
        k = value_key(v)
        if k in seen:
            continue
        seen.add(k)
        if k in by_key:
            i, m = by_key[k]
            if m.kind != "max" or value_key(m.operand) != value_key(a) or found not in (None, i):
                return None
            found = i
            continue
        d = hir.defining_op(v)
        if d is None or d.name not in _SHIFT_OPS:
            return None
        todo.extend(d.operands)
    return None if found is None else (c, found)


def _depths(body, reds, by_key) -> dict:
    """value key -> how many row reductions must finish before the value is known; sets each
    reduction's ``stage`` (a folded sum takes its max's)."""
    depth: dict = {}

    def dep(v):
        return depth.get(value_key(v), 0)

    for o in body:
        if o.name == "stablehlo.reduce":
            _, r = by_key[_okey(o)]
            r.stage = reds[r.shift_of].stage if r.shift is not None else dep(r.operand)
            depth[r.key] = r.stage + 1
        else:
            d = max([dep(v) for v in o.operands] or [0])
            for res in o.results:
                depth[value_key(res)] = d
    return depth


def plan(spec) -> TilePlan:
    """Stage the region of ``spec`` (a :class:`~hlofuse.kernels.reduction.ReductionSpec`)."""
    if spec.col_outputs:
        raise EmitError("column reductions in a column-tiled row region are not supported")
    entry = _entry(spec.func_op)
    ops = [o.operation for o in entry.operations]
    body, ret = ops[:-1], ops[-1]
    classes = spec.classes
    reds: list[Red] = []
    by_key: dict = {}
    for o in body:
        if o.name != "stablehlo.reduce":
            continue
        if is_column_reduce(o):
            raise EmitError("column reductions in a column-tiled row region are not supported")
        ri = reduce_info(o)
        if ri is None or ri[0] not in _COMBINE:
            raise EmitError(f"reduction {ri[0] if ri else '(variadic)'} in a column-tiled row region")
        dt = np.dtype(hir.np_dtype(hir.tensor_type_info(o.results[0].type).dtype))
        if dt == np.bool_:
            raise EmitError("boolean reduction in a column-tiled row region")
        ident = {k: v for k, v in REDUCERS.values()}[ri[0]]
        if dt.kind in "iu" and ri[0] in ("max", "min"):
            ident = np.iinfo(dt).min if ri[0] == "max" else np.iinfo(dt).max
        r = Red(o, value_key(o.results[0]), o.operands[0], ri[0], reduce_init(o), ident,
                np.dtype(np.float32) if dt in _LOW else dt, dt, 0)
        by_key[r.key] = (len(reds), r)
        reds.append(r)
    for r in reds:   # online logsumexp: the sum joins its max's pass
        f = _fold_shift(r, by_key, classes)
        if f is not None:
            r.shift, r.shift_of = f
    while True:
        depth = _depths(body, reds, by_key)
        # a folded sum whose exp reads values its max's pass does not know yet: unfold it
        bad = [r for r in reds if r.shift is not None
               and depth.get(value_key(r.operand), 0) != reds[r.shift_of].stage + 1]
        if not bad:
            break
        for r in bad:
            r.shift, r.shift_of = None, -1

    def dep(v):
        return depth.get(value_key(v), 0)

    for r in reds:
        if r.shift is not None:
            r.shift_ops = _cone([r.shift], body, {reds[r.shift_of].key})
            r.fold_ops = _cone([r.operand], body)
    outs = list(ret.operands)
    full_outputs = [(i, v) for i, v in enumerate(outs) if spec.out_classes[i] == FULL]
    row_outputs = [(i, v) for i, v in enumerate(outs) if spec.out_classes[i] != FULL]
    last = max([r.stage for r in reds] + [dep(v) for _, v in full_outputs] + [0])
    pass_ops = []
    for k in range(last + 1):
        targets = [r.operand for r in reds if r.stage == k and r.shift is None]
        if k == last:
            targets += [v for _, v in full_outputs]
        pass_ops.append(_cone(targets, body))
    row_ops = _cone([v for _, v in row_outputs], body)
    if any(classes.get(o.results[0]) == FULL for o in row_ops):
        raise EmitError("a per-row output reads a full row value outside a reduction")
    return TilePlan(reds, last + 1, pass_ops, full_outputs, row_outputs, row_ops,
                    sum(r.shift is not None for r in reds))


def is_tiled(spec, target) -> bool:
    """Does the region need column tiles on ``target`` (its row exceeds the row budget)?"""
    target = Target.of(target)
    return not target.is_cpu and spec.cols > target.max_row_elems


# ---------------------------------------------------------------------------------------------
# The tile step, shared by the Triton and Mosaic kernels (pure jnp on blocks)
# ---------------------------------------------------------------------------------------------

class Stepper:
    """Evaluates a :class:`TilePlan` on ``(br, bc)`` tiles; accumulators are ``{red index:
    (br, 1) array}``."""

    def __init__(self, spec, tp: TilePlan, shapes: dict):
        self.tp, self.shapes = tp, shapes
        self.rules, self.emit = block_rules(spec.classes, shapes, f32_math=True)

    def run(self, ops, env):
        run_ops(ops, env, rules=self.rules, emit=self.emit)
        return env

    def init(self, k) -> dict:
        """Accumulators of pass ``k`` before its first tile."""
        return {i: jnp.full(self.shapes[ROW], r.identity, r.acc_dtype)
                for i, r in enumerate(self.tp.reds) if r.stage == k}

    def _shift(self, r, m_acc):
        m = self.tp.reds[r.shift_of]
        return self.run(r.shift_ops, {m.key: m.finalize(m_acc)})[value_key(r.shift)].astype(F32)

    def result(self, i, accs):
        """The value of reduction ``i`` from the accumulators (its pass finished)."""
        r = self.tp.reds[i]
        v = r.finalize(accs[i])
        if r.shift is not None:   # exp(-inf - -inf) = NaN, as the untiled region gives
            c = jnp.broadcast_to(self._shift(r, accs[r.shift_of]), v.shape)
            v = jnp.where(c == -jnp.inf, jnp.asarray(jnp.nan, v.dtype), v)
        return v

    def seed(self, env, accs, before: int) -> dict:
        """``env`` with the results of the reductions of passes before ``before``."""
        for i, r in enumerate(self.tp.reds):
            if r.stage < before:
                env[r.key] = self.result(i, accs)
        return env

    def _partial(self, r, x, valid):
        x = jnp.broadcast_to(x, self.shapes[FULL]).astype(r.acc_dtype)
        if valid is not None:
            x = jnp.where(valid, x, jnp.asarray(r.identity, r.acc_dtype))
        return _PARTIAL[r.kind](x, axis=-1, keepdims=True)

    def step(self, k, env, accs, valid) -> dict:
        """One tile of pass ``k``. ``env``: the tile's inputs and the earlier passes' results
        (updated with the tile's values). Returns the new accumulators."""
        tp = self.tp
        self.run(tp.pass_ops[k], env)
        new = dict(accs)
        for i, r in enumerate(tp.reds):
            if r.stage == k and r.shift is None:
                new[i] = _COMBINE[r.kind](accs[i], self._partial(r, env[value_key(r.operand)], valid))
        for i, r in enumerate(tp.reds):
            if r.stage != k or r.shift is None:
                continue
            m = tp.reds[r.shift_of]
            c_old, c_new = self._shift(r, accs[r.shift_of]), self._shift(r, new[r.shift_of])
            env2 = dict(env)
            env2[m.key] = m.finalize(new[r.shift_of])
            self.run(r.fold_ops, env2)
            ps = self._partial(r, env2[value_key(r.operand)], valid)
            ps = jnp.where(c_new == -jnp.inf, jnp.zeros_like(ps), ps)
            alpha = jnp.where(c_old == c_new, jnp.ones_like(c_new), jnp.exp(c_old - c_new))
            l_old = accs[i]
            new[i] = jnp.where(l_old == 0, l_old, l_old * alpha.astype(l_old.dtype)) + ps
        return new

    def outputs(self, env, which) -> list:
        return [env[value_key(v)] for _, v in which]


# ---------------------------------------------------------------------------------------------
# Builders
# ---------------------------------------------------------------------------------------------

def _view_shape(cls: str, rows: int, cols: int) -> tuple:
    return {FULL: (rows, cols), ROW: (rows, 1), COL: (1, cols), SCALAR: (1, 1)}[cls]


def build_tiled(spec, target: Target | str, *, interpret=None, blocks: TiledRowBlocks | None = None,
                name: str | None = None):
    """The region as ``f(*inputs) -> outputs`` around one column-tiled ``pallas_call`` (gpu or
    tpu; ``interpret`` as in :func:`~hlofuse.kernels.common.call_options`)."""
    target = Target.of(target)
    if target.is_cpu:
        raise EmitError("no column-tiled row kernel on cpu (a cpu row is unbounded)")
    tp = plan(spec)
    bool_in = int32_bools(spec.in_dtypes, target, interpret)
    bool_out = int32_bools(spec.out_dtypes, target, interpret)
    n_full = sum(c == FULL for c in spec.in_classes + spec.out_classes)
    try:
        blocks = blocks or tiled_row_blocks(spec.rows, spec.cols, target=target,
                                            itemsize=max_itemsize(spec.in_dtypes + spec.out_dtypes),
                                            n_arrays=max(2, n_full + 2))
    except ValueError as e:
        raise EmitError(str(e)) from None
    blocks = copy.copy(blocks)                # (not replace(): that re-resolves the chip by name)
    object.__setattr__(blocks, "passes", tp.passes)
    check_tpu_dtypes(spec.in_dtypes + spec.out_dtypes, target)
    name = name or f"hlofuse_reduction_tiled_{spec.pattern.replace('-', '_')}_{spec.digest}"
    out_dtypes = kernel_dtypes(spec.out_dtypes, bool_out)
    make = _gpu_call if target.is_gpu else _tpu_call
    call = make(spec, tp, blocks, bool_in, bool_out, out_dtypes, interpret, name)
    fused = boundary(call, blocks, name,
                     in_views=[(i, _view_shape(c, spec.rows, spec.cols)) for i, c in enumerate(spec.in_classes)],
                     out_shapes=spec.out_shapes, bool_in=bool_in, bool_out=bool_out)
    fused.passes, fused.folded = tp.passes, tp.folded
    return fused


def _arg_keys(spec):
    return [value_key(a) for a in _entry(spec.func_op).arguments]


def _store_value(v, b, shape, dtype):
    return jnp.broadcast_to(to_kernel(v, b), shape).astype(dtype)


# ---- gpu: Triton, one program per row block, a loop over the column tiles per pass ----------

def _gpu_kernel(*refs, spec, tp, n_in, blocks, bool_in, bool_out):
    from jax.experimental.pallas import triton as plgpu
    in_refs, out_refs = refs[:n_in], refs[n_in:]
    br, bc, T, cols, rows = blocks.br, blocks.bc, blocks.tiles, spec.cols, spec.rows
    shapes = {FULL: (br, bc), ROW: (br, 1), COL: (1, bc), SCALAR: (1, 1)}
    st = Stepper(spec, tp, shapes)
    keys = _arg_keys(spec)
    i = pl.program_id(0)
    rows_ok = i * br + lax.broadcasted_iota(jnp.int32, (br, 1), 0) < rows
    row_env = {}
    for k, r, cls, b in zip(keys, in_refs, spec.in_classes, bool_in):
        if cls == ROW:
            row_env[k] = from_kernel(plgpu.load(r, mask=rows_ok, other=0), b)
        elif cls == SCALAR:
            row_env[k] = from_kernel(r[...], b)

    def tile(t):
        cols_ok = t * bc + lax.broadcasted_iota(jnp.int32, (1, bc), 1) < cols
        both = rows_ok & cols_ok
        env = dict(row_env)
        for k, r, cls, b in zip(keys, in_refs, spec.in_classes, bool_in):
            if cls == FULL:
                env[k] = from_kernel(plgpu.load(r.at[:, pl.ds(t * bc, bc)], mask=both, other=0), b)
            elif cls == COL:
                env[k] = from_kernel(plgpu.load(r.at[:, pl.ds(t * bc, bc)], mask=cols_ok, other=0), b)
        valid = jnp.broadcast_to(cols_ok, (br, bc)) if blocks.padded else None
        return env, valid, both

    accs = {}
    for k in range(tp.passes):
        def body(t, accs, k=k):
            env, valid, both = tile(t)
            st.seed(env, accs, k)
            new = st.step(k, env, accs, valid)
            if k == tp.passes - 1:
                for (o, v) in tp.full_outputs:
                    ref = out_refs[o]
                    plgpu.store(ref.at[:, pl.ds(t * bc, bc)],
                                _store_value(env[value_key(v)], bool_out[o], (br, bc), ref.dtype), mask=both)
            return new
        accs = lax.fori_loop(0, T, body, {**accs, **st.init(k)})
    env = st.seed(dict(row_env), accs, tp.passes)
    st.run(tp.row_ops, env)
    for (o, v) in tp.row_outputs:
        ref = out_refs[o]
        plgpu.store(ref, _store_value(env[value_key(v)], bool_out[o], (br, 1), ref.dtype), mask=rows_ok)


def _gpu_call(spec, tp, blocks, bool_in, bool_out, out_dtypes, interpret, name):
    br, bc = blocks.br, blocks.bc
    cp = blocks.tiles * bc    # the block spans whole rows, in tiles (loads past the end are masked)

    def bspec(cls):
        shape = {FULL: (br, cp), ROW: (br, 1), COL: (1, cp), SCALAR: (1, 1)}[cls]
        return pl.BlockSpec(shape, (lambda i: (i, 0)) if cls in (FULL, ROW) else (lambda i: (0, 0)))

    kernel = functools.partial(_gpu_kernel, spec=spec, tp=tp, n_in=len(spec.in_dtypes), blocks=blocks,
                               bool_in=bool_in, bool_out=bool_out)
    params = None
    if interpret is None:
        from jax.experimental.pallas import triton as pltriton
        params = pltriton.CompilerParams(num_warps=blocks.num_warps, num_stages=blocks.num_stages)
    return pl.pallas_call(
        kernel,
        out_shape=[jax.ShapeDtypeStruct(_view_shape(c, spec.rows, spec.cols), d)
                   for c, d in zip(spec.out_classes, out_dtypes)],
        grid=blocks.grid,
        in_specs=[bspec(c) for c in spec.in_classes],
        out_specs=[bspec(c) for c in spec.out_classes],
        compiler_params=params, interpret=interpret or False, name=name)


# ---- tpu: Mosaic, grid (row blocks, passes x tiles), accumulators in VMEM scratch -------------

def _tpu_kernel(*refs, spec, tp, n_in, n_out, blocks, bool_in, bool_out):
    in_refs, out_refs, scratch = refs[:n_in], refs[n_in:n_in + n_out], refs[n_in + n_out:]
    br, bc, T, cols = blocks.br, blocks.bc, blocks.tiles, spec.cols
    shapes = {FULL: (br, bc), ROW: (br, 1), COL: (1, bc), SCALAR: (1, 1)}
    st = Stepper(spec, tp, shapes)
    keys = _arg_keys(spec)
    j = pl.program_id(1)
    p, t = j // T, j % T
    valid = (t * bc + lax.broadcasted_iota(jnp.int32, (br, bc), 1) < cols) if blocks.padded else None

    def load(classes):
        return {k: from_kernel(r[...], b) for k, r, cls, b in zip(keys, in_refs, spec.in_classes, bool_in)
                if cls in classes}

    for k in range(tp.passes):
        @pl.when(p == k)
        def _(k=k):
            init = st.init(k)
            accs = {i: (jnp.where(t == 0, init[i], scratch[i][...]) if i in init else scratch[i][...])
                    for i in range(len(tp.reds))}
            env = st.seed(load((FULL, COL, ROW, SCALAR)), accs, k)
            new = st.step(k, env, accs, valid)
            for i in init:
                scratch[i][...] = new[i]
            if k == tp.passes - 1:
                for (o, v) in tp.full_outputs:
                    out_refs[o][...] = _store_value(env[value_key(v)], bool_out[o], (br, bc), out_refs[o].dtype)

                @pl.when(t == T - 1)
                def _():
                    env_r = st.seed(load((ROW, SCALAR)), new, tp.passes)
                    st.run(tp.row_ops, env_r)
                    for (o, v) in tp.row_outputs:
                        out_refs[o][...] = _store_value(env_r[value_key(v)], bool_out[o], (br, 1),
                                                        out_refs[o].dtype)


def _tpu_call(spec, tp, blocks, bool_in, bool_out, out_dtypes, interpret, name):
    from jax.experimental.pallas import tpu as pltpu
    br, bc, T, P = blocks.br, blocks.bc, blocks.tiles, tp.passes

    def in_spec(cls):
        if cls == FULL:
            return pl.BlockSpec((br, bc), lambda i, j: (i, j % T))
        if cls == COL:
            return pl.BlockSpec((1, bc), lambda i, j: (0, j % T))
        if cls == ROW:
            return pl.BlockSpec((br, 1), lambda i, j: (i, 0))
        return pl.BlockSpec((1, 1), lambda i, j: (0, 0))

    def out_spec(cls):
        if cls == FULL:   # only the last pass moves (and so writes back) the output tiles
            return pl.BlockSpec((br, bc), lambda i, j: (i, jnp.maximum(j - (P - 1) * T, 0)))
        return pl.BlockSpec((br, 1), lambda i, j: (i, 0))

    kernel = functools.partial(_tpu_kernel, spec=spec, tp=tp, n_in=len(spec.in_dtypes),
                               n_out=len(spec.out_dtypes), blocks=blocks, bool_in=bool_in, bool_out=bool_out)
    return pl.pallas_call(
        kernel,
        out_shape=[jax.ShapeDtypeStruct(_view_shape(c, spec.rows, spec.cols), d)
                   for c, d in zip(spec.out_classes, out_dtypes)],
        grid=(blocks.grid[0], P * T),
        in_specs=[in_spec(c) for c in spec.in_classes],
        out_specs=[out_spec(c) for c in spec.out_classes],
        scratch_shapes=[pltpu.VMEM((br, 1), r.acc_dtype) for r in tp.reds],
        compiler_params=None if interpret is not None else pltpu.CompilerParams(
            dimension_semantics=blocks.dimension_semantics),
        interpret=interpret or False, name=name)
