"""check=True / verify_module: planted wrong kernels are caught and rolled back; fallbacks.

Every test that plants a bug asserts three things: the final results are right, the region was
rolled back (report entry + warning), and the bug was really live (without check=True the
same program gives wrong numbers, or the planted kernel is what got spliced).
"""

import warnings

import numpy as np
import pytest

import jax
import jax.numpy as jnp
from jax import lax

import hlofuse
from hlofuse.core import ir as hir
from hlofuse.core import ops
from hlofuse.runtime.execute import run_module
from hlofuse.kernels import FAMILIES, Family
from hlofuse.passes import kernelize
from hlofuse.core.pipeline import Pass
from hlofuse.core.report import HlofuseWarning
from hlofuse.runtime.testing import assert_same, compare, random_inputs
from hlofuse.runtime.verify import verify_module
from hlofuse.runtime.testing import ALL_KERNELS

E = ops.OpClass.ELEMENTWISE

# The checks below reason about which regions exist, so they pin the fusion passes to the
# elementwise one (other fusions would claim ops differently); verification itself does not
# depend on the pipeline (test_default_pipeline_verifies below runs the default one).
PIPE = "inline-calls,canonicalize,cse,fuse-elementwise,kernelize,symbol-dce,canonicalize"


def jit(f, **kw):
    return hlofuse.jit(f, pipeline=kw.pop("pipeline", PIPE), **kw)


def optimize(m, **kw):
    return hlofuse.optimize(m, pipeline=kw.pop("pipeline", PIPE), **kw)


def f2(x, y):
    """Two elementwise regions: tanh chain (region 0), exp chain (region 1)."""
    a = jnp.tanh(x * 2.0 + y) * y - 1.0
    b = (jnp.exp(x) * y + x).sum(axis=0)
    return a, b


@pytest.fixture
def xy():
    r = np.random.default_rng(0)
    return (jnp.asarray(r.standard_normal((8, 128), np.float32)),
            jnp.asarray(r.standard_normal((8, 128), np.float32)))


@pytest.fixture(autouse=True)
def fresh_kernel_cache(monkeypatch):
    """Kernels are cached by region body; planted bugs must not leak between tests."""
    monkeypatch.setattr(kernelize, "_CACHE", {})


def plant_rule(monkeypatch, op_name, emit):
    """Replace one op's emitter: only kernels use emitters, so only the kernel path is wrong."""
    monkeypatch.setitem(ops.RULES, op_name, ops.OpRule(E, emit))


def _rolled_back(report):
    return [r for r in report.regions if r.reason and r.reason.startswith("verification failed")]


def test_correct_kernels_pass_verification(xy):
    fn = jit(f2, check=True)
    out = fn(*xy)
    assert_same(out, jax.jit(f2)(*xy))
    rep = fn.report(*xy)
    assert len(rep.kernels) == 2 and not _rolled_back(rep)
    assert all(r.extra["verify"].startswith("ok") for r in rep.kernels)


def test_default_pipeline_verifies(xy):
    """Whatever fusion passes the default pipeline holds, their kernels pass the check."""
    fn = hlofuse.jit(f2, check=True)
    with warnings.catch_warnings():
        warnings.simplefilter("error", HlofuseWarning)
        out = fn(*xy)
    assert_same(out, jax.jit(f2)(*xy), "reassociate")
    rep = fn.report(*xy)
    assert rep.kernels and all(r.extra["verify"].startswith("ok") for r in rep.kernels)


def test_planted_wrong_emitter_is_rolled_back(monkeypatch, xy):
    plant_rule(monkeypatch, "stablehlo.tanh", lambda op, v: lax.sin(v))
    # the plant is live: without the check the program computes sin
    wrong = jit(f2)(*xy)
    assert compare(wrong, jax.jit(f2)(*xy))
    monkeypatch.setattr(kernelize, "_CACHE", {})
    fn = jit(f2, check=True)
    with pytest.warns(HlofuseWarning, match=r"region 0 \(elementwise, at test_verify.py:\d+\) rolled back"):
        out = fn(*xy)
    assert_same(out, jax.jit(f2)(*xy))
    rep = fn.report(*xy)
    (bad,) = _rolled_back(rep)
    assert bad.id == 0 and bad.kernel is None and "random inputs" in bad.reason
    assert any("rolled back" in n for n in rep.notes)
    # the healthy region keeps its kernel; the rolled-back one calls its original function
    assert [r.id for r in rep.kernels] == [1]
    text = fn.lower(*xy).as_text()
    assert "call @hlofuse_region_0(" in text and "hlofuse.xla" in text
    assert "hlofuse_k0_" not in text and "call @hlofuse_k1_main(" in text


