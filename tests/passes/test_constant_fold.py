"""``constant-fold``: golden IR (fires / size limit / no match), exactness, idempotence."""

from __future__ import annotations

import numpy as np
import pytest

import hlofuse
from hlofuse.runtime.testing import assert_same
from hlofuse.runtime.execute import run_module

PASS = ["constant-fold"]


def optimize(text, **kw):
    return hlofuse.optimize(text, pipeline=PASS, **kw)


def stats(o, name="constant-fold"):
    return next(p.stats for p in o.report.passes if p.name == name)


FOLD = """
func.func @main(%x: tensor<4x3xf32>) -> (tensor<4x3xf32>, tensor<3x4xf32>) {
  %w = stablehlo.constant dense<[[1.0, 2.0, 3.0], [4.0, 5.0, 6.0], [7.0, 8.0, 9.0], [1.5, 2.5, 3.5]]> : tensor<4x3xf32>
  %two = stablehlo.constant dense<2.0> : tensor<f32>
  %b2 = stablehlo.broadcast_in_dim %two, dims = [] : (tensor<f32>) -> tensor<4x3xf32>
  %w2 = stablehlo.multiply %w, %b2 : tensor<4x3xf32>
  %wt = stablehlo.transpose %w2, dims = [1, 0] : (tensor<4x3xf32>) -> tensor<3x4xf32>
  %y = stablehlo.add %x, %w2 : tensor<4x3xf32>
  %xt = stablehlo.transpose %x, dims = [1, 0] : (tensor<4x3xf32>) -> tensor<3x4xf32>
  %z = stablehlo.subtract %xt, %wt : tensor<3x4xf32>
  return %y, %z : tensor<4x3xf32>, tensor<3x4xf32>
}"""

# exp(v) is small and folds; broadcasting the result to 64x256 would materialize 64 KiB from
# 1 KiB of data, so the broadcast must stay (of the folded vector).
EXPANSION = """
func.func @main(%x: tensor<64x256xf32>) -> tensor<64x256xf32> {
  %v = stablehlo.iota dim = 0 : tensor<256xf32>
  %e = stablehlo.exponential %v : tensor<256xf32>
  %b = stablehlo.broadcast_in_dim %e, dims = [1] : (tensor<256xf32>) -> tensor<64x256xf32>
  %y = stablehlo.multiply %x, %b : tensor<64x256xf32>
  return %y : tensor<64x256xf32>
}"""

NO_MATCH = """
func.func @main(%x: tensor<4x3xf32>, %w: tensor<4x3xf32>) -> tensor<4x3xf32> {
  %y = stablehlo.multiply %x, %w : tensor<4x3xf32>
  %z = stablehlo.exponential %y : tensor<4x3xf32>
  return %z : tensor<4x3xf32>
}"""

INT_DIV_ZERO = """
func.func @main(%x: tensor<4xi32>) -> tensor<4xi32> {
  %a = stablehlo.constant dense<[7, 8, 9, 10]> : tensor<4xi32>
  %b = stablehlo.constant dense<[2, 0, 3, 0]> : tensor<4xi32>
  %q = stablehlo.divide %a, %b : tensor<4xi32>
  %y = stablehlo.add %x, %q : tensor<4xi32>
  return %y : tensor<4xi32>
}"""

F64 = """
func.func @main(%x: tensor<2xf64>) -> tensor<2xf64> {
  %a = stablehlo.constant dense<[1.0000000000000002, 3.0]> : tensor<2xf64>
  %b = stablehlo.constant dense<[1.0e-300, 7.0]> : tensor<2xf64>
  %c = stablehlo.multiply %a, %b : tensor<2xf64>
  %y = stablehlo.add %x, %c : tensor<2xf64>
  return %y : tensor<2xf64>
}"""

BF16 = """
func.func @main(%x: tensor<3xbf16>) -> tensor<3xbf16> {
  %a = stablehlo.constant dense<[1.5, -2.25, 3.0]> : tensor<3xf32>
  %c = stablehlo.convert %a : (tensor<3xf32>) -> tensor<3xbf16>
  %n = stablehlo.negate %c : tensor<3xbf16>
  %y = stablehlo.add %x, %n : tensor<3xbf16>
  return %y : tensor<3xbf16>
}"""


