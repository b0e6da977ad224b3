"""``hlofuse.jit`` under ``jax.distributed`` (issue 16): two local processes, one coordinator.

Two child processes (2 CPU devices each, gloo collectives) join a coordinator on 127.0.0.1 and
run the same sharded program (a 2x2 mesh over the 4 global devices; layernorm + column- and
row-parallel matmuls) with ``jax.jit`` and ``hlofuse.jit``: each process compares its
addressable shards, the output shardings and the compiled collectives, and hlofuse must have
built per-shard kernels. Bounded: each process has 240 s.
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys

from hlofuse.testing import TOLERANCES

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

CHILD = r'''
import os, sys, json
pid, port = int(sys.argv[1]), sys.argv[2]
os.environ["XLA_FLAGS"] = "--xla_force_host_platform_device_count=2"
os.environ["JAX_PLATFORMS"] = "cpu"
import jax
jax.config.update("jax_cpu_collectives_implementation", "gloo")
jax.distributed.initialize(coordinator_address=f"127.0.0.1:{port}", num_processes=2, process_id=pid,
                           initialization_timeout=60)
import numpy as np, jax.numpy as jnp, hlofuse
from jax.sharding import NamedSharding, PartitionSpec as P
mesh = jax.make_mesh((2, 2), ("data", "model"), axis_types=(jax.sharding.AxisType.Auto,) * 2)
def f(x, w1, w2):
    m = x.mean(-1, keepdims=True); h = (x - m) * jax.lax.rsqrt(((x - m) ** 2).mean(-1, keepdims=True) + 1e-5)
    return jax.nn.gelu(h @ w1) @ w2 + x
rng = np.random.default_rng(0)
host = [rng.standard_normal(s).astype(np.float32) * 0.3 for s in [(8, 16, 32), (32, 64), (64, 32)]]
shard = (NamedSharding(mesh, P("data")), NamedSharding(mesh, P(None, "model")), NamedSharding(mesh, P("model")))
args = [jax.make_array_from_callback(h.shape, s, lambda idx, h=h: h[idx]) for h, s in zip(host, shard)]
yj = jax.jit(f, in_shardings=shard)(*args)
hf = hlofuse.jit(f, in_shardings=shard, autotune=False)
yh = hf(*args)
err = max(float(np.max(np.abs(np.asarray(a.data) - np.asarray(b.data))))
          for a, b in zip(yj.addressable_shards, yh.addressable_shards))
lowered = hf.lower(*args)
rep = lowered.report
sys.path.insert(0, ROOT)
from tests.sharded_programs import collectives
cj = collectives(jax.jit(f, in_shardings=shard).lower(*args).compile().as_text())
ch = collectives(lowered.compile().as_text())
print(json.dumps({"pid": pid, "procs": jax.process_count(), "devices": jax.device_count(),
                  "local": jax.local_device_count(), "err": err, "kernels": len(rep.kernels),
                  "per_shard": sum("per_shard" in r.extra for r in rep.regions),
                  "spec_same": str(yj.sharding) == str(yh.sharding), "jax": cj, "hlofuse": ch}))
jax.distributed.shutdown()
'''.replace("ROOT", repr(ROOT))


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_two_processes_with_a_local_coordinator():
    port = str(_free_port())
    env = dict(os.environ, JAX_PLATFORMS="cpu", HLOFUSE_AUTOTUNE="off")
    procs = [subprocess.Popen([sys.executable, "-c", CHILD, str(i), port], env=env,
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
             for i in range(2)]
    outs = []
    try:
        for p in procs:
            out, err = p.communicate(timeout=240)
            assert p.returncode == 0, err[-3000:]
            outs.append(json.loads(out.strip().splitlines()[-1]))
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
    assert sorted(o["pid"] for o in outs) == [0, 1]
    for o in outs:
        assert o["procs"] == 2 and o["devices"] == 4 and o["local"] == 2, o
        assert o["err"] <= TOLERANCES["reassociate"]["float32"][1] and o["spec_same"], o
        assert o["kernels"] >= 2 and o["per_shard"] >= 2, o
        for kind, n in o["hlofuse"].items():
            assert n <= o["jax"][kind], o
