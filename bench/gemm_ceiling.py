"""The f32 GEMM ceiling of this CPU, on the BERT-base layer's matmul shapes.

    python -m bench.gemm_ceiling [--rounds 15]

A transformer layer cannot run faster than its matmuls, and its matmuls cannot run faster than
the best f32 GEMM the machine has. This times, per shape, XLA's dot under ``jax.jit`` (its
default, with YNNPACK, and with YNNPACK off) and numpy's BLAS, and prints GFLOP/s, then what the
bench's BERT-base S=512 goal asks of the whole layer: ``flops / (goal x jax.jit's layer time)``.
Interleaved rounds, medians. The layer's own time comes from ``python -m bench --models
bert_s512``; pass it with ``--bert-ms`` (default: measured here, one jax.jit layer). Each
variant's rounds run back to back (numpy's BLAS threads spin after a call and slow an XLA call
interleaved with it), so run it on a quiet machine.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time

import numpy as np

# BERT-base, S=512: Q/K/V/output projections, FFN up and down
SHAPES = ((512, 768, 768), (512, 768, 3072), (512, 3072, 768))


def _median_s(fn, rounds: int) -> float:
    ts = []
    for _ in range(rounds):
        t0 = time.perf_counter()
        fn()
        ts.append(time.perf_counter() - t0)
    return statistics.median(ts)


def main(argv=None) -> int:
    import jax
    import jax.numpy as jnp
    ap = argparse.ArgumentParser(prog="python -m bench.gemm_ceiling",
                                 description=__doc__.split("\n\n")[0])
    ap.add_argument("--rounds", type=int, default=15)
    ap.add_argument("--bert-ms", type=float, default=None,
                    help="jax.jit's BERT-base S=512 layer time (default: measure it)")
    a = ap.parse_args(argv)
    rng = np.random.default_rng(0)
    best = 0.0
    print("f32 GEMM, GFLOP/s (median of consecutive rounds):")
    for m, k, n in SHAPES:
        x = rng.standard_normal((m, k)).astype(np.float32)
        w = rng.standard_normal((k, n)).astype(np.float32)
        jx, jw = jnp.asarray(x), jnp.asarray(w)
        low = jax.jit(lambda p, q: p @ q).lower(jx, jw)
        runs = {"xla": low.compile(), "xla ynn-off":
                low.compile({"xla_cpu_experimental_ynn_fusion_type": ""})}
        calls = {name: (lambda c=c: c(jx, jw).block_until_ready()) for name, c in runs.items()}
        calls["numpy"] = lambda: x @ w
        rates = {}
        for name, c in calls.items():   # one after the other: numpy's BLAS threads spin after
            c()                         # each call and would slow an interleaved XLA call
            rates[name] = 2 * m * k * n / _median_s(c, a.rounds) / 1e9
        best = max(best, *rates.values())
        print(f"  {m}x{k} @ {k}x{n}: " + ", ".join(f"{nm} {r:.0f}" for nm, r in rates.items()))
    from bench import workloads
    wl = workloads.get("bert_s512")
    args = jax.tree.map(jnp.asarray, wl.make_args(np.random.default_rng(0)))
    f = jax.jit(wl.fn)
    flops = f.lower(*args).compile().cost_analysis()
    flops = (flops[0] if isinstance(flops, list) else flops)["flops"]
    if a.bert_ms is None:
        jax.block_until_ready(f(*args))
        layer_s = _median_s(lambda: jax.block_until_ready(f(*args)), a.rounds)
    else:
        layer_s = a.bert_ms / 1e3
    goal = 0.72
    need = flops / (goal * layer_s) / 1e9
    print(f"BERT-base S=512 layer: {flops / 1e9:.2f} GFLOP, jax.jit {layer_s * 1e3:.1f} ms "
          f"({flops / layer_s / 1e9:.0f} GFLOP/s); the {goal} goal needs {need:.0f} GFLOP/s over "
          f"the whole layer (softmax, LayerNorms and GELU included), {need / best:.2f} of the "
          f"best f32 GEMM rate measured here ({best:.0f} GFLOP/s)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
