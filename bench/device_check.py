"""On a machine with a GPU or TPU: real kernels (not interpret mode) against ``jax.jit``.

    python -m bench.device_check [--quick] [--no-bench] [--json out.json]

1. Runs every program of ``tests/programs.py`` and the benchmark workloads with
   ``hlofuse.jit`` on the device (Triton or Mosaic kernels, compiled for the chip that is
   there) and with ``jax.jit`` on the same device, and compares the outputs with the tolerance
   table (:func:`hlofuse.runtime.testing.compare`). Reports kernels per program and mismatches.
2. Runs the benchmark (``python -m bench``, ``--quick`` passed through) on the device.

On a CPU-only machine it prints why it skips and exits 0: the deviceless compile check is
``hlofuse check --compile-for`` / ``.ci/aot_matrix.py``. Exit 1 on a mismatch or an error.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
import traceback


def _device() -> str | None:
    import jax
    backend = jax.default_backend()
    return backend if backend in ("gpu", "cuda", "tpu") else None


def _programs(quick: bool):
    import numpy as np
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    if root not in sys.path:
        sys.path.insert(0, root)
    from tests.programs import PROGRAMS
    from bench import workloads
    out = []
    for p in PROGRAMS:
        out.append((f"program:{p.name}", p.fn, lambda p=p: p.args(np.random.default_rng(0)),
                    p.static_argnums, p.category))
    names = workloads.QUICK if quick else workloads.DEFAULT
    for n in names:
        w = workloads.get(n)
        out.append((f"workload:{n}", None, lambda w=w: w.instantiate(0), (), "reassociate"))
    return out


def check_programs(quick: bool) -> list[dict]:
    import jax
    import hlofuse
    from hlofuse.runtime.testing import compare
    rows = []
    for name, fn, make, static, category in _programs(quick):
        t0 = time.perf_counter()
        row = {"name": name}
        try:
            if fn is None:
                fn, args = make()
            else:
                args = make()
            want = jax.jit(fn, static_argnums=static)(*args)
            hf = hlofuse.jit(fn, tiered=False, static_argnums=static)  # target: this device
            got = hf(*args)
            rep = hf.report(*args)
            problems = compare(jax.tree_util.tree_leaves(got), jax.tree_util.tree_leaves(want), category)
            row.update(kernels=len(rep.kernels), left_to_xla=len(rep.left_to_xla),
                       ok=not problems, problems=problems[:3])
        except Exception as e:   # noqa: BLE001 -- report every program, fail at the end
            row.update(ok=False, problems=[f"{type(e).__name__}: {str(e).splitlines()[0][:300]}"],
                       traceback=traceback.format_exc()[-2000:])
        row["seconds"] = round(time.perf_counter() - t0, 2)
        rows.append(row)
        status = "ok " if row["ok"] else "BAD"
        print(f"  {status} {name}: {row.get('kernels', 0)} kernel(s) "
              f"{'; '.join(row['problems'])}", flush=True)
    return rows


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="fewer workloads; passed to the benchmark")
    ap.add_argument("--no-bench", action="store_true", help="skip the benchmark")
    ap.add_argument("--json", default=None)
    a = ap.parse_args(argv)
    dev = _device()
    if dev is None:
        import jax
        print(f"device_check: skipped: no GPU or TPU here (jax backend: {jax.default_backend()}). "
              f"On CPU, prove compilation instead: hlofuse check --compile-for h100,a100,v5e,v4 FILE")
        return 0
    import jax
    print(f"device_check on {jax.devices()[0].device_kind} ({dev}), jax {jax.__version__}")
    rows = check_programs(a.quick)
    bad = [r for r in rows if not r["ok"]]
    bench_rc = None
    if not a.no_bench:
        from bench.__main__ import main as bench_main
        bench_rc = bench_main((["--quick"] if a.quick else []))
    if a.json:
        with open(a.json, "w") as fh:
            json.dump({"device": jax.devices()[0].device_kind, "programs": rows,
                       "bench_rc": bench_rc}, fh, indent=1)
    print(f"{len(rows) - len(bad)} passed, {len(bad)} failed")
    return 1 if bad or bench_rc else 0


if __name__ == "__main__":
    sys.exit(main())
