"""``propagate-shardings`` and per-shard kernels (:mod:`hlofuse.passes.sharding`).

In-process, on module text (an 8-device mesh needs no devices to optimize): the pass annotates
every op; ``kernelize`` wraps a shard-local region's kernel in ``sdy.manual_computation`` with
the region's shardings and builds it for one shard's shapes; a region whose contraction is
sharded stays with XLA and the report says why. The numbers of these programs on 8 CPU devices
are checked against ``jax.jit`` in ``tests/test_sharded.py``.
"""

import re

import hlofuse
from hlofuse.core import ir as hir
from hlofuse.passes import sharding as shd

def stats(report, name):
    return [p.stats for p in report.passes if p.name == name][-1]


MESH = 'sdy.mesh @mesh = <["data"=2, "model"=4]>'
SH = lambda dims: f"{{sdy.sharding = #sdy.sharding<@mesh, [{dims}]>}}"  # noqa: E731

# column-parallel matmul with a gelu-like epilogue, then a row-parallel matmul + residual
MLP = f"""
module @jit_f attributes {{mhlo.num_partitions = 8 : i32, mhlo.num_replicas = 1 : i32}} {{
  {MESH}
  func.func public @main(%x: tensor<8x16xf32> {SH('{"data"}, {}')},
                         %w1: tensor<16x32xf32> {SH('{}, {"model"}')},
                         %w2: tensor<32x16xf32> {SH('{"model"}, {}')}) -> tensor<8x16xf32> {{
    %0 = stablehlo.dot_general %x, %w1, contracting_dims = [1] x [0] : (tensor<8x16xf32>, tensor<16x32xf32>) -> tensor<8x32xf32>
    %1 = stablehlo.tanh %0 : tensor<8x32xf32>
    %2 = stablehlo.multiply %1, %0 : tensor<8x32xf32>
    %3 = stablehlo.dot_general %2, %w2, contracting_dims = [1] x [0] : (tensor<8x32xf32>, tensor<32x16xf32>) -> tensor<8x16xf32>
    %4 = stablehlo.add %3, %x : tensor<8x16xf32>
    %5 = stablehlo.exponential %4 : tensor<8x16xf32>
    return %5 : tensor<8x16xf32>
  }}
}}"""

PIPE = ["propagate-shardings", "fuse-matmul-epilogue", "kernelize", "symbol-dce"]


def test_propagation_annotates_every_op_and_changes_nothing_else():
    opt = hlofuse.optimize(MLP, pipeline=["propagate-shardings"])
    body = [l for l in opt.text.splitlines() if "stablehlo." in l]
    assert body and all("sdy.sharding" in l for l in body)
    assert stats(opt.report, "propagate-shardings")["annotated_ops"] == 6
    names = lambda m: [(op.name, str(op.results[0].type) if len(op.results) else "")  # noqa: E731
                       for op in hir.all_ops(m)]
    assert names(opt.module) == names(hir.parse(MLP))


def test_shard_local_region_runs_per_shard_and_sharded_contraction_stays_with_xla():
    opt = hlofuse.optimize(MLP, pipeline=PIPE)
    st = stats(opt.report, "kernelize")
    assert st["per_shard"] == 1 and st["not_shard_local"] == 1, st
    local, xla = sorted(opt.report.regions, key=lambda r: r.kernel is None)
    assert local.kernel and "per_shard" in local.extra
    assert local.extra["per_shard"] == "P('data', None), P(None, 'model') -> P('data', 'model')"
    assert "contraction is sharded" in xla.reason and xla.kernel is None
    text = opt.text
    assert text.count("sdy.manual_computation") == 1
    # the kernel is built for one shard: 8x16 / (data=2) and 16x32 / (model=4)
    m = re.search(r"manual_axes=\{[^}]*\} \((%\w+): (tensor<[^>]*>), (%\w+): (tensor<[^>]*>)\)", text)
    assert m and m.group(2) == "tensor<4x16xf32>" and m.group(4) == "tensor<16x8xf32>", m
    hir.verify(hir.parse(text))


