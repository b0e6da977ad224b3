"""Regions left to XLA go back inline in the module XLA compiles (``Optimized.bytecode``).

Fusion outlines every candidate region into a function; a region that gets no kernel (the cost
model, the unmeasured gpu/tpu policy, a measurement, a failed build) stays a call of that
function in ``Optimized.module``, where the report, Model Explorer and rollbacks read it. XLA
fuses and assigns buffers across a call boundary differently from the same ops inline (the
ViT-B/16 training step on v5e: 63 KiB more temporaries than jax.jit's with no kernel at all), so
the module handed to XLA has those calls inlined; kernels stay calls.
"""

from __future__ import annotations

import numpy as np

import jax
from jaxlib.mlir import ir

import hlofuse
from hlofuse.core import ir as hir
from hlofuse.passes.fusion.outline import KIND_ATTR, XLA_ATTR, inline_xla_regions
from hlofuse.runtime.execute import run_module
from hlofuse.runtime.testing import assert_same

F32 = np.float32


def _block(x, w, b, g):
    h = jax.nn.gelu(x @ w + b)
    mu = h.mean(-1, keepdims=True)
    var = ((h - mu) ** 2).mean(-1, keepdims=True)
    return (h - mu) * jax.lax.rsqrt(var + 1e-5) * g + x


def _args(rng=np.random.default_rng(0)):
    return (rng.standard_normal((64, 128)).astype(F32), (rng.standard_normal((128, 128)) / 12).astype(F32),
            rng.standard_normal(128).astype(F32), rng.standard_normal(128).astype(F32))


def _funcs(module):
    out = {}
    for f in hir.funcs(module):
        attrs = f.operation.attributes
        out[hir.func_name(f)] = ("xla" if XLA_ATTR in attrs else "region" if KIND_ATTR in attrs
                                 else "other")
    return out


def _callee(call) -> str:
    return ir.FlatSymbolRefAttr(call.attributes["callee"]).value


def _calls(module):
    return [op for op in hir.all_ops(module) if op.name == "func.call"]


def test_regions_left_to_xla_are_inlined_in_what_xla_compiles_and_results_are_bit_exact():
    text = jax.jit(_block).lower(*_args()).as_text()
    opt = hlofuse.optimize(text, target="cpu", options={"kernelize": {"no_kernels": True}})
    kinds = _funcs(opt.module)
    assert list(kinds.values()).count("xla") >= 2, kinds     # the report's form keeps the calls
    assert _calls(opt.module)
    flat = hir.parse(opt.bytecode)
    assert set(_funcs(flat).values()) == {"other"} and not _calls(flat), _funcs(flat)
    assert len(_funcs(opt.module)) == len(kinds)              # Optimized.module is left as it was
    inputs = list(_args())
    assert_same(run_module(flat, inputs), run_module(opt.module, inputs), "exact")
    assert_same(run_module(flat, inputs), run_module(text, inputs), "reassociate")


def test_kernels_stay_calls_and_only_xla_regions_are_inlined():
    text = jax.jit(_block).lower(*_args()).as_text()
    opt = hlofuse.optimize(text, target="cpu")
    m = hir.clone_module(opt.module)
    before = _funcs(m)
    n = inline_xla_regions(m)
    after = _funcs(m)
    assert n == list(before.values()).count("xla")
    assert "xla" not in after.values()
    # every function that was not a region left to XLA is still there (kernels, their callees)
    assert {k for k, v in before.items() if v != "xla"} == set(after)
    kept_calls = [c for c in _calls(opt.module) if before[_callee(c)] != "xla"]
    assert kept_calls and len(_calls(m)) == len(kept_calls)
    inputs = list(_args())
    assert_same(run_module(m, inputs), run_module(opt.module, inputs), "exact")


def test_no_kernel_program_compiles_to_jax_jits_memory_plan():
    """With every region left to XLA, hlofuse.jit's executable has jax.jit's buffer plan."""
    args = _args()
    f = hlofuse.jit(_block, options={"kernelize": {"no_kernels": True}}, autotune="off")
    lowered = f.lower(*args)
    assert lowered.report.left_to_xla and not lowered.report.kernels
    mine = lowered.jax_lowered.compile().memory_analysis()
    theirs = jax.jit(_block).lower(*args).compile().memory_analysis()
    for field in ("argument_size_in_bytes", "output_size_in_bytes", "temp_size_in_bytes",
                  "alias_size_in_bytes"):
        assert getattr(mine, field) == getattr(theirs, field), field
    np.testing.assert_array_equal(np.asarray(f(*args)), np.asarray(jax.jit(_block)(*args)))