def test_folds_constant_subgraph():
    o = optimize(FOLD)
    s = stats(o)
    assert s["folded"] >= 2 and s["eval_failed"] == 0
    text = o.text
    # the multiply and the transpose of constants are gone; x's transpose stays
    assert text.count("stablehlo.multiply") == 0
    assert text.count("stablehlo.transpose") == 1
    assert "dense<[[2.000000e+00, 4.000000e+00, 6.000000e+00]" in text
    x = np.arange(12, dtype=np.float32).reshape(4, 3) - 5
    assert_same(run_module(text, [x]), run_module(FOLD, [x]), "exact")


def test_size_limit_keeps_broadcast():
    o = optimize(EXPANSION)
    s = stats(o)
    text = o.text
    assert "stablehlo.exponential" not in text and "stablehlo.iota" not in text
    assert "stablehlo.broadcast_in_dim" in text and "tensor<256xf32>" in text
    assert "tensor<64x256xf32> = dense" not in text and s["refused_size"] >= 1
    assert refusals(o)["refused[broadcast_in_dim result is not a splat]"] == 1, refusals(o)
    x = np.random.default_rng(0).standard_normal((64, 256)).astype(np.float32)
    assert_same(run_module(text, [x]), run_module(EXPANSION, [x]), "kernel")


def test_max_bytes_option():
    # 48-byte results exceed a 16-byte limit: only the splat broadcast (always cheap) folds
    o = optimize(FOLD, options={"constant-fold": {"max_bytes": 16}})
    assert stats(o)["folded"] == 1 and stats(o)["refused_size"] >= 1
    assert refusals(o)["refused[result larger than max_bytes]"] >= 1, refusals(o)
    assert "stablehlo.multiply" in o.text and o.text.count("stablehlo.transpose") == 2


def refusals(o) -> dict:
    return {k: v for k, v in stats(o).items() if k.startswith("refused[")}


def test_no_match_leaves_module_alone():
    before = hlofuse.optimize(NO_MATCH, pipeline="none").text
    o = optimize(NO_MATCH)
    assert stats(o)["folded"] == 0 and o.text == before
    assert refusals(o) == {}  # no constant at all: no candidate


def test_constant_meeting_an_argument_says_so():
    text = NO_MATCH.replace("%w: tensor<4x3xf32>) -> tensor<4x3xf32> {",
                            "%u: tensor<4x3xf32>) -> tensor<4x3xf32> {\n"
                            "  %w = stablehlo.constant dense<2.0> : tensor<4x3xf32>")
    before = hlofuse.optimize(text, pipeline="none").text
    o = optimize(text)
    assert stats(o)["folded"] == 0 and o.text == before
    assert refusals(o) == {"refused[operand is a function argument]": 1}


def test_integer_division_by_zero_folds_to_xlas_values():
    """XLA's own compile-time folding of ``divide(constant, 0)`` dies with SIGFPE (jaxlib
    0.10.2); the pipeline first spells out XLA's run-time values (x / 0 = -1,
    ``hlofuse.core.ir.guard_integer_division``), which then fold like any constant."""
    o = optimize(INT_DIV_ZERO)
    assert "stablehlo.divide" not in o.text and stats(o)["folded"] >= 1, o.text
    x = np.array([1, 2, 3, 4], np.int32)
    np.testing.assert_array_equal(run_module(o.text, [x])[0], x + np.array([3, -1, 3, -1]))


@pytest.mark.parametrize("text,x", [
    (F64, np.array([0.5, -1.0])),
    (BF16, np.array([1.0, 2.0, -0.5], dtype=__import__("ml_dtypes").bfloat16)),
])
def test_wide_and_narrow_types_fold_exactly(text, x):
    import jax
    o = optimize(text)
    assert stats(o)["folded"] == 1
    assert "stablehlo.multiply" not in o.text and "stablehlo.negate" not in o.text
    with jax.enable_x64(True):  # f64 inputs must reach XLA as f64
        assert_same(run_module(o.text, [x]), run_module(text, [x]), "exact")


