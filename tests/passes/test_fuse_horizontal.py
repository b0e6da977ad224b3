"""fuse-horizontal: sibling dots sharing an lhs (Q/K/V) and sibling elementwise chains."""

import numpy as np
from hypothesis import given, settings, strategies as st, HealthCheck

import jax
import jax.numpy as jnp

import hlofuse
from hlofuse.runtime.testing import assert_same
from tests.fusion_util import kernels, outline, pipe
from hlofuse.runtime.testing import ALL_KERNELS

def refusals(report) -> dict:
    """fuse-horizontal's ``refused[<reason>]`` statistics (reason -> count)."""
    (stats,) = [p.stats for p in report.passes if p.name == "fuse-horizontal"]
    return {k[len("refused["):-1]: v for k, v in stats.items() if k.startswith("refused[")}


def notes(report) -> list:
    return [n for n in report.notes if n.startswith("fuse-horizontal:")]


PIPE = pipe("fuse-matmul-epilogue", "fuse-horizontal")
R = np.random.default_rng(2)
F32 = np.float32
X = R.standard_normal((2, 10, 32)).astype(F32)
WS = [(R.standard_normal((32, 48)) * 0.2).astype(F32) for _ in range(3)]
BS = [R.standard_normal(48).astype(F32) for _ in range(3)]


def qkv(x, wq, wk, wv, bq, bk, bv):
    return x @ wq + bq, x @ wk + bk, jax.nn.relu(x @ wv + bv)


def test_qkv_projections_become_one_kernel():
    f = hlofuse.jit(qkv, target="cpu", pipeline=PIPE)
    rep = f.report(X, *WS, *BS)
    (h,) = kernels(rep, "horizontal")
    assert h.ops.count("stablehlo.dot_general") == 3
    assert sorted(h.extra["merged_regions"]) == [0, 1, 2]
    merged = [r for r in rep.regions if r.extra.get("merged_into") == h.id]
    assert len(merged) == 3 and all(r.bytes_unfused == 0 and r.kernel is None for r in merged)
    # the shared lhs is read once instead of three times
    assert sum(1 for t in h.inputs if t == "f32[2,10,32]") == 1
    assert refusals(rep) == {} and notes(rep) == []  # a merge adds no refusal
    assert_same(f(X, *WS, *BS), jax.jit(qkv)(X, *WS, *BS), "reassociate")


def test_bare_sibling_dots_merge():
    fn = lambda x, a, b: (x @ a, x @ b)  # noqa: E731
    f = hlofuse.jit(fn, target="gpu", pipeline=PIPE, options=ALL_KERNELS)
    lo = f.lower(X, WS[0], WS[1])
    (h,) = kernels(lo.report, "horizontal")
    assert "__gpu$xla.gpu.triton" in lo.as_text()
    assert h.kernel and h.bytes_fused < h.bytes_unfused


def test_dependent_dots_do_not_merge():
    def fn(x, a, b):
        q = jnp.tanh(x @ a)               # k's lhs is x too, but k also reads q: a path q -> k
        k = x @ b + q[..., :48]
        return q, jax.nn.relu(k)
    a = (R.standard_normal((32, 64)) * 0.2).astype(F32)
    f = hlofuse.jit(fn, target="cpu", pipeline=PIPE)
    rep = f.report(X, a, WS[1])
    assert kernels(rep, "horizontal") == []
    # a is 32x64, b 32x48: the shapes already keep them apart, before the path is looked at
    assert refusals(rep) == {"sibling dots with different shapes": 1}
    assert len(notes(rep)) == 1 and "1 sibling dot(s) not merged" in notes(rep)[0]
    assert_same(f(X, a, WS[1]), jax.jit(fn)(X, a, WS[1]), "reassociate")