def test_planted_wrong_family_build_is_rolled_back(monkeypatch, xy):
    fam = FAMILIES["elementwise"]

    def bad_build(spec, target, **kw):
        good = fam.build(spec, target, **kw)

        def off_by_one(*args):
            return tuple(o + jnp.ones((), o.dtype) for o in good(*args))
        off_by_one.kernel_name, off_by_one.blocks = good.kernel_name, good.blocks
        return off_by_one

    monkeypatch.setitem(FAMILIES, "elementwise", Family(fam.spec_from_func, bad_build, fam.reference))
    fn = jit(f2, check=True)
    with pytest.warns(HlofuseWarning):
        out = fn(*xy)
    assert_same(out, jax.jit(f2)(*xy))
    rep = fn.report(*xy)
    assert {r.id for r in _rolled_back(rep)} == {0, 1} and not rep.kernels


def test_bug_only_on_nan_caught_by_edge_trial(monkeypatch):
    # max as a > b ? a : b drops NaNs: N(0,1) inputs cannot see it, the edge trial must
    plant_rule(monkeypatch, "stablehlo.maximum", lambda op, a, b: jnp.where(a > b, a, b))

    def g(x, y):
        return jnp.maximum(x * 3.0, y) + 1.0

    x = jnp.asarray(random_inputs([jax.ShapeDtypeStruct((4, 64), np.float32)], 1)[0])
    x, y = x.at[0, 0].set(jnp.nan), x[::-1]
    wrong = jit(g)(x, y)
    assert compare(wrong, jax.jit(g)(x, y))  # live plant: NaN lost
    monkeypatch.setattr(kernelize, "_CACHE", {})
    fn = jit(g, check=True)
    with pytest.warns(HlofuseWarning):
        out = fn(x, y)
    assert_same(out, jax.jit(g)(x, y))
    (bad,) = _rolled_back(fn.report(x, y))
    assert "edge inputs" in bad.reason


def test_kernel_that_does_not_compile_is_rolled_back_alone(monkeypatch, xy):
    fam = FAMILIES["elementwise"]

    def build(spec, target, **kw):
        good = fam.build(spec, target, **kw)
        if "tanh" not in spec.body_text:
            return good

        def unknown_custom_call(*args):
            outs = good(*args)
            return tuple(jax.ffi.ffi_call("hlofuse_no_such_target", jax.ShapeDtypeStruct(o.shape, o.dtype))(o)
                         for o in outs)
        unknown_custom_call.kernel_name, unknown_custom_call.blocks = good.kernel_name, good.blocks
        return unknown_custom_call

    monkeypatch.setitem(FAMILIES, "elementwise", Family(fam.spec_from_func, build, fam.reference))
    fn = jit(f2, check=True)
    with pytest.warns(HlofuseWarning, match="did not compile or run"):
        out = fn(*xy)
    assert_same(out, jax.jit(f2)(*xy))
    rep = fn.report(*xy)
    assert [r.id for r in _rolled_back(rep)] == [0] and [r.id for r in rep.kernels] == [1]


def test_verify_module_from_optimize_alone(monkeypatch, xy):
    """The ``hlofuse optimize --verify`` path: a module and its report, no Exported."""
    plant_rule(monkeypatch, "stablehlo.exponential", lambda op, v: lax.exp(v) * 1.001)
    text = jax.jit(f2).lower(*xy).as_text()
    opt = optimize(text, target="cpu")
    assert len(opt.report.kernels) == 2
    inputs = [np.asarray(a) for a in xy]
    want = run_module(text, inputs)
    assert compare(run_module(opt.module, inputs), want)  # live plant
    res = verify_module(opt, warn=False)
    assert res is opt
    assert [r.id for r in _rolled_back(opt.report)] == [1]
    assert opt.report.kernels[0].extra["verify"].startswith("ok")
    hir.verify(opt.module)
    assert_same(run_module(opt.module, inputs), want, "exact")
    # the rolled-back module is stable under another run of the pipeline
    assert optimize(opt.text, target="cpu").text == opt.text


