"""Matmul kernels with fused prologues and epilogues, tiled, accumulating in f32 (int32 for
int8 x int8 dots).

One kernel per outlined ``matmul_epilogue`` region: a ``dot_general`` whose operands may pass
through a *prologue* (convert, scaling by a scalar) and whose result flows through an
*epilogue* of elementwise ops (bias, relu, gelu exact or tanh, silu, sigmoid, residual add,
scale, convert, ...). The same machinery runs several dots sharing their lhs (horizontal
fusion, :mod:`hlofuse.kernels.horizontal`): ``spec.dots`` has one entry per dot.

Canonical form (anything else is refused by the fusion predicates): ``out[b, m, n] =
sum_k lhs[b, m, k] * rhs[b, k, n]`` with leading batch dims, the lhs possibly stored (K, M)
and the rhs possibly (N, K) or without batch dims (shared weights). Outside the kernel every
operand is reshaped (free) to a 3-D/2-D view: lhs (B, M, K), rhs (B, K, N) or (K, N), epilogue
inputs by view class: full (B, M, N), row (B, M, 1), col (1, N), scalar (1, 1).

Column-sum outputs (``spec.col_outputs``): a ``reduce`` summing an epilogue value over every
row (a bias gradient) is written as one ``(1, bn)`` partial per (row block, column block) into
a ``(row blocks, 1, N)`` f32 array (rows past M masked out), combined with the init after the
kernel. Unbatched dots only.

Quantized matmuls (``quantize-matmul`` makes them from fake-quant code): an int8 x int8 -> int32
dot accumulates in int32 on every target (exact: the same integers as XLA's dot), and its
epilogue carries the dequant scale, bias, activation and requantization to int8 for the next
layer (``round``, ``clamp``, ``convert``); weight-only int8 weights are converted tile by tile in
the rhs prologue. Tiles are picked for a 1-byte operand (TPU: 32-row int8 sublane tiles). On
cpu the kernel keeps the program's own int8 dot, which ``int8-dot-unsigned`` then turns into
XLA:CPU's faster unsigned x signed int8 dot (exact).

Tiling (:class:`~hlofuse.kernels.tiling.MatmulBlocks`):

* gpu (Triton): grid (B, M/bm, N/bn); K is looped inside the kernel in ``bk`` chunks
  (``lax.fori_loop``), tail chunks masked when ``bk`` does not divide K;
* tpu (Mosaic): grid (B, M/bm, N/bn, K/bk) with K ``arbitrary`` and an f32 VMEM accumulator
  per dot, the epilogue running on the last K step;
* cpu (interpret): one block of the whole arrays, one grid step (batch dims inside the block).

Shape of this file: :func:`matmul_epilogue_kernel`, :func:`build_matmul_epilogue`
(``pallas_call(name=...)``), :func:`matmul_epilogue_reference`.
"""

from __future__ import annotations

import dataclasses
import functools
import hashlib

import numpy as np

import jax
import jax.numpy as jnp
from jax import lax
from jax.experimental import pallas as pl

from hlofuse.core.target import Target
from hlofuse.core import ir as hir
from hlofuse.core.ir import value_key
from hlofuse.core.ops import EmitError
from hlofuse.kernels.blockeval import eval_block
from hlofuse.kernels.interpret import eval_reference
from hlofuse.kernels.common import boundary, call_options
from hlofuse.kernels.tiling import MatmulBlocks, matmul_blocks
from hlofuse.kernels.interpret import reduce_with_init
from hlofuse.kernels.support import (COL, FULL, ROW, SCALAR, ClassError, View, dot_layout, is_column_reduce,
                                     is_scalar_operand, prologue_member, view_classes)

__all__ = ["MatmulSpec", "DotSpec", "spec_from_func", "matmul_epilogue_kernel", "build_matmul_epilogue",
           "matmul_epilogue_reference"]


@dataclasses.dataclass(frozen=True)
class DotSpec:
    """One dot of the region: which function argument feeds its rhs, and how."""
    rhs_arg: int
    rhs_t: bool                    # rhs stored (N, K)
    rhs_batched: bool
    out_dtype: object              # the dot's result dtype (the accumulator is f32)
    prologue: tuple = dataclasses.field(compare=False, hash=False, default=())   # ops on the rhs
    op: object = dataclasses.field(compare=False, hash=False, default=None)      # the dot_general
    precision: tuple | None = None   # the program's precision_config, kept in the kernel's dot

    @property
    def integer(self) -> bool:
        """An int8 x int8 -> int32 dot: accumulated in int32, exactly, on every target."""
        return np.dtype(self.out_dtype).kind == "i"