@pytest.mark.parametrize("text", [FOLD, EXPANSION, INT_DIV_ZERO, F64, BF16])
def test_idempotent(text):
    once = optimize(text)
    twice = optimize(once.text)
    assert stats(twice)["folded"] == 0
    assert twice.text == once.text


DATA_MOVEMENT = [
    ("stablehlo.pad %x, %v, low = [1, -1], high = [-2, 2], interior = [1, 0] : (tensor<3x4xf32>, tensor<f32>) -> tensor<4x5xf32>", "tensor<4x5xf32>"),
    ("stablehlo.pad %x, %v, low = [0, 2], high = [1, 0], interior = [0, 2] : (tensor<3x4xf32>, tensor<f32>) -> tensor<4x12xf32>", "tensor<4x12xf32>"),
    ("stablehlo.broadcast_in_dim %v, dims = [] : (tensor<f32>) -> tensor<4x5x3xf32>", "tensor<4x5x3xf32>"),
    ("stablehlo.slice %x [1:3, 0:4:2] : (tensor<3x4xf32>) -> tensor<2x2xf32>", "tensor<2x2xf32>"),
    ("stablehlo.reverse %x, dims = [0, 1] : tensor<3x4xf32>", "tensor<3x4xf32>"),
    ("stablehlo.transpose %x, dims = [1, 0] : (tensor<3x4xf32>) -> tensor<4x3xf32>", "tensor<4x3xf32>"),
    ("stablehlo.reshape %x : (tensor<3x4xf32>) -> tensor<2x6xf32>", "tensor<2x6xf32>"),
    ("stablehlo.concatenate %x, %x, dim = 1 : (tensor<3x4xf32>, tensor<3x4xf32>) -> tensor<3x8xf32>", "tensor<3x8xf32>"),
    ("stablehlo.iota dim = 1 : tensor<2x5xf32>", "tensor<2x5xf32>"),
]


@pytest.mark.parametrize("body,rtype", DATA_MOVEMENT, ids=[b.split()[0].split(".")[1] + str(i)
                                                          for i, (b, _) in enumerate(DATA_MOVEMENT)])
def test_numpy_data_movement_matches_xla(body, rtype):
    text = f"""func.func @main(%y: tensor<3x4xf32>) -> {rtype} {{
  %x = stablehlo.constant dense<[[1.0, 2.0, 3.0, 4.0], [5.0, 6.0, 7.0, 8.0], [9.0, 10.0, 11.0, 12.0]]> : tensor<3x4xf32>
  %v = stablehlo.constant dense<-1.0> : tensor<f32>
  %r = {body}
  %n = stablehlo.negate %r : {rtype}
  return %n : {rtype}
}}"""
    o = optimize(text)
    assert "stablehlo.negate" not in o.text and stats(o)["folded"] == 1
    y = np.zeros((3, 4), np.float32)
    assert_same(run_module(o.text, [y]), run_module(text, [y]), "exact")


BOOL = """
func.func @main(%x: tensor<4x3xi32>) -> tensor<4x3xi32> {
  %a = stablehlo.constant dense<2> : tensor<4x3xi32>
  %b = stablehlo.constant dense<1> : tensor<4x3xi32>
  %p = stablehlo.compare GT, %a, %b, SIGNED : (tensor<4x3xi32>, tensor<4x3xi32>) -> tensor<4x3xi1>
  %y = stablehlo.select %p, %x, %b : tensor<4x3xi1>, tensor<4x3xi32>
  return %y : tensor<4x3xi32>
}"""


def test_boolean_splat_is_a_broadcast_scalar():
    o = optimize(BOOL)
    assert "stablehlo.compare" not in o.text
    assert "dense<true> : tensor<i1>" in o.text and "stablehlo.broadcast_in_dim" in o.text
    assert optimize(o.text).text == o.text
    x = np.arange(12, dtype=np.int32).reshape(4, 3)
    assert_same(run_module(o.text, [x]), run_module(BOOL, [x]), "exact")


