"""Block sizes per target: validated on construction, chosen by a cost model or heuristic."""

from __future__ import annotations

import dataclasses
import os

import numpy as np

from hlofuse.core import compat, hostcpu
from hlofuse.core.target import Target
from hlofuse.kernels.attention.skip import skip_info
from hlofuse.kernels.attention.spec import AttentionSpec
from hlofuse.kernels.tiling import Tile, check_block, next_pow2

__all__ = ["AttentionBlocks", "cpu_plan", "cpu_fwd_plan", "cpu_whole_rows", "cpu_whole_rows_key",
           "cpu_bwd_plan",
           "CPU_ROW_BUDGET", "CPU_ROW_MIN_BLOCK_Q", "CPU_WHOLE_ROWS", "gpu_blocks", "tpu_blocks",
           "CPU_STEP_BUDGET", "CPU_FWD_STEP_BUDGET", "CPU_FWD_MIN_BLOCK_Q", "CPU_MAX_BLOCK_K", "CPU_SKIP_BLOCK",
           "CPU_BWD_STEP_BUDGET", "CPU_BWD_MAX_BLOCK_K", "CPU_BWD_MIN_BLOCK_Q", "CPU_REF_L2", "CPU_BUDGETS", "cpu_budgets"]

# cpu cost model: elements of the per-step logits block ([batch.., rows chunk, key block]);
# 2M f32 = 8 MiB keeps the step's temporaries (logits, probabilities) near the cache and the
# run memory at ~50 MiB for B=1 H=8 S=4096 (jax.jit: ~1 GiB). On the shared 2-core host
# (python bench/attention_cpu.py), 512x512 blocks with the scale folded into Q ran at 0.33-0.39
# of jax.jit's time at S=2048/4096; 256..1024-row chunks and 256/512-key blocks were within
# noise of each other, unchunked rows (a 64 MiB step block) about 15% slower.
CPU_STEP_BUDGET = 2 * 1024 * 1024
# the inference forward's budget (the cpu forward loops, also the training forward's): 2M f32 =
# 8 MiB per step (512x512 blocks at B=1 H=8). Per step the forward writes the logits block,
# reads it for the row max, reads it again for exp and writes the probabilities, reads those
# for the row sum and for the P·V dot: five passes over the block, so a block nearer the
# (1 MiB/core) L2 pays when other processes share the cores and caches: measured on the
# shared 2-core host while ~10 other processes ran (the kernel built with each budget, timed
# interleaved with jax.jit in one process, median of 9 rounds), B=1 H=8 d=64 S=4096: process
# CPU time ratio to jax.jit 0.29 at 1M (256x512 blocks), 0.34 at 2M, 0.34 at 512K (128x512);
# wall 0.17 / 0.34 / 0.28. With the block dots all YNNPACK library dots (kernels/attention/
# backward.py) on the host with nothing else running (load ~1.7, YNN threading each dot over
# both cores), the larger dots win: 2M / 1M in the same kind of A/B (median of per-round
# ratios, 14 rounds, both budgets built in one process) 0.889 at S=4096,
# 0.898 at S=2048, and 0.941 for the attn_train_s2048 step of bench/train_cpu (hlofuse/jax
# 0.308 -> 0.285, 0.334 -> 0.297, 0.378 -> 0.349); an earlier run at load ~1.1: 512K 0.499,
# 1M 0.339, 2M 0.304, 4M 0.310 of jax.jit at S=4096. Run memory at S=4096 stays 48 MiB
# (jax.jit 1051 MiB). So the budget is the quiet machine's. At BERT-base shapes (H=12, S=512,
# one key block) 128- and 256-row chunks were within noise in CPU time (loaded host).
# The backward has its own budget (CPU_BWD_STEP_BUDGET below, tuned separately).
# Both budgets are per loop: when the cpu loops are split along a batch axis into independent
# loops (opt-in, kernels/attention/cpu.py: cpu_split, CPU_PARTS; cpu_plan(parts=...)), at B=1
# H=8 S=4096 each of 2 loops steps over 4 heads x 1024 rows x 512 keys (2M elements per loop,
# as the one loop's 8 x 512 x 512).
CPU_FWD_STEP_BUDGET = 2 * 1024 * 1024
# ...but at least 256-row query chunks in the forward (up to Sq): with many heads the budget
# alone shrinks each head's dots (B=2 H=12 S=2048: 128-row chunks; B=4 H=16 S=1024: 64-row),
# and the forward ran 0.64 / 0.95 of jax.jit's time. Measured on the quiet host (load ~1.2,
# the kernel built each way in one process, interleaved with jax.jit, median of per-round
# ratios, 10 rounds): 256-row chunks (512-key blocks) 0.725x (hlofuse/jax 0.638 -> 0.454) and
# 0.547x (0.95 -> 0.514); at B=2 H=12, 512-row chunks 0.755x and 256x256 blocks 1.13x of the
# 128-row chunks. B=1 H=8 already has 512-row chunks (unchanged). Run memory grows to
# 32 MiB per block-sized temporary at B=4 H=16 (jax.jit's logits: 256 MiB).
CPU_FWD_MIN_BLOCK_Q = 256
CPU_MAX_BLOCK_K = 512
CPU_SKIP_BLOCK = 256          # blocks when a position mask lets whole blocks be skipped
# cpu backward (kernels/attention/backward.py): one step keeps ~5 block-sized f32 temporaries
# live (logits, probabilities, dP, dS, and dS's transposed read for dK) against the forward's
# ~2, so its step block is smaller. Measured on the shared 2-core host (load 5-20, so each
# figure is preliminary), B=1 H=8 S=2048 d=64:
# * the attention training step, `python -m bench.train_cpu --workloads attn_train_s2048
#   --no-rss --rounds 11 --bwd-blocks 512x512,128x128` (ratio to jax.jit, two runs):
#   256x256 0.28 / 0.41, 512x512 (the forward's 2M-element block) 0.32 / 0.43, 128x128 0.34 /
#   0.42, 128x256 0.31; a third run at load ~2: 256x256 0.40, 512x512 0.38, 128x128 0.38. So in
#   the whole step the block size is within noise (the step is not decided by it); the rule
#   rests on the standalone figures below and on the smaller run memory;
# * a standalone copy of the backward loops, one thread (cpu time / jax.vjp's): 512x512 0.55,
#   256x256 0.40, 128x256 0.40, 128x128 0.37 (smaller blocks win more when other processes
#   share the cache, larger ones when the dots run on both cores).
CPU_BWD_STEP_BUDGET = 512 * 1024
CPU_BWD_MAX_BLOCK_K = 256
# ...and, as the forward, at least 256-row query chunks (up to Sq): with many heads the budget
# alone gave 16..64-row chunks, whose block dots ran far below the library's speed. Measured on
# a 2-core AMD EPYC (Zen 4), the attention training step of bench/train_cpu at B=2 H=12
# S=2048 (`python -m bench.attention_parts`, and a copy of it varying this minimum; 7-9
# interleaved rounds with jax.jit, median of per-round ratios, load 1-3): 0.94 (32-row chunks,
# no minimum) -> 0.78 (64) -> 0.77 (128) -> 0.72 (256) of jax.jit's time; at B=1 H=8 (128-
# and 256-row chunks) 0.59-0.61 either way. Run memory: 24 x 256 x 256 f32 = 6 MiB per
# block-sized temporary at B=2 H=12.
CPU_BWD_MIN_BLOCK_Q = 256

