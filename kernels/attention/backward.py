"""Training: a flash forward that also returns the logsumexp, and a flash backward.

``fuse-attention`` matches attention *and* the backward ``jax.grad`` built for it in one
program (``hlofuse.jit(jax.value_and_grad(loss))``) and outlines two regions:

* kind ``attention_fwd_lse``: the forward plus its row statistics ``[max(m, init), l]`` per query
  row (:class:`FwdLseSpec`; f32, a trailing dim of 2): the forward's online softmax returns them;
* kind ``attention_bwd``: the program's backward (its body recomputes the forward, so XLA runs it
  unchanged when no kernel is built), replaced by the flash backward (:class:`BwdSpec`): per key
  block, ``p = exp(x - m) / l``, ``dP = dO·Vᵀ``, ``dx = p·(dP - rowsum(dO·O))`` (0 where ``p`` is
  one-hot, :func:`~.online_softmax.logit_grad`), the logit chain's
  own VJP (``jax.vjp`` of the region's logit ops: scale, masks, bias) gives ``dS`` and the
  learned side inputs' gradients, then ``dQ += dS·K``, ``dK += dSᵀ·Q``, ``dV += pᵀ·dO``. Only
  ``[.., bq, bk]`` blocks are live; nothing of size ``Sq×Sk`` is stored.

cpu dot forms: XLA:CPU runs a dot in its YNNPACK library kernel (``__ynn_fusion`` in the
compiled HLO) only when the lhs is ``[B.., M, K]`` with K last; otherwise an Eigen dot thunk
runs it (about 2x slower per flop here). ``dSᵀ·Q`` and ``pᵀ·dO`` contract the lhs's row dim,
so they were Eigen dots (a third of the training step at S=2048). The loops compute the
transposed products instead, ``dKᵀ += Qᵀ·dS`` and ``dVᵀ += dOᵀ·p``, with ``Qᵀ``/``dOᵀ``
(``[B.., D, R.., Sq]``) built once per call from the inputs, so every per-block dot is a
library dot and no block is transposed; dK and dV are moved back once, in the transpose that
brings each gradient to its result layout (:func:`_to_outputs`). Measured (interleaved A/B in
one process, ``attn_train_s2048`` of ``bench/train_cpu``, 9 rounds, load ~3): step time
0.83x of the TN form (ratio to jax.jit 0.372 -> 0.338). On the quieter machine (load ~1.7,
YNN threading its dots over both cores) this and the one-transpose layouts together ran
0.93-0.96x of the kernels before them (0.362 -> 0.348, 11 and 15 rounds). ``Q·Kᵀ`` and ``dO·Vᵀ`` (rhs with its contracted dim last) were already library
dots (YNNPACK takes a transposed rhs).

The gradients are computed in the canonical layout (:mod:`.layout`), except dK/dV (above),
brought back to the region inputs' layouts and the layout the program's gradient values have
(``outs``: a permutation of the non-unit dims, found when the backward was matched) in one
transpose each.

cpu: XLA loops (:func:`build_cpu_bwd`); gpu/tpu: Pallas kernels (Triton / Mosaic,
:mod:`.pallas_bwd`: a dK/dV kernel and a dQ kernel), the forward with lse is the forward kernel
writing its row statistics too. What a kernel cannot do raises :class:`~hlofuse.core.ops.EmitError`
(the region stays with XLA and the report says why).
"""

from __future__ import annotations

import dataclasses
import functools
import json

import numpy as np

import jax
import jax.numpy as jnp
from jax import lax
from jaxlib.mlir import ir

from hlofuse.core import ir as hir
from hlofuse.core.ops import EmitError
from hlofuse.core.target import Target
from hlofuse.kernels.attention.blocks import AttentionBlocks, cpu_bwd_plan
from hlofuse.kernels.attention.cpu import block_index, build_cpu, cpu_split, split_parts
from hlofuse.kernels.attention.layout import (canonical_inputs, from_canonical, pad_axis, pad_to,
                                              to_canonical)
from hlofuse.kernels.attention.logits import F32, eval_logits
from hlofuse.kernels.attention.online_softmax import (logit_grad, needs_own_stats, online_init,
                                                      online_stats)
from hlofuse.kernels.attention.reference import attention_reference
from hlofuse.kernels.attention.skip import skip_table_cached
from hlofuse.kernels.attention.spec import AttentionSpec
from hlofuse.kernels.naming import named_kernel