# ---------------------------------------------------------------------------------------------
# Huge splats are read as one element (issue 11, item 9)
# ---------------------------------------------------------------------------------------------

SPLAT_SLICE = """
func.func @main(%arg0: tensor<4x4xf32>) -> tensor<4x4xf32> {{
  %c = stablehlo.constant dense<2.0> : tensor<{shape}xf32>
  %s = stablehlo.slice %c [0:4, 0:4] : (tensor<{shape}xf32>) -> tensor<4x4xf32>
  %0 = stablehlo.add %arg0, %s : tensor<4x4xf32>
  return %0 : tensor<4x4xf32>
}}"""

SPLAT_DIV_ZERO = """
func.func @main() -> tensor<4xi32> {{
  %n = stablehlo.constant dense<5> : tensor<4xi32>
  %z = stablehlo.constant dense<0> : tensor<{shape}xi32>
  %s = stablehlo.slice %z [0:4, 0:1] : (tensor<{shape}xi32>) -> tensor<4x1xi32>
  %r = stablehlo.reshape %s : (tensor<4x1xi32>) -> tensor<4xi32>
  %q = stablehlo.divide %n, %r : tensor<4xi32>
  return %q : tensor<4xi32>
}}"""


def test_slice_of_a_one_gib_splat_folds_without_materializing_it():
    from tests.kernels.memory_util import MiB, optimize_rss_growth
    grown, res = optimize_rss_growth(SPLAT_SLICE, "16384x16384", "64x64", pipeline=PASS)
    text = res["text"]
    assert "stablehlo.slice" not in text and "dense<2.000000e+00> : tensor<4x4xf32>" in text, text
    assert grown < 200 * MiB, f"constant-fold grew the peak RSS by {grown / MiB:.0f} MiB (splat: 1024 MiB)"


def test_splat_slice_folds_to_the_same_values():
    o = optimize(SPLAT_SLICE.format(shape="64x64"))
    assert stats(o)["folded"] == 1 and "stablehlo.slice" not in o.text
    x = np.arange(16, dtype=np.float32).reshape(4, 4)
    assert_same(run_module(o.text, [x]), run_module(SPLAT_SLICE.format(shape="64x64"), [x]), "exact")


def test_zero_divisor_from_a_huge_splat_folds_without_materializing_it():
    """A zero divisor sliced from a 256 MiB splat: the division (XLA's x / 0 = -1, spelled out
    by the pipeline's division guard) folds from the splat's one element."""
    from tests.kernels.memory_util import MiB, optimize_rss_growth
    grown, res = optimize_rss_growth(SPLAT_DIV_ZERO, "16384x4096", "64x64", pipeline=PASS)
    assert "stablehlo.divide" not in res["text"] and "dense<-1> : tensor<4xi32>" in res["text"], res["text"]
    assert grown < 100 * MiB, f"constant-fold grew the peak RSS by {grown / MiB:.0f} MiB (splat: 256 MiB)"


# a causal mask as jnp.tril / attention code builds it: generated from iotas only. 512x512 i1
# is 256 KiB: folding it would load a dense constant instead of computing it where it is used,
# and hide the position mask from fuse-attention (no block skipping).
CAUSAL = """
func.func @main(%x: tensor<512x512xf32>) -> tensor<512x512xf32> {
  %r = stablehlo.iota dim = 0 : tensor<512x512xi32>
  %c = stablehlo.iota dim = 1 : tensor<512x512xi32>
  %p = stablehlo.compare GE, %r, %c, SIGNED : (tensor<512x512xi32>, tensor<512x512xi32>) -> tensor<512x512xi1>
  %f = stablehlo.constant dense<0xFF800000> : tensor<f32>
  %fb = stablehlo.broadcast_in_dim %f, dims = [] : (tensor<f32>) -> tensor<512x512xf32>
  %y = stablehlo.select %p, %x, %fb : tensor<512x512xi1>, tensor<512x512xf32>
  return %y : tensor<512x512xf32>
}"""


