"""Measured per-region decisions on the bench workloads, and what they do to the steady state.

Per workload (one process, cache directory of your choice): ``hlofuse.jit`` with
``autotune=False`` (kernels as the passes made them) and with the measured decisions
(``f.tune(*args)``: every kernelized region timed against XLA's own code in the whole
program, and the XLA-option variants), each timed interleaved against ``jax.jit`` with
:func:`bench.runner.interleaved`. Prints per region what was kept and why (the measured
kernel/XLA ratio, the learned model's prediction when it has one), the tuning time, and the
two steady-state ratios.

    python -m bench.decisions [--models resnet_nhwc,bert_s128] [--budget 30] [--json out.json]

Timings on a shared machine are noisy: the ratios are medians of interleaved rounds, and a
tuning run during which other processes held more than a quarter of the CPUs is flagged
(its decisions are then not written to disk).
"""

from __future__ import annotations

import argparse
import json
import sys
import time


def run(model: str, budget: float, cfg) -> dict:
    import jax
    import hlofuse
    from bench import runner, workloads
    fn, args = workloads.get(model).instantiate(0)
    args = jax.block_until_ready(args)
    jf = jax.jit(fn)
    plain = hlofuse.jit(fn, tiered=False, autotune=False)
    tuned = hlofuse.jit(fn, tiered=False, autotune="on")
    t0 = time.perf_counter()
    d = tuned.tune(*args, budget_s=budget)
    tune_s = time.perf_counter() - t0
    rep = tuned.report(*args)
    rows = []
    for r in rep.regions:
        c = (d.regions if d else {}).get(r.extra.get("region_hash"))
        rows.append({"id": r.id, "kind": r.kind, "where": ", ".join(r.locations[:2]),
                     "decision": c["reason"] if c else ("not measured" if r.extra.get("region_hash")
                                                        else (r.reason or ""))})
    lat_plain = runner.interleaved(jf, plain, args, cfg)
    lat_tuned = runner.interleaved(jf, tuned, args, cfg)
    return {"model": model, "tune_s": round(tune_s, 2),
            "options": d.variant if d else "default",
            "foreign_load_while_tuning": d.foreign_load if d else None,
            "kernels_before": len(plain.report(*args).kernels), "kernels_after": len(rep.kernels),
            "ratio_kernels": lat_plain["median_ratio"], "ratio_decided": lat_tuned["median_ratio"],
            "flagged_rounds": lat_plain["flagged_rounds"] + lat_tuned["flagged_rounds"],
            "regions": rows}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog="python -m bench.decisions",
                                 description=__doc__.split("\n\n")[0])
    ap.add_argument("--models", default="resnet_nhwc,bert_s128,layernorm")
    ap.add_argument("--budget", type=float, default=30.0, help="tuning seconds per model")
    ap.add_argument("--json", default=None)
    a = ap.parse_args(argv)
    from bench import runner
    cfg = runner.Config.quick()
    out = []
    for m in a.models.split(","):
        r = run(m, a.budget, cfg)
        out.append(r)
        print(f"{m}: kernels {r['kernels_before']} -> {r['kernels_after']}, options {r['options']}, "
              f"tuned in {r['tune_s']:.1f}s (foreign load {r['foreign_load_while_tuning']}); "
              f"steady ratio vs jax.jit: kernels {r['ratio_kernels']:.3f}, decided "
              f"{r['ratio_decided']:.3f} ({r['flagged_rounds']} rounds flagged busy)")
        for row in r["regions"]:
            print(f"  region {row['id']:3d} {row['kind']:16s} {row['where'][:40]:40s} {row['decision']}")
        sys.stdout.flush()
    if a.json:
        with open(a.json, "w") as fh:
            json.dump(out, fh, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