# The budgets above were measured on a host with a 2 MiB L2 per core (CPU_REF_L2, the 2-core
# Sapphire Rapids Xeon): the forward's 8 MiB step block is 4x its L2. On other hosts both
# scale with the L2 of one core (hlofuse.core.hostcpu.l2_per_core; a power of two, from a
# quarter to twice the reference budget), so the block keeps its size relative to the cache it
# streams through five times per step. Measured on a 2-core AMD EPYC (Zen 4, 1 MiB L2 per core,
# 32 MiB L3; `python -m bench.attention_parts --budgets 512K,1M,2M,4M`, 9 interleaved rounds):
# forward 1M (the scaled budget) and 2M within 1% of each other, 4M 9-17% slower.
CPU_REF_L2 = 2 << 20
# Whole rows (the forward): with one key block per query chunk (bk = Sk) the chunk is
# softmax(q·Kᵀ)·V with no carry between key blocks, which XLA:CPU (jax 0.12, YNNPACK library
# fusions) compiles into ONE library fusion, dot, row max, exp, row sum and the second dot
# (kernels/attention/online_softmax.py: online_only); the compiled temporaries stay small
# (26-32 MiB at B=1 H=8 S=4096 with 512- to 2048-row chunks; jax.jit 1 GiB). Measured on the
# 2-core AMD EPYC (Zen 4), jax 0.12.1, the kernel built each way in one process, interleaved
# with jax.jit, median of per-round ratios (5-10 rounds, load 1.1-1.6), B=1 H=8 d=64: S=2048
# 0.33-0.35 of jax.jit's time with 512-, 1024- or 2048-row chunks against 0.43 in the host's
# 256x512 key blocks; S=4096 0.34-0.40 with 512 or 1024 rows (which one won changed between
# runs) against 0.42-0.47; S=8192 0.222 with 512 rows against 0.26-0.28 (1024 rows 0.263);
# 64 heads (B=4 H=16) at S=1024, 512 rows: 0.461 against 0.678 in 256x512 key blocks.
# Chunks of 256 rows at S=4096 ran 0.46-0.48: XLA split that chunk into four fusions (the exp
# written out between them), so whole rows need at least CPU_ROW_MIN_BLOCK_Q rows within
# CPU_ROW_BUDGET elements (128 MiB of f32 were the step written out), else the key blocks
# above. On jax 0.10.2 (the same single fusion there, but slow) whole rows ran 0.75 against
# 0.32 in key blocks: whole rows are the default only where
# ``compat.cpu_fuses_attention_rows()``, and autotune measures key blocks against them
# (hlofuse.runtime.autotune.KERNEL_VARIANTS, ``attn-key-blocks``).
CPU_ROW_BUDGET = 32 * 1024 * 1024
CPU_ROW_MIN_BLOCK_Q = 512
#: whole rows in the forward where they fit: None from the release
#: (:func:`cpu_whole_rows`), or forced either way (an A/B harness)
CPU_WHOLE_ROWS: bool | None = None

