"""``fuse-elementwise``: golden IR cases (fire / no match), cycle safety, exactness, idempotence."""

from __future__ import annotations

import numpy as np
import pytest

import hlofuse
from hlofuse.core import ir as hir
from hlofuse.runtime.testing import assert_same
from tests.fusion_util import eval_modules

FUSE = ["fuse-elementwise"]

CHAIN = """
func.func @main(%x: tensor<8x16xf32>, %b: tensor<16xf32>) -> tensor<8x16xf32> {
  %c = stablehlo.constant dense<2.0> : tensor<f32>
  %cb = stablehlo.broadcast_in_dim %c, dims = [] : (tensor<f32>) -> tensor<8x16xf32>
  %bb = stablehlo.broadcast_in_dim %b, dims = [1] : (tensor<16xf32>) -> tensor<8x16xf32>
  %0 = stablehlo.multiply %x, %cb : tensor<8x16xf32>
  %1 = stablehlo.add %0, %bb : tensor<8x16xf32>
  %2 = stablehlo.tanh %1 : tensor<8x16xf32>
  func.return %2 : tensor<8x16xf32>
}"""

# %r = reduce(%0) sits between %0 and %2, and %2 uses it: fusing %0 with %2 would need the
# reduce inside the region -> a cycle. Two regions (or none) must form, never one.
CYCLE = """
func.func @main(%x: tensor<8x16xf32>) -> tensor<8x16xf32> {
  %z = stablehlo.constant dense<0.0> : tensor<f32>
  %0 = stablehlo.exponential %x : tensor<8x16xf32>
  %a = stablehlo.negate %0 : tensor<8x16xf32>
  %r = stablehlo.reduce(%a init: %z) applies stablehlo.add across dimensions = [1] : (tensor<8x16xf32>, tensor<f32>) -> tensor<8xf32>
  %rb = stablehlo.broadcast_in_dim %r, dims = [0] : (tensor<8xf32>) -> tensor<8x16xf32>
  %1 = stablehlo.multiply %0, %rb : tensor<8x16xf32>
  %2 = stablehlo.tanh %1 : tensor<8x16xf32>
  func.return %2 : tensor<8x16xf32>
}"""

NO_MATCH = """
func.func @main(%x: tensor<8x16xf32>, %w: tensor<16x4xf32>) -> tensor<8x4xf32> {
  %0 = stablehlo.dot_general %x, %w, contracting_dims = [1] x [0] : (tensor<8x16xf32>, tensor<16x4xf32>) -> tensor<8x4xf32>
  %1 = stablehlo.tanh %0 : tensor<8x4xf32>
  func.return %1 : tensor<8x4xf32>
}"""

# a producer used outside the region: it becomes a second output (multi-output region)
MULTI_OUT = """
func.func @main(%x: tensor<8x16xf32>) -> (tensor<8x16xf32>, tensor<8xf32>) {
  %z = stablehlo.constant dense<0.0> : tensor<f32>
  %0 = stablehlo.sine %x : tensor<8x16xf32>
  %1 = stablehlo.multiply %0, %x : tensor<8x16xf32>
  %r = stablehlo.reduce(%0 init: %z) applies stablehlo.add across dimensions = [1] : (tensor<8x16xf32>, tensor<f32>) -> tensor<8xf32>
  %2 = stablehlo.exponential %1 : tensor<8x16xf32>
  func.return %2, %r : tensor<8x16xf32>, tensor<8xf32>
}"""

# an elementwise chain inside a while body is fused too; a reduce's reducer body never is
IN_WHILE = """
func.func @main(%x: tensor<8x16xf32>) -> tensor<8x16xf32> {
  %c0 = stablehlo.constant dense<0> : tensor<i32>
  %c1 = stablehlo.constant dense<1> : tensor<i32>
  %c3 = stablehlo.constant dense<3> : tensor<i32>
  %w:2 = stablehlo.while(%i = %c0, %v = %x) : tensor<i32>, tensor<8x16xf32>
  cond {
    %p = stablehlo.compare LT, %i, %c3, SIGNED : (tensor<i32>, tensor<i32>) -> tensor<i1>
    stablehlo.return %p : tensor<i1>
  } do {
    %n = stablehlo.add %i, %c1 : tensor<i32>
    %t = stablehlo.tanh %v : tensor<8x16xf32>
    %u = stablehlo.multiply %t, %v : tensor<8x16xf32>
    stablehlo.return %n, %u : tensor<i32>, tensor<8x16xf32>
  }
  func.return %w#1 : tensor<8x16xf32>
}"""


def _inputs(text, seed=0):
    m = hir.parse(text)
    main = hir.main_func(m)
    rng = np.random.default_rng(seed)
    out = []
    for a in main.regions[0].blocks[0].arguments:
        info = hir.tensor_type_info(a.type)
        out.append(rng.standard_normal(info.shape).astype(hir.np_dtype(info.dtype)))
    return out


def _calls(text):
    return text.count("call @hlofuse_region")


def test_chain_becomes_one_region_bit_exact():
    opt = hlofuse.optimize(CHAIN, pipeline=FUSE)
    assert _calls(opt.text) == 1
    assert [r.kind for r in opt.report.regions] == ["elementwise"]
    r = opt.report.regions[0]
    assert r.ops.count("stablehlo.broadcast_in_dim") == 2 and "stablehlo.tanh" in r.ops
    assert sorted(r.inputs) == ["f32[16]", "f32[8,16]"] and r.outputs == ["f32[8,16]"]
    assert r.bytes_fused < r.bytes_unfused
    x = _inputs(CHAIN)
    assert_same(*eval_modules([opt.text, CHAIN], x), "exact")


