"""``python -m bench.train_rest``: the rest of a training step (issue 15, item 3), hlofuse.jit
vs jax.jit of ``jax.value_and_grad(loss)``, interleaved.

Workloads:

* ``xent_v32k`` / ``xent_v50k``: softmax cross-entropy forward + backward over a large vocabulary
  with integer labels (``take_along_axis(log_softmax(logits), labels)``), logits given (rows x
  vocab), the loss and d(logits) returned;
* ``xent_optax_v32k``: the same loss as optax writes it (``logsumexp(z) - take_along_axis(z, y)``);
* ``norm_mlp``: a pre-norm MLP block's training step (layernorm with learned scale/bias, GELU
  MLP, rmsnorm) on (rows x d_model), value and gradients of all parameters.

Per workload: median per-round time ratio hlofuse/jax (rounds interleaved A B B A, see
:func:`bench.runner.interleaved`), the numbers' agreement, XLA's ``memory_analysis()`` temp
bytes of both executables, and hlofuse's kernels. ``--variant NAME=pass,...`` adds an hlofuse
configuration with those passes disabled (e.g. ``--variant nogather=row-gather-scatter``) or a
pass option set (``--variant cols=fuse-reduction.column_reductions:on``,
``--variant rows=row-gather-scatter.on_cpu:true``: both are off on cpu by default), timed against
jax.jit the same way, to see what one rewrite contributes.

``--compare-hlo``: instead of timing, compile jax.jit's and hlofuse's (``autotune=False``) step
and print the XLA instructions (dtype, shape without unit dims, opcode; bitcasts and parameters
left out) that one has and the other lacks. For ``norm_mlp`` on cpu both lists are empty: the
rewritten step is XLA's own program instruction for instruction (the kernels are single-step
StableHLO that XLA:CPU fuses as it would the original ops; row-gather-scatter and column
reductions are off on cpu), so its time ratio is 1.0 up to noise (measured 0.94-1.12 on the
loaded host).

CPU figures on a shared machine are noisy: treat them as preliminary and re-run on a quiet one.
"""

from __future__ import annotations

import argparse
import json
import sys

WORKLOADS = ("xent_v32k", "xent_v50k", "xent_optax_v32k", "norm_mlp")


def _xent(logits, labels):
    import jax
    import jax.numpy as jnp
    lp = jax.nn.log_softmax(logits)
    return -jnp.take_along_axis(lp, labels[:, None], -1).mean()


def _xent_optax(logits, labels):
    import jax
    import jax.numpy as jnp
    lse = jax.nn.logsumexp(logits, axis=-1)
    return (lse - jnp.take_along_axis(logits, labels[:, None], -1)[:, 0]).mean()


def _norm_mlp(p, x):
    import jax
    import jax.numpy as jnp
    m = x.mean(-1, keepdims=True)
    v = ((x - m) ** 2).mean(-1, keepdims=True)
    h = (x - m) * jax.lax.rsqrt(v + 1e-5) * p["ln_s"] + p["ln_b"]
    h = jax.nn.gelu(h @ p["w1"] + p["b1"], approximate=True) @ p["w2"] + p["b2"]
    y = x + h
    y = y * jax.lax.rsqrt((y * y).mean(-1, keepdims=True) + 1e-6) * p["rms_s"]
    return (y * y).mean()


def make(name: str, norm_mlp_sizes: tuple = (1024, 768, 3072)):
    """(loss function, args) of a workload (``norm_mlp_sizes``: rows, d_model, ffn)."""
    import jax
    import jax.numpy as jnp
    k1, k2, k3, k4 = jax.random.split(jax.random.PRNGKey(0), 4)
    if name.startswith("xent"):
        vocab = {"xent_v32k": 32768, "xent_v50k": 50304, "xent_optax_v32k": 32768}[name]
        rows = 512
        logits = jax.random.normal(k1, (rows, vocab), jnp.float32) * 2.0
        labels = jax.random.randint(k2, (rows,), 0, vocab)
        return (_xent_optax if "optax" in name else _xent), (logits, labels)
    if name == "norm_mlp":
        rows, d, f = norm_mlp_sizes
        p = {"ln_s": jnp.ones(d), "ln_b": jnp.zeros(d), "rms_s": jnp.ones(d),
             "w1": jax.random.normal(k1, (d, f)) * 0.02, "b1": jnp.zeros(f),
             "w2": jax.random.normal(k2, (f, d)) * 0.02, "b2": jnp.zeros(d)}
        return _norm_mlp, (p, jax.random.normal(k3, (rows, d)))
    raise KeyError(name)