@dataclasses.dataclass(frozen=True)
class MatmulSpec:
    batch: int
    m: int
    n: int
    k: int
    out_shape: tuple               # the dots' result shape (the epilogue domain)
    lhs_arg: int
    lhs_t: bool                    # lhs stored (K, M)
    dots: tuple                    # DotSpec per dot (all share the lhs)
    extra_args: tuple              # (function arg index, view class) read by prologues/epilogue
    in_shapes: tuple
    in_dtypes: tuple
    out_shapes: tuple
    out_dtypes: tuple
    body_text: str
    func_op: object = dataclasses.field(compare=False, hash=False, repr=False)
    classes: dict = dataclasses.field(compare=False, hash=False, repr=False, default=None)
    lhs_prologue: tuple = dataclasses.field(compare=False, hash=False, repr=False, default=())
    epilogue: tuple = dataclasses.field(compare=False, hash=False, repr=False, default=())
    col_outputs: tuple = ()        # outputs that are column sums of epilogue values (bias grads)

    @property
    def digest(self) -> str:
        return hashlib.sha1(self.body_text.encode()).hexdigest()[:10]

    @property
    def integer(self) -> bool:
        """Every dot is an integer (int8 x int8 -> int32) dot."""
        return all(d.integer for d in self.dots)

    @property
    def n_epilogue_ops(self) -> int:
        return sum(1 for o in self.epilogue if o.name not in ("stablehlo.constant", "stablehlo.broadcast_in_dim"))


def _entry(fn_op):
    return fn_op.regions[0].blocks[0]


def _data_operand(op):
    """The operand of a prologue op that carries the matrix (the other one is a scalar)."""
    if op.name in ("stablehlo.convert", "stablehlo.negate", "stablehlo.divide"):
        return op.operands[0]
    a, b = op.operands
    return a if is_scalar_operand(b) else b


def _trace_prologue(v, ops_in_fn) -> tuple:
    """Follow an operand back through prologue ops to a function argument.

    Returns (argument, prologue ops incl. the scalar ops they read, in program order)."""
    chain = []
    while True:
        p = hir.defining_op(v)
        if p is None:
            break
        why = prologue_member(p, "cpu")
        if why is not None:
            raise EmitError(f"'{p.name}' feeding a dot operand: {why}")
        chain.append(p)
        v = _data_operand(p)
    support = []
    stack = [o for p in chain for o in p.operands]
    while stack:
        u = stack.pop()
        p = hir.defining_op(u)
        if p is None or p in chain or p in support:
            continue
        support.append(p)
        stack.extend(p.operands)
    members = set(chain) | set(support)
    return v, tuple(o for o in ops_in_fn if o in members)


def _precision(dot) -> tuple | None:
    """The dot's ``precision_config`` as ``lax.Precision`` values (None when all DEFAULT)."""
    if "precision_config" not in dot.attributes:
        return None
    from jaxlib.mlir import ir
    names = [str(a).rstrip(">").split()[-1] for a in ir.ArrayAttr(dot.attributes["precision_config"])]
    if not names or all(n == "DEFAULT" for n in names):
        return None
    return tuple(getattr(lax.Precision, n) for n in names)


