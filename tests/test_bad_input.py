"""Bad input never crashes the Python process: a clear ``hlofuse.IRError`` or a pass-through.

Cases that could take the interpreter down (corrupt MLIR bytecode aborts jaxlib's parser with
``std::terminate`` or heap corruption) run in a child process; the test asserts the child
exited normally (not by a signal) and that every case gave IRError.
"""

import json
import os
import subprocess
import sys
import textwrap
import warnings

import ml_dtypes
import numpy as np
import pytest

import jax
import jax.numpy as jnp

import hlofuse
from hlofuse.runtime.testing import ALL_KERNELS
from hlofuse.core import ir as hir
from hlofuse.runtime.execute import run_module
from hlofuse.core.report import HlofuseWarning
from hlofuse.runtime.testing import assert_same
from tests.bad_inputs import ARITH_ONLY, MHLO


def _good_text() -> str:
    return jax.jit(lambda x, y: (jnp.tanh(x * 2 + y) * y, (x @ y.T).sum(0))).lower(
        jnp.ones((4, 8)), jnp.ones((4, 8))).as_text()


def _both(data):
    """hlofuse.core.ir.parse and hlofuse.optimize (cpu and gpu) on ``data``."""
    yield lambda: hir.parse(data)
    yield lambda: hlofuse.optimize(data, target="cpu")
    yield lambda: hlofuse.optimize(data, target="gpu")


def _assert_ir_error(data, match):
    for call in _both(data):
        with pytest.raises(hlofuse.IRError, match=match):
            call()


EW = ("module {{ func.func @main(%a: {T}, %b: {T}) -> {T} {{ %0 = {OP} %a, %b : {T}\n"
      " %1 = stablehlo.multiply %0, %b : {T}\n %2 = stablehlo.subtract %1, %a : {T}\n"
      " return %2 : {T} }} }}")


@pytest.mark.parametrize("name,data,match", [
    ("random bytes", bytes(np.random.default_rng(0).integers(0, 256, 4096, dtype=np.uint8)), "not StableHLO"),
    ("bytecode magic + garbage", b"ML\xefR" + bytes(np.random.default_rng(1).integers(0, 256, 600, dtype=np.uint8)),
     "cannot parse|corrupt"),
    ("truncated text", "module { func.func @main(%a: tensor<4xf32>) -> tensor<4xf32> { %0 = stablehlo.ta",
     "cannot parse"),
    ("unregistered dialect", 'module { func.func @main(%a: tensor<4xf32>) -> tensor<4xf32> { '
     '%0 = "torch.aten.relu"(%a) : (tensor<4xf32>) -> tensor<4xf32>\n return %0 : tensor<4xf32> } }',
     "unregistered dialect"),
    ("vhlo as text", "module { vhlo.func_v1 @main() -> () {} }", "cannot parse|vhlo"),
    ("unranked", "module { func.func @main(%a: tensor<*xf32>) -> tensor<*xf32> { %0 = stablehlo.tanh %a : "
     "tensor<*xf32>\n return %0 : tensor<*xf32> } }", "ranked"),
    ("does not verify", "module { func.func @main(%a: tensor<4xf32>) -> tensor<8xf32> { return %a : "
     "tensor<4xf32> } }", "doesn't match"),
    ("dimension overflow", "module { func.func @main(%a: tensor<99999999999999999999xf32>) -> "
     "tensor<99999999999999999999xf32> { return %a : tensor<99999999999999999999xf32> } }", "invalid dimension"),
])
def test_malformed_input_is_an_ir_error(name, data, match):
    _assert_ir_error(data, match)


def test_no_main_is_an_ir_error():
    for data in ("", b"", "module { func.func @f(%a: tensor<4xf32>) -> tensor<4xf32> { return %a : tensor<4xf32> } }"):
        hir.parse(data)  # a module, just not a program
        for target in ("cpu", "gpu"):
            with pytest.raises(hlofuse.IRError, match="no 'main'"):
                hlofuse.optimize(data, target=target)