__all__ = ["FWD_LSE_ATTR", "BWD_ATTR", "FwdLseSpec", "BwdSpec", "fwd_lse_spec_from_func", "consistent_inputs",
           "bwd_spec_from_func", "build_fwd_lse", "build_bwd", "fwd_lse_reference", "bwd_reference",
           "build_cpu_bwd"]

FWD_LSE_ATTR = "hlofuse.attention_fwd_lse"
BWD_ATTR = "hlofuse.attention_bwd"


@dataclasses.dataclass(frozen=True)
class FwdLseSpec:
    """The forward of a training step: ``fwd`` plus the logsumexp output."""
    fwd: AttentionSpec
    lse_dims: tuple          # labels of the lse value (the logits' dims without the key)
    o_index: int             # which function result is the P·V output (the other is lse)
    lse_shape: tuple = ()

    def to_attr(self) -> str:
        return json.dumps({"fwd": self.fwd.to_attr(), "lse_dims": list(self.lse_dims),
                           "o_index": self.o_index})


@dataclasses.dataclass(frozen=True)
class BwdSpec:
    """The backward of one matched attention (see the module docstring). Pure data.

    Inputs of the region function: the forward region's inputs (``fwd``'s arg positions),
    then ``o_arg`` (the P·V result), ``lse_arg``, ``do_arg`` (the cotangent, labels
    ``do_dims``). ``outs``: per function result, ``(grad, perm)``: ``grad`` is an input position
    of the forward (Q, K, V or a side input) and ``perm`` permutes the non-unit dims of that
    gradient (in its input's layout) into the result's.
    """
    fwd: AttentionSpec
    o_arg: int
    lse_arg: int
    do_arg: int
    do_dims: tuple
    lse_dims: tuple
    outs: tuple
    in_shapes: tuple = ()
    in_dtypes: tuple = ()
    out_shapes: tuple = ()
    out_dtypes: tuple = ()

    def to_attr(self) -> str:
        return json.dumps({"fwd": self.fwd.to_attr(), "o_arg": self.o_arg, "lse_arg": self.lse_arg,
                           "do_arg": self.do_arg, "do_dims": list(self.do_dims),
                           "lse_dims": list(self.lse_dims),
                           "outs": [[g, list(p)] for g, p in self.outs]})

    @property
    def learned(self) -> tuple:
        """Positions in ``fwd.side_args`` of the side inputs whose gradient is an output."""
        sides = [a for a, _ in self.fwd.side_args]
        return tuple(sorted({sides.index(g) for g, _ in self.outs if g in sides}))


def _labels(x) -> tuple:
    return tuple(None if d is None else d for d in x)


def _func_parts(fn_op, attr: str):
    if attr not in fn_op.attributes:
        raise EmitError(f"region without a {attr} attribute")
    ftype = hir.function_type(fn_op)
    ins = [hir.tensor_type_info(t) for t in ftype.inputs]
    outs = [hir.tensor_type_info(t) for t in ftype.results]
    if any(i is None for i in ins + outs):
        raise EmitError("dynamic shapes")
    ops = hir.block_ops(fn_op.regions[0].blocks[0])
    d = json.loads(ir.StringAttr(fn_op.attributes[attr]).value)
    return d, ins, outs, ops


def _fwd_from(d, ins, outs, ops, fn_op, o_shape) -> AttentionSpec:
    return AttentionSpec.from_attr(
        d["fwd"], in_shapes=tuple(i.shape for i in ins),
        in_dtypes=tuple(hir.np_dtype(i.dtype) for i in ins), out_shape=tuple(o_shape),
        body_text=hir.ops_text(ops),
        func_text=fn_op.operation.get_asm(assume_verified=True))


def fwd_lse_spec_from_func(fn_op) -> FwdLseSpec:
    d, ins, outs, ops = _func_parts(fn_op, FWD_LSE_ATTR)
    if len(outs) != 2:
        raise EmitError("attention forward with lse must return two values")
    oi = int(d["o_index"])
    fwd = _fwd_from(d, ins, outs, ops, fn_op, outs[oi].shape)
    return FwdLseSpec(fwd, _labels(d["lse_dims"]), oi, tuple(outs[1 - oi].shape))