def test_unsharded_module_is_unchanged_by_propagation():
    plain = MLP.replace(MESH, "").replace(SH('{"data"}, {}'), "").replace(
        SH('{}, {"model"}'), "").replace(SH('{"model"}, {}'), "")
    opt = hlofuse.optimize(plain, pipeline=PIPE)
    assert "manual_computation" not in opt.text and len(opt.report.kernels) == 2
    assert stats(opt.report, "propagate-shardings")["annotated_ops"] == 0


def test_check_region_reasons():
    """Each rule names the op and why: a reduction over a sharded dim is not shard-local."""
    text = f"""
module {{
  {MESH}
  func.func public @main(%x: tensor<8x16xf32> {SH('{}, {"model"}')}) -> tensor<8xf32> {{
    %c = stablehlo.constant dense<0.0> : tensor<f32>
    %0 = stablehlo.tanh %x : tensor<8x16xf32>
    %1 = stablehlo.reduce(%0 init: %c) applies stablehlo.add across dimensions = [1] : (tensor<8x16xf32>, tensor<f32>) -> tensor<8xf32>
    return %1 : tensor<8xf32>
  }}
}}"""
    opt = hlofuse.optimize(text, pipeline=["propagate-shardings", "fuse-reduction", "kernelize"])
    (r,) = opt.report.regions
    assert r.kernel is None and "reduces over a sharded dim" in r.reason, r.reason
    assert shd._parse_dims('[{"data", ?}, {}, {"a", "b"}]') == (("data",), (), ("a", "b"))


def test_reshape_rule_is_by_the_elements_before_the_sharded_dim():
    """A reshape is shard-local when each sharded dim keeps the elements before it: merging it
    with unsharded dims after it, or splitting off its major part, is; merging it under an
    unsharded dim before it is not."""
    ok, m = shd.reshape_keeps, ("model",)        # a 4-way axis: every sharded size is a multiple
    assert ok((8, 2, 16), (16, 16), (m, (), ()), (m, ()))          # [8 sharded, 2] -> 16
    assert ok((16, 16), (8, 2, 16), (m, ()), (m, (), ()))          # and back
    assert ok((3, 4, 2), (3, 8), ((), m, ()), ((), m))             # elements before kept: 3
    assert not ok((2, 8), (16,), ((), m), (m,))                    # under an unsharded dim
    assert not ok((8, 2), (16,), (m, ()), ((),))                   # the sharding dropped
    # inferred for an op made after propagation: kept on a merge; on a split only when the
    # mesh's axis sizes are known and divide the major part
    assert shd.reshaped((8, 2, 16), (16, 16), (m, (), ())) == (m, ())
    assert shd.reshaped((16, 16), (8, 2, 16), (m, ())) == ((), (), ())
    assert shd.reshaped((16, 16), (8, 2, 16), (m, ()), {"model": 4}) == (m, (), ())
    assert shd.reshaped((16, 16), (2, 8, 16), (m, ()), {"model": 4}) == ((), (), ())


def _shard_map_module(manual: str) -> str:
    local = "tensor<8x4xf32>" if manual == '"model"' else "tensor<4x4xf32>"
    dims = '[{}, {"model"}]' if manual == '"model"' else '[{"data"}, {"model"}]'
    return f"""
module {{
  {MESH}
  func.func public @main(%x: tensor<8x16xf32>) -> tensor<8x16xf32> {{
    %0 = sdy.manual_computation(%x) in_shardings=[<@mesh, {dims}>] out_shardings=[<@mesh, {dims}>] manual_axes={{{manual}}} (%a: {local}) {{
      %1 = stablehlo.tanh %a : {local}
      %2 = stablehlo.multiply %1, %a : {local}
      %3 = stablehlo.exponential %2 : {local}
      sdy.return %3 : {local}
    }} : (tensor<8x16xf32>) -> tensor<8x16xf32>
    return %0 : tensor<8x16xf32>
  }}
}}"""


