"""``python -m bench --zoo``: every zoo model under ``hlofuse.jit`` and ``jax.jit``.

Per model, in one process (the same measurement for every model):

* **first call** of each, fresh jitted functions: trace + (hlofuse: export and passes) + XLA
  compile + run. jax.jit goes first; the ratio is hlofuse / jax. Each starts from a collected
  heap (:func:`bench.runner.first_call`): a full collection triggered by what earlier models
  left is charged to neither (in a long process it took up to 0.4 s). hlofuse's first call is
  tiered by default (XLA's code now, hlofuse's module built in a background thread): the
  **ready** ratio is the time from the first call's start until hlofuse's code is ready,
  over jax.jit's first call (:func:`bench.runner.settle` waits for it before anything else);
* **tuning**: the wall time of hlofuse's 2nd and 3rd calls beyond two steady-state calls: what
  a user pays after the first call while hlofuse measures (autotune runs on the 2nd call);
  the autotune decision and its own ``tune_s`` are recorded too;
* **correct**: hlofuse's outputs (first call and steady state) against jax.jit's with
  :func:`hlofuse.runtime.testing.compare` and the model's tolerance category (``reassociate`` for
  inference, ``grad`` for training steps). A bf16 model that differs beyond the bf16 tolerance
  passes ("ok (f32)") only when hlofuse is as accurate as jax.jit against the same model built
  in f32 (:data:`bench.zoo.BF16_PARITY`);
* **steady ratio**: :func:`bench.runner.interleaved` (A B B A rounds, median of per-round
  hlofuse / jax time ratios, quartiles, rounds disturbed by other processes flagged);
* **kernels / decisions**: hlofuse's report: kernels built by kind (attn = attention, mm =
  matmul + epilogue, red = reduction, ew = elementwise, horiz = horizontal), regions left to
  XLA (reasons in the JSON and Markdown), and the XLA-option variant autotune chose.

The HLOFUSE cache is a fresh temporary directory unless ``HLOFUSE_CACHE_DIR`` is set, so a run
measures what a new user gets (tuning included).
"""

from __future__ import annotations

import datetime
import json
import math
import os
import statistics
import sys
import time
from collections import Counter

from bench import zoo

CEILING = 1.02  # nothing may be slower than this (issue 14)


def _block(x):
    import jax
    return jax.block_until_ready(x)


def _timed(fn, args):
    t0 = time.perf_counter()
    out = _block(fn(*args))
    return time.perf_counter() - t0, out


def _named(fn, name):
    def model(*args):
        return fn(*args)
    model.__name__ = model.__qualname__ = name
    return model


_KIND = {"attention": "attn", "matmul_epilogue": "mm", "reduction": "red", "elementwise": "ew",
         "horizontal": "horiz"}


def _decisions(rep, dec) -> dict:
    """What hlofuse decided for this model, from its report and the autotune decision."""
    reasons = Counter((r.kind, r.reason) for r in rep.left_to_xla)
    return {"kernels": len(rep.kernels), "left_to_xla": len(rep.left_to_xla),
            "kernel_kinds": dict(Counter(r.kind for r in rep.kernels)),
            "left_to_xla_reasons": [{"kind": k, "reason": why, "count": c}
                                    for (k, why), c in reasons.most_common()],
            "xla_options": None if dec is None else dec.variant}


def _decision_text(d: dict) -> str:
    kinds = " ".join(f"{c} {_KIND.get(k, k)}" for k, c in sorted(d["kernel_kinds"].items(),
                                                                  key=lambda kv: -kv[1]))
    parts = [kinds or "no kernels"]
    if d["left_to_xla"]:
        parts.append(f"{d['left_to_xla']} to XLA")
    parts.append(f"xla-opts {d['xla_options'] or 'off'}")
    return "; ".join(parts)


