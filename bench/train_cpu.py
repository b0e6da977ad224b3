"""Training steps on CPU: ``hlofuse.jit`` vs ``jax.jit`` of the same step, time and memory.

    python -m bench.train_cpu                          # every workload, 7 interleaved rounds
    python -m bench.train_cpu --workloads attn_train_s2048 --rounds 10 --json out.json
    python -m bench.train_cpu --no-rss                 # time only

Workloads (issue 15):

* ``attn_train_s2048``: ``jax.value_and_grad`` of ``sum(attention(q, k, v)**2)`` w.r.t. Q, K, V,
  attention B=1 H=8 d=64 S=2048 f32 (BSHD einsums, ``jax.nn.softmax``, as in
  ``bench/attention_cpu.py``). Targets: time <= 0.45, run memory <= 1/4 of jax.jit's.
* ``attn_train_b2h12_s2048``: the same step at B=2 H=12 (base-model heads), where the step
  budgets shrink each head's query chunks (no target; the many-head case).
* ``gpt2_train_s1024`` / ``gpt2_train_s2048``: a GPT-2-small-like stack (d=768, 12 heads,
  ff=3072, causal, pre-LN, tanh-GELU; ``LAYERS`` blocks) training step: forward, a
  next-token-style squared loss, backward, SGD update of every parameter. Target at S=1024:
  time <= 0.85.
* ``gpt2_scan_train_s1024`` / ``gpt2_scan_remat_train_s1024``: the same stack's step with its
  blocks run by ``lax.scan`` over stacked parameters, without and with ``jax.checkpoint``
  around the scanned block (no target: what a scan-over-layers user gets, and what remat
  buys there).
* ``attn_grad_of_hlofuse_s2048``: ``jax.jit(jax.value_and_grad(hlofuse.jit(loss)))`` (hlofuse
  inside a user's jax transformation: the derived forward saves no probabilities, the derived
  backward recomputes them and gets the flash kernels) against
  ``jax.jit(jax.value_and_grad(loss))``. Target <= 1.0.
* ``gpt2_blocks_grad_of_hlofuse_s1024``: the gpt2 step at S=1024 with each block under
  ``hlofuse.jit`` and ``jax.jit(jax.value_and_grad(...))`` outside (a user who wraps the model,
  not the step), against the same step without hlofuse (no target).

Modes per workload: ``hlofuse`` (``autotune=False``: fusion alone) and, with ``--autotune``,
``hlofuse+tune`` (the default a user gets: XLA options measured on the second call).

``--bwd-blocks 512x512,128x128`` adds one ``hlofuse bwd=BQxBK`` mode per entry: the same step
with the cpu flash backward built with those blocks instead of ``cpu_bwd_plan``'s (the module
cache is turned off for this run, so every mode is optimized afresh): the A/B behind
:data:`hlofuse.kernels.attention.blocks.CPU_BWD_STEP_BUDGET`.

Time: each function compiled and called twice, then rounds that run each once in alternating
order; the ratio is the median of per-round ratios (robust on a shared machine). Memory: a
fresh subprocess per function compiles ahead of time, runs one call, resets the peak-RSS mark
(``/proc/self/clear_refs``), runs a steady call; the figure is ``VmHWM`` minus the RSS before it.
"""

from __future__ import annotations

import argparse
import functools
import json
import math
import os
import statistics
import subprocess
import sys
import time

import numpy as np

LAYERS = 2
D_MODEL, N_HEADS, FF = 768, 12, 3072


# ---------------------------------------------------------------------------------------------
# steps
# ---------------------------------------------------------------------------------------------

def attention(q, k, v):
    import jax
    import jax.numpy as jnp
    s = jnp.einsum("bqhd,bkhd->bhqk", q, k) * (1.0 / math.sqrt(q.shape[-1]))
    p = jax.nn.softmax(s, axis=-1)
    return jnp.einsum("bhqk,bkhd->bqhd", p, v)


