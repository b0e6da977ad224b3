"""Attention kernels: one online-softmax (flash) algorithm, three executions.

Shape of this file (as every kernel family): :func:`spec_from_func` reads an outlined attention
region (``hlofuse.kind = "attention"``, made by the ``fuse-attention`` pass) into an
:class:`AttentionSpec`; :func:`build_attention` builds it for a target; :func:`attention_reference`
is the plain-jnp reference.

Canonical form. The region's Q, K, V and side inputs (masks, biases) are transposed/reshaped
outside the kernel into one label order — ``batch..., other rows..., Sq, Sk`` for the logits,
with ``D``/``Dv`` last for Q/K/V (GQA: K/V carry the kv-head label, Q's head is split into
(kv head, group) and the group joins the rows, so K/V are never repeated). Side inputs keep
size-1 dims where they broadcast, so a ``[B, 1, 1, Sk]`` padding mask stays that small.

The logits are computed blockwise by *re-evaluating the region's own ops* (scale, bias, masks,
iotas, converts, selects) on each block: iotas become block positions, broadcasts and
transposes are free in the label view. So every mask or bias form the matcher accepts is
executed with the original arithmetic, and fully masked rows give what the original gives
(NaN for an all ``-inf`` row, uniform weights for a finite fill).

Online softmax per row, over key blocks, in f32::

    m' = max(m, rowmax(x));  m* = m' if finite else 0;  a = exp(m - m*);  p = exp(x - m*)
    l = a·l + rowsum(p);     acc = a·acc + p·V;  out = acc / l     (all -inf row: 0/0 = NaN)

``m`` starts at the original max-reduce's init (``-inf`` for ``jax.nn.softmax``). Padded keys
(sequence lengths that are not a multiple of the block) get ``-inf`` after the logit ops.

Executions:

* ``cpu`` — plain JAX loops (``lax.map`` over query chunks, ``lax.fori_loop`` over key blocks)
  that never materialize the ``[.., Sq, Sk]`` logits nor carry whole arrays; chunk sizes come
  from :func:`cpu_plan` (the cost model: the per-step logits block must fit a cache budget).
* ``gpu`` — a Pallas Triton kernel: grid (batch, row group, query block), key loop inside.
* ``tpu`` — a Pallas Mosaic kernel: grid (batch, row group, query block, key block) with
  scratch accumulators and scalar-prefetched per-block key ranges.

Block skipping (causal and other position-only masks): when the logits are
``select(pred, logits, F)`` with ``pred`` built from iotas only and ``F = -inf`` (or
``F <= -1e30`` with no fully masked row), ``pred`` is evaluated once at trace time and each
query block visits only the key blocks where some entry is visible.
"""

from __future__ import annotations

import dataclasses
import functools
import hashlib
import math
from typing import Callable, Sequence

import numpy as np

import jax
import jax.numpy as jnp
from jax import lax
from jax.experimental import pallas as pl
from jaxlib.mlir import ir

from hlofuse import ir as hir
from hlofuse.ops import EmitError, emit_op

__all__ = ["AttentionSpec", "AttentionBlocks", "spec_from_func", "cpu_plan", "gpu_blocks",
           "tpu_blocks", "build_attention", "attention_reference", "attention_kernel_gpu",
           "attention_kernel_tpu", "CPU_STEP_BUDGET"]

F32 = jnp.float32
# cpu cost model: elements of the per-step logits block ([batch.., rows chunk, key block]);
# 2M f32 = 8 MiB keeps the step's temporaries (logits, probabilities) near the cache and the
# run memory at ~50 MiB for B=1 H=8 S=4096 (jax.jit: ~1 GiB). On the shared 2-core host
# (python bench/attention_cpu.py), 512x512 blocks with the scale folded into Q ran at 0.33-0.39
# of jax.jit's time at S=2048/4096; 256..1024-row chunks and 256/512-key blocks were within
# noise of each other, unchunked rows (a 64 MiB step block) about 15% slower.
CPU_STEP_BUDGET = 2 * 1024 * 1024
CPU_MAX_BLOCK_K = 512
CPU_SKIP_BLOCK = 256
CPU_K_TRANSPOSED = True       # K as [.., D, Sk]: QKᵀ per block is an NN matmul (measured faster)          # blocks when a position mask lets whole blocks be skipped
SKIP_FILL_LIMIT = -1e30       # finite fills at or below this make skipped blocks exact zeros
SKIP_TABLE_MAX = 1 << 26      # evaluate position-only masks statically up to Sq*Sk elements


# ---------------------------------------------------------------------------------------------
# Spec
# ---------------------------------------------------------------------------------------------

@dataclasses.dataclass(frozen=True)
class AttentionSpec:
    """What the kernels need, read from an outlined attention region."""
    att: object = dataclasses.field(compare=False, hash=False, repr=False)  # fuse_attention.Attention
    in_shapes: tuple = ()
    in_dtypes: tuple = ()
    q_arg: int = 0
    k_arg: int = 1
    v_arg: int = 2
    side_args: tuple = ()           # ((arg index, dims), ...)
    out_shape: tuple = ()
    out_dtype: object = None
    body_text: str = ""

    @property
    def digest(self) -> str:
        return hashlib.sha1(self.body_text.encode()).hexdigest()[:10]

    # convenient views of the analysis ------------------------------------------------------
    @property
    def sizes(self) -> dict:
        return self.att.label_sizes()

    @property
    def order(self) -> list:
        return self.att.order

    @property
    def batch(self) -> list:
        return self.att.canonical_batch

    @property
    def rows_other(self) -> list:
        return self.att.rows_other

    @property
    def sq(self) -> str:
        return self.att.sq

    @property
    def key(self) -> str:
        return self.att.key

    @property
    def seq_q(self) -> int:
        return self.sizes[self.sq]

    @property
    def seq_k(self) -> int:
        return self.sizes[self.key]

    @property
    def n_batch(self) -> int:
        return int(math.prod(self.sizes[b] for b in self.batch))

    @property
    def n_group(self) -> int:
        return int(math.prod(self.sizes[r] for r in self.rows_other))

    @property
    def head_dim(self) -> int:
        return self.att.head_dim

    @property
    def v_head_dim(self) -> int:
        return self.att.v_head_dim

    @property
    def gqa_groups(self) -> int:
        return self.att.repeat.groups if self.att.repeat else 1

    def describe(self) -> str:
        s = self.sizes
        return (f"attention batch={[s[b] for b in self.batch]} rows={[s[r] for r in self.rows_other]}"
                f" Sq={self.seq_q} Sk={self.seq_k} D={self.head_dim} Dv={self.v_head_dim}"
                f" gqa={self.gqa_groups} x={self.att.x_dtype} out={self.att.out_dtype}")


