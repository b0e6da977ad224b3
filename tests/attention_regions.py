"""Attention regions for the kernel tests: an attention function through ``fuse-attention``,
its outlined region as a module of its own (the ground truth, compiled by XLA alone) and its
spec. Shared by ``tests/kernels/test_attention.py`` and ``test_attention_short.py`` (a helper,
not a test module)."""

from __future__ import annotations

import math
import re

import numpy as np

import jax
import jax.numpy as jnp

import hlofuse
from hlofuse.core import ir as hir
from hlofuse.kernels import attention as A
from hlofuse.runtime.testing import random_inputs
from tests.attention_programs import BF16, make_args, make_attention

_KEEP = []  # modules whose ops a spec refers to


def region_of(f, args):
    """(spec, region module text, region input arrays) for the single attention in ``f``."""
    exp = jax.export.export(jax.jit(f), platforms=["cpu"])(*args)
    opt = hlofuse.optimize(exp.mlir_module(), pipeline=["inline-calls", "canonicalize", "cse",
                                                         "fuse-attention"])
    _KEEP.append(opt)
    (fn,) = [fo for fo in hir.funcs(opt.module) if hir.func_name(fo).startswith("hlofuse_attention")]
    spec = A.spec_from_func(fn)
    name = hir.func_name(fn)
    text = fn.operation.get_asm(large_elements_limit=1 << 30)
    text = text.replace(f"@{name}", "@main").replace("func.func private", "func.func public")
    # drop the function's attributes (kind, region id, the recorded spec: a JSON string)
    text = "module {\n" + re.sub(r" attributes \{hlofuse.*\} \{$", " {", text, count=1,
                                  flags=re.M) + "\n}"
    avals = [jax.ShapeDtypeStruct(s, d) for s, d in zip(spec.in_shapes, spec.in_dtypes)]
    ins = random_inputs(avals, 1)
    for a, d in zip(ins, spec.in_dtypes):
        if d == np.bool_:
            a[..., 0] = True          # no fully masked rows unless a test asks for them
    return spec, text, ins


CASES = {
    "plain-odd-cross": ("bhsd", "none", 1, "nn", "div", "-inf", np.float32, 37, 29),
    "causal-gqa": ("bshd", "causal", 2, "nn", "div", "-inf", np.float32, 37, 37),
    "causal-finite-fill": ("bshd", "causal", 2, "nn", "div", "-1e9", np.float32, 40, 40),
    "tril-mqa": ("mqa", "tril", 1, "manual", "mul", "-inf", np.float32, 24, 24),
    "bool-padding": ("bshd", "bool", 1, "nn", "div", "-inf", np.float32, 16, 24),
    "bool-full-finite": ("bhsd", "bool_full", 1, "nn", "div", "-1e9", np.float32, 9, 11),
    "additive": ("bshd", "additive", 1, "nn", "div", "-inf", np.float32, 16, 20),
    "bias-gqa": ("bhsd", "bias", 2, "manual", "div", "-inf", np.float32, 16, 16),
    "causal-bf16": ("bshd", "causal", 2, "f32", "div", "-inf", BF16, 33, 33),
}


def region(case):
    lay, m, g, sm, sc, fill, dt, sq, sk = CASES[case]
    return region_of(make_attention(lay, m, g, sm, sc, fill), make_args(lay, m, g, dt, sq, sk))


def bench_spec(seq, causal=False, b=1, h=8):
    def f(q, k, v):
        s = jnp.einsum("bqhd,bkhd->bhqk", q, k) * (1.0 / math.sqrt(q.shape[-1]))
        if causal:
            s = jnp.where(jnp.tril(jnp.ones((seq, seq), bool)), s, jnp.finfo(s.dtype).min)
        return jnp.einsum("bhqk,bkhd->bqhd", jax.nn.softmax(s, axis=-1), v)
    args = [jax.ShapeDtypeStruct((b, seq, h, 64), np.float32)] * 3
    exp = jax.export.export(jax.jit(f), platforms=["cpu"])(*args)
    opt = hlofuse.optimize(exp.mlir_module(), pipeline=["inline-calls", "canonicalize", "cse",
                                                         "fuse-attention"])
    _KEEP.append(opt)
    (fn,) = [fo for fo in hir.funcs(opt.module) if hir.func_name(fo).startswith("hlofuse_attention")]
    return A.spec_from_func(fn)


def strict_causal_region(n=24):
    """(spec, region text, inputs) of a strict causal attention (key j < query i) filled with
    -inf: row 0 sees no key, and the original softmax gives NaN there."""
    def f(q, k, v):
        s = jnp.einsum("bhqd,bhkd->bhqk", q, k)
        s = jnp.where(jnp.arange(n)[:, None] > jnp.arange(n)[None, :], s, -jnp.inf)
        return jax.nn.softmax(s, axis=-1) @ v
    return region_of(f, make_args("bhsd", "none", 1, np.float32, n, n))
