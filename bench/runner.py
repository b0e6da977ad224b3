"""Side-by-side measurement of ``hlofuse.jit`` and ``jax.jit`` on one workload.

What one :func:`bench_workload` call measures (all in this process unless stated):

* **first call** of each (trace + export/optimize + XLA compile + run), fresh function objects;
* **numerics**: max abs / relative difference between the two outputs;
* **autotune**: hlofuse's compiler-option decision (made on its second call, see
  :mod:`hlofuse.runtime.autotune`) and the seconds it took;
* **latency, interleaved**: after warm-up, ``rounds`` rounds; each round times ``reps``
  back-to-back calls of each function (synchronized once with ``block_until_ready``; on a
  GPU/TPU this is device time with host dispatch overlapped) in the order A B B A (B A A B
  on odd rounds), so a linear drift of the machine's speed cancels within each round.
  Reported: medians of both, the median of per-round ratios hlofuse/jax and its quartiles.
  A round is *flagged* when other processes used more than :data:`FOREIGN_LOAD_FLAG` of the
  machine's CPU time while it ran (from ``/proc/stat`` minus this process's CPU time; the
  1-minute load average is recorded too); medians are also given over unflagged rounds;
* **eager JAX** (no jit) as context, a few calls;
* ``cost_analysis()`` flops and bytes and ``memory_analysis()`` of both compiled executables
  (hlofuse's compiled with the options autotune chose), fusion counts by kind in the optimized
  HLO, and hlofuse's own report (kernels, regions left to XLA, modeled bytes);
* **modeled** GPU/TPU HBM bytes: hlofuse's report for ``target='gpu'``/``'tpu'`` lowered from
  this machine (cost model figures, never measurements);
* **peak RSS of one call in a fresh subprocess** (``python -m bench.runner --rss-child``): the
  child compiles, resets the kernel's high-water mark (``/proc/self/clear_refs``), calls once
  and reports the peak. On CPU ``memory_analysis()`` misses the scratch of XLA's library
  fusions; this does not.
"""

from __future__ import annotations

import dataclasses
import gc
import json
import math
import os
import re
import statistics
import subprocess
import sys
import time
from collections import Counter
from typing import Callable

import numpy as np

# hlofuse.jit points jax's persistent compilation cache at its cache dir when the application
# has none; in this side-by-side process jax.jit would then get cache hits from earlier runs and
# its first call would no longer be a first call; likewise hlofuse's own module cache. Both
# first calls here are cold; bench.first_call measures warm caches apart (fresh processes).
os.environ.setdefault("HLOFUSE_XLA_CACHE", "0")
os.environ.setdefault("HLOFUSE_MODULE_CACHE", "0")

from hlofuse.runtime.autotune import BUSY_SHARE as FOREIGN_LOAD_FLAG  # noqa: E402 (0.25: share of
# all CPUs' time used by other processes during a round above which the round is flagged)


# ------------------------------------------------------------------------------------------
# configuration
# ------------------------------------------------------------------------------------------
@dataclasses.dataclass
class Config:
    rounds: int = 20
    min_measure_s: float = 0.1     # each timed measurement lasts at least this long
    max_reps: int = 50
    warmup: int = 2
    eager_calls: int = 3
    rss: bool = True               # fresh-subprocess peak RSS
    modeled_targets: tuple = ("gpu", "tpu")
    autotune: bool | None = None   # passed to hlofuse.jit
    seed: int = 0
    round_budget_s: float = float("inf")  # stop adding rounds after this (>= min_rounds run)
    min_rounds: int = 20

    @classmethod
    def quick(cls) -> "Config":
        return cls(rounds=7, min_measure_s=0.05, warmup=1, eager_calls=0, rss=False,
                   modeled_targets=("gpu",), round_budget_s=12.0, min_rounds=3)


# ------------------------------------------------------------------------------------------
# foreign load
# ------------------------------------------------------------------------------------------
# the probe lives in hlofuse.runtime.autotune (tuning records the load it ran under too)
from hlofuse.runtime.autotune import ForeignLoad as LoadProbe  # noqa: E402
from hlofuse.runtime.autotune import time_calls  # noqa: E402