def spec_from_func(fn_op) -> AttentionSpec:
    """Read an outlined attention region (``func.func``) into an :class:`AttentionSpec`."""
    from hlofuse.passes.fuse_attention import NoMatch, analyze, vkey
    entry = fn_op.regions[0].blocks[0]
    ops = hir.block_ops(entry)
    ret = ops[-1]
    if ret.name != "func.return" or len(ret.operands) != 1:
        raise EmitError("attention region must return exactly one value")
    from hlofuse.passes.fuse_attention import producer
    pv = producer(ret.operands[0])
    if pv is None:
        raise EmitError("attention region returns an argument")
    try:
        att = analyze(pv)
    except NoMatch as e:
        raise EmitError(f"outlined region is not attention: {e}") from None
    body_ops = [o for o in ops[:-1] if o.name != "stablehlo.constant" or o in set(att.members)]
    if set(body_ops) - set(att.members):
        extra = sorted({o.name for o in set(body_ops) - set(att.members)})
        raise EmitError(f"attention region has ops outside the match: {extra}")
    arg_index = {vkey(a): i for i, a in enumerate(entry.arguments)}

    def arg_of(v, what):
        k = vkey(v)
        if k not in arg_index:
            raise EmitError(f"{what} is not a region input")
        return arg_index[k]

    ftype = ir.FunctionType(ir.TypeAttr(fn_op.attributes["function_type"]).value)
    ins = [hir.tensor_type_info(t) for t in ftype.inputs]
    out = hir.tensor_type_info(ftype.results[0])
    if any(i is None for i in ins) or out is None:
        raise EmitError("dynamic shapes")
    side = tuple((arg_of(v, "side input"), tuple(d)) for v, d in att.side_inputs)
    body = "\n".join(str(o) for o in ops)
    return AttentionSpec(att, tuple(i.shape for i in ins), tuple(hir.np_dtype(i.dtype) for i in ins),
                         arg_of(att.q, "Q"), arg_of(att.k, "K"), arg_of(att.v, "V"), side,
                         out.shape, hir.np_dtype(out.dtype), body)


# ---------------------------------------------------------------------------------------------
# Blocks and the cost model
# ---------------------------------------------------------------------------------------------

def _pow2(n: int) -> int:
    return 1 << max(0, (int(n) - 1).bit_length())


@dataclasses.dataclass(frozen=True)
class AttentionBlocks:
    """Query block (rows per program / chunk) and key block, validated per target."""
    target: str
    bq: int
    bk: int
    num_warps: int = 4
    num_stages: int = 2

    def __post_init__(self):
        if self.bq < 1 or self.bk < 1:
            raise ValueError(f"blocks must be positive, got bq={self.bq} bk={self.bk}")
        if self.target == "gpu":
            for n in (self.bq, self.bk):
                if n & (n - 1) or n < 16:
                    raise ValueError(f"Triton blocks must be powers of two >= 16, got {self.bq}x{self.bk}")
        elif self.target == "tpu":
            if self.bq % 8 or self.bk % 128:
                raise ValueError(f"TPU blocks must be (8,128)-aligned, got bq={self.bq} bk={self.bk}")
        elif self.target != "cpu":
            raise ValueError(f"unknown target {self.target!r}")

    def __str__(self) -> str:
        return f"bq={self.bq} bk={self.bk}"


