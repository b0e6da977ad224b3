"""Tensor-parallel transformer block on 8 CPU devices: ``hlofuse.jit`` vs ``jax.jit`` (issue 16).

    python -m bench.sharded_cpu                      # forward, mesh data=2 x model=4, 15 rounds
    python -m bench.sharded_cpu --train --rounds 21  # the training step (value_and_grad)
    python -m bench.sharded_cpu --json out.json

The block of ``tests/sharded_programs.py`` (layernorm, QKV with heads sharded over "model",
attention, row-parallel output projection, layernorm, column/row-parallel MLP) at B=8, S=256,
D=512, 8 heads of 64, F=2048, f32, called with the same ``in_shardings`` by both. The 8 devices
are host devices (``--xla_force_host_platform_device_count=8``, set here before jax starts),
so the 8 shards share this machine's cores. Time: both compiled and warmed up, then rounds
that run each ``--calls`` times in alternating order; the ratio is the median of per-round
ratios. Alongside: each program's collectives by kind (compiled HLO) and XLA's cost analysis
(flops, bytes accessed), deterministic figures. Autotuning is off by default (``autotune=False``):
the figure is hlofuse's default program. ``--autotune on`` is what a user gets on CPU by default:
the measured decisions (XLA options, regions kept as XLA's code) are made during the warm-up
calls, within their budget, and the timed program is the decided one.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time

os.environ.setdefault("XLA_FLAGS", "--xla_force_host_platform_device_count=8")
if "--xla_force_host_platform_device_count" not in os.environ["XLA_FLAGS"]:
    os.environ["XLA_FLAGS"] += " --xla_force_host_platform_device_count=8"


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--rounds", type=int, default=15)
    ap.add_argument("--calls", type=int, default=5)
    ap.add_argument("--train", action="store_true", help="time the training step")
    ap.add_argument("--json", default=None)
    ap.add_argument("--autotune", choices=("off", "on"), default="off",
                    help="on: hlofuse's measured decisions, as a user gets them on CPU")
    a = ap.parse_args(argv)

    import jax
    import numpy as np
    from jax.sharding import NamedSharding, PartitionSpec as P
    import hlofuse
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    sys.path.insert(0, root)
    from tests.sharded_programs import block, collectives, step

    if jax.device_count() < 8:
        print(f"needs 8 devices, have {jax.device_count()} (XLA_FLAGS={os.environ['XLA_FLAGS']!r})")
        return 2
    mesh = jax.make_mesh((2, 4), ("data", "model"), axis_types=(jax.sharding.AxisType.Auto,) * 2)
    B, S, D, H, HD, F = 8, 256, 512, 8, 64, 2048
    shapes = [(B, S, D), (D, 3, H, HD), (H, HD, D), (D, F), (F, D)]
    specs = [P("data"), P(None, None, "model"), P("model"), P(None, "model"), P("model")]
    shard = tuple(NamedSharding(mesh, s) for s in specs)
    keys = jax.random.split(jax.random.key(0), len(shapes))
    args = [jax.device_put(jax.random.normal(k, s) * (1.0 if i == 0 else 0.05), sh)
            for i, (k, s, sh) in enumerate(zip(keys, shapes, shard))]
    fn = step(block) if a.train else block
    jj = jax.jit(fn, in_shardings=shard)
    hf = hlofuse.jit(fn, tiered=False, in_shardings=shard, autotune=a.autotune == "on" and "on")
    for f in (jj, hf):
        for _ in range(5):   # hlofuse tunes on an early call when --autotune on
            jax.block_until_ready(f(*args))
    # after the warm-up: with --autotune on, the program that runs is the decided one
    cj, ch = jj.lower(*args).compile(), hf.lower(*args).compile()
    rep = hf.lower(*args).report
    decision = hf.autotune_decision(*args)

    def timed(f):
        t0 = time.perf_counter()
        for _ in range(a.calls):
            out = f(*args)
        jax.block_until_ready(out)
        return (time.perf_counter() - t0) / a.calls

    ratios, tj, th = [], [], []
    for r in range(a.rounds):
        if r % 2:
            h, j = timed(hf), timed(jj)
        else:
            j, h = timed(jj), timed(hf)
        tj.append(j)
        th.append(h)
        ratios.append(h / j)

    def cost(c):
        ca = c.cost_analysis()
        ca = ca[0] if isinstance(ca, (list, tuple)) else ca
        return {"flops": ca.get("flops"), "bytes accessed": ca.get("bytes accessed")}

    res = {
        "workload": f"tp_block{'_train' if a.train else ''} B={B} S={S} D={D} H={H}x{HD} F={F} "
                    f"f32, mesh data=2 x model=4 (8 host devices)",
        "ratio_median": statistics.median(ratios), "ratios": ratios,
        "jax_ms_median": 1e3 * statistics.median(tj), "hlofuse_ms_median": 1e3 * statistics.median(th),
        "collectives": {"jax": collectives(cj.as_text()), "hlofuse": collectives(ch.as_text())},
        "xla_cost": {"jax": cost(cj), "hlofuse": cost(ch)},
        "kernels": len(rep.kernels),
        "per_shard": sorted(r.kind for r in rep.regions if "per_shard" in r.extra),
        "left_to_xla": [r.reason for r in rep.regions if r.reason],
        "decision": decision.note() if decision is not None else "autotune off",
        "command": "python -m bench.sharded_cpu " + " ".join(argv if argv is not None else sys.argv[1:]),
    }
    print(f"{res['workload']}\n  hlofuse/jax time ratio (median of {a.rounds} interleaved rounds): "
          f"{res['ratio_median']:.3f}  (jax {res['jax_ms_median']:.2f} ms, hlofuse "
          f"{res['hlofuse_ms_median']:.2f} ms per call)")
    print(f"  collectives jax {res['collectives']['jax']}\n  collectives hlofuse {res['collectives']['hlofuse']}")
    print(f"  XLA cost jax {res['xla_cost']['jax']}\n  XLA cost hlofuse {res['xla_cost']['hlofuse']}")
    print(f"  {res['kernels']} kernel(s), per shard: {', '.join(res['per_shard'])}")
    print(f"  decision: {res['decision']}")
    for why in res["left_to_xla"]:
        print(f"  left to XLA: {why}")
    if a.json:
        with open(a.json, "w") as fh:
            json.dump(res, fh, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
