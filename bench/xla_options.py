"""How much do XLA:CPU's compiler-option variants matter per workload? (evidence for autotune)

    python -m bench.xla_options [--models ...] [--rounds 7] [--hlofuse]

For each workload, times ``jax.jit(fn, compiler_options=variant)`` for every variant in
:data:`hlofuse.runtime.autotune.VARIANTS` (interleaved rounds, :func:`hlofuse.runtime.autotune.measure`) and
prints the median per-round time ratio to XLA's defaults, plus which variants compile to the
same optimized HLO. With ``--hlofuse`` the module measured is hlofuse's optimized one (what
``hlofuse.jit(autotune=True)`` tunes) instead of plain ``jax.jit``'s.
"""

from __future__ import annotations

import argparse
import json
import sys
import time


def main(argv=None) -> int:
    import jax
    from bench import workloads
    from hlofuse.runtime import autotune
    ap = argparse.ArgumentParser(prog="python -m bench.xla_options", description=__doc__.split("\n\n")[0])
    ap.add_argument("--models", nargs="+", default=None)
    ap.add_argument("--rounds", type=int, default=7)
    ap.add_argument("--budget", type=float, default=120.0, help="seconds per workload at most")
    ap.add_argument("--hlofuse", action="store_true", help="measure hlofuse's optimized module")
    ap.add_argument("--json", default=None)
    a = ap.parse_args(argv)
    names = []
    for m in a.models or workloads.QUICK:
        names += [x for x in m.split(",") if x]
    variants = autotune.VARIANTS[jax.devices()[0].platform] if jax.devices()[0].platform in \
        autotune.VARIANTS else {"default": {}}
    out = {}
    print(f"time ratio to XLA defaults, median of per-round ratios ({'hlofuse module' if a.hlofuse else 'jax.jit'})")
    for n in names:
        fn, args = workloads.get(n).instantiate(0)
        leaves = jax.tree_util.tree_leaves(args)
        if a.hlofuse:
            import hlofuse
            low = hlofuse.jit(fn, autotune=False).lower(*args)
            call = low.exported.call
        else:
            tree = jax.tree_util.tree_structure(args)

            def call(*xs, _fn=fn, _tree=tree):
                return _fn(*jax.tree_util.tree_unflatten(_tree, xs))
        t0 = time.perf_counter()
        m = autotune.measure(call, leaves, variants, budget_s=a.budget, rounds=a.rounds)
        out[n] = {"ratios": m.ratios, "wins_majority": m.eligible, "default_s": m.default_s,
                  "rounds": m.rounds, "same_hlo_as_another": m.duplicates, "skipped": m.skipped}
        cells = "  ".join(f"{k} {v:.2f}" for k, v in m.ratios.items() if k != "default")
        print(f"  {n:<20} default {m.default_s * 1e3:8.1f} ms  {cells}"
              f"{'  (same HLO: ' + ', '.join(m.duplicates) + ')' if m.duplicates else ''}"
              f"{'  skipped: ' + m.skipped if m.skipped else ''}  [{time.perf_counter() - t0:.0f}s]",
              flush=True)
    if a.json:
        with open(a.json, "w") as fh:
            json.dump(out, fh, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