def measure(name: str, size: str, cfg, progress=None) -> dict:
    import jax
    import hlofuse
    from bench import runner
    from hlofuse.runtime.testing import compare

    m = zoo.get(name)
    step = progress or (lambda msg: None)
    res = {"name": name, "library": m.library, "kind": m.kind, "mode": m.mode,
           "description": m.description, "size": size, "config": m.config(size),
           "category": m.category}
    fn, args = m.instantiate(size, cfg.seed)
    leaves = jax.tree_util.tree_leaves(args)
    res["dtype"] = sorted({str(x.dtype) for x in leaves if hasattr(x, "dtype")
                           and str(x.dtype).startswith(("float", "bfloat"))})
    res["param_mib"] = sum(getattr(x, "nbytes", 0) for x in leaves) / 2**20
    _block(args)

    # fresh wrappers, named after the model: neither side reuses the other's trace of `fn`
    jf = jax.jit(_named(fn, name))
    hf = hlofuse.jit(_named(fn, name), autotune=cfg.autotune)
    step("first call jax.jit")
    res["first_call_jax_s"], out_j = runner.first_call(jf, args)
    step("first call hlofuse.jit")
    res["first_call_hlofuse_s"], out_h1 = runner.first_call(hf, args)
    res["first_call_ratio"] = res["first_call_hlofuse_s"] / res["first_call_jax_s"]
    step("optimized executable (tiered first call)")
    res.update(runner.settle(hf, args, res["first_call_hlofuse_s"], res["first_call_jax_s"]))

    step("calls 2-3 (tuning)")
    t2, _ = _timed(hf, args)
    t3, _ = _timed(hf, args)
    res["calls_2_3_s"] = [t2, t3]
    dec = hf.autotune_decision(*args) if hasattr(hf, "autotune_decision") else None
    res["autotune"] = (None if dec is None else
                       {"variant": dec.variant, "options": dec.options, "tune_s": dec.tune_s,
                        "reason": dec.reason, "ratios": dec.ratios})

    # a signature decided to run XLA's own module runs jax.jit's executable: checked here
    # (optimized HLO), so a ratio above 1 is known to be noise, not a loss
    res["same_executable_as_jax"] = runner.runs_jax_executable(hf, jf, args, dec)
    lat = runner.interleaved(jf, hf, args, cfg,
                             progress=lambda i, n: step(f"round {i}/{n}"))
    res["latency"] = lat
    # what the user paid on calls 2 and 3 beyond two steady-state calls
    res["tune_s"] = max(0.0, t2 + t3 - 2 * lat["hlofuse_median_s"])

    step("correctness")
    out_h = _block(hf(*args))
    res["mismatches"] = compare(out_h, out_j, m.category)[:5]
    res["mismatches_first_call"] = compare(out_h1, out_j, m.category)[:5]
    res["correct"] = not res["mismatches"] and not res["mismatches_first_call"]
    res["correct_by"] = "matches jax.jit" if res["correct"] else None
    ref = None if res["correct"] else zoo.f32_reference(name, size, cfg.seed, args)
    if ref is not None:  # bf16: as accurate as jax.jit against the model computed in f32
        want = _block(ref())
        res["bf16_parity"] = [zoo.bf16_parity(o, out_j, want) for o in (out_h, out_h1)]
        res["correct"] = all(p["ok"] for p in res["bf16_parity"])
        res["correct_by"] = "as accurate as jax.jit vs f32" if res["correct"] else None
    res["numerics"] = runner.numerics(out_h, out_j)

    rep = hf.report(*args)
    res["decisions"] = _decisions(rep, dec)
    res["pass_seconds"] = {k: round(v, 3) for k, v in rep.pass_seconds.items()}
    res["notes"] = list(rep.notes)[:30]
    return res


# ------------------------------------------------------------------------------------------
# output
# ------------------------------------------------------------------------------------------
def _ms(s):
    return "-" if s is None or not math.isfinite(s) else f"{s * 1e3:.3g}"