def attn_loss(q, k, v):
    import jax.numpy as jnp
    return jnp.sum(attention(q, k, v) ** 2)


def attn_step(q, k, v):
    import jax
    return jax.value_and_grad(attn_loss, argnums=(0, 1, 2))(q, k, v)


def _attn_args(seq, batch=1, heads=8):
    rng = np.random.default_rng(0)
    return [rng.standard_normal((batch, seq, heads, 64)).astype(np.float32) for _ in range(3)]


def _next_token_loss(h, x):
    """Next-token-style target: each position predicts the next position's input."""
    import jax.numpy as jnp
    return jnp.mean((h[:, :-1] - x[:, 1:]) ** 2)


def gpt2_loss(params, x, block=None):
    """The stack's loss; ``block(p, h)`` runs one block (default: ``gpt2_block``)."""
    from bench.workloads import gpt2_block
    h = x
    for p in params:
        h = gpt2_block(p, h, n_heads=N_HEADS) if block is None else block(p, h)
    return _next_token_loss(h, x)


def gpt2_scan_loss(params, x, remat: bool = False):
    """:func:`gpt2_loss` with the blocks' parameters stacked and the blocks run by
    ``lax.scan`` (scan over layers); ``remat``: the scanned block under ``jax.checkpoint``
    (``dots_with_no_batch_dims_saveable``, the projections' products are saved)."""
    import jax
    from bench.workloads import gpt2_block

    def block(h, p):
        return gpt2_block(p, h, n_heads=N_HEADS)
    if remat:
        block = jax.checkpoint(block, policy=jax.checkpoint_policies.dots_with_no_batch_dims_saveable)
    return _next_token_loss(jax.lax.scan(lambda h, p: (block(h, p), None), x, params)[0], x)


def _sgd_step(loss_fn, name: str):
    """``step(params, x) -> (loss, params - 1e-3 * grad)`` of ``loss_fn``, named ``name``."""
    def step(params, x):
        import jax
        loss, grads = jax.value_and_grad(loss_fn)(params, x)
        return loss, jax.tree.map(lambda p, g: p - 1e-3 * g, params, grads)
    step.__name__ = step.__qualname__ = name
    return step


gpt2_step = _sgd_step(gpt2_loss, "gpt2_step")


def _gpt2_scan_step(remat: bool):
    return _sgd_step(lambda params, x: gpt2_scan_loss(params, x, remat),
                     "gpt2_scan_remat_step" if remat else "gpt2_scan_step")


def _gpt2_scan_args(seq):
    """:func:`_gpt2_args` with the blocks' parameter trees stacked along a leading layer axis."""
    import jax
    params, x = _gpt2_args(seq)
    return [jax.tree.map(lambda *xs: np.stack(xs), *params), x]


def _gpt2_args(seq):
    from bench.workloads import _transformer_params
    rng = np.random.default_rng(0)
    params = [_transformer_params(rng, D_MODEL, FF) for _ in range(LAYERS)]
    x = (rng.standard_normal((1, seq, D_MODEL)) * 0.5).astype(np.float32)
    return [params, x]


WORKLOADS = {
    "attn_train_s2048": (attn_step, lambda: _attn_args(2048)),
    # many heads: B=2 H=12 (BERT/GPT-2-base heads), where the step budgets shrink the chunks
    "attn_train_b2h12_s2048": (attn_step, lambda: _attn_args(2048, batch=2, heads=12)),
    "gpt2_train_s1024": (gpt2_step, lambda: _gpt2_args(1024)),
    "gpt2_train_s2048": (gpt2_step, lambda: _gpt2_args(2048)),
    "attn_grad_of_hlofuse_s2048": (None, lambda: _attn_args(2048)),
    # the gpt2 stack as scan over layers: without remat the probabilities are the forward
    # loop's residuals (no kernel spans the two loops); with remat the backward loop
    # recomputes the forward and gets the flash forward and backward
    "gpt2_scan_train_s1024": (_gpt2_scan_step(False), lambda: _gpt2_scan_args(1024)),
    "gpt2_scan_remat_train_s1024": (_gpt2_scan_step(True), lambda: _gpt2_scan_args(1024)),
    # the gpt2 step with each block under hlofuse.jit, grad and jit outside (a user who wraps
    # the model, not the step)
    "gpt2_blocks_grad_of_hlofuse_s1024": (None, lambda: _gpt2_args(1024)),
}