def test_generated_mask_not_folded():
    o = optimize(CAUSAL)
    assert "tensor<512x512xi1> = dense" not in o.text and "stablehlo.iota" in o.text
    assert refusals(o)["refused[generated from iotas, larger than GENERATED_MAX_BYTES]"] == 1, \
        refusals(o)
    x = np.random.default_rng(0).standard_normal((512, 512)).astype(np.float32)
    assert_same(run_module(o.text, [x]), run_module(CAUSAL, [x]), "exact")
    # a small generated value still folds (an 8x8 mask: 64 bytes)
    small = CAUSAL.replace("512x512", "8x8")
    o = optimize(small)
    assert "stablehlo.iota" not in o.text and stats(o)["folded"] >= 1

# ---------------------------------------------------------------------------------------------
# integer/boolean ops fold with numpy: the same values as the jax emitters, no XLA compiles
# ---------------------------------------------------------------------------------------------
CAUSAL_MASK = """
func.func @main(%x: tensor<8x8xf32>) -> tensor<8x8xf32> {
  %r = stablehlo.iota dim = 0 : tensor<8x8xi32>
  %c = stablehlo.iota dim = 1 : tensor<8x8xi32>
  %one = stablehlo.constant dense<1> : tensor<i32>
  %b1 = stablehlo.broadcast_in_dim %one, dims = [] : (tensor<i32>) -> tensor<8x8xi32>
  %r1 = stablehlo.add %r, %b1 : tensor<8x8xi32>
  %m = stablehlo.compare LT, %c, %r1, SIGNED : (tensor<8x8xi32>, tensor<8x8xi32>) -> tensor<8x8xi1>
  %t = stablehlo.constant dense<true> : tensor<i1>
  %f = stablehlo.constant dense<false> : tensor<i1>
  %bt = stablehlo.broadcast_in_dim %t, dims = [] : (tensor<i1>) -> tensor<8x8xi1>
  %bf = stablehlo.broadcast_in_dim %f, dims = [] : (tensor<i1>) -> tensor<8x8xi1>
  %s = stablehlo.select %m, %bt, %bf : tensor<8x8xi1>, tensor<8x8xi1>
  %n = stablehlo.constant dense<-1.0e30> : tensor<f32>
  %bn = stablehlo.broadcast_in_dim %n, dims = [] : (tensor<f32>) -> tensor<8x8xf32>
  %y = stablehlo.select %s, %x, %bn : tensor<8x8xi1>, tensor<8x8xf32>
  return %y : tensor<8x8xf32>
}"""


def _optimize_counting_compiles(text):
    """(optimize(text), the XLA compilations it ran)."""
    import jax
    compiles = []
    listener = (lambda ev, secs, **kw: compiles.append(ev)
                if ev.endswith("backend_compile_duration") else None)
    jax.monitoring.register_event_duration_secs_listener(listener)
    try:
        return optimize(text), compiles
    finally:
        jax.monitoring.unregister_event_duration_listener(listener)


def test_causal_mask_folds_without_xla_compiles():
    o, compiles = _optimize_counting_compiles(CAUSAL_MASK)
    assert stats(o)["folded"] >= 1 and "stablehlo.compare" not in o.text
    assert compiles == []   # iota, add, compare and select on integers/booleans: numpy only
    x = np.arange(64, dtype=np.float32).reshape(8, 8)
    assert_same(run_module(o.text, [x]), run_module(CAUSAL_MASK, [x]), "exact")


_EDGES = {np.int8: [-128, -1, 0, 1, 127], np.int32: [-2**31, -7, 0, 5, 2**31 - 1],
          np.uint8: [0, 1, 128, 255], np.uint32: [0, 3, 2**31, 2**32 - 1],
          np.int64: [-2**63, -3, 0, 9, 2**63 - 1]}


def _edge_pairs(vals, dtype):
    """Every ordered pair of ``vals``, as two arrays of ``dtype``."""
    import itertools
    vals = np.array(vals, dtype)
    return tuple(np.array(p, dtype) for p in zip(*itertools.product(vals, vals)))


