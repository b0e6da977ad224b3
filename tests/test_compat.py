"""One test per entry of hlofuse/core/compat.py's table (issue 44), run on both CI legs (jax 0.10.2 and
the newest jax in range): each checks what the entry says of the installed release *and* the
hlofuse behaviour that rests on it, so the next JAX release fails a named test here instead of
crashing inside a user's call."""

from __future__ import annotations

import os
import textwrap
import warnings

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import hlofuse
from hlofuse.core import compat
from hlofuse.runtime import program as runtime
from hlofuse.core import ir as hir
from hlofuse.kernels import lowering
from hlofuse.runtime.testing import assert_same
from tests.sharded_programs import run_json_child
from hlofuse.runtime.testing import ALL_KERNELS

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
NEW = compat.JAX_VERSION >= (0, 11)


def on(old, new) -> set:
    """The values allowed on this release: ``old`` on 0.10.x, ``new`` on 0.12+; on 0.11.x,
    which sits between the changes the table records for 0.10.2 and 0.12, either of the two
    (never anything else)."""
    if compat.JAX_VERSION < (0, 11):
        return {old}
    if compat.JAX_VERSION >= (0, 12):
        return {new}
    return {old, new}
TESTED = {}


def entry(name):
    """Register the decorated test as the one for ``name`` (an entry of compat.ENTRIES)."""
    assert name in compat.ENTRIES, name

    def deco(fn):
        TESTED[name] = fn.__name__
        return fn
    return deco


def test_every_entry_has_a_test_and_a_table_row():
    missing = [e for e in compat.ENTRIES if e not in TESTED]
    assert not missing, f"compat entries without a test: {missing}"
    rows = {line.split("|")[1].strip() for line in compat.__doc__.splitlines()
            if line.startswith("| ") and not line.startswith("| entry")}
    assert set(compat.ENTRIES) == rows, set(compat.ENTRIES) ^ rows


def _closed():
    c = np.arange(3.0, dtype=np.float32) + 0.5
    return jax.make_jaxpr(lambda x: jnp.sin(x) * c + jax.lax.scan(
        lambda h, _: (h * 2.0, None), x, None, length=2)[0])(jnp.ones(3, jnp.float32)), c


@entry("jaxpr_types")
def test_jaxpr_types():
    closed, c = _closed()
    assert compat.is_jaxpr(closed) and compat.is_closed_jaxpr(closed)
    body = compat.jaxpr_body(closed)
    assert (body is closed) == NEW              # 0.11+: ClosedJaxpr merged into Jaxpr
    assert compat.is_jaxpr(body) and body.eqns
    assert any(np.array_equal(np.asarray(k), c) for k in compat.jaxpr_consts(closed))
    # the runtime's digest walks both shapes: stable, and it sees the constant
    d1 = runtime._jaxpr_digest_of(closed)
    assert d1 is not None and d1 == runtime._jaxpr_digest_of(_closed()[0])
    other = jax.make_jaxpr(lambda x: jnp.sin(x) * (c + 1.0) + jax.lax.scan(
        lambda h, _: (h * 2.0, None), x, None, length=2)[0])(jnp.ones(3, jnp.float32))
    assert runtime._jaxpr_digest_of(other) not in (None, d1)


@entry("jaxpr_eval")
def test_jaxpr_eval():
    closed, c = _closed()
    x = jnp.linspace(0, 1, 3, dtype=jnp.float32)
    want = jnp.sin(x) * c + x * 4.0
    body = compat.jaxpr_body(closed)
    np.testing.assert_allclose(compat.eval_jaxpr(body, compat.jaxpr_consts(closed), x)[0], want,
                               rtol=1e-6)
    np.testing.assert_allclose(compat.jaxpr_as_fun(closed)(x)[0], want, rtol=1e-6)
    subs = list(compat.subjaxprs(body))
    assert len(subs) == 1 and compat.jaxpr_body(subs[0]).eqns      # the scan body
    scan = next(e for e in body.eqns if e.primitive.name == "scan")
    assert len(list(compat.jaxprs_in_params(scan.params))) == 1
    lit = jax.make_jaxpr(lambda x: x + 1.0)(1.0)
    assert any(isinstance(v, compat.Literal) for e in compat.jaxpr_body(lit).eqns
               for v in e.invars)


