"""row-gather-scatter: per-row gathers/scatters (cross-entropy labels) as row-view ops.

The pass is exact: its output module runs bit-identically to its input (NaN fill of
out-of-range labels included). End to end, the cross-entropy forward + backward then becomes one
reduction kernel (logsumexp once, no gather, no scatter, no second (rows, vocab) tensor), whose
gpu/tpu blocks are checked in interpret mode. No-match cases say why.
"""

import numpy as np
import pytest

import jax
import jax.numpy as jnp

import hlofuse
from hlofuse.kernels import FAMILIES
from hlofuse.runtime.testing import assert_same
from hlofuse.runtime.execute import run_module
from tests.fusion_util import PREFIX, check_kernel_everywhere, kernels, outline
from hlofuse.runtime.testing import ALL_KERNELS

R = np.random.default_rng(5)
ON = "row-gather-scatter{on_cpu=true}"          # off on cpu by default (measured slower there)
ON_OPTS = {"row-gather-scatter": {"on_cpu": True}}
ROWS, VOCAB = 16, 200


def xent_take(logits, labels):
    lp = jax.nn.log_softmax(logits)
    return -jnp.take_along_axis(lp, labels[:, None], -1).mean()


def xent_optax(logits, labels):  # optax.softmax_cross_entropy_with_integer_labels, as written there
    lse = jax.nn.logsumexp(logits, axis=-1)
    return (lse - jnp.take_along_axis(logits, labels[:, None], -1)[:, 0]).mean()


def xent_onehot(logits, labels):
    return -(jax.nn.one_hot(labels, logits.shape[-1]) * jax.nn.log_softmax(logits)).sum(-1).mean()


def _args(dtype=np.float32, rows=ROWS, vocab=VOCAB):
    logits = (R.standard_normal((rows, vocab)) * 3).astype(dtype)
    labels = R.integers(0, vocab, rows).astype(np.int32)
    return logits, labels


def _stats(report, name="row-gather-scatter"):
    recs = [p for p in report.passes if p.name == name]
    assert recs, [p.name for p in report.passes]
    return recs[-1].stats


def _pass_only(fn, args):
    """(module text before, optimized result after) of the pass alone on ``fn``'s program."""
    text = jax.jit(fn).lower(*args).as_text()
    before = hlofuse.optimize(text, pipeline=PREFIX).text
    return before, hlofuse.optimize(before, pipeline=ON)


def test_pass_is_exact_and_fires_on_cross_entropy_grad():
    logits, labels = _args()
    labels[0], labels[1] = VOCAB + 3, -2          # out of range: NaN fill / wrap-around, as jnp does
    step = jax.value_and_grad(xent_take)
    before, after = _pass_only(step, (logits, labels))
    st = _stats(after.report)
    assert st["gather"] == 1 and st["scatter"] == 1 and st["degenerate_reduce"] >= 1, st
    assert "stablehlo.gather" not in after.text and "stablehlo.scatter" not in after.text
    ins = [logits, labels]
    assert_same(run_module(after.text, ins), run_module(before, ins), "exact")
    # rerun: nothing left to rewrite, same text
    again = hlofuse.optimize(after.text, pipeline=ON)
    assert not any(v for k, v in _stats(again.report).items() if not k.startswith("refused")), _stats(again.report)
    assert again.text == after.text


_NARROW_GATHER = """
func.func @main(%z: tensor<8xVxf32>, %y: tensor<8x1x1xIT>) -> (tensor<8x1xf32>, tensor<8xf32>) {
  %e = stablehlo.exponential %z : tensor<8xVxf32>
  %c0 = stablehlo.constant dense<0.0> : tensor<f32>
  %s = stablehlo.reduce(%e init: %c0) applies stablehlo.add across dimensions = [1] : (tensor<8xVxf32>, tensor<f32>) -> tensor<8xf32>
  %g = "stablehlo.gather"(%e, %y) <{dimension_numbers = #stablehlo.gather<collapsed_slice_dims = [1], operand_batching_dims = [0], start_indices_batching_dims = [0], start_index_map = [1], index_vector_dim = 2>, indices_are_sorted = false, slice_sizes = array<i64: 1, 1>}> : (tensor<8xVxf32>, tensor<8x1x1xIT>) -> tensor<8x1xf32>
  return %g, %s : tensor<8x1xf32>, tensor<8xf32>
}"""