def bwd_spec_from_func(fn_op) -> BwdSpec:
    d, ins, outs, ops = _func_parts(fn_op, BWD_ATTR)
    o_arg = int(d["o_arg"])
    fwd = _fwd_from(d, ins, outs, ops, fn_op, ins[o_arg].shape)
    outs_spec = tuple((int(g), tuple(int(x) for x in p)) for g, p in d["outs"])
    if len(outs_spec) != len(outs):
        raise EmitError("attention backward: results do not agree with the recorded gradients")
    return BwdSpec(fwd, o_arg, int(d["lse_arg"]), int(d["do_arg"]), _labels(d["do_dims"]),
                   _labels(d["lse_dims"]), outs_spec, tuple(i.shape for i in ins),
                   tuple(hir.np_dtype(i.dtype) for i in ins), tuple(o.shape for o in outs),
                   tuple(hir.np_dtype(o.dtype) for o in outs))


# ---------------------------------------------------------------------------------------------
# forward with lse
# ---------------------------------------------------------------------------------------------

STAT = "<stat>"   # the trailing dim of the row statistics: (m, l)


def _lse_out(fs: FwdLseSpec, stats_c):
    spec = fs.fwd
    return from_canonical(stats_c, spec.out_order[:-1] + [STAT], tuple(fs.lse_dims) + (STAT,),
                          fs.lse_shape, spec.repeat).astype(F32)


def _pallas_target_check(spec, target):
    if target.is_tpu and (spec.x_dtype == "f16"
                          or any(np.dtype(d) == np.float16 for d in spec.in_dtypes)):
        raise EmitError("f16 is not supported by the TPU kernel")


def build_fwd_lse(fs: FwdLseSpec, target, *, interpret=None, blocks=None, name=None,
                  budget_scale: float = 1.0, whole_rows: bool | None = None):
    target = Target.of(target)
    if not target.is_cpu:
        from hlofuse.kernels.attention.pallas_bwd import pallas_stats
        from hlofuse.kernels.attention.triton import build_gpu
        from hlofuse.kernels.attention.mosaic import build_tpu
        _pallas_target_check(fs.fwd, target)
        name = name or f"hlofuse_attention_fwd_lse_{fs.fwd.digest}"
        build = build_gpu if target.is_gpu else build_tpu
        kern = build(fs.fwd, blocks, interpret=interpret, name=name, with_lse=True)

        def pfn(*inputs):
            o, stats = kern(*inputs)
            res = [None, None]
            res[fs.o_index], res[1 - fs.o_index] = o, _lse_out(fs, pallas_stats(fs.fwd, stats))
            return tuple(res)
        pfn.kernel_name = name
        pfn.blocks = kern.blocks
        return pfn
    inner = build_cpu(fs.fwd, blocks, with_lse=True, budget_scale=budget_scale,
                      whole_rows=whole_rows)

    def fn(*inputs):
        o, lse_c = inner.unscoped(*inputs)   # under this kernel's name, not the forward's
        res = [None, None]
        res[fs.o_index], res[1 - fs.o_index] = o, _lse_out(fs, lse_c)
        return tuple(res)
    fn = named_kernel(fn, inner.kernel_name.replace("attention_cpu", "attention_fwd_lse_cpu"))
    fn.blocks = inner.blocks
    return fn


def fwd_lse_reference(fs: FwdLseSpec):
    spec = fs.fwd
    ref = attention_reference(spec)

    def f(*inputs):
        (o,) = ref(*inputs)
        q, k, v, sides = canonical_inputs(spec, inputs)
        nb = len(spec.batch)
        s = lax.dot_general(q, k, (((q.ndim - 1,), (k.ndim - 1,)), (tuple(range(nb)),) * 2),
                            preferred_element_type=F32)
        x = jnp.broadcast_to(eval_logits(spec, s, sides, _ref_index(spec)), s.shape).astype(F32)
        m = jnp.maximum(jnp.max(x, -1), spec.m_init)
        stats = jnp.stack([m, jnp.sum(jnp.exp(x - m[..., None]), -1)], axis=-1)
        res = [None, None]
        res[fs.o_index], res[1 - fs.o_index] = o, _lse_out(fs, stats)
        return tuple(res)
    return f


def consistent_inputs(bs: BwdSpec, inputs):
    """``inputs`` with the forward's output and row statistics (``o_arg``, ``lse_arg``)
    recomputed from the forward's inputs: the flash backward trusts them (``p = exp(x - m) /
    l``), while the region's original recomputes the forward and reads neither, so drawn
    values that are not the forward's made a correct kernel fail verification (``check=True``
    rolled back every backward kernel; adversarial round)."""
    fs = FwdLseSpec(bs.fwd, bs.lse_dims, 0, tuple(bs.in_shapes[bs.lse_arg]))
    o, lse = fwd_lse_reference(fs)(*inputs)
    out = list(inputs)
    out[bs.o_arg] = np.asarray(o).astype(np.asarray(inputs[bs.o_arg]).dtype)
    out[bs.lse_arg] = np.asarray(lse).astype(np.asarray(inputs[bs.lse_arg]).dtype)
    return out