# ------------------------------------------------------------------------------------------
# helpers
# ------------------------------------------------------------------------------------------
def fresh_cache_dir(prefix: str = "hlofuse-bench-cache-") -> str:
    """Point ``HLOFUSE_CACHE_DIR`` at a new temporary directory unless the caller set one, so a
    run measures what a new user gets: decisions measured in this run, no learned cost model
    or cached modules from earlier runs (which may have been measured on a busy machine).
    Returns the directory in use."""
    import tempfile
    if not os.environ.get("HLOFUSE_CACHE_DIR"):
        os.environ["HLOFUSE_CACHE_DIR"] = tempfile.mkdtemp(prefix=prefix)
    return os.environ["HLOFUSE_CACHE_DIR"]


def _block(x):
    import jax
    return jax.block_until_ready(x)


def timed_calls(fn: Callable, args, reps: int, cpu: list | None = None) -> float:
    """Seconds per call for ``reps`` back-to-back calls, synchronized once at the end, then
    an untimed wait until work the calls left running in this process is done
    (``hlofuse.runtime.autotune.quiesce``: jax.jit's attention S=4096 frees 1 GiB on a thread of
    its own after its outputs are ready, which ran during the next measured call): the
    autotuner's own timing, so the benchmark and the decisions measure alike.

    When ``cpu`` is a list, this process's CPU seconds per call (all threads) are appended.
    """
    return time_calls(fn, args, reps, cpu=cpu)


def first_call(fn: Callable, args) -> tuple[float, object]:
    """Seconds of ``fn(*args)`` until its outputs are ready, and the outputs. The heap is
    collected first: a full collection that garbage left by earlier work triggers inside the
    call (0.1 s in a fresh process, up to 0.4 s in a long zoo process) is charged to neither
    side; one the call's own allocations trigger is still timed."""
    gc.collect()
    t0 = time.perf_counter()
    out = _block(fn(*args))
    return time.perf_counter() - t0, out


def settle(hf, args, first_s: float, jax_first_s: float) -> dict:
    """After an ``hlofuse.jit`` first call: wait for the optimized executable its tiered first
    call builds in the background (steady-state timing must run hlofuse's code, not XLA's
    stand-in). Returns the tier state, ``ready_s``, the seconds from the first call's start
    until hlofuse's code was ready (the first call itself when it built in place), and
    ``ready_ratio``, that over jax.jit's first call ``jax_first_s``."""
    t0 = time.perf_counter()
    hf.block_until_optimized()
    waited = time.perf_counter() - t0
    st = hf.tier_status(*args)
    ready = st.get("seconds") if st.get("state") in ("ready", "failed") else None
    ready = first_s if ready is None else ready
    return {"tier": st.get("state"), "ready_s": ready, "ready_ratio": ready / jax_first_s,
            "waited_s": waited, "tier_error": st.get("error")}


def fusion_counts(hlo_text: str) -> dict:
    """Kernel-ish counts from optimized HLO text: fusions by kind, custom calls, while loops."""
    kinds = Counter(re.findall(r"= \S+ fusion\([^\n]*kind=(k\w+)", hlo_text))
    entry = hlo_text[hlo_text.find("\nENTRY"):] if "\nENTRY" in hlo_text else hlo_text
    ynn = len(re.findall(r'"kind":"__ynn_fusion"', hlo_text))
    return {"fusions": dict(kinds), "fusions_total": int(sum(kinds.values())),
            "ynn_fusions": ynn,
            "custom_calls": len(re.findall(r" custom-call\(", hlo_text)),
            "while_loops": len(re.findall(r" while\(", hlo_text)),
            "dots_outside_fusion": len(re.findall(r" dot\(", entry)),
            "convolutions": len(re.findall(r" convolution\(", hlo_text))}


def hlo_fingerprint(hlo_text: str) -> str:
    """The optimized HLO as a multiset of instructions (result shape, opcode, attributes),
    without names, operands' names, metadata or parameter order: equal fingerprints mean XLA
    runs the same ops with the same shapes, layouts and fusion kinds for both programs."""
    out = []
    for line in hlo_text.splitlines():
        m = re.match(r"\s*(?:ROOT )?%\S+ = (.+?) ([a-z][\w\-]*)\((.*?)\)(.*)$", line)
        if not m:
            continue
        shape, opcode, _, attrs = m.groups()
        attrs = re.sub(r",? ?metadata=\{[^}]*\}", "", attrs)
        attrs = re.sub(r"%[\w.\-]+", "%", attrs)
        if opcode == "parameter":
            attrs = ""                                   # parameter numbers follow names
        out.append(f"{shape} {opcode}{attrs}")
    return "\n".join(sorted(out))


