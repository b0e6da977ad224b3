"""One process of ``tests/test_distributed.py``'s two-process runs (issue 16).

Run as ``python -m tests.distributed_child SCENARIO PROCESS_ID PORT`` from the repository root,
with ``JAX_PLATFORMS=cpu`` and ``XLA_FLAGS=--xla_force_host_platform_device_count=2`` in the
environment (the launcher sets them): it joins the coordinator on ``127.0.0.1:PORT`` (gloo
collectives over loopback), runs SCENARIO with ``jax.jit`` and ``hlofuse.jit`` and prints one
JSON line of what it measured; the test asserts on it. Scenarios:

* ``forward``: a sharded forward program (2x2 ``data`` x ``model`` mesh; layernorm + column- and
  row-parallel matmuls): addressable shards, output shardings and compiled collectives.
* ``fsdp_train``: two FSDP training steps (2x2 ``data`` x ``fsdp`` mesh; every parameter and
  its Adam moments sharded along their first dimension over ``fsdp``, so XLA all-gathers the
  weights inside the step; the batch sharded over both axes; mean squared error,
  ``jax.value_and_grad``, a hand-written Adam update; parameters and optimizer state donated):
  every output's addressable shards after each step, output shardings, hlofuse's kernels, and
  both executables' per-device ``memory_analysis()``.
"""

from __future__ import annotations

import json
import sys

import numpy as np

import jax
import jax.numpy as jnp
from jax.sharding import NamedSharding, PartitionSpec as P

from tests.sharded_programs import collectives

# hlofuse is imported by each scenario, after jax.distributed.initialize (which must come before
# anything starts jax's backends)


def _start(pid: int, port: str) -> None:
    jax.config.update("jax_cpu_collectives_implementation", "gloo")
    jax.distributed.initialize(coordinator_address=f"127.0.0.1:{port}", num_processes=2,
                               process_id=pid, initialization_timeout=60)


def _topology() -> dict:
    return {"procs": jax.process_count(), "devices": jax.device_count(),
            "local": jax.local_device_count()}


def forward() -> dict:
    import hlofuse
    mesh = jax.make_mesh((2, 2), ("data", "model"), axis_types=(jax.sharding.AxisType.Auto,) * 2)

    def f(x, w1, w2):
        m = x.mean(-1, keepdims=True)
        h = (x - m) * jax.lax.rsqrt(((x - m) ** 2).mean(-1, keepdims=True) + 1e-5)
        return jax.nn.gelu(h @ w1) @ w2 + x

    rng = np.random.default_rng(0)
    host = [rng.standard_normal(s).astype(np.float32) * 0.3 for s in [(8, 16, 32), (32, 64), (64, 32)]]
    shard = (NamedSharding(mesh, P("data")), NamedSharding(mesh, P(None, "model")),
             NamedSharding(mesh, P("model")))
    args = [jax.make_array_from_callback(h.shape, s, lambda idx, h=h: h[idx]) for h, s in zip(host, shard)]
    yj = jax.jit(f, in_shardings=shard)(*args)
    hf = hlofuse.jit(f, in_shardings=shard, autotune=False)
    yh = hf(*args)
    err = max(float(np.max(np.abs(np.asarray(a.data) - np.asarray(b.data))))
              for a, b in zip(yj.addressable_shards, yh.addressable_shards))
    lowered = hf.lower(*args)
    rep = lowered.report
    cj = collectives(jax.jit(f, in_shardings=shard).lower(*args).compile().as_text())
    ch = collectives(lowered.compile().as_text())
    return {"err": err, "kernels": len(rep.kernels),
            "per_shard": sum("per_shard" in r.extra for r in rep.regions),
            "spec_same": str(yj.sharding) == str(yh.sharding), "jax": cj, "hlofuse": ch}


# --- fsdp_train -----------------------------------------------------------------------------

