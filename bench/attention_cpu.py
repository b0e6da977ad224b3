"""Long-sequence attention on CPU: ``hlofuse.jit`` vs ``jax.jit``, time and peak memory.

    python bench/attention_cpu.py                  # S=2048 and 4096, 10 interleaved rounds
    python bench/attention_cpu.py --seq 4096 --rounds 20 --json out.json
    python bench/attention_cpu.py --no-rss         # time only
    python bench/attention_cpu.py --seq 4096 --no-rss --profile   # + where the kernel's time goes

Workload: B=1, H=8, d=64, f32, ``softmax(QKᵀ/√d)·V`` written as models write it (BSHD einsums,
``jax.nn.softmax``). Goals (issue 4): time ratio hlofuse/jax <= 0.45 at S=4096 and <= 0.55 at
S=2048; peak RSS <= 1/8 of jax.jit's at S=4096.

Time: both functions compiled and called ``WARMUP`` times first, then rounds that run each once in alternating order
(A B, B A, ...); the ratio is the median of the per-round ratios (robust to a noisy, shared
machine). Wall and process-CPU time are both reported.

Memory, two figures, each from a fresh subprocess per function:

* run memory (``--rss-child``): import, build inputs, compile ahead of time (no run), read
  RSS, reset the kernel's peak-RSS mark (``/proc/self/clear_refs`` = 5), run once; the memory
  the computation needs is the peak (``VmHWM``) minus the RSS before the run. (``ru_maxrss`` is
  the same high-water mark but cannot be reset, and a child started by fork+exec inherits the
  parent's value, so ``VmHWM`` is read instead.)
* whole-process peak (``--peak-child``): import, inputs, compile and 3 calls, ``VmHWM`` at the
  end: what a fresh process running the function peaks at (~200 MiB of it is Python + jax).
"""

from __future__ import annotations

import argparse
import json
import math
import os
import statistics
import subprocess
import sys
import time

B, H, D = 1, 8, 64


def attention(q, k, v):
    import jax
    import jax.numpy as jnp
    s = jnp.einsum("bqhd,bkhd->bhqk", q, k) * (1.0 / math.sqrt(q.shape[-1]))
    p = jax.nn.softmax(s, axis=-1)
    return jnp.einsum("bhqk,bkhd->bqhd", p, v)


def make_inputs(seq: int):
    import numpy as np
    rng = np.random.default_rng(0)
    return [rng.standard_normal((B, seq, H, D)).astype(np.float32) for _ in range(3)]


def functions():
    import jax
    import hlofuse
    return {"jax": jax.jit(attention), "hlofuse": hlofuse.jit(attention, tiered=False)}


def _status_kib(key: str) -> int:
    with open("/proc/self/status") as fh:
        for line in fh:
            if line.startswith(key + ":"):
                return int(line.split()[1])
    return 0


def rss_child(which: str, seq: int) -> dict:
    import jax
    fn = functions()[which]
    args = [jax.device_put(a) for a in make_inputs(seq)]
    compiled = fn.lower(*args).compile()                   # ahead of time: no run yet
    base = _status_kib("VmRSS")
    reset = _reset_peak()
    jax.block_until_ready(compiled(*args))                 # the first run allocates its buffers
    run_peak = _status_kib("VmHWM")
    for _ in range(2):
        jax.block_until_ready(compiled(*args))
    return {"which": which, "seq": seq, "base_kib": base, "run_peak_kib": run_peak,
            "run_kib": run_peak - base if reset else None,
            "process_peak_kib": _status_kib("VmHWM") if not reset else None,
            "peak_reset": reset}


def process_peak_child(which: str, seq: int) -> dict:
    """Whole fresh process: import, inputs, compile, 3 calls; the VmHWM high-water mark (the
    figure ``ru_maxrss`` gives for a process started by exec, without the parent's history)."""
    import jax
    fn = functions()[which]
    args = [jax.device_put(a) for a in make_inputs(seq)]
    for _ in range(3):
        jax.block_until_ready(fn(*args))
    return {"which": which, "seq": seq, "process_peak_kib": _status_kib("VmHWM")}


def _reset_peak() -> bool:
    try:
        with open("/proc/self/clear_refs", "w") as fh:     # reset VmHWM to the current RSS
            fh.write("5")
        return True
    except OSError:
        return False


