"""Which hlofuse pass or kernel makes a workload slower (or faster) than plain XLA?

    python -m bench.attribute bert_s128 [--rounds 5] [--options default|ynn-off|...]
    python -m bench.attribute zoo:nnx_llama      # a zoo model (bench/zoo), its real config

Builds, from one export of the workload, several versions of the module and times them
interleaved against the *unrewritten* module run through the same ``Exported`` path (so only
the rewrite differs; compiler options are held fixed):

* ``full``            — hlofuse's default pipeline (timed twice: the second copy, ``full
                        (control)``, shows the noise floor of the run);
* ``no-kernels``      — the pipeline with ``no_kernels`` (regions formed, all left to XLA);
* ``-<pass>``         — the pipeline with one pass disabled (for every pass whose absence
                        changes the module);
* ``rollback <id>``   — the full result with one kernelized region rolled back to XLA
                        (:func:`hlofuse.runtime.kernel_choice.rollback`), for every kernel.

A region whose rollback brings the ratio down is what costs time; the table names its kernel,
kind, ops and source lines.
"""

from __future__ import annotations

import argparse
import copy
import dataclasses
import statistics
import sys
import time

import numpy as np


def _flat(fn, args):
    import jax
    leaves, tree = jax.tree_util.tree_flatten(args)

    def flat_fn(*xs):
        return tuple(jax.tree_util.tree_leaves(fn(*jax.tree_util.tree_unflatten(tree, xs))))

    return flat_fn, leaves


def build_variants(fn, args, *, max_regions: int = 40) -> tuple[list, dict]:
    """[(name, module bytes, description)], and context (the Exported, flat leaves, report)."""
    import jax
    from jax import export as jexport
    import hlofuse
    from hlofuse.core import ir as hir
    from hlofuse.core.pipeline import PIPELINES
    from hlofuse.runtime.kernel_choice import rollback

    flat_fn, leaves = _flat(fn, args)
    sds = [jax.ShapeDtypeStruct(x.shape, x.dtype) for x in leaves]
    exp0 = jexport.export(jax.jit(flat_fn), platforms=["cpu"])(*sds)
    text0 = exp0.mlir_module()
    base = hlofuse.optimize(text0, target="cpu", pipeline="none")
    full = hlofuse.optimize(text0, target="cpu")
    full_bytes = hir.to_bytecode(full.module)
    out = [("baseline (no rewrite)", hir.to_bytecode(base.module), ""),
           ("full", full_bytes, f"{len(full.report.kernels)} kernels"),
           ("full (control)", full_bytes, "the same module again: the noise floor of this run")]
    nk = hlofuse.optimize(text0, target="cpu", options={"no_kernels": True})
    out.append(("no-kernels", hir.to_bytecode(nk.module), "regions formed, all left to XLA"))
    rewriting = [p.name for p in full.report.passes
                 if not p.disabled and any(v for v in p.stats.values() if isinstance(v, (int, float)))
                 and p.name not in ("inline-calls", "canonicalize", "cse", "symbol-dce")]
    for p in dict.fromkeys(rewriting):
        if p not in {n for n, _ in PIPELINES["default"]}:
            continue
        o = hlofuse.optimize(text0, target="cpu", disable=[p])
        b = hir.to_bytecode(o.module)
        if hir.to_text(o.module) == hir.to_text(full.module):
            print(f"  -{p}: same module as full (pass changed nothing here); not timed",
                  file=sys.stderr)
            continue
        out.append((f"-{p}", b, f"pipeline without {p}"))
    for r in full.report.kernels[:max_regions]:
        o = dataclasses.replace(full, module=hir.clone_module(full.module),
                                report=copy.deepcopy(full.report))
        region = o.report.region(r.id)
        try:
            rollback(o, region, "attribution")
        except Exception as e:  # noqa: BLE001 - bench harness: printed, the others go on
            print(f"  rollback of region {r.id} failed: {type(e).__name__}: {e}", file=sys.stderr)
            continue
        where = ", ".join(r.locations[:2])
        ops = ",".join(o_.split(".")[-1] for o_ in r.ops)
        out.append((f"rollback {r.id}", hir.to_bytecode(o.module),
                    f"{r.kind} {r.kernel} [{ops[:60]}] {where}"))
    return out, {"exp0": exp0, "leaves": leaves, "report": full.report}


def time_variants(variants, exp0, leaves, options: dict, rounds: int) -> dict:
    import jax
    fns = {}
    for name, payload, _ in variants:
        exp = dataclasses.replace(exp0, mlir_module_serialized=payload, _get_vjp=None)
        f = jax.jit(exp.call, compiler_options=options or None)
        jax.block_until_ready(f(*leaves))
        fns[name] = f
    t = {}
    for n, f in fns.items():
        t0 = time.perf_counter()
        jax.block_until_ready(f(*leaves))
        t[n] = time.perf_counter() - t0
    reps = max(1, int(0.1 / max(min(t.values()), 1e-6)))
    names = list(fns)
    times = {n: [] for n in names}
    for r in range(rounds):
        order = names[r % len(names):] + names[:r % len(names)]
        for n in order:
            t0 = time.perf_counter()
            out = None
            for _ in range(reps):
                out = fns[n](*leaves)
            jax.block_until_ready(out)
            times[n].append((time.perf_counter() - t0) / reps)
    b = times[names[0]]
    return {n: (statistics.median(times[n]), statistics.median(x / y for x, y in zip(times[n], b)))
            for n in names}


def main(argv=None) -> int:
    from bench import workloads
    from hlofuse.runtime import autotune
    ap = argparse.ArgumentParser(prog="python -m bench.attribute", description=__doc__.split("\n\n")[0])
    ap.add_argument("model")
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--options", default="default", choices=list(autotune.VARIANTS["cpu"]),
                    help="XLA:CPU compiler-option variant held fixed for every version")
    a = ap.parse_args(argv)
    if a.model.startswith("zoo:"):
        from bench import zoo
        fn, args = zoo.instantiate(a.model[4:], "real")
    else:
        fn, args = workloads.get(a.model).instantiate(0)
    t0 = time.perf_counter()
    variants, ctx = build_variants(fn, args)
    res = time_variants(variants, ctx["exp0"], ctx["leaves"], autotune.VARIANTS["cpu"][a.options],
                        a.rounds)
    print(f"{a.model}: time of each version / unrewritten module (same Exported path, options "
          f"{a.options}), median of {a.rounds} interleaved rounds; {time.perf_counter() - t0:.0f}s")
    width = max(len(n) for n, _, _ in variants)
    for name, _, desc in variants:
        s, ratio = res[name]
        print(f"  {name:<{width}}  {s * 1e3:9.2f} ms  {ratio:6.3f}  {desc}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