def _ref_index(spec):
    rank = len(spec.order)
    sizes = spec.sizes

    def index(lab):
        ax = spec.order.index(lab)
        shape = [1] * rank
        shape[ax] = sizes[lab]
        return jnp.arange(sizes[lab], dtype=jnp.int32).reshape(shape)
    return index


# ---------------------------------------------------------------------------------------------
# backward
# ---------------------------------------------------------------------------------------------

def _grad_layout(bs: BwdSpec, g: int):
    """(canonical order, dims, shape) of forward input ``g``."""
    spec = bs.fwd
    shape = bs.in_shapes[g]
    if g == spec.q_arg:
        return spec.batch + spec.rows_other + [spec.sq, "d"], spec.q_dims, shape
    if g == spec.k_arg:
        return spec.batch + [spec.key, "d"], spec.k_dims, shape
    if g == spec.v_arg:
        return spec.batch + [spec.key, "dv"], spec.v_dims, shape
    for a, dims in spec.side_args:
        if a == g:
            return spec.order, dims, shape
    raise EmitError(f"internal: gradient of input {g} is not Q, K, V or a side input")


def _to_outputs(bs: BwdSpec, grads: dict, orders: dict | None = None) -> tuple:
    """Canonical gradients (input position -> array) -> the function's results. ``orders``:
    per input position, the label order of its gradient when not the canonical one (the cpu
    loops' transposed dK/dV). Each result is one transpose then one reshape (the input's
    layout and the result's permutation composed: one copy pass, see
    :func:`~.layout.to_canonical`)."""
    res = []
    for (g, perm), shape, dt in zip(bs.outs, bs.out_shapes, bs.out_dtypes):
        order, dims, in_shape = _grad_layout(bs, g)
        order = (orders or {}).get(g, order)
        nonunit = [i for i, n in enumerate(in_shape) if n != 1]
        sel = [nonunit[p] for p in perm]    # the result's dims, as dims of the input
        x = from_canonical(grads[g], order, [dims[i] for i in sel], [in_shape[i] for i in sel],
                           bs.fwd.repeat)
        res.append(x.reshape(shape).astype(dt))
    return tuple(res)


def _canonical_o_do_stats(bs: BwdSpec, inputs):
    """O, dO and the row statistics in the canonical layout (GQA: the query heads split into
    (kv head, group), the group a row dim: the dK/dV contractions over the rows sum each
    group's gradients, nothing is repeated)."""
    spec = bs.fwd
    rep = spec.repeat
    o = to_canonical(inputs[bs.o_arg], spec.out_dims, spec.out_order, rep)
    do = to_canonical(inputs[bs.do_arg], bs.do_dims, spec.out_order, rep)
    stats = to_canonical(inputs[bs.lse_arg], tuple(bs.lse_dims) + (STAT,),
                         spec.out_order[:-1] + [STAT], rep).astype(F32)
    return o, do, stats


def build_bwd(bs: BwdSpec, target, *, interpret=None, blocks=None, name=None,
               budget_scale: float = 1.0):
    target = Target.of(target)
    if target.is_cpu:
        return build_cpu_bwd(bs, blocks, budget_scale=budget_scale)
    return build_pallas_bwd(bs, target, interpret=interpret, blocks=blocks, name=name)


