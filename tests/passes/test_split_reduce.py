"""``split-reduce``: reductions over non-adjacent dims (GroupNorm's ``(1, 2, 4)``) become
chains of single-run reductions with jax.jit's numbers (``reassociate`` for float sums, exact
for max/min and integers); what it must not split stays as written."""

from __future__ import annotations

import numpy as np
import pytest

import jax
import jax.numpy as jnp
from jax import lax

import hlofuse
from hlofuse.core import ir as hir
from hlofuse.passes.split_reduce import plan, runs
from hlofuse.runtime.testing import assert_same
from tests.fusion_util import eval_modules

PIPE = ["inline-calls", "canonicalize", "cse", "split-reduce"]
B, H, W, C, G = 2, 16, 16, 64, 16            # 32K elements: at the default min_split_elements


def _group_norm(x, scale, bias):
    """Flax's GroupNorm as it lowers: reshape to groups, mean and mean of squares over
    (1, 2, 4), SiLU after."""
    xr = x.reshape(B, H, W, G, C // G)
    mean = xr.mean((1, 2, 4), keepdims=True)
    var = jnp.maximum((xr * xr).mean((1, 2, 4), keepdims=True) - mean * mean, 0.0)
    y = ((xr - mean) * lax.rsqrt(var + 1e-6)).reshape(B, H, W, C)
    return jax.nn.silu(y * scale + bias)


def _x(shape=(B, H, W, C), dtype=np.float32, seed=0):
    return np.random.default_rng(seed).standard_normal(shape).astype(dtype)


def _stats(report) -> dict:
    (stats,) = [p.stats for p in report.passes if p.name == "split-reduce"]
    return stats


def _reduce_dims(text: str) -> list[tuple[list[int], list[int]]]:
    """(operand shape, dims) of every reduce in ``text``."""
    out = []
    module = hir.parse(text)           # held while its ops are read
    for op in hir.all_ops(module):
        if op.name == "stablehlo.reduce":
            shape = list(hir.tensor_type_info(op.operands[0].type).shape)
            out.append((shape, [int(d) for d in op.attributes["dimensions"]]))
    return out


def _non_adjacent(text: str) -> int:
    return sum(len(plan(shape, set(dims))) > 0 for shape, dims in _reduce_dims(text))


def test_runs_and_plan():
    assert runs([4, 32, 32, 16, 4], {1, 2, 4}) == [(4, False), (1024, True), (16, False), (4, True)]
    assert runs([1, 8, 1, 8], {0, 1, 3}) == [(64, True)]         # unit dims drop out
    # GroupNorm: the H*W run first, on [B, HW, C]; then the C/G run of [B*G, C/G]
    assert plan([4, 32, 32, 16, 4], {1, 2, 4}) == [([4, 1024, 64], 1), ([64, 4], 1)]
    # BatchNorm NCHW (0, 2, 3): HW first (a row reduction), then N of [N, C]
    assert plan([8, 64, 16, 16], {0, 2, 3}) == [([512, 256], 1), ([8, 64], 0)]
    # three runs: the largest first, the regrouped rest after
    assert plan([3, 5, 7, 11, 13], {0, 2, 4}) == [([1155, 13], 1), ([15, 7, 11], 1), ([3, 55], 0)]
    assert plan([4, 32, 32, 64], {1, 2}) == []                   # one run: nothing to split
    assert plan([2, 1, 4, 1], {1, 3}) == []                      # unit dims only


def test_group_norm_stats_split_with_jax_jit_numbers():
    args = (_x(), _x((C,), seed=1), _x((C,), seed=2))
    text = jax.jit(_group_norm).lower(*args).as_text()
    assert _non_adjacent(text) == 2
    opt = hlofuse.optimize(text, pipeline=PIPE)
    assert _stats(opt.report) == {"split": 2, "split_float": 2}
    assert _non_adjacent(opt.text) == 0
    assert ([B, H * W, C], [1]) in _reduce_dims(opt.text)
    assert_same(*eval_modules([opt.text, text], list(args)), "reassociate")
    again = hlofuse.optimize(opt.text, pipeline="split-reduce")     # idempotent
    assert _stats(again.report)["split"] == 0


SHAPE, DIMS = (32, 32, 8, 4), (1, 3)      # runs: kept 32, reduced 32, kept 8, reduced 4


@pytest.mark.parametrize("dtype,reduce,category", [
    (np.float32, lambda x: x.max(DIMS), "exact"),
    (np.float32, lambda x: x.min(DIMS), "exact"),
    (np.int32, lambda x: x.sum(DIMS), "exact"),
    (np.int32, lambda x: jnp.prod(x, DIMS), "exact"),
    (np.float32, lambda x: jnp.prod(x, DIMS), "reassociate"),
    (np.bool_, lambda x: x.any(DIMS), "exact"),
], ids=["max", "min", "int-sum", "int-prod", "float-prod", "any"])
def test_every_reducer_keeps_its_numbers(dtype, reduce, category):
    rng = np.random.default_rng(0)
    if dtype == np.bool_:
        x = rng.random(SHAPE) < 0.001
    elif dtype == np.int32:
        x = rng.integers(-3, 4, SHAPE).astype(dtype)
    else:
        x = (1 + 0.01 * rng.standard_normal(SHAPE)).astype(dtype)
    text = jax.jit(reduce).lower(x).as_text()
    opt = hlofuse.optimize(text, pipeline=PIPE)
    stats = _stats(opt.report)
    assert stats["split"] == 1
    assert stats["split_float"] == (category == "reassociate")
    assert _non_adjacent(opt.text) == 0
    assert_same(*eval_modules([opt.text, text], [x]), category)


def _left_alone(f, *args, target="cpu", options=None, disable=()):
    text = jax.jit(f).lower(*args).as_text()
    opt = hlofuse.optimize(text, target=target, pipeline=PIPE, options=options, disable=disable)
    assert _stats(opt.report).get("split", 0) == 0
    assert _non_adjacent(opt.text) == _non_adjacent(text)
    return opt


def test_what_it_leaves_alone():
    x = _x(SHAPE)
    # an init the reducer is not idempotent on: applied once per step it would count twice
    _left_alone(lambda x: lax.reduce(x, np.float32(1.0), lax.add, DIMS), x)
    # fewer than min_split_elements
    _left_alone(lambda x: x.sum(DIMS), _x((4, 8, 4, 4)))
    _left_alone(lambda x: x.sum(DIMS), x, options={"split-reduce": {"min_split_elements": 1 << 16}})
    # a long innermost reduced run (BatchNorm over NCHW's (0, 2, 3)), a kept innermost run
    _left_alone(lambda x: x.sum((0, 2, 3)), _x((16, 256, 8, 8)))
    _left_alone(lambda x: x.sum((0, 2)), x)
    _left_alone(lambda x: x.sum(DIMS), x, options={"split-reduce": {"inner_run_below": 4}})
    # adjacent dims: one run
    _left_alone(lambda x: x.sum((1, 2, 3)), x)
    # not cpu: XLA:GPU splits itself
    _left_alone(lambda x: x.sum(DIMS), x, target="gpu")
    _left_alone(lambda x: x.sum(DIMS), x, disable=["split-reduce"])
    # argmax: a variadic reduce; complex elements
    _left_alone(lambda x: jnp.argmax(x.reshape(1024, 32), 1), x)
    _left_alone(lambda x: x.sum(DIMS), x.astype(np.complex64))


def test_narrow_float_sums_stay_and_the_report_says_why():
    x = _x(SHAPE).astype(jnp.bfloat16)
    f = lambda x: lax.reduce(x, jnp.bfloat16(0), lax.add, DIMS)   # a bf16 accumulator
    opt = _left_alone(f, x)
    assert any("split-reduce" in n and "narrower than f32" in n for n in opt.report.notes)
    # bf16 max is exact whatever the width: split
    text = jax.jit(lambda x: x.max(DIMS)).lower(x).as_text()
    assert _stats(hlofuse.optimize(text, pipeline=PIPE).report)["split"] == 1


def test_group_norm_under_hlofuse_jit_and_grad():
    """The whole pipeline: forward and the gradient (whose input gradient has more such
    sums), compared with jax.jit; the verify category of the program is ``reassociate``."""
    from hlofuse.runtime.verify import program_category
    args = (_x(), _x((C,), seed=1), _x((C,), seed=2))
    loss = lambda x, s, b: jnp.sum(_group_norm(x, s, b) ** 2)
    g = jax.grad(loss, argnums=(0, 1, 2))
    f = hlofuse.jit(g, autotune=False)
    got = f(*args)
    rep = f.report(*args)
    assert _stats(rep)["split_float"] >= 2
    assert program_category(rep) == "reassociate"
    assert_same([np.asarray(a) for a in got], [np.asarray(a) for a in jax.jit(g)(*args)], "grad")
