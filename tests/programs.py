"""A catalog of JAX programs covering what users write: models, control flow, dtypes, pytrees.

Each :class:`Program` has a function, a seeded argument factory, and what hlofuse should do
with it (``kernels``: at least one kernel expected / none expected / None = don't care).
"""

from __future__ import annotations

import dataclasses
from typing import Callable

import numpy as np

import jax
import jax.numpy as jnp
from jax import lax


@dataclasses.dataclass
class Program:
    name: str
    fn: Callable
    args: Callable[[np.random.Generator], tuple]
    kernels: bool | None = True      # True: >=1 kernel on cpu; False: none; None: either
    grad: bool = True                # differentiable w.r.t. arg 0 (float)
    vmap: bool = True                # vmappable over a new leading axis of arg 0
    category: str = "kernel"         # tolerance category
    static_argnums: tuple = ()


def f32(rng, *shape, scale=1.0):
    return (rng.standard_normal(shape) * scale).astype(np.float32)


# ---- models ---------------------------------------------------------------------------------

def mlp(params, x):
    (w1, b1), (w2, b2) = params
    h = jax.nn.relu(x @ w1 + b1)
    return jax.nn.gelu(h @ w2 + b2, approximate=True)


def mlp_args(rng):
    return ([(f32(rng, 32, 64), f32(rng, 64)), (f32(rng, 64, 16), f32(rng, 16))], f32(rng, 8, 32))


def cnn_bn(x, w, gamma, beta, mean, var):
    y = lax.conv_general_dilated(x, w, (1, 1), "SAME", dimension_numbers=("NHWC", "HWIO", "NHWC"))
    y = (y - mean) * lax.rsqrt(var + 1e-5) * gamma + beta
    y = jax.nn.relu(y)
    return lax.reduce_window(y, -jnp.inf, lax.max, (1, 2, 2, 1), (1, 2, 2, 1), "VALID")


def cnn_args(rng):
    c = 8
    return (f32(rng, 2, 8, 8, 4), f32(rng, 3, 3, 4, c, scale=0.3), f32(rng, c), f32(rng, c),
            f32(rng, c), np.abs(f32(rng, c)) + 0.5)


def layernorm(x, g, b):
    m = x.mean(-1, keepdims=True)
    v = ((x - m) ** 2).mean(-1, keepdims=True)
    return (x - m) * lax.rsqrt(v + 1e-6) * g + b


def transformer_block(x, wqkv, wo, w1, w2, g1, b1, g2, b2):
    h = layernorm(x, g1, b1)
    q, k, v = jnp.split(h @ wqkv, 3, axis=-1)
    s = q @ k.T / np.sqrt(q.shape[-1])
    a = jax.nn.softmax(s, axis=-1) @ v
    x = x + a @ wo
    h = layernorm(x, g2, b2)
    return x + jax.nn.gelu(h @ w1) @ w2


def transformer_args(rng):
    d = 32
    return (f32(rng, 16, d), f32(rng, d, 3 * d, scale=0.2), f32(rng, d, d, scale=0.2),
            f32(rng, d, 4 * d, scale=0.2), f32(rng, 4 * d, d, scale=0.2),
            1 + f32(rng, d, scale=0.1), f32(rng, d, scale=0.1), 1 + f32(rng, d, scale=0.1), f32(rng, d, scale=0.1))


def softmax(x):
    return jax.nn.softmax(x * 0.5, axis=-1)


def rmsnorm(x, g):
    return x * lax.rsqrt(jnp.mean(x * x, -1, keepdims=True) + 1e-6) * g


# ---- control flow ---------------------------------------------------------------------------

def while_loop(x):
    def body(c):
        i, v = c
        return i + 1, jnp.tanh(v * 1.5 + 0.1) * 0.9
    return lax.while_loop(lambda c: c[0] < 5, body, (0, x))[1]


def cond(x, p):
    return lax.cond(p > 0, lambda v: jnp.exp(v * 0.1) + 1.0, lambda v: jnp.sin(v) * 2.0 - 1.0, x)


def scan(x):
    def step(c, xi):
        c = jnp.tanh(c * 0.5 + xi) * 1.1
        return c, c * 2.0 + 1.0
    return lax.scan(step, jnp.zeros(x.shape[1:], x.dtype), x)


def fori(x):
    return lax.fori_loop(0, 4, lambda i, v: v * 0.5 + jnp.cos(v), x)