def test_gpu_target_verified_in_interpret_mode(monkeypatch, xy):
    """No GPU here: the Triton kernel cannot run, its interpret-mode twin is checked instead."""
    fn = jit(f2, target="gpu", check=True, options=ALL_KERNELS)
    lo = fn.lower(*xy)
    assert lo.as_text().count("__gpu$xla.gpu.triton") == 2
    assert all("interpret" in r.extra["verify"] for r in lo.report.kernels)
    plant_rule(monkeypatch, "stablehlo.tanh", lambda op, v: lax.sin(v))
    monkeypatch.setattr(kernelize, "_CACHE", {})
    with pytest.warns(HlofuseWarning, match="interpret mode for gpu"):
        lo = jit(f2, target="gpu", check=True, options=ALL_KERNELS).lower(*xy)
    assert [r.id for r in _rolled_back(lo.report)] == [0]
    assert lo.as_text().count("__gpu$xla.gpu.triton") == 1


# ---------------------------------------------------------------------------------------------
# Fallbacks: a failing kernel build or pass never makes a program fail
# ---------------------------------------------------------------------------------------------

def test_kernel_build_failure_warns_with_region_and_line(monkeypatch, xy):
    fam = FAMILIES["elementwise"]

    def build(spec, target, **kw):
        if "tanh" in spec.body_text:
            raise RuntimeError("boom in the tanh kernel")
        return fam.build(spec, target, **kw)

    monkeypatch.setitem(FAMILIES, "elementwise", Family(fam.spec_from_func, build, fam.reference))
    fn = jit(f2)
    with pytest.warns(HlofuseWarning, match=r"region 0 \(elementwise, at test_verify.py:\d+\) left to XLA: "
                                            r"kernel build failed \(RuntimeError: boom"):
        out = fn(*xy)
    assert_same(out, jax.jit(f2)(*xy))
    rep = fn.report(*xy)
    assert rep.region(0).kernel is None and "boom" in rep.region(0).reason
    assert rep.region(1).kernel


def test_lowering_failure_warns(monkeypatch, xy):
    import hlofuse.kernels.lowering as lowering

    def broken(fn, avals, target):
        raise ValueError("lowering exploded")

    monkeypatch.setattr(lowering, "lower_to_text", broken)
    with pytest.warns(HlofuseWarning, match="lowering exploded"):
        out = jit(f2)(*xy)
    assert_same(out, jax.jit(f2)(*xy))


def test_unsupported_region_is_reported_without_warning(monkeypatch, xy):
    fam = FAMILIES["elementwise"]

    def build(spec, target, **kw):
        raise ops.EmitError("legal but unsupported here")

    monkeypatch.setitem(FAMILIES, "elementwise", Family(fam.spec_from_func, build, fam.reference))
    fn = jit(f2)
    with warnings.catch_warnings():
        warnings.simplefilter("error", HlofuseWarning)
        out = fn(*xy)
    assert_same(out, jax.jit(f2)(*xy))
    assert all("unsupported here" in r.reason for r in fn.report(*xy).regions)


class _Exploding(Pass):
    name = "fuse-elementwise"

    def run(self, module, ctx):
        raise RuntimeError("pass exploded")


def test_failing_pass_falls_back_to_unoptimized(monkeypatch, xy):
    from hlofuse.core import pipeline
    monkeypatch.setitem(pipeline._REGISTRY, "fuse-elementwise", _Exploding)
    fn = jit(f2)
    with pytest.warns(HlofuseWarning, match="failed in pass 'fuse-elementwise'; running it unoptimized"):
        out = fn(*xy)
    assert_same(out, jax.jit(f2)(*xy), "exact")
    rep = fn.report(*xy)
    assert not rep.regions and any("unoptimized" in n for n in rep.notes)
    # strict (debugging) re-raises
    with pytest.raises(hlofuse.PassFailure, match="pass exploded"):
        jit(f2, options={"strict": True})(*xy)


def test_unknown_pass_name_is_still_an_error(xy):
    """Raised by hlofuse.jit itself, before any call (a tiered first call would otherwise
    meet it only in its background build)."""
    with pytest.raises(KeyError, match="unknown pass"):
        jit(f2, disable=["no-such-pass"])
    with pytest.raises(KeyError, match="unknown pass 'no-such-pass'"):
        jit(f2, pipeline="cse,no-such-pass", tiered=True)