def spec_from_func(fn_op) -> MatmulSpec:
    """Read an outlined matmul region (one or more dots sharing the lhs) into a :class:`MatmulSpec`."""
    entry = _entry(fn_op)
    args = list(entry.arguments)
    ops = [o.operation for o in entry.operations]
    ret = ops[-1]
    dots = [o for o in ops if o.name == "stablehlo.dot_general"]
    if not dots:
        raise EmitError("matmul region without a dot_general")
    layouts = [dot_layout(d) for d in dots]
    if any(lay is None for lay in layouts):
        raise EmitError("dot_general layout not canonical")
    shapes = {hir.tensor_type_info(d.results[0].type).shape for d in dots}
    if len(shapes) != 1:
        raise EmitError("dots of one region must have the same result shape")
    out_shape = shapes.pop()
    lhs_vals = {d.operands[0] for d in dots}
    if len(lhs_vals) != 1:
        raise EmitError("dots of one region must share their lhs")
    lay0 = layouts[0]
    if any(lay["lhs_t"] != lay0["lhs_t"] or lay["nb"] != lay0["nb"] for lay in layouts):
        raise EmitError("dots of one region must share the lhs layout")
    lhs_val = dots[0].operands[0]
    lhs_src, lhs_pro = _trace_prologue(lhs_val, ops)
    if lhs_src not in args:
        raise EmitError("dot lhs is not a region input")
    nb = lay0["nb"]
    lhs_info = hir.tensor_type_info(lhs_val.type)
    src_info = hir.tensor_type_info(lhs_src.type)
    if src_info.shape != lhs_info.shape:
        raise EmitError("lhs prologue changes the shape")
    bshape = lhs_info.shape[:nb]
    batch = int(np.prod(bshape)) if nb else 1
    if lay0["lhs_t"]:
        k, m = lhs_info.shape[nb], lhs_info.shape[nb + 1]
    else:
        k, m = lhs_info.shape[-1], int(np.prod(lhs_info.shape[nb:-1]))
    dspecs = []
    pro_ops = set(lhs_pro)
    n = None
    for d, lay in zip(dots, layouts):
        rhs_src, rhs_pro = _trace_prologue(d.operands[1], ops)
        if rhs_src not in args:
            raise EmitError("dot rhs is not a region input")
        rinfo = hir.tensor_type_info(d.operands[1].type)
        if hir.tensor_type_info(rhs_src.type).shape != rinfo.shape:
            raise EmitError("rhs prologue changes the shape")
        nd = rinfo.shape[nb] if lay["rhs_t"] else rinfo.shape[nb + 1]
        if n is not None and nd != n:
            raise EmitError("dots of one region must have the same N")
        n = nd
        pro_ops |= set(rhs_pro)
        dt = hir.np_dtype(hir.tensor_type_info(d.results[0].type).dtype)
        dspecs.append(DotSpec(args.index(rhs_src), lay["rhs_t"], nb > 0, dt, rhs_pro, d, _precision(d)))
    epilogue = [o for o in ops[:-1] if o.name != "stablehlo.dot_general" and o not in pro_ops]
    for o in pro_ops:  # prologue values feed dots only
        for r in o.results:
            for u in r.uses:
                owner = u.owner
                uop = getattr(owner, "operation", owner)
                if uop not in pro_ops and uop.name != "stablehlo.dot_general":
                    raise EmitError("a prologue value is also used by the epilogue")
    view = View.of(out_shape)
    try:
        classes = view_classes(epilogue, view, seeds={d.results[0]: FULL for d in dots})
    except ClassError as e:
        raise EmitError(f"epilogue has no consistent block view: {e}") from None
    col_outputs = []
    for k_out, v in enumerate(ret.operands):
        d = hir.defining_op(v)
        if classes.get(v) == COL and d is not None and d.name == "stablehlo.reduce" and is_column_reduce(d):
            # a column reduction of an epilogue value (d(bias) of a matmul's backward): each
            # row block writes its partial, summed after the kernel
            if batch != 1:
                raise EmitError("column-reduction outputs of a batched matmul region")
            if any(u.name != "func.return" for u in hir.users(v)):
                raise EmitError("a column reduction is read inside the matmul region")
            if not hir.tensor_type_info(v.type).dtype.startswith(("f", "bf")):
                raise EmitError("column reduction of a non-float value")
            col_outputs.append(k_out)
        elif classes.get(v) != FULL:
            raise EmitError("matmul region outputs must be in the dot's domain")
    extra = []
    used_by = {}
    for o in epilogue:
        for v in o.operands:
            if v in args:
                used_by.setdefault(args.index(v), set()).add(classes[v])
    for o in pro_ops:
        for v in o.operands:
            if v in args and v != lhs_src and all(v != args[ds.rhs_arg] for ds in dspecs):
                used_by.setdefault(args.index(v), set()).add(SCALAR)
    for i in sorted(used_by):
        for c in sorted(used_by[i]):
            if c == SCALAR and hir.tensor_type_info(args[i].type).size != 1:
                raise EmitError("prologue scalar input is not a scalar")
            extra.append((i, c))
    ins = [hir.tensor_type_info(a.type) for a in args]
    outs = [hir.tensor_type_info(v.type) for v in ret.operands]
    body = hir.ops_text(ops)
    return MatmulSpec(batch, m, n, k, tuple(out_shape), args.index(lhs_src), lay0["lhs_t"], tuple(dspecs),
                      tuple(extra), tuple(i.shape for i in ins), tuple(hir.np_dtype(i.dtype) for i in ins),
                      tuple(o.shape for o in outs), tuple(hir.np_dtype(o.dtype) for o in outs), body, fn_op,
                      classes, lhs_pro, tuple(epilogue), tuple(col_outputs))


