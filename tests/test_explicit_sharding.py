"""Meshes with Explicit axes (``jax.make_mesh``'s default): an ``hlofuse.jit`` function returns
the same values *and the same output shardings* as ``jax.jit`` (sharding in types), inside and
outside ``jax.set_mesh``, for matmuls, reductions, row kernels and a gradient.

Runs in a child process with 4 CPU devices (the device count is fixed at jax's start).
"""

import os
import textwrap

from tests.sharded_programs import run_json_child

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

CHILD = textwrap.dedent('''
    import json, os, sys
    os.environ["XLA_FLAGS"] = "--xla_force_host_platform_device_count=4"
    sys.path.insert(0, ROOT)
    import numpy as np, jax, jax.numpy as jnp, hlofuse
    from jax.sharding import NamedSharding, PartitionSpec as P, AxisType
    from hlofuse.testing import compare
    R = np.random.default_rng(0)
    mesh = jax.make_mesh((2, 2), ("a", "b"), axis_types=(AxisType.Explicit,) * 2)
    x = jax.device_put(R.standard_normal((8, 16)).astype(np.float32), NamedSharding(mesh, P("a")))
    w = jax.device_put(R.standard_normal((16, 32)).astype(np.float32),
                       NamedSharding(mesh, P(None, "b")))
    fs = {
        "matmul": lambda x, w: jnp.tanh(x @ w),
        "column_sum": lambda x, w: (x @ w).sum(0),
        "softmax": lambda x, w: jax.nn.softmax(x @ w, axis=-1),
        "layernorm": lambda x, w: (x - x.mean(-1, keepdims=True)) / (x.std(-1, keepdims=True) + 1e-5),
        "grad": lambda x, w: jax.grad(lambda w: jnp.sum(jnp.tanh(x @ w) ** 2))(w),
    }
    out = {}
    for where in ("set_mesh", "arrays"):
        for n, f in fs.items():
            def run():
                a = jax.jit(f)(x, w)
                b = hlofuse.jit(f, tiered=False, autotune=False)(x, w)
                return {"same_sharding": a.sharding.is_equivalent_to(b.sharding, a.ndim),
                        "jax": str(a.sharding.spec), "hlofuse": str(b.sharding.spec),
                        "problems": compare(b, a, "reassociate")}
            if where == "set_mesh":
                with jax.set_mesh(mesh):
                    out[f"{where}/{n}"] = run()
            else:
                out[f"{where}/{n}"] = run()
    print(json.dumps(out))
''').replace("ROOT", repr(ROOT))


def test_explicit_mesh_outputs_keep_jax_jit_shardings():
    out = run_json_child(CHILD, timeout=600)
    assert len(out) == 10
    for name, o in out.items():
        assert not o["problems"], (name, o)
        assert o["same_sharding"], (name, o)    # before: hlofuse's outputs came back replicated