def test_check_inside_grad_and_vmap_traces(xy):
    """Regression (found by tests/test_threads.py): verification runs while JAX traces the
    backward or batched program; it used to hand tracers to XLA and roll back every region."""
    fn = jit(f2, check=True)
    with warnings.catch_warnings():
        warnings.simplefilter("error", HlofuseWarning)
        g = jax.grad(lambda x, y: fn(x, y)[0].sum())(*xy)
        v = jax.vmap(fn)(xy[0][None], xy[1][None])
    assert_same(g, jax.grad(lambda x, y: f2(x, y)[0].sum())(*xy), "grad")
    assert_same(v, jax.vmap(f2)(xy[0][None], xy[1][None]))
    program, = fn.programs()

    def derived(p):
        for sub in p.derived.values():
            yield sub
            yield from derived(sub)
    built = [e for sub in derived(program) for e in sub.entries()]
    assert len(built) >= 2                # the backward and the batched program
    for entry in built:                   # were checked and kept
        assert entry.report.kernels and all(r.extra["verify"].startswith("ok")
                                            for r in entry.report.kernels)


# ---------------------------------------------------------------------------------------------
# Edge trials stay where backends agree (issue 11, item 12: a Gemma-2 RoPE region rolled back)
# ---------------------------------------------------------------------------------------------

def _naive_periodic(fn):
    """``fn`` (sin or cos) as a backend without an exact range reduction computes it: the same
    as XLA for |x| < 2**16, a float32 Cody-Waite-style reduction beyond (sin(3.4e38) comes out
    0.998 on one backend and -0.38 on another). Correct where real programs evaluate it."""
    def emit(op, x):
        two_pi = np.float32(2 * np.pi)
        reduced = x - jnp.floor(x / two_pi + 0.5) * two_pi
        return fn(jnp.where(jnp.abs(x) < 65536, x, reduced))
    return emit


def rope(x, pos):
    """Rotary position embedding, as Gemma/Llama compute it: sin/cos of positions x freqs."""
    d = x.shape[-1] // 2
    inv = 1.0 / (10000.0 ** (jnp.arange(d, dtype=jnp.float32) / d))
    ang = pos[:, None].astype(jnp.float32) * inv[None, :]
    s, c = jnp.sin(ang), jnp.cos(ang)
    x1, x2 = x[..., :d], x[..., d:]
    return jnp.concatenate([x1 * c - x2 * s, x2 * c + x1 * s], -1)


def _rope_args():
    r = np.random.default_rng(5)
    return (jnp.asarray(r.standard_normal((16, 64)), jnp.float32), jnp.arange(16, dtype=jnp.int32))


def test_rope_sin_cos_region_is_not_rolled_back_for_huge_edge_arguments(monkeypatch):
    plant_rule(monkeypatch, "stablehlo.sine", _naive_periodic(lax.sin))
    plant_rule(monkeypatch, "stablehlo.cosine", _naive_periodic(lax.cos))
    huge = jnp.asarray([3.4e38, -1e30, 2147483647.0], jnp.float32)
    assert compare(_naive_periodic(lax.sin)(None, huge), lax.sin(huge))  # live: differs out there
    args = _rope_args()
    fn = jit(rope, check=True)
    with warnings.catch_warnings():
        warnings.simplefilter("error", HlofuseWarning)
        out = fn(*args)
    assert_same(out, jax.jit(rope)(*args))
    rep = fn.report(*args)
    trig = [r for r in rep.regions if "stablehlo.sine" in r.ops]
    assert trig and all(r.kernel for r in trig) and not _rolled_back(rep)
    assert all(r.extra["verify"].startswith("ok (2 trial(s)") for r in trig), [r.extra["verify"] for r in trig]


def test_rope_region_in_interpret_mode_for_gpu(monkeypatch):
    plant_rule(monkeypatch, "stablehlo.sine", _naive_periodic(lax.sin))
    plant_rule(monkeypatch, "stablehlo.cosine", _naive_periodic(lax.cos))
    with warnings.catch_warnings():
        warnings.simplefilter("error", HlofuseWarning)
        lo = jit(rope, target="gpu", check=True, options=ALL_KERNELS).lower(*_rope_args())
    trig = [r for r in lo.report.regions if "stablehlo.sine" in r.ops]
    assert trig and all(r.kernel and r.extra["verify"].startswith("ok") for r in trig)