@entry("convert_constvars")
def test_convert_constvars():
    closed, c = _closed()
    opened = compat.convert_constvars_jaxpr(compat.jaxpr_body(closed))
    x = jnp.ones(3, jnp.float32)
    got = compat.eval_jaxpr(opened, [], *compat.jaxpr_consts(closed), x)[0]
    np.testing.assert_allclose(got, compat.jaxpr_as_fun(closed)(x)[0], rtol=1e-6)


@entry("trace_state")
def test_trace_state():
    assert compat.at_top_level()
    seen = []
    jax.jit(lambda x: seen.append(compat.at_top_level()) or x)(1.0)
    jax.grad(lambda x: seen.append(compat.at_top_level()) or x * x)(1.0)
    assert seen == [False, False]


@entry("jaxpr_rebuild")
def test_jaxpr_rebuild():
    """map_jaxpr_arrays copies the numpy arrays of constants, sub-jaxprs (an inner jit, a
    named-tuple parameter of a linear solve) and 0-d literals; the copy evaluates the same and
    no longer shares the caller's memory; nothing to copy gives the same object."""
    w = np.eye(3, dtype=np.float32)
    t = np.array(2.0, np.float32)
    inner = jax.jit(lambda x: x @ w + t)

    def f(x):
        y = inner(x) * t + w.sum()
        return jax.lax.custom_linear_solve(lambda v: v * 2.0, y, lambda mv, b: b / 2.0)
    x = jnp.ones(3, jnp.float32)
    closed = jax.make_jaxpr(f)(x)
    seen = []
    copied = compat.map_jaxpr_arrays(closed, lambda a: seen.append(a) or a.copy())
    assert copied is not closed and any(np.shares_memory(a, w) for a in seen)
    assert any(a.ndim == 0 for a in seen)                     # the literal
    want = compat.jaxpr_as_fun(closed)(x)[0]
    w *= 3
    t[...] = 7
    np.testing.assert_allclose(compat.jaxpr_as_fun(copied)(x)[0], want, rtol=1e-6)
    plain = jax.make_jaxpr(lambda x: x * 2)(x)
    assert compat.map_jaxpr_arrays(plain, lambda a: a) is plain


@entry("jaxpr_copy")
def test_jaxpr_copy():
    """run_jaxpr copies the equations into an enclosing trace, with their source lines."""
    closed, _ = _closed()
    x = jnp.ones(3, jnp.float32)
    copied = jax.make_jaxpr(lambda x: runtime.run_jaxpr(closed, (x,)))(x)
    assert ([e.primitive for e in compat.jaxpr_body(copied).eqns]
            == [e.primitive for e in compat.jaxpr_body(closed).eqns])
    inside = []
    jax.make_jaxpr(lambda x: inside.append(isinstance(compat.current_trace(),
                                                      compat.DynamicJaxprTrace)) or x)(1.0)
    assert inside == [True] and compat.current_source_info() is not None


@entry("trace_context")
def test_trace_context():
    text = runtime._context_text()
    assert " at 0x" not in text and "AxisEnv" in text
    assert len(compat.trace_context()) >= 40
    with jax.numpy_rank_promotion("raise"):
        assert runtime._context_text() != text   # a tracing setting changes the key


@entry("fun_signature")
def test_fun_signature():
    def f(a, b, *, c=1):
        return a + b + c
    sig = compat.fun_signature(f)
    nums, names = compat.infer_argnums_and_argnames(sig, None, ("b",))
    assert tuple(nums) == (1,) and tuple(names) == ("b",)
    g = hlofuse.jit(f, static_argnames=("b",), autotune=False)
    assert float(g(jnp.float32(1.0), 2)) == 4.0