def _gpt2_step_of(block):
    """:data:`gpt2_step` with ``block(p, h)`` for the blocks, under ``jax.jit``."""
    import jax
    return jax.jit(_sgd_step(functools.partial(gpt2_loss, block=block), "gpt2_step"))


def _with_bwd_blocks(step, blocks: str):
    """``hlofuse.jit(step)`` whose cpu attention backward uses ``blocks`` ("BQxBK"): the plan is
    swapped while the first call builds the kernels."""
    import jax
    import hlofuse
    from hlofuse.kernels.attention import backward
    from hlofuse.kernels.attention.blocks import AttentionBlocks
    bq, bk = (int(x) for x in blocks.split("x"))
    f = hlofuse.jit(step, tiered=False, autotune=False)

    def call(*args):
        if not getattr(call, "built", False):
            plan = backward.cpu_bwd_plan
            backward.cpu_bwd_plan = lambda spec: AttentionBlocks("cpu", bq, bk)
            try:
                jax.block_until_ready(f(*args))
            finally:
                backward.cpu_bwd_plan = plan
            call.built = True
        return f(*args)
    return call


def functions(name: str, autotune: bool, bwd_blocks: tuple = ()) -> dict:
    import jax
    import hlofuse
    step, _ = WORKLOADS[name]
    if name == "gpt2_blocks_grad_of_hlofuse_s1024":
        from bench.workloads import gpt2_block

        def block(p, h):
            return gpt2_block(p, h, n_heads=N_HEADS)
        return {"jax": _gpt2_step_of(block),
                "hlofuse": _gpt2_step_of(hlofuse.jit(block, autotune=False))}
    if step is None:    # hlofuse inside the user's grad
        return {"jax": jax.jit(jax.value_and_grad(attn_loss, argnums=(0, 1, 2))),
                "hlofuse": jax.jit(jax.value_and_grad(hlofuse.jit(attn_loss, autotune=False),
                                                      argnums=(0, 1, 2)))}
    fns = {"jax": jax.jit(step), "hlofuse": hlofuse.jit(step, tiered=False, autotune=False)}
    if autotune:
        fns["hlofuse+tune"] = hlofuse.jit(step, tiered=False)
    for b in bwd_blocks:
        fns[f"hlofuse bwd={b}"] = _with_bwd_blocks(step, b)
    return fns


# ---------------------------------------------------------------------------------------------
# measurement
# ---------------------------------------------------------------------------------------------

def _status_kib(key: str) -> int:
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith(key + ":"):
                return int(line.split()[1])
    return -1


def _block(x):
    import jax
    return jax.block_until_ready(x)


def rss_child(name: str, which: str) -> dict:
    import jax
    args = [jax.tree.map(jax.numpy.asarray, a) for a in WORKLOADS[name][1]()]
    f = functions(name, autotune=which == "hlofuse+tune")[which]
    _block(f(*args))
    _block(f(*args))
    before = _status_kib("VmRSS")
    try:
        with open("/proc/self/clear_refs", "w") as fh:
            fh.write("5")
        reset = True
    except OSError:
        reset = False
    _block(f(*args))
    peak = _status_kib("VmHWM")
    return {"run_mib": (peak - before) / 1024, "reset": reset}