def cpu_plan(spec: AttentionSpec) -> AttentionBlocks:
    """Cost model for the cpu loops: the largest key block up to ``CPU_MAX_BLOCK_K``, and
    query chunks so one step's logits block ``[batch.., rows.., bq, bk]`` stays within
    ``CPU_STEP_BUDGET`` elements (cache-resident, small peak memory). Small problems run as
    one block (the loop disappears). With a position mask (causal) both blocks are at most
    ``CPU_SKIP_BLOCK`` so whole blocks above the diagonal are skipped."""
    sq, sk = spec.seq_q, spec.seq_k
    per_row = spec.n_batch * spec.n_group
    bk = sk if sk <= CPU_MAX_BLOCK_K else CPU_MAX_BLOCK_K
    skip = _skip_info(spec) is not None and sk > CPU_SKIP_BLOCK
    if skip:
        bk = CPU_SKIP_BLOCK
    bq = max(1, CPU_STEP_BUDGET // max(1, per_row * bk))
    if skip:
        bq = min(bq, CPU_SKIP_BLOCK)
    if bq >= sq:
        bq = sq
    elif bq >= 8:
        bq = 1 << (bq.bit_length() - 1)   # a power of two: chunks align with key blocks
    return AttentionBlocks("cpu", bq, bk)


def gpu_blocks(spec: AttentionSpec) -> AttentionBlocks:
    d = max(_pow2(spec.head_dim), _pow2(spec.v_head_dim))
    bq = min(128 if d <= 64 else 64, max(16, _pow2(spec.seq_q)))
    bk = min(64 if d <= 128 else 32, max(16, _pow2(spec.seq_k)))
    return AttentionBlocks("gpu", bq, bk, num_warps=4 if d <= 64 else 8, num_stages=2)


def tpu_blocks(spec: AttentionSpec) -> AttentionBlocks:
    sub = 16 if np.dtype(spec.in_dtypes[spec.q_arg]).itemsize == 2 else 8
    bq = min(512, -(-spec.seq_q // sub) * sub)
    bk = min(512, -(-spec.seq_k // 128) * 128)
    return AttentionBlocks("tpu", bq, bk)


# ---------------------------------------------------------------------------------------------
# Canonical layout (outside the kernel)
# ---------------------------------------------------------------------------------------------

def _split_repeat(x, dims, repeat):
    dims = list(dims)
    if repeat is None or repeat.label not in dims:
        return x, dims
    i = dims.index(repeat.label)
    shape = list(x.shape)
    shape[i:i + 1] = [shape[i] // repeat.groups, repeat.groups]
    dims[i:i + 1] = [repeat.kv, repeat.g]
    return x.reshape(shape), dims


def to_canonical(x, dims, order: Sequence[str], repeat=None):
    """Transpose/reshape ``x`` (per-dim labels ``dims``) to ``order``, size 1 where absent."""
    x, dims = _split_repeat(jnp.asarray(x), dims, repeat)
    keep = [i for i, d in enumerate(dims) if d is not None]
    labs = [dims[i] for i in keep]
    x = x.reshape([x.shape[i] for i in keep])
    for lab in labs:
        if lab not in order:
            raise EmitError(f"internal: label {lab} not in the canonical order {order}")
    present = [lab for lab in order if lab in labs]
    x = jnp.transpose(x, [labs.index(lab) for lab in present])
    return x.reshape([x.shape[present.index(lab)] if lab in labs else 1 for lab in order])


def from_canonical(o, order: Sequence[str], out_dims, out_shape, repeat=None):
    """Inverse of :func:`to_canonical` for the output (labels of ``o`` are ``order``)."""
    tgt = []
    for d in out_dims:
        if d is None:
            continue
        if repeat is not None and d == repeat.label:
            tgt += [repeat.kv, repeat.g]
        else:
            tgt.append(d)
    drop = [i for i, lab in enumerate(order) if lab not in tgt]
    if any(o.shape[i] != 1 for i in drop):
        raise EmitError("internal: output label missing from the P·V result")
    o = o.reshape([n for i, n in enumerate(o.shape) if i not in drop])
    kept = [lab for lab in order if lab in tgt]
    o = jnp.transpose(o, [kept.index(lab) for lab in tgt])
    return o.reshape(out_shape)


def canonical_inputs(spec: AttentionSpec, inputs: Sequence) -> tuple:
    """(q [B.., R.., Sq, D], k [B.., Sk, D], v [B.., Sk, Dv], sides aligned to the logits)."""
    att = spec.att
    order = spec.order
    rep = att.repeat
    q = to_canonical(inputs[spec.q_arg], att.q_dims, spec.batch + spec.rows_other + [spec.sq, "d"], rep)
    k = to_canonical(inputs[spec.k_arg], att.k_dims, spec.batch + [spec.key, "d"], rep)
    v = to_canonical(inputs[spec.v_arg], att.v_dims, spec.batch + [spec.key, "dv"], rep)
    sides = [to_canonical(inputs[i], dims, order, rep) for i, dims in spec.side_args]
    return q, k, v, sides + const_sides(spec)


def const_sides(spec: AttentionSpec) -> list:
    """The region's dense constants, aligned to the logits (numpy, static)."""
    from hlofuse.passes.fuse_attention import const_array
    with jax.ensure_compile_time_eval():
        return [np.asarray(to_canonical(const_array(v), dims, spec.order, spec.att.repeat))
                for v, dims in spec.att.const_sides]


# ---------------------------------------------------------------------------------------------
# The logit ops, evaluated blockwise
# ---------------------------------------------------------------------------------------------

def eval_logits(spec: AttentionSpec, s, sides: Sequence, index: Callable[[str], object],
                *, upto=None, upcast_half: bool = False, seed: dict | None = None):
    """Evaluate the region's logit ops on one block.

    ``s``: the QKᵀ block (f32), ``sides``: side inputs' blocks (same order as
    ``spec.side_args``), ``index(label)``: positions of ``label`` in the block (broadcastable).
    Every value is an array broadcastable to the block; layout ops are identities.
    Returns the softmax input ``x`` (or the value keyed ``upto``). ``upcast_half``: compute
    16-bit float ops in f32 and round back (Triton has no bf16 division, for instance).
    ``seed``: values already known (value key -> block), e.g. a scaled QKᵀ (see :func:`_prescale`).
    """
    from hlofuse.passes.fuse_attention import producer, splat_value, vkey
    att = spec.att
    env = {att.s_key: s.astype(hir.np_dtype(_dtype_str(att.qk.results[0])))}
    for (v, _), blk in zip(att.all_sides, sides):
        if blk is None:
            continue
        if blk.dtype == np.int32 and _dtype_str(v) == "i1":
            blk = blk != 0
        env[vkey(v)] = blk

    def value(a):
        k = vkey(a)
        if k in env:
            return env[k]
        c = splat_value(a)
        p = producer(a)
        if c is None or p is None:
            raise EmitError(f"internal: logit operand {a} has no value")
        return jnp.asarray(c, hir.np_dtype(_dtype_str(a)))

    target = att.x_key if upto is None else upto
    if target in env:
        return env[target]
    steps = att.steps if upto is None else _slice_steps(att, upto)
    env.update(seed or {})
    for op in steps:
        r = op.results[0]
        name = op.name
        if vkey(r) in env and name != "stablehlo.constant":
            if vkey(r) == target:
                return env[target]
            continue
        if name in ("stablehlo.broadcast_in_dim", "stablehlo.transpose", "stablehlo.reshape"):
            res = value(op.operands[0])
        elif name == "stablehlo.iota":
            d = ir.IntegerAttr(op.attributes["iota_dimension"]).value
            lab = att.dims[vkey(r)][d]
            dt = hir.np_dtype(_dtype_str(r))
            res = jnp.zeros((), dt) if lab is None else jnp.asarray(index(lab)).astype(dt)
        elif name == "stablehlo.constant":
            res = env[vkey(r)] if vkey(r) in env else value(r)
        else:
            args = [value(a) for a in op.operands]
            shape = jnp.broadcast_shapes(*[jnp.shape(a) for a in args])
            args = [jnp.broadcast_to(a, shape) for a in args]
            half = [a.dtype in (jnp.bfloat16, jnp.float16) for a in args]
            if upcast_half and any(half) and name != "stablehlo.convert":
                args = [a.astype(F32) if h else a for a, h in zip(args, half)]
                res = emit_op(op, args)[0].astype(hir.np_dtype(_dtype_str(r)))
            else:
                res = emit_op(op, args)[0]
        env[vkey(r)] = res
        if vkey(r) == target:
            return res
    raise EmitError("internal: logits not produced by the region's ops")


def _slice_steps(att, key) -> list:
    """The logit ops ``key`` depends on, program order."""
    from hlofuse.passes.fuse_attention import vkey
    by_key = {vkey(op.results[0]): op for op in att.steps}
    need, stack = set(), [key]
    while stack:
        op = by_key.get(stack.pop())
        if op is None or op in need:
            continue
        need.add(op)
        stack.extend(vkey(a) for a in op.operands)
    return [op for op in att.steps if op in need]


def _prescale(spec: AttentionSpec):
    """(f, key) when the logits start with ``s * c`` or ``s / c``, ``c`` a power of two.

    Then ``(f·Q)·Kᵀ`` equals the scaled product bit for bit (scaling by a power of two is exact
    in binary floating point), so the cpu path scales Q once instead of every logits block.
    """
    from hlofuse.passes.fuse_attention import splat_value, vkey
    att = spec.att
    users = [op for op in att.steps if any(vkey(a) == att.s_key for a in op.operands)]
    if len(users) != 1 or users[0].name not in ("stablehlo.multiply", "stablehlo.divide"):
        return None
    op = users[0]
    a, b = op.operands
    if vkey(a) == att.s_key and vkey(b) != att.s_key:
        c = splat_value(b)
    elif op.name == "stablehlo.multiply" and vkey(b) == att.s_key:
        c = splat_value(a)
    else:
        return None
    if c is None or c == 0 or not math.isfinite(c) or _dtype_str(op.results[0]) != _dtype_str(a):
        return None
    f = c if op.name == "stablehlo.multiply" else 1.0 / c
    if math.frexp(abs(f))[0] != 0.5:
        return None
    return f, vkey(op.results[0])


def _dtype_str(v) -> str:
    return hir.tensor_type_info(v.type).dtype


def _x_select(spec: AttentionSpec):
    """(predicate value, fill) when x == select(pred, logits, fill) with ``pred`` built from
    iotas and constants only, over the Sq and key labels only; else None."""
    from hlofuse.passes.fuse_attention import producer, splat_value, vkey
    att = spec.att
    by_key = {vkey(op.results[0]): op for op in att.steps}
    x = by_key.get(att.x_key)
    while x is not None and x.name == "stablehlo.convert":  # converts keep -inf / huge fills
        x = by_key.get(vkey(x.operands[0]))
    if x is None or x.name != "stablehlo.select":
        return None
    pred, on_true, on_false = x.operands
    fill = splat_value(on_false)
    if fill is None:
        return None
    steps = {vkey(op.results[0]): op for op in att.steps}
    side_keys = {vkey(v) for v, _ in att.side_inputs}
    stack, seen = [pred], set()
    while stack:
        v = stack.pop()
        k = vkey(v)
        if k in seen:
            continue
        seen.add(k)
        if k in side_keys or k == att.s_key:
            return None
        op = steps.get(k)
        if op is None:
            if splat_value(v) is None:
                return None
            continue
        stack.extend(op.operands)
    return pred, fill   # iotas over other labels are rejected when the table is evaluated


@functools.lru_cache(maxsize=64)
def _skip_table_cached(spec: AttentionSpec, bq: int, bk: int):
    return _skip_table(spec, bq, bk)


def _skip_info(spec: AttentionSpec):
    sel = _x_select(spec)
    if sel is None or spec.seq_q * spec.seq_k > SKIP_TABLE_MAX:
        return None
    pred, fill = sel
    if not (fill == -math.inf or fill <= SKIP_FILL_LIMIT):
        return None
    return sel


def _skip_table(spec: AttentionSpec, bq: int, bk: int):
    """Static per-query-block key-block ranges [lo, hi) from a position-only mask, or None."""
    from hlofuse.passes.fuse_attention import vkey
    info = _skip_info(spec)
    if info is None:
        return None
    pred, fill = info
    sq, sk = spec.seq_q, spec.seq_k
    order = spec.order
    rank = len(order)

    def index(lab):
        shape = [1] * rank
        if lab == spec.sq:
            shape[rank - 2] = sq
            return np.arange(sq).reshape(shape)
        if lab == spec.key:
            shape[rank - 1] = sk
            return np.arange(sk).reshape(shape)
        raise EmitError("position mask depends on another label")

    consts = const_sides(spec)
    n_in = len(spec.att.side_inputs)
    with jax.ensure_compile_time_eval():
        s = jnp.zeros([1] * rank, F32)
        try:
            m = eval_logits(spec, s, [None] * n_in + consts, index, upto=vkey(pred))
        except EmitError:
            return None
        m = np.broadcast_to(np.asarray(m), [1] * (rank - 2) + [sq, sk]).reshape(sq, sk)
    if fill != -math.inf and not m.any(axis=1).all():
        return None    # a fully masked row must see every key's fill (uniform weights)
    nq, nk = -(-sq // bq), -(-sk // bk)
    padded = np.zeros((nq * bq, nk * bk), bool)
    padded[:sq, :sk] = m
    need = padded.reshape(nq, bq, nk, bk).any(axis=(1, 3))
    lo = np.where(need.any(1), need.argmax(1), 0).astype(np.int32)
    hi = np.where(need.any(1), nk - need[:, ::-1].argmax(1), 0).astype(np.int32)
    if (lo == 0).all() and (hi == nk).all():
        return None
    return lo, hi


# ---------------------------------------------------------------------------------------------
# cpu: loops
# ---------------------------------------------------------------------------------------------

def _online_update(spec, carry, x, vb, valid, pv_batch: int):
    """One online-softmax step on a logits block ``x`` [.., rows, bk] and values ``vb``."""
    att = spec.att
    m, l, acc = carry
    xf = x.astype(F32)
    if valid is not None:
        xf = jnp.where(valid, xf, -jnp.inf)
    m_new = jnp.maximum(m, jnp.max(xf, axis=-1))
    m_use = jnp.where(m_new == -jnp.inf, 0.0, m_new) if att.m_init == -math.inf else m_new
    alpha = jnp.exp(m - m_use)
    p = jnp.exp(xf - m_use[..., None])
    l = alpha * l + jnp.sum(p, axis=-1)
    pdt = hir.np_dtype(att.p_dtype)
    nb = pv_batch
    pv = lax.dot_general(p.astype(pdt), vb, (((p.ndim - 1,), (nb,)), (tuple(range(nb)), tuple(range(nb)))),
                         preferred_element_type=F32, precision=_lax_precision(att.precision[1]))
    acc = alpha[..., None] * acc + pv
    return m_new, l, acc


def _lax_precision(p: str):
    return {"HIGHEST": lax.Precision.HIGHEST, "HIGH": lax.Precision.HIGH}.get(p)


def _pad_to(x, axis: int, to: int):
    """Zero-pad ``axis`` of ``x`` to length ``to``."""
    n = x.shape[axis]
    if n == to:
        return x
    pad = [(0, 0)] * x.ndim
    pad[axis] = (0, to - n)
    return jnp.pad(x, pad)


def _pad_axis(x, axis: int, to: int, value=0):
    """Pad a side input along ``axis`` unless it broadcasts there (size 1)."""
    n = x.shape[axis]
    if n == to or n == 1:
        return x
    pad = [(0, 0)] * x.ndim
    pad[axis] = (0, to - n)
    return jnp.pad(x, pad, constant_values=value)


def build_cpu(spec: AttentionSpec, blocks: AttentionBlocks | None = None, *,
              fold_scale: bool = True, k_transposed: bool = CPU_K_TRANSPOSED):
    """The flash algorithm as XLA loops: ``lax.map`` over query chunks, ``fori_loop`` over
    key blocks; only the current logits block ``[batch.., rows.., bq, bk]`` is live.

    ``fold_scale``: apply a power-of-two logit scale to Q once (exact, see :func:`_prescale`).
    ``k_transposed``: keep K as ``[.., D, Sk]`` so QKᵀ is a plain (NN) matmul per block.
    """
    blocks = blocks or cpu_plan(spec)
    pre = _prescale(spec) if fold_scale else None
    att = spec.att
    bq, bk = blocks.bq, blocks.bk
    sq, sk = spec.seq_q, spec.seq_k
    nq, nk = -(-sq // bq), -(-sk // bk)
    nb = len(spec.batch)
    rank = len(spec.order)
    sq_ax, k_ax = rank - 2, rank - 1
    table = _skip_table_cached(spec, bq, bk)
    out_dtype = hir.np_dtype(att.out_dtype)
    qk_prec = _lax_precision(att.precision[0])
    sizes = spec.sizes

    def index_fn(c, j):
        def index(lab):
            shape = [1] * rank
            if lab == spec.sq:
                shape[sq_ax] = bq
                return (c * bq + jnp.arange(bq, dtype=jnp.int32)).reshape(shape)
            if lab == spec.key:
                shape[k_ax] = bk
                return (j * bk + jnp.arange(bk, dtype=jnp.int32)).reshape(shape)
            if att.repeat is not None and lab == att.repeat.label:
                return index(att.repeat.kv) * att.repeat.groups + index(att.repeat.g)
            ax = spec.order.index(lab)
            shape[ax] = sizes[lab]
            return jnp.arange(sizes[lab], dtype=jnp.int32).reshape(shape)
        return index

    def fn(*inputs):
        q, k, v, sides = canonical_inputs(spec, inputs)
        if pre is not None:
            q = q * jnp.asarray(pre[0], q.dtype)
        q = _pad_to(q, sq_ax, nq * bq)
        k = _pad_to(k, nb, nk * bk)
        v = _pad_to(v, nb, nk * bk)
        if k_transposed:
            k = jnp.swapaxes(k, -1, -2)                                  # [.., D, Skp]
        sides = [_pad_axis(_pad_axis(s, k_ax, nk * bk), sq_ax, nq * bq) for s in sides]
        acc_shape = list(q.shape[:-1]) + [v.shape[-1]]
        acc_shape[sq_ax] = bq

        def run_chunk(c):
            qc = lax.dynamic_slice_in_dim(q, c * bq, bq, axis=sq_ax) if nq > 1 else q
            sc = [lax.dynamic_slice_in_dim(s, c * bq, bq, axis=sq_ax) if nq > 1 and s.shape[sq_ax] > 1
                  else s for s in sides]

            def body(j, carry):
                k_axis = k.ndim - 1 if k_transposed else nb
                kb = lax.dynamic_slice_in_dim(k, j * bk, bk, axis=k_axis) if nk > 1 else k
                vb = lax.dynamic_slice_in_dim(v, j * bk, bk, axis=nb) if nk > 1 else v
                sb = [lax.dynamic_slice_in_dim(s, j * bk, bk, axis=k_ax) if nk > 1 and s.shape[k_ax] > 1
                      else s for s in sc]
                kc = nb if k_transposed else kb.ndim - 1
                s_blk = lax.dot_general(qc, kb, (((qc.ndim - 1,), (kc,)),
                                                 (tuple(range(nb)), tuple(range(nb)))),
                                        preferred_element_type=F32, precision=qk_prec)
                seed = None
                if pre is not None:
                    seed = {pre[1]: s_blk.astype(hir.np_dtype(_dtype_str(att.qk.results[0])))}
                x = eval_logits(spec, s_blk, sb, index_fn(c, j), seed=seed)
                x = jnp.broadcast_to(x, s_blk.shape)
                valid = None
                if nk * bk != sk:
                    valid = (j * bk + jnp.arange(bk, dtype=jnp.int32)) < sk
                return _online_update(spec, carry, x, vb, valid, nb)

            init = (jnp.full(acc_shape[:-1], att.m_init, F32), jnp.zeros(acc_shape[:-1], F32),
                    jnp.zeros(acc_shape, F32))
            if table is not None:
                lo, hi = jnp.asarray(table[0])[c], jnp.asarray(table[1])[c]
                m, l, acc = lax.fori_loop(lo, hi, body, init)
            elif nk == 1:
                m, l, acc = body(0, init)
            else:
                m, l, acc = lax.fori_loop(0, nk, body, init)
            return (acc / l[..., None]).astype(out_dtype)

        if nq == 1:
            o = run_chunk(0)
        else:
            o = lax.map(run_chunk, jnp.arange(nq, dtype=jnp.int32))     # [nq, .., bq, dv]
            o = jnp.moveaxis(o, 0, sq_ax)                                # [.., nq, bq, dv]
            o = o.reshape(o.shape[:sq_ax] + (nq * bq,) + o.shape[sq_ax + 2:])
        o = lax.slice_in_dim(o, 0, sq, axis=sq_ax)
        order_o = spec.batch + spec.rows_other + [spec.sq, "dv"]
        return (from_canonical(o, order_o, att.out_dims, spec.out_shape, att.repeat),)

    fn.kernel_name = f"hlofuse_attention_cpu_{spec.digest}"
    fn.blocks = f"cpu loops {blocks}" + (" +skip" if table is not None else "")
    return fn


# ---------------------------------------------------------------------------------------------
# Pallas: shared wrapper (flattened [N, G, Sq, D] layout)
# ---------------------------------------------------------------------------------------------

def _flatten_group(x, start: int, labels: list, sizes: dict):
    """Merge axes [start, start+len(labels)) into one; partial broadcasts are materialized."""
    n = len(labels)
    if n == 0:
        return jnp.expand_dims(x, start)
    dims = x.shape[start:start + n]
    full = [sizes[lab] for lab in labels]
    if all(d == 1 for d in dims):
        return x.reshape(x.shape[:start] + (1,) + x.shape[start + n:])
    if list(dims) != full:
        x = jnp.broadcast_to(x, x.shape[:start] + tuple(full) + x.shape[start + n:])
    return x.reshape(x.shape[:start] + (int(math.prod(full)),) + x.shape[start + n:])


def _pallas_inputs(spec: AttentionSpec, inputs, bq: int, bk: int, dpad: int | None):
    """q [N, G, Sqp, D], k/v [N, Skp, D], sides [N|1, G|1, Sqp|1, Skp|1] (bool -> int32)."""
    q, k, v, sides = canonical_inputs(spec, inputs)
    sizes = spec.sizes
    nbl, ngl = len(spec.batch), len(spec.rows_other)
    q = _flatten_group(_flatten_group(q, 0, spec.batch, sizes), 1, spec.rows_other, sizes)
    k = _flatten_group(k, 0, spec.batch, sizes)
    v = _flatten_group(v, 0, spec.batch, sizes)
    sides = [_flatten_group(_flatten_group(s, 0, spec.batch, sizes), 1, spec.rows_other, sizes)
             for s in sides]
    sqp = -(-spec.seq_q // bq) * bq
    skp = -(-spec.seq_k // bk) * bk
    q = _pad_to(q, 2, sqp)
    k = _pad_to(k, 1, skp)
    v = _pad_to(v, 1, skp)
    if dpad is not None:
        q = _pad_to(q, 3, max(dpad, q.shape[3]))
        k = _pad_to(k, 2, max(dpad, k.shape[2]))
    sides = [_pad_axis(_pad_axis(s, 3, skp), 2, sqp) for s in sides]
    sides = [s.astype(jnp.int32) if s.dtype == np.bool_ else s for s in sides]
    return q, k, v, sides


def _pallas_output(spec: AttentionSpec, o):
    """[N, G, Sqp, Dvp] -> the P·V result's shape."""
    sizes = spec.sizes
    o = o[:, :, :spec.seq_q, :spec.v_head_dim]
    shape = ([sizes[b] for b in spec.batch] + [sizes[r] for r in spec.rows_other]
             + [spec.seq_q, spec.v_head_dim])
    o = o.reshape(shape)
    order_o = spec.batch + spec.rows_other + [spec.sq, "dv"]
    return from_canonical(o, order_o, spec.att.out_dims, spec.out_shape, spec.att.repeat)


def _kernel_index(spec: AttentionSpec, n, g, q_pos, k_pos):
    """index(label) inside a Pallas kernel: program ids decode batch/group labels."""
    sizes = spec.sizes
    att = spec.att

    def decode(flat, labels, lab):
        stride = int(math.prod(sizes[x] for x in labels[labels.index(lab) + 1:]))
        return (flat // stride) % sizes[lab]

    def index(lab):
        if lab == spec.sq:
            return q_pos
        if lab == spec.key:
            return k_pos
        if att.repeat is not None and lab == att.repeat.label:
            return index(att.repeat.kv) * att.repeat.groups + index(att.repeat.g)
        if lab in spec.batch:
            return decode(n, spec.batch, lab)
        if lab in spec.rows_other:
            return decode(g, spec.rows_other, lab)
        raise EmitError(f"internal: unknown label {lab}")
    return index


def _side_block_spec_dims(s_shape, bq_block, bk_block):
    """Block dims for a [N|1, G|1, Sqp|1, Skp|1] side input."""
    return (None, None, bq_block if s_shape[2] > 1 else 1, bk_block if s_shape[3] > 1 else 1)


# ---------------------------------------------------------------------------------------------
# gpu: Triton
# ---------------------------------------------------------------------------------------------

def attention_kernel_gpu(q_ref, k_ref, v_ref, lo_ref, hi_ref, *refs, spec: AttentionSpec,
                         bq: int, bk: int, n_side: int, side_full_k: tuple):
    """Triton body: one (batch, group, query block) program, loop over key blocks."""
    side_refs, o_ref = refs[:n_side], refs[n_side]
    att = spec.att
    n, g, i = pl.program_id(0), pl.program_id(1), pl.program_id(2)
    q = q_ref[...]
    q_pos = i * bq + lax.broadcasted_iota(jnp.int32, (bq, bk), 0)
    lo, hi = lo_ref[i], hi_ref[i]
    dv = v_ref.shape[-1]

    def body(j, carry):
        kb = k_ref[pl.ds(j * bk, bk), :]
        vb = v_ref[pl.ds(j * bk, bk), :]
        s = jnp.dot(q, kb.T, preferred_element_type=F32)
        k_pos = j * bk + lax.broadcasted_iota(jnp.int32, (bq, bk), 1)
        sb = [r[:, pl.ds(j * bk, bk)] if full else r[...] for r, full in zip(side_refs, side_full_k)]
        x = eval_logits(spec, s, sb, _kernel_index(spec, n, g, q_pos, k_pos), upcast_half=True)
        x = jnp.broadcast_to(x, (bq, bk))
        return _online_update_2d(att, carry, x, vb, k_pos < spec.seq_k)

    init = (jnp.full((bq,), att.m_init, F32), jnp.zeros((bq,), F32), jnp.zeros((bq, dv), F32))
    m, l, acc = lax.fori_loop(lo, hi, body, init)
    o_ref[...] = (acc / l[:, None]).astype(o_ref.dtype)


def _online_update_2d(att, carry, x, vb, valid):
    m, l, acc = carry
    xf = jnp.where(valid, x.astype(F32), -jnp.inf)
    m_new = jnp.maximum(m, jnp.max(xf, axis=1))
    m_use = jnp.where(m_new == -jnp.inf, 0.0, m_new) if att.m_init == -math.inf else m_new
    alpha = jnp.exp(m - m_use)
    p = jnp.exp(xf - m_use[:, None])
    l = alpha * l + jnp.sum(p, axis=1)
    pv = jnp.dot(p.astype(vb.dtype), vb, preferred_element_type=F32)
    return m_new, l, alpha[:, None] * acc + pv


def _ranges(spec: AttentionSpec, bq: int, bk: int, pad_to: int | None = None):
    nq, nk = -(-spec.seq_q // bq), -(-spec.seq_k // bk)
    table = _skip_table_cached(spec, bq, bk)
    lo, hi = (table if table is not None else (np.zeros(nq, np.int32), np.full(nq, nk, np.int32)))
    if pad_to:
        lo = np.pad(lo, (0, pad_to - nq))
        hi = np.pad(hi, (0, pad_to - nq))
    return lo, hi, table is not None


def build_gpu(spec: AttentionSpec, blocks: AttentionBlocks | None = None, *, interpret=None,
              name: str | None = None):
    blocks = blocks or gpu_blocks(spec)
    bq, bk = blocks.bq, blocks.bk
    dpad = max(16, _pow2(spec.head_dim))
    dvp = max(16, _pow2(spec.v_head_dim))
    nq = -(-spec.seq_q // bq)
    lo, hi, skipping = _ranges(spec, bq, bk, pad_to=_pow2(nq))
    name = name or f"hlofuse_attention_{spec.digest}"
    n_side = len(spec.att.all_sides)

    def fn(*inputs):
        q, k, v, sides = _pallas_inputs(spec, inputs, bq, bk, dpad)
        v = _pad_to(v, 2, max(dvp, v.shape[2]))
        N, G, sqp, _ = q.shape
        skp = k.shape[1]
        full_k = tuple(s.shape[3] > 1 for s in sides)
        side_specs = []
        for s in sides:
            bdims = (None, None, bq if s.shape[2] > 1 else 1, skp if s.shape[3] > 1 else 1)
            side_specs.append(pl.BlockSpec(bdims, functools.partial(
                _side_index, nb=s.shape[0] > 1, ng=s.shape[1] > 1, nq=s.shape[2] > 1)))
        kernel = functools.partial(attention_kernel_gpu, spec=spec, bq=bq, bk=bk, n_side=n_side,
                                   side_full_k=full_k)
        from jax.experimental.pallas import triton as pltriton
        call = pl.pallas_call(
            kernel,
            out_shape=jax.ShapeDtypeStruct((N, G, sqp, dvp), hir.np_dtype(spec.att.out_dtype)),
            grid=(N, G, nq),
            in_specs=[pl.BlockSpec((None, None, bq, dpad), lambda n, g, i: (n, g, i, 0)),
                      pl.BlockSpec((None, skp, dpad), lambda n, g, i: (n, 0, 0)),
                      pl.BlockSpec((None, skp, dvp), lambda n, g, i: (n, 0, 0)),
                      pl.BlockSpec((lo.shape[0],), lambda n, g, i: (0,)),
                      pl.BlockSpec((hi.shape[0],), lambda n, g, i: (0,))] + side_specs,
            out_specs=pl.BlockSpec((None, None, bq, dvp), lambda n, g, i: (n, g, i, 0)),
            compiler_params=None if interpret else pltriton.CompilerParams(
                num_warps=blocks.num_warps, num_stages=blocks.num_stages),
            interpret=interpret or False,
            name=name,
        )
        o = call(q, k, v, jnp.asarray(lo), jnp.asarray(hi), *sides)
        return (_pallas_output(spec, o),)

    fn.kernel_name = name
    fn.blocks = f"triton {blocks}" + (" +skip" if skipping else "")
    return fn


def _side_index(n, g, i, *rest, nb: bool, ng: bool, nq: bool):
    return (n if nb else 0, g if ng else 0, i if nq else 0, 0)


# ---------------------------------------------------------------------------------------------
# tpu: Mosaic
# ---------------------------------------------------------------------------------------------

LANES = 128


def attention_kernel_tpu(lo_ref, hi_ref, q_ref, k_ref, v_ref, *refs, spec: AttentionSpec,
                         bq: int, bk: int, nk: int, n_side: int):
    """Mosaic body: one (batch, group, query block, key block) step; scratch accumulators."""
    side_refs = refs[:n_side]
    o_ref, m_sc, l_sc, acc_sc = refs[n_side:]
    att = spec.att
    n, g, i, j = pl.program_id(0), pl.program_id(1), pl.program_id(2), pl.program_id(3)

    @pl.when(j == 0)
    def _init():
        m_sc[...] = jnp.full(m_sc.shape, att.m_init, F32)
        l_sc[...] = jnp.zeros(l_sc.shape, F32)
        acc_sc[...] = jnp.zeros(acc_sc.shape, F32)

    @pl.when((j >= lo_ref[i]) & (j < hi_ref[i]))
    def _step():
        q = q_ref[...]
        kb = k_ref[...]
        vb = v_ref[...]
        s = lax.dot_general(q, kb, (((1,), (1,)), ((), ())), preferred_element_type=F32)
        q_pos = i * bq + lax.broadcasted_iota(jnp.int32, (bq, bk), 0)
        k_pos = j * bk + lax.broadcasted_iota(jnp.int32, (bq, bk), 1)
        sb = [r[...] for r in side_refs]
        x = eval_logits(spec, s, sb, _kernel_index(spec, n, g, q_pos, k_pos))
        xf = jnp.where(k_pos < spec.seq_k, jnp.broadcast_to(x, (bq, bk)).astype(F32), -jnp.inf)
        m_prev = m_sc[...]                                      # (bq, LANES), lanes equal
        m_cur = jnp.max(xf, axis=1, keepdims=True)              # (bq, 1)
        m_new = jnp.maximum(m_prev, m_cur)
        m_use = jnp.where(m_new == -jnp.inf, 0.0, m_new) if att.m_init == -math.inf else m_new
        alpha = jnp.exp(m_prev - m_use)
        p = jnp.exp(xf - m_use[:, :1])
        l_sc[...] = alpha * l_sc[...] + jnp.sum(p, axis=1, keepdims=True)
        pv = jnp.dot(p.astype(vb.dtype), vb, preferred_element_type=F32)
        acc_sc[...] = alpha[:, :1] * acc_sc[...] + pv
        m_sc[...] = m_new

    @pl.when(j == nk - 1)
    def _done():
        o_ref[...] = (acc_sc[...] / l_sc[...][:, :1]).astype(o_ref.dtype)


def build_tpu(spec: AttentionSpec, blocks: AttentionBlocks | None = None, *, interpret=None,
              name: str | None = None):
    from jax.experimental.pallas import tpu as pltpu
    blocks = blocks or tpu_blocks(spec)
    bq, bk = blocks.bq, blocks.bk
    nq, nk = -(-spec.seq_q // bq), -(-spec.seq_k // bk)
    lo, hi, skipping = _ranges(spec, bq, bk)
    name = name or f"hlofuse_attention_{spec.digest}"
    n_side = len(spec.att.all_sides)

    def fn(*inputs):
        q, k, v, sides = _pallas_inputs(spec, inputs, bq, bk, None)
        N, G, sqp, d = q.shape
        dv = v.shape[2]

        def kv_index(n, g, i, j, lo_ref, hi_ref):
            # clamp into the visited range so skipped steps re-use the resident block (no DMA)
            jj = jnp.minimum(jnp.maximum(j, lo_ref[i]), jnp.maximum(hi_ref[i] - 1, lo_ref[i]))
            return (n, jj, 0)

        side_specs = []
        for s in sides:
            bdims = (None, None, bq if s.shape[2] > 1 else 1, bk if s.shape[3] > 1 else 1)
            side_specs.append(pl.BlockSpec(bdims, functools.partial(
                _side_index_tpu, nb=s.shape[0] > 1, ng=s.shape[1] > 1, nq=s.shape[2] > 1,
                nkk=s.shape[3] > 1)))
        grid_spec = pltpu.PrefetchScalarGridSpec(
            num_scalar_prefetch=2,
            grid=(N, G, nq, nk),
            in_specs=[pl.BlockSpec((None, None, bq, d), lambda n, g, i, j, lo_r, hi_r: (n, g, i, 0)),
                      pl.BlockSpec((None, bk, d), kv_index),
                      pl.BlockSpec((None, bk, dv), kv_index)] + side_specs,
            out_specs=pl.BlockSpec((None, None, bq, dv), lambda n, g, i, j, lo_r, hi_r: (n, g, i, 0)),
            scratch_shapes=[pltpu.VMEM((bq, LANES), F32), pltpu.VMEM((bq, LANES), F32),
                            pltpu.VMEM((bq, dv), F32)])
        kernel = functools.partial(attention_kernel_tpu, spec=spec, bq=bq, bk=bk, nk=nk, n_side=n_side)
        call = pl.pallas_call(
            kernel,
            out_shape=jax.ShapeDtypeStruct((N, G, sqp, dv), hir.np_dtype(spec.att.out_dtype)),
            grid_spec=grid_spec,
            compiler_params=None if interpret else pltpu.CompilerParams(
                dimension_semantics=("parallel", "parallel", "parallel", "arbitrary")),
            interpret=interpret or False,
            name=name,
        )
        o = call(jnp.asarray(lo), jnp.asarray(hi), q, k, v, *sides)
        return (_pallas_output(spec, o),)

    fn.kernel_name = name
    fn.blocks = f"mosaic {blocks}" + (" +skip" if skipping else "")
    return fn


def _side_index_tpu(n, g, i, j, lo_r, hi_r, *, nb: bool, ng: bool, nq: bool, nkk: bool):
    return (n if nb else 0, g if ng else 0, i if nq else 0, j if nkk else 0)


# ---------------------------------------------------------------------------------------------
# Entry points
# ---------------------------------------------------------------------------------------------

def build_attention(spec: AttentionSpec, target: str, *, interpret=None,
                    blocks: AttentionBlocks | None = None, name: str | None = None):
    """The region as a JAX function ``f(*inputs) -> (output,)``.

    cpu: the loop implementation (:func:`build_cpu`). gpu / tpu: the Pallas kernel for that
    target; with ``interpret=True`` (gpu) or a ``pltpu.InterpretParams`` (tpu) it runs on CPU
    in Pallas interpret mode for verification.
    """
    if target == "cpu":
        if interpret is not None:
            raise ValueError("the cpu attention path is plain JAX; interpret the gpu/tpu kernels")
        return build_cpu(spec, blocks)
    if target == "gpu":
        return build_gpu(spec, blocks, interpret=interpret, name=name)
    if target == "tpu":
        if spec.att.x_dtype == "f16" or any(np.dtype(d) == np.float16 for d in spec.in_dtypes):
            raise EmitError("f16 is not supported by the TPU kernel")
        return build_tpu(spec, blocks, interpret=interpret, name=name)
    raise ValueError(f"unknown target {target!r}")


def attention_reference(spec: AttentionSpec):
    """Plain jnp, the whole logits at once, the softmax written as the original's arithmetic
    (max with the original init, exp(x - max), sum, divide)."""
    att = spec.att
    rank = len(spec.order)
    sizes = spec.sizes
    nb = len(spec.batch)

    def index(lab):
        if att.repeat is not None and lab == att.repeat.label:
            return index(att.repeat.kv) * att.repeat.groups + index(att.repeat.g)
        ax = spec.order.index(lab)
        shape = [1] * rank
        shape[ax] = sizes[lab]
        return jnp.arange(sizes[lab], dtype=jnp.int32).reshape(shape)

    def ref(*inputs):
        q, k, v, sides = canonical_inputs(spec, inputs)
        s = lax.dot_general(q, k, (((q.ndim - 1,), (k.ndim - 1,)), (tuple(range(nb)),) * 2),
                            preferred_element_type=F32)
        x = jnp.broadcast_to(eval_logits(spec, s, sides, index), s.shape)
        m = jnp.maximum(jnp.max(x, axis=-1, keepdims=True), jnp.asarray(att.m_init, x.dtype))
        e = jnp.exp(x - m)
        p = (e / jnp.sum(e.astype(F32), axis=-1, keepdims=True).astype(e.dtype))
        o = lax.dot_general(p.astype(hir.np_dtype(att.p_dtype)), v,
                            (((p.ndim - 1,), (nb,)), (tuple(range(nb)),) * 2), preferred_element_type=F32)
        order_o = spec.batch + spec.rows_other + [spec.sq, "dv"]
        return (from_canonical(o.astype(hir.np_dtype(att.out_dtype)), order_o, att.out_dims,
                               spec.out_shape, att.repeat),)
    return ref