def dispatch_s(fn: Callable, args, n: int = 15) -> float:
    """Median host time for a call to *return* (dispatch, not execution; XLA runs async)."""
    ts = []
    for _ in range(n):
        t0 = time.perf_counter()
        out = fn(*args)
        ts.append(time.perf_counter() - t0)
        _block(out)
    return statistics.median(ts)


def compiled_stats(compiled) -> dict:
    out: dict = {}
    try:
        ca = compiled.cost_analysis()
        if isinstance(ca, (list, tuple)):
            ca = ca[0] if ca else {}
        out["flops"] = float(ca.get("flops", float("nan")))
        out["bytes_accessed"] = float(ca.get("bytes accessed", float("nan")))
        out["transcendentals"] = float(ca.get("transcendentals", 0.0))
    except Exception as e:  # noqa: BLE001 - bench harness: a figure XLA cannot give is recorded as an error
        out["cost_analysis_error"] = f"{type(e).__name__}: {e}"
    try:
        ma = compiled.memory_analysis()
        out["memory_analysis"] = {
            "argument_bytes": int(ma.argument_size_in_bytes),
            "output_bytes": int(ma.output_size_in_bytes),
            "alias_bytes": int(ma.alias_size_in_bytes),
            "temp_bytes": int(ma.temp_size_in_bytes),
            "peak_bytes": int(getattr(ma, "peak_memory_in_bytes", 0) or 0),
        }
    except Exception as e:  # noqa: BLE001 - bench harness: a figure XLA cannot give is recorded as an error
        out["memory_analysis_error"] = f"{type(e).__name__}: {e}"
    try:
        text = compiled.as_text()
        out["hlo"] = fusion_counts(text)
        out["_fingerprint"] = hlo_fingerprint(text)
    except Exception as e:  # noqa: BLE001 - bench harness: a figure XLA cannot give is recorded as an error
        out["hlo_error"] = f"{type(e).__name__}: {e}"
    return out


def numerics(a, b) -> dict:
    import jax
    la, lb = jax.tree_util.tree_leaves(a), jax.tree_util.tree_leaves(b)
    max_abs, max_rel, finite_same = 0.0, 0.0, True
    for x, y in zip(la, lb):
        x, y = np.asarray(x, np.float64), np.asarray(y, np.float64)
        if x.shape != y.shape:
            return {"error": f"shape {x.shape} vs {y.shape}"}
        finite_same &= bool(np.array_equal(np.isfinite(x), np.isfinite(y)))
        m = np.isfinite(x) & np.isfinite(y)
        if m.any():
            d = np.abs(x[m] - y[m])
            max_abs = max(max_abs, float(d.max()))
            max_rel = max(max_rel, float(d.max() / max(np.abs(y[m]).max(), 1e-30)))
    return {"max_abs_diff": max_abs, "max_rel_diff": max_rel, "nonfinite_pattern_same": finite_same}


def _median(xs):
    xs = [x for x in xs if x is not None and math.isfinite(x)]
    return statistics.median(xs) if xs else float("nan")


def _quantile(xs, q):
    xs = sorted(x for x in xs if math.isfinite(x))
    if not xs:
        return float("nan")
    return float(np.quantile(np.asarray(xs), q))


