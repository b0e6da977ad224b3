"""CI: every kernel family x dtype x shape (tiny to real models) compiles for real chips.

Run with the ``aot`` extras installed (``.venv-aot``): ``python .ci/aot_matrix.py [--chips
h100,a100,v5e,v4,v6e] [--jobs 2] [--json out.json]``. For each chip, in its own process, every
case is exported for the chip's platform, optimized by hlofuse for that chip (tiles from its
description) and compiled by the chip's real compiler (:func:`hlofuse.runtime.aot.optimize_many`: one
compiler worker per chip). A kernel passes when it compiles; it fails when the compiler
rejects it (it would then go back to XLA for that chip) or when a case that should produce a
kernel of its family produces none. Prints per-chip counts and compile times, the compiler's
resource figures per kernel for the chips named by ``--figures`` (default h100 and v5e: ptxas
registers per thread, spills, shared memory and the occupancy bound of each Triton kernel;
the scoped VMEM of each Mosaic kernel against the chip's limit), flags ("!!") kernels that
spill or cannot reach half occupancy, and ends with "N passed, M failed" (exit 1 on any
failure; a kernel whose figures could not be read is a failure, and so is one that spills
registers unless it is listed in KNOWN_SPILLS or ``--allow-spills`` is given).
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)

FAMILIES = ("elementwise", "reduction", "matmul_epilogue", "attention", "horizontal",
            "attention_bwd")

# Kernels the compiler rejects today, each with what the compiler says. They go back to XLA
# for that chip (hlofuse.runtime.aot.optimize_for), are listed in the output as "known", and are not
# counted as passed. (target, case substring, kernel kind, text of the compiler's message).
KNOWN = [
    # (the bf16 cross-entropy row kernels' "Lane broadcast" failure on v5e/v6e is gone: a select
    # of 16-bit floats runs in f32 in every kernel body, kernels/blockeval.py)
]


# Kernels that spill registers today (ptxas -v of the compile hlofuse.runtime.aot runs), with the
# figures measured when listed: printed as "known spill", not counted as failed; any other
# spill fails the matrix. Fix the kernel's blocks/warps and drop its line.
# (chip, case substring, kernel kind, figures)
# None left on H100 or A100: the f32 flash forward at head dim 64 (32-48 B on H100) takes 64-row
# query blocks (kernels/attention/triton.py), the Q/K/V horizontal kernels (H100 96 B, A100
# 16-96 B) 64x32 tiles (kernels/tiling.py, GPU_MAX_ACC_PER_THREAD), the flash backward (dK/dV
# up to 788+774 B on H100, 14672+14788 B on A100) per-chip blocks (kernels/attention/backward.py,
# gpu_bwd_blocks).
KNOWN_SPILLS: list[tuple[str, str, str, str]] = []


def _known_spill(chip: str, case: str, kind: str) -> str | None:
    for c, sub, k, why in KNOWN_SPILLS:
        if c == chip and sub in case and k == kind:
            return why
    return None


def _known(target: str, case: str, kind: str, error: str | None) -> str | None:
    for t, sub, k, text, why in KNOWN:
        if t == target and sub in case and k == kind and error and text in error:
            return why
    return None
DTYPES = ("f32", "bf16", "f16", "int8")


@dataclasses.dataclass
class Case:
    name: str
    family: str              # the family that must appear ('model' cases: at least one kernel)
    dtype: str
    build: object            # () -> (fn, avals)
    targets: tuple = ("gpu", "tpu")   # where the family supports this dtype
    requires: str | None = None       # a hlofuse.core.chips.Chip flag the chip must have (int8_matmul)


def _cases() -> list[Case]:
    import numpy as np
    import jax
    import jax.numpy as jnp
    from jax import lax
    from bench import workloads as W

    dt = {"f32": jnp.float32, "bf16": jnp.bfloat16, "f16": jnp.float16, "int8": jnp.int8}
    S = jax.ShapeDtypeStruct
    cases: list[Case] = []

    def add(name, family, dtype, build, targets=("gpu", "tpu"), requires=None):
        cases.append(Case(f"{family}/{dtype}/{name}", family, dtype, build, targets, requires))

    for d in ("f32", "bf16", "f16"):
        t = dt[d]
        no_f16_tpu = ("gpu",) if d == "f16" else ("gpu", "tpu")
        # elementwise: a chain with a bias broadcast; tiny, a 4096-wide activation, ResNet NHWC
        for nm, shape in (("tiny", (8, 128)), ("act_4096x4096", (4096, 4096)),
                          ("nhwc_1x56x56x256", (1, 56, 56, 256))):
            add(nm, "elementwise", d, lambda shape=shape, t=t: (
                lambda x, y, b: jnp.tanh(x * y + b) * 0.5 + x,
                [S(shape, t), S(shape, t), S(shape[-1:], t)]), no_f16_tpu)
        # divide and sigmoid (a SiLU gate): Triton has no 16-bit divide; gpu/tpu kernels compute
        # 16-bit arithmetic in f32 and round each result back
        add("silu_div_4096x4096", "elementwise", d, lambda t=t: (
            lambda x, y, b: jax.nn.silu(x) / (y * y + 1) + b,
            [S((4096, 4096), t), S((4096, 4096), t), S((4096,), t)]), no_f16_tpu)
        # reduction: layernorm (tiny, BERT 512x768, 8192 features), softmax/logsumexp over 50k
        for nm, shape in (("layernorm_tiny", (8, 128)), ("layernorm_512x768", (512, 768)),
                          ("layernorm_64x8192", (64, 8192))):
            add(nm, "reduction", d, lambda shape=shape, t=t: (
                lambda x, g, b: W.layer_norm(x, g, b), [S(shape, t), S(shape[-1:], t), S(shape[-1:], t)]),
                no_f16_tpu)
        add("softmax_32x50257", "reduction", d, lambda t=t: (
            lambda x: jax.nn.softmax(x, axis=-1), [S((32, 50257), t)]), no_f16_tpu)
        add("logsumexp_32x50257", "reduction", d, lambda t=t: (
            lambda x: jax.nn.logsumexp(x.astype(jnp.float32), axis=-1), [S((32, 50257), t)]), no_f16_tpu)
        # matmul + epilogue: tiny, BERT FFN, a 4096-square GEMM with GELU
        for nm, (m, k, n) in (("tiny", (8, 128, 128)), ("bert_ffn_512x768x3072", (512, 768, 3072)),
                              ("gemm_4096", (4096, 4096, 4096))):
            add(nm, "matmul_epilogue", d, lambda m=m, k=k, n=n, t=t: (
                lambda x, w, b: jax.nn.gelu(x @ w + b), [S((m, k), t), S((k, n), t), S((n,), t)]),
                no_f16_tpu)
        # horizontal: Q/K/V projections sharing their input
        for nm, (m, k, n) in (("qkv_tiny", (16, 128, 128)), ("qkv_bert_512x768", (512, 768, 768))):
            add(nm, "horizontal", d, lambda m=m, k=k, n=n, t=t: (
                lambda x, wq, wk, wv: (x @ wq, x @ wk, x @ wv),
                [S((m, k), t)] + [S((k, n), t)] * 3), no_f16_tpu)
        # attention: tiny, BERT S=512 with a padding mask, S=8192 causal, S=8192 with a bias mask
        add("tiny", "attention", d, lambda t=t: (
            lambda q, k, v: W.attention(q, k, v), [S((1, 128, 2, 64), t)] * 3), no_f16_tpu)
        add("bert_s512_padmask", "attention", d, lambda t=t: (
            lambda q, k, v, m: W.attention(q, k, v, mask=m),
            [S((2, 512, 12, 64), t)] * 3 + [S((2, 1, 1, 512), jnp.float32)]), no_f16_tpu)
        add("s8192_causal", "attention", d, lambda t=t: (
            lambda q, k, v: W.attention(q, k, v, causal=True), [S((1, 8192, 8, 128), t)] * 3),
            no_f16_tpu)
        add("s8192_biasmask", "attention", d, lambda t=t: (
            lambda q, k, v, m: W.attention(q, k, v, mask=m),
            [S((1, 8192, 4, 64), t)] * 3 + [S((1, 1, 1, 8192), jnp.float32)]), no_f16_tpu)

    # training steps (issue 15 item 3), value_and_grad: cross-entropy forward + backward over a
    # 32k vocabulary (one row kernel: labels as a row input, the vocab iota as a column input),
    # a layernorm backward (d(scale)/d(bias) column partials per row block), a GELU MLP backward
    # (the derivative as the backward matmul's epilogue); select them with --only train_
    def _xent(z, y):
        return -jnp.take_along_axis(jax.nn.log_softmax(z), y[:, None], -1).mean()

    def _ln_loss(p, x):
        return (W.layer_norm(x, p[0], p[1]) ** 2).sum()

    def _mlp_loss(p, x):
        return jnp.sum((jax.nn.gelu(x @ p[0] + p[1]) @ p[2]) ** 2)

    for d in ("f32", "bf16"):
        t = dt[d]
        # (a gpu row block holds 16k elements: 32k and GPT-2's 50257 vocabulary are walked in
        # column tiles with an online logsumexp, kernels/row_tiled.py; 50257 is not a multiple
        # of any tile, so the last tile is masked)
        for v in (8192, 32768, 50257):
            add(f"train_xent_fwd_bwd_512x{v}", "reduction", d, lambda t=t, v=v: (
                jax.value_and_grad(_xent), [S((512, v), t), S((512,), jnp.int32)]))
        add("train_layernorm_bwd_512x768", "reduction", d, lambda t=t: (
            jax.value_and_grad(_ln_loss), [(S((768,), t), S((768,), t)), S((512, 768), t)]))
        add("train_gelu_mlp_bwd_512x768x3072", "matmul_epilogue", d, lambda t=t: (
            jax.value_and_grad(_mlp_loss),
            [(S((768, 3072), t), S((3072,), t), S((3072, 768), t)), S((512, 768), t)]))

    # attention training step (issue 15): value_and_grad through attention at S=8192, head dims
    # 64 and 128 -> the flash forward with lse and the flash backward (dK/dV and dQ kernels);
    # causal (block skipping) and a padding mask; select them with --only train_attention
    def _att_loss(q, k, v):
        return jnp.sum(W.attention(q, k, v, causal=True).astype(jnp.float32) ** 2)

    def _att_mask_loss(q, k, v, m):
        return jnp.sum(W.attention(q, k, v, mask=m).astype(jnp.float32) ** 2)

    for hd in (64, 128):
        add(f"train_attention_bwd_s8192_d{hd}_causal", "attention_bwd", "bf16", lambda hd=hd: (
            jax.value_and_grad(_att_loss, argnums=(0, 1, 2)),
            [S((1, 8192, 8, hd), jnp.bfloat16)] * 3))
        add(f"train_attention_bwd_s8192_d{hd}_padmask", "attention_bwd", "bf16", lambda hd=hd: (
            jax.value_and_grad(_att_mask_loss, argnums=(0, 1, 2)),
            [S((1, 8192, 8, hd), jnp.bfloat16)] * 3 + [S((1, 1, 1, 8192), jnp.float32)]))

    # grouped-query attention in a training step: the K/V repeat (32 query heads over 8 K/V
    # heads) is inside both regions, so the kernels read the unrepeated K/V and the backward
    # sums dK/dV over each group without a repeated tensor
    def _gqa_loss(q, k, v):
        k, v = jnp.repeat(k, 4, axis=2), jnp.repeat(v, 4, axis=2)
        return jnp.sum(W.attention(q, k, v, causal=True).astype(jnp.float32) ** 2)

    for hd in (64, 128):
        add(f"train_attention_bwd_gqa_s4096_d{hd}_causal", "attention_bwd", "bf16", lambda hd=hd: (
            jax.value_and_grad(_gqa_loss, argnums=(0, 1, 2)),
            [S((1, 4096, 32, hd), jnp.bfloat16)] + [S((1, 4096, 8, hd), jnp.bfloat16)] * 2))

    # int8 where a family supports it: elementwise (gpu; TPU kernels take no 8/16-bit ints)
    add("tiny", "elementwise", "int8", lambda: (
        lambda x, y: jnp.maximum(x, y) + jnp.minimum(x, y) * 2, [S((8, 128), jnp.int8)] * 2), ("gpu",))
    add("act_1024x4096", "elementwise", "int8", lambda: (
        lambda x, y: jnp.maximum(x, y) + jnp.minimum(x, y) * 2, [S((1024, 4096), jnp.int8)] * 2), ("gpu",))

    # quantized matmuls: int8 x int8 -> int32 with the dequant scale, bias, GELU and the
    # requantization to int8 in the epilogue; weight-only int8 with bf16 activations
    for nm, (m, k, n) in (("qlinear_tiny", (32, 128, 128)), ("qlinear_bert_ffn_512x768x3072", (512, 768, 3072))):
        add(nm, "matmul_epilogue", "int8", lambda m=m, k=k, n=n: (
            lambda x, w, s, b: W.quant_int8(jax.nn.gelu(
                jax.lax.dot_general(x, w, (((1,), (0,)), ((), ())), preferred_element_type=jnp.int32)
                .astype(jnp.float32) * s + b), 0.02),
            [S((m, k), jnp.int8), S((k, n), jnp.int8), S((n,), jnp.float32), S((n,), jnp.float32)]),
            requires="int8_matmul")  # TPU v4's MXU has no int8 mode: the dot stays with XLA there
    # the scale after the dot, as bf16 weight-only code that keeps int8 reads writes it
    # (quantize-matmul leaves a bf16 dequantization `w.astype(bf16) * s` as written: the
    # program rounds each product to bf16)
    add("qweight_only_bf16_512x4096x4096", "matmul_epilogue", "int8", lambda: (
        lambda x, w, s: jax.nn.silu((x @ w.astype(jnp.bfloat16)) * s),
        [S((512, 4096), jnp.bfloat16), S((4096, 4096), jnp.int8), S((4096,), jnp.bfloat16)]))
    add("qmlp_256x1024x4096", "model", "int8", lambda: (
        lambda p, x: W.int8_mlp(p, x), shapes_of(W._int8_mlp_args(), jnp.float32)))
    add("qblock_gpt2_s512", "model", "int8", lambda: (
        lambda p, x: W.int8_block(p, x), shapes_of(W._int8_block_args(), jnp.float32)))

    # real models (f32 and bf16), parameter shapes from bench.workloads without allocating them
    def shapes_of(make_args, t):
        real = W._normal
        W._normal = lambda rng, shape, scale=1.0: np.broadcast_to(np.float32(0), shape)
        try:
            args = make_args(np.random.default_rng(0))
        finally:
            W._normal = real
        return jax.tree_util.tree_map(
            lambda a: S(np.shape(a), t if np.asarray(a).dtype == np.float32 else np.asarray(a).dtype), args)

    models = [
        ("bert_base_layer_s512", lambda *a: W.bert_layer(*a), W._bert_args(512, b=1)),
        ("gpt2_block_s1024", lambda *a: W.gpt2_block(*a), W._gpt2_args(s=1024)),
        ("llama_block_gqa_rope_s2048", lambda *a: W.llama_block(*a, n_heads=32, n_kv=8),
         W._llama_args(s=2048, d=4096, ff=11008, n_heads=32, n_kv=8)),
        ("resnet50_stage_nhwc", lambda p, x: W.resnet_stage(p, x, "NHWC"), W._resnet_args("NHWC")),
    ]
    for d in ("f32", "bf16"):
        for nm, fn, make in models:
            add(nm, "model", d, lambda fn=fn, make=make, t=dt[d]: (fn, shapes_of(make, t)))
    del lax
    return cases


# ---------------------------------------------------------------------------------------------
# One chip (child process)
# ---------------------------------------------------------------------------------------------

def run_chip(chip_name: str, only: str | None) -> dict:
    import jax
    jax.config.update("jax_platforms", "cpu")
    from hlofuse.runtime import aot
    from hlofuse.core import chips
    chip = chips.get(chip_name)
    cases = [c for c in _cases() if not only or only in c.name]
    items, meta, rows = [], [], []
    t0 = time.perf_counter()
    for c in cases:
        if chip.target not in c.targets:
            continue
        if c.requires and chip.target == "tpu" and not getattr(chip, c.requires):
            continue
        fn, avals = c.build()
        flat, tree = jax.tree_util.tree_flatten(avals)
        exp = jax.export.export(jax.jit(lambda *xs, fn=fn, tree=tree: fn(*jax.tree_util.tree_unflatten(tree, xs))),
                                platforms=[chip.platform])(*flat)
        items.append((c.name, exp.mlir_module()))
        meta.append(c)
    t_export = time.perf_counter() - t0
    t1 = time.perf_counter()
    results = aot.optimize_many(items, chip.name)
    t_total = time.perf_counter() - t1
    for c, r in zip(meta, results):
        kinds = sorted({k.kind for k in r.kernels} | {k.kind for k in r.left_to_xla})
        skipped = None
        if c.family not in kinds and c.family != "model":
            # hlofuse itself left the region to XLA on this chip (before any compiler ran)
            rep = r.optimized.report if r.optimized is not None else None
            why = "; ".join(f"{x.kind}: {x.reason}" for x in (rep.left_to_xla if rep else [])[:2])
            skipped = f"no {c.family} kernel on {chip.name}: {why or 'no region found'}"
        known = [dict(kind=k.kind, blocks=k.blocks, error=k.error, why=_known(chip.target, c.name, k.kind, k.error))
                 for k in r.left_to_xla]
        rows.append({
            "case": c.name, "family": c.family, "dtype": c.dtype, "ok": r.ok,
            "seconds": round(r.seconds, 3), "error": r.error, "skipped": skipped,
            "kernels": [{"kind": k.kind, "name": k.name, "blocks": k.blocks, "ok": k.ok,
                         "error": k.error, "resources": k.resources, "spill_bytes": k.spill_bytes,
                         "occupancy": k.occupancy, "vmem_bytes": k.vmem_bytes, "flags": k.flags,
                         "figures": k.resource_lines()}
                        for k in r.kernels],
            "left_to_xla": [k for k in known if not k["why"]],
            "known": [k for k in known if k["why"]],
        })
    return {"chip": chip.name, "title": chip.title, "rows": rows, "export_s": round(t_export, 1),
            "optimize_and_compile_s": round(t_total, 1)}


# ---------------------------------------------------------------------------------------------
# Driver
# ---------------------------------------------------------------------------------------------

def _figures(res: dict, show: bool, spills_fail: bool) -> tuple[int, list[str]]:
    """The compiler's resource figures of every compiled kernel (hlofuse.runtime.aot: ptxas -v for
    Triton, Mosaic's scoped VMEM for TPU): a summary line, and with ``show`` one line per
    kernel entry, flagged ones marked "!!". Returns (failures, lines): a kernel that spills
    counts as a failure with ``spills_fail``, one whose figures could not be read always does."""
    ks = [(r["case"], k) for r in res["rows"] for k in r["kernels"] if k["ok"]]
    if not ks:
        return 0, []
    spills = [(c, k) for c, k in ks if k.get("spill_bytes")]
    from hlofuse.runtime.aot import LOW_OCCUPANCY
    low = [(c, k) for c, k in ks if k.get("occupancy") is not None and k["occupancy"] < LOW_OCCUPANCY]
    unread = [(c, k) for c, k in ks if not k.get("resources") or k["resources"].get("unavailable")]
    # absent: the program compiled and its figures were read, but XLA emitted no such kernel
    absent = [(c, k) for c, k in unread if k.get("resources") and k["resources"].get("absent")]
    missing = [(c, k) for c, k in unread if (c, k) not in absent]
    entries = [e for _, k in ks for e in ((k.get("resources") or {}).get("entries") or [])]
    gpu = [e for e in entries if "registers" in e]
    tpu = [e for e in entries if "vmem_bytes" in e]
    head = f"    figures: {len(ks) - len(unread)}/{len(ks)} kernels"
    if gpu:
        arch = ", ".join(sorted({e["arch"] for e in gpu}))
        top = max(gpu, key=lambda e: e["registers"])
        head += (f" (ptxas {arch}), {len(spills)} spill, {len(low)} below occupancy "
                 f"{LOW_OCCUPANCY}; "
                 f"max {top['registers']} registers/thread ({top['name']})")
    if tpu:
        top = max(tpu, key=lambda e: e["vmem_fraction"])
        head += (f" (Mosaic VMEM as compiled), max {top['vmem_bytes'] / 2**20:.1f} MiB = "
                 f"{top['vmem_fraction']:.0%} of the {top['vmem_limit'] >> 20} MiB scoped limit "
                 f"({top['name']})")
    if missing:
        head += f"; figures unavailable for {len(missing)}"
    if absent:
        head += f"; {len(absent)} not emitted by XLA in the whole program"
    lines = [head]
    if show:
        for case, k in ks:
            flagged = bool(k.get("flags"))
            for l in k.get("figures") or ["no figures"]:
                lines.append(f"    {'!!' if flagged else '  '} {case} {k['kind']}: {l}")
    n_new = 0
    for case, k in spills:
        known = _known_spill(res["chip"], case, k["kind"])
        new = not known and spills_fail
        n_new += new
        what = "; ".join(f for f in k["flags"] if "spills" in f)
        lines.append(f"    {'FAIL' if new else 'note'} {case}: {k['kind']} [{k['blocks']}] spills: {what}"
                     + (f" (known spill: {known})" if known else ""))
    for case, k in missing[:10]:
        why = (k.get("resources") or {}).get("unavailable", "no figures")
        lines.append(f"    FAIL {case}: {k['kind']} figures unavailable: {why}")
    for case, k in absent:
        lines.append(f"    note {case}: {k['kind']} [{k['blocks']}]: {k['resources']['unavailable']}")
    return len(missing) + n_new, lines


def _summarize(res: dict, show_figures: bool = False, spills_fail: bool = True) -> tuple[int, int, list[str]]:
    """Passed: kernels the chip's compiler accepted. Failed: kernels it rejected (not known),
    programs that did not compile, and (family, dtype) groups with no kernel at all; kernels
    that spill registers (``spills_fail``) or whose resource figures could not be read."""
    passed = failed = 0
    lines, notes = [], []
    rows = res["rows"]
    groups: dict[tuple, list] = {}
    for r in rows:
        n_ok = sum(1 for k in r["kernels"] if k["ok"])
        bad = [k for k in r["kernels"] if not k["ok"]] + r["left_to_xla"]
        n_bad = len(bad) + (1 if not r["ok"] and not bad else 0)
        passed += n_ok
        failed += n_bad
        g = groups.setdefault((r["family"], r["dtype"]), [0, 0, 0.0, 0, 0])
        g[0] += n_ok
        g[1] += n_bad
        g[2] += r["seconds"]
        g[3] += 1
        g[4] += len(r["known"])
        if n_bad:
            lines.append(f"    FAIL {r['case']}: " + (r["error"] or "") + " ".join(
                f"[{k['kind']} {k['blocks']}: {k['error']}]" for k in bad))
        for k in r["known"]:
            notes.append(f"    known {r['case']}: {k['kind']} [{k['blocks']}] back to XLA: {k['why']} "
                         f"(compiler: {(k['error'] or '')[:160]})")
        if r["skipped"]:
            notes.append(f"    skip  {r['case']}: {r['skipped'][:220]}")
    for (fam, dt), g in groups.items():
        if g[0] == 0:
            failed += 1
            lines.append(f"    FAIL {fam}/{dt}: no kernel of this family compiled for {res['chip']}")
    secs = sorted(r["seconds"] for r in rows)
    head = (f"  {res['chip']} ({res['title']}): {passed} kernels passed, {failed} failed, in "
            f"{len(rows)} programs; compile {sum(secs):.1f} s (median {secs[len(secs) // 2]:.2f} s, "
            f"max {secs[-1]:.2f} s per program); export {res['export_s']} s, optimize+compile "
            f"{res['optimize_and_compile_s']} s")
    fams: dict[str, list] = {}
    for (fam, dt), g in groups.items():
        fams.setdefault(fam, []).append(f"{dt} {g[0]} ok" + (f"/{g[1]} bad" if g[1] else "")
                                        + (f"/{g[4]} known" if g[4] else "") + f" {g[2]:.1f}s")
    fam_lines = [f"    {fam:16s} " + "; ".join(v) for fam, v in fams.items()]
    n_fig, fig_lines = _figures(res, show_figures, spills_fail)
    return passed, failed + n_fig, [head] + fam_lines + fig_lines + lines + notes


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--chips", default="h100,a100,v5e,v4,v6e")
    ap.add_argument("--jobs", type=int, default=2, help="chips compiled at once")
    ap.add_argument("--json", default=None, help="write all results here")
    ap.add_argument("--only", default=None, help="cases whose name contains this")
    ap.add_argument("--figures", default="h100,v5e",
                    help="chips whose per-kernel resource figures are printed (ptxas registers, "
                         "spills, shared memory, occupancy; Mosaic VMEM); '' for none")
    ap.add_argument("--allow-spills", action="store_true",
                    help="a kernel that spills registers is a note, not a failure")
    ap.add_argument("--child", default=None, help=argparse.SUPPRESS)
    a = ap.parse_args(argv)
    if a.child:
        print(json.dumps(run_chip(a.child, a.only)))
        return 0
    from hlofuse.runtime import aot
    names = aot.parse_chips(a.chips)
    for n in names:
        miss = aot.missing_packages(n)
        if miss:
            print(f"aot matrix: {miss}", file=sys.stderr)
            return 2
    t0 = time.time()

    def one(n):
        cmd = [sys.executable, __file__, "--child", n] + (["--only", a.only] if a.only else [])
        p = subprocess.run(cmd, capture_output=True, text=True, cwd=ROOT,
                           env=dict(os.environ, JAX_PLATFORMS="cpu", TF_CPP_MIN_LOG_LEVEL="3"))
        lines = [l for l in p.stdout.splitlines() if l.startswith("{")]
        if p.returncode != 0 or not lines:
            tail = "\n".join(p.stderr.strip().splitlines()[-8:])
            return {"chip": n, "crash": f"exit {p.returncode}: {tail}"}
        return json.loads(lines[-1])

    with ThreadPoolExecutor(max_workers=max(1, a.jobs)) as ex:
        results = list(ex.map(one, names))
    total_p = total_f = 0
    print(f"aot compile matrix: families {', '.join(FAMILIES)} (+ models) x dtypes "
          f"{', '.join(DTYPES)} x tiny..real shapes, compiled deviceless for {', '.join(names)}")
    for res in results:
        if "crash" in res:
            print(f"  {res['chip']}: the matrix process failed: {res['crash']}")
            total_f += 1
            continue
        show = res["chip"] in {c.strip() for c in a.figures.split(",") if c.strip()}
        p, f, lines = _summarize(res, show_figures=show, spills_fail=not a.allow_spills)
        total_p += p
        total_f += f
        print("\n".join(lines))
    print(f"  wall time {time.time() - t0:.1f} s for {len(names)} chips ({a.jobs} at once)")
    if a.json:
        with open(a.json, "w") as fh:
            json.dump(results, fh, indent=1)
    print(f"{total_p} passed, {total_f} failed")
    return 0 if total_f == 0 else 1


if __name__ == "__main__":
    sys.exit(main())