def rows(results: list) -> list[tuple]:
    head = ("model", "library", "mode", "dtype", "correct", "kernels", "jax ms", "hlofuse ms",
            "ratio", "IQR", "flag", "1st jax s", "1st hl s", "1st ratio", "ready ratio", "tune s",
            "decisions")
    out = [head]
    for r in results:
        if "error" in r:
            out.append((r["name"], r.get("library", "-"), "-", "-", "ERROR", "-", "-", "-", "-",
                        "-", "-", "-", "-", "-", "-", "-", r["error"][:70]))
            continue
        lat, d = r["latency"], r["decisions"]
        ok = ("MISMATCH" if not r["correct"] else
              "ok" if r["correct_by"] == "matches jax.jit" else "ok (f32)")
        out.append((r["name"], r["library"], r["mode"], "/".join(x.replace("float", "f")
                                                               for x in r["dtype"]),
                    ok, f"{d['kernels']}", _ms(lat["jax_median_s"]), _ms(lat["hlofuse_median_s"]),
                    f"{lat['median_ratio']:.3f}", f"{lat['ratio_p25']:.2f}-{lat['ratio_p75']:.2f}",
                    f"{lat['flagged_rounds']}/{lat['rounds']}", f"{r['first_call_jax_s']:.2f}",
                    f"{r['first_call_hlofuse_s']:.2f}", f"{r['first_call_ratio']:.2f}",
                    f"{r.get('ready_ratio', r['first_call_ratio']):.2f}",
                    f"{r['tune_s']:.2f}", _decision_text(d)))
    return out


def summary(results: list) -> dict:
    ok = [r for r in results if "error" not in r]
    ratios = [r["latency"]["median_ratio"] for r in ok]
    firsts = [r["first_call_ratio"] for r in ok]
    geo = lambda xs: math.exp(statistics.fmean(math.log(x) for x in xs)) if xs else float("nan")  # noqa: E731
    return {"models": len(results), "errors": len(results) - len(ok),
            "mismatches": sum(1 for r in ok if not r["correct"]),
            "steady_geomean": geo(ratios), "steady_max": max(ratios, default=float("nan")),
            "above_ceiling": [r["name"] + (" (jax.jit's own executable: noise)"
                                           if r.get("same_executable_as_jax") else "")
                              for r in ok if r["latency"]["median_ratio"] > CEILING],
            "first_call_geomean": geo(firsts), "first_call_max": max(firsts, default=float("nan")),
            "ready_geomean": geo([r.get("ready_ratio", r["first_call_ratio"]) for r in ok]),
            "tune_s_total": sum(r["tune_s"] for r in ok)}


def format_summary(s: dict) -> str:
    return (f"{s['models']} models, {s['errors']} errors, {s['mismatches']} mismatches; steady "
            f"ratio geomean {s['steady_geomean']:.3f}, max {s['steady_max']:.3f}, above "
            f"{CEILING}: {', '.join(s['above_ceiling']) or 'none'}; first-call ratio geomean "
            f"{s['first_call_geomean']:.2f}, max {s['first_call_max']:.2f} (hlofuse's code "
            f"ready: geomean {s.get('ready_geomean', float('nan')):.2f}); tuning "
            f"{s['tune_s_total']:.1f} s in all")


def markdown(meta: dict, results: list) -> str:
    rs = rows(results)
    lines = [f"# hlofuse model zoo ({meta['device']}, {meta['size']} configs)", "",
             f"Command: `{meta['command']}`  ", f"Date: {meta['date']}; " + ", ".join(
                 f"{k} {v}" for k, v in meta["versions"].items()), "",
             "| " + " | ".join(rs[0]) + " |", "|" + "---|" * len(rs[0])]
    lines += ["| " + " | ".join(str(c) for c in row) + " |" for row in rs[1:]]
    lines += ["", format_summary(summary(results)), "", "## Models", ""]
    for r in results:
        m = zoo.get(r["name"])
        lines.append(f"- **{r['name']}** ({m.library}): {m.description}")
        for p in r.get("mismatches", []) + r.get("mismatches_first_call", []):
            lines.append(f"  - differs from jax.jit: {p}")
        for p in r.get("bf16_parity", [])[:1]:
            lines.append(f"  - against the model in f32: hlofuse max/RMS error "
                         f"{p['hlofuse_vs_f32']['max']:.3g}/{p['hlofuse_vs_f32']['rms']:.3g}, "
                         f"jax.jit {p['jax_vs_f32']['max']:.3g}/{p['jax_vs_f32']['rms']:.3g} "
                         f"(passes within {p['factor']}x: {p['ok']})")
        if "error" in r:
            lines.append(f"  - error: {r['error']}")
    return "\n".join(lines) + "\n"