def gpu_bwd_blocks(spec: AttentionSpec, chip=None) -> AttentionBlocks:
    """The Triton backward's blocks (dK/dV and dQ kernels alike) per chip and operand width,
    chosen so that neither kernel spills registers (ptxas in the deviceless compile,
    hlofuse.runtime.aot; .ci/aot_matrix.py's bf16 training steps at S=8192 / GQA S=4096, f32
    ones at BERT S=512 and S=4096).

    The forward's blocks (bq=128 at head dim 64) spilled: bf16 with a padding mask, the dK/dV
    kernel 788+774 B on H100, 14672+14788 B on A100.

    * H100 (sm_90): every dot keeps M >= 64 rows where it can (wgmma takes 64 rows per
      warpgroup; a 32-row operand falls back to mma.sync, seen in the PTX). Head dim 64: 64x64,
      4 warps for 16-bit operands (dK/dV 205-255 registers, occupancy bound 0.12; dQ 128-167,
      0.19-0.25), 8 for f32. Head dim 128: 64x64 at 8 warps without side inputs; with a mask
      64-row blocks spill at 1 or 2 stages (12+8 B, 160+160 B), so bq=32 (dK/dV 255
      registers, dQ 96, 0.12 -> 0.25), as JAX's own Pallas flash backward (32x32 blocks).
    * A100 (sm_80, mma.sync only): head dim 64: 64x32 at 4 warps for 16-bit operands (dK/dV
      128-182 registers, 0.12-0.25; 64x64 still spills 228+220 B with a mask), 32x32 for f32;
      head dim 128: 32x64 at 8 warps (dK/dV 128-208, dQ 96-99, 0.12-0.25).
    * f32 operands: head dim 64, 64x64 at 8 warps on H100, 32x32 at 4 on A100 (no spills;
      bq=128 spilled 744-1720 B / 18-20 KB). Head dim 128 still spills at every block tried
      (one stage: H100 464-1200 B per kernel, A100 88-104 B; two: up to 764+752 B and
      11400+11408 B): it takes one stage.

    Larger head dims keep :func:`~.blocks.gpu_blocks`."""
    from hlofuse.kernels.attention.blocks import gpu_blocks
    from hlofuse.kernels.tiling import next_pow2
    c = Target.of("gpu", chip).chip
    d = max(next_pow2(spec.head_dim), next_pow2(spec.v_head_dim))
    wgmma = tuple(c.compute_capability) >= (9, 0)
    f32 = np.dtype(spec.in_dtypes[spec.q_arg] if spec.in_dtypes else np.float32).itemsize >= 4
    stages = 2
    if d <= 64 and f32:
        bq, bk, warps = (64, 64, 8) if wgmma else (32, 32, 4)
    elif d <= 64:
        bq, bk, warps = 64, (64 if wgmma else 32), 4
    elif d <= 128:
        bq, bk, warps = (64 if wgmma and not spec.n_sides else 32), 64, 8
        stages = 1 if f32 else 2
    else:
        return gpu_blocks(spec)
    bq = min(bq, max(16, next_pow2(spec.seq_q)))
    bk = min(bk, max(16, next_pow2(spec.seq_k)))
    return AttentionBlocks("gpu", bq, bk, num_warps=warps, num_stages=stages)


def build_pallas_bwd(bs: BwdSpec, target, *, interpret=None, blocks=None, name=None):
    """The flash backward as Pallas kernels (:mod:`.pallas_bwd`): Triton (gpu) or Mosaic (tpu);
    ``interpret``: True (gpu) or a ``pltpu.InterpretParams`` (tpu) runs them on CPU."""
    from hlofuse.kernels.attention.blocks import tpu_blocks
    from hlofuse.kernels.attention.pallas_bwd import build_gpu_bwd, build_tpu_bwd, bwd_finish
    target = Target.of(target)
    spec = bs.fwd
    _pallas_target_check(spec, target)
    name = name or f"hlofuse_attention_bwd_{spec.digest}"
    if target.is_gpu:
        kern = build_gpu_bwd(spec, bs.learned, blocks or gpu_bwd_blocks(spec, target.chip),
                             interpret=interpret, name=name)
    elif target.is_tpu:
        kern = build_tpu_bwd(spec, bs.learned, blocks or tpu_blocks(spec), interpret=interpret,
                             name=name)
    else:
        raise ValueError(f"unknown target {target!r}")

    def fn(*inputs):
        o, do, stats = _canonical_o_do_stats(bs, inputs)
        dq, dk, dv, dsides = kern(inputs, o, do, stats)
        return _to_outputs(bs, bwd_finish(spec, inputs, bs.learned, dq, dk, dv, dsides))
    fn.kernel_name = name
    fn.blocks = kern.blocks
    return fn


def bwd_reference(bs: BwdSpec):
    """Plain jnp: ``jax.vjp`` of the forward reference, gradients mapped like the kernel's."""
    spec = bs.fwd
    ref = attention_reference(spec)
    wanted = sorted({g for g, _ in bs.outs})

    def f(*inputs):
        fwd_in = list(inputs)

        def fwd(*xs):
            args = list(fwd_in)
            for g, x in zip(wanted, xs):
                args[g] = x
            return ref(*args)[0]
        _, vjp = jax.vjp(fwd, *[inputs[g] for g in wanted])
        cts = vjp(_do_in_out_layout(bs, inputs))
        grads = {}
        for g, ct in zip(wanted, cts):
            order, dims, _ = _grad_layout(bs, g)
            grads[g] = to_canonical(ct, dims, order, spec.repeat)
        return _to_outputs(bs, grads)
    return f


