"""Column-tiled row kernels (kernels/row_tiled.py): reduction regions whose rows exceed the
target's row budget, walked tile by tile with an online logsumexp.

Every case runs the gpu (Pallas interpret) and tpu (TPU interpret) kernels against the region
evaluated op by op with plain jnp (the unfused program), at small shapes with a small tile or a
small forced row budget, vocabularies not divisible by the tile (masked last tile), bf16 logits
(f32 accumulation), and rows of -inf / +inf; and asserts the tiled kernel ran (its blocks, its
pass count, the folded logsumexp).
"""

import dataclasses

import numpy as np
import pytest

import jax
import jax.numpy as jnp
from jax.experimental.pallas import tpu as pltpu

from hlofuse.core import chips
from hlofuse.kernels import FAMILIES
from hlofuse.kernels import row_tiled
from hlofuse.kernels.common import func_avals
from hlofuse.kernels.lowering import lower_to_text
from hlofuse.kernels.tiling import TiledRowBlocks, max_tiled_row_elems
from hlofuse.core.ops import EmitError
from hlofuse.core.target import Target
from hlofuse.runtime.testing import assert_same
from tests.fusion_util import func_inputs, outline

FAM = FAMILIES["reduction"]
R = np.random.default_rng(11)
CE_PASSES = "constant-fold,algebraic-simplify,row-gather-scatter,fuse-reduction"
ROWS, VOCAB = 24, 300            # 300 = 2 x 128 + 44: the last tile is masked


def xent(logits, labels):
    return -jnp.take_along_axis(jax.nn.log_softmax(logits), labels[:, None], -1).mean()


def _region(fn, args, passes="fuse-reduction", target="gpu"):
    keep = outline(fn, args, passes, target=target)
    (f,) = keep.funcs("reduction")
    return keep, f


def _ce_region(dtype):
    logits = np.zeros((ROWS, VOCAB), dtype)
    labels = np.zeros(ROWS, np.int32)
    return _region(jax.value_and_grad(xent), (logits, labels), CE_PASSES)


def _ce_inputs(fn_op, dtype):
    ins = func_inputs(fn_op, 0)
    logits = (R.standard_normal((ROWS, VOCAB)) * 4).astype(dtype)
    logits[0, :] = -np.inf                 # an all -inf row: NaN loss and gradient, as unfused
    logits[1, :200] = -np.inf              # a -inf first tile (the online max starts at -inf)
    logits[2, 5] = np.inf                  # +inf in a row: NaN
    logits[3, :] -= 300                     # very negative logits (no overflow when rescaling)
    ins[0] = logits
    ins[1] = R.integers(-2, VOCAB + 2, ins[1].shape).astype(np.int32)   # some out of range
    return ins


def _run_everywhere(f, ins, blocks: dict, category="reassociate", cast=None):
    spec = FAM.spec_from_func(f)
    want = jax.jit(FAM.reference(spec))(*ins)
    built = {}
    for target, interp in (("gpu", True), ("tpu", pltpu.InterpretParams())):
        k = FAM.build(spec, target, interpret=interp, blocks=blocks.get(target))
        assert isinstance(k.blocks, TiledRowBlocks), k.blocks     # the tiled kernel ran
        got = jax.jit(k)(*ins)
        if cast is not None:
            got, exp = (jax.tree.map(lambda a: jnp.asarray(a).astype(cast), t) for t in (got, want))
        else:
            exp = want
        assert_same(got, exp, category)
        built[target] = k
    return built


@pytest.mark.parametrize("dtype", [np.float32, jnp.bfloat16], ids=["f32", "bf16"])
def test_cross_entropy_fwd_bwd_tiled_matches_unfused(dtype):
    keep, f = _ce_region(dtype)
    tp = row_tiled.plan(FAM.spec_from_func(f))
    # logsumexp once: max and sum of exp in one pass (online), the label logit and the
    # gradient in the second
    assert tp.passes == 2 and tp.folded == 1, tp
    ins = _ce_inputs(f, dtype)
    built = _run_everywhere(f, ins, {"gpu": TiledRowBlocks("gpu", ROWS, VOCAB, 8, 128),
                                     "tpu": TiledRowBlocks("tpu", ROWS, VOCAB, 8, 128)},
                            # the loss rows are bf16 values converted to f32: compared as bf16
                            cast=dtype if dtype is not np.float32 else None)
    assert built["gpu"].blocks.tiles == 3 and built["gpu"].blocks.padded
    assert built["gpu"].passes == 2 and built["gpu"].folded == 1


def _small_chip(target):
    if target == "gpu":   # a 32-element row block: every row over 64 elements is tiled
        return dataclasses.replace(chips.get("h100"), registers_per_block=256)
    return dataclasses.replace(chips.get("v5e"), scoped_vmem_bytes=64 * 1024)


