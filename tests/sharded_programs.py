"""Sharded test programs (issue 16): data parallel, FSDP-style, Megatron-style tensor-parallel MLP
and transformer block (attention heads sharded), and a 2-D mesh; each as a forward and a
training step. Used by ``tests/test_sharded.py`` (8 CPU devices, in a child process run by
:func:`run_json_child`) and by the deviceless compile for an 8-GPU topology and a TPU v5e 2x2
slice (``tests/test_aot.py``).

A tensor-parallel MLP with replicated biases checks that a replicated region input is read as
a local slice. A GQA decode step (batch and KV heads sharded) checks ``fold-dot-repeats`` on a 2-D mesh.

A case is ``(name, fn, shapes, specs, mesh_shape)``: ``specs`` are PartitionSpec tuples over the
mesh axes ``("data", "model")``; ``mesh_shape`` is (data, model).
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys

import numpy as np

import jax
import jax.numpy as jnp


def run_json_child(code: str, timeout: float = 900):
    """Run ``code`` in a fresh Python (its own CPU device count: fixed when jax starts; cpu only,
    autotune off) and return the JSON of its last stdout line."""
    env = dict(os.environ, JAX_PLATFORMS="cpu", HLOFUSE_AUTOTUNE="off")
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env,
                       timeout=timeout)
    assert r.returncode == 0, r.stderr[-4000:]
    return json.loads(r.stdout.strip().splitlines()[-1])


COLLECTIVES = ("all-gather", "all-reduce", "collective-permute", "all-to-all", "reduce-scatter")


def collectives(hlo_text: str) -> dict[str, int]:
    """Collective ops of each kind in compiled HLO text (async pairs counted once), the
    tuple-shaped ones XLA's combiners make too (``%all-reduce.9 = (f32[64]{0}, f32[32]{0})
    all-reduce(...)``; layouts may hold parentheses: ``{1,0:T(8,128)}``)."""
    shape = r"(?:\((?:[^()]|\([^()]*\))*\)|\S+)"
    return {c: len(re.findall(r"= " + shape + " " + c + r"(?:-start)?\(", hlo_text))
            for c in COLLECTIVES}


def agreement(want, got) -> dict:
    """How ``got`` (hlofuse.jit's outputs) agrees with ``want`` (jax.jit's): ``err``, the largest
    ``|want - got| / (1 + |want|)`` over the leaves, and ``same_sharding``, every leaf's
    sharding equivalent to jax.jit's."""
    pairs = list(zip(jax.tree.leaves(want), jax.tree.leaves(got)))
    return {"err": max(float(np.max(np.abs(np.asarray(a) - np.asarray(b)) / (1.0 + np.abs(np.asarray(a)))))
                       for a, b in pairs),
            "same_sharding": all(a.sharding.is_equivalent_to(b.sharding, a.ndim) for a, b in pairs)}


def _ln(x):
    m = x.mean(-1, keepdims=True)
    v = ((x - m) ** 2).mean(-1, keepdims=True)
    return (x - m) * jax.lax.rsqrt(v + 1e-5)


def mlp(x, w1, w2):
    return jax.nn.gelu(_ln(x) @ w1) @ w2 + x


def mlp_bias(x, w1, b1, w2, b2):
    """Megatron's MLP with the biases replicated (as ``nnx.with_partitioning`` leaves them when
    only the kernels are annotated): the column-parallel epilogue reads its shard of ``b1``."""
    return jax.nn.gelu(_ln(x) @ w1 + b1) @ w2 + b2 + x


def block(x, wqkv, wo, w1, w2, heads_dim=8):
    h = _ln(x)
    qkv = jnp.einsum("bsd,dthk->tbshk", h, wqkv)
    q, k, v = qkv[0], qkv[1], qkv[2]
    s = jnp.einsum("bqhk,bshk->bhqs", q, k) / np.sqrt(q.shape[-1])
    a = jnp.einsum("bhqs,bshk->bqhk", jax.nn.softmax(s, -1), v)
    x = x + jnp.einsum("bqhk,hkd->bqd", a, wo)
    return x + jax.nn.gelu(_ln(x) @ w1) @ w2


def cnn(x, w1, w2):
    """Two 3x3 convolutions (NHWC) with a ReLU between (on cpu: Winograd kernels per shard)."""
    dn = ("NHWC", "HWIO", "NHWC")
    h = jax.nn.relu(jax.lax.conv_general_dilated(x, w1, (1, 1), "SAME", dimension_numbers=dn))
    return jax.lax.conv_general_dilated(h, w2, (1, 1), "SAME", dimension_numbers=dn)


def scanned(x, wqkv, wo):
    """Two causal attention layers run by ``lax.scan`` over stacked weights, each under
    ``jax.checkpoint`` (remat): the causal mask is hoisted out of the loops by jax and generated
    in them again by ``sink-loop-generators``; the attention runs per shard in the loop bodies
    (in the step, the backward loop's flash forward and backward too)."""
    def layer(h, w):
        wq, wo_ = w
        qkv = jnp.einsum("bsd,dthk->tbshk", _ln(h), wq)
        a = jax.nn.dot_product_attention(qkv[0], qkv[1], qkv[2], is_causal=True)
        return h + jnp.einsum("bqhk,hkd->bqd", a, wo_), None
    return jax.lax.scan(jax.checkpoint(layer), x, (wqkv, wo))[0]