def measure_rss(name: str, which: str) -> dict:
    out = subprocess.run([sys.executable, "-m", "bench.train_cpu", "--rss-child", name, which],
                         capture_output=True, text=True, timeout=3600,
                         env={**os.environ, "HLOFUSE_AUTOTUNE": os.environ.get("HLOFUSE_AUTOTUNE", "on")})
    if out.returncode:
        raise RuntimeError(out.stderr[-2000:])
    return json.loads(out.stdout.strip().splitlines()[-1])


def measure_time(name: str, rounds: int, autotune: bool, bwd_blocks: tuple = ()) -> dict:
    import jax
    from bench.runner import timed_calls
    args = [jax.tree.map(jax.numpy.asarray, a) for a in WORKLOADS[name][1]()]
    fns = functions(name, autotune, bwd_blocks)
    compile_s = {}
    for k, f in fns.items():
        t = time.perf_counter()
        _block(f(*args))
        compile_s[k] = time.perf_counter() - t
        _block(f(*args))
    times = {k: [] for k in fns}
    order = list(fns)
    for r in range(rounds):
        for k in (order if r % 2 == 0 else order[::-1]):
            times[k].append(timed_calls(fns[k], args, 1))   # waits out the call's tail, untimed
    res = {"median_s": {k: statistics.median(v) for k, v in times.items()},
           "first_call_s": compile_s}
    res["ratio"] = {k: statistics.median(a / b for a, b in zip(times[k], times["jax"]))
                    for k in fns if k != "jax"}
    return res


def report_regions(name: str) -> list:
    import jax
    import hlofuse
    step, make = WORKLOADS[name]
    if step is None:
        return []
    args = [jax.tree.map(jax.numpy.asarray, a) for a in make()]
    rep = hlofuse.jit(step, tiered=False, autotune=False).report(*args)
    return [f"{r.kind}:{r.kernel or r.reason}" for r in rep.regions if r.kind.startswith("attention")]


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--workloads", nargs="*", default=list(WORKLOADS),
                    help="space or comma separated; known: " + ", ".join(WORKLOADS))
    ap.add_argument("--rounds", type=int, default=7)
    ap.add_argument("--no-rss", action="store_true")
    ap.add_argument("--autotune", action="store_true")
    ap.add_argument("--json", default=None)
    ap.add_argument("--bwd-blocks", default="",
                    help="comma-separated BQxBK: also time the step with these cpu backward blocks")
    ap.add_argument("--rss-child", nargs=2, default=None, help=argparse.SUPPRESS)
    a = ap.parse_args(argv)
    a.workloads = [w for arg in a.workloads for w in arg.split(",") if w]
    unknown = [w for w in a.workloads if w not in WORKLOADS]
    if unknown:
        ap.error(f"unknown workload(s) {', '.join(unknown)}; known: {', '.join(WORKLOADS)}")
    if a.rss_child:
        print(json.dumps(rss_child(*a.rss_child)))
        return 0
    from bench import runner
    runner.fresh_cache_dir("hlofuse-train-cache-")   # measure what a new user gets
    bwd_blocks = tuple(b for b in a.bwd_blocks.split(",") if b)
    if bwd_blocks:
        os.environ["HLOFUSE_MODULE_CACHE"] = "0"   # else every mode would load the same module
    results = {}
    for name in a.workloads:
        r = {"attention_regions": report_regions(name)}
        r.update(measure_time(name, a.rounds, a.autotune, bwd_blocks))
        if not a.no_rss:
            r["run_mib"] = {k: measure_rss(name, k)["run_mib"] for k in r["median_s"]
                            if not k.startswith("hlofuse bwd=")}   # time-only modes
            r["mem_ratio"] = {k: r["run_mib"][k] / r["run_mib"]["jax"] for k in r["run_mib"]
                              if k != "jax"}
        results[name] = r
        print(name, json.dumps(r, indent=1), flush=True)
    if a.json:
        with open(a.json, "w") as f:
            json.dump(results, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
