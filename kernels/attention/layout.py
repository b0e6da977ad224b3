"""Canonical layout, outside the kernel: every execution sees one label order.

Q, K, V and the side inputs (masks, biases) are transposed/reshaped into ``batch..., other
rows..., Sq, Sk`` for the logits, with ``D``/``Dv`` last for Q/K/V. GQA: K/V carry the kv-head
label, Q's head is split into (kv head, group) and the group joins the rows, so K/V are never
repeated. Side inputs keep size-1 dims where they broadcast, so a ``[B, 1, 1, Sk]`` padding mask
stays that small. The Pallas kernels further flatten to ``[N, G, Sq, D]`` (:func:`pallas_inputs`).
"""

from __future__ import annotations

import math
from typing import Sequence

import numpy as np

import jax.numpy as jnp

from hlofuse.core.ops import EmitError
from hlofuse.kernels.attention.logits import const_arrays
from hlofuse.kernels.attention.spec import AttentionSpec

__all__ = ["to_canonical", "from_canonical", "output", "canonical_inputs", "const_sides", "pad_to",
           "pad_axis", "pallas_inputs", "pallas_output", "pallas_index"]


def _split_repeat(x, dims, repeat):
    dims = list(dims)
    if repeat is None or repeat.label not in dims:
        return x, dims
    i = dims.index(repeat.label)
    shape = list(x.shape)
    shape[i:i + 1] = [shape[i] // repeat.groups, repeat.groups]
    dims[i:i + 1] = [repeat.kv, repeat.g]
    return x.reshape(shape), dims


def to_canonical(x, dims, order: Sequence[str], repeat=None, xp=jnp):
    """Transpose/reshape ``x`` (per-dim labels ``dims``) to ``order``, size 1 where absent.
    ``xp``: the array module (numpy for static constants: no XLA compile).

    One transpose of the whole array (the unlabeled size-1 dims moved last), then one reshape
    that only drops/inserts size-1 dims: XLA:CPU makes that a single copy pass into the
    row-major layout the loops read. A reshape *before* the transpose (dropping the size-1
    dims first) made it two passes (a layout-preserving copy, then the transposing copy into
    the while loop's row-major operand), seen in the compiled HLO of ``bench/attention_cpu``'s
    B=1 inputs. With Kᵀ also built by one transpose (``canonical_inputs(k_transposed=True)``),
    the cpu forward at S=4096 ran 0.89x of its time before (interleaved A/B in one process, 12
    rounds, load ~3: ratio to jax.jit 0.331 -> 0.281)."""
    x, dims = _split_repeat(xp.asarray(x), dims, repeat)
    labs = [d for d in dims if d is not None]
    for lab in labs:
        if lab not in order:
            raise EmitError(f"internal: label {lab} not in the canonical order {order}")
    present = [lab for lab in order if lab in labs]
    perm = [dims.index(lab) for lab in present] + [i for i, d in enumerate(dims) if d is None]
    if perm != list(range(len(dims))):
        x = xp.transpose(x, perm)
    return x.reshape([x.shape[present.index(lab)] if lab in labs else 1 for lab in order])


def from_canonical(o, order: Sequence[str], out_dims, out_shape, repeat=None):
    """Inverse of :func:`to_canonical` for the output (labels of ``o`` are ``order``): one
    transpose (the labels the output lacks, size 1, moved last), then one reshape."""
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
    perm = [order.index(lab) for lab in tgt] + drop
    if perm != list(range(o.ndim)):
        o = jnp.transpose(o, perm)
    return o.reshape(out_shape)


def output(spec: AttentionSpec, o):
    """The canonical output ``[batch.., rows.., Sq, Dv]`` in the P·V result's layout."""
    return from_canonical(o, spec.out_order, spec.out_dims, spec.out_shape, spec.repeat)


def canonical_inputs(spec: AttentionSpec, inputs: Sequence, *, k_transposed: bool = False) -> tuple:
    """(q [B.., R.., Sq, D], k [B.., Sk, D], v [B.., Sk, Dv], sides aligned to the logits).
    ``k_transposed``: k as ``[B.., D, Sk]`` (Kᵀ straight from the input in one transpose, not
    the canonical K transposed again: one copy pass instead of two)."""
    rep = spec.repeat
    q = to_canonical(inputs[spec.q_arg], spec.q_dims, spec.batch + spec.rows_other + [spec.sq, "d"], rep)
    k_order = [spec.key, "d"] if not k_transposed else ["d", spec.key]
    k = to_canonical(inputs[spec.k_arg], spec.k_dims, spec.batch + k_order, rep)
    v = to_canonical(inputs[spec.v_arg], spec.v_dims, spec.batch + [spec.key, "dv"], rep)
    sides = [to_canonical(inputs[i], dims, spec.order, rep) for i, dims in spec.side_args]
    return q, k, v, sides + const_sides(spec)


def const_sides(spec: AttentionSpec) -> list:
    """The region's dense constants, aligned to the logits (numpy, static: reshapes and
    transposes move the same bits as jax would, without a compile per op)."""
    return [np.asarray(to_canonical(np.asarray(a), dims, spec.order, spec.repeat, xp=np))
            for a, (_, dims) in zip(const_arrays(spec), spec.const_sides)]


def pad_to(x, axis: int, to: int):
    """Zero-pad ``axis`` of ``x`` to length ``to``."""
    n = x.shape[axis]
    if n == to:
        return x
    pad = [(0, 0)] * x.ndim
    pad[axis] = (0, to - n)
    return jnp.pad(x, pad)


def pad_axis(x, axis: int, to: int, value=0):
    """Pad a side input along ``axis`` unless it broadcasts there (size 1)."""
    n = x.shape[axis]
    if n == to or n == 1:
        return x
    pad = [(0, 0)] * x.ndim
    pad[axis] = (0, to - n)
    return jnp.pad(x, pad, constant_values=value)


# ---------------------------------------------------------------------------------------------
# Pallas: the flattened [N, G, Sq, D] layout
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


def pallas_inputs(spec: AttentionSpec, inputs, bq: int, bk: int, dpad: int | None):
    """q [N, G, Sqp, D], k/v [N, Skp, D], sides [N|1, G|1, Sqp|1, Skp|1] (bool -> int32)."""
    q, k, v, sides = canonical_inputs(spec, inputs)
    sizes = spec.sizes
    q = _flatten_group(_flatten_group(q, 0, spec.batch, sizes), 1, spec.rows_other, sizes)
    k = _flatten_group(k, 0, spec.batch, sizes)
    v = _flatten_group(v, 0, spec.batch, sizes)
    sides = [_flatten_group(_flatten_group(s, 0, spec.batch, sizes), 1, spec.rows_other, sizes)
             for s in sides]
    sqp = -(-spec.seq_q // bq) * bq
    skp = -(-spec.seq_k // bk) * bk
    q = pad_to(q, 2, sqp)
    k = pad_to(k, 1, skp)
    v = pad_to(v, 1, skp)
    if dpad is not None:
        q = pad_to(q, 3, max(dpad, q.shape[3]))
        k = pad_to(k, 2, max(dpad, k.shape[2]))
    sides = [pad_axis(pad_axis(s, 3, skp), 2, sqp) for s in sides]
    sides = [s.astype(jnp.int32) if s.dtype == np.bool_ else s for s in sides]
    return q, k, v, sides


def pallas_output(spec: AttentionSpec, o):
    """[N, G, Sqp, Dvp] -> the P·V result's shape."""
    sizes = spec.sizes
    o = o[:, :, :spec.seq_q, :spec.v_head_dim]
    shape = ([sizes[b] for b in spec.batch] + [sizes[r] for r in spec.rows_other]
             + [spec.seq_q, spec.v_head_dim])
    return output(spec, o.reshape(shape))


def pallas_index(spec: AttentionSpec, n, g, q_pos, k_pos):
    """index(label) inside a Pallas kernel: program ids decode batch/group labels."""
    sizes = spec.sizes
    rep = spec.repeat

    def decode(flat, labels, lab):
        stride = int(math.prod(sizes[x] for x in labels[labels.index(lab) + 1:]))
        return (flat // stride) % sizes[lab]

    def index(lab):
        if lab == spec.sq:
            return q_pos
        if lab == spec.key:
            return k_pos
        if rep is not None and lab == rep.label:
            return index(rep.kv) * rep.groups + index(rep.g)
        if lab in spec.batch:
            return decode(n, spec.batch, lab)
        if lab in spec.rows_other:
            return decode(g, spec.rows_other, lab)
        raise EmitError(f"internal: unknown label {lab}")
    return index