def measure(name: str, rounds: int, variants: dict) -> dict:
    import jax
    import hlofuse
    from hlofuse.runtime.testing import compare
    from bench.runner import Config, compiled_stats, hlofuse_compiled, interleaved
    loss, args = make(name)
    step = jax.value_and_grad(loss)
    ref = jax.jit(step)
    want = jax.block_until_ready(ref(*args))
    cfg = Config(rounds=rounds, min_rounds=rounds, warmup=3)
    jax_stats = compiled_stats(ref.lower(*args).compile())
    out = {"workload": name, "jax_temp_bytes": jax_stats.get("memory_analysis", {}).get("temp_bytes"),
           "variants": {}}
    for vname, spec in {"default": ((), {}), **variants}.items():
        disabled, options = spec
        hf = hlofuse.jit(step, tiered=False, disable=disabled, options=options or None)
        got = jax.block_until_ready(hf(*args))
        problems = compare(got, want, "grad")
        report = hf.report(*args)
        t = interleaved(ref, hf, args, cfg)
        hs = compiled_stats(hlofuse_compiled(hf, args)[0])
        out["variants"][vname] = {
            "disabled": list(disabled), "options": options, "same_results": not problems, "problems": problems[:2],
            "median_ratio": t["median_ratio"], "ratio_p25": t["ratio_p25"], "ratio_p75": t["ratio_p75"],
            "jax_median_s": t["jax_median_s"], "hlofuse_median_s": t["hlofuse_median_s"],
            "flagged_rounds": t["flagged_rounds"], "rounds": t["rounds"],
            "temp_bytes": hs.get("memory_analysis", {}).get("temp_bytes"),
            "kernels": [r.kernel for r in report.regions if r.kernel],
        }
    return out


def _instructions(text: str):
    import collections
    import re
    out = collections.Counter()
    for m in re.finditer(r"= (\w+)\[([\d,]*)\]\S* (\w[\w-]*)\(", text):
        dt, shape, op = m.groups()
        if op not in ("bitcast", "parameter"):
            out[(dt, ",".join(d for d in shape.split(",") if d not in ("1", "")), op)] += 1
    return out


def compare_hlo(name: str) -> dict:
    """XLA instructions only jax.jit's / only hlofuse's compiled step has (see the docstring)."""
    return compare_step_hlo(*make(name))


def compare_step_hlo(loss, args) -> dict:
    """:func:`compare_hlo` of ``jax.value_and_grad(loss)`` on ``args``."""
    import jax
    import hlofuse
    from bench.runner import hlofuse_compiled
    step = jax.value_and_grad(loss)
    ref = _instructions(jax.jit(step).lower(*args).compile().as_text())
    hf = hlofuse.jit(step, tiered=False, autotune=False)
    jax.block_until_ready(hf(*args))
    got = _instructions(hlofuse_compiled(hf, args)[0].as_text())
    fmt = lambda c: {f"{dt}[{sh}] {op}": n for (dt, sh, op), n in sorted(c.items())}
    return {"kernels": len(hf.report(*args).kernels), "only_jax": fmt(ref - got),
            "only_hlofuse": fmt(got - ref)}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--workloads", default=",".join(WORKLOADS))
    ap.add_argument("--rounds", type=int, default=10)
    ap.add_argument("--variant", action="append", default=[],
                    help="NAME=pass1,pass2,pass.option:value: also time hlofuse with these passes "
                         "disabled / options set (e.g. cols=fuse-reduction.column_reductions:on)")
    ap.add_argument("--json", default=None)
    ap.add_argument("--compare-hlo", action="store_true",
                    help="print the XLA instructions jax.jit's and hlofuse's step do not share")
    a = ap.parse_args(argv)
    if a.compare_hlo:
        for name in a.workloads.split(","):
            print(name, json.dumps(compare_hlo(name)), flush=True)
        return 0
    variants = {}
    for v in a.variant:
        k, _, items = v.partition("=")
        disabled, options = [], {}
        for item in (i for i in items.split(",") if i):
            if "." in item:   # pass.option=value (bool): e.g. fuse-reduction.column_reductions=false
                key, _, val = item.partition(":")
                pname, _, opt = key.partition(".")
                options.setdefault(pname, {})[opt] = {"true": True, "false": False}.get(val.lower(), val)
            else:
                disabled.append(item)
        variants[k] = (tuple(disabled), options)
    results = []
    for name in a.workloads.split(","):
        r = measure(name, a.rounds, variants)
        results.append(r)
        for vname, v in r["variants"].items():
            print(f"{name:16s} {vname:10s} ratio {v['median_ratio']:.3f} (p25 {v['ratio_p25']:.3f}, p75 "
                  f"{v['ratio_p75']:.3f}; jax {v['jax_median_s'] * 1e3:.1f} ms; {v['flagged_rounds']}/"
                  f"{v['rounds']} rounds under foreign load) temp bytes hlofuse {v['temp_bytes']} vs jax "
                  f"{r['jax_temp_bytes']}; same results: {v['same_results']}; kernels {len(v['kernels'])}",
                  flush=True)
    if a.json:
        with open(a.json, "w") as fh:
            json.dump(results, fh, indent=2)
    return 0


if __name__ == "__main__":
    sys.exit(main())