def _ops_of(bodies, t):
    """Each body (``%r = <body>`` of operands ``%a``, ``%b``: ``t``) parsed in one context:
    (its op per body, the modules, which own the ops and must stay alive)."""
    from hlofuse.core import ir as hir
    ctx = hir.new_context()
    modules = [hir.parse(f"func.func @main(%a: {t}, %b: {t}) -> () {{\n  %r = {body}\n  return\n}}",
                         ctx) for body in bodies]
    return [hir.block_ops(hir.main_func(m).regions[0].blocks[0])[0] for m in modules], modules


def _assert_numpy_is_jax(bodies, ops, a, b, operands=None):
    """``constant_fold._exact`` (numpy) of every op against the op's jax emitter (what folding
    used before, and what XLA runs), bit for bit; the jax side in one compile."""
    import jax
    from hlofuse.core.ops import emit_op
    from hlofuse.passes import constant_fold as cf
    operands = operands or (lambda op, a, b: [a, b][:len(op.operands)])
    with jax.enable_x64(True):
        wants = jax.jit(lambda a, b: [emit_op(op, operands(op, a, b))[0] for op in ops])(a, b)
    for body, op, want in zip(bodies, ops, wants):
        got = cf._exact(op, operands(op, a, b))
        want = np.asarray(want)
        assert got is not None, body
        assert got.dtype == want.dtype and got.shape == want.shape, body
        np.testing.assert_array_equal(got.view(np.uint8), want.view(np.uint8), err_msg=body)


@pytest.mark.parametrize("dtype", list(_EDGES), ids=lambda d: np.dtype(d).name)
def test_exact_numpy_emitters_match_the_jax_emitters(dtype):
    """Every numpy emitter of EXACT_EMITTERS against the op's jax emitter, on the overflow
    edges of each integer type."""
    a, b = _edge_pairs(_EDGES[dtype], dtype)
    n = a.size
    ety = {"int8": "i8", "int32": "i32", "int64": "i64", "uint8": "ui8", "uint32": "ui32"}[np.dtype(dtype).name]
    t = f"tensor<{n}x{ety}>"
    signed = "SIGNED" if np.dtype(dtype).kind == "i" else "UNSIGNED"
    bodies = [f"stablehlo.{o} %a, %b : {t}" for o in
              ("add", "subtract", "multiply", "maximum", "minimum", "and", "or", "xor")]
    bodies.append(f"stablehlo.not %a : {t}")
    if signed == "SIGNED":   # (signless integers only)
        bodies += [f"stablehlo.{o} %a : {t}" for o in ("negate", "abs", "sign")]
    bodies.append(f"stablehlo.clamp %b, %a, %b : {t}")
    bodies += [f"stablehlo.compare {d}, %a, %b, {signed} : ({t}, {t}) -> tensor<{n}xi1>"
               for d in ("EQ", "NE", "LT", "LE", "GT", "GE")]
    bodies += [f"stablehlo.convert %a : ({t}) -> tensor<{n}x{to}>"
               for to in ("i8", "ui8", "i32", "ui32", "i64", "i1")]
    if np.dtype(dtype).itemsize <= 4:
        bodies += [f"stablehlo.convert %a : ({t}) -> tensor<{n}x{to}>" for to in ("f32", "f64")]
    ops, _modules = _ops_of(bodies, t)

    def operands(op, a, b):
        return [b, a, b] if op.name == "stablehlo.clamp" else [a, b][:len(op.operands)]
    _assert_numpy_is_jax(bodies, ops, a, b, operands)


_FLOAT_EDGES = [0.0, -0.0, np.inf, -np.inf, np.nan, 1.0, -3.0, 0.1, 7.5, 2.0 ** 24 + 1, 1e30, -1e-30]


