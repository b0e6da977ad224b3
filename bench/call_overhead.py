"""Per-call (dispatch) overhead of ``hlofuse.jit`` against ``jax.jit``.

A tiny function (a few elementwise ops on 8 floats, so the device work is negligible) is
called many times through ``jax.jit``, ``hlofuse.jit`` with autotune off, with autotune on
(after its decision) and with static and keyword arguments. Timings are interleaved: every
round times each variant for ``--calls`` calls, rotating the order; the figure is the median
over rounds of microseconds per call (results not waited on per call, like a training loop;
one ``block_until_ready`` at the end of each batch). The goal is hlofuse within jax.jit +
10 µs.

    python -m bench.call_overhead [--rounds 15] [--calls 2000] [--json out.json]
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
    hf_off = hlofuse.jit(f, autotune=False)
    hf_on = hlofuse.jit(f, autotune=True)
    jg = jax.jit(g, static_argnames="n")
    hg = hlofuse.jit(g, static_argnames="n", autotune=False)
    return {
        "jax.jit": lambda: jf(x, y),
        "hlofuse.jit": lambda: hf_off(x, y),
        "hlofuse.jit autotune=on": lambda: hf_on(x, y),
        "jax.jit kwargs+static": lambda: jg(x, y, scale=2.0, n=2),
        "hlofuse.jit kwargs+static": lambda: hg(x, y, scale=2.0, n=2),
    }


def measure(rounds: int, calls: int) -> dict:
    import jax
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
                "hlofuse.jit kwargs+static": (med["hlofuse.jit kwargs+static"]
                                              - med["jax.jit kwargs+static"])},
            "rounds": rounds, "calls": calls, "goal_us": GOAL_US}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog="python -m bench.call_overhead",
                                 description=__doc__.split("\n\n")[0])
    ap.add_argument("--rounds", type=int, default=15)
    ap.add_argument("--calls", type=int, default=2000)
    ap.add_argument("--json", default=None, help="also write the figures to this file")
    args = ap.parse_args(argv)
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