#: ``(forward, backward)`` step budgets in effect when set (an A/B harness:
#: ``python -m bench.attention_parts --budgets``); None: from the host (:func:`cpu_budgets`)
CPU_BUDGETS: tuple | None = None


def _host_scaled(ref: int, l2: int) -> int:
    b = ref * l2 // CPU_REF_L2
    b = 1 << max(0, b.bit_length() - 1)            # a power of two at or below
    return max(ref // 4, min(2 * ref, b))


def cpu_budgets(l2: int | None = None, scale: float = 1.0) -> tuple:
    """``(forward, backward)`` step budgets (elements of one step's logits block) on this host:
    :data:`CPU_BUDGETS` when set, else :data:`CPU_FWD_STEP_BUDGET` and
    :data:`CPU_BWD_STEP_BUDGET` scaled by the L2 of one core (``l2`` bytes, default
    :func:`hlofuse.core.hostcpu.l2_per_core`) against :data:`CPU_REF_L2`. Part of both
    module-cache keys (the host's L2 through ``hostcpu.profile``, an override as in effect).
    ``scale``: both times this (kernelize's ``cpu_attention_budget_scale``: the alternative
    autotune measures where two block sizes ran close, ``hlofuse.runtime.autotune``)."""
    if CPU_BUDGETS is not None and l2 is None:
        fwd, bwd = CPU_BUDGETS
    else:
        l2 = hostcpu.l2_per_core() if l2 is None else l2
        fwd, bwd = _host_scaled(CPU_FWD_STEP_BUDGET, l2), _host_scaled(CPU_BWD_STEP_BUDGET, l2)
    if scale == 1:
        return fwd, bwd
    return max(1, int(fwd * scale)), max(1, int(bwd * scale))


def _dot_operands(b: Tile) -> str | None:
    if min(b.br, b.bc) < 16:
        return f"Triton attention blocks must be at least 16 (tl.dot), got {b.br}x{b.bc}"
    return None


_RULES = {"gpu": (_dot_operands,)}   # beyond the per-target block rules (tiling.BLOCK_RULES)


@dataclasses.dataclass(frozen=True)
class AttentionBlocks:
    """Query block (rows per program / chunk) and key block, validated per target."""
    target: Target
    bq: int
    bk: int
    num_warps: int = 4
    num_stages: int = 2

    def __post_init__(self):
        object.__setattr__(self, "target", Target.of(self.target))  # a name is accepted
        # the (bq, bk) logits tile, checked before the sequence lengths are known
        check_block(self.target, Tile(self.bq, self.bk), _RULES)

    def __str__(self) -> str:
        return f"bq={self.bq} bk={self.bk}"


def cpu_plan(spec: AttentionSpec, *, budget: int | None = None,
             max_block_k: int | None = None, parts: int = 1,
             min_block_q: int = 1) -> AttentionBlocks:
    """Cost model for the cpu loops: the largest key block up to ``CPU_MAX_BLOCK_K``, and
    query chunks so one step's logits block ``[batch.., rows.., bq, bk]`` stays within
    ``budget`` elements (default ``CPU_STEP_BUDGET``; the forward passes
    ``CPU_FWD_STEP_BUDGET``, the backward :func:`cpu_bwd_plan`'s) (cache-resident, small peak memory). Small problems run as
    one block (the loop disappears). With a position mask (causal) both blocks are at most
    ``CPU_SKIP_BLOCK`` so whole blocks above the diagonal are skipped.

    ``parts``: the loops are split along a batch axis into that many independent loops (one
    per core, :func:`~hlofuse.kernels.attention.cpu.cpu_split`): the budget is per loop (per
    core), so ``per_row`` counts the rows of the largest part.

    ``min_block_q``: query chunks at least this long (up to ``Sq``) even past the budget (the
    forward's :data:`CPU_FWD_MIN_BLOCK_Q`: many heads must not shrink each head's dots)."""
    budget = CPU_STEP_BUDGET if budget is None else budget
    max_block_k = CPU_MAX_BLOCK_K if max_block_k is None else max_block_k
    sq, sk = spec.seq_q, spec.seq_k
    per_row = _rows_per_step(spec, parts)
    bk = sk if sk <= max_block_k else max_block_k
    skip = skip_info(spec) is not None and sk > CPU_SKIP_BLOCK
    if skip:
        bk = min(bk, CPU_SKIP_BLOCK)
    bq = max(1, budget // max(1, per_row * bk), min_block_q)
    if skip:
        bq = min(bq, CPU_SKIP_BLOCK)
    if bq >= sq:
        bq = sq
    elif bq >= 8:
        bq = 1 << (bq.bit_length() - 1)   # a power of two: chunks align with key blocks
    return AttentionBlocks("cpu", bq, bk)


def cpu_whole_rows() -> bool:
    """Whether the forward runs whole rows by default: :data:`CPU_WHOLE_ROWS` when set, else
    where this release's XLA:CPU compiles them well (``compat.cpu_fuses_attention_rows``, a
    probe compile once per process). Keyed by :func:`cpu_whole_rows_key`."""
    if CPU_WHOLE_ROWS is not None:
        return CPU_WHOLE_ROWS
    return compat.cpu_fuses_attention_rows()


def cpu_whole_rows_key():
    """What :func:`cpu_whole_rows` depends on, for both module-cache keys, without its probe
    compile (the keys are computed before every cached call): :data:`CPU_WHOLE_ROWS` when set,
    else ``XLA_FLAGS`` (which may turn XLA:CPU's library fusions off; the jax and jaxlib
    versions the probe also depends on are in every key)."""
    if CPU_WHOLE_ROWS is not None:
        return CPU_WHOLE_ROWS
    return "auto: XLA_FLAGS=" + os.environ.get("XLA_FLAGS", "")


def cpu_fwd_plan(spec: AttentionSpec, *, parts: int = 1, scale: float = 1.0,
                 whole_rows: bool | None = None) -> AttentionBlocks:
    """The forward's blocks: whole rows (``bk = Sk``, see :data:`CPU_ROW_BUDGET`) when
    ``whole_rows`` (default :func:`cpu_whole_rows`), no position mask skips blocks, and at
    least :data:`CPU_ROW_MIN_BLOCK_Q` rows (or all of ``Sq``) fit in :data:`CPU_ROW_BUDGET`
    elements; else :func:`cpu_plan` with the forward's step budget (:func:`cpu_budgets` times
    ``scale``)."""
    if whole_rows is None:
        whole_rows = cpu_whole_rows()
    sq, sk = spec.seq_q, spec.seq_k
    if whole_rows and sk > CPU_MAX_BLOCK_K and not (skip_info(spec) is not None
                                                     and sk > CPU_SKIP_BLOCK):
        per_row = _rows_per_step(spec, parts)
        bq = CPU_ROW_BUDGET // (per_row * sk)
        if bq >= min(sq, CPU_ROW_MIN_BLOCK_Q):
            bq = sq if bq >= sq else 1 << (bq.bit_length() - 1)
            return AttentionBlocks("cpu", bq, sk)
    return cpu_plan(spec, budget=cpu_budgets(scale=scale)[0], parts=parts,
                    min_block_q=CPU_FWD_MIN_BLOCK_Q)


def _rows_per_step(spec: AttentionSpec, parts: int) -> int:
    """Rows of the step block per query position: the batch and group sizes (of the largest
    part when the loops are split into ``parts``)."""
    per_row = spec.n_batch * spec.n_group
    if parts > 1:
        n = max(spec.sizes[b] for b in spec.batch)
        per_row = per_row // n * -(-n // min(parts, n))
    return per_row


def cpu_bwd_plan(spec: AttentionSpec, *, parts: int = 1, scale: float = 1.0) -> AttentionBlocks:
    """:func:`cpu_plan` with the backward's smaller step block (:func:`cpu_budgets`' second,
    key blocks up to :data:`CPU_BWD_MAX_BLOCK_K`): the flash backward keeps more
    block-sized temporaries live per step than the forward (measured, see the constants);
    query chunks of at least :data:`CPU_BWD_MIN_BLOCK_Q` rows (up to Sq)."""
    return cpu_plan(spec, budget=cpu_budgets(scale=scale)[1], max_block_k=CPU_BWD_MAX_BLOCK_K,
                    parts=parts, min_block_q=CPU_BWD_MIN_BLOCK_Q)


def gpu_blocks(spec: AttentionSpec) -> AttentionBlocks:
    d = max(next_pow2(spec.head_dim), next_pow2(spec.v_head_dim))
    bq = min(128 if d <= 64 else 64, max(16, next_pow2(spec.seq_q)))
    bk = min(64 if d <= 128 else 32, max(16, next_pow2(spec.seq_k)))
    return AttentionBlocks("gpu", bq, bk, num_warps=4 if d <= 64 else 8, num_stages=2)


def tpu_blocks(spec: AttentionSpec) -> AttentionBlocks:
    sub = 16 if np.dtype(spec.in_dtypes[spec.q_arg]).itemsize == 2 else 8
    bq = min(512, -(-spec.seq_q // sub) * sub)
    bk = min(512, -(-spec.seq_k // 128) * 128)
    return AttentionBlocks("tpu", bq, bk)