# ---------------------------------------------------------------------------------------------
# Kernel body
# ---------------------------------------------------------------------------------------------

def _mm(x, w, *, lhs_t: bool, rhs_t: bool, acc=jnp.float32, precision=None):
    """Product of an lhs block (.., M, K)/(.., K, M) and rhs block (.., K, N)/(.., N, K),
    accumulated in ``acc`` (f32 on gpu/tpu); a rank-3 pair shares a leading batch dim."""
    xb = x.ndim == 3
    wb = w.ndim == 3
    lc = x.ndim - 2 if lhs_t else x.ndim - 1
    rc = w.ndim - 1 if rhs_t else w.ndim - 2
    batch = ((0,), (0,)) if xb and wb else ((), ())
    return lax.dot_general(x, w, (((lc,), (rc,)), batch), precision=precision, preferred_element_type=acc)


def _prologue(ops, src_arg, block, env_scalars, f32_math: bool = False):
    """Apply an operand's prologue ops (convert, scalar scaling) to one loaded block."""
    if not ops:
        return block
    env = dict(env_scalars)
    env[value_key(src_arg)] = block
    classes = {r: (SCALAR if hir.tensor_type_info(r.type).size == 1 else FULL) for o in ops for r in o.results}
    shapes = {FULL: tuple(block.shape), SCALAR: (1,) * block.ndim, ROW: None, COL: None}
    eval_block(ops, env, classes, shapes, f32_math=f32_math)
    return env[value_key(ops[-1].results[0])]