# ------------------------------------------------------------------------------------------
# the measurement of one workload
# ------------------------------------------------------------------------------------------
def interleaved(fa: Callable, fb: Callable, args, cfg: Config, progress=None) -> dict:
    """Time ``fa`` (jax.jit) and ``fb`` (hlofuse.jit) in alternating order; per-round ratios."""
    for _ in range(cfg.warmup):
        _block(fa(*args))
        _block(fb(*args))
    ta, tb = timed_calls(fa, args, 1), timed_calls(fb, args, 1)
    reps = max(1, min(cfg.max_reps, int(math.ceil(cfg.min_measure_s / max(min(ta, tb), 1e-7)))))
    rounds = []
    t_start = time.perf_counter()
    for r in range(cfg.rounds):
        if r >= cfg.min_rounds and time.perf_counter() - t_start > cfg.round_budget_s:
            break
        ca, cb = [], []
        with LoadProbe() as probe:
            # one round = A B B A (B A A B on odd rounds): linear drift cancels within a round
            first, second = ((fa, ca), (fb, cb)) if r % 2 == 0 else ((fb, cb), (fa, ca))
            ta_tb = {}
            for f_, c_ in (first, second, second, first):
                ta_tb.setdefault(id(c_), []).append(timed_calls(f_, args, reps, c_))
            a = sum(ta_tb[id(ca)]) / 2
            b = sum(ta_tb[id(cb)]) / 2
        rounds.append({"jax_s": a, "hlofuse_s": b, "ratio": b / a,
                       "jax_cpu_s": sum(ca) / 2, "hlofuse_cpu_s": sum(cb) / 2,
                       "foreign_load": round(probe.foreign, 3),
                       "loadavg": probe.loadavg,
                       "flagged": probe.foreign > FOREIGN_LOAD_FLAG})
        if progress:
            progress(r + 1, cfg.rounds)
    if progress and len(rounds) < cfg.rounds:
        progress(len(rounds), len(rounds))  # stopped early (round time budget)
    clean = [x for x in rounds if not x["flagged"]]
    ratios = [x["ratio"] for x in rounds]
    res = {
        "reps_per_measurement": reps, "rounds": len(rounds),
        "jax_median_s": _median([x["jax_s"] for x in rounds]),
        "hlofuse_median_s": _median([x["hlofuse_s"] for x in rounds]),
        "ratio_of_medians": float("nan"),
        "median_ratio": _median(ratios),
        "ratio_p25": _quantile(ratios, 0.25), "ratio_p75": _quantile(ratios, 0.75),
        "flagged_rounds": len(rounds) - len(clean),
        "median_ratio_unflagged": _median([x["ratio"] for x in clean]) if clean else None,
        # secondary: ratio of this process's CPU seconds (all threads); less sensitive to
        # foreign load than wall time, but counts spinning threads as work
        "median_cpu_time_ratio": _median([x["hlofuse_cpu_s"] / x["jax_cpu_s"] for x in rounds
                                          if x["jax_cpu_s"] > 0]),
        "per_round": rounds,
    }
    if res["jax_median_s"] > 0:
        res["ratio_of_medians"] = res["hlofuse_median_s"] / res["jax_median_s"]
    return res


def eager_time(fn: Callable, args, calls: int) -> float | None:
    if calls <= 0:
        return None
    try:
        _block(fn(*args))  # per-op compilation happens here
        return _median([timed_calls(fn, args, 1) for _ in range(calls)])
    except Exception as e:  # noqa: BLE001 - bench harness: eager is context only; printed
        print(f"  eager run failed: {type(e).__name__}: {str(e)[:200]}", file=sys.stderr)
        return None


def modeled(fn: Callable, args, target: str) -> dict:
    """hlofuse's cost-model figures for ``target`` (lowered from here; nothing is run)."""
    import hlofuse
    try:
        t0 = time.perf_counter()
        rep = hlofuse.jit(fn, target=target).lower(*args).report
        return {"kernels": len(rep.kernels), "regions_left_to_xla": len(rep.left_to_xla),
                "modeled_bytes_unfused": rep.bytes_unfused, "modeled_bytes_fused": rep.bytes_fused,
                "modeled_bytes_saved": rep.bytes_saved, "lower_s": time.perf_counter() - t0,
                "label": "modeled"}
    except Exception as e:  # noqa: BLE001 - bench harness: the model's failure is recorded in its row
        return {"error": f"{type(e).__name__}: {str(e)[:300]}", "label": "modeled"}


def xla_module_compiled(hf, args):
    """XLA's own module for ``hf``'s function (what its calls run under an ``xla-module``
    autotune decision), compiled for ``args`` without donation."""
    return hf._variant_jit({}, donate=False, plain=True).lower(*args).compile()


def runs_jax_executable(hf, jf, args, dec) -> bool:
    """Whether ``hf``'s calls on ``args`` run the same optimized HLO as ``jf`` (jax.jit of the
    function): autotune decided XLA's own module and both compile to one program."""
    if dec is None or not dec.xla_module:
        return False
    from hlofuse.runtime.autotune import _normalized_hlo
    return (_normalized_hlo(xla_module_compiled(hf, args))
            == _normalized_hlo(jf.lower(*args).compile()))


