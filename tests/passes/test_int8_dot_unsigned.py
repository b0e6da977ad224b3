"""``int8-dot-unsigned``: on cpu, int8 x int8 -> int32 dots become u8 x s8 dots minus the exact
correction (bit-identical to the unrewritten module over a sweep of dot forms and at the int8
extremes; statistics, idempotence, no-match cases, matrix-vector padding, hlofuse's cpu kernels
and a sharded program), or stay signed x signed where the host multiplies those natively (the
choice ``shift="auto"`` makes from :mod:`hlofuse.core.hostcpu`; the tests of the shifted form force
it with ``shift="always"``, so they run the same on every CPU)."""

from __future__ import annotations

import itertools
import json
import os
import subprocess
import sys

import numpy as np
import pytest

import jax
import jax.numpy as jnp
from jax import lax

import hlofuse
from hlofuse.runtime.execute import run_module
from hlofuse.core.pipeline import OptionError
from hlofuse.runtime.testing import assert_same
from tests.fusion_util import PREFIX, dot_forms, kernels

PASS = "int8-dot-unsigned"
SHIFTED = f"{PASS}{{shift=always}}"
PIPE = f"{PREFIX},{SHIFTED}"
ALWAYS = {PASS: {"shift": "always"}}
R = np.random.default_rng(0)


def _i8(*shape, lo=-128, hi=128):
    return R.integers(lo, hi, shape).astype(np.int8)


def idot(a, b, dims=None, out=jnp.int32):
    dims = dims or (((a.ndim - 1,), (0,)), ((), ()))
    return lax.dot_general(a, b, dims, preferred_element_type=out)


def _stats(report):
    (stats,) = [p.stats for p in report.passes if p.name == PASS]
    return stats


def _text(fn, args, platform="cpu"):
    return jax.export.export(jax.jit(fn), platforms=[platform])(*args).mlir_module()


def _same_as_unrewritten(text, args, **kw):
    opt = hlofuse.optimize(text, target="cpu", pipeline=PIPE, **kw)
    base = hlofuse.optimize(text, target="cpu", pipeline=PREFIX)
    got, want = run_module(opt.text, list(args)), run_module(base.text, list(args))
    for g, w in zip(got, want):
        assert g.dtype == w.dtype and np.array_equal(g, w)       # integer math: bit-identical
    return opt