def matmul_epilogue_kernel(*refs, spec: MatmulSpec, plan: dict):
    """Kernel body for one or more dots sharing the lhs, then the epilogue.

    Refs: lhs, one rhs per dot, the extra (epilogue/prologue) inputs, the outputs, and on tpu
    one f32 accumulator per dot. ``plan`` holds static facts: block shapes per view class,
    K chunking (``bk``, ``nk``, ``k`` for masking) and whether K runs on the grid (tpu).
    """
    nd = len(spec.dots)
    n_extra = len(spec.extra_args)
    lhs_ref = refs[0]
    rhs_refs = refs[1:1 + nd]
    extra_refs = refs[1 + nd:1 + nd + n_extra]
    out_refs = refs[1 + nd + n_extra:1 + nd + n_extra + len(spec.out_shapes)]
    acc_refs = refs[1 + nd + n_extra + len(spec.out_shapes):]
    args = list(_entry(spec.func_op).arguments)
    extra_vals = {}
    scalars = {}
    for (i, cls), r in zip(spec.extra_args, extra_refs):
        extra_vals.setdefault(value_key(args[i]), r[...])
        if cls == SCALAR:
            scalars[value_key(args[i])] = r[...]
    lhs_arg = args[spec.lhs_arg]
    lhs_t = spec.lhs_t

    def lhs_chunk(c):
        if plan["k_in_grid"] or plan["nk"] == 1:
            x = lhs_ref[...]
        elif lhs_t:
            x = lhs_ref[pl.ds(c * plan["bk"], plan["bk"]), :]
        else:
            x = lhs_ref[:, pl.ds(c * plan["bk"], plan["bk"])]
        if plan["mask_k"]:
            axis = x.ndim - 2 if lhs_t else x.ndim - 1
            kk = lax.broadcasted_iota(jnp.int32, x.shape, axis) + c * plan["bk"]
            x = jnp.where(kk < plan["k"], x, jnp.zeros_like(x))
        return _prologue(spec.lhs_prologue, lhs_arg, x, scalars, plan["f32_math"])

    def rhs_chunk(j, c):
        ds = spec.dots[j]
        r = rhs_refs[j]
        if plan["k_in_grid"] or plan["nk"] == 1:
            w = r[...]
        elif ds.rhs_t:
            w = r[:, pl.ds(c * plan["bk"], plan["bk"])]
        else:
            w = r[pl.ds(c * plan["bk"], plan["bk"]), :]
        if plan["mask_k"]:
            axis = w.ndim - 1 if ds.rhs_t else w.ndim - 2
            kk = lax.broadcasted_iota(jnp.int32, w.shape, axis) + c * plan["bk"]
            w = jnp.where(kk < plan["k"], w, jnp.zeros_like(w))
        return _prologue(ds.prologue, args[ds.rhs_arg], w, scalars, plan["f32_math"])

    def step(c, accs):
        x = lhs_chunk(c)
        return tuple(acc + _mm(x, rhs_chunk(j, c), lhs_t=lhs_t, rhs_t=spec.dots[j].rhs_t,
                               acc=plan["acc"][j], precision=spec.dots[j].precision).astype(acc.dtype)
                     for j, acc in enumerate(accs))

    def epilogue(accs):
        env = dict(extra_vals)
        for ds, acc in zip(spec.dots, accs):
            env[value_key(ds.op.results[0])] = acc.astype(ds.out_dtype)
        row_valid = None
        if plan.get("mask_m"):   # rows past M in the last row block: out of column sums
            bm = plan["shapes"][ROW][0]
            row_valid = (pl.program_id(1) * bm + lax.broadcasted_iota(jnp.int32, plan["shapes"][ROW], 0)
                         < spec.m)
        eval_block(list(spec.epilogue), env, spec.classes, plan["shapes"], f32_math=plan["f32_math"],
                   row_valid=row_valid)
        ret = [o for o in _entry(spec.func_op).operations][-1]
        for k_out, (r, v) in enumerate(zip(out_refs, ret.operands)):
            if k_out in spec.col_outputs:   # this row block's partial column sums (f32)
                r[...] = jnp.reshape(env[value_key(v)], r.shape).astype(r.dtype)
                continue
            r[...] = jnp.broadcast_to(env[value_key(v)], plan["shapes"][FULL]).astype(r.dtype)

    if plan["k_in_grid"]:
        kid = pl.program_id(len(plan["grid"]) - 1)

        @pl.when(kid == 0)
        def _init():
            for a in acc_refs:
                a[...] = jnp.zeros_like(a)

        part = step(0, tuple(jnp.zeros(a.shape, a.dtype) for a in acc_refs))
        for a, p in zip(acc_refs, part):
            a[...] += p

        @pl.when(kid == plan["grid"][-1] - 1)
        def _done():
            epilogue(tuple(a[...] for a in acc_refs))
        return
    zeros = tuple(jnp.zeros(plan["shapes"][FULL], a) for a in plan["acc"])
    if plan["nk"] == 1 and not plan["k_in_grid"]:
        x = lhs_chunk(0)  # one product, no accumulator: exactly the dot the program had
        accs = tuple(_mm(x, rhs_chunk(j, 0), lhs_t=lhs_t, rhs_t=d.rhs_t, acc=plan["acc"][j], precision=d.precision)
                     for j, d in enumerate(spec.dots))
    else:
        accs = lax.fori_loop(0, plan["nk"], step, zeros)
    epilogue(accs)


# ---------------------------------------------------------------------------------------------
# Builder
# ---------------------------------------------------------------------------------------------

def _views(spec: MatmulSpec) -> dict:
    B, M, N, K = spec.batch, spec.m, spec.n, spec.k
    return {"lhs": (B, K, M) if spec.lhs_t else (B, M, K),
            FULL: (B, M, N), ROW: (B, M, 1), COL: (1, N), SCALAR: (1, 1)}


def _rhs_view(spec: MatmulSpec, ds: DotSpec) -> tuple:
    K, N = spec.k, spec.n
    core = (N, K) if ds.rhs_t else (K, N)
    return (spec.batch,) + core if ds.rhs_batched else core