def measure_rss(which: str, seq: int, mode: str = "--rss-child") -> dict:
    out = subprocess.run([sys.executable, os.path.abspath(__file__), mode, which,
                          "--seq", str(seq)], capture_output=True, text=True, timeout=1800,
                         env=dict(os.environ, PYTHONWARNINGS="ignore"))
    if out.returncode != 0:
        raise RuntimeError(f"rss child {which} failed: {out.stderr[-2000:]}")
    return json.loads(out.stdout.strip().splitlines()[-1])


def measure_time(seq: int, rounds: int) -> dict:
    import jax
    from hlofuse.runtime.testing import compare
    from hlofuse.runtime.autotune import quiesce
    fns = functions()
    args = [jax.device_put(a) for a in make_inputs(seq)]
    outs = {n: jax.block_until_ready(f(*args)) for n, f in fns.items()}   # compile
    for _ in range(WARMUP):   # past hlofuse's one-time autotuning call (hlofuse.runtime.autotune)
        for f in fns.values():
            jax.block_until_ready(f(*args))
    problems = compare(outs["hlofuse"], outs["jax"], "reassociate")
    report = fns["hlofuse"].report(*args)
    att = [r for r in report.regions if r.kind == "attention"]
    wall = {n: [] for n in fns}
    cpu = {n: [] for n in fns}
    for r in range(rounds):
        order = list(fns) if r % 2 == 0 else list(reversed(list(fns)))
        for n in order:
            c0, t0 = time.process_time(), time.perf_counter()
            jax.block_until_ready(fns[n](*args))
            wall[n].append(time.perf_counter() - t0)
            cpu[n].append(time.process_time() - c0)
            quiesce(wall[n][-1])   # untimed: jax.jit's 1 GiB is freed after its outputs are ready
    ratio = [h / j for h, j in zip(wall["hlofuse"], wall["jax"])]
    cratio = [h / j for h, j in zip(cpu["hlofuse"], cpu["jax"])]
    return {
        "seq": seq, "rounds": rounds, "same_results": not problems, "problems": problems[:2],
        "kernel": att[0].kernel if att else None, "blocks": att[0].block if att else None,
        "jax_s": statistics.median(wall["jax"]), "hlofuse_s": statistics.median(wall["hlofuse"]),
        "time_ratio": statistics.median(ratio), "time_ratio_min": min(ratio),
        "time_ratio_max": max(ratio), "cpu_time_ratio": statistics.median(cratio),
        # cores kept busy (process CPU time / wall): jax.jit's big ops use every core; where the
        # kernel's figure is lower, its wall ratio is above its cpu-time ratio by that much
        "cores": {n: statistics.median(c / w for c, w in zip(cpu[n], wall[n])) for n in fns},
        "load_avg": os.getloadavg()[0],
    }



def profile_ops(seq: int, top: int = 12) -> list:
    """Where one ``hlofuse.jit`` call spends its time: XLA:CPU's per-thunk trace events
    (``jax.profiler``, perfetto JSON) summed per fusion, largest first, as
    ``(name, calls, ms, what)`` with ``what`` the fusion's root ops from the optimized HLO
    (e.g. the block dots, the row max/sum, the exp pass, the K/V block slices)."""
    import collections
    import glob
    import gzip
    import re
    import tempfile
    import jax
    f = functions()["hlofuse"]
    args = [jax.device_put(a) for a in make_inputs(seq)]
    for _ in range(2):
        jax.block_until_ready(f(*args))
    hlo = re.sub(r", metadata=\{[^}]*\}", "", f.lower(*args).compile().as_text())
    bodies = {m.group(1): m.group(2) for m in
              re.finditer(r"^%(\S+) \(.*?\) -> .*? \{\n(.*?)\n\}", hlo, re.S | re.M)}
    calls = dict(re.findall(r"%(\S+) = .*? fusion\(.*?calls=%([\w.\-]+)", hlo))
    with tempfile.TemporaryDirectory() as d:
        with jax.profiler.trace(d, create_perfetto_trace=True):
            jax.block_until_ready(f(*args))
        path = glob.glob(f"{d}/**/*perfetto_trace.json.gz", recursive=True)[0]
        ev = json.load(gzip.open(path))
    ev = ev["traceEvents"] if isinstance(ev, dict) else ev
    tot, cnt = collections.defaultdict(float), collections.Counter()
    for e in ev:
        if e.get("ph") == "X" and e["name"] in calls:
            tot[e["name"]] += e["dur"] / 1e3
            cnt[e["name"]] += 1
    out = []
    for n, ms in sorted(tot.items(), key=lambda x: -x[1])[:top]:
        ops = re.findall(r"= \S+ ([a-z\-]+)\(", bodies.get(calls[n], ""))
        what = ",".join(dict.fromkeys(o for o in ops if o not in (
            "parameter", "bitcast", "broadcast", "constant", "select", "compare", "add",
            "multiply")))
        out.append((n, cnt[n], ms, what or "elementwise"))
    return out


