"""The IR layer: parsing every format, serialization, surgery guards (the crash hazards)."""

from __future__ import annotations

import numpy as np
import pytest

import jax
import jax.numpy as jnp
from jax import export as jexport
from jaxlib.mlir import ir

from hlofuse.core import ir as hir


def _exported():
    return jexport.export(jax.jit(lambda x: jnp.tanh(x) * 2.0), platforms=["cpu"])(
        jax.ShapeDtypeStruct((4, 8), jnp.float32))


def test_parse_every_format_gives_the_same_module():
    exp = _exported()
    text = exp.mlir_module()
    ctx = hir.new_context()
    from_text = hir.parse(text, ctx)
    variants = {
        "text": text,
        "bytecode": hir.to_bytecode(from_text),
        "portable": exp.mlir_module_serialized,
        "exported": bytes(exp.serialize()),
    }
    expected = hir.to_text(from_text)
    for fmt, data in variants.items():
        assert hir.detect_format(data) == fmt
        m = hir.parse(data, ctx, source=fmt)
        assert hir.to_text(m) == expected, fmt


def test_portable_artifact_round_trip_does_not_mutate():
    ctx = hir.new_context()
    m = hir.parse(_exported().mlir_module(), ctx)
    before = hir.to_text(m)
    art = hir.to_portable_artifact(m)
    assert hir.detect_format(art) == "portable"
    assert hir.to_text(m) == before  # H2: the source module stays StableHLO
    assert hir.to_text(hir.parse(art, ctx)) == before


@pytest.mark.parametrize("data,needle", [
    (b"\x00\x01garbage\xff\xfe" * 10, "not StableHLO"),
    ("module { func.func @main( ", "cannot parse"),
    ("func.func @f() { \"bogus.op\"() : () -> () \n func.return }", "cannot parse"),
])
def test_bad_input_names_the_source(data, needle):
    with pytest.raises(hir.IRError) as e:
        hir.parse(data, source="model.mlir")
    assert "model.mlir" in str(e.value) and needle in str(e.value)


def test_missing_main_is_a_clear_error():
    m = hir.parse("func.func @other(%a: tensor<f32>) -> tensor<f32> { func.return %a : tensor<f32> }")
    with pytest.raises(hir.IRError, match="no 'main'"):
        hir.main_func(m, source="x.mlir")


def test_safe_erase_refuses_ops_with_uses():
    m = hir.parse(_exported().mlir_module())
    main = hir.main_func(m)
    op = hir.block_ops(main.regions[0].blocks[0])[0]
    assert hir.has_uses(op)
    with pytest.raises(hir.IRError, match="still have uses"):
        hir.safe_erase(op)
    hir.verify(m)  # untouched


def test_import_funcs_refuses_cross_context():
    a = hir.parse(_exported().mlir_module(), hir.new_context())
    b = hir.parse(_exported().mlir_module(), hir.new_context())
    with pytest.raises(hir.IRError, match="across MLIR contexts"):
        hir.import_funcs(a, b, "k_")
    hir.verify(a)


def test_import_funcs_prefixes_and_privatizes():
    ctx = hir.new_context()
    a = hir.parse(_exported().mlir_module(), ctx)
    b = hir.parse(_exported().mlir_module(), ctx)
    mapping = hir.import_funcs(a, b, "k_")
    assert mapping == {"main": "k_main"}
    names = [hir.func_name(f) for f in hir.funcs(a)]
    assert names == ["main", "k_main"]
    assert "private" in str(hir.funcs(a)[1].attributes["sym_visibility"])
    hir.verify(a)


def test_inline_all_calls_flattens_nested_calls_bit_exactly():
    def f(x):
        inner = jax.jit(lambda v: jax.nn.relu(v) * 2.0)
        return jax.jit(lambda v: inner(v) + jnp.where(v > 0, v, 1.0))(x) + 1.0
    exp = jexport.export(jax.jit(f), platforms=["cpu"])(jax.ShapeDtypeStruct((8,), jnp.float32))
    m = hir.parse(exp.mlir_module())
    n = hir.inline_all_calls(m)
    assert n >= 2
    assert not [op for op in hir.all_ops(m) if op.name == "func.call"]
    hir.verify(m)
    x = np.linspace(-2, 2, 8, dtype=np.float32)
    import dataclasses
    out = dataclasses.replace(exp, mlir_module_serialized=hir.to_bytecode(m)).call(x)
    np.testing.assert_array_equal(out, f(x))


def test_check_no_host_callbacks():
    text = """func.func @main(%a: tensor<f32>) -> tensor<f32> {
      %0 = stablehlo.custom_call @xla_ffi_python_cpu_callback(%a) : (tensor<f32>) -> tensor<f32>
      func.return %0 : tensor<f32> }"""
    with pytest.raises(hir.IRError, match="host callbacks"):
        hir.check_no_host_callbacks(hir.parse(text), source="cb.mlir")