_NARROW_SCATTER = """
func.func @main(%x: tensor<8xVxf32>, %y: tensor<8x1x1xIT>, %u: tensor<8x1xf32>) -> tensor<8xVxf32> {
  %e = stablehlo.exponential %x : tensor<8xVxf32>
  %r = "stablehlo.scatter"(%e, %y, %u) <{indices_are_sorted = false, unique_indices = false, scatter_dimension_numbers = #stablehlo.scatter<inserted_window_dims = [1], input_batching_dims = [0], scatter_indices_batching_dims = [0], scatter_dims_to_operand_dims = [1], index_vector_dim = 2>}> ({
  ^bb0(%a: tensor<f32>, %b: tensor<f32>):
    %t = stablehlo.add %a, %b : tensor<f32>
    stablehlo.return %t : tensor<f32>
  }) : (tensor<8xVxf32>, tensor<8x1x1xIT>, tensor<8x1xf32>) -> tensor<8xVxf32>
  return %r : tensor<8xVxf32>
}"""


@pytest.mark.parametrize("itype,vocab,labels", [
    ("i8", 200, [5, 100, 127, -100, 0, -1, 126, -128]),
    ("i16", 40000, [5, 32767, -32768, 0, 1, -1, 20000, 39])])
def test_narrow_index_types_are_widened_for_the_column_match(itype, vocab, labels):
    """i8 indices over 200 columns (i16 over 40000): the column iota and the clamp bound V-1
    were built in the index type and wrapped (the bound 199 became -57, so every row read
    column 199; a scattered -100 matched the wrapped column 156; adversarial round). The
    indices are widened to i32 first."""
    rng = np.random.default_rng(3)
    z = rng.standard_normal((8, vocab)).astype(np.float32)
    y = np.array(labels, {"i8": np.int8, "i16": np.int16}[itype]).reshape(8, 1, 1)
    u = np.full((8, 1), 1000.0, np.float32)
    for text, ins, kind in ((_NARROW_GATHER, [z, y], "gather"),
                            (_NARROW_SCATTER, [z, y, u], "scatter")):
        text = text.replace("xV", f"x{vocab}").replace("xIT", f"x{itype}")
        after = hlofuse.optimize(text, pipeline=ON)
        assert _stats(after.report)[kind] == 1, _stats(after.report)
        assert_same(run_module(after.text, ins), run_module(text, ins), "exact")


@pytest.mark.parametrize("loss", [xent_take, xent_onehot], ids=["take_along_axis", "one_hot"])
@pytest.mark.parametrize("dtype", [np.float32, jnp.bfloat16], ids=["f32", "bf16"])
def test_cross_entropy_fwd_bwd_is_one_row_kernel(loss, dtype):
    logits, labels = _args(dtype)
    step = jax.value_and_grad(loss)
    f = hlofuse.jit(step, target="cpu", autotune=False, options=ON_OPTS)
    rep = f.report(logits, labels)
    # logsumexp, the loss rows and d(logits) in one kernel over the (rows, vocab) logits (the
    # one_hot form's mean over the rows may be a second, (1, rows) kernel)
    red = [k for k in kernels(rep, "reduction") if k.extra["view"] == f"{ROWS}x{VOCAB}"]
    assert len(red) == 1, rep
    assert red[0].extra["pattern"] == "log-softmax"
    # no separate pass over the (rows, vocab) gradient (the labels' bounds checks are (rows, 1))
    assert all(k.bytes_fused < ROWS * VOCAB for k in kernels(rep, "elementwise")), rep
    text = f.lower(logits, labels).as_text()
    assert "stablehlo.gather" not in text and "stablehlo.scatter" not in text
    got, want = f(logits, labels), jax.jit(step)(logits, labels)
    if dtype is not np.float32:
        # one_hot's f32 promotes the loss, but it is computed from bf16 log-probabilities (hlofuse
        # and jax.jit round them at different points, as without this pass): compare at bf16
        got, want = (jax.tree.map(lambda a: a.astype(dtype), t) for t in (got, want))
    assert_same(got, want, "grad")