B, S, D, F = 8, 16, 32, 64           # batch, sequence, model width, hidden width
# Adam divides by sqrt(v) + EPS: where a gradient is about as small as its kernel-vs-XLA rounding
# difference, an update moves by up to LR * |d grad| / EPS. EPS = 1e-4 bounds that factor by 10
# (the usual 1e-8 would make it 1e5 and a 1e-9 gradient difference could flip an update's sign)
LR, BETA1, BETA2, EPS = 1e-3, 0.9, 0.999, 1e-4
DONATE = (0, 1)                      # params, optimizer state
STEPS = 2
MEMORY_FIELDS = ("argument_size_in_bytes", "output_size_in_bytes", "temp_size_in_bytes",
                 "alias_size_in_bytes")


def _block(params, x):
    m = x.mean(-1, keepdims=True)
    h = (x - m) * jax.lax.rsqrt(((x - m) ** 2).mean(-1, keepdims=True) + 1e-5)
    h = h * params["ln_scale"] + params["ln_bias"]
    h = jax.nn.gelu(jnp.dot(h, params["w1"]) + params["b1"])
    return jnp.dot(h, params["w2"]) + params["b2"] + x


def train_step(params, opt, x, y):
    """One FSDP step: loss and gradients, then Adam (moments ``m``/``v``, step ``count``)."""

    def loss_fn(p):
        return jnp.mean((_block(p, x) - y) ** 2)

    loss, grads = jax.value_and_grad(loss_fn)(params)
    count = opt["count"] + 1
    m = jax.tree.map(lambda m, g: BETA1 * m + (1 - BETA1) * g, opt["m"], grads)
    v = jax.tree.map(lambda v, g: BETA2 * v + (1 - BETA2) * g * g, opt["v"], grads)
    t = count.astype(jnp.float32)
    m_corr, v_corr = 1 - BETA1 ** t, 1 - BETA2 ** t
    new = jax.tree.map(lambda p, m, v: p - LR * (m / m_corr) / (jnp.sqrt(v / v_corr) + EPS),
                       params, m, v)
    return new, {"m": m, "v": v, "count": count}, loss


def _host_state():
    rng = np.random.default_rng(0)
    shapes = {"ln_scale": (D,), "ln_bias": (D,), "w1": (D, F), "b1": (F,), "w2": (F, D), "b2": (D,)}
    params = {k: (rng.standard_normal(s) * 0.2 + (1.0 if k == "ln_scale" else 0.0)).astype(np.float32)
              for k, s in shapes.items()}
    x = rng.standard_normal((B, S, D)).astype(np.float32)
    y = rng.standard_normal((B, S, D)).astype(np.float32)
    return params, x, y