def _specs(spec: MatmulSpec, blocks: MatmulBlocks, target: str):
    """BlockSpecs for (lhs, rhs..., extras..., outs...) and the kernel's block shapes per class."""
    target = Target.of(target)
    bm, bn, bk = blocks.bm, blocks.bn, blocks.bk
    if target.is_cpu:
        v = _views(spec)
        whole = lambda shape: pl.BlockSpec(shape, lambda i, n=len(shape): (0,) * n)  # noqa: E731
        ins = [whole(v["lhs"])] + [whole(_rhs_view(spec, d)) for d in spec.dots]
        ins += [whole(v[c]) for _, c in spec.extra_args]
        outs = [whole((1, 1, spec.n) if k in spec.col_outputs else v[FULL]) for k in range(len(spec.out_shapes))]
        shapes = {FULL: v[FULL], ROW: v[ROW], COL: v[COL], SCALAR: v[SCALAR]}
        return ins, outs, shapes
    tpu = target.is_tpu
    kblk = bk if tpu else bk * blocks.k_steps
    if tpu:
        lhs = pl.BlockSpec((None, bk, bm) if spec.lhs_t else (None, bm, bk),
                           (lambda b, i, j, k: (b, k, i)) if spec.lhs_t else (lambda b, i, j, k: (b, i, k)))
    else:
        lhs = pl.BlockSpec((None, kblk, bm) if spec.lhs_t else (None, bm, kblk),
                           (lambda b, i, j: (b, 0, i)) if spec.lhs_t else (lambda b, i, j: (b, i, 0)))
    ins = [lhs]
    for d in spec.dots:
        kk = bk if tpu else kblk
        core = (bn, kk) if d.rhs_t else (kk, bn)
        if tpu:
            idx = (lambda b, i, j, k: (j, k)) if d.rhs_t else (lambda b, i, j, k: (k, j))
        else:
            idx = (lambda b, i, j: (j, 0)) if d.rhs_t else (lambda b, i, j: (0, j))
        if d.rhs_batched:
            inner = idx
            shape = (None,) + core
            if tpu:
                idx = lambda b, i, j, k, f=inner: (b,) + f(b, i, j, k)  # noqa: E731
            else:
                idx = lambda b, i, j, f=inner: (b,) + f(b, i, j)  # noqa: E731
        else:
            shape = core
        ins.append(pl.BlockSpec(shape, idx))

    def by_class(c):
        if tpu:
            m = {FULL: ((None, bm, bn), lambda b, i, j, k: (b, i, j)),
                 ROW: ((None, bm, 1), lambda b, i, j, k: (b, i, 0)),
                 COL: ((1, bn), lambda b, i, j, k: (0, j)),
                 SCALAR: ((1, 1), lambda b, i, j, k: (0, 0))}
        else:
            m = {FULL: ((None, bm, bn), lambda b, i, j: (b, i, j)),
                 ROW: ((None, bm, 1), lambda b, i, j: (b, i, 0)),
                 COL: ((1, bn), lambda b, i, j: (0, j)),
                 SCALAR: ((1, 1), lambda b, i, j: (0, 0))}
        shape, idx = m[c]
        return pl.BlockSpec(shape, idx)

    ins += [by_class(c) for _, c in spec.extra_args]
    # column-sum outputs: one (1, bn) partial per (row block, column block)
    col = pl.BlockSpec((None, 1, bn), (lambda b, i, j, k: (i, 0, j)) if tpu else (lambda b, i, j: (i, 0, j)))
    outs = [col if k in spec.col_outputs else by_class(FULL) for k in range(len(spec.out_shapes))]
    shapes = {FULL: (bm, bn), ROW: (bm, 1), COL: (1, bn), SCALAR: (1, 1)}
    return ins, outs, shapes