GOALS = {2048: 0.55, 4096: 0.45}
WARMUP = 3


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--seq", type=int, nargs="*", default=[2048, 4096])
    ap.add_argument("--rounds", type=int, default=10)
    ap.add_argument("--no-rss", action="store_true")
    ap.add_argument("--json", default=None)
    ap.add_argument("--profile", action="store_true",
                    help="print where the kernel's time goes (per fusion, one traced call)")
    ap.add_argument("--rss-child", default=None, help=argparse.SUPPRESS)
    ap.add_argument("--peak-child", default=None, help=argparse.SUPPRESS)
    a = ap.parse_args(argv)
    if a.rss_child:
        print(json.dumps(rss_child(a.rss_child, a.seq[0])))
        return 0
    if a.peak_child:
        print(json.dumps(process_peak_child(a.peak_child, a.seq[0])))
        return 0
    results = []
    for seq in a.seq:
        t = measure_time(seq, a.rounds)
        goal = GOALS.get(seq)
        line = (f"S={seq}: jax {t['jax_s']:.3f}s, hlofuse {t['hlofuse_s']:.3f}s, time ratio "
                f"{t['time_ratio']:.3f} (min {t['time_ratio_min']:.3f}, max {t['time_ratio_max']:.3f};"
                f" cpu-time ratio {t['cpu_time_ratio']:.3f}; cores busy jax {t['cores']['jax']:.2f}"
                f" hlofuse {t['cores']['hlofuse']:.2f}; goal <= {goal}) kernel={t['kernel']} "
                f"[{t['blocks']}] same results: {t['same_results']} load {t['load_avg']:.1f}")
        print(line, flush=True)
        if not a.no_rss:
            rj, rh = measure_rss("jax", seq), measure_rss("hlofuse", seq)
            pj, ph = measure_rss("jax", seq, "--peak-child"), measure_rss("hlofuse", seq, "--peak-child")
            t["rss"] = {"jax": rj, "hlofuse": rh, "jax_process": pj, "hlofuse_process": ph}
            t["run_rss_ratio"] = (rh["run_kib"] / max(1, rj["run_kib"])
                                  if rj["run_kib"] is not None else None)
            t["process_peak_ratio"] = ph["process_peak_kib"] / pj["process_peak_kib"]
            mib = lambda k: (k or 0) / 1024  # noqa: E731
            print(f"  memory of one run (peak - RSS before, fresh process, compiled ahead): jax "
                  f"{mib(rj['run_kib']):.0f} MiB, hlofuse {mib(rh['run_kib']):.0f} MiB, ratio "
                  f"{t['run_rss_ratio'] if t['run_rss_ratio'] is not None else float('nan'):.3f} "
                  f"(goal <= 0.125)", flush=True)
            print(f"  whole-process peak RSS (import + compile + 3 runs): jax "
                  f"{mib(pj['process_peak_kib']):.0f} MiB, hlofuse {mib(ph['process_peak_kib']):.0f} MiB,"
                  f" ratio {t['process_peak_ratio']:.3f}", flush=True)
        if a.profile:
            rows = profile_ops(seq)
            total = sum(r[2] for r in rows)
            print(f"  per-fusion time of one hlofuse call (XLA:CPU trace; top {len(rows)}, "
                  f"{total:.0f} ms):", flush=True)
            for n, c, ms, what in rows:
                print(f"    {ms:8.1f} ms {ms / total:6.1%}  x{c:<4d} {n:32s} {what}", flush=True)
            t["profile"] = [list(r) for r in rows]
        results.append(t)
    if a.json:
        with open(a.json, "w") as fh:
            json.dump(results, fh, indent=2)
    return 0


if __name__ == "__main__":
    sys.exit(main())
