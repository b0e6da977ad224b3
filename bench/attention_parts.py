"""A/B of the cpu attention loops' settings: the split (one independent loop per core, or one
loop), the step budgets (the size of one step's logits block), the forward's whole rows
against key blocks, or a power-of-two logit scale (at most 1) taken into Q against the
logits scaled as the program does.

    python -m bench.attention_parts                       # attn_s4096, 12 interleaved rounds
    python -m bench.attention_parts --models attn_s2048,bert_s512 --rounds 20
    python -m bench.attention_parts --budgets 512K,1M,2M,4M --models attn_s4096,attn_s2048
    python -m bench.attention_parts --models attn_train_s2048 --budgets 1M/256K,2M/512K
    python -m bench.attention_parts --rows --models attn_s4096,attn_s2048,attn_train_s2048
    python -m bench.attention_parts --fold --models attn_s4096,attn_s2048 --rounds 21

Per bench workload (``bench/workloads.py``, or a training step of ``bench/train_cpu.py``),
``jax.jit`` and one ``hlofuse.jit`` per setting,
interleaved in one process. The settings: with ``--budgets`` (``FWD[/BWD]`` element counts, K
and M suffixes; the backward's default is this host's) one build per budget
(:data:`hlofuse.kernels.attention.blocks.CPU_BUDGETS`), with ``--rows`` whole rows and key
blocks (:data:`hlofuse.kernels.attention.blocks.CPU_WHOLE_ROWS`), with ``--fold`` the scale
fold and none (:data:`hlofuse.kernels.attention.logits.CPU_FOLD_SCALE`), else the loops split into
``--parts`` (default 2) and one loop (:data:`hlofuse.kernels.attention.cpu.CPU_PARTS`). Each
is set before its build; the module cache and the XLA-option autotune are off and kernelize's
in-process kernel cache is cleared, so each build is fresh and nothing else differs; the
kernels' block descriptions are printed. Prints each setting's median per-round time ratio to
jax.jit, and each one's median per-round ratio to the first setting. The header names the CPU
and its L2 (``hlofuse.core.hostcpu``), which the default budgets derive from.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys

os.environ["HLOFUSE_MODULE_CACHE"] = "0"   # each setting is built afresh
os.environ.setdefault("HLOFUSE_AUTOTUNE", "0")


def _count(text: str) -> int:
    text = text.strip().upper()
    mult = {"K": 1 << 10, "M": 1 << 20}.get(text[-1:], 1)
    return int(text.rstrip("KM")) * mult


def _settings(a) -> list:
    """``[(label, parts, budgets or None, whole rows or None, fold)]`` in build order."""
    if a.fold:
        return [("fold", None, None, None, True), ("scaled logits", None, None, None, False)]
    if a.rows:
        return [("whole rows", 1, None, True, True), ("key blocks", 1, None, False, True)]
    if not a.budgets:
        return [(f"{a.parts} loops", a.parts, None, None, True), ("one loop", 1, None, None, True)]
    from hlofuse.kernels.attention import blocks
    host_bwd = blocks.cpu_budgets(blocks.hostcpu.l2_per_core())[1]
    out = []
    for b in a.budgets.split(","):
        fwd, _, bwd = b.partition("/")
        out.append((f"budget {b}", 1, (_count(fwd), _count(bwd) if bwd else host_bwd), None, True))
    return out


def _workload(name: str):
    """``(function, arguments)`` of a bench workload or a ``bench.train_cpu`` training step."""
    import numpy as np
    from bench.workloads import WORKLOADS
    if name in WORKLOADS:
        return WORKLOADS[name].fn, WORKLOADS[name].make_args(np.random.default_rng(0))
    from bench import train_cpu
    step, make = train_cpu.WORKLOADS[name]
    if step is None:
        raise SystemExit(f"{name}: not a step this A/B can build (hlofuse.jit inside the step)")
    return step, make()


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--models", default="attn_s4096")
    ap.add_argument("--rounds", type=int, default=12)
    ap.add_argument("--parts", type=int, default=2)
    ap.add_argument("--budgets", default="", help="FWD[/BWD],... step budgets to compare")
    ap.add_argument("--rows", action="store_true", help="the forward's whole rows / key blocks")
    ap.add_argument("--fold", action="store_true",
                    help="a power-of-two logit scale <= 1 taken into Q / the logits scaled")
    a = ap.parse_args(argv)
    import jax
    import hlofuse
    from hlofuse.core import hostcpu
    from hlofuse.kernels.attention import blocks as B
    from hlofuse.kernels.attention import cpu as C
    from hlofuse.kernels.attention import logits as L
    from hlofuse.passes import kernelize
    from bench.runner import timed_calls
    settings = _settings(a)
    print(f"host: {hostcpu.model()}, {hostcpu.profile()}; host budgets "
          f"{B.cpu_budgets(hostcpu.l2_per_core())}", flush=True)
    for name in a.models.split(","):
        fn, args = _workload(name)
        args = jax.tree.map(jax.device_put, args)
        fns = {"jax": jax.jit(fn)}
        try:
            for label, parts, budgets, rows, fold in settings:
                C.CPU_PARTS, B.CPU_BUDGETS, B.CPU_WHOLE_ROWS = parts, budgets, rows
                L.CPU_FOLD_SCALE = fold
                kernelize._CACHE.clear()           # lowered kernels are cached in-process too
                f = hlofuse.jit(fn, tiered=False, autotune=False)
                jax.block_until_ready(f(*args))                    # builds with this setting
                rep = f.report(*args)
                blocks = [r.block for r in rep.regions if "attention" in r.kind]
                print(f"{name}: {label}: attention kernels {blocks}", flush=True)
                fns[label] = f
        finally:
            C.CPU_PARTS, B.CPU_BUDGETS, B.CPU_WHOLE_ROWS = None, None, None
            L.CPU_FOLD_SCALE = True
        for f in fns.values():
            jax.block_until_ready(f(*args))
        t = {n: [] for n in fns}
        for r in range(a.rounds):
            for n in (list(fns) if r % 2 == 0 else list(reversed(list(fns)))):
                t[n].append(timed_calls(fns[n], args, 1))   # + an untimed quiesce

        def med(x, y):
            return statistics.median(p / q for p, q in zip(t[x], t[y]))
        first = settings[0][0]
        parts = [f"{lb} {med(lb, 'jax'):.3f} ({med(lb, first):.3f} of {first})"
                 for lb, *_ in settings]
        print(f"{name}: jax {statistics.median(t['jax']) * 1e3:.1f} ms; ratio to jax.jit: "
              f"{'; '.join(parts)} (load {os.getloadavg()[0]:.1f})", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