def scanned_noremat(x, wqkv, wo):
    """:func:`scanned` without ``jax.checkpoint``: in the step the forward loop saves the
    probabilities for the backward loop, where ``remat-loop-attention`` recomputes them (the
    copies get their shardings from ``propagate-shardings``)."""
    def layer(h, w):
        wq, wo_ = w
        qkv = jnp.einsum("bsd,dthk->tbshk", _ln(h), wq)
        a = jax.nn.dot_product_attention(qkv[0], qkv[1], qkv[2], is_causal=True)
        return h + jnp.einsum("bqhk,hkd->bqd", a, wo_), None
    return jax.lax.scan(layer, x, (wqkv, wo))[0]


def gqa_decode(q, k, v):
    """One decode step of grouped-query attention over a KV cache (``jnp.repeat`` of K/V to
    the query heads; one query row): ``fold-dot-repeats`` reads K/V unrepeated, heads sharded."""
    g = q.shape[2] // k.shape[2]
    s = jnp.einsum("bqhd,bkhd->bhqk", q, jnp.repeat(k, g, axis=2)) / np.sqrt(q.shape[-1])
    return jnp.einsum("bhqk,bkhd->bqhd", jax.nn.softmax(s, -1), jnp.repeat(v, g, axis=2))


def make_fsdp(mesh):
    """Parameters stored sharded over "data" and gathered for use. (A NamedSharding, not a bare
    PartitionSpec: hlofuse traces the function outside the caller's ``jax.set_mesh``.)"""
    rep = jax.sharding.NamedSharding(mesh, jax.sharding.PartitionSpec())

    def fsdp(x, w1, w2):
        w1 = jax.lax.with_sharding_constraint(w1, rep)
        w2 = jax.lax.with_sharding_constraint(w2, rep)
        return mlp(x, w1, w2)
    return fsdp


def make_shard_map_mlp(mesh):
    """A Megatron MLP written per device with ``shard_map`` (its body is what hlofuse fuses)."""
    P = jax.sharding.PartitionSpec

    def body(x, w1, w2):
        return jax.lax.psum(jax.nn.gelu(_ln(x) @ w1) @ w2, "model") + x

    def shard_map_mlp(x, w1, w2):
        return jax.shard_map(body, mesh=mesh, in_specs=(P("data"), P(None, "model"), P("model")),
                             out_specs=P("data"))(x, w1, w2)
    return shard_map_mlp


def step(fn):
    """A training step: loss and gradients of the parameters (all arguments but the first)."""
    def train(x, *params):
        def loss(ps):
            return jnp.mean(fn(x, *ps) ** 2)
        value, grads = jax.value_and_grad(loss)(params)
        return value, grads
    train.__name__ = f"train_{fn.__name__}"
    return train


def cases(make_mesh, scale: int = 1):
    """The test set; ``make_mesh((data, model))`` gives the mesh a case runs on; ``scale``
    multiplies the widths (1: CPU tests, larger for GPU/TPU)."""
    P = jax.sharding.PartitionSpec
    D, F, H, HD, B, S = 32 * scale, 64 * scale, 8, 4 * scale, 8, 16
    out = [
        ("data_parallel", mlp, [(B, S, D), (D, F), (F, D)], [P("data"), P(), P()], (8, 1)),
        ("fsdp", make_fsdp(make_mesh((8, 1))), [(B, S, D), (D, F), (F, D)], [P("data"), P("data"), P("data")], (8, 1)),
        ("tp_mlp", mlp, [(B, S, D), (D, F), (F, D)], [P(), P(None, "model"), P("model")], (1, 8)),
        ("tp_mlp_bias", mlp_bias, [(B, S, D), (D, F), (F,), (F, D), (D,)],
         [P(), P(None, "model"), P(), P("model"), P()], (1, 8)),
        ("tp_block", block, [(B, S, D), (D, 3, H, HD), (H, HD, D), (D, F), (F, D)],
         [P(), P(None, None, "model"), P("model"), P(None, "model"), P("model")], (1, 8)),
        ("mesh_2d", block, [(B, S, D), (D, 3, H, HD), (H, HD, D), (D, F), (F, D)],
         [P("data"), P(None, None, "model"), P("model"), P(None, "model"), P("model")], (2, 4)),
        ("data_parallel_cnn", cnn, [(B, 8, 8, 16), (3, 3, 16, 16), (3, 3, 16, 16)],
         [P("data"), P(), P()], (8, 1)),
        ("data_parallel_scan", scanned, [(B, S, D), (2, D, 3, H, HD), (2, H, HD, D)],
         [P("data"), P(), P()], (8, 1)),
        ("gqa_decode", gqa_decode, [(B, 1, H, HD), (B, S, 4, HD), (B, S, 4, HD)],
         [P("data", None, "model")] * 3, (2, 4)),
    ]
    out.append(("shard_map_mlp", make_shard_map_mlp(make_mesh((2, 4))), [(B, S, D), (D, F), (F, D)],
                [P("data"), P(None, "model"), P("model")], (2, 4)))
    # (its forward is the scanned forward above: only the step)
    scan_nr = ("mesh_2d_scan_noremat_train", step(scanned_noremat),
               [(B, S, D), (2, D, 3, H, HD), (2, H, HD, D)],
               [P("data"), P(None, None, None, "model"), P(None, "model")], (2, 4))
    return out + [(f"{n}_train", step(f), sh, sp, m) for n, f, sh, sp, m in out] + [scan_nr]
