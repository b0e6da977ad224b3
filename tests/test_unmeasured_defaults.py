"""gpu/tpu programs before anything was measured on the device (issue 46): only the kernels XLA
cannot match are built (flash attention forward and backward, int8 dots with their epilogues);
elementwise chains, row reductions, BatchNorm chains and float matmul epilogues stay with XLA,
which fuses them itself, and the report says so per region. Counted on the bench's models.

The gpu/tpu decision path that turns held-back kernels on once measured runs on cpu in
tests/test_decisions.py (the same path, a fake clock and a gpu's device key).
"""

from __future__ import annotations

import numpy as np
import pytest

import jax

import hlofuse
from bench import workloads
from hlofuse.passes.kernelize import XLA_FUSES

ATTENTION = ("attention", "attention_fwd_lse", "attention_bwd")
# (workload, attention kernels it must keep, int8 kernels it must keep)
MODELS = [("bert_s128", 1, 0), ("gpt2_block", 1, 0), ("llama_block", 1, 0), ("mlp_3x4096", 0, 0),
          ("resnet_nhwc", 0, 0), ("layernorm", 0, 0), ("softmax", 0, 0), ("attn_s2048", 1, 0),
          ("int8_mlp", 0, 2)]


def _specs(w):
    args = w.make_args(np.random.default_rng(0))
    return jax.tree_util.tree_map(lambda a: jax.ShapeDtypeStruct(np.shape(a), np.asarray(a).dtype),
                                  args)


def _int8(r) -> bool:
    return r.kind == "matmul_epilogue" and "int8" in (r.extra.get("unmeasured") or "")


@pytest.mark.parametrize("target", ["gpu", "tpu"])
@pytest.mark.parametrize("name,n_attn,n_int8", MODELS, ids=[m[0] for m in MODELS])
def test_unmeasured_gpu_tpu_keep_only_what_xla_cannot_fuse(name, n_attn, n_int8, target):
    w = workloads.get(name)
    rep = hlofuse.jit(w.fn, target=target).lower(*_specs(w)).report
    kernels = rep.kernels
    # tpu: flash attention unmeasured only from TPU_UNMEASURED_MIN_KEYS keys (attn_s2048)
    short_tpu = target == "tpu" and name != "attn_s2048"
    assert sum(r.kind in ATTENTION for r in kernels) >= (0 if short_tpu else n_attn)
    if short_tpu and n_attn:
        assert any("tpu attention over" in (r.reason or "") for r in rep.regions)
    assert sum(_int8(r) for r in kernels) >= n_int8
    for r in kernels:   # every kernel is one XLA cannot match, and says why it runs unmeasured
        assert r.kind in ATTENTION or _int8(r), (r.kind, r.ops[:4])
        assert r.extra["unmeasured"].startswith("kernel (")
        assert "(unmeasured: kernel (" in str(rep)
    fuses = [r for r in rep.regions if (r.reason or "").startswith("unmeasured: kept XLA")]
    for r in fuses:
        assert r.kind in ("elementwise", "reduction", "matmul_epilogue", "horizontal") or (
            short_tpu and r.kind in ATTENTION), r.kind
    if name in ("mlp_3x4096", "resnet_nhwc", "layernorm", "softmax"):
        assert not kernels and fuses   # the regions were found, and left to XLA by this rule
    stats = {k: v for p in rep.passes if p.name == "kernelize" for k, v in p.stats.items()}
    assert stats["unmeasured_xla"] == len(fuses)


def test_kernel_policy_builds_every_region_unmeasured():
    """``unmeasured="kernel"`` (what hlofuse.jit builds on the device to measure, and an
    explicit choice for users) builds the regions the default holds back."""
    w = workloads.get("mlp_3x4096")
    spec = _specs(w)
    rep = hlofuse.jit(w.fn, target="gpu",
                      options={"kernelize": {"unmeasured": "kernel"}}).lower(*spec).report
    assert rep.kernels and all(r.extra["xla_fuses"] for r in rep.kernels)
    # a mistyped policy is named (hlofuse.jit warns and runs XLA's program, as for any option)
    with pytest.warns(hlofuse.HlofuseWarning, match="unmeasured='sometimes': expected one of"):
        hlofuse.jit(w.fn, target="gpu",
                    options={"kernelize": {"unmeasured": "sometimes"}}).lower(*spec)