def _chain(x, w1, w2):
    """int8 linear -> relu -> requantize -> batched int8 einsum."""
    h = jax.nn.relu(idot(x, w1))
    q = jnp.clip(h // 64, -128, 127).astype(jnp.int8)
    return jnp.einsum("bsf,df->bsd", q, w2, preferred_element_type=jnp.int32)


CHAIN = (_i8(2, 8, 32), _i8(32, 48), _i8(16, 48))


def test_int8_dots_become_unsigned_lhs_dots_with_the_same_integers():
    text = _text(_chain, CHAIN)
    opt = _same_as_unrewritten(text, CHAIN)
    assert _stats(opt.report) == {"rewritten": 2, "matrix_vector_padded": 0}
    dots = [ln for ln in opt.text.splitlines() if "stablehlo.dot_general" in ln]
    # each rewritten dot: the u8 x s8 product and the two-row correction dot
    assert len(dots) == 4 and all("xui8>, tensor<" in ln for ln in dots), dots
    assert "stablehlo.xor" in opt.text and "stablehlo.subtract" in opt.text
    # a second run over its own output changes nothing (the lhs is u8 now)
    again = hlofuse.optimize(opt.text, target="cpu", pipeline=SHIFTED)
    assert _stats(again.report) == {"rewritten": 0, "matrix_vector_padded": 0}
    assert again.text == hlofuse.optimize(opt.text, target="cpu", pipeline="none").text


def test_extremes_and_overflowing_sums_wrap_as_xla_does():
    # -128 * -128 summed 2048 times is 2^25; 127/-128 mixes; a K large enough that the int32
    # sum wraps (2^17 products of 2^14 = 2^31): both programs wrap identically
    cases = [(np.full((4, 2048), -128, np.int8), np.full((2048, 8), -128, np.int8)),
             (np.full((4, 2048), 127, np.int8), np.full((2048, 8), -128, np.int8)),
             (_i8(5, 300), _i8(300, 7)),
             (np.full((2, 1 << 17), -128, np.int8), np.full((1 << 17, 2), -128, np.int8))]
    for x, w in cases:
        opt = _same_as_unrewritten(_text(idot, (x, w)), (x, w))
        assert _stats(opt.report)["rewritten"] == 1
    wrapped = run_module(opt.text, [x, w])[0]
    assert wrapped[0, 0] == np.int32(np.int64(1 << 31) - (1 << 32))


# forms XLA:CPU gives its own dot, where a mixed u8 x s8 dot fails to compile (found by the sweep
# below with the form check off): rhs batch dim last; a transposed lhs against two rhs free dims
UNSUPPORTED = [((16, 16, 8), (16, 16, 16), (((1,), (0,)), ((0,), (2,)))),
               ((3, 16, 2), (3, 33, 16, 33), (((1,), (2,)), ((0,), (0,))))]


# the seeded sweep of 60 forms: the default run takes the first 20, the `long` step the other 40
SWEEP = [pytest.param(0, 20, id="first20"),
         pytest.param(20, 60, id="rest40", marks=pytest.mark.long)]


@pytest.mark.parametrize("start,stop", SWEEP)
def test_every_dot_form_gives_the_same_integers(start, stop):
    """Batch, free and contracting dims in any order (the correction's broadcast must land each
    output channel on its own column): a seeded sweep, each form compiled by XLA:CPU and
    bit-identical; the forms known to fail are left as they were."""
    n = 0
    forms = list(itertools.islice(dot_forms(5, 60), start, stop))
    cases = [(a, b, d, "known") for a, b, d in UNSUPPORTED] * (start == 0) + forms
    for sa, sb, dims, form in cases:
        fn = lambda a, b, dims=dims: idot(a, b, dims)  # noqa: E731
        args = (_i8(*sa), _i8(*sb))
        opt = _same_as_unrewritten(_text(fn, args), args)
        if form == "known":
            stats = _stats(opt.report)
            assert stats["rewritten"] == 0 and any("lead" in k or "transposed" in k for k in stats), stats
            assert any("left signed x signed" in n for n in opt.report.notes), opt.report.notes
        n += _stats(opt.report)["rewritten"]
    assert n >= len(forms) * 5 // 6, n     # (17 of the first 20, 35 of the rest)


def test_matrix_vector_dot_with_a_vector_lhs_becomes_a_two_row_product():
    vec, mat = _i8(1, 1, 64), _i8(64, 40)
    fn = lambda v, m: jnp.einsum("bsd,dv->bsv", v, m, preferred_element_type=jnp.int32)  # noqa: E731
    opts = {PASS: {"int8_gemv_pad_min_elems": 256, "int8_gemv_rows": 2}}
    opt = _same_as_unrewritten(_text(fn, (vec, mat)), (vec, mat), options=opts)
    assert _stats(opt.report) == {"rewritten": 1, "matrix_vector_padded": 1}
    assert "stablehlo.pad" in opt.text
    # a vector rhs is rewritten but not padded (XLA:CPU's library takes it as it is)
    opt = _same_as_unrewritten(_text(lambda m, v: idot(m, v), (mat.T, vec[0, 0])), (mat.T, vec[0, 0]),
                               options=opts)
    assert _stats(opt.report) == {"rewritten": 1, "matrix_vector_padded": 0}


def _dot_shapes(text):
    return [ln.split(":")[-1].strip() for ln in text.splitlines() if "stablehlo.dot_general" in ln]


def test_signed_form_keeps_the_programs_dots_and_pads_matrix_vector_dots():
    """``shift="never"`` (what ``auto`` does on AMX-INT8 / AVX-VNNI-INT8 / Arm CPUs): no dot is
    shifted, a vector lhs or rhs against a large matrix becomes a ``int8_gemv_rows``-row product,
    the integers are the program's, and a second run changes nothing."""
    vec, mat = _i8(1, 64), _i8(64, 40)
    for rows in (2, 8):
        opts = {PASS: {"shift": "never", "int8_gemv_pad_min_elems": 256, "int8_gemv_rows": rows}}
        for fn, args in ((idot, (vec, mat)), (lambda m, v: idot(m, v), (mat.T, vec[0]))):
            opt = hlofuse.optimize(_text(fn, args), target="cpu", pipeline=PIPE.replace(
                SHIFTED, PASS), options=opts)
            base = hlofuse.optimize(_text(fn, args), target="cpu", pipeline=PREFIX)
            assert np.array_equal(run_module(opt.text, list(args))[0],
                                  run_module(base.text, list(args))[0])
            assert _stats(opt.report) == {"rewritten": 0, "matrix_vector_padded": 1,
                                          "kept_signed": 1}
            (dot,) = _dot_shapes(opt.text)
            assert "ui8" not in dot and f"tensor<{rows}x64xi8>" in dot.replace(
                f"tensor<64x{rows}xi8>", f"tensor<{rows}x64xi8>"), dot
            again = hlofuse.optimize(opt.text, target="cpu", pipeline=PASS, options=opts)
            assert again.text == hlofuse.optimize(opt.text, target="cpu", pipeline="none").text
            assert _stats(again.report)["matrix_vector_padded"] == 0
    # a matrix x matrix dot is left exactly as written, and no note: the user chose "never"
    opt = hlofuse.optimize(_text(_chain, CHAIN), target="cpu", pipeline=f"{PREFIX},{PASS}",
                           options={PASS: {"shift": "never"}})
    assert _stats(opt.report) == {"rewritten": 0, "matrix_vector_padded": 0, "kept_signed": 2}
    assert opt.text == hlofuse.optimize(_text(_chain, CHAIN), target="cpu", pipeline=PREFIX).text
    assert not any(PASS in n for n in opt.report.notes)


@pytest.mark.parametrize("native", ["amx_int8", None])
def test_auto_shifts_only_where_the_host_lacks_signed_int8_dots(monkeypatch, native):
    """``shift="auto"`` asks :func:`hlofuse.core.hostcpu.int8_signed_native`: with such a feature the
    dots stay signed and the report says why; without one they are shifted."""
    from hlofuse.core import hostcpu
    monkeypatch.setattr(hostcpu, "int8_signed_native", lambda: native)
    text = _text(_chain, CHAIN)
    opt = hlofuse.optimize(text, target="cpu", pipeline=f"{PREFIX},{PASS}")
    if native:
        assert _stats(opt.report) == {"rewritten": 0, "matrix_vector_padded": 0, "kept_signed": 2}
        assert "ui8" not in opt.text
        (note,) = [n for n in opt.report.notes if n.startswith(PASS)]
        assert "2 int8 x int8 dot(s) kept signed x signed" in note and "amx_int8" in note
    else:
        assert _stats(opt.report) == {"rewritten": 2, "matrix_vector_padded": 0}
        assert "xui8>, tensor<" in opt.text


def test_gemv_rows_option_is_checked():
    with pytest.raises(OptionError,
                       match="pass 'int8-dot-unsigned': option 'int8_gemv_rows' must be 0"):
        hlofuse.optimize(_text(_chain, CHAIN), target="cpu", pipeline=PASS,
                         options={PASS: {"int8_gemv_rows": 1}})
    with pytest.raises(OptionError, match="option 'shift' of pass 'int8-dot-unsigned': expected"):
        hlofuse.optimize(_text(_chain, CHAIN), target="cpu", pipeline=PASS,
                         options={PASS: {"shift": "sometimes"}})


def test_no_match_other_types_other_targets_and_disabled():
    f32 = (np.asarray(CHAIN[0], np.float32), np.asarray(CHAIN[1], np.float32))
    u8 = (CHAIN[0].astype(np.uint8), CHAIN[1])
    for text, target, opts, why in [
            (_text(lambda a, b: a @ b, f32), "cpu", None, None),                      # float dot
            (_text(lambda a, b: idot(a, b, out=jnp.int16), CHAIN[:2]), "cpu", None,   # i16 result
             "refused[result is not int32]"),
            (_text(lambda a, b: idot(a, b), u8), "cpu", None, None),               # jax: i32 x i32
            (_text(_chain, CHAIN, "cuda"), "gpu", None, None),                      # not cpu
            (_text(_chain, CHAIN), "cpu", [PASS], None)]:
        before = hlofuse.optimize(text, target=target, pipeline=PREFIX).text
        opt = hlofuse.optimize(text, target=target, pipeline=PIPE, disable=opts or ())
        want = {} if opts else {"rewritten": 0, "matrix_vector_padded": 0}
        if why:
            want[why] = 1
        assert _stats(opt.report) == want
        assert opt.text == before


def test_default_pipeline_cpu_kernels_run_the_unsigned_dot():
    """A quantized linear -> GELU -> linear chain: two matmul kernels, each with the program's
    int8 dot turned into the u8 x s8 form, the int32 results exact (the float epilogue as jax's)."""
    def fn(x, w1, s1, w2, s2):
        q = jnp.clip(jnp.round(x / 0.05), -127, 127).astype(jnp.int8)
        h = jax.nn.gelu(idot(q, w1).astype(jnp.float32) * s1)
        q2 = jnp.clip(jnp.round(h / 0.05), -127, 127).astype(jnp.int8)
        return idot(q2, w2), idot(q2, w2).astype(jnp.float32) * s2
    args = (R.standard_normal((16, 64)).astype(np.float32), _i8(64, 128, lo=-127),
            R.uniform(1e-3, 1e-2, 128).astype(np.float32), _i8(128, 32, lo=-127),
            R.uniform(1e-3, 1e-2, 32).astype(np.float32))
    f = hlofuse.jit(fn, autotune=False, options=ALWAYS)
    rep = f.report(*args)
    assert _stats(rep)["rewritten"] >= 2 and kernels(rep, "matmul_epilogue")
    text = f.lower(*args).as_text()
    assert "xui8>, tensor<64x128xi8>" in text and "xui8>, tensor<128x32xi8>" in text
    got, want = f(*args), jax.jit(fn)(*args)
    assert np.array_equal(np.asarray(got[0]), np.asarray(want[0]))
    assert_same(got[1], want[1], "quantize")


SHARDED_CHILD = r'''
import json, os
os.environ["XLA_FLAGS"] = "--xla_force_host_platform_device_count=2"
import numpy as np, jax, jax.numpy as jnp, hlofuse
from jax import lax
from jax.sharding import Mesh, NamedSharding, PartitionSpec as P
mesh = Mesh(np.array(jax.devices()[:2]), ("x",))
rows, cols = NamedSharding(mesh, P("x", None)), NamedSharding(mesh, P(None, "x"))
r = np.random.default_rng(0)
x = jax.device_put(r.integers(-128, 128, (16, 64)).astype(np.int8), rows)
w = jax.device_put(r.integers(-128, 128, (64, 32)).astype(np.int8), cols)
fn = lambda x, w: lax.dot_general(x, w, (((1,), (0,)), ((), ())), preferred_element_type=jnp.int32)
f = hlofuse.jit(fn, autotune=False, in_shardings=(rows, cols),
                options={"int8-dot-unsigned": {"shift": "always"}})
rep = f.report(x, w)
stats = [p.stats for p in rep.passes if p.name == "int8-dot-unsigned"]
got, want = np.asarray(f(x, w)), np.asarray(jax.jit(fn)(x, w))
print(json.dumps({"stats": stats, "same": bool(np.array_equal(got, want)), "notes": rep.notes,
                  "sharding": str(f(x, w).sharding.spec)}))
'''


def test_sharded_int8_dot_is_rewritten_per_shard_and_exact():
    env = dict(os.environ, JAX_PLATFORMS="cpu", HLOFUSE_AUTOTUNE="off")
    root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    r = subprocess.run([sys.executable, "-c", SHARDED_CHILD], capture_output=True, text=True,
                       env=env, timeout=300, cwd=root)
    assert r.returncode == 0, r.stderr[-3000:]
    out = json.loads(r.stdout.strip().splitlines()[-1])
    assert out["stats"] == [{"rewritten": 1, "matrix_vector_padded": 0}], out["notes"]
    assert out["same"], out
