"""``hlofuse.jit`` takes every ``jax.jit`` keyword and honours it like ``jax.jit`` does.

Runs in a child process with 4 CPU devices (``--xla_force_host_platform_device_count`` must be
set before jax starts): shardings in and out, donation by number and by name, keep_unused,
inline, compiler_options, backend; results, output shardings and donation compared with
``jax.jit``; bad combinations raise jax's own error types.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap

import numpy as np
import pytest

import jax
import jax.numpy as jnp

import hlofuse

CHILD = textwrap.dedent('''
    import json, os
    os.environ["XLA_FLAGS"] = "--xla_force_host_platform_device_count=4"
    import numpy as np, jax, jax.numpy as jnp, hlofuse
    from jax.sharding import NamedSharding, PartitionSpec as P
    mesh = jax.make_mesh((4,), ("d",))
    row, rep = NamedSharding(mesh, P("d")), NamedSharding(mesh, P())
    def f(x, w):
        return jax.nn.gelu(x @ w) * 2.0
    x = jax.device_put(np.arange(16 * 32, dtype=np.float32).reshape(16, 32) / 500, row)
    w = jax.device_put(np.ones((32, 32), np.float32) * 0.01, rep)
    out = {}
    kw = dict(in_shardings=(row, rep), out_shardings=rep)
    y_h, y_j = hlofuse.jit(f, **kw)(x, w), jax.jit(f, **kw)(x, w)
    out["sharded"] = [float(np.abs(np.asarray(y_h) - np.asarray(y_j)).max()),
                      str(y_h.sharding.spec), str(y_j.sharding.spec)]
    hf = hlofuse.jit(f, out_shardings=row)
    out["out_only"] = [str(hf(x, w).sharding.spec), len(hf.report(x, w).kernels)]
    print(json.dumps(out))
''')


def test_shardings_in_a_four_device_child():
    env = dict(os.environ, JAX_PLATFORMS="cpu")
    r = subprocess.run([sys.executable, "-c", CHILD], capture_output=True, text=True, env=env,
                       timeout=600)
    assert r.returncode == 0, r.stderr[-3000:]
    out = json.loads(r.stdout.strip().splitlines()[-1])
    err, spec_h, spec_j = out["sharded"]
    assert err <= 1e-5 and spec_h == spec_j
    assert out["out_only"][0] in ("P('d',)", "PartitionSpec('d',)") and out["out_only"][1] >= 1


def f(x, w):
    return jnp.tanh(x @ w) + 1.0


X = np.ones((8, 16), np.float32)
W = np.full((16, 16), 0.1, np.float32)


def test_donate_argnames_and_keep_unused():
    def g(x, unused, *, w):
        return f(x, w)
    hf = hlofuse.jit(g, donate_argnames="x", keep_unused=True)
    jf = jax.jit(g, donate_argnames="x", keep_unused=True)
    x1, x2 = jnp.asarray(X), jnp.asarray(X)
    np.testing.assert_allclose(hf(x1, jnp.zeros(3), w=W), jf(x2, jnp.zeros(3), w=W), rtol=2e-6)
    assert x1.is_deleted() and x2.is_deleted()           # both donated the buffer
    ch = hf.lower(X, np.zeros(3, np.float32), w=W).compile()
    cj = jf.lower(X, np.zeros(3, np.float32), w=W).compile()
    assert "f32[3]" in ch.as_text().split("ENTRY")[1].split("\n")[0]   # unused param kept
    assert ch.aliases() == {0: 0}
    assert "f32[3]" in cj.as_text().split("ENTRY")[1].split("\n")[0]


def test_inline_compiler_options():
    inl = hlofuse.jit(f, inline=True)
    out = jax.jit(lambda a, b: inl(a, b) * 2)(X, W)
    np.testing.assert_allclose(out, 2 * jax.jit(f)(X, W), rtol=2e-6)
    hf = hlofuse.jit(f, compiler_options={"xla_cpu_experimental_ynn_fusion_type": ""})
    np.testing.assert_allclose(hf(X, W), jax.jit(f)(X, W), rtol=2e-6)
    assert "__ynn_fusion" not in hf.lower(X, W).compile().as_text()
    assert "__ynn_fusion" in hlofuse.jit(f).lower(X, W).compile().as_text()
    assert hf.report(X, W).kernels                        # still optimized


@pytest.mark.parametrize("kwargs", [
    {"static_argnums": 0, "donate_argnums": 0},
    {"in_shardings": (None,)},                              # wrong length
    {"static_argnames": "nope"},
    {"donate_argnames": "nope"},
])
def test_bad_combinations_raise_what_jax_raises(kwargs):
    def call(lib):
        try:
            lib.jit(f, **kwargs)(X, W)
        except Exception as e:  # noqa: BLE001
            return type(e)
        return None
    want = call(jax)
    got = call(hlofuse)
    assert got is want or (want is not None and got is not None and issubclass(got, want)), \
        (kwargs, got, want)


def test_trace_and_eval_shape():
    hf = hlofuse.jit(f)
    assert "hlofuse_call" in str(hf.trace(X, W).jaxpr)
    s = hf.eval_shape(X, W)
    assert s.shape == (8, 16) and s.dtype == jnp.float32


@pytest.mark.parametrize("kw", [{"static_argnums": 3}, {"donate_argnums": 3},
                                {"static_argnums": (0, -2)}])
def test_argnums_out_of_range_are_named_as_the_user_wrote_them(kw):
    """hlofuse said 'static_argnums=(0, 4), but only accepts 2 positional arguments' for the
    user's (3,) on a one-argument function: the inner jax.jit's positions (adversarial round)."""
    import re
    f = lambda x: x * 2   # noqa: E731
    with pytest.raises(ValueError) as want:
        jax.jit(f, **kw)
    with pytest.raises(ValueError, match=re.escape(str(want.value))):
        hlofuse.jit(f, **kw)