def test_edge_only_finite_difference_keeps_the_kernel_with_a_debug_note(monkeypatch, caplog):
    """sin(x * y): both inputs within the edge domain, their product is not. Only the edge trial
    reaches the arguments where the backends differ, with finite values on both sides: the
    kernel stays (verdict and a debug line say why), no warning."""
    plant_rule(monkeypatch, "stablehlo.sine", _naive_periodic(lax.sin))

    def g(x, y):
        return jnp.sin(x * y) + 1.0
    r = np.random.default_rng(2)
    args = [jnp.asarray(r.standard_normal((8, 128)), jnp.float32) for _ in range(2)]
    fn = jit(g, check=True)
    with warnings.catch_warnings(), caplog.at_level("DEBUG", logger="hlofuse.runtime.verify"):
        warnings.simplefilter("error", HlofuseWarning)
        out = fn(*args)
    assert_same(out, jax.jit(g)(*args))
    (reg,) = fn.report(*args).regions
    assert reg.kernel and "finite values differ on edge inputs" in reg.extra["verify"]
    assert any("kept" in rec.getMessage() and "edge inputs" in rec.getMessage() for rec in caplog.records)


def test_random_input_disagreement_in_a_trig_region_still_rolls_back(monkeypatch):
    """The edge domain changes what edge trials feed, not what counts on realistic inputs."""
    plant_rule(monkeypatch, "stablehlo.sine", lambda op, v: lax.sin(v) + 1e-3)

    def g(x):
        return jnp.sin(x) * 2.0
    x = jnp.asarray(np.random.default_rng(3).standard_normal((8, 128)), jnp.float32)
    fn = jit(g, check=True)
    with pytest.warns(HlofuseWarning, match="rolled back"):
        out = fn(x)
    assert_same(out, jax.jit(g)(x))
    (bad,) = _rolled_back(fn.report(x))
    assert "random inputs" in bad.reason


def test_edge_inputs_respect_the_domain_of_periodic_ops():
    from hlofuse.runtime.testing import EDGE_DOMAIN, edge_bound, edge_inputs
    assert edge_bound(["stablehlo.multiply", "stablehlo.sine"]) == EDGE_DOMAIN["stablehlo.sine"]
    assert edge_bound(["stablehlo.exponential", "stablehlo.log"]) is None
    avals = [jax.ShapeDtypeStruct((64, 64), np.float32), jax.ShapeDtypeStruct((4096,), np.int32),
             jax.ShapeDtypeStruct((64, 64), jnp.bfloat16)]
    free, bounded = edge_inputs(avals, 0), edge_inputs(avals, 0, bound=1024.0)
    for f, b in zip(free, bounded):
        fw, bw = f.astype(np.float64), b.astype(np.float64)
        assert np.nanmax(np.abs(np.where(np.isfinite(fw), fw, 0))) > 1e9   # extremes by default
        assert np.nanmax(np.abs(np.where(np.isfinite(bw), bw, 0))) <= 1024  # none when bounded
        if f.dtype.kind == "f" or f.dtype == jnp.bfloat16:
            assert np.isnan(bw).any() and np.isinf(bw).any()              # NaN and inf still fed


def test_float64_twin_of_a_region():
    """run_wide: the region's text with every float type f64, run by XLA (no hlofuse emitter);
    a region whose value depends on a float's width has no twin."""
    from hlofuse.runtime.verify import run_wide
    text = """func.func private @r(%x: tensor<272xbf16>) -> tensor<bf16> {
      %c = stablehlo.constant dense<0.0> : tensor<bf16>
      %s = stablehlo.reduce(%x init: %c) applies stablehlo.add across dimensions = [0] : (tensor<272xbf16>, tensor<bf16>) -> tensor<bf16>
      return %s : tensor<bf16>
    }"""
    x = np.random.default_rng(0).standard_normal(272).astype(jnp.bfloat16)
    (got,) = run_wide(text, [x])
    assert got.dtype == np.float64 and got == np.asarray(x, np.float64).sum()
    with pytest.raises(ValueError, match="width"):
        run_wide("func.func private @r(%x: tensor<4xf32>) -> tensor<4xi32> {\n"
                 "  %0 = stablehlo.bitcast_convert %x : (tensor<4xf32>) -> tensor<4xi32>\n"
                 "  return %0 : tensor<4xi32>\n}", [np.zeros(4, np.float32)])