def hlofuse_compiled(hf, args):
    """hlofuse's executable for ``args`` compiled with the compiler options autotune chose
    (XLA's own module when autotune decided that calls run it)."""
    import jax
    dec = hf.autotune_decision(*args) if hasattr(hf, "autotune_decision") else None
    if dec is not None and dec.xla_module:
        return xla_module_compiled(hf, args), {}
    low = hf.lower(*args)
    opts = dict(dec.options) if dec is not None else {}
    exp = low.exported
    avals = [jax.ShapeDtypeStruct(a.shape, a.dtype, weak_type=a.weak_type) for a in exp.in_avals]
    args, kwargs = jax.tree.unflatten(exp.in_tree, avals)
    return jax.jit(exp.call, compiler_options=opts or None).lower(*args, **kwargs).compile(), opts


def rss_in_subprocess(name: str, impl: str, cfg: Config, timeout: float = 600) -> dict:
    """Peak RSS of one call of ``impl`` ('jax' | 'hlofuse') on workload ``name``, fresh process."""
    cmd = [sys.executable, "-m", "bench.runner", "--rss-child", name, impl, str(cfg.seed)]
    if cfg.autotune is not None:
        cmd.append("autotune=" + ("1" if cfg.autotune else "0"))
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    try:
        p = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, cwd=root)
    except subprocess.TimeoutExpired:
        return {"error": "timeout"}
    for line in reversed(p.stdout.splitlines()):
        if line.startswith("{"):
            return json.loads(line)
    return {"error": f"rc={p.returncode}: {p.stderr.strip()[-300:]}"}


def _rss_child(name: str, impl: str, seed: int, autotune: bool | None) -> None:
    import jax
    import hlofuse
    from bench import workloads
    from bench.common import proc_status as status, reset_peak_rss

    w = workloads.get(name)
    fn, args = w.instantiate(seed)
    if impl == "jax":
        f = jax.jit(fn)
        f.lower(*args).compile()
        call = f
        note = None
    else:
        hf = hlofuse.jit(fn, autotune=autotune)
        try:
            # compile without running; Lowered.compile() applies a cached autotune decision
            from hlofuse.runtime import autotune as at
            low = hf.lower(*args)
            dec = (at.cache().get(hf._decision_key(low._entry)) if autotune is not False
                   else None)
            if dec is not None and dec.xla_module:   # calls run XLA's own module: measure it
                call = xla_module_compiled(hf, args)
                note = "XLA's own module (autotune decision)"
            else:
                call = low.compile()
                opts = at.cached_options(low._entry.optimized.text) if autotune is not False else {}
                note = f"compiler options {opts}" if opts else "XLA defaults"
        except Exception as e:  # noqa: BLE001 - bench harness: one warm-up call instead, noted
            call = hf
            _block(hf(*args))
            note = f"warm-up call used ({type(e).__name__}); peak may be understated"
    _block(args)
    try:  # give freed heap pages back to the OS so the call's peak is not hidden by reuse
        import ctypes
        ctypes.CDLL("libc.so.6").malloc_trim(0)
    except (OSError, AttributeError):  # no glibc (OSError), no malloc_trim in it (AttributeError)
        pass
    before = status()
    reset = reset_peak_rss()
    _block(call(*args))
    after = status()
    out = {"rss_before_call": before.get("VmRSS"), "peak_rss": after.get("VmHWM"),
           "peak_reset_before_call": reset, "autotune": note}
    dev = jax.devices()[0]
    if dev.platform != "cpu":
        try:  # accelerator memory: the allocator's peak in this fresh process (args included)
            stats = dev.memory_stats() or {}
            out["device_peak_bytes_in_use"] = stats.get("peak_bytes_in_use")
        except (RuntimeError, AttributeError) as e:  # JaxRuntimeError, NotImplementedError: none kept
            out["device_peak_error"] = f"{type(e).__name__}: {str(e)[:200]}"
    if reset and before.get("VmRSS") is not None and after.get("VmHWM") is not None:
        out["call_peak_delta"] = after["VmHWM"] - before["VmRSS"]
    print(json.dumps(out))