def test_eval_module_runs_in_a_subprocess():
    text = _exported().mlir_module()
    x = np.linspace(-1, 1, 32, dtype=np.float32).reshape(4, 8)
    (out,) = hir.eval_module(text, [x])
    np.testing.assert_allclose(out, np.tanh(x) * 2, rtol=1e-6)
    bad = """func.func @main(%a: tensor<f32>) -> tensor<f32> {
      %0 = stablehlo.custom_call @lapack_whatever(%a) : (tensor<f32>) -> tensor<f32>
      func.return %0 : tensor<f32> }"""
    with pytest.raises(hir.IRError, match="reference interpreter failed"):
        hir.eval_module(bad, [np.float32(1.0)])


def test_ops_text_is_op_text_of_each_op():
    """ops_text names SSA values once per function; the text must be op_text's, op by op,
    for every function of a module with several (values numbered per function), regions
    (a reduce body) and ops taken out of order."""
    def f(x, w):
        y = jnp.tanh(x @ w) + x * 2.0
        return jax.nn.softmax(y).sum(axis=0), jax.jit(lambda a: a * 3.0)(y)

    text = jax.jit(f).lower(jnp.ones((8, 8)), jnp.ones((8, 8))).as_text()
    m = hir.parse(text)
    seen = 0
    for fn in hir.funcs(m):
        ops = list(fn.regions[0].blocks[0].operations)
        for sub in (ops, ops[::-1], ops[1:3]):
            assert hir.ops_text(sub) == "\n".join(hir.op_text(o) for o in sub)
            seen += len(sub)
        assert "stablehlo" in hir.ops_text(ops)
    assert len(hir.funcs(m)) >= 2 and seen > 10
    assert hir.ops_text([]) == ""


_INT_DTYPES = ["int32", "int8", "uint32", "uint8"]


def _division_cases(dt):
    info = np.iinfo(dt)
    signed = info.min < 0
    a = np.array([7, 250 if not signed else -7, info.min, info.max, 0, 9, 100, 3], dt)
    b = np.array([0, 0, -1 if signed else 0, 0, 0, 2, 7, -1 if signed else 1], dt)
    return a, b


@pytest.mark.parametrize("dt", _INT_DTYPES)
def test_integer_division_by_zero_and_minus_one_gives_xlas_values_and_never_traps(dt):
    """H9: the canonicalizer (jaxlib 0.10.2) and XLA's constant folder divided integer
    constants with the host's division: a zero divisor killed the process (SIGFPE), e.g.
    ``7 // (argmax(x) * 0)`` or a frozen divisor holding 0 (adversarial rounds). Guarded, the
    frozen program gives what jax.jit gives for the same values passed at run time."""
    import hlofuse
    a, b = _division_cases(dt)
    f = lambda a, b: (jax.lax.div(a, b), jax.lax.rem(a, b))   # noqa: E731
    want = jax.jit(f)(a, b)                                    # run-time values: no folding
    frozen = hlofuse.jit(f, freeze_argnums=(0, 1), tiered=False, autotune=False,
                         options={"strict": True})
    for g, w in zip(frozen(a, b), want):
        np.testing.assert_array_equal(np.asarray(g), np.asarray(w))
    live = hlofuse.jit(f, tiered=False, autotune=False, options={"strict": True})
    for g, w in zip(live(a, b), want):
        np.testing.assert_array_equal(np.asarray(g), np.asarray(w))


def test_a_divisor_that_folds_to_zero_inside_the_canonicalizer_does_not_trap():
    import hlofuse
    x = jnp.arange(8.0)
    for f in (lambda x: 7 // (jnp.argmax(x) * 0),
              lambda x: jnp.int32(7) // jnp.zeros((), jnp.int32) + jnp.argmax(x)):
        got = hlofuse.jit(f, tiered=False, autotune=False, options={"strict": True})(x)
        assert int(got) == int(jax.jit(f)(x))


def test_guard_integer_division_rewrites_what_may_trap_once():
    text = """
func.func @main(%a: tensor<4xi32>, %b: tensor<4xi32>) -> (tensor<4xi32>, tensor<4xi32>, tensor<4xui8>) {
  %c = stablehlo.constant dense<[1, 2, 3, 4]> : tensor<4xi32>
  %z = stablehlo.constant dense<[1, 0, 3, 4]> : tensor<4xi32>
  %u = stablehlo.constant dense<255> : tensor<4xui8>
  %safe = stablehlo.divide %a, %c : tensor<4xi32>
  %d = stablehlo.remainder %a, %b : tensor<4xi32>
  %e = stablehlo.divide %safe, %z : tensor<4xi32>
  %uu = stablehlo.divide %u, %u : tensor<4xui8>
  return %d, %e, %uu : tensor<4xi32>, tensor<4xi32>, tensor<4xui8>
}"""
    m = hir.parse(text, hir.new_context())
    assert hir.guard_integer_division(m) == 2        # %d (a run-time divisor) and %e (a 0)
    hir.verify(m)
    once = hir.to_text(m)
    assert hir.guard_integer_division(m) == 0 and hir.to_text(m) == once
    a, b = np.array([5, -9, 7, 8], np.int32), np.array([0, 2, -1, 3], np.int32)
    from hlofuse.runtime.execute import run_module
    d, e, uu = run_module(once, [a, b])
    np.testing.assert_array_equal(d, [5, -1, 0, 2])
    np.testing.assert_array_equal(e, [5, -1, 0, 0])      # [5, -4, 2, 2] / [1, 0, 3, 4]
    np.testing.assert_array_equal(uu, [1, 1, 1, 1])