@pytest.mark.parametrize("dtype", [np.float32, np.float64], ids=lambda d: np.dtype(d).name)
def test_float_numpy_emitters_match_the_jax_emitters(dtype):
    """The f32/f64 ops EXACT_EMITTERS evaluates with numpy (IEEE-rounded or exact) against their
    jax emitters, bit for bit, on every pair of edge values (infinities, NaN, signed zeros,
    large and small magnitudes; no subnormal results: _subnormal_risk refuses those first)."""
    from hlofuse.passes import constant_fold as cf
    a, b = _edge_pairs(_FLOAT_EDGES, dtype)
    n = a.size
    ety = {"float32": "f32", "float64": "f64"}[np.dtype(dtype).name]
    other = {"f32": "f64", "f64": "f32"}[ety]
    t = f"tensor<{n}x{ety}>"
    bodies = [f"stablehlo.{o} %a, %b : {t}" for o in ("add", "subtract", "multiply", "divide")]
    bodies += [f"stablehlo.{o} %a : {t}" for o in
               ("sqrt", "floor", "ceil", "round_nearest_even", "negate", "abs")]
    bodies += [f"stablehlo.compare {d}, %a, %b{c} : ({t}, {t}) -> tensor<{n}xi1>"
               for d in ("EQ", "NE", "LT", "LE", "GT", "GE") for c in ("", ", FLOAT")]
    bodies.append(f"stablehlo.convert %a : ({t}) -> tensor<{n}x{other}>")
    ops, _modules = _ops_of(bodies, t)
    for body, op in zip(bodies, ops):
        assert not cf._subnormal_risk(op, [a, b][:len(op.operands)]), body
    _assert_numpy_is_jax(bodies, ops, a, b)


# float -> int: toward zero, saturating at the bounds, NaN -> 0 (numpy's astype wraps around)
_TO_INT_EDGES = [0.0, -0.0, 0.5, -0.5, 1.5, -1.5, -2.5, 127.6, -129.0, 200.0, 255.5, -300.0,
                 3e9, -3e9, 2.0 ** 31 - 128, -2.0 ** 31, 2.0 ** 31, 2.0 ** 63, -2.0 ** 63,
                 1.9e19, 2.0 ** 64, 1e30, -1e30, 6e4, np.inf, -np.inf, np.nan]


@pytest.mark.parametrize("src", ["f64", "f32", "f16", "bf16"])
def test_float_to_int_folds_as_xla_converts(src):
    """Every float -> integer convert folds with numpy as XLA converts, bit for bit: in range,
    out of range (saturation), infinities and NaN, to every integer width. jax 0.12 gave the
    op's jax emitter numpy's wrap-around (int8(200.0) = -56): a user's naive int8
    quantization of a constant weight came out wrong."""
    import ml_dtypes
    from hlofuse.passes import constant_fold as cf
    dtype = {"f64": np.float64, "f32": np.float32, "f16": np.float16,
             "bf16": ml_dtypes.bfloat16}[src]
    with np.errstate(over="ignore"):
        x = np.array(_TO_INT_EDGES).astype(dtype)
    n = x.size
    t = f"tensor<{n}x{src}>"
    bodies = [f"stablehlo.convert %a : ({t}) -> tensor<{n}x{to}>"
              for to in ("i8", "ui8", "i16", "ui16", "i32", "ui32", "i64", "ui64")]
    ops, _modules = _ops_of(bodies, t)
    _assert_numpy_is_jax(bodies, ops, x, x)


TO_INT8 = """
func.func @main(%x: tensor<8xf32>) -> tensor<8xf32> {
  %w = stablehlo.constant dense<[-3.0e+02, -1.29e+02, 1.276e+02, 2.0e+02, 0x7F800000, 0xFF800000, 0x7FC00000, 3.0e+09]> : tensor<8xf32>
  %q = stablehlo.convert %w : (tensor<8xf32>) -> tensor<8xi8>
  %f = stablehlo.convert %q : (tensor<8xi8>) -> tensor<8xf32>
  %y = stablehlo.add %x, %f : tensor<8xf32>
  return %y : tensor<8xf32>
}"""