@entry("manual_axis_type")
def test_manual_axis_type():
    m = compat.ManualAxisType(varying=frozenset(), unreduced=frozenset(), reduced=frozenset())
    assert m is not None


@entry("ir_context")
def test_ir_context():
    """A fresh context every time, never the one JAX lowers into (0.12 shares that one)."""
    a, b = compat.new_ir_context(), compat.new_ir_context()
    assert a is not b
    lowered = jax.jit(lambda x: x + 1).lower(jnp.ones(2)).compiler_ir()
    assert lowered.context is not a and lowered.context is not b
    mod = hir.parse(jax.jit(lambda x: jnp.tanh(x)).lower(jnp.ones(2)).as_text(), source="t")
    assert mod.context is not lowered.context
    assert "stablehlo.tanh" in hir.to_text(mod)


@entry("lowering_rules")
def test_lowering_rules():
    p = compat.host_callback_primitives()
    assert callable(compat.custom_call) and callable(compat.lower_fun)
    with pytest.raises(NotImplementedError, match="no lowering"):
        compat.lowering_rule(_FakeModuleContext(), jax.extend.core.Primitive("nothing"), "cpu")
    assert callable(compat.lowering_rule(_FakeModuleContext(), p.pure_callback_p, "cpu"))
    # and the behaviour that rests on it: a host callback round-trips through hlofuse.jit
    calls = []

    def f(x):
        y = jax.pure_callback(lambda a: calls.append(1) or np.asarray(a) * 2,
                              jax.ShapeDtypeStruct(x.shape, x.dtype), x)
        return jnp.sin(y)
    x = jnp.arange(4.0, dtype=jnp.float32)
    np.testing.assert_allclose(hlofuse.jit(f, autotune=False)(x), jnp.sin(x * 2), rtol=1e-6)
    assert calls


class _FakeModuleContext:
    """What ``_get_override_lowering_rule`` reads of a module context: no overrides."""
    lowering_parameters = type("P", (), {"override_lowering_rules": None})()


@entry("inlined_func_call")
def test_inlined_func_call():
    text = """
    func.func private @g(%a: tensor<2xf32>) -> tensor<2xf32> {
      %0 = stablehlo.add %a, %a : tensor<2xf32>
      return %0 : tensor<2xf32>
    }
    func.func public @main(%x: tensor<2xf32>) -> tensor<2xf32> {
      %0 = func.call @g(%x) : (tensor<2xf32>) -> tensor<2xf32>
      return %0 : tensor<2xf32>
    }"""
    mod = hir.parse(text, source="calls")
    assert hir.inline_all_calls(mod) == 1
    assert "func.call" not in hir.to_text(hir.main_func(mod).operation)


@entry("host_callback_primitives")
def test_host_callback_primitives():
    p = compat.host_callback_primitives()
    assert len(p.primitives) == 4 and len(p.unordered_effects) == 2
    assert callable(p.emit_python_callback)
    seen = []

    def f(x):
        jax.debug.callback(lambda v: seen.append(float(v.sum())), x)
        return jnp.tanh(x) * 2.0
    x = jnp.ones(4, jnp.float32)
    np.testing.assert_allclose(hlofuse.jit(f, autotune=False)(x), jnp.tanh(x) * 2.0, rtol=1e-6)
    jax.effects_barrier()
    assert seen == [4.0]