def _do_in_out_layout(bs: BwdSpec, inputs):
    spec = bs.fwd
    do = to_canonical(inputs[bs.do_arg], bs.do_dims, spec.out_order, spec.repeat)
    return from_canonical(do, spec.out_order, spec.out_dims, spec.out_shape, spec.repeat).astype(
        bs.in_dtypes[bs.o_arg])


def build_cpu_bwd(bs: BwdSpec, blocks: AttentionBlocks | None = None, *,
                  parts: int | None = None, budget_scale: float = 1.0):
    """The flash backward as XLA loops: a loop over query chunks (carrying dK, dV and the
    learned side gradients, O(S·D)), inside it a loop over key blocks (carrying the chunk's dQ).
    Position-mask skipping (causal) visits the same key blocks as the forward. Like the
    forward, the loops can be split along a batch axis into ``parts`` independent loops
    (default :data:`~.cpu.CPU_PARTS`, :func:`~.cpu.cpu_split`); a learned side input that
    broadcasts along that axis gets the sum of the parts' gradients."""
    spec = bs.fwd
    ax, bounds = cpu_split(spec, parts)
    blocks = blocks or cpu_bwd_plan(spec, parts=len(bounds), scale=budget_scale)
    bq, bk = blocks.bq, blocks.bk
    sq, sk = spec.seq_q, spec.seq_k
    nq, nk = -(-sq // bq), -(-sk // bk)
    nb = len(spec.batch)
    nr = len(spec.rows_other)
    rank = len(spec.order)
    sq_ax, k_ax = rank - 2, rank - 1
    table = skip_table_cached(spec, bq, bk)
    learned = bs.learned
    side_pos = [a for a, _ in spec.side_args]

    bdims = tuple(range(nb))
    rows_c = tuple(range(nb, nb + nr)) + (sq_ax,)

    def fn(*inputs):
        q, k, v, sides = canonical_inputs(spec, inputs)
        o, do, stats = _canonical_o_do_stats(bs, inputs)
        mx, lsum = stats[..., 0], stats[..., 1]
        lsum = 1.0 / lsum      # per row once: the blocks multiply (a divide per element costs more)
        dd = jnp.sum(do.astype(F32) * o.astype(F32), axis=-1)              # rowsum(dO·O)
        # Qᵀ and dOᵀ [B.., D, R.., Sq] for the dKᵀ/dVᵀ dots (run_part), each one transpose of
        # the input (a move of the canonical array was a second copy pass)
        rep = spec.repeat
        qt = to_canonical(inputs[spec.q_arg], spec.q_dims,
                          spec.batch + ["d"] + spec.rows_other + [spec.sq], rep)
        dot_ = to_canonical(inputs[bs.do_arg], bs.do_dims,
                            spec.batch + ["dv"] + spec.rows_other + [spec.sq], rep)
        q, do = pad_to(q, sq_ax, nq * bq), pad_to(do, sq_ax, nq * bq)
        qt, dot_ = pad_to(qt, rank - 1, nq * bq), pad_to(dot_, rank - 1, nq * bq).astype(v.dtype)
        dd, mx, lsum = (pad_to(dd, sq_ax, nq * bq), pad_to(mx, sq_ax, nq * bq),
                        pad_to(lsum, sq_ax, nq * bq))
        k, v = pad_to(k, nb, nk * bk), pad_to(v, nb, nk * bk)
        sides = [pad_axis(pad_axis(s, k_ax, nk * bk), sq_ax, nq * bq) for s in sides]
        do = do.astype(v.dtype)
        own = needs_own_stats(q, k)
        res = [run_part(*xs, own=own, part=None if ax is None else (spec.batch[ax], a, b - a))
               for xs, (a, b) in zip(split_parts(ax, bounds, q, k, v, do, qt, dot_, dd, mx, lsum,
                                                     *sides),
                                     bounds)]
        if len(res) == 1:
            dq, dk, dv, dsd = res[0]
        else:
            cat = lambda *xs: jnp.concatenate(xs, axis=ax)   # noqa: E731
            dq, dk, dv = (cat(*[r[i] for r in res]) for i in range(3))
            dsd = tuple(cat(*gs) if sides[i].shape[ax] > 1 else functools.reduce(jnp.add, gs)
                        for i, gs in zip(learned, zip(*[r[3] for r in res])))
        grads = {spec.q_arg: lax.slice_in_dim(dq, 0, sq, axis=sq_ax),     # dK, dV transposed:
                 spec.k_arg: lax.slice_in_dim(dk, 0, sk, axis=nb + 1),    # [B.., D, Sk]
                 spec.v_arg: lax.slice_in_dim(dv, 0, sk, axis=nb + 1)}
        for i, g in zip(learned, dsd):
            if g.shape[k_ax] > 1:
                g = lax.slice_in_dim(g, 0, sk, axis=k_ax)
            if g.shape[sq_ax] > 1:
                g = lax.slice_in_dim(g, 0, sq, axis=sq_ax)
            grads[side_pos[i]] = g
        return _to_outputs(bs, grads, {spec.k_arg: spec.batch + ["d", spec.key],
                                       spec.v_arg: spec.batch + ["dv", spec.key]})

    def run_part(q, k, v, do, qt, dot_, dd, mx, lsum, *sides, own, part):
        """The loops over one part (``part``: its (batch label, start, size), or None).
        dKᵀ = Qᵀ·dS and dVᵀ = dOᵀ·P: Qᵀ/dOᵀ (``qt``/``dot_``, [B.., D, R.., Sq]) are the lhs
        with the contracted rows last and dS/P the rhs [B.., R.., bq, bk]: both NN dots
        (XLA:CPU's library matmul, see the module docstring); dK/dV accumulate and are returned
        transposed ([B.., D, Sk]; :func:`_to_outputs` moves them in its one transpose)."""
        index_fn = functools.partial(block_index, spec, bq, bk, part=part)  # the forward's iotas
        init = (jnp.zeros(q.shape, F32), jnp.zeros(_t_shape(k.shape, nb), F32),
                jnp.zeros(_t_shape(v.shape, nb), F32),
                tuple(jnp.zeros(sides[i].shape, F32) for i in learned))
        rows_t = tuple(range(nb + 1, rank))       # Qᵀ/dOᵀ's row dims (R.., Sq), last

        def chunk(c, carry):
            dq_all, dkt, dvt, dsd = carry

            def rows(a, axis=sq_ax):
                return lax.dynamic_slice_in_dim(a, c * bq, bq, axis=axis) if nq > 1 else a
            qc, doc, ddc, mc, lc = rows(q), rows(do), rows(dd), rows(mx), rows(lsum)
            qtc, dotc = rows(qt, rank - 1), rows(dot_, rank - 1)
            sc = [rows(s) if s.shape[sq_ax] > 1 else s for s in sides]

            def logits_of(j):
                """Block j's keys and logits: (kb, vb, sb, x, vjp of the logit chain)."""
                def keys(a, ax):
                    return lax.dynamic_slice_in_dim(a, j * bk, bk, axis=ax) if nk > 1 else a
                kb, vb = keys(k, nb), keys(v, nb)
                sb = [keys(s, k_ax) if s.shape[k_ax] > 1 else s for s in sc]
                s_blk = lax.dot_general(qc, kb, (((qc.ndim - 1,), (kb.ndim - 1,)), (bdims, bdims)),
                                        preferred_element_type=F32)

                def logits(s, *ls):
                    sb2 = list(sb)
                    for i, x in zip(learned, ls):
                        sb2[i] = x
                    x = eval_logits(spec, s, sb2, index_fn(c, j))
                    return jnp.broadcast_to(x, s.shape).astype(F32)
                x, vjp = jax.vjp(logits, s_blk, *[sb[i] for i in learned])
                if nk * bk != sk:
                    valid = (j * bk + jnp.arange(bk, dtype=jnp.int32)) < sk
                    x = jnp.where(valid, x, -jnp.inf)
                return kb, vb, sb, x, vjp

            def over_keys(step, init_):
                """``step`` over the chunk's key blocks (those the forward visited)."""
                if table is not None:
                    lo, hi = jnp.asarray(table[0])[c], jnp.asarray(table[1])[c]
                    return lax.fori_loop(lo, hi, step, init_)
                if nk == 1:
                    return step(0, init_)
                return lax.fori_loop(0, nk, step, init_)

            def own_stats():
                """The chunk's row max and 1/sum from these loops' own logits."""
                def step(j, st):
                    return online_stats(st, logits_of(j)[3], m_init=spec.m_init)
                m_, l_ = over_keys(step, online_init(mc.shape, (), spec.m_init)[:2])
                return m_, 1.0 / l_
            mc, lc = lax.cond(own, own_stats, lambda: (mc, lc))

            def body(j, carry2):
                dqc, dkt, dvt, dsd = carry2
                kb, vb, sb, x, vjp = logits_of(j)
                p = jnp.exp(x - mc[..., None]) * lc[..., None]
                if nq * bq != sq:      # padded query rows (their logits may be anything)
                    rv = (c * bq + jnp.arange(bq, dtype=jnp.int32)) < sq
                    p = jnp.where(rv[:, None], p, 0.0)
                dp = lax.dot_general(doc, vb, (((doc.ndim - 1,), (vb.ndim - 1,)), (bdims, bdims)),
                                     preferred_element_type=F32)
                dx = logit_grad(p, dp, ddc[..., None])
                if nk * bk != sk:
                    # padded keys: a row with every key masked has p = exp(-inf - -inf) = NaN
                    # there, and a padded key's mask entry may pass (its side values are 0):
                    # their gradients are 0 (jax.jit's dQ of such a row is 0, not NaN)
                    kv = (j * bk + jnp.arange(bk, dtype=jnp.int32)) < sk
                    dx = jnp.where(kv, dx, 0.0)
                ds, *dls = vjp(dx)
                if nk * bk != sk:
                    ds = jnp.where(kv, ds, 0.0)
                dsq = ds.astype(q.dtype)
                dqc = dqc + lax.dot_general(dsq, kb, (((k_ax,), (nb,)), (bdims, bdims)),
                                            preferred_element_type=F32)
                dkt_b = lax.dot_general(qtc, dsq, ((rows_t, rows_c), (bdims, bdims)),
                                        preferred_element_type=F32)          # [B.., D, bk]
                dvt_b = lax.dot_general(dotc, p.astype(v.dtype), ((rows_t, rows_c), (bdims, bdims)),
                                        preferred_element_type=F32)          # [B.., Dv, bk]
                dkt = _add_at(dkt, dkt_b, nb + 1, j * bk, nk > 1)
                dvt = _add_at(dvt, dvt_b, nb + 1, j * bk, nk > 1)
                new = []
                for acc, g in zip(dsd, dls):
                    g = g.astype(F32)
                    keys_sl = acc.shape[k_ax] > 1 and nk > 1
                    if acc.shape[sq_ax] > 1 and nq > 1:
                        blk = lax.dynamic_slice_in_dim(acc, c * bq, bq, axis=sq_ax)
                        blk = _add_at(blk, g, k_ax, j * bk, keys_sl)
                        new.append(lax.dynamic_update_slice_in_dim(acc, blk, c * bq, axis=sq_ax))
                    else:
                        new.append(_add_at(acc, g, k_ax, j * bk, keys_sl))
                return dqc, dkt, dvt, tuple(new)

            dqc, dkt, dvt, dsd = over_keys(body, (jnp.zeros(qc.shape, F32), dkt, dvt, dsd))
            dq_all = (lax.dynamic_update_slice_in_dim(dq_all, dqc, c * bq, axis=sq_ax)
                      if nq > 1 else dqc)
            return dq_all, dkt, dvt, dsd

        dq, dkt, dvt, dsd = chunk(0, init) if nq == 1 else lax.fori_loop(0, nq, chunk, init)
        # without loops (one chunk, one key block) XLA would fold the transpose of dKᵀ/dVᵀ
        # (:func:`_to_outputs`) into their dots as dSᵀ·Q / Pᵀ·dO again: an Eigen dot, which has
        # no bf16 x bf16 -> f32 form ("Unsupported element type for DotThunk"); the barrier
        # keeps the dots as written (no copy: it only orders)
        dkt, dvt = lax.optimization_barrier((dkt, dvt))
        return dq, dkt, dvt, dsd

    fn = named_kernel(fn, f"hlofuse_attention_bwd_cpu_{spec.digest}")
    fn.blocks = (f"cpu loops {blocks}" + (f" x{len(bounds)}" if len(bounds) > 1 else "")
                 + (" +skip" if table is not None else ""))
    return fn


def _t_shape(shape, nb: int) -> tuple:
    """``[B.., S, D]`` -> ``[B.., D, S]`` (K's/V's shape with the head dim moved before the keys)."""
    return tuple(shape[:nb]) + (shape[-1],) + tuple(shape[nb:-1])


def _add_at(acc, blk, axis: int, start, sliced: bool):
    """``acc[.., start:start+n, ..] += blk`` along ``axis`` (the whole ``acc`` when not sliced)."""
    if not sliced:
        return acc + blk
    n = blk.shape[axis]
    cur = lax.dynamic_slice_in_dim(acc, start, n, axis=axis)
    return lax.dynamic_update_slice_in_dim(acc, cur + blk, start, axis=axis)