def test_out_of_range_int8_quantization_of_a_constant_folds_to_xlas_values():
    o = optimize(TO_INT8)
    assert stats(o)["folded"] >= 1 and "stablehlo.convert" not in o.text
    x = np.zeros(8, np.float32)
    want = run_module(TO_INT8, [x])
    assert_same(run_module(o.text, [x]), want, "exact")
    np.testing.assert_array_equal(np.asarray(want[0] if isinstance(want, (list, tuple)) else want),
                                  [-128, -128, 127, 127, 127, -128, 0, 127])


RESIZE_INDEX = """
func.func @main(%x: tensor<4x32xf32>) -> tensor<4x32xf32> {
  %i = stablehlo.iota dim = 0 : tensor<32xf32>
  %h = stablehlo.constant dense<0.5> : tensor<32xf32>
  %s = stablehlo.constant dense<2.0> : tensor<32xf32>
  %a = stablehlo.add %i, %h : tensor<32xf32>
  %d = stablehlo.divide %a, %s : tensor<32xf32>
  %f = stablehlo.floor %d : tensor<32xf32>
  %q = stablehlo.sqrt %f : tensor<32xf32>
  %b = stablehlo.broadcast_in_dim %q, dims = [1] : (tensor<32xf32>) -> tensor<4x32xf32>
  %y = stablehlo.multiply %x, %b : tensor<4x32xf32>
  return %y : tensor<4x32xf32>
}"""


def test_float_index_arithmetic_folds_without_xla_compiles():
    """An image resize's index arithmetic (iota, add, divide, floor) and an attention scale's
    sqrt fold with numpy: no per-op XLA compilation (each cost ~30 ms of a first call)."""
    o, compiles = _optimize_counting_compiles(RESIZE_INDEX)
    assert stats(o)["folded"] >= 1 and "stablehlo.sqrt" not in o.text
    assert compiles == []
    x = np.arange(128, dtype=np.float32).reshape(4, 32)
    assert_same(run_module(o.text, [x]), run_module(RESIZE_INDEX, [x]), "exact")


def test_float_op_with_a_subnormal_result_is_not_folded():
    """1e-20 * 1e-20 is subnormal in f32: XLA:CPU flushes it to zero at run time, XLA's own
    folding does not; the multiply is left alone, with numpy as with the jax emitter."""
    from hlofuse.passes import constant_fold as cf
    from hlofuse.core import ir as hir
    m = hir.parse("func.func @main(%a: tensor<2xf32>) -> () {\n"
                  "  %r = stablehlo.multiply %a, %a : tensor<2xf32>\n  return\n}")
    op = hir.block_ops(hir.main_func(m).regions[0].blocks[0])[0]
    assert cf._subnormal_risk(op, [np.array([1e-20, 1.0], np.float32)] * 2)
    assert not cf._subnormal_risk(op, [np.array([1e-15, 1.0], np.float32)] * 2)


def test_a_folded_transcendental_is_xla_cpus_run_time_value():
    """The pass docstring's invariant: tanh of constants folds to what XLA:CPU's compiled code
    computes for it (bit for bit), which is within ``kernel`` of jax.jit's program, whose
    compile-time folding (XLA's HLO evaluator) differs by a few ulp (adversarial round)."""
    import jax
    import jax.numpy as jnp
    c = np.linspace(-3, 3, 256, dtype=np.float32)
    text = ("func.func @main(%x: tensor<256xf32>) -> tensor<256xf32> {\n"
            f"  %c = stablehlo.constant dense<{np.array2string(c, separator=', ', threshold=1 << 20, floatmode='unique')}> : tensor<256xf32>\n"
            "  %t = stablehlo.tanh %c : tensor<256xf32>\n"
            "  %y = stablehlo.add %x, %t : tensor<256xf32>\n"
            "  return %y : tensor<256xf32>\n}")
    o = optimize(text)
    assert stats(o)["folded"] >= 1 and "stablehlo.tanh" not in o.text
    x = np.zeros(256, np.float32)
    got = np.asarray(run_module(o.text, [x])[0])
    run_time = np.asarray(jax.jit(lambda a: jnp.tanh(a) + x)(jax.device_put(c)))
    np.testing.assert_array_equal(got, run_time)
    assert_same(got, np.asarray(run_module(text, [x])[0]), "kernel")