def plot(path: str, results: list, title: str) -> None:
    from bench.png import bar_image, stack, write_png
    ok = [r for r in results if "error" not in r]
    labels = [r["name"] + ("" if r["correct"] else " (x)") for r in ok]
    steady = bar_image(labels, [r["latency"]["median_ratio"] for r in ok],
                       lo=[r["latency"]["ratio_p25"] for r in ok],
                       hi=[r["latency"]["ratio_p75"] for r in ok],
                       goals=[CEILING] * len(ok),
                       title=f"steady state hlofuse.jit / jax.jit ({title})")
    first = bar_image(labels, [r["first_call_ratio"] for r in ok],
                      goals=[2.0] * len(ok), title="first call hlofuse.jit / jax.jit")
    write_png(path, stack([steady, first]))


def format_table(rs: list[tuple]) -> str:
    from bench.common import format_table as fmt
    return fmt(rs)


def main(args) -> int:
    """Run the zoo for the parsed ``python -m bench`` arguments (see bench/__main__.py)."""
    from bench import runner
    from bench.common import Progress, _versions

    names = []
    for x in args.models or zoo.names():
        names += [n for n in x.split(",") if n]
    models = [zoo.get(n) for n in names]  # fail early on a typo
    missing = zoo.missing_libraries(models)
    if missing:
        print(f"the model zoo needs {', '.join(missing)}: pip install -e \".[zoo]\"",
              file=sys.stderr)
        return 2
    size = args.zoo_size
    cfg = runner.Config(rounds=15, min_rounds=15, warmup=1, rss=False, eager_calls=0,
                        modeled_targets=())
    if args.quick:
        cfg = runner.Config(rounds=5, min_rounds=5, warmup=1, min_measure_s=0.05, rss=False,
                            eager_calls=0, modeled_targets=())
    if args.rounds is not None:
        cfg.rounds = cfg.min_rounds = max(1, args.rounds)
    cfg.autotune = {"auto": None, "on": True, "off": False}[args.autotune]
    runner.fresh_cache_dir("hlofuse-zoo-cache-")
    import jax
    dev = jax.devices()[0]
    meta = {"command": "python -m bench " + " ".join(sys.argv[1:]),
            "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
            "versions": _versions(), "device": (dev.platform if dev.device_kind == dev.platform
                       else f"{dev.platform}: {dev.device_kind}"),
            "size": size, "rounds": cfg.rounds, "cache_dir": os.environ["HLOFUSE_CACHE_DIR"],
            "ceiling": CEILING}
    # the selected models' libraries (missing_libraries imported them)
    for lib in zoo.LIBRARIES:
        if lib in sys.modules:
            meta["versions"][lib] = getattr(sys.modules[lib], "__version__", "?")
    results = []
    prog = Progress(len(names))
    t0 = time.perf_counter()
    for i, n in enumerate(names):
        prog.start(i, n)
        try:
            results.append(measure(n, size, cfg, progress=prog.show))
        except Exception as e:  # noqa: BLE001 - one broken model must not hide the others
            results.append({"name": n, "library": zoo.get(n).library,
                            "error": f"{type(e).__name__}: {str(e)[:500]}"})
    prog.done()
    meta["total_s"] = time.perf_counter() - t0
    print(f"\nmodel zoo ({size} configs) on {meta['device']}: hlofuse.jit vs jax.jit; ratio = "
          f"median of per-round time ratios over {cfg.rounds} interleaved rounds; "
          f"total {meta['total_s']:.0f}s")
    print(format_table(rows(results)))
    print(format_summary(summary(results)))
    if args.json:
        with open(args.json, "w") as fh:
            json.dump({"meta": meta, "summary": summary(results), "results": results}, fh,
                      indent=1, default=str)
        print(f"wrote {args.json}")
    if args.markdown:
        with open(args.markdown, "w") as fh:
            fh.write(markdown(meta, results))
        print(f"wrote {args.markdown}")
    if args.plot:
        plot(args.plot, results, f"{meta['device']}, {size} configs")
        print(f"wrote {args.plot}")
    bad = any("error" in r or not r["correct"] for r in results)
    return 1 if bad else 0