def test_different_shapes_do_not_merge():
    w2 = (R.standard_normal((32, 16)) * 0.2).astype(F32)
    fn = lambda x, a, b: (jnp.tanh(x @ a), jnp.tanh(x @ b))  # noqa: E731
    f = hlofuse.jit(fn, target="cpu", pipeline=PIPE)
    rep = f.report(X, WS[0], w2)
    assert kernels(rep, "horizontal") == []
    assert refusals(rep) == {"sibling dots with different shapes": 1}
    (note,) = notes(rep)
    assert note.startswith("fuse-horizontal: 1 sibling dot(s) not merged at test_fuse_horizontal.py:")
    assert note.endswith(": sibling dots with different shapes")


def test_sibling_elementwise_chains_merge(monkeypatch):
    fn = lambda x, y: (jnp.exp(x) * 2.0, jnp.sin(x) + y, jnp.cos(y))  # noqa: E731
    out = outline(fn, (X, X), "fuse-horizontal{cpu_kernels=true}")
    merged = [r for r in out.report.regions if r.extra.get("horizontal")]
    assert len(merged) == 1 and len(merged[0].outputs) == 3
    f = hlofuse.jit(fn, target="cpu", pipeline=pipe("fuse-horizontal{cpu_kernels=true}"))
    assert len(kernels(f.report(X, X), "elementwise")) == 1
    assert_same(f(X, X), jax.jit(fn)(X, X), "kernel")
    # by default the cpu rule leaves the merged loop to XLA:CPU, which fuses it itself
    monkeypatch.delenv("HLOFUSE_CPU_ELEMENTWISE_KERNELS", raising=False)  # conftest sets it
    f = hlofuse.jit(fn, target="cpu", pipeline=pipe("fuse-horizontal"))
    rep = f.report(X, X)
    assert not kernels(rep, "elementwise")
    assert [r.reason for r in rep.regions if r.extra.get("horizontal")][0].startswith("cost model: XLA:CPU")
    assert_same(f(X, X), jax.jit(fn)(X, X), "kernel")


SHARED_CONSTANT = """
func.func @main(%x: tensor<4x8xf32>, %y: tensor<4x8xf32>) -> (tensor<4x8xf32>, tensor<4x8xf32>) {
  %c = stablehlo.constant dense<3.0> : tensor<f32>
  %b0 = stablehlo.broadcast_in_dim %c, dims = [] : (tensor<f32>) -> tensor<4x8xf32>
  %e0 = stablehlo.exponential %x : tensor<4x8xf32>
  %m0 = stablehlo.multiply %e0, %b0 : tensor<4x8xf32>
  %b1 = stablehlo.broadcast_in_dim %c, dims = [] : (tensor<f32>) -> tensor<4x8xf32>
  %e1 = stablehlo.exponential %y : tensor<4x8xf32>
  %m1 = stablehlo.multiply %e1, %b1 : tensor<4x8xf32>
  return %m0, %m1 : tensor<4x8xf32>, tensor<4x8xf32>
}
"""


def test_sharing_only_a_constant_does_not_merge():
    out = hlofuse.optimize(SHARED_CONSTANT, pipeline=["fuse-horizontal"])
    assert [r for r in out.report.regions if r.extra.get("horizontal")] == []
    assert refusals(out.report) == {"siblings share only a constant": 1}
    (note,) = notes(out.report)
    assert note.startswith("fuse-horizontal: 1 sibling elementwise group(s) not merged")
    assert note.endswith(": siblings share only a constant")


def test_chains_joined_by_a_shared_broadcast_are_one_group_not_siblings():
    # after cse both chains read the same broadcast of 0.0 and of 3.0: one elementwise group
    # (fuse-elementwise's business), so there is no sibling to merge or to refuse
    fn = lambda x, y: (jnp.maximum(x, 0.0) * 3.0, jnp.maximum(y, 0.0) * 3.0)  # noqa: E731
    out = outline(fn, (X, X), "fuse-horizontal")
    assert [r for r in out.report.regions if r.extra.get("horizontal")] == []
    assert refusals(out.report) == {} and notes(out.report) == []


