"""Differential fuzzing: random StableHLO DAGs -> hlofuse pipeline -> same numbers, idempotent.

Each example is a random straight-line program (:func:`hlofuse.runtime.testing.stablehlo_graphs`:
elementwise, broadcast, reduce, dot_general, transpose, reshape, select, convert, concatenate,
slice over f32/bf16/f16/i32/bool, with ±inf/NaN/-0/subnormal/huge constants and inputs), checked
by :func:`hlofuse.runtime.verify.check_graph`: the optimized module verifies, gives the unoptimized
module's results (kernel tolerance; ints and bools exact), and a second run of the pipeline over
it changes nothing. Every third CPU example also runs the per-region verifier (no rollback may
happen on a correct pipeline). gpu/tpu examples lower only (no device here) and verify their
kernels in Pallas interpret mode.

The default ``python -m pytest`` runs a small fixed, derandomized budget (30 cpu examples, 8 per
accelerator target); the ``long`` cases (deselected by default, run by CI's ``newest: long
tests`` step with ``-m long``) run 400 cpu examples and 40 per accelerator. A longer run:

    HLOFUSE_FUZZ_EXAMPLES=10000 python -m pytest tests/test_fuzz.py -x -q

(the quick cases at that budget; gpu and tpu get a tenth of it each). A failing example prints its program
(``spec.source()``); each bug found keeps a regression test at the end of this file. To collect
every failure of a long run instead of stopping at the first:

    python tests/fuzz_long.py --examples 10000 --out fuzz.jsonl [--target gpu] [--minutes 40]
"""

import collections
import os

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings

import jax
import jax.numpy as jnp
from jax import lax

import hlofuse
from hlofuse.core import ir as hir
from hlofuse.passes.kernel_table import kernel_funcs
from hlofuse.runtime.testing import GraphSpec, Node, stablehlo_graphs
from hlofuse.runtime.verify import check_graph

EXAMPLES = int(os.environ.get("HLOFUSE_FUZZ_EXAMPLES", "30"))
LONG_EXAMPLES = max(EXAMPLES, 400)
FUZZ = settings(max_examples=EXAMPLES, deadline=None, derandomize=True, database=None,
                suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large,
                                       HealthCheck.filter_too_much])
#: (budget, pytest marks): the default run's and the long step's
BUDGETS = [pytest.param(EXAMPLES, id="quick"),
           pytest.param(LONG_EXAMPLES, id="long", marks=pytest.mark.long)]


def _report(spec, e):
    return f"{e}\n--- program ---\n{spec.source()}"


@pytest.mark.parametrize("examples", BUDGETS)
def test_random_graphs_cpu(examples):
    @settings(FUZZ, max_examples=examples)
    @given(stablehlo_graphs())
    def run(spec):
        try:
            check_graph(spec, target="cpu", verify=spec.seed % 3 == 0)
        except AssertionError as e:
            raise AssertionError(_report(spec, e)) from None

    run()