def build_matmul_epilogue(spec: MatmulSpec, target: Target | str, *, interpret=None, blocks: MatmulBlocks | None = None,
                          name: str | None = None, _family: str = "matmul_epilogue", _body=None):
    """The region as ``f(*inputs) -> outputs`` around one ``pallas_call``.

    ``interpret``: see :func:`~hlofuse.kernels.common.call_options`.
    """
    target = Target.of(target)
    if any(np.dtype(d) == np.bool_ for d in spec.out_dtypes) and not target.is_cpu:
        raise EmitError("boolean matmul-region outputs are not supported on gpu/tpu")
    integer = spec.integer
    if target.is_tpu and not integer and any(np.dtype(d) == np.int8 for d in spec.out_dtypes):
        raise EmitError("int8 outputs of a float matmul on tpu (int8 tiles need the int8 dot's 32-row blocks)")
    itemsize = 1 if integer else max(np.dtype(spec.in_dtypes[spec.lhs_arg]).itemsize, 2)
    # full-tile VMEM beyond the operands and one output per dot: full extra inputs (residuals)
    # and extra outputs (a training forward also writes the activation's saved values)
    n_full_extra = (sum(1 for _, c in spec.extra_args if c == FULL)
                    + max(0, len(spec.out_dtypes) - len(spec.col_outputs) - len(spec.dots)))
    try:
        blocks = blocks or matmul_blocks(spec.batch, spec.m, spec.n, spec.k, target=target, itemsize=itemsize,
                                         members=len(spec.dots),
                                         extra_bytes=n_full_extra * 4 * min(spec.m, 512) * min(spec.n, 512))
    except ValueError as e:
        raise EmitError(str(e)) from None
    ins, outs, shapes = _specs(spec, blocks, target)
    tpu = target.is_tpu
    plan = {"shapes": shapes, "k_in_grid": tpu and not target.is_cpu, "bk": blocks.bk, "nk": blocks.k_steps,
            "k": spec.k, "mask_k": target.is_gpu and spec.k % blocks.bk != 0, "grid": blocks.grid,
            "f32_math": not target.is_cpu,
            # cpu keeps each dot's own result type (XLA:CPU then sees the program's dot unchanged);
            # gpu/tpu tiles accumulate in f32, int8 x int8 dots in int32 (exact)
            "acc": tuple(np.dtype(d.out_dtype) if target.is_cpu or d.integer else np.dtype(np.float32)
                         for d in spec.dots),
            "mask_m": bool(spec.col_outputs) and not target.is_cpu and spec.m % blocks.bm != 0}
    name = name or f"hlofuse_{_family}_{spec.digest}"
    scratch = []
    if tpu:
        from jax.experimental.pallas import tpu as pltpu
        scratch = [pltpu.VMEM((blocks.bm, blocks.bn), a) for a in plan["acc"]]
    v = _views(spec)
    kernel = functools.partial(_body or matmul_epilogue_kernel, spec=spec, plan=plan)
    n_row_blocks = 1 if target.is_cpu else -(-spec.m // blocks.bm)

    def out_struct(k, d):
        if k in spec.col_outputs:   # per row block partials, 16-bit floats as f32
            pd = np.float32 if np.dtype(d).itemsize < 4 else d
            return jax.ShapeDtypeStruct((n_row_blocks, 1, spec.n), pd)
        return jax.ShapeDtypeStruct(v[FULL], d)

    call = pl.pallas_call(
        kernel,
        out_shape=[out_struct(k, d) for k, d in enumerate(spec.out_dtypes)],
        grid=blocks.grid,
        in_specs=ins,
        out_specs=outs,
        scratch_shapes=scratch,
        **call_options(target, blocks, interpret),
        name=name,
    )
    if spec.col_outputs:
        ret = [o.operation for o in _entry(spec.func_op).operations][-1]
        col_ops = {k: hir.defining_op(ret.operands[k]) for k in spec.col_outputs}
        kernel_call = call

        def call(*views):
            # the column sums' partials combined over the row blocks, init applied once
            outs = list(kernel_call(*views))
            for k, op in col_ops.items():
                outs[k] = reduce_with_init(op, outs[k][:, 0, :], axis=0).astype(spec.out_dtypes[k])
            return outs
    in_views = [(spec.lhs_arg, v["lhs"])] + [(d.rhs_arg, _rhs_view(spec, d)) for d in spec.dots]
    in_views += [(i, v[c]) for i, c in spec.extra_args]
    return boundary(call, blocks, name, in_views=in_views, out_shapes=spec.out_shapes)


def matmul_epilogue_reference(spec: MatmulSpec):
    """Plain-jnp reference: the region op by op on whole arrays (dots accumulate in f32)."""
    def ref(*inputs):
        return tuple(eval_reference(spec.func_op, inputs))
    return ref
