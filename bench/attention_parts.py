"""A/B of the cpu attention loops' split (one independent loop per core, or one loop).

    python -m bench.attention_parts                       # attn_s4096, 12 interleaved rounds
    python -m bench.attention_parts --models attn_s2048,bert_s512 --rounds 20

Per bench workload (``bench/workloads.py``), three functions interleaved in one process:
``jax.jit``, ``hlofuse.jit`` with the attention loops split into ``--parts`` (default 2) and
with one loop (``hlofuse.kernels.attention.cpu.CPU_PARTS``, set before each build; the module
cache and the XLA-option autotune are off and kernelize's in-process kernel cache is cleared, so
each build is fresh and nothing else differs; the kernels' block descriptions are printed).
Prints each hlofuse variant's median per-round time ratio to jax.jit and the median per-round
ratio split / one loop.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys

os.environ["HLOFUSE_MODULE_CACHE"] = "0"   # the cache does not key on the split
os.environ.setdefault("HLOFUSE_AUTOTUNE", "0")


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--models", default="attn_s4096")
    ap.add_argument("--rounds", type=int, default=12)
    ap.add_argument("--parts", type=int, default=2)
    a = ap.parse_args(argv)
    import numpy as np
    import jax
    import hlofuse
    from hlofuse.kernels.attention import cpu as C
    from hlofuse.passes import kernelize
    from bench.runner import timed_calls
    from bench.workloads import WORKLOADS
    for name in a.models.split(","):
        w = WORKLOADS[name]
        args = jax.tree.map(jax.device_put, w.make_args(np.random.default_rng(0)))
        fns = {"jax": jax.jit(w.fn)}
        for label, parts in (("split", a.parts), ("one", 1)):
            C.CPU_PARTS = parts
            kernelize._CACHE.clear()           # lowered kernels are cached in-process too
            f = hlofuse.jit(w.fn, tiered=False, autotune=False)
            jax.block_until_ready(f(*args))                    # builds with this split
            blocks = [r.block for r in f.report(*args).regions if "attention" in r.kind]
            print(f"{name}: {label}: attention kernels {blocks}", flush=True)
            fns[label] = f
        for f in fns.values():
            jax.block_until_ready(f(*args))
        t = {n: [] for n in fns}
        for r in range(a.rounds):
            for n in (list(fns) if r % 2 == 0 else list(reversed(list(fns)))):
                t[n].append(timed_calls(fns[n], args, 1))   # + an untimed quiesce

        def med(x, y):
            return statistics.median(p / q for p, q in zip(t[x], t[y]))
        print(f"{name}: jax {statistics.median(t['jax']) * 1e3:.1f} ms; ratio to jax.jit: "
              f"{a.parts} loops {med('split', 'jax'):.3f}, one loop {med('one', 'jax'):.3f}; "
              f"{a.parts} loops / one loop {med('split', 'one'):.3f} (load "
              f"{os.getloadavg()[0]:.1f})", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
