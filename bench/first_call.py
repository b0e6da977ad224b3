"""First-call time of ``hlofuse.jit`` vs ``jax.jit``, cold and with a warm cache.

Each measurement runs in a fresh Python process: the child imports jax and hlofuse, builds
the arguments, then times the first call of a fresh jitted function until its result is ready
(tracing + hlofuse's export and passes + XLA compile + one run). Three kinds of process,
interleaved per repeat: ``jax`` (plain ``jax.jit``, no persistent cache: as a user gets it),
``cold`` (hlofuse with an empty cache directory) and ``warm`` (hlofuse in a second process
whose cache directory an earlier process filled: optimized modules, decisions, jax's
compilation cache). Medians are compared with the targets: cold <= 2x, warm <= 1.2x. The
hlofuse children also report where the time went (pass pipeline, XLA compile in all threads).

hlofuse's cold first call is tiered by default (XLA's code for the function now, hlofuse's
module optimized and compiled in a background thread): the **ready** column is the time from
that call's start until hlofuse's own code is ready (``HlofuseFunction.block_until_optimized``),
the first call's time when it was built in place (warm cache, ``HLOFUSE_TIERED=0``).

    python -m bench.first_call [--repeats 3] [--models bert_s128,mlp_3x4096] [--json out.json]

``--models`` takes bench workloads and zoo models (``nnx_bert``, ``eqx_gpt_train``, ...; the
zoo needs ``pip install -e ".[zoo]"``), or ``default`` (the bench's default workloads).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time

TARGET = 2.0        # cold: empty caches
TARGET_WARM = 1.2   # a second process with the caches the first one filled


def _child(impl: str, model: str) -> None:
    import jax
    import hlofuse

    compile_s = []
    jax.monitoring.register_event_duration_secs_listener(
        lambda ev, secs, **kw: compile_s.append(secs) if ev.endswith("backend_compile_duration") else None)
    fn, args = _instantiate(model)
    args = jax.block_until_ready(args)
    compile_s.clear()   # the compiles that made the arguments are not the first call's
    f = jax.jit(fn) if impl == "jax" else hlofuse.jit(fn)
    from hlofuse.runtime import module_cache
    t0 = time.perf_counter()
    jax.block_until_ready(f(*args))
    total = time.perf_counter() - t0
    out = {"impl": impl, "first_call_s": total, "ready_s": total}
    if impl == "hlofuse":
        # a tiered first call ran XLA's code: hlofuse's is ready when the background build is
        f.block_until_optimized()
        st = f.tier_status(*args)
        out["tier"] = st.get("state")
        if st.get("state") == "ready":
            out["ready_s"] = st["seconds"]
    out["xla_compile_s"] = sum(compile_s)
    if impl == "hlofuse":
        rep = f.report(*args)
        out["passes_s"] = sum(rep.pass_seconds.values())
        out["slowest_passes"] = sorted(rep.pass_seconds.items(), key=lambda kv: -kv[1])[:4]
        out["kernels"] = len(rep.kernels)
        out["module_cache"] = dict(module_cache.STATS)
    print(json.dumps(out))


def _instantiate(model: str):
    """A bench workload (bench/workloads.py) or a zoo model (bench/zoo, real config: needs
    the ``.[zoo]`` extra)."""
    from bench import workloads
    if model in workloads.WORKLOADS:
        return workloads.get(model).instantiate(0)
    from bench import zoo
    return zoo.instantiate(model, "real", 0)


def run_child(impl: str, model: str, cache_dir: str | None = None) -> dict:
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    env = dict(os.environ)
    if cache_dir is not None:
        env["HLOFUSE_CACHE_DIR"] = cache_dir
    p = subprocess.run([sys.executable, "-m", "bench.first_call", "--child", impl, model],
                       capture_output=True, text=True, cwd=root, timeout=900, env=env)
    for line in reversed(p.stdout.splitlines()):
        if line.startswith("{"):
            return json.loads(line)
    raise RuntimeError(f"{impl} child failed (rc={p.returncode}): {p.stderr[-800:]}")


def measure_model(model: str, repeats: int, tmp: str) -> dict:
    """Interleaved fresh processes: jax, hlofuse cold (new empty cache dir each), hlofuse warm
    (the cache dir of the first cold run, filled by it)."""
    import tempfile
    runs = {"jax": [], "cold": [], "warm": []}
    warm_dir = None
    for i in range(repeats):
        kinds = ("jax", "cold", "warm") if i % 2 == 0 else ("warm", "cold", "jax")
        for kind in kinds:
            if kind == "jax":
                r = run_child("jax", model)
            elif kind == "cold":
                d = tempfile.mkdtemp(dir=tmp)
                r = run_child("hlofuse", model, d)
                warm_dir = warm_dir or d
            else:
                if warm_dir is None:  # fill one first
                    warm_dir = tempfile.mkdtemp(dir=tmp)
                    run_child("hlofuse", model, warm_dir)
                r = run_child("hlofuse", model, warm_dir)
            runs[kind].append(r)
            sys.stderr.write(f"  {model} [{i + 1}/{repeats}] {kind:5s} first call "
                             f"{r['first_call_s']:.2f}s, hlofuse's code ready "
                             f"{r.get('ready_s', r['first_call_s']):.2f}s ({r.get('tier')}; "
                             f"XLA compile {r['xla_compile_s']:.2f}s"
                             + (f", passes {r['passes_s']:.2f}s, module cache "
                                f"{r['module_cache']}" if "passes_s" in r else "") + ")\n")
    med = {k: statistics.median(x["first_call_s"] for x in v) for k, v in runs.items()}
    ready = statistics.median(x.get("ready_s", x["first_call_s"]) for x in runs["cold"])
    return {"model": model, "median_s": med, "cold_ratio": med["cold"] / med["jax"],
            "warm_ratio": med["warm"] / med["jax"], "cold_ready_s": ready,
            "cold_ready_ratio": ready / med["jax"],
            "tiers": sorted({str(x.get("tier")) for x in runs["cold"]}), "runs": runs}


def main(argv=None) -> int:
    import tempfile
    ap = argparse.ArgumentParser(prog="python -m bench.first_call", description=__doc__.split("\n\n")[0])
    ap.add_argument("--repeats", type=int, default=3, help="fresh processes per kind")
    ap.add_argument("--models", "--model", default="bert_s128",
                    help="comma-separated workloads (bench/workloads.py) or zoo models "
                         "(bench/zoo), or 'default'")
    ap.add_argument("--json", default=None)
    ap.add_argument("--child", nargs=2, metavar=("IMPL", "MODEL"), help=argparse.SUPPRESS)
    a = ap.parse_args(argv)
    if a.child:
        _child(*a.child)
        return 0
    from bench import workloads
    models = workloads.DEFAULT if a.models == "default" else a.models.split(",")
    results = []
    with tempfile.TemporaryDirectory(prefix="hlofuse-first-call-") as tmp:
        for m in models:
            results.append(measure_model(m, a.repeats, tmp))
    print(f"{'model':20s} {'jax.jit':>8s} {'cold':>8s} {'warm':>8s} {'cold/jax':>9s} "
          f"{'warm/jax':>9s} {'ready':>8s} {'ready/jax':>9s}  (median of {a.repeats} fresh "
          f"processes; targets cold <= {TARGET:.1f}x, warm <= {TARGET_WARM:.1f}x; ready: "
          f"hlofuse's code in place after a cold first call)")
    for r in results:
        med = r["median_s"]
        print(f"{r['model']:20s} {med['jax']:7.2f}s {med['cold']:7.2f}s {med['warm']:7.2f}s "
              f"{r['cold_ratio']:8.2f}x{'' if r['cold_ratio'] <= TARGET else '!'} "
              f"{r['warm_ratio']:8.2f}x{'' if r['warm_ratio'] <= TARGET_WARM else '!'} "
              f"{r['cold_ready_s']:7.2f}s {r['cold_ready_ratio']:8.2f}x")
    if a.json:
        with open(a.json, "w") as fh:
            json.dump({"targets": {"cold": TARGET, "warm": TARGET_WARM}, "results": results},
                      fh, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
