"""Peak device memory per chip without the chip (issue 45): ``python -m bench --memory``.

Compiles training steps (optax AdamW, donated state) for H100 and TPU v5e with the chips' own
compilers (the ``aot`` extra) and reads XLA's ``memory_analysis()``. Skipped, with the reason,
where those compilers are not installed; CI's aot leg runs it.
"""

from __future__ import annotations

import json
import sys

import pytest

from hlofuse.runtime import aot

_MISSING = (aot.missing_packages("h100") or aot.missing_packages("v5e")) \
    if aot._python() == sys.executable else None
if _MISSING is None:
    try:
        import optax  # noqa: F401
    except ImportError:
        _MISSING = "optax is not installed (the aot extra installs it)"
# the default test venv has no GPU/TPU compilers (about 2 GB); CI's aot leg installs them
# (`pip install -e ".[aot]"`) and runs this file
pytestmark = pytest.mark.skipif(bool(_MISSING), reason=f"deviceless compilers not installed "
                                f"(CI's aot leg runs this): {_MISSING}")


def _peak(row, which):
    assert "error" not in row, row
    return row[which]["peak"]


def test_quick_table_never_above_jax_jit(tmp_path):
    """The CI table: small steps on h100 and v5e; hlofuse's peak is never above jax.jit's, the
    attention of BERT is a kernel, and the figures come from the compiled executables."""
    from bench import memory
    out = tmp_path / "mem.json"
    rc = memory.main(["--quick", "--chips", "h100,v5e", "--steps", "bert", "mlp", "--json",
                      str(out), "--plot", str(tmp_path / "mem.png")])
    rows = json.loads(out.read_text())["rows"]
    assert rc == 0 and len(rows) == 4
    for r in rows:
        j, h = _peak(r, "jax"), _peak(r, "hlofuse")
        assert 0 < h <= j, (r["step"], r["chip"], h, j)
        assert r["jax"]["alias"] > 0 and r["hlofuse"]["alias"] > 0   # donated state reused
        if r["step"] == "bert" and r["chip"] == "h100":
            assert "attention" in r["kernel_kinds"] or "attention_bwd" in r["kernel_kinds"]
        else:   # an MLP: nothing XLA cannot fuse; tpu attention over 128 keys: XLA's own
            assert r["kernels"] == 0, r
            # no kernel: the regions left to XLA go back inline (outline.executable_module), so
            # XLA compiles jax.jit's program (a call boundary changed v5e's buffer plan)
            assert r["hlofuse"]["temp"] == r["jax"]["temp"], r
    assert (tmp_path / "mem.png").read_bytes()[:4] == b"\x89PNG"


def test_unmeasured_policy_lowers_peak_of_the_mlp_step_on_h100():
    """The memory the unmeasured policy saves, on a real-size step: the MLP 3x4096 training
    step (batch 256) with every kernel built (what hlofuse did before, unmeasured) against the
    default, which leaves XLA the elementwise chains and matmul epilogues it fuses itself."""
    from bench import memory
    from hlofuse.runtime.testing import ALL_KERNELS
    (every,) = memory.run_chip("h100", ["mlp"], quick=False, options=ALL_KERNELS)
    (default,) = memory.run_chip("h100", ["mlp"], quick=False)
    assert every["kernels"] > 0 and default["kernels"] == 0
    assert _peak(default, "hlofuse") < _peak(every, "hlofuse")
    assert _peak(default, "hlofuse") <= _peak(default, "jax")


def test_largest_batch_that_fits_h100_with_flash_attention_is_larger(tmp_path):
    """``--largest-batch``: the GPT-2-class step at the CI size, compiled for H100, the batch
    that fits 1 GiB (``--capacity``; the chip's 80 GB takes batches of 20k at this size and
    minutes of compiles). hlofuse's flash attention forward and backward keep no [S, S]
    probabilities per layer, so more examples fit than under jax.jit; each search ends at a
    batch that fits next to one that does not (exact), in a handful of compiles."""
    from bench import memory
    out = tmp_path / "batch.json"
    rc = memory.main(["--largest-batch", "--quick", "--chips", "h100", "--steps", "gpt2",
                      "--capacity", "1GiB", "--json", str(out)])
    (row,) = json.loads(out.read_text())["rows"]
    assert rc == 0 and "error" not in row, row
    j, h = row["jax"], row["hlofuse"]
    assert j["exact"] and h["exact"] and len(j["tried"]) <= 12 and len(h["tried"]) <= 12
    assert row["capacity"] == 1 << 30 and h["batch"] > j["batch"] > row["base_batch"], row
    for x in (j, h):   # the batch found fits, the next one was compiled and did not
        peaks = dict(map(tuple, x["tried"]))
        assert peaks[x["batch"]] <= row["capacity"] < peaks[x["batch"] + 1]


def test_fsdp_rows_compile_per_device_with_kernels_per_shard(tmp_path):
    """The sharded rows: GPT-2-class step with FSDP over 8 H100s, compiled by XLA's SPMD
    partitioner for the slice; the per-device peak is below the single-chip step's (the
    parameters and optimizer state are split 8 ways, each device's batch is the same) and
    hlofuse's attention kernels run per shard."""
    from bench import memory
    out = tmp_path / "fsdp.json"
    rc = memory.main(["--quick", "--chips", "h100", "--steps", "gpt2", "gpt2_fsdp", "--json",
                      str(out)])
    one, fsdp = json.loads(out.read_text())["rows"]
    assert rc == 0 and fsdp["devices"] == 8 and one["devices"] == 1, (one, fsdp)
    assert fsdp["kernels"] > 0 and "attention_bwd" in fsdp["kernel_kinds"], fsdp
    for which in ("jax", "hlofuse"):
        assert 0 < _peak(fsdp, which) < _peak(one, which), (which, one, fsdp)


def test_rss_sanity_check_agrees_with_xla_buffer_assignment_on_cpu():
    """``--rss``: on this CPU, the resident bytes one call of the step adds (peak resident set
    reset before the call) match XLA's buffer assignment of it (temporaries + new outputs)
    within 2 MiB + 10%, for jax.jit's program and hlofuse's, and move the same way between
    them: the figures the deviceless table reads are what a process really allocates."""
    from bench import memory
    why = memory.rss_unavailable()
    if why:
        pytest.skip(why)
    (row,) = memory.run_rss(["bert"], quick=True, timeout=900)
    assert "error" not in row, row
    for which in ("jax", "hlofuse"):
        r = row[which]
        assert len(r["rss_added"]) == memory.RSS_CALLS
        assert abs(r["rss"] - r["predicted"]) <= (2 << 20) + 0.1 * r["predicted"], (which, r)
    assert row["kernels"] > 0 and row["same_direction"], row
    assert "| bert | cpu |" in memory.rss_table([row])