@settings(max_examples=5, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.integers(2, 4), st.sampled_from([(3, 8, 16), (1, 17, 5)]), st.booleans())
def test_random_sibling_groups(n, mkn, with_bias):
    m, k, nn = mkn
    x = R.standard_normal((m, k)).astype(F32)
    ws = [R.standard_normal((k, nn)).astype(F32) for _ in range(n)]

    def fn(x, *ws):
        outs = []
        for i, w in enumerate(ws):
            h = x @ w
            outs.append(jnp.tanh(h + float(i)) if with_bias else h)
        return tuple(outs)
    f = hlofuse.jit(fn, target="cpu", pipeline=PIPE)
    rep = f.report(x, *ws)
    (h,) = [r for r in rep.regions if r.kind == "horizontal"]
    assert h.ops.count("stablehlo.dot_general") == n and h.kernel
    assert_same(f(x, *ws), jax.jit(fn)(x, *ws), "reassociate")


def test_sibling_groups_feeding_each_other_both_ways_are_not_both_merged():
    # {tanh(x), sin(x)*d2} and {exp(y), relu(d1+y)} are each convex sibling groups, but the
    # first feeds the second through d1 = tanh(x)@w and the second the first through d2:
    # outlining both as kernels would need each before the other
    w = (R.standard_normal((32, 32)) * 0.1).astype(F32)
    x = R.standard_normal((16, 32)).astype(F32)

    def fn(x, y, w):
        a = jnp.tanh(x)
        e = jnp.exp(y)
        d1, d2 = a @ w, e @ w
        return a, jnp.sin(x) * d2, e, jax.nn.relu(d1 + y)
    f = hlofuse.jit(fn, target="cpu", pipeline=pipe("fuse-horizontal"))
    rep = f.report(x, x, w)
    assert len([r for r in rep.regions if r.extra.get("horizontal")]) == 1
    assert_same(f(x, x, w), jax.jit(fn)(x, x, w), "reassociate")


# the first merge {exp(u), sin(u)} sinks the dot and {select, abs} below its call; the second
# merge {select(x, d), abs} + {select(x, y)} must then go after the sunk ops, not after the
# op that was last before the first merge moved them
SUNK_BY_AN_EARLIER_MERGE = """
func.func @main(%x: tensor<8xf32>, %p: tensor<i1>, %y: tensor<8xf32>, %u: tensor<8xf32>,
                %m: tensor<8x8xf32>) -> (tensor<8xf32>, tensor<8xf32>, tensor<8xf32>) {
  %e1 = stablehlo.exponential %u : tensor<8xf32>
  %d = stablehlo.dot_general %m, %e1, contracting_dims = [1] x [0] : (tensor<8x8xf32>, tensor<8xf32>) -> tensor<8xf32>
  %c = stablehlo.select %p, %x, %d : tensor<i1>, tensor<8xf32>
  %ac = stablehlo.abs %c : tensor<8xf32>
  %b = stablehlo.select %p, %x, %y : tensor<i1>, tensor<8xf32>
  %e2 = stablehlo.sine %u : tensor<8xf32>
  return %e2, %b, %ac : tensor<8xf32>, tensor<8xf32>, tensor<8xf32>
}
"""


def test_a_merge_after_an_earlier_merge_moved_its_members():
    from hlofuse.runtime.execute import run_module
    out = hlofuse.optimize(SUNK_BY_AN_EARLIER_MERGE, pipeline=["fuse-horizontal{cpu_kernels=true}"],
                           options={"strict": True})
    merged = [sorted(r.ops) for r in out.report.regions if r.extra.get("horizontal")]
    assert merged == [["stablehlo.exponential", "stablehlo.sine"],
                      ["stablehlo.abs", "stablehlo.select", "stablehlo.select"]]
    args = [R.standard_normal(8).astype(F32), np.array(True), R.standard_normal(8).astype(F32),
            R.standard_normal(8).astype(F32), R.standard_normal((8, 8)).astype(F32)]
    for p in (True, False):
        args[1] = np.array(p)
        want = run_module(SUNK_BY_AN_EARLIER_MERGE, args)
        assert_same(run_module(out.module, args), want, "exact")