def test_forced_small_row_budget_picks_the_tiled_kernel():
    keep, f = _ce_region(np.float32)
    spec = FAM.spec_from_func(f)
    ins = _ce_inputs(f, np.float32)
    want = jax.jit(FAM.reference(spec))(*ins)
    for target, interp in (("gpu", True), ("tpu", pltpu.InterpretParams())):
        t = Target(target, _small_chip(target))
        assert t.max_row_elems < VOCAB
        assert row_tiled.is_tiled(spec, t)
        k = FAM.build(spec, t, interpret=interp)
        assert isinstance(k.blocks, TiledRowBlocks) and k.blocks.tiles >= 3, k.blocks
        assert "tiled" in k.kernel_name
        assert_same(jax.jit(k)(*ins), want, "reassociate")
    # the default chips keep a 300-wide row whole
    assert not row_tiled.is_tiled(spec, "gpu") and not row_tiled.is_tiled(spec, "tpu")


@pytest.mark.parametrize("fn,name", [
    (lambda x: jax.nn.softmax(x, axis=-1), "softmax"),
    (lambda x: jax.nn.logsumexp(x, axis=-1), "logsumexp"),       # the isfinite-select shift
], ids=["softmax", "logsumexp"])
def test_other_long_row_regions(fn, name):
    x = (R.standard_normal((16, 200)) * 3).astype(np.float32)
    x[0, :] = -np.inf
    x[1, :130] = -np.inf
    x[2, :] -= 200
    keep, f = _region(fn, (x,))
    tp = row_tiled.plan(FAM.spec_from_func(f))
    assert tp.folded == 1 and tp.passes == (2 if name == "softmax" else 1), tp
    _run_everywhere(f, [x], {"gpu": TiledRowBlocks("gpu", 16, 200, 4, 64),
                             "tpu": TiledRowBlocks("tpu", 16, 200, 8, 128)})


def test_lowers_to_triton_and_mosaic():
    keep, f = _ce_region(jnp.bfloat16)
    spec = FAM.spec_from_func(f)
    for target, marker in (("gpu", "__gpu$xla.gpu.triton"), ("tpu", "tpu_custom_call")):
        k = FAM.build(spec, Target(target, _small_chip(target)))
        assert isinstance(k.blocks, TiledRowBlocks)
        assert marker in lower_to_text(k, func_avals(f), target)


def test_refusals_say_why():
    # a layernorm backward's column reductions (d(scale), d(bias)) are not tiled: XLA keeps it
    def ln_loss(g, x):
        m = x.mean(-1, keepdims=True)
        return ((x - m) * jax.lax.rsqrt(((x - m) ** 2).mean(-1, keepdims=True) + 1e-5) * g).sum()
    x = R.standard_normal((16, 200)).astype(np.float32)
    keep = outline(jax.grad(ln_loss), (np.ones(200, np.float32), x), "fuse-reduction", target="gpu")
    withcols = [f for f in keep.funcs("reduction") if FAM.spec_from_func(f).col_outputs]
    assert withcols
    with pytest.raises(EmitError, match="column reductions"):
        FAM.build(FAM.spec_from_func(withcols[0]), Target("gpu", _small_chip("gpu")))
    # ... so with rows over the row budget they do not join the row region at all
    with chips.use(_small_chip("gpu")):
        small = outline(jax.grad(ln_loss), (np.ones(200, np.float32), x), "fuse-reduction", target="gpu")
    assert not [f for f in small.funcs("reduction") if FAM.spec_from_func(f).col_outputs]
    assert any("walked in column tiles" in str(r.extra.get("refused")) for r in small.report.regions), \
        small.report
    with pytest.raises(EmitError, match="cpu"):
        row_tiled.build_tiled(FAM.spec_from_func(withcols[0]), "cpu")
    assert max_tiled_row_elems("gpu") == 1 << 24 and max_tiled_row_elems("cpu") >= 1 << 30


def test_negate_of_a_constant_lowers_to_triton():
    # without constant-fold the cross-entropy region holds negate(constant): jax keeps the splat
    # as a jaxpr literal, which Triton's negate rule cannot take (blockeval folds it on scalars)
    logits, labels = np.zeros((8, 64), np.float32), np.zeros(8, np.int32)
    keep, f = _region(jax.value_and_grad(xent), (logits, labels), "row-gather-scatter,fuse-reduction")
    body = [o.operation for o in f.regions[0].blocks[0].operations]
    neg = [o for o in body if o.name == "stablehlo.negate"]
    assert any(o.operands[0].owner.name == "stablehlo.constant" for o in neg), [o.name for o in body]
    k = FAM.build(FAM.spec_from_func(f), "gpu")
    assert "__gpu$xla.gpu.triton" in lower_to_text(k, func_avals(f), "gpu")