def test_shard_map_body_is_fused_with_per_device_shapes():
    opt = hlofuse.optimize(_shard_map_module('"data", "model"'),
                           pipeline=["propagate-shardings", "fuse-elementwise", "kernelize",
                                     "symbol-dce"])
    (r,) = opt.report.regions
    assert r.kernel and r.reason is None and "per_shard" not in r.extra
    assert opt.text.count("sdy.manual_computation") == 1   # the body's own: no nesting
    assert re.search(r"func.func private @hlofuse_k0_main\(%arg0: tensor<4x4xf32>", opt.text)


def test_partially_manual_shard_map_body_stays_with_xla_and_says_why():
    opt = hlofuse.optimize(_shard_map_module('"model"'),
                           pipeline=["propagate-shardings", "fuse-elementwise", "kernelize"])
    (r,) = opt.report.regions
    assert r.kernel is None and "manual over model only" in r.reason, r.reason


# a loop carrying a batch-sharded activation (a scan over two layers)
LOOP = f"""
module @jit_f attributes {{mhlo.num_partitions = 8 : i32, mhlo.num_replicas = 1 : i32}} {{
  {MESH}
  func.func public @main(%x: tensor<8x16xf32> {SH('{"data"}, {}')}) -> tensor<8x16xf32> {{
    %c0 = stablehlo.constant dense<0> : tensor<i32>
    %r:2 = stablehlo.while(%i = %c0, %h = %x) : tensor<i32>, tensor<8x16xf32>
     cond {{
      %two = stablehlo.constant dense<2> : tensor<i32>
      %lt = stablehlo.compare LT, %i, %two, SIGNED : (tensor<i32>, tensor<i32>) -> tensor<i1>
      stablehlo.return %lt : tensor<i1>
    }} do {{
      %one = stablehlo.constant dense<1> : tensor<i32>
      %n = stablehlo.add %i, %one : tensor<i32>
      %t = stablehlo.tanh %h : tensor<8x16xf32>
      %e = stablehlo.exponential %t : tensor<8x16xf32>
      stablehlo.return %n, %e : tensor<i32>, tensor<8x16xf32>
    }}
    return %r#1 : tensor<8x16xf32>
  }}
}}"""


def test_propagation_reaches_into_loop_bodies():
    """Shardy propagates along a loop's data-flow edges: the body's ops are sharded like the
    carried activation, and a body argument reads the loop's sharding (before, nothing in a
    body was annotated, its regions read as replicated and their per-shard kernels made XLA
    all-gather the activation). The loop's own shardings move to ``hlofuse.loop_shardings``:
    XLA's import drops loop invariants without updating a while's ``sdy.sharding``."""
    opt = hlofuse.optimize(LOOP, pipeline=["propagate-shardings"])
    body = [l for l in opt.text.splitlines() if "stablehlo.tanh" in l or "stablehlo.exponential" in l]
    assert len(body) == 2 and all('[{"data"' in l for l in body), body
    loop = next(op for op in hir.all_ops(opt.module) if op.name == "stablehlo.while")
    assert shd.LOOP_SHARDING_ATTR in loop.attributes and shd.SHARDING_ATTR not in loop.attributes
    arg = loop.regions[1].blocks[0].arguments[1]
    assert shd.value_sharding(arg) == (("data",), ())


def test_several_meshes_counts_layouts_not_names():
    """A shard_map's mesh made apart from the inputs' is the same mesh under a second name
    (``@mesh_0``): one layout, still a sharded program (counting names turned every per-shard
    kernel of a shard_map MLP off on h100 and v5e; CI's deviceless compile caught it). Axis-less
    meshes do not count; two layouts do."""
    from hlofuse.core import ir as hir
    from hlofuse.passes import sharding as shd
    body = ("func.func @main(%x: tensor<8xf32>) -> tensor<8xf32> {\n"
            "  return %x : tensor<8xf32>\n}")
    same = ('sdy.mesh @mesh = <["data"=2, "model"=4]>\nsdy.mesh @mesh_0 = <["data"=2, "model"=4]>\n'
            'sdy.mesh @empty_mesh = <[]>\n')
    other = 'sdy.mesh @mesh = <["a"=8]>\nsdy.mesh @mesh_0 = <["a"=2, "b"=4]>\n'
    assert not shd.several_meshes(hir.parse(same + body))
    assert shd.several_meshes(hir.parse(other + body))
