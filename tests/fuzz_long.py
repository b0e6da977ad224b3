"""Long differential fuzz run that records every failing program instead of stopping at the first.

    JAX_PLATFORMS=cpu python tests/fuzz_long.py --examples 10000 --out fuzz.jsonl [--target cpu]
        [--seed 0] [--category kernel] [--no-verify] [--minutes 40]

Each failure is one JSON line: the error, the program (``GraphSpec.source()``) and the
``GraphSpec`` repr to paste into a regression test. Progress (graphs tried, failures, kernels
made) is printed every 50 graphs. ``tests/test_fuzz.py`` runs the same check under pytest with a
fixed budget (``HLOFUSE_FUZZ_EXAMPLES``), stopping and shrinking at the first failure.

The graphs run in a child process. A program that kills the process (XLA aborting, a signal)
no longer ends the run: the child writes each program to ``<out>.current`` before it runs, and
when the child dies the parent records that program as a failure with ``"crash"`` set, says
whose crash it is (the unoptimized program compiled and run alone in another process: if it
dies too, XLA's own bug, ``"xla_crash": true``, which plain ``jax.jit`` hits as well), and
starts a new child at the next graph (same seed: hypothesis draws the same sequence).
"""

import argparse
import json
import os
import signal
import subprocess
import sys
import time
import traceback
import warnings

os.environ.setdefault("JAX_PLATFORMS", "cpu")

#: the unoptimized program of a GraphSpec repr (argv[1]), compiled and run on cpu by XLA alone
_RUN_ORIGINAL = """
import sys
import jax
from hlofuse.runtime.execute import run_module
from hlofuse.runtime.testing import GraphSpec, Node
spec = eval(sys.argv[1], {"GraphSpec": GraphSpec, "Node": Node, "inf": float("inf"),
                          "nan": float("nan")})
exp = jax.export.export(jax.jit(spec.build()), platforms=["cpu"])(*spec.avals())
values = spec.input_values()
run_module(exp.mlir_module(), [values[i] for i in sorted(exp.module_kept_var_idx)])
"""


def _args(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--examples", type=int, default=10_000)
    ap.add_argument("--out", default="fuzz.jsonl")
    ap.add_argument("--target", default="cpu", choices=["cpu", "gpu", "tpu"])
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--category", default=None, help="tolerance category (default: by kernel kinds)")
    ap.add_argument("--no-verify", action="store_true", help="skip hlofuse.runtime.verify on each graph")
    ap.add_argument("--minutes", type=float, default=0, help="stop after this long (0: no limit)")
    ap.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--skip", type=int, default=0, help=argparse.SUPPRESS)
    ap.add_argument("--deadline", type=float, default=0, help=argparse.SUPPRESS)
    return ap.parse_args(argv)


def _signal_name(rc: int) -> str:
    if rc < 0:
        try:
            return signal.Signals(-rc).name
        except ValueError:
            return f"signal {-rc}"
    return f"exit status {rc}"


def _read_current(path: str):
    """(index, spec repr, source) of the program a dead child was running, or None."""
    try:
        with open(path) as fh:
            head, spec, *src = fh.read().split("\n")
        return int(head.split()[-1]), spec, "\n".join(src)
    except (OSError, ValueError):
        return None


def _crashes_alone(spec: str) -> tuple[bool, str]:
    """Does the unoptimized program kill a process of its own (XLA's bug)?"""
    try:
        p = subprocess.run([sys.executable, "-c", _RUN_ORIGINAL, spec], capture_output=True,
                           text=True, timeout=600)
    except subprocess.TimeoutExpired:
        return False, "timed out"
    return p.returncode < 0, _signal_name(p.returncode) if p.returncode else "ran"


def supervise(args) -> None:
    """Run the graphs in child processes, recording and skipping any that kill one."""
    deadline = time.time() + 60 * args.minutes if args.minutes else 0
    skip, crashes = args.skip, 0
    while True:
        p = subprocess.run([sys.executable, os.path.abspath(__file__), *sys.argv[1:], "--child",
                            "--skip", str(skip), "--deadline", str(deadline)])
        if p.returncode == 0:
            break
        cur = _read_current(args.out + ".current")
        if cur is None or cur[0] < skip:   # died outside a graph: nothing to skip past
            sys.exit(f"fuzz child died with {_signal_name(p.returncode)} outside a graph")
        index, spec, src = cur
        crashes += 1
        xla, alone = _crashes_alone(spec)
        whose = ("the unoptimized program kills a process of its own too (XLA's bug; jax.jit "
                 "dies the same)" if xla else
                 f"the unoptimized program alone: {alone}; hlofuse's bug")
        with open(args.out, "a") as fh:
            fh.write(json.dumps({"err": f"the process died with {_signal_name(p.returncode)} "
                                        f"on graph {index}: {whose}",
                                 "src": src, "spec": spec, "crash": True, "xla_crash": xla}) + "\n")
        print(f"CRASH graph {index} ({_signal_name(p.returncode)}; "
              f"{'XLA' if xla else 'hlofuse'}): recorded, going on", flush=True)
        skip = index + 1
        if deadline and time.time() > deadline:
            break
    print(f"crashes: {crashes}", flush=True)


def run_child(args) -> None:
    from hypothesis import HealthCheck, Phase, given, seed, settings
    from hlofuse.runtime.testing import stablehlo_graphs
    from hlofuse.runtime.verify import check_graph

    warnings.simplefilter("ignore")
    stats = {"tried": 0, "failed": 0, "kernels": 0}
    t0 = time.time()
    deadline = args.deadline or (t0 + 60 * args.minutes if args.minutes else None)
    index = [-1]

    def progress(final=False):
        print(("DONE " if final else "") + json.dumps(dict(stats, seconds=round(time.time() - t0))), flush=True)

    with open(args.out, "a") as fh:
        @settings(max_examples=args.examples, deadline=None, database=None, phases=[Phase.generate],
                  suppress_health_check=list(HealthCheck))
        @given(stablehlo_graphs())
        def run(spec):
            index[0] += 1
            if index[0] < args.skip or (deadline and time.time() > deadline):
                return
            stats["tried"] += 1
            with open(args.out + ".current", "w") as cur:  # survives a crash of this process
                cur.write(f"# graph {index[0]}\n" + repr(spec) + "\n" + spec.source() + "\n")
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


def main() -> None:
    args = _args()
    (run_child if args.child else supervise)(args)


if __name__ == "__main__":
    main()