def fsdp_train() -> dict:
    import hlofuse
    from hlofuse.runtime.testing import compare

    mesh = jax.make_mesh((2, 2), ("data", "fsdp"), axis_types=(jax.sharding.AxisType.Auto,) * 2)
    fsdp, batch, repl = (NamedSharding(mesh, P("fsdp")), NamedSharding(mesh, P(("data", "fsdp"))),
                         NamedSharding(mesh, P()))
    host_params, host_x, host_y = _host_state()

    def put(a, s):
        return jax.make_array_from_callback(a.shape, s, lambda idx: a[idx])

    def fresh():
        """New global arrays for one run (the donated ones are consumed by the first step)."""
        params = {k: put(a, fsdp) for k, a in host_params.items()}
        opt = {mv: {k: put(np.zeros_like(a), fsdp) for k, a in host_params.items()} for mv in "mv"}
        opt["count"] = put(np.zeros((), np.int32), repl)
        return params, opt, put(host_x, batch), put(host_y, batch)

    def local(out):
        """This process's shards of every output leaf, copied to the host:
        (leaf path, device, index, array)."""
        leaves = jax.tree_util.tree_flatten_with_path(out)[0]
        return [(jax.tree_util.keystr(path), str(s.device), str(s.index), np.asarray(s.data))
                for path, leaf in leaves for s in leaf.addressable_shards]

    def run(fn):
        """STEPS steps from fresh inputs: each step's local shards and loss, the last shardings."""
        params, opt, x, y = fresh()
        steps, losses, out = [], [], None
        for _ in range(STEPS):
            out = fn(params, opt, x, y)
            params, opt, loss = out
            steps.append(local(out))   # before the next step donates these buffers
            losses.append(float(loss))
        leaves = jax.tree_util.tree_flatten_with_path(out)[0]
        shardings = {jax.tree_util.keystr(p): (leaf.sharding, leaf.ndim) for p, leaf in leaves}
        return steps, shardings, losses

    def memory(compiled) -> dict:
        ma = compiled.memory_analysis()
        fig = {f: (int(getattr(ma, f)) if ma is not None and hasattr(ma, f) else None)
               for f in MEMORY_FIELDS}
        if all(v is not None for v in fig.values()):
            fig["peak"] = (fig["argument_size_in_bytes"] + fig["output_size_in_bytes"]
                           + fig["temp_size_in_bytes"] - fig["alias_size_in_bytes"])
        return fig

    jj = jax.jit(train_step, donate_argnums=DONATE)
    hf = hlofuse.jit(train_step, donate_argnums=DONATE, autotune=False)
    # lower with fresh arrays of their own: lowering reads only shapes and shardings, and the
    # arrays the runs below pass are donated away
    compiled_jax = jj.lower(*fresh()).compile()
    lowered = hf.lower(*fresh())
    compiled_hf = lowered.compile()
    mem_jax, mem_hf = memory(compiled_jax), memory(compiled_hf)
    rep = lowered.report

    steps_j, shard_j, losses_j = run(jj)
    steps_h, shard_h, losses_h = run(hf)

    problems, max_err, n_shards = [], 0.0, 0
    for k, (sj, sh) in enumerate(zip(steps_j, steps_h)):
        if len(sj) != len(sh):
            problems.append(f"step {k + 1}: {len(sh)} addressable shards vs jax.jit's {len(sj)}")
            continue
        for (path, dev, idx, a), (path_h, dev_h, idx_h, b) in zip(sj, sh):
            n_shards += 1
            if (path, dev, idx) != (path_h, dev_h, idx_h):
                problems.append(f"step {k + 1} {path}: shard {dev_h} {idx_h} vs jax.jit's {dev} {idx}")
                continue
            problems += [f"step {k + 1} {path} on {dev} {idx}: {p}" for p in compare(b, a, "grad")]
            if a.dtype.kind == "f" and a.size:
                max_err = max(max_err, float(np.max(np.abs(a.astype(np.float64) - b))))
    sharding = {}
    for p, (sj, ndim) in shard_j.items():
        sh = shard_h.get(p, (None, ndim))[0]
        sharding[p] = {"jax": str(sj), "hlofuse": str(sh), "equal": sh == sj,
                       "equivalent": sh is not None and sh.is_equivalent_to(sj, ndim)}
    return {"losses_jax": losses_j, "losses_hlofuse": losses_h,
            "shards_compared": n_shards, "max_abs_err": max_err, "problems": problems[:20],
            "n_problems": len(problems), "sharding": sharding, "kernels": len(rep.kernels),
            "memory": {"jax": mem_jax, "hlofuse": mem_hf},
            "collectives": {"jax": collectives(compiled_jax.as_text()),
                            "hlofuse": collectives(compiled_hf.as_text())}}


SCENARIOS = {"forward": forward, "fsdp_train": fsdp_train}


def main(argv: list[str]) -> None:
    scenario, pid, port = argv[0], int(argv[1]), argv[2]
    _start(pid, port)
    out = {"pid": pid, **_topology(), **SCENARIOS[scenario]()}
    print(json.dumps(out), flush=True)
    jax.distributed.shutdown()


if __name__ == "__main__":
    main(sys.argv[1:])
