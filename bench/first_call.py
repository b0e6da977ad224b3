"""First-call time of ``hlofuse.jit`` vs ``jax.jit`` on a BERT-base encoder layer (B=1, S=128).

Each measurement runs in a fresh Python process (no warm caches of either kind): the child
imports jax and hlofuse, builds the arguments, then times the first call of a fresh jitted
function until its result is ready (tracing + hlofuse's export and passes + XLA compile + one
run). Processes alternate jax / hlofuse; the medians are compared. The target is a ratio of
at most 3x. The hlofuse child also reports where its time went (pass pipeline, XLA compile).

    python -m bench.first_call [--repeats 3] [--model bert_s128] [--json out.json]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time

TARGET = 3.0


def _child(impl: str, model: str) -> None:
    import jax
    import hlofuse
    from bench import workloads

    compile_s = []
    jax.monitoring.register_event_duration_secs_listener(
        lambda ev, secs, **kw: compile_s.append(secs) if ev.endswith("backend_compile_duration") else None)
    fn, args = workloads.get(model).instantiate(0)
    args = jax.block_until_ready(args)
    f = jax.jit(fn) if impl == "jax" else hlofuse.jit(fn)
    t0 = time.perf_counter()
    jax.block_until_ready(f(*args))
    total = time.perf_counter() - t0
    out = {"impl": impl, "first_call_s": total, "xla_compile_s": sum(compile_s)}
    if impl == "hlofuse":
        rep = f.report(*args)
        out["passes_s"] = sum(rep.pass_seconds.values())
        out["slowest_passes"] = sorted(rep.pass_seconds.items(), key=lambda kv: -kv[1])[:4]
        out["kernels"] = len(rep.kernels)
    print(json.dumps(out))


def run_child(impl: str, model: str) -> dict:
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    p = subprocess.run([sys.executable, "-m", "bench.first_call", "--child", impl, model],
                       capture_output=True, text=True, cwd=root, timeout=900)
    for line in reversed(p.stdout.splitlines()):
        if line.startswith("{"):
            return json.loads(line)
    raise RuntimeError(f"{impl} child failed (rc={p.returncode}): {p.stderr[-800:]}")


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog="python -m bench.first_call", description=__doc__.split("\n\n")[0])
    ap.add_argument("--repeats", type=int, default=3, help="fresh processes per implementation")
    ap.add_argument("--model", default="bert_s128")
    ap.add_argument("--json", default=None)
    ap.add_argument("--child", nargs=2, metavar=("IMPL", "MODEL"), help=argparse.SUPPRESS)
    a = ap.parse_args(argv)
    if a.child:
        _child(*a.child)
        return 0
    runs = {"jax": [], "hlofuse": []}
    for i in range(a.repeats):
        order = ("jax", "hlofuse") if i % 2 == 0 else ("hlofuse", "jax")
        for impl in order:
            r = run_child(impl, a.model)
            runs[impl].append(r)
            sys.stderr.write(f"  [{i + 1}/{a.repeats}] {impl:8s} first call {r['first_call_s']:.2f}s "
                             f"(XLA compile {r['xla_compile_s']:.2f}s"
                             + (f", hlofuse passes {r['passes_s']:.2f}s" if "passes_s" in r else "")
                             + ")\n")
    med = {k: statistics.median(x["first_call_s"] for x in v) for k, v in runs.items()}
    ratio = med["hlofuse"] / med["jax"]
    print(f"first call on {a.model} (median of {a.repeats} fresh processes each): "
          f"jax.jit {med['jax']:.2f}s, hlofuse.jit {med['hlofuse']:.2f}s, ratio {ratio:.2f}x "
          f"(target <= {TARGET:.0f}x: {'met' if ratio <= TARGET else 'NOT met'})")
    hl = runs["hlofuse"][-1]
    print(f"  hlofuse breakdown (last run): passes {hl.get('passes_s', 0):.2f}s, XLA compile "
          f"{hl['xla_compile_s']:.2f}s, slowest passes {hl.get('slowest_passes')}")
    if a.json:
        with open(a.json, "w") as fh:
            json.dump({"model": a.model, "median_s": med, "ratio": ratio, "target": TARGET,
                       "runs": runs}, fh, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
