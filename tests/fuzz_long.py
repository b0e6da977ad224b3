"""Long differential fuzz run that records every failing program instead of stopping at the first.

    JAX_PLATFORMS=cpu python tests/fuzz_long.py --examples 10000 --out fuzz.jsonl [--target cpu]
        [--seed 0] [--category kernel] [--no-verify] [--minutes 40]

Each failure is one JSON line: the error, the program (``GraphSpec.source()``) and the
``GraphSpec`` repr to paste into a regression test. The program under test is also written to
``<out>.current`` before it runs, so a crash of the process (XLA aborting) leaves the culprit. Progress (graphs tried, failures, kernels
made) is printed every 50 graphs. ``tests/test_fuzz.py`` runs the same check under pytest with a
fixed budget (``HLOFUSE_FUZZ_EXAMPLES``), stopping and shrinking at the first failure.
"""

import argparse
import json
import os
import time
import traceback
import warnings

os.environ.setdefault("JAX_PLATFORMS", "cpu")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--examples", type=int, default=10_000)
    ap.add_argument("--out", default="fuzz.jsonl")
    ap.add_argument("--target", default="cpu", choices=["cpu", "gpu", "tpu"])
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--category", default=None, help="tolerance category (default: by kernel kinds)")
    ap.add_argument("--no-verify", action="store_true", help="skip hlofuse.verify on each graph")
    ap.add_argument("--minutes", type=float, default=0, help="stop after this long (0: no limit)")
    args = ap.parse_args()

    from hypothesis import HealthCheck, Phase, given, seed, settings
    from hlofuse.testing import stablehlo_graphs
    from hlofuse.verify import check_graph

    warnings.simplefilter("ignore")
    stats = {"tried": 0, "failed": 0, "kernels": 0}
    t0 = time.time()
    deadline = t0 + 60 * args.minutes if args.minutes else None

    def progress(final=False):
        print(("DONE " if final else "") + json.dumps(dict(stats, seconds=round(time.time() - t0))), flush=True)

    with open(args.out, "a") as fh:
        @settings(max_examples=args.examples, deadline=None, database=None, phases=[Phase.generate],
                  suppress_health_check=list(HealthCheck))
        @given(stablehlo_graphs())
        def run(spec):
            if deadline and time.time() > deadline:
                return
            stats["tried"] += 1
            with open(args.out + ".current", "w") as cur:  # survives a crash of this process
                cur.write(repr(spec) + "\n" + spec.source() + "\n")
            try:
                opt = check_graph(spec, target=args.target, category=args.category,
                                  verify=not args.no_verify)
                stats["kernels"] += len(opt.report.kernels)
            except Exception as e:  # noqa: BLE001 - every failure is recorded
                stats["failed"] += 1
                fh.write(json.dumps({"err": f"{type(e).__name__}: {str(e)[:3000]}", "src": spec.source(),
                                     "spec": repr(spec), "tb": traceback.format_exc()[-3000:]}) + "\n")
                fh.flush()
            if stats["tried"] % 50 == 0:
                progress()

        seed(args.seed)(run)()
    progress(final=True)


if __name__ == "__main__":
    main()