@pytest.mark.parametrize("examples", BUDGETS)
@pytest.mark.parametrize("target", ["gpu", "tpu"])
def test_random_graphs_lower_for_accelerators(target, examples):
    @settings(FUZZ, max_examples=max(8, examples // 10))
    @given(stablehlo_graphs())
    def run(spec):
        try:
            check_graph(spec, target=target, verify=True)
        except AssertionError as e:
            raise AssertionError(_report(spec, e)) from None

    run()


def test_generator_covers_every_op_kind_and_feeds_the_fusion_passes():
    """The fuzzer is not vacuous: it draws every op kind and dtype, and its graphs make regions."""
    ops, dtypes, regions = collections.Counter(), collections.Counter(), []

    @settings(max_examples=60, deadline=None, derandomize=True, database=None)
    @given(stablehlo_graphs())
    def draw(spec):
        ops.update(n.op for n in spec.nodes)
        dtypes.update(d for _, d in spec.inputs)
        exp = jax.export.export(jax.jit(spec.build()), platforms=["cpu"])(*spec.avals())
        opt = hlofuse.optimize(exp.mlir_module(), pipeline="inline-calls,canonicalize,cse,fuse-elementwise")
        regions.append(len(opt.report.regions))

    draw()
    assert set(ops) >= {"const", "unary", "binary", "compare", "select", "convert", "broadcast", "reduce",
                        "dot", "transpose", "reshape", "concat", "slice"}, ops
    assert set(dtypes) == {"f32", "bf16", "f16", "i32", "i1"}, dtypes
    assert sum(r > 0 for r in regions) >= len(regions) // 4, regions


def test_fuzz_oracle_catches_a_wrong_kernel(monkeypatch):
    """check_graph fails when a kernel is wrong (the oracle can fail)."""
    from hlofuse.core import ops
    from hlofuse.passes import kernelize
    monkeypatch.setattr(kernelize, "_CACHE", {})
    monkeypatch.setitem(ops.RULES, "stablehlo.add", ops.OpRule(ops.OpClass.ELEMENTWISE, lambda op, a, b: a - b))
    spec = GraphSpec(inputs=(((4, 8), "f32"), ((4, 8), "f32")),
                     nodes=(Node("binary", (0, 1), ("add",)), Node("unary", (2,), ("tanh",))),
                     outputs=(3,), seed=3)
    with pytest.raises(AssertionError, match="differ"):
        check_graph(spec)
    with pytest.raises(AssertionError, match="verification rolled back"):
        check_graph(spec, verify=True)


# ---------------------------------------------------------------------------------------------
# Regression tests: one per bug the fuzzer (or the tests around it) found
# ---------------------------------------------------------------------------------------------

def _text(f, *args):
    return jax.jit(f).lower(*args).as_text()


def test_regression_rerun_does_not_inline_or_refuse_kernels():
    """Bug 1: a second run inlined the kernel functions (inline-calls), re-fused their
    interpret-mode loop bodies into new kernels, and cse rewrote the kernels' insides."""
    x = jnp.ones((8, 128))
    text = _text(lambda x, y: (jnp.tanh(x * 2.0 + y) * y - 1.0, (x + y).sum()), x, x)
    opt = hlofuse.optimize(text)
    assert opt.report.kernels
    again = hlofuse.optimize(opt.text)
    assert again.text == opt.text and not again.report.kernels


def test_regression_rerun_with_regions_left_to_xla():
    """Bug 2: kernelize looked up region ids of an earlier run in the new (empty) report and
    failed (PassFailure: IndexError); regions left to XLA are now marked and skipped."""
    x = jnp.ones((8, 128))
    text = _text(lambda x, y: jnp.tanh(x * 2.0 + y) * y, x, x)
    opt = hlofuse.optimize(text, options={"no_kernels": True})
    assert opt.report.regions and not opt.report.kernels and "hlofuse.xla" in opt.text
    for options in ({"no_kernels": True}, {}):
        again = hlofuse.optimize(opt.text, options=options)
        assert again.text == opt.text


T = "tensor<8x128xf32>"
EARLIER = f"""module {{
  func.func public @main(%a: {T}, %b: {T}) -> ({T}, {T}, {T}) {{
    %0 = call @hlofuse_region_0(%a, %b) : ({T}, {T}) -> {T}
    %1 = call @hlofuse_k0_main(%a) : ({T}) -> {T}
    %2 = stablehlo.multiply %a, %b : {T}
    %3 = stablehlo.tanh %2 : {T}
    %4 = stablehlo.add %3, %a : {T}
    return %0, %1, %4 : {T}, {T}, {T}
  }}
  func.func private @hlofuse_region_0(%x: {T}, %y: {T}) -> {T} attributes {{hlofuse.kind = "elementwise", hlofuse.region = 0 : i64, hlofuse.xla = "left to XLA"}} {{
    %0 = stablehlo.subtract %x, %y : {T}
    %1 = stablehlo.exponential %0 : {T}
    return %1 : {T}
  }}
  func.func private @hlofuse_k0_main(%x: {T}) -> {T} {{
    %0 = stablehlo.negate %x : {T}
    return %0 : {T}
  }}
}}"""


def test_regression_outlining_and_kernels_never_reuse_a_symbol():
    """Bug 3: in a module optimized before, a new region 0 was outlined as
    ``hlofuse_region_0`` and its kernel imported as ``hlofuse_k0_*`` although both names were
    taken (region ids restart at 0 per run): duplicate symbols, a failing pipeline. Now both
    get a suffix; the old region (left to XLA) and the old kernel are untouched."""
    from hlofuse.runtime.execute import run_module
    from hlofuse.runtime.testing import assert_same, random_inputs
    opt = hlofuse.optimize(EARLIER)
    hir.verify(opt.module)
    names = {hir.func_name(f) for f in hir.funcs(opt.module)}
    assert {"hlofuse_region_0", "hlofuse_k0_main", "hlofuse_k0_1_main"} <= names
    (region,) = opt.report.regions
    assert region.kernel and kernel_funcs(opt.module)[region.id].symbol == "hlofuse_k0_1_main"
    inputs = random_inputs([jax.ShapeDtypeStruct((8, 128), np.float32)] * 2, 0)
    assert_same(run_module(opt.module, inputs), run_module(EARLIER, inputs))
    assert hlofuse.optimize(opt.text).text == opt.text


def test_edge_value_constants_survive_kernels_bit_exactly():
    """Every edge constant the fuzzer draws (-0, NaN, ±inf, subnormals, largest finite) goes
    through a kernel bit-exactly, in each float dtype, on edge-salted inputs."""
    from hlofuse.runtime.testing import edge_values
    for dt in ("f32", "bf16", "f16"):
        values = [float(v) for v in edge_values(hir.np_dtype(dt))]
        nodes, outs = [], []
        for v in values:  # out_k = -(x * c_k + x), one multi-output region
            c = 1 + len(nodes)
            nodes += [Node("const", (), (v, (4, 8), dt)), Node("binary", (0, c), ("mul",)),
                      Node("binary", (c + 1, 0), ("add",)), Node("unary", (c + 2,), ("neg",))]
            outs.append(c + 3)
        spec = GraphSpec(inputs=(((4, 8), dt),), nodes=tuple(nodes), outputs=tuple(outs), seed=5, edge=True)
        opt = check_graph(spec, category="exact")
        assert opt.report.kernels and not opt.report.left_to_xla


def test_regression_no_pass_rewrites_hlofuse_functions():
    """Bug 4: cleanups added to the pipeline (constant-fold, algebraic-simplify) rewrote the
    imported kernel functions on a second run (folded the interpret-mode loop's constants,
    dropped no-op converts). Every pass of the default pipeline, run alone over the pipeline's
    output, must now change nothing."""
    x = jnp.ones((4, 8))
    text = _text(lambda x, y: (jnp.tanh(x - y) * 2.0, jnp.exp(y) + x), x, x)
    opt = hlofuse.optimize(text, options={})
    assert opt.report.kernels
    for name in dict.fromkeys(hlofuse.core.pipeline.resolve_pipeline("default")):
        again = hlofuse.optimize(opt.text, pipeline=[name])
        assert again.text == opt.text, f"pass {name} changed the optimized module"


def test_regression_interpret_mode_check_of_constant_only_kernel_values():
    """Bug 5 (fuzz, gpu target): the interpret-mode check evaluated the rebuilt kernel eagerly
    (``ensure_compile_time_eval``), so values computed from literals alone became captured
    constants and Pallas refused the kernel -> a false rollback. Now lowered and run by XLA."""
    spec = GraphSpec(inputs=(((1,), "f32"),),
                     nodes=(Node("convert", (0,), ("i1",)), Node("convert", (1,), ("f32",)),
                            Node("select", (1, 0, 2), ())),
                     outputs=(1, 2, 3), seed=0)
    for target in ("gpu", "tpu"):
        opt = check_graph(spec, target=target, verify=True)
        assert opt.report.kernels and all("interpret" in r.extra["verify"] for r in opt.report.kernels)


@pytest.mark.parametrize("spec", [
    # select(false, x, 0) -> 0 (algebraic-simplify) exposed shift_right_logical(2, 0) to folding
    GraphSpec(inputs=(((), "i1"), ((), "f32")),
              nodes=(Node("convert", (0,), ("i32",)), Node("const", (), (False, (), "i1")),
                     Node("convert", (3,), ("i32",)), Node("select", (3, 2, 4), ()),
                     Node("const", (), (2, (), "i32")), Node("binary", (6, 5), ("shift_right_logical",)),
                     Node("unary", (6,), ("clz",))),
              outputs=(2, 7, 8), seed=18, edge=True),
    # the second cse merged two folded constants, exposing or(c, c) after simplification ran
    GraphSpec(inputs=(((8, 128), "i1"),),
              nodes=(Node("const", (), (True, (16, 128), "i1")), Node("transpose", (1,), ((1, 0),)),
                     Node("const", (), (True, (128, 16), "i1")), Node("binary", (3, 2), ("bitwise_or",)),
                     Node("unary", (0,), ("bitwise_not",))),
              outputs=(1, 4, 5), seed=4),
    # select(false, x, 0.0) -> 0.0 exposed max(convert(0.0), -0.0) to the folder
    GraphSpec(inputs=(((130, 5), "f16"), ((130, 5), "f32"), ((), "f32")),
              nodes=(Node("const", (), (-0.0, (130, 5), "f32")), Node("binary", (3, 1), ("mul",)),
                     Node("const", (), (False, (), "i1")), Node("convert", (5,), ("f32",)),
                     Node("select", (5, 2, 6), ()), Node("convert", (7,), ("bf16",)),
                     Node("const", (), (-0.0, (), "bf16")), Node("binary", (8, 9), ("max",))),
              outputs=(3, 4, 10), seed=80),
], ids=["fold-after-simplify", "simplify-after-cse", "fold-signed-zero-after-simplify"])
def test_regression_cleanups_reach_a_fixed_point(spec):
    """Bug 6 (long fuzz run): constant-fold and algebraic-simplify ran once each, before the
    second cse, so a second run of the pipeline still folded/simplified what they exposed.
    The default pipeline now runs the pair again after that cse."""
    check_graph(spec, verify=False)


@pytest.mark.parametrize("dt", ["f32", "bf16", "f16"])
def test_regression_constant_fold_keeps_subnormals(dt):
    """Bug 7 (long fuzz run): constant-fold evaluated on the CPU runtime, which flushes
    subnormals to zero, while XLA folds the unoptimized program's constants without flushing:
    sign(-1e-40) became -0 instead of -1, and tiny * 0.01 became 0 instead of a subnormal.
    Such ops are now left for XLA to fold."""
    npdt = hir.np_dtype(dt)
    import ml_dtypes
    info = ml_dtypes.finfo(npdt)
    sub, tiny = float(info.smallest_subnormal), float(info.tiny)
    spec = GraphSpec(inputs=(((4,), dt),),
                     nodes=(Node("const", (), (-sub, (4,), dt)), Node("unary", (1,), ("sign",)),
                            Node("const", (), (tiny, (4,), dt)), Node("const", (), (0.25, (4,), dt)),
                            Node("binary", (3, 4), ("mul",)),           # exact result: subnormal
                            Node("binary", (0, 2), ("add",)), Node("binary", (6, 5), ("add",))),
                     outputs=(2, 5, 7), seed=1)
    check_graph(spec, category="exact")


def test_regression_layout_assignment_does_not_oscillate():
    """Bug 8 (long fuzz run): layout-assignment sank the transpose of lt(x, transpose(x))
    counting that very transpose as reusable for the other operand (the permutation is its own
    inverse), so each run flipped lt(x, T(x)) <-> T(lt(T(x), x)) and added a copy."""
    spec = GraphSpec(inputs=(((17, 17), "i32"),),
                     nodes=(Node("transpose", (0,), ((1, 0),)), Node("compare", (0, 1), ("lt",))),
                     outputs=(2,), seed=351, edge=True)
    opt = check_graph(spec)
    assert opt.text.count("stablehlo.transpose") == 1


def test_regression_folding_never_hands_xla_a_constant_division_by_zero(tmp_path):
    """Bug 9 (long fuzz run: the process died with SIGFPE): XLA's own constant folder traps on
    an integer divide/remainder of two constants with a zero divisor, but XLA cannot fold
    clz/popcnt, so div(clz(5), 0) runs (x/0 = -1). constant-fold folded clz(5) for another
    user and left div(29, 0): the optimized program killed the process when compiled."""
    import subprocess
    import sys
    c5 = np.int32(5)
    text = _text(lambda x: (lax.div(lax.clz(c5), np.int32(0)), lax.rem(lax.population_count(c5), np.int32(0)),
                            lax.clz(c5) + x, lax.population_count(c5) * x), np.int32(4))
    opt = hlofuse.optimize(text)
    (tmp_path / "orig.mlir").write_text(text)
    (tmp_path / "opt.mlir").write_text(opt.text)
    child = ("import sys, numpy as np\nfrom hlofuse.runtime.execute import run_module\n"
             "for p in sys.argv[1:]:\n"
             "    print([int(v) for v in run_module(open(p).read(), [np.int32(4)])], flush=True)\n")
    p = subprocess.run([sys.executable, "-c", child, str(tmp_path / "orig.mlir"), str(tmp_path / "opt.mlir")],
                       capture_output=True, text=True, timeout=300, env=dict(os.environ, JAX_PLATFORMS="cpu"))
    assert p.returncode == 0, f"exit {p.returncode} (a signal is negative): {p.stderr[-1500:]}"
    want, got = p.stdout.splitlines()
    assert got == want == "[-1, 2, 33, 8]", p.stdout  # x/0 = -1, x%0 = x at run time


def test_regression_x_divided_by_itself_is_what_jax_jit_gives():
    """Bug 11 (long fuzz run): ``div(x, x)`` with x = 0 is 1 under jax 0.12's jax.jit (XLA
    simplifies x / x to 1) and -1 under 0.10.2's (run: x / 0 = -1); the H9 guard wrote the
    division out with XLA's run-time values, which XLA can no longer simplify, so hlofuse gave
    -1 on 0.12. A division of a value by itself is left unguarded (nothing folds it to a
    constant zero divisor)."""
    spec = GraphSpec(inputs=(((1, 8), "i32"),),
                     nodes=(Node("binary", (0, 0), ("div",)),
                            Node("broadcast", (0,), ((2, 1, 8), (1, 2))),
                            Node("broadcast", (1,), ((2, 1, 8), (1, 2))),
                            Node("binary", (3, 2), ("bitwise_xor",)),
                            Node("binary", (0, 0), ("rem",))),
                     outputs=(4, 5), seed=967, edge=False)
    check_graph(spec)
    x = np.array([0, 1, -3, 5, 0, 2, 7, 0], np.int32)
    f = lambda v: (lax.div(v, v), lax.rem(v, v))   # noqa: E731
    got = hlofuse.jit(f, tiered=False, autotune=False)(x)
    for g, w in zip(got, jax.jit(f)(x)):
        np.testing.assert_array_equal(np.asarray(g), np.asarray(w))


def test_regression_the_second_cleanup_runs_until_stable():
    """Bug 12 (long fuzz run, seed 1207): the second cleanup's algebraic-simplify turned a
    select of two equal converts into ``min(broadcast(1.0), 1.0)`` after the last
    constant-fold, so a second run of the pipeline folded it (not idempotent). The pass
    manager now runs that cse / constant-fold / algebraic-simplify group again until a round
    changes nothing (``hlofuse.core.pipeline.UNTIL_STABLE``)."""
    spec = GraphSpec(inputs=(((4, 3, 2), "bf16"),), nodes=(
        Node("convert", (0,), ("i1",)), Node("convert", (1,), ("bf16",)),
        Node("select", (1, 0, 2), ()), Node("const", (), (9.183549615799121e-41, (4, 3, 2), "bf16")),
        Node("binary", (4, 3), ("rem",)), Node("binary", (3, 4), ("div",)),
        Node("const", (), (1.0, (4, 3, 2), "bf16")), Node("binary", (7, 4), ("add",)),
        Node("convert", (7,), ("f32",)), Node("convert", (9,), ("bf16",)),
        Node("binary", (10, 8), ("min",)), Node("convert", (10,), ("f32",)),
        Node("select", (1, 9, 12), ()), Node("slice", (12,), ((2, 1, 1), (4, 2, 2), (2, 1, 1))),
        Node("unary", (4,), ("sqrt",)), Node("concat", (3, 8), (0,)),
        Node("broadcast", (13,), ((3, 4, 3, 2), (1, 2, 3))),
        Node("const", (), (1.0, (3, 4, 3, 2), "f32")), Node("binary", (17, 18), ("min",)),
        Node("const", (), (-0.0, (4, 3, 2), "bf16")), Node("binary", (20, 11), ("min",))),
        outputs=(7, 8, 10, 19, 21), seed=107, edge=False)
    opt = check_graph(spec)   # asserts that a second run changes nothing
    assert [p.name for p in opt.report.passes].count("algebraic-simplify") >= 3


def test_regression_layout_assignment_survives_erased_handles():
    """Bug 10 (long fuzz run): layout-assignment asked graph_util.alive() about a transpose
    erased through that very handle; reading its address raised "the operation has been
    invalidated" and the pass failed (PassFailure; hlofuse.jit fell back to unoptimized)."""
    spec = GraphSpec(
        inputs=(((4, 2), "f32"),),
        nodes=(Node("unary", (0,), ("sqrt",)), Node("transpose", (1,), ((1, 0),)), Node("dot", (2, 2), ()),
               Node("convert", (2,), ("i1",)), Node("select", (4, 2, 2), ()), Node("transpose", (5,), ((1, 0),)),
               Node("const", (), (-3.4028234663852886e+38, (2, 4), "f32")), Node("compare", (5, 7), ("gt",)),
               Node("dot", (6, 1), ()), Node("unary", (7,), ("is_finite",)), Node("dot", (2, 9), ()),
               Node("convert", (10,), ("f32",)), Node("compare", (7, 12), ("ge",)),
               Node("slice", (11,), ((1, 3), (2, 4), (1, 2)))),
        outputs=(1, 3, 9, 10, 11, 14), seed=18083, edge=True)
    check_graph(spec)


def test_regression_interpret_mode_check_rounds_every_op_to_its_type():
    """Bug (long fuzz run, tpu target, seed 3737): the interpret-mode check compiled the
    rebuilt kernel with XLA's default excess precision. The kernel computes a bf16 divide and
    then tan in f32 from the divide's bf16 result; XLA dropped the convert pair in between, so
    tan read the unrounded f32 quotient. Near tan's poles one ulp of bf16 is 2-5% of the
    result: 372 of 2048 elements beyond bf16's tolerance, and a correct kernel was rolled back.
    Both sides now compile with every op rounded to its type, as Triton and Mosaic run it."""
    spec = GraphSpec(inputs=(((16, 128), "f16"),),
                     nodes=(Node("convert", (0,), ("bf16",)), Node("unary", (1,), ("log1p",)),
                            Node("const", (), (-1.0, (16, 128), "bf16")),
                            Node("binary", (3, 2), ("div",)), Node("unary", (4,), ("tan",))),
                     outputs=(2, 4, 5), seed=4)
    for target in ("tpu", "gpu"):
        opt = check_graph(spec, target=target, verify=True)
        assert opt.report.kernels and all("interpret" in r.extra["verify"] for r in opt.report.kernels)


def test_regression_a_more_accurate_16_bit_sum_is_kept():
    """Bug (long fuzz run, tpu target): a bf16 sum of 272 terms; the kernel accumulates in f32
    (0.2158), XLA's original in bf16 (0.2930), the exact sum is 0.2163. Cancellation puts
    XLA's value 35% off, beyond any tolerance relative to the result, and the better kernel
    was rolled back. A disagreement now also consults the region's float64 twin (its text with
    every float type f64, run by XLA: no hlofuse emitter in it), and the kernel stays when it
    is no farther from it than the original, element by element."""
    spec = GraphSpec(inputs=(((2, 17, 8), "bf16"),),
                     nodes=(Node("binary", (0, 0), ("min",)), Node("reshape", (1,), ((272,),)),
                            Node("reduce", (2,), ("add", (0,))), Node("const", (), (0.5, (), "bf16")),
                            Node("binary", (4, 3), ("mul",))),
                     outputs=(5,), seed=0)
    opt = check_graph(spec, target="tpu", verify=True)
    (k,) = opt.report.kernels
    assert k.kind == "reduction" and "interpret" in k.extra["verify"]


def test_regression_a_dot_that_keeps_an_overflowing_product_is_kept():
    """Bug (long fuzz run, gpu target, seed 6262): a bf16 ``dot(x, x.T)`` on edge inputs; one
    output element sums -inf with products past f32's range. XLA's original rounds each such
    product to +inf (+inf + -inf = NaN); the interpret-mode kernel's dot fuses the multiply
    and the add (exact product: -inf, the float64 value). The NaN rule ("a NaN on both sides")
    rolled the kernel back; the kernel may now hold the float64 value where the original
    overflowed to inf or NaN."""
    spec = GraphSpec(inputs=(((17, 17), "bf16"), ((17, 17), "f32")),
                     nodes=(Node("dot", (0, 0), ()), Node("convert", (2,), ("f32",)),
                            Node("binary", (3, 1), ("add",))),
                     outputs=(2, 4), seed=1)
    opt = check_graph(spec, target="gpu", verify=True)
    assert [k.kind for k in opt.report.kernels] == ["matmul_epilogue"]


def test_regression_an_int_from_a_more_accurate_16_bit_sum_is_kept():
    """Bug (long fuzz run, gpu target, seed 6262): an f16 sum of edge values (cancellation
    around 65504) divided by 2**-14 and converted to int32. The kernel sums in f32: 16400;
    XLA's f16 accumulation: 41344; the float64 evaluation: 16399. Integer outputs had to agree
    exactly, and the better kernel was rolled back. An integer may now be no farther from the
    float64 evaluation than the original's (exact where the region computes on integers)."""
    spec = GraphSpec(inputs=(((8,), "f16"),),
                     nodes=(Node("reduce", (0,), ("add", (0,))),
                            Node("const", (), (6.103515625e-05, (), "f16")),
                            Node("binary", (1, 2), ("div",)), Node("convert", (3,), ("i32",))),
                     outputs=(1, 4), seed=9)
    opt = check_graph(spec, target="gpu", verify=True)
    assert opt.report.kernels


def test_regression_constant_fold_folds_what_a_failed_fold_is_computed_from():
    """Bug (long fuzz run, tpu target): negate(reshape(c)) with a subnormal bf16 ``c``. The
    negate is not folded (the CPU that folds flushes subnormals), and neither was the reshape
    under it, so a second run of the pipeline folded reshape(c) where it fed a kernel: the
    pipeline was not idempotent. The producers of an op that fails to fold are folded now."""
    spec = GraphSpec(inputs=(((16, 16), "bf16"),),
                     nodes=(Node("unary", (0,), ("log",)), Node("compare", (1, 1), ("le",)),
                            Node("const", (), (-9.183549615799121e-41, (1, 1), "bf16")),
                            Node("unary", (3,), ("logistic",)), Node("reshape", (4,), ((1,),)),
                            Node("unary", (3,), ("neg",))),
                     outputs=(2, 5, 6), seed=3)
    for target in ("tpu", "cpu"):
        check_graph(spec, target=target, verify=True)