@entry("checkify_rules")
def test_checkify_of_an_hlofuse_function_reports_its_errors():
    """``checkify(hlofuse.jit(f))`` saw ``hlofuse_call`` as opaque and reported no error where
    ``checkify(jax.jit(f))`` did (adversarial round); also inside ``jax.jit``, and the values
    of an error-free call are jax.jit's."""
    from jax.experimental import checkify
    r = np.random.default_rng(0)
    x = jnp.asarray(r.standard_normal((16, 64)), jnp.float32)
    w = jnp.asarray(r.standard_normal((64, 64)), jnp.float32) / 8
    cases = [(lambda x: jnp.log(jax.nn.softmax(x @ w, -1) - 0.01), checkify.float_checks, "nan"),
             (lambda x: jax.nn.softmax(x @ w, -1)[jnp.argmax(x[0]) + 100], checkify.index_checks,
              "out-of-bounds"),
             (lambda x: jax.nn.softmax(x @ w, -1) * (7 // (jnp.argmax(x[0]) * 0)),
              checkify.div_checks, "division by zero")]
    for f, errors, says in cases:
        h = hlofuse.jit(f, tiered=False, autotune=False)
        err, _ = checkify.checkify(h, errors=errors)(x)
        assert err.get() is not None and says in err.get(), (says, err.get())
        err, _ = jax.jit(checkify.checkify(h, errors=errors))(x)
        assert err.get() is not None and says in err.get(), (says, err.get())
    g = lambda x: jax.nn.softmax(x @ w, -1)   # noqa: E731
    err, y = checkify.checkify(hlofuse.jit(g, tiered=False, autotune=False),
                               errors=checkify.all_checks)(x)
    assert err.get() is None
    np.testing.assert_allclose(np.asarray(y), np.asarray(jax.jit(g)(x)), rtol=1e-5, atol=1e-6)


@entry("ad_batching")
def test_ad_batching():
    def f(x):
        return jnp.sum(jnp.tanh(x) ** 2)
    x = jnp.linspace(-1, 1, 8, dtype=jnp.float32).reshape(2, 4)
    g = hlofuse.jit(f, autotune=False)
    assert_same(jax.grad(g)(x), jax.grad(f)(x), "reassociate")
    assert_same(jax.vmap(g)(x), jax.vmap(f)(x), "reassociate")
    assert compat.not_mapped is None
    assert np.asarray(compat.moveaxis(jnp.ones((2, 3)), 1, 0)).shape == (3, 2)


@entry("apply_primitive")
def test_apply_primitive():
    assert float(compat.apply_primitive(jax.lax.add_p, jnp.float32(1), jnp.float32(2))) == 3.0


@entry("meshes")
def test_meshes():
    mesh = jax.make_mesh((1,), ("d",))
    assert compat.get_concrete_mesh() is None or compat.get_concrete_mesh().empty
    with jax.set_mesh(mesh):
        assert compat.get_concrete_mesh() == mesh
        with lowering.isolated():            # kernels lower free of the caller's mesh
            assert compat.get_concrete_mesh().empty
            assert compat.get_abstract_mesh().empty
        assert compat.get_concrete_mesh() == mesh


def _kernel_targets(text: str) -> set[str]:
    return {t for t in ("__gpu$xla.gpu.triton", "tpu_custom_call") if t in text}


def _block(x, w):
    h = jnp.tanh(x @ w)
    return jax.nn.softmax(h, axis=-1)


_ARGS = (jax.ShapeDtypeStruct((128, 256), jnp.float32), jax.ShapeDtypeStruct((256, 256), jnp.float32))


@entry("abstract_mesh_auto")
def test_abstract_mesh_auto():
    assert compat.abstract_mesh().axis_types == (jax.sharding.AxisType.Auto,)
    text = hlofuse.jit(_block, target="tpu", autotune=False,
                       options=ALL_KERNELS).lower(*_ARGS).as_text()
    assert _kernel_targets(text) == {"tpu_custom_call"}, "no Mosaic kernel: lowering fell back"


@entry("gpu_abstract_device")
def test_gpu_abstract_device():
    assert compat.gpu_abstract_device("NVIDIA H100 80GB HBM3").platform == "cuda"
    text = hlofuse.jit(_block, target="gpu", autotune=False,
                       options=ALL_KERNELS).lower(*_ARGS).as_text()
    assert _kernel_targets(text) == {"__gpu$xla.gpu.triton"}, "no Triton kernel: lowering fell back"


@entry("triton_deprecation")
def test_triton_deprecation():
    with warnings.catch_warnings(record=True) as got:
        warnings.simplefilter("always")
        text = hlofuse.jit(lambda x: jax.nn.softmax(x * 3.0, axis=-1), target="gpu",
                           autotune=False, options=ALL_KERNELS).lower(
            jax.ShapeDtypeStruct((64, 512), jnp.float32)).as_text()
    assert "__gpu$xla.gpu.triton" in text
    assert not [w for w in got if "Triton backend is deprecated" in str(w.message)]


@entry("mosaic_gpu_env")
def test_mosaic_gpu_env():
    from hlofuse.runtime import aot
    assert ("JAX_PALLAS_USE_MOSAIC_GPU" in compat.MOSAIC_GPU_ENV) in on(True, False)
    assert all(aot._WORKER_ENV[k] == v for k, v in compat.MOSAIC_GPU_ENV.items())


@entry("compilation_cache")
def test_compilation_cache():
    before = compat.persistent_cache_min_compile_time()
    with compat.persistent_cache_min_compile_time(0.0):
        assert compat.persistent_cache_min_compile_time() == 0.0
    assert compat.persistent_cache_min_compile_time() == before
    assert isinstance(compat.compilation_cache_decided_off(), bool)
    assert callable(compat.reset_compilation_cache)


@entry("python_dispatch")
def test_python_dispatch():
    assert callable(compat.python_dispatch()._run_python_pjit)


@entry("export_backend_init")
def test_export_backend_init():
    assert compat.install_export_backend_guard(lambda: False)   # installed (runtime did it)
    exp = jax.export.export(jax.jit(lambda x: x * 2))(jnp.ones(3))
    with runtime._no_lapack_init():                           # skipped: still runs
        out = jax.jit(exp.call)(jnp.ones(3))
    np.testing.assert_allclose(out, 2.0)


@entry("pallas_internals")
def test_pallas_internals():
    from jax.experimental import pallas as pl
    p = compat.pallas()
    for name in ("pallas_call_p", "pallas_call_lowering", "hlo_interpret",
                 "initialize_output_vals", "Blocked", "GridAxis", "grid_env",
                 "uninitialized_value", "AbstractRef", "discharge_state"):
        assert getattr(p, name) is not None, name

    def kernel(x_ref, o_ref):
        o_ref[...] = jnp.exp(x_ref[...]) + 1.0
    x = jnp.linspace(0, 1, 256, dtype=jnp.float32).reshape(8, 32)
    fn = pl.pallas_call(kernel, out_shape=jax.ShapeDtypeStruct(x.shape, x.dtype), interpret=True)
    text = lowering.lower_to_text(fn, [jax.ShapeDtypeStruct(x.shape, x.dtype)], "cpu")
    assert "stablehlo.while" not in text           # the one-step evaluation, not the interpreter
    np.testing.assert_allclose(jax.jit(fn)(x), jnp.exp(x) + 1.0, rtol=1e-6)


@entry("xla_client")
def test_xla_client():
    dl = compat.DeviceList(jax.devices()[:1])
    assert len(dl) == 1
    assert compat.backends_are_initialized() is True
    path = compat.cuda_path()   # set where jax found CUDA (the aot extra's nvcc), else None
    assert path is None or os.path.isdir(path)


_RGV3 = textwrap.dedent('''
    import json, os, sys
    os.environ["XLA_FLAGS"] = "--xla_force_host_platform_device_count=4"
    sys.path.insert(0, ROOT)
    import re, numpy as np, jax, jax.numpy as jnp, hlofuse
    from jax.sharding import PartitionSpec as P
    from hlofuse.runtime.testing import compare
    mesh = jax.make_mesh((4,), ("d",), axis_types=(jax.sharding.AxisType.Auto,))

    @jax.shard_map(mesh=mesh, in_specs=(P("d"), P()), out_specs=P())
    def f(x, w):
        h = jnp.tanh(x @ w)
        return jax.lax.psum(jnp.sum(h * h, axis=0), "d")

    x = np.random.default_rng(0).standard_normal((16, 8)).astype(np.float32)
    w = np.random.default_rng(1).standard_normal((8, 8)).astype(np.float32)
    want = jax.jit(f)(x, w)
    h = hlofuse.jit(f, autotune=False)
    got = h(x, w)
    text = h.lower(x, w).as_text()
    refs = set(re.findall(r"mesh = @(\\w+)", text))
    defined = set(re.findall(r"sdy.mesh @(\\w+)", text))
    print(json.dumps({"problems": compare(got, want, "reassociate"), "refs": sorted(refs),
                      "defined": sorted(defined),
                      "jax_has_group_mesh": "replica_group_mesh_axes" in jax.jit(f).lower(x, w).as_text()}))
''').replace("ROOT", repr(ROOT))


@entry("rgv3_meshes")
def test_rgv3_meshes():
    """shard_map collectives that name their mesh (0.11+) keep a defined mesh through hlofuse."""
    out = run_json_child(_RGV3, timeout=600)
    assert not out["problems"], out
    assert set(out["refs"]) <= set(out["defined"]), out          # no dangling @mesh reference
    assert out["jax_has_group_mesh"] == compat.HAS_RGV3, out


@entry("loop_bodies")
def test_loop_bodies():
    outlined = compat.outlines_loop_bodies()

    def f(x, w):
        def body(i, h):
            return jnp.tanh(h @ w) + 0.1 * i
        return jax.lax.fori_loop(0, 3, body, x)
    x = jnp.ones((8, 16), jnp.float32) * 0.1
    w = jnp.eye(16, dtype=jnp.float32) * 0.5
    assert_same(hlofuse.jit(f, autotune=False)(x, w), jax.jit(f)(x, w), "reassociate")
    assert outlined in on(True, False)


@entry("serialization")
def test_serialization():
    # 11 on 0.10.x, 12 on 0.12.0, 13 from 0.12.1
    assert compat.serialization_version() in (
        on(11, 12) if compat.JAX_VERSION < (0, 12, 1) else {13})
    exp = jax.export.export(jax.jit(lambda x: jnp.sin(x) * 2))(jnp.ones(3))
    back = jax.export.deserialize(exp.serialize())
    np.testing.assert_allclose(back.call(jnp.ones(3)), jnp.sin(1.0) * 2, rtol=1e-6)


@entry("embedded_constants")
def test_embedded_constants():
    """A kernel's module must hold its constants: from jax 0.12.1 a closed-over constant over
    1 KiB becomes an argument of ``main`` unless hlofuse lowers in this context."""
    table = np.arange(2048, dtype=np.float32)

    def f(x):
        return x * table

    spec = jax.ShapeDtypeStruct((2048,), np.float32)
    plain = jax.jit(f).lower(spec).as_text()
    assert ("jax.const = true" in plain) in ({False} if compat.JAX_VERSION < (0, 12, 1) else {True})
    with compat.embedded_constants():
        inside = jax.jit(f).lower(spec).as_text()
    assert "jax.const = true" not in inside and "stablehlo.constant dense<" in inside


@entry("cpu_attention_rows")
def test_cpu_attention_rows():
    fused = compat.cpu_fuses_attention_rows()
    assert fused in on(False, True) or "ynn_fusion_type" in os.environ.get("XLA_FLAGS", "")
    # the default forward plan follows it: whole rows (bk = Sk) only where XLA fuses them
    q = jnp.ones((1, 4096, 8, 64), jnp.float32) * 0.01

    def attn(q, k, v):
        s = jnp.einsum("bqhd,bkhd->bhqk", q, k) / 8.0
        return jnp.einsum("bhqk,bkhd->bqhd", jax.nn.softmax(s, axis=-1), v)
    f = hlofuse.jit(attn, autotune=False)
    blocks_ = [r.block for r in f.report(q, q, q).regions if "attention" in r.kind]
    want = "cpu row loops bq=1024 bk=4096" if fused else "cpu loops bq="
    assert len(blocks_) == 1 and blocks_[0].startswith(want), blocks_