def test_truncated_bytecode_and_artifacts_are_ir_errors():
    m = hir.parse(_good_text())
    bc, art = hir.to_bytecode(m), hir.to_portable_artifact(m)
    _assert_ir_error(bc[: len(bc) // 2], "cannot parse|corrupt")
    _assert_ir_error(art[: len(art) * 2 // 3], "cannot parse|corrupt")


def test_truncated_exported_is_an_ir_error():
    blob = bytes(jax.export.export(jax.jit(jnp.tanh))(jnp.ones(3)).serialize())
    _assert_ir_error(blob[: len(blob) // 3], "not StableHLO|cannot parse|corrupt")


@pytest.mark.parametrize("text", [
    # other dialects jax's context knows: nothing hlofuse can fuse, passed through untouched
    "module { func.func @main(%a: tensor<4xf32>, %b: tensor<4xf32>) -> tensor<4xf32> { "
    "%0 = arith.addf %a, %b : tensor<4xf32>\n %1 = arith.mulf %0, %a : tensor<4xf32>\n return %1 : tensor<4xf32> } }",
    "module { func.func @main(%a: tensor<?x4xf32>) -> tensor<?x4xf32> { %0 = stablehlo.tanh %a : tensor<?x4xf32>\n"
    " %1 = stablehlo.add %0, %a : tensor<?x4xf32>\n return %1 : tensor<?x4xf32> } }",
    # recursion: not inlinable, left as a call
    "module { func.func @main(%a: tensor<4xf32>) -> tensor<4xf32> { %0 = call @main(%a) : (tensor<4xf32>) -> "
    "tensor<4xf32>\n return %0 : tensor<4xf32> } }",
])
def test_foreign_but_valid_modules_pass_through(text):
    for target in ("cpu", "gpu", "tpu"):
        opt = hlofuse.optimize(text, target=target)
        hir.verify(opt.module)
        assert not opt.report.regions
        assert opt.text == hlofuse.optimize(text, pipeline="cleanup").text


def test_modules_without_stablehlo_ops_pass_through_and_say_so():
    """Issue 11 #8: a func+arith module was 'optimized' as if it were StableHLO."""
    opt = hlofuse.optimize(ARITH_ONLY, source="a.mlir")
    assert opt.text == hir.to_text(hir.parse(ARITH_ONLY))
    assert opt.report.notes == ["a.mlir: no StableHLO ops (dialects: arith, func); passed "
                                "through unchanged"]
    assert not opt.report.passes                                # no pass ran over it


def test_mhlo_is_refused_with_a_conversion_that_works():
    """Issue 11 #8: MHLO was 'optimized' with exit 0; it is refused, and the conversion the
    message names (jaxlib's hlo-legalize-to-stablehlo) really turns it into StableHLO."""
    with pytest.raises(hlofuse.IRError, match=r"m.mlir: an MHLO module \(mhlo.add, mhlo.tanh\)") as e:
        hlofuse.optimize(MHLO, source="m.mlir")
    assert "hlo-legalize-to-stablehlo" in str(e.value)
    from jaxlib.mlir import passmanager
    from jaxlib.mlir.dialects import mhlo
    module = hir.parse(MHLO)
    mhlo.register_mhlo_passes()
    with module.context:
        passmanager.PassManager.parse("builtin.module(hlo-legalize-to-stablehlo)").run(module.operation)
    opt = hlofuse.optimize(hir.to_text(module))
    assert len(opt.report.kernels) == 1
    x = np.linspace(-1, 1, 4, dtype=np.float32)
    assert_same(run_module(opt.module, [x]), [np.tanh(x + x)], "kernel")


# element type -> numpy dtype for inputs; all pass through (no kernel) and keep their results
UNSUPPORTED = {"complex<f32>": np.complex64, "f8E4M3FN": ml_dtypes.float8_e4m3fn,
               "f8E5M2": ml_dtypes.float8_e5m2, "i4": ml_dtypes.int4, "ui4": ml_dtypes.uint4,
               "f4E2M1FN": ml_dtypes.float4_e2m1fn}


@pytest.mark.parametrize("elt", sorted(UNSUPPORTED) + ["f64", "i64"])
def test_unsupported_dtypes_pass_through(elt):
    integer = elt.startswith(("i", "ui"))
    text = EW.format(T=f"tensor<4x8x{elt}>", OP="stablehlo.and" if integer else "stablehlo.add")
    for target in ("cpu", "gpu", "tpu"):
        opt = hlofuse.optimize(text, target=target)
        hir.verify(opt.module)
        assert not opt.report.kernels
        assert len(opt.report.regions) == 0
    if elt in UNSUPPORTED:  # 64-bit inputs would need jax_enable_x64 to reach XLA
        dt = UNSUPPORTED[elt]
        a = (np.arange(32, dtype=np.float32).reshape(4, 8) % 5).astype(dt)
        b = ((np.arange(32, dtype=np.float32).reshape(4, 8) + 1) % 3).astype(dt)
        assert_same(run_module(opt.module, [a, b]), run_module(text, [a, b]), "exact")


def test_huge_shapes_are_left_to_xla_with_a_warning():
    t = "tensor<100000000000x100000000xf32>"
    text = (f"module {{ func.func @main(%a: {t}) -> {t} {{ %0 = stablehlo.tanh %a : {t}\n"
            f" %1 = stablehlo.add %0, %a : {t}\n %2 = stablehlo.multiply %1, %a : {t}\n return %2 : {t} }} }}")
    for target in ("cpu", "gpu", "tpu"):
        with warnings.catch_warnings(record=True) as w:
            warnings.simplefilter("always")
            opt = hlofuse.optimize(text, target=target, options=ALL_KERNELS)
        hir.verify(opt.module)
        (region,) = opt.report.regions
        # gpu cannot build it (CUDA grid limits): left to XLA with a warning; tpu's 128x2048
        # blocks fit its grid, and cpu's kernel is one grid step (no int32 grid index), so
        # both lower
        if region.kernel is None:
            assert target == "gpu"
            assert region.reason.startswith("kernel build failed")
            assert any(issubclass(x.category, HlofuseWarning) and "region 0" in str(x.message) for x in w)
        else:
            assert target in ("cpu", "tpu")
        # regression: sizes past 2**63 bytes wrapped around to negative costs (np.prod)
        assert region.bytes_unfused > 2**64 and region.flops > 0


def test_zero_size_tensors_pass_through():
    t = "tensor<0x4xf32>"
    text = (f"module {{ func.func @main(%a: {t}) -> {t} {{ %0 = stablehlo.tanh %a : {t}\n"
            f" %1 = stablehlo.add %0, %a : {t}\n return %1 : {t} }} }}")
    opt = hlofuse.optimize(text)
    hir.verify(opt.module)
    assert run_module(opt.module, [np.zeros((0, 4), np.float32)])[0].shape == (0, 4)


# ---------------------------------------------------------------------------------------------
# Crash-prone binary input, in a child process
# ---------------------------------------------------------------------------------------------

_CHILD = textwrap.dedent("""
    import json, sys
    import numpy as np
    import hlofuse
    from hlofuse.core import ir as hir

    def corrupt(src, k):
        # the recipe the fuzz run used; seeds 20 and 140 aborted jaxlib's parser in-process
        r = np.random.default_rng(k)
        b = bytearray(src)
        kind = k % 4
        if kind == 0:
            for _ in range(r.integers(1, 6)):
                i = r.integers(0, len(b)); b[i] = r.integers(0, 256)
        elif kind == 1:
            b = b[:r.integers(4, len(b))]
        elif kind == 2:
            i = r.integers(4, len(b)); b[i:i] = bytes(r.integers(0, 256, r.integers(1, 20), dtype=np.uint8))
        else:
            i = r.integers(4, len(b)); del b[i:i + r.integers(1, 30)]
        return bytes(b)

    bc, pa = (open(p, "rb").read() for p in sys.argv[1:3])
    cases = {"bytecode seed 20 (heap corruption)": corrupt(bc, 20),
             "bytecode seed 140 (nanobind terminate)": corrupt(bc, 140),
             "portable flipped": bytes(x ^ 0xFF if i % 37 == 0 and i > 40 else x for i, x in enumerate(pa))}
    out = {}
    for name, data in cases.items():
        res = []
        for call in (lambda: hir.parse(data), lambda: hlofuse.optimize(data)):
            try:
                call()
                res.append("ok")
            except hlofuse.IRError as e:
                res.append("IRError")
            except Exception as e:
                res.append(f"{type(e).__name__}: {e}")
        out[name] = res
    print("RESULT " + json.dumps(out))
""")


def test_corrupt_bytecode_never_kills_the_process(tmp_path):
    m = hir.parse(_good_text())
    (tmp_path / "m.mlirbc").write_bytes(hir.to_bytecode(m))
    (tmp_path / "m.vhlo").write_bytes(hir.to_portable_artifact(m))
    p = subprocess.run([sys.executable, "-c", _CHILD, str(tmp_path / "m.mlirbc"), str(tmp_path / "m.vhlo")],
                       capture_output=True, text=True, timeout=600,
                       env=dict(os.environ, JAX_PLATFORMS="cpu"))
    assert p.returncode >= 0, f"child killed by signal {-p.returncode}: {p.stderr[-2000:]}"
    assert p.returncode == 0, p.stderr[-2000:]
    (line,) = [l for l in p.stdout.splitlines() if l.startswith("RESULT ")]
    results = json.loads(line[len("RESULT "):])
    assert results and all(r == ["IRError", "IRError"] for r in results.values()), results


def test_own_serializations_are_not_probed(monkeypatch):
    """Bytes this process wrote parse in-process without the subprocess probe (fast path)."""
    m = hir.parse(_good_text())
    data = hir.to_bytecode(m)
    art = hir.to_portable_artifact(m)

    def no_probe(*a, **k):
        raise AssertionError("probed a payload this process produced")

    monkeypatch.setattr(hir, "probe_parse", no_probe)
    assert hir.to_text(hir.parse(data)) == hir.to_text(m)
    hir.verify(hir.parse(art))


# ---------------------------------------------------------------------------------------------
# Deeply nested text: refused before the parser recurses off its stack
# ---------------------------------------------------------------------------------------------

_DEEP_CHILD = textwrap.dedent("""
    import json
    import hlofuse
    from hlofuse.core import ir as hir
    n = 20000
    cases = {
        "dense literal": "module { func.func @main() -> tensor<f32> { %0 = stablehlo.constant dense<"
                         + "[" * n + "1.0" + "]" * n + "> : tensor<f32>\\n return %0 : tensor<f32> } }",
        "array attribute": "module attributes {x = " + "[" * n + "]" * n + "} { func.func @main() { return } }",
        "dictionary": "module attributes {x = " + "{a = " * n + "1" + "}" * n + "} { func.func @main() { return } }",
        "bytes": ("module { func.func @main() { return } }\\n// " + "{" * n).encode()
                 + b"\\n" + b"module attributes {x = " + b"[" * n + b"]" * n + b"} {}",
    }
    out = {}
    for name, data in cases.items():
        res = []
        for call in (lambda: hir.parse(data), lambda: hlofuse.optimize(data)):
            try:
                call()
                res.append("ok")
            except hlofuse.IRError as e:
                res.append("IRError: " + str(e))
            except Exception as e:
                res.append(f"{type(e).__name__}: {e}")
        out[name] = res
    print("RESULT " + json.dumps(out))
""")


def test_deeply_nested_text_never_kills_the_process():
    """Issue 11 #7: ``hlofuse.optimize('[' * 20000 ...)`` segfaulted the caller (the MLIR
    parser recursed off its stack); only bytecode had a crash guard."""
    p = subprocess.run([sys.executable, "-c", _DEEP_CHILD], capture_output=True, text=True,
                       timeout=600, env=dict(os.environ, JAX_PLATFORMS="cpu"))
    assert p.returncode == 0, f"child died (rc {p.returncode}): {p.stderr[-2000:]}"
    (line,) = [l for l in p.stdout.splitlines() if l.startswith("RESULT ")]
    results = json.loads(line[len("RESULT "):])
    for name, res in results.items():
        for r in res:
            assert r.startswith("IRError") and "nested more than 1000 levels" in r, (name, r)
    assert "at line 1" in results["dense literal"][0]


def test_nesting_guard_ignores_strings_arrows_and_wide_modules():
    """Brackets inside string literals, ``->`` and many shallow brackets are no nesting."""
    many = "module attributes {test.s = \"" + "[" * 5000 + "\"} {\n" + "\n".join(
        f"  func.func private @f{i}(%a: tensor<2xf32>) -> (tensor<2xf32>) {{ return %a : tensor<2xf32> }}"
        for i in range(400)) + "\n  func.func @main(%a: tensor<2xf32>) -> tensor<2xf32> { return %a : tensor<2xf32> }\n}\n"
    hir.check_text_nesting(many)
    hir.verify(hir.parse(many))
    hir.check_text_nesting("[" * 1000 + "]" * 1000)
    with pytest.raises(hlofuse.IRError, match="at line 3"):
        hir.check_text_nesting("a\nb\n" + "(" * 1001, source="x.mlir")