# ---- indexing -------------------------------------------------------------------------------

def gather(x, idx):
    return jnp.exp(x[idx] * 2.0) + 1.0


def scatter(x, idx, v):
    return x.at[idx].add(v * 3.0 + 1.0) * 2.0


def embedding(table, ids):
    return jax.nn.one_hot(ids, table.shape[0]) @ table * 2.0 + 1.0


# ---- dtypes ---------------------------------------------------------------------------------

def int_chain(a, b):
    return ((a * 3 + b) // 2 - (a % 5)) * (b > 0)


def int_division(a, b):
    b = jnp.where(b == 0, 1, b)
    return lax.div(a, b), lax.rem(a, b), a >> 1, a << 2


def bool_logic(x, y):
    m = (x > 0) & ~(y < 0.5) | (x == y)
    return jnp.where(m, x, -y), m ^ (x < y)


def bf16_chain(x, y):
    return (jax.nn.silu(x) * y + 1).astype(jnp.bfloat16) * jnp.bfloat16(0.5)


def f16_chain(x):
    return jnp.tanh(x.astype(jnp.float16) * 2) + jnp.float16(1)


def mixed_convert(x, i):
    return (x * i.astype(jnp.float32)).astype(jnp.int32) + i, jnp.sqrt(jnp.abs(x)).astype(jnp.bfloat16)


# ---- structure ------------------------------------------------------------------------------

def pytree(inp):
    a, (b, c) = inp["a"], inp["bc"]
    return {"sum": a + b * c, "nested": [jnp.tanh(a) * 2.0, {"c": c - 1.0}]}


def multi_output(x, y):
    s = jnp.sin(x) * y
    return s, s + 1.0, jnp.exp(-s) * 2.0


def scalars(x, s):
    return x * s + 1.0, (x * x).sum() * s


def zero_size(x, y):
    return jnp.tanh(x) * 2 + 1, y * 3


def broadcasting(x, row, col):
    return jnp.maximum(x * row[None, :] + col[:, None], 0.0) * 0.5


def nan_inf(x):
    y = jnp.where(jnp.isfinite(x), x, 0.0) * 2.0
    return jnp.clip(y, -1.0, 1.0) + jnp.sign(x) * 0.0, jnp.isnan(x)


def sum_of_squares(x):
    return jnp.sum(jnp.square(x * 2.0 + 1.0), axis=-1)


def cumsum(x):
    return jnp.cumsum(jnp.abs(x) * 2.0, axis=-1)


def sort(x):
    return jnp.sort(x, axis=-1)


def hi_primitives(x):
    """jnp functions jax 0.12 builds as "high" primitives (``call_hi_primitive``), lowered to
    plain ones only where the trace saw them bound: hlofuse's first call once copied them into
    its trace without that record (a TypeError in jax's lowering), next to an elementwise chain
    that fuses."""
    edges = jnp.sort(x[0])
    pos = jnp.searchsorted(edges, x[1:]).astype(jnp.float32)
    mant, _ = jnp.frexp(x * 3.0)
    return jnp.tanh(x[1:] * 2.0 + 1.0) * pos + mant[1:], jnp.unique(jnp.round(x[0]), size=4)


def argmax(x):
    return jnp.argmax(x * 2.0 + 1.0, axis=-1)


def rng_program(key, x):
    return x * jax.random.uniform(key, x.shape) + jax.random.bernoulli(key, 0.3, x.shape)


def einsum(x, y):
    return jnp.tanh(jnp.einsum("bij,bjk->bik", x, y) * 0.1) * 2.0


def linalg(x):
    return jnp.linalg.inv(x @ x.T + 4.0 * jnp.eye(x.shape[0])) * 2.0 + 1.0


def single_matmul(x, w):
    return x @ w


def static_arg(x, n):
    for _ in range(n):
        x = jnp.tanh(x) * 1.5
    return x


def rsqrt_bias_chain(x, b):
    return lax.rsqrt(jnp.abs(x) + 1.0) * b + jnp.exp(-x * x)


def key_args(rng):
    return (jax.random.key_data(jax.random.PRNGKey(3)), f32(rng, 8, 16))


def rng_program_raw(raw_key, x):
    return rng_program(jax.random.wrap_key_data(raw_key), x)


PROGRAMS: list[Program] = [
    Program("mlp", mlp, mlp_args, grad=False, vmap=False),
    Program("cnn_bn", cnn_bn, cnn_args),
    Program("transformer_block", transformer_block, transformer_args, category="reassociate"),
    Program("softmax", softmax, lambda r: (f32(r, 16, 128),)),
    Program("layernorm", layernorm, lambda r: (f32(r, 16, 64), f32(r, 64), f32(r, 64))),
    Program("rmsnorm", rmsnorm, lambda r: (f32(r, 16, 64), f32(r, 64))),
    Program("while_loop", while_loop, lambda r: (f32(r, 16, 32),), grad=False),
    Program("cond", cond, lambda r: (f32(r, 16, 32), np.float32(1.0))),
    Program("scan", scan, lambda r: (f32(r, 6, 16, 32),)),
    Program("fori", fori, lambda r: (f32(r, 16, 32),), grad=False),
    Program("gather", gather, lambda r: (f32(r, 64, 32), r.integers(0, 64, (16,)).astype(np.int32))),
    Program("scatter", scatter, lambda r: (f32(r, 64, 32), r.integers(0, 64, (16,)).astype(np.int32), f32(r, 16, 32))),
    Program("embedding", embedding, lambda r: (f32(r, 50, 16), r.integers(0, 50, (12,)).astype(np.int32))),
    Program("int_chain", int_chain, lambda r: (r.integers(-50, 50, (16, 32)).astype(np.int32),
                                               r.integers(-50, 50, (16, 32)).astype(np.int32)), grad=False),
    Program("int_division", int_division, lambda r: (r.integers(-50, 50, (16, 32)).astype(np.int32),
                                                     r.integers(-7, 7, (16, 32)).astype(np.int32)), grad=False),
    Program("bool_logic", bool_logic, lambda r: (f32(r, 16, 32), f32(r, 16, 32)), grad=False),
    Program("bf16_chain", bf16_chain, lambda r: (f32(r, 16, 64), f32(r, 16, 64)), grad=False),
    Program("f16_chain", f16_chain, lambda r: (f32(r, 16, 64),), grad=False),
    Program("mixed_convert", mixed_convert, lambda r: (f32(r, 16, 32, scale=4), r.integers(-5, 5, (16, 32)).astype(np.int32)),
            grad=False),
    Program("pytree", pytree, lambda r: ({"a": f32(r, 8, 16), "bc": (f32(r, 8, 16), f32(r, 8, 16))},), grad=False, vmap=False),
    Program("multi_output", multi_output, lambda r: (f32(r, 16, 32), f32(r, 16, 32))),
    Program("scalars", scalars, lambda r: (f32(r, 16, 32), np.float32(1.5))),
    Program("zero_size", zero_size, lambda r: (f32(r, 0, 32), f32(r, 4, 0)), kernels=False, grad=False),
    Program("broadcasting", broadcasting, lambda r: (f32(r, 16, 32), f32(r, 32), f32(r, 16))),
    Program("nan_inf", nan_inf, lambda r: (np.array([[np.nan, np.inf, -np.inf, -0.0, 0.0, 1e38, -1e-40, 3.0]] * 4,
                                                    np.float32),), grad=False),
    Program("sum_of_squares", sum_of_squares, lambda r: (f32(r, 16, 64),)),
    Program("cumsum", cumsum, lambda r: (f32(r, 8, 64),)),
    Program("sort", sort, lambda r: (f32(r, 8, 64),), kernels=False, grad=False),
    Program("hi_primitives", hi_primitives, lambda r: (f32(r, 8, 64),), grad=False),
    Program("argmax", argmax, lambda r: (f32(r, 8, 64),), grad=False),
    Program("rng", rng_program_raw, key_args, grad=False, vmap=False),
    Program("einsum", einsum, lambda r: (f32(r, 4, 8, 16), f32(r, 4, 16, 8))),
    Program("linalg_custom_call", linalg, lambda r: (f32(r, 8, 8),), kernels=None, vmap=False),
    Program("single_matmul", single_matmul, lambda r: (f32(r, 16, 32), f32(r, 32, 8)), kernels=False),
    Program("static_arg", static_arg, lambda r: (f32(r, 16, 32), 3), static_argnums=(1,)),
    Program("rsqrt_bias_chain", rsqrt_bias_chain, lambda r: (f32(r, 16, 32), f32(r, 32))),
]
