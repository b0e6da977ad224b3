"""Per-call (dispatch) overhead of ``hlofuse.jit`` against ``jax.jit``.

A tiny function (a few elementwise ops on 8 floats, so the device work is negligible) is
called many times through ``jax.jit``, ``hlofuse.jit`` with autotune off, with autotune on
(after its decision), after a tiered first call's switch to hlofuse's code, and with static
and keyword arguments. Timings are interleaved: every
round times each variant for ``--calls`` calls, rotating the order; the figure is the median
over rounds of microseconds per call (results not waited on per call, like a training loop;
one ``block_until_ready`` at the end of each batch). The goal is hlofuse within jax.jit +
10 µs.

    python -m bench.call_overhead [--rounds 15] [--calls 2000] [--json out.json]

``--tuning resnet_nhwc,attn_s2048`` instead reports what autotuning costs a user: the first,
second (tuning) and third call of ``hlofuse.jit(autotune='on')`` on those bench workloads in a
fresh process with an empty decision cache, then the same in a second process that finds the
decisions on disk, against ``autotune='off'``.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time

GOAL_US = 10.0


def _variants():
    import jax
    import jax.numpy as jnp
    import hlofuse

    def f(x, y):
        return jnp.tanh(x * y + 1.0) - y

    def g(x, y, *, scale, n):
        return (x * scale + y) ** n

    x = jnp.arange(8.0, dtype=jnp.float32)
    y = jnp.ones(8, jnp.float32)
    jf = jax.jit(f)
    hf_off = hlofuse.jit(f, tiered=False, autotune=False)
    hf_on = hlofuse.jit(f, tiered=False, autotune=True)
    # the default first call: XLA's code, hlofuse's module built in the background (the
    # module cache is fresh, see measure), then switched to
    hf_tier = hlofuse.jit(f, tiered=True, autotune=False)
    jax.block_until_ready(hf_tier(x, y))
    hf_tier.block_until_optimized()
    jg = jax.jit(g, static_argnames="n")
    hg = hlofuse.jit(g, tiered=False, static_argnames="n", autotune=False)
    return {
        "jax.jit": lambda: jf(x, y),
        "hlofuse.jit": lambda: hf_off(x, y),
        "hlofuse.jit autotune=on": lambda: hf_on(x, y),
        "hlofuse.jit tiered": lambda: hf_tier(x, y),
        "jax.jit kwargs+static": lambda: jg(x, y, scale=2.0, n=2),
        "hlofuse.jit kwargs+static": lambda: hg(x, y, scale=2.0, n=2),
    }


def measure(rounds: int, calls: int) -> dict:
    import jax
    from bench import runner
    runner.fresh_cache_dir("hlofuse-overhead-cache-")   # a tiered first call needs a cold cache
    fns = _variants()
    for fn in fns.values():          # compile, and let autotune decide (2nd call)
        for _ in range(3):
            jax.block_until_ready(fn())
    names = list(fns)
    times = {n: [] for n in names}
    for r in range(rounds):
        order = names[r % len(names):] + names[:r % len(names)]
        for n in order:
            fn = fns[n]
            t0 = time.perf_counter()
            for _ in range(calls):
                out = fn()
            jax.block_until_ready(out)
            times[n].append((time.perf_counter() - t0) / calls * 1e6)
    med = {n: statistics.median(v) for n, v in times.items()}
    return {"us_per_call": med,
            "overhead_us": {
                "hlofuse.jit": med["hlofuse.jit"] - med["jax.jit"],
                "hlofuse.jit autotune=on": med["hlofuse.jit autotune=on"] - med["jax.jit"],
                "hlofuse.jit tiered": med["hlofuse.jit tiered"] - med["jax.jit"],
                "hlofuse.jit kwargs+static": (med["hlofuse.jit kwargs+static"]
                                              - med["jax.jit kwargs+static"])},
            "rounds": rounds, "calls": calls, "goal_us": GOAL_US}


def _tuning_child(name: str, mode: str) -> None:
    import jax
    import hlofuse
    from bench import workloads
    fn, args = workloads.get(name).instantiate(0)
    args = jax.block_until_ready(args)
    f = hlofuse.jit(fn, tiered=False, autotune=mode)
    calls = []
    for _ in range(3):
        t0 = time.perf_counter()
        jax.block_until_ready(f(*args))
        calls.append(time.perf_counter() - t0)
    d = f.autotune_decision(*args)
    print(json.dumps({"calls_s": calls, "decision": d.variant if d else None,
                      "reason": d.reason if d else ""}))


def tuning(names: list[str]) -> list[dict]:
    import os
    import subprocess
    import tempfile
    rows = []
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    for name in names:
        with tempfile.TemporaryDirectory() as cache:
            env = dict(os.environ, HLOFUSE_CACHE_DIR=cache)
            for label, mode in [("off", "off"), ("on, empty cache", "on"),
                                ("on, warm cache", "on"), ("cached", "cached")]:
                p = subprocess.run([sys.executable, "-m", "bench.call_overhead", "--tuning-child",
                                    name, mode], capture_output=True, text=True, env=env,
                                   cwd=root, timeout=900)
                line = [ln for ln in p.stdout.splitlines() if ln.startswith("{")]
                if not line:
                    raise RuntimeError(f"{name} {mode}: {p.stderr[-600:]}")
                rows.append(dict(json.loads(line[-1]), workload=name, mode=label))
    return rows


def main(argv=None) -> int:
    if argv is None and sys.argv[1:2] == ["--tuning-child"]:
        _tuning_child(sys.argv[2], sys.argv[3])
        return 0
    ap = argparse.ArgumentParser(prog="python -m bench.call_overhead",
                                 description=__doc__.split("\n\n")[0])
    ap.add_argument("--rounds", type=int, default=15)
    ap.add_argument("--calls", type=int, default=2000)
    ap.add_argument("--json", default=None, help="also write the figures to this file")
    ap.add_argument("--tuning", default=None, metavar="WORKLOADS",
                    help="comma-separated bench workloads: report the autotune call costs")
    args = ap.parse_args(argv)
    if args.tuning:
        rows = tuning(args.tuning.split(","))
        print("autotune cost per call (s), fresh process each; 2nd call is the tuning call:")
        for r in rows:
            c = r["calls_s"]
            print(f"  {r['workload']:14s} {r['mode']:16s} 1st {c[0]:6.2f}  2nd {c[1]:6.2f}  "
                  f"3rd {c[2]:6.3f}  decision: {r['decision']}")
        if args.json:
            with open(args.json, "w") as fh:
                json.dump(rows, fh, indent=1)
        return 0
    res = measure(args.rounds, args.calls)
    import jax
    print(f"per-call time, median of {args.rounds} interleaved rounds x {args.calls} calls "
          f"(jax {jax.__version__}, {jax.default_backend()}):")
    for n, v in res["us_per_call"].items():
        print(f"  {n:28s} {v:7.1f} us")
    ok = True
    for n, v in res["overhead_us"].items():
        good = v <= GOAL_US
        ok &= good
        print(f"  overhead {n:19s} {v:+7.1f} us  ({'within' if good else 'OVER'} the "
              f"{GOAL_US:.0f} us goal)")
    if args.json:
        with open(args.json, "w") as fh:
            json.dump(res, fh, indent=1)
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