def bench_workload(w, cfg: Config, progress=None) -> dict:
    """All measurements for one :class:`bench.workloads.Workload` (see the module docstring)."""
    import jax
    import hlofuse

    def step(msg):
        if progress:
            progress(msg)

    res: dict = {"name": w.name, "description": w.description, "group": w.group}
    fn, args = w.instantiate(cfg.seed)

    step("first call jax.jit")
    jf = jax.jit(fn)
    res["first_call_jax_s"], out_j = first_call(jf, args)
    step("first call hlofuse.jit")
    hf = hlofuse.jit(fn, autotune=cfg.autotune)
    res["first_call_hlofuse_s"], out_h = first_call(hf, args)
    res["first_call_ratio"] = res["first_call_hlofuse_s"] / res["first_call_jax_s"]
    step("optimized executable (tiered first call)")
    res.update(settle(hf, args, res["first_call_hlofuse_s"], res["first_call_jax_s"]))

    step("autotune")
    t0 = time.perf_counter()
    _block(hf(*args))   # second call: autotune measures here (when on)
    res["second_call_hlofuse_s"] = time.perf_counter() - t0
    dec = hf.autotune_decision(*args) if hasattr(hf, "autotune_decision") else None
    res["autotune"] = (None if dec is None else
                       {"variant": dec.variant, "options": dec.options, "ratios": dec.ratios,
                        "tune_s": dec.tune_s, "rounds": dec.rounds, "reason": dec.reason,
                        "foreign_load": getattr(dec, "foreign_load", None),
                        # measured kernel-vs-XLA choice per region (cpu int8 matmuls: bf16-chunk
                        # kernel vs XLA's int8 dot): hash -> choice, ratio, reason
                        "regions": dict(getattr(dec, "regions", None) or {}),
                        "from_cache": any("cached decision" in n for n in hf.report(*args).notes)})

    def prog(i, n):
        step(f"round {i}/{n}")

    res["latency"] = interleaved(jf, hf, args, cfg, progress=prog)
    # numerics of what was timed (after autotune switched options), against jax.jit
    res["numerics"] = numerics(_block(hf(*args)), out_j)
    res["numerics_first_call"] = numerics(out_h, out_j)

    step("eager")
    res["eager_s"] = eager_time(fn, args, cfg.eager_calls)

    step("analysis")
    rep = hf.report(*args)
    res["hlofuse_report"] = {
        "kernels": len(rep.kernels), "regions_left_to_xla": len(rep.left_to_xla),
        "kernel_names": [r.kernel for r in rep.kernels],
        "left_to_xla": [{"kind": r.kind, "reason": r.reason} for r in rep.left_to_xla][:50],
        "modeled_bytes_unfused": rep.bytes_unfused, "modeled_bytes_fused": rep.bytes_fused,
        "ops_before": rep.ops_before, "ops_after": rep.ops_after,
        "pass_seconds": {k: round(v, 4) for k, v in rep.pass_seconds.items()},
        "notes": list(rep.notes), "target": rep.target,
    }
    res["jax_compiled"] = compiled_stats(jf.lower(*args).compile())
    try:
        hc, opts = hlofuse_compiled(hf, args)
        res["hlofuse_compiled"] = compiled_stats(hc)
        res["hlofuse_compiled"]["compiler_options"] = opts
    except Exception as e:  # noqa: BLE001 - bench harness: hlofuse's compile failing is recorded in the row
        res["hlofuse_compiled"] = {"error": f"{type(e).__name__}: {e}"}

    fj = res["jax_compiled"].pop("_fingerprint", None)
    fh = res.get("hlofuse_compiled", {}).pop("_fingerprint", None)
    # same optimized HLO => any time difference is host overhead or noise, not a kernel
    res["same_optimized_hlo"] = bool(fj is not None and fj == fh)
    res["dispatch_s"] = {"jax": dispatch_s(jf, args), "hlofuse": dispatch_s(hf, args)}

    res["modeled"] = {}
    for t in cfg.modeled_targets:
        step(f"modeled {t}")
        res["modeled"][t] = modeled(fn, args, t)

    if cfg.rss:
        for impl in ("jax", "hlofuse"):
            step(f"peak RSS {impl} (fresh process)")
            res.setdefault("peak_rss", {})[impl] = rss_in_subprocess(w.name, impl, cfg)
    return res


if __name__ == "__main__":
    if len(sys.argv) >= 4 and sys.argv[1] == "--rss-child":
        at = None
        for extra in sys.argv[5:]:
            if extra.startswith("autotune="):
                at = extra.split("=", 1)[1] == "1"
        _rss_child(sys.argv[2], sys.argv[3], int(sys.argv[4]) if len(sys.argv) > 4 else 0, at)
    else:
        print("usage: python -m bench [--quick] ... (this module is the measurement library)")
