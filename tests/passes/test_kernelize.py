"""``kernelize``: regions become spliced kernels; failures fall back to XLA with a reason."""

import numpy as np
import pytest

import hlofuse
from hlofuse.core import ir as hir
from hlofuse.passes.kernel_table import kernel_funcs
from hlofuse.kernels import FAMILIES
from hlofuse.runtime.testing import assert_same
from hlofuse.runtime.testing import ALL_KERNELS
from tests.fusion_util import eval_modules

CHAIN = """
func.func @main(%x: tensor<8x16xf32>, %y: tensor<8x16xf32>) -> tensor<8x16xf32> {
  %0 = stablehlo.multiply %x, %y : tensor<8x16xf32>
  %1 = stablehlo.tanh %0 : tensor<8x16xf32>
  %2 = stablehlo.add %1, %x : tensor<8x16xf32>
  func.return %2 : tensor<8x16xf32>
}"""

PIPE = ["fuse-elementwise", "kernelize", "symbol-dce"]


def _inputs():
    rng = np.random.default_rng(0)
    return [rng.standard_normal((8, 16)).astype(np.float32) for _ in range(2)]


def test_region_becomes_a_kernel_and_keeps_results():
    opt = hlofuse.optimize(CHAIN, pipeline=PIPE)
    (r,) = opt.report.regions
    assert r.kernel and r.kernel.startswith("hlofuse_elementwise_") and r.reason is None
    assert "call @hlofuse_k0_main" in opt.text
    funcs = {hir.func_name(f) for f in hir.funcs(opt.module)}
    assert "hlofuse_region_0" not in funcs      # replaced: kept only as the kernel's original
    (k,) = kernel_funcs(opt.module).values()
    assert k.symbol == "hlofuse_k0_main" and "@hlofuse_region_0" in k.original
    # cpu: the Pallas interpret-mode kernel body, plain StableHLO (one grid step: no loop)
    assert "custom_call" not in opt.text and opt.text.count("stablehlo.add") >= 1
    x = _inputs()
    assert_same(*eval_modules([opt.text, CHAIN], x), "kernel")


@pytest.mark.parametrize("target,marker", [("gpu", "__gpu$xla.gpu.triton"), ("tpu", "tpu_custom_call")])
def test_accelerator_targets_splice_custom_calls(target, marker):
    opt = hlofuse.optimize(CHAIN, target=target, pipeline=PIPE, options=ALL_KERNELS)
    assert opt.text.count(marker) == 1 and opt.report.kernels


def test_build_failure_leaves_region_to_xla_with_reason(monkeypatch):
    fam = FAMILIES["elementwise"]

    def broken(spec, target, **kw):
        raise NotImplementedError("this region shape is not supported")

    monkeypatch.setitem(FAMILIES, "elementwise", type(fam)(fam.spec_from_func, broken, fam.reference))
    from hlofuse.passes import kernelize
    monkeypatch.setattr(kernelize, "_CACHE", {})
    opt = hlofuse.optimize(CHAIN, pipeline=PIPE)
    (r,) = opt.report.regions
    assert r.kernel is None and "not supported" in r.reason
    assert "call @hlofuse_region_0" in opt.text  # left to XLA: the plain outlined function
    x = _inputs()
    assert_same(*eval_modules([opt.text, CHAIN], x), "exact")


def test_no_kernels_option():
    opt = hlofuse.optimize(CHAIN, pipeline=PIPE, options={"no_kernels": True})
    assert not opt.report.kernels and "disabled" in opt.report.regions[0].reason


def test_region_texts_printed_once_match_the_verifying_printer():
    """kernelize prints each region body once (for its hash and its kernel cache key) and
    without re-verifying: the very texts str() and get_asm() give, so region hashes (keys of
    cached measured decisions) and kernel names do not change."""
    from jaxlib.mlir import ir
    from hlofuse.passes import kernelize
    from hlofuse.passes.fusion.outline import KIND_ATTR
    opt = hlofuse.optimize(CHAIN, pipeline=["fuse-elementwise"], target="gpu")
    fns = [f for f in hir.funcs(opt.module) if KIND_ATTR in f.attributes]
    assert fns
    for f in fns:
        kind = ir.StringAttr(f.attributes[KIND_ATTR]).value
        body = kernelize.body_text(f)
        assert body == "\n".join(str(o) for o in f.regions[0].blocks[0].operations)
        assert kernelize.region_hash(f, kind, "gpu", body) == kernelize.region_hash(f, kind, "gpu")
        assert (f.operation.get_asm(enable_debug_info=True, assume_verified=True)
                == f.operation.get_asm(enable_debug_info=True))
        assert f.operation.get_asm(assume_verified=True) == f.operation.get_asm()