def test_no_less_accurate_rules_for_non_finite_and_integer_outputs():
    """A kernel that differs from the original is kept when it is no farther from the float64
    evaluation: it may hold the float64 value where the original overflowed to inf or NaN, and
    an integer no farther from it; a NaN the float64 value has, or an integer the region
    computes exactly, must stay the original's."""
    from hlofuse.runtime.verify import _no_less_accurate

    def kept(got, want, exact, dtype=np.float32):
        return _no_less_accurate([np.array(got, dtype)], [np.array(want, dtype)],
                                 lambda: [np.array(exact, np.float64)], "reassociate")
    inf, nan = np.inf, np.nan
    assert kept([-inf, 1.0], [nan, 1.0], [-inf, 1.0])          # overflowed product, kept exact
    assert kept([3e38], [inf], [3e38])
    assert not kept([inf], [nan], [-inf])                       # not the float64 value
    assert not kept([1.0], [nan], [nan])                        # the NaN is the answer
    assert not kept([nan], [1.0], [1.0])
    assert not kept([inf], [1.0], [1.0])
    assert kept([16400], [41344], [16399], np.int32)            # an f16 sum converted to int
    assert not kept([5], [4], [4], np.int32)                    # integers computed exactly
    assert kept([True], [False], [True], np.bool_)
    assert not kept([True], [False], [False], np.bool_)


def test_check_keeps_a_correct_attention_backward(tmp_path, monkeypatch):
    """The flash backward trusts its forward's output and row statistics (``p = exp(x - m) /
    l``); the region's original recomputes the forward. Drawn independently, they made every
    correct backward kernel fail verification (errors up to 8e4) and roll back under
    ``check=True`` (adversarial round): verify now derives them from the drawn forward inputs."""
    monkeypatch.setenv("HLOFUSE_CACHE_DIR", str(tmp_path))        # a warm cache skips the check
    b, s, h, dh = 2, 64, 4, 16
    ks = jax.random.split(jax.random.key(0), 5)
    x = jax.random.normal(ks[0], (b, s, h * dh))
    p = {n: jax.random.normal(k, (h * dh, h * dh)) / 8 for n, k in zip("qkvo", ks[1:])}

    def loss(p, x):
        q, k, v = ((x @ p[n]).reshape(b, s, h, dh) for n in "qkv")
        w = jax.nn.softmax(jnp.einsum("bqhd,bkhd->bhqk", q, k) / np.sqrt(dh), -1)
        return jnp.mean((jnp.einsum("bhqk,bkhd->bqhd", w, v).reshape(b, s, h * dh) @ p["o"]) ** 2)

    step = jax.value_and_grad(loss)
    f = hlofuse.jit(step, check=True, tiered=False, autotune=False)
    with warnings.catch_warnings(record=True) as seen:
        warnings.simplefilter("always")
        got = f(p, x)
    assert not [w for w in seen if "attention_bwd" in str(w.message)], [str(w.message) for w in seen]
    rep = f.report(p, x)
    bwd = [r for r in rep.kernels if r.kind == "attention_bwd"]
    assert len(bwd) == 1 and bwd[0].extra["verify"].startswith("ok"), bwd
    assert_same(got, jax.jit(step)(p, x), "grad")


def test_compare_matches_nans_of_every_float_type():
    """float8 (and bfloat16) NaNs equal NaNs, in the exact path too: ``compare`` reported
    bit-identical float8 NaNs as a mismatch (numpy's isnan does not take ml_dtypes' floats;
    adversarial round). A NaN against a number still differs."""
    import jax.numpy as jnp
    for dt in (jnp.float8_e4m3fn, jnp.float8_e5m2, jnp.bfloat16, jnp.float16):
        a = np.asarray(jnp.asarray([np.nan, 1.0, -2.0], dt))
        for category in ("exact", "kernel"):
            assert compare(a, a, category) == [], (dt, category)
            assert compare(a, np.asarray(jnp.asarray([1.0, 1.0, -2.0], dt)), category), (dt, category)


def test_compare_reads_the_imaginary_parts_of_complex_leaves():
    """A complex leaf is compared part by part: every toleranced category passed [1+5j, 2-7j]
    against [1+0j, 2+7j] (the float64 cast dropped the imaginary parts), so a kernel with a
    wrong imaginary part would have passed check=True (adversarial round)."""
    import warnings
    e = np.array([1 + 0j, 2 + 7j], np.complex64)
    with warnings.catch_warnings():
        warnings.simplefilter("error")   # no ComplexWarning: nothing is silently dropped
        for category in ("exact", "kernel", "reassociate", "grad"):
            assert compare(np.array([1 + 5j, 2 - 7j], np.complex64), e, category), category
            assert compare(np.array([1 + 0j, 2 + 7j], np.complex64), e, category) == [], category
            nan = np.array([complex(1, np.nan), 2 + 7j], np.complex128)
            assert compare(nan, nan, category) == [], category
            assert compare(nan, e.astype(np.complex128), category), category
        close = e * np.complex64(1 + 1e-7)
        assert compare(close, e, "kernel") == []
