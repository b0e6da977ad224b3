"""The f32 GEMM ceiling of this CPU, and the floor it puts under each CPU goal of the bench.

    python -m bench.gemm_ceiling [--rounds 15] [--workloads attn_s4096 resnet_nhwc]

A program cannot run faster than its matmuls, and its matmuls cannot run faster than the best
f32 GEMM the machine has. This times, per shape (BERT-base's), XLA's dot under ``jax.jit`` (its
default, with YNNPACK, and with YNNPACK off) and numpy's BLAS, and prints GFLOP/s. Then, per
workload with a CPU goal (``bench.__main__.GOALS_CPU``): jax.jit's time, the flops of its dots
and convolutions and the fewest hlofuse's algorithms need (Winograd for 3x3 convolutions,
:func:`contraction_flops`), and the floor: that many flops at the best GEMM rate, as a ratio of
jax.jit's time. A goal below its floor cannot be met on this host by any program that computes
those products in f32; one a little above it asks for the GEMM peak with nothing else around it.
Medians of consecutive rounds (``--bert-ms``: jax.jit's BERT-base S=512 layer time from a
bench run instead of timing it here). Each GEMM variant's rounds run back to back (numpy's BLAS
threads spin after a call and slow an XLA call interleaved with it), so run it on a quiet
machine.
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


def contraction_flops(text: str) -> tuple[float, float]:
    """``(flops, fewest)`` of a StableHLO module's dots and convolutions (2 per multiply-add):
    as written, and as hlofuse's cpu algorithms compute them (a 3x3 stride-1 f32 convolution
    by Winograd F(2x2, 3x3), 2.25x fewer multiplies; everything else as written)."""
    from hlofuse.core import ir as hir
    from hlofuse.core.ops import OpClass, rule_for
    from hlofuse.kernels.conv_winograd import winograd_reason
    from hlofuse.passes.fusion.cost import op_flops
    module = hir.parse(text)
    total = fewest = 0.0
    for op in hir.all_ops(module):
        if rule_for(op.name).cls not in (OpClass.DOT, OpClass.CONVOLUTION):
            continue
        n = op_flops(op)
        total += n
        fewest += n / 2.25 if winograd_reason(op) is None else n
    return total, fewest


def main(argv=None) -> int:
    import jax
    import jax.numpy as jnp
    ap = argparse.ArgumentParser(prog="python -m bench.gemm_ceiling",
                                 description=__doc__.split("\n\n")[0])
    ap.add_argument("--rounds", type=int, default=15)
    ap.add_argument("--workloads", nargs="+", default=None,
                    help="bench workloads to give the floor of (default: the f32 ones with a CPU goal)")
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
    print(f"best f32 GEMM rate measured here: {best:.0f} GFLOP/s")
    print()
    print("What each CPU goal asks (floor: the fewest multiply-add flops of the algorithms "
          "hlofuse runs, at that rate, against jax.jit's time; elementwise work not counted, "
          "so no program reaches it):")
    print("| workload | jax.jit ms | jax.jit GFLOP | fewest GFLOP | floor ratio | goal | "
          "goal needs GFLOP/s | of the best GEMM |")
    print("|---|---|---|---|---|---|---|---|")
    from bench.__main__ import GOALS_CPU
    from bench import workloads
    names = a.workloads or [n for n in GOALS_CPU   # f32 programs: int8 dots have other peaks
                             if n in workloads.WORKLOADS and not n.startswith("int8")]
    for name in names:
        wl = workloads.get(name)
        args = jax.tree.map(jnp.asarray, wl.make_args(np.random.default_rng(0)))
        f = jax.jit(wl.fn)
        lowered = f.lower(*args)
        total, fewest = contraction_flops(lowered.as_text())
        if name == "bert_s512" and a.bert_ms is not None:
            jax_s = a.bert_ms / 1e3
        else:
            jax.block_until_ready(f(*args))
            jax_s = _median_s(lambda: jax.block_until_ready(f(*args)), a.rounds)
        goal = GOALS_CPU[name]
        floor = fewest / (best * 1e9) / jax_s
        need = fewest / (goal * jax_s) / 1e9
        print(f"| {name} | {jax_s * 1e3:.1f} | {total / 1e9:.2f} | {fewest / 1e9:.2f} | "
              f"{floor:.2f} | {goal} | {need:.0f} | {need / best:.2f} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
