"""Fusion engine (issue 3) measurements: modeled HBM bytes on gpu/tpu, and CPU side by side.

    python bench/fusion_engine.py bytes                     # bert_s128 gpt2_block resnet_nhwc llama_block
    python bench/fusion_engine.py bytes bert_s512 -v        # ... with the per-region report
    python bench/fusion_engine.py cpu --rounds 30           # same workloads, CPU timings
    python bench/fusion_engine.py cpu layernorm softmax --rounds 40

``bytes``: for each workload and target (gpu: H100-class, tpu: v5e-class model), the modeled
HBM bytes of the whole program with every op its own kernel (after the cleanup passes, the
cost model of ``passes/fusion/cost.py``) against the fused plan (each kernel's region moves
its ``bytes_fused`` instead of its ``bytes_unfused``), the same sums over the report's regions,
and kernel counts per kind. Goal (issue 3): the plan moves at most half of the unfused bytes.

``cpu``: XLA executables only (no Python dispatch wrappers, device-array arguments): jax.jit,
hlofuse (default pipeline) and hlofuse without the fusion-engine passes
(fuse-matmul-epilogue, fuse-reduction, fuse-horizontal), run in alternating A/B rounds; ratios
are medians of per-round ratios. ``hlo`` says whether the fused executable's HLO has the same
(dtype, opcode, fusion kind) multiset as jax.jit's -- the fusion engine's cpu kernels are one
grid step each, so XLA removes their loop and should see the program it would have compiled.
"""

from __future__ import annotations

import argparse
import collections
import os
import re
import statistics
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import jax  # noqa: E402
from jax import tree_util  # noqa: E402

import hlofuse  # noqa: E402
from hlofuse.core import ir as hir  # noqa: E402
from hlofuse.passes.fusion import cost  # noqa: E402
from hlofuse.core.pipeline import PIPELINES  # noqa: E402
from bench import workloads  # noqa: E402

MODELS = ["bert_s128", "gpt2_block", "resnet_nhwc", "llama_block"]
ENGINE = ["fuse-matmul-epilogue", "fuse-reduction", "fuse-horizontal"]
PLATFORM = {"gpu": "cuda", "tpu": "tpu", "cpu": "cpu"}


def _flat(fn, args):
    leaves, tree = tree_util.tree_flatten(args)
    return (lambda *ls: fn(*tree_util.tree_unflatten(tree, ls))), [jax.device_put(x) for x in leaves]


def whole_program_unfused(text: str, target: str) -> int:
    """Modeled bytes of the module after the cleanups, every op its own kernel."""
    names = [n for n, _ in PIPELINES["default"]]
    pre = names[:names.index("fuse-attention")] if "fuse-attention" in names else names[:3]
    opt = hlofuse.optimize(text, target=target, pipeline=pre)
    ops = [o for o in hir.block_ops(hir.main_func(opt.module).regions[0].blocks[0]) if o.name != "func.return"]
    return cost.region_cost(ops, [], []).bytes_unfused


def bytes_report(names, verbose: bool) -> None:
    for name in names:
        fn, args = workloads.get(name).instantiate()
        g, leaves = _flat(fn, args)
        for target in ("gpu", "tpu"):
            text = jax.export.export(jax.jit(g), platforms=[PLATFORM[target]])(*leaves).mlir_module()
            total = whole_program_unfused(text, target)
            rep = hlofuse.optimize(text, target=target).report
            kern = [r for r in rep.regions if r.kernel]
            plan = total - sum(r.bytes_unfused - r.bytes_fused for r in kern)
            kinds = collections.Counter(r.kind for r in kern)
            mib = 1 << 20
            print(f"{name:12s} {target}: whole program {total / mib:8.1f} MiB unfused -> {plan / mib:7.1f} MiB "
                  f"fused (ratio {plan / total:.3f}); regions {rep.bytes_unfused / mib:.1f} -> "
                  f"{rep.bytes_fused / mib:.1f} MiB; kernels {dict(sorted(kinds.items()))}", flush=True)
            if verbose:
                print(rep)


def _ops(compiled) -> collections.Counter:
    out = collections.Counter()
    for line in compiled.as_text().splitlines():
        m = re.search(r"= (\S+?)\[.*?\]\S* (\w+)\(", line)
        if m and m.group(2) not in ("parameter", "bitcast"):
            kind = re.search(r"kind=(k\w+)", line)
            out[(m.group(1), m.group(2), kind.group(1) if kind else "")] += 1
    return out


def _paired(fa, fb, args, rounds: int, inner: int = 2) -> tuple[float, float, float]:
    for f in (fa, fb):
        jax.block_until_ready(f(*args))
    ratios, ta, tb = [], [], []
    for i in range(rounds):
        t = [0.0, 0.0]
        for k in ((0, 1) if i % 2 == 0 else (1, 0)):
            f = (fa, fb)[k]
            t0 = time.perf_counter()
            for _ in range(inner):
                r = f(*args)
            jax.block_until_ready(r)
            t[k] = (time.perf_counter() - t0) / inner * 1e3
        ratios.append(t[1] / t[0])
        ta.append(t[0])
        tb.append(t[1])
    return statistics.median(ratios), statistics.median(ta), statistics.median(tb)


def cpu_report(names, rounds: int) -> None:
    for name in names:
        fn, args = workloads.get(name).instantiate()
        g, leaves = _flat(fn, args)
        cj = jax.jit(g).lower(*leaves).compile()
        ch = hlofuse.jit(g, target="cpu").lower(*leaves).compile()._compiled
        cm = hlofuse.jit(g, target="cpu", disable=ENGINE).lower(*leaves).compile()._compiled
        rep = hlofuse.jit(g, target="cpu").report(*leaves)
        mine = collections.Counter(r.kind for r in rep.kernels if r.kind in ("matmul_epilogue", "reduction", "horizontal"))
        r_hj, tj, th = _paired(cj, ch, leaves, rounds)
        r_hm = _paired(cm, ch, leaves, rounds)[0]
        print(f"{name:12s} jax {tj:8.2f} ms  hlofuse {th:8.2f} ms  hlofuse/jax {r_hj:.3f}  "
              f"with/without fusion-engine passes {r_hm:.3f}  engine kernels {dict(mine)}  "
              f"hlo same as jax: {_ops(cj) == _ops(ch)}, same as without engine: {_ops(cm) == _ops(ch)}",
              flush=True)


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("what", choices=["bytes", "cpu"])
    ap.add_argument("models", nargs="*", default=MODELS)
    ap.add_argument("--rounds", type=int, default=20)
    ap.add_argument("-v", "--verbose", action="store_true")
    a = ap.parse_args(argv)
    if a.what == "bytes":
        bytes_report(a.models, a.verbose)
    else:
        cpu_report(a.models, a.rounds)


if __name__ == "__main__":
    main()