def test_cycle_is_never_created():
    opt = hlofuse.optimize(CYCLE, pipeline=FUSE)
    hir.verify(hir.parse(opt.text))
    for r in opt.report.regions:  # no region contains both the exp and the tanh
        assert not ({"stablehlo.exponential", "stablehlo.tanh"} <= set(r.ops))
    x = _inputs(CYCLE)
    assert_same(*eval_modules([opt.text, CYCLE], x), "exact")


def test_no_match_leaves_module_alone():
    opt = hlofuse.optimize(NO_MATCH, pipeline=FUSE)
    assert not opt.report.regions and _calls(opt.text) == 0
    # why: the only elementwise group is the lone tanh, too small to be worth a region
    (stats,) = [p.stats for p in opt.report.passes if p.name == "fuse-elementwise"]
    assert stats == {"regions": 0, "too_small": 1}, stats
    assert opt.text == hlofuse.optimize(NO_MATCH, pipeline="none").text


def test_multi_output_region():
    opt = hlofuse.optimize(MULTI_OUT, pipeline=FUSE)
    (r,) = opt.report.regions
    assert len(r.outputs) == 2  # sine (used by the reduce) and exponential
    x = _inputs(MULTI_OUT)
    assert_same(*eval_modules([opt.text, MULTI_OUT], x), "exact")


def test_fuses_loop_bodies_but_not_reducer_bodies():
    opt = hlofuse.optimize(IN_WHILE, pipeline=FUSE)
    assert _calls(opt.text) == 1
    assert opt.report.regions[0].ops == ["stablehlo.tanh", "stablehlo.multiply"]
    x = _inputs(IN_WHILE)
    assert_same(*eval_modules([opt.text, IN_WHILE], x), "exact")
    opt2 = hlofuse.optimize(MULTI_OUT, pipeline=FUSE)
    assert "hlofuse_region" not in opt2.text.split("applies")[0].split("reduce")[-1]


def test_rerun_changes_nothing():
    once = hlofuse.optimize(CHAIN).text
    twice = hlofuse.optimize(once).text
    assert once == twice


@pytest.mark.parametrize("dtype", ["bf16", "f16", "i32", "i1"])
def test_dtypes_form_regions(dtype):
    op2 = "and" if dtype == "i1" else "add"
    text = f"""
func.func @main(%x: tensor<8x16x{dtype}>, %y: tensor<8x16x{dtype}>) -> tensor<8x16x{dtype}> {{
  %0 = stablehlo.{op2} %x, %y : tensor<8x16x{dtype}>
  %1 = stablehlo.{"xor" if dtype == "i1" else "multiply"} %0, %x : tensor<8x16x{dtype}>
  func.return %1 : tensor<8x16x{dtype}>
}}"""
    opt = hlofuse.optimize(text, pipeline=FUSE)
    assert _calls(opt.text) == 1


def test_unsupported_dtype_is_left_alone():
    text = """
func.func @main(%x: tensor<4xcomplex<f32>>) -> tensor<4xcomplex<f32>> {
  %0 = stablehlo.add %x, %x : tensor<4xcomplex<f32>>
  %1 = stablehlo.multiply %0, %x : tensor<4xcomplex<f32>>
  func.return %1 : tensor<4xcomplex<f32>>
}"""
    opt = hlofuse.optimize(text, pipeline=FUSE)
    assert not opt.report.regions
    (stats,) = [p.stats for p in opt.report.passes if p.name == "fuse-elementwise"]
    refused = {k: v for k, v in stats.items() if k.startswith("refused[")}
    assert len(refused) == 1 and list(refused.values()) == [2], stats  # add and multiply
    assert "complex" in next(iter(refused)), refused
    (note,) = [n for n in opt.report.notes if n.startswith("fuse-elementwise:")]
    assert note.startswith("fuse-elementwise: 2 elementwise op(s) left to XLA"), note


def test_cpu_leaves_elementwise_loops_to_xla_and_says_why(monkeypatch):
    """The cpu rule (cost.CPU_RULES): XLA:CPU fuses the loop itself, so the region is outlined,
    marked hlofuse.xla with the reason and built as no kernel; gpu still gets its kernel, and
    ``cpu_kernels`` builds the cpu kernel anyway. Results are the same in every case."""
    monkeypatch.delenv("HLOFUSE_CPU_ELEMENTWISE_KERNELS", raising=False)  # conftest sets it
    full = FUSE + ["kernelize", "symbol-dce", "canonicalize"]
    cpu = hlofuse.optimize(CHAIN, pipeline=full)
    (region,) = cpu.report.regions
    assert not cpu.report.kernels and region.reason.startswith("cost model: XLA:CPU fuses")
    (stats,) = [p.stats for p in cpu.report.passes if p.name == "fuse-elementwise"]
    assert stats["left_to_xla"] == 1
    forced = hlofuse.optimize(CHAIN, pipeline=full, options={"fuse-elementwise": {"cpu_kernels": True}})
    assert len(forced.report.kernels) == 1 and not forced.report.regions[0].reason
    gpu = hlofuse.optimize(CHAIN, target="gpu", pipeline=FUSE)
    assert len(gpu.report.regions) == 1 and not gpu.report.regions[0].reason  # a kernel there
    monkeypatch.setenv("HLOFUSE_CPU_ELEMENTWISE_KERNELS", "1")  # what the suite runs with
    assert len(hlofuse.optimize(CHAIN, pipeline=full).report.kernels) == 1
    x = _inputs(CHAIN)
    for opt in (cpu, forced):
        assert_same(*eval_modules([opt.text, CHAIN], x), "exact")