def test_cross_entropy_region_on_gpu_and_tpu_blocks():
    from hlofuse.kernels.tiling import RowBlocks
    logits, labels = _args(rows=24, vocab=100)
    # constant-fold as in the default pipeline (a kernel body holding negate(constant) does not
    # lower to Triton: jax 0.10.2 lowers the literal to a numpy value)
    keep = outline(jax.value_and_grad(xent_take), (logits, labels),
                   f"constant-fold,algebraic-simplify,{ON},fuse-reduction")
    (fn,) = keep.funcs("reduction")
    used = check_kernel_everywhere(fn, FAMILIES["reduction"], category="reassociate",
                                   gpu_blocks=RowBlocks("gpu", 24, 100, 8, 128),
                                   tpu_blocks=RowBlocks("tpu", 24, 100, 8, 100))
    assert used["gpu"].padded and used["gpu"].grid == (3,) and used["tpu"].grid == (3,)


def test_no_match_reasons():
    logits, labels = _args()
    # optax's loss gathers from the logits themselves: already in memory, the gather stays
    _, after = _pass_only(jax.value_and_grad(xent_optax), (logits, labels))
    st = _stats(after.report)
    assert st["gather"] == 0 and st["scatter"] == 1, st
    assert any("materialized anyway" in k for k in st), st
    assert "stablehlo.gather" in after.text
    # two labels per row: the scatter may add twice into one element, the gather is not one per row
    two = R.integers(0, VOCAB, (ROWS, 2)).astype(np.int32)
    fn = jax.value_and_grad(lambda z, y: -jnp.take_along_axis(jax.nn.log_softmax(z), y, -1).mean())
    before, after = _pass_only(fn, (logits, two))
    st = _stats(after.report)
    assert st["gather"] == 0 and st["scatter"] == 0, st
    assert st.get("refused[not one index per row]") == 2, st
    assert any("not one index per row" in n for n in after.report.notes), after.report.notes
    assert "stablehlo.gather" in after.text and "stablehlo.scatter" in after.text
    # a gather whose rows no reduction reads: left alone
    fn = lambda z, y: jnp.take_along_axis(jnp.tanh(z), y[:, None], -1)  # noqa: E731
    _, after = _pass_only(fn, (logits, labels))
    st = _stats(after.report)
    assert st["gather"] == 0 and any("no row reduction" in k for k in st), st


def test_pass_disabled_by_option_keeps_the_program():
    logits, labels = _args()
    text = jax.jit(jax.value_and_grad(xent_take)).lower(logits, labels).as_text()
    before = hlofuse.optimize(text, pipeline=PREFIX).text
    after = hlofuse.optimize(before, pipeline="row-gather-scatter{on_cpu=true,gather=false,scatter=false,"
                                              "degenerate=false}")
    assert after.text == before


def test_off_on_cpu_by_default_and_says_why():
    logits, labels = _args()
    step = jax.value_and_grad(xent_take)
    text = jax.jit(step).lower(logits, labels).as_text()
    before = hlofuse.optimize(text, pipeline=PREFIX).text
    after = hlofuse.optimize(before, pipeline="row-gather-scatter")
    assert after.text == before and _stats(after.report)["off_on_cpu"] == 1
    assert any("off on cpu by default" in n for n in after.report.notes), after.report.notes
    # gpu: on by default (the row fits a gpu row kernel)
    gpu = hlofuse.jit(step, target="gpu", options=ALL_KERNELS).lower(logits, labels)
    assert _stats(gpu.report)["gather"] == 1 and len(kernels(gpu.report, "reduction")) >= 1
