"""The plain-jnp reference: the whole logits at once, the softmax as the original's arithmetic."""

from __future__ import annotations

import jax.numpy as jnp
from jax import lax

from hlofuse.core import ir as hir
from hlofuse.kernels.attention.layout import canonical_inputs, output
from hlofuse.kernels.attention.logits import F32, eval_logits
from hlofuse.kernels.attention.spec import AttentionSpec

__all__ = ["attention_reference"]


def attention_reference(spec: AttentionSpec):
    """``f(*inputs) -> (output,)``: max with the original init, exp(x - max), sum, divide."""
    rank = len(spec.order)
    sizes = spec.sizes
    nb = len(spec.batch)
    rep = spec.repeat

    def index(lab):
        if rep is not None and lab == rep.label:
            return index(rep.kv) * rep.groups + index(rep.g)
        ax = spec.order.index(lab)
        shape = [1] * rank
        shape[ax] = sizes[lab]
        return jnp.arange(sizes[lab], dtype=jnp.int32).reshape(shape)

    def ref(*inputs):
        q, k, v, sides = canonical_inputs(spec, inputs)
        s = lax.dot_general(q, k, (((q.ndim - 1,), (k.ndim - 1,)), (tuple(range(nb)),) * 2),
                            preferred_element_type=F32)
        x = jnp.broadcast_to(eval_logits(spec, s, sides, index), s.shape)
        m = jnp.maximum(jnp.max(x, axis=-1, keepdims=True), jnp.asarray(spec.m_init, x.dtype))
        e = jnp.exp(x - m)
        p = (e / jnp.sum(e.astype(F32), axis=-1, keepdims=True).astype(e.dtype))
        o = lax.dot_general(p.astype(hir.np_dtype(spec.p_dtype)), v,
                            (((p.ndim - 1,), (nb,)), (tuple(range(nb)),) * 2), preferred_element_type=F32)
        return (output(spec, o.astype(hir.np_dtype(spec.out_dtype))),)
    return ref
