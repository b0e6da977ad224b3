"""Kernel names (issue 48, item 4): every kernel hlofuse emits is named after its region kind
and the user's source line, ``hlofuse_<kind>[_<variant>]_<file>_<line>`` (passes/kernelize.py,
``kernel_name``: ``hlofuse_attention_cpu_test_kernel_names_py_<line>``,
``hlofuse_reduction_softmax_test_kernel_names_py_<line>``), so XLA's HLO, profiles and the
report point at the model's code. Kernels are still built once per region body (the cache is keyed by the body
without locations) and renamed per region in the lowered text (kernels/naming.py): in the
ops' name stacks (XLA's ``op_name`` metadata), Triton's kernel function (inside its serialized
module) and Mosaic's ``kernel_name``. The source lines are read from this file with
``inspect``, never written down."""

from __future__ import annotations

import glob
import inspect
import os
import re

import numpy as np
import pytest

import jax
import jax.numpy as jnp

import hlofuse
from hlofuse.core import ir as hir
from hlofuse.core.pipeline import PassContext, PassManager
from hlofuse.core.report import Report
from hlofuse.kernels import lowering, naming
from hlofuse.passes import kernelize as kz
from hlofuse.passes.kernel_table import kernel_funcs
from hlofuse.runtime import aot
from hlofuse.runtime.testing import assert_same

FILE = "test_kernel_names_py"


def model(q, k, v, x):
    o = jax.nn.dot_product_attention(q, k, v)
    s = jax.nn.softmax(jnp.tanh(x * 2.0) + x, axis=-1)
    return o, s


def two_lines(x, y):
    a = jax.nn.softmax(jnp.tanh(x) * 3.0, axis=-1)
    b = jax.nn.softmax(jnp.tanh(y) * 3.0, axis=-1)
    return a, b


def one_line(x, y):
    return jax.nn.softmax(jnp.tanh(x) * 3.0, axis=-1), jax.nn.softmax(jnp.tanh(y) * 3.0, axis=-1)


def line_of(fn, text: str) -> int:
    """The line of this file on which ``fn``'s source has ``text`` (first occurrence)."""
    src, start = inspect.getsourcelines(fn)
    return start + next(i for i, s in enumerate(src) if text in s)


def model_args():
    rng = np.random.default_rng(0)
    qkv = [rng.standard_normal((2, 64, 4, 32)).astype(np.float32) for _ in range(3)]
    return (*qkv, rng.standard_normal((64, 128)).astype(np.float32))


def named(kind: str, line: int) -> str:
    """The pattern of a kernel name: its kind, the family's variant (``cpu``, ``softmax``),
    this file and ``line``."""
    return rf"hlofuse_{kind}(_[a-z0-9]+)*_{FILE}_{line}"


def model_lines() -> dict[str, int]:
    return {"attention": line_of(model, "dot_product_attention"),
            "reduction": line_of(model, "softmax")}


def check_names(names: dict[str, str]) -> None:
    """``names`` (kind -> kernel name) are the model's two kernels, named after their lines."""
    lines = model_lines()
    assert set(names) == set(lines), names
    for kind, name in names.items():
        assert re.fullmatch(named(kind, lines[kind]), name), (kind, name)


def test_kernels_are_named_after_the_region_kind_and_the_users_line():
    """hlofuse.jit on cpu: the report, the optimized module's kernel functions and XLA's
    compiled HLO name each kernel ``hlofuse_<kind>[_<variant>]_test_kernel_names_py_<line>``,
    ``<line>`` the line of the attention call and of the softmax chain; the results are
    jax.jit's within the tolerance table."""
    args = model_args()
    g = hlofuse.jit(model)
    report = g.report(*args)
    want = {r.kind: r.kernel for r in report.regions if r.kernel}
    check_names(want)
    for name in want.values():
        assert name in str(report)
    low = g.lower(*args)
    module = hir.parse(low.as_text(debug_info=True), hir.new_context())
    table = {hir.func_name(f): f for f in hir.funcs(module)}
    kernels = kernel_funcs(module)
    assert {k.kind: k.kernel for k in kernels.values()} == want
    for r in report.kernels:
        kfn = table[kernels[r.id].symbol]
        text = kfn.operation.get_asm(enable_debug_info=True)
        assert f'hlofuse.kernel = "{r.kind}|{r.id}|{want[r.kind]}|' in text
        # every op of the kernel carries the name in its name stack (-> XLA's op_name);
        # constants are the canonicalizer's (folded, hoisted), never run as ops
        ops = [op for op in hir.all_ops(kfn)
               if op.name not in ("func.func", "func.return", "stablehlo.constant")]
        assert ops and all(f"/{want[r.kind]}/" in str(op.location) for op in ops), r.kind
    hlo = low.compile().as_text()
    for name in want.values():
        assert re.search(rf'op_name="[^"]*/{name}/', hlo), name
    assert_same(g(*args), jax.jit(model)(*args), "kernel")


def test_same_body_on_two_lines_two_names_one_build(monkeypatch):
    """Two regions with the same body on different lines get different names (and two on one
    line a suffix), while the kernel is built (lowered) once: the cache is keyed by the body."""
    monkeypatch.setattr(kz, "_CACHE", {})
    built = []
    real = lowering.lower_to_text

    def counting(fn, avals, target):
        built.append(fn.kernel_name)
        return real(fn, avals, target)
    monkeypatch.setattr(lowering, "lower_to_text", counting)
    rng = np.random.default_rng(1)
    x, y = (rng.standard_normal((32, 64)).astype(np.float32) for _ in range(2))
    line = rf"hlofuse_reduction(?:_[a-z0-9]+)*_{FILE}_(\d+)"   # -> the line
    a, b, both = (line_of(two_lines, "a = "), line_of(two_lines, "b = "),
                  line_of(one_line, "return"))
    for fn, lines in ((two_lines, [a, b]), (one_line, [both, both])):
        g = hlofuse.jit(fn, autotune=False)
        report = g.report(x, y)
        regions = [r for r in report.regions if r.kernel]
        assert len(regions) == 2 and len({r.extra["region_hash"] for r in regions}) == 1
        names = sorted(r.kernel for r in regions)
        if fn is one_line:   # one line: the second kernel is told apart by a suffix
            assert names[1] == names[0] + "_1", names
            names[1] = names[0]
        assert sorted(int(re.fullmatch(line, n).group(1)) for n in names) == lines, names
        assert_same(g(x, y), jax.jit(fn)(x, y), "kernel")
    # one build for the four regions (the second function hits the first one's kernel)
    assert len([n for n in built if n.startswith("hlofuse_reduction_")]) == 1, built


def test_name_without_a_source_location_is_the_kind_and_region_id():
    text = """
    func.func @main(%x: tensor<8x16xf32>, %y: tensor<8x16xf32>) -> tensor<8x16xf32> {
      %0 = stablehlo.multiply %x, %y : tensor<8x16xf32>
      %1 = stablehlo.tanh %0 : tensor<8x16xf32>
      return %1 : tensor<8x16xf32>
    }"""
    opt = hlofuse.optimize(text, pipeline=["fuse-elementwise", "kernelize"])
    (r,) = opt.report.kernels
    assert r.kernel == f"hlofuse_elementwise_region{r.id}"   # (no variant in the build's name)
    # a location in a named file (an .mlir a user wrote) counts as the user's line
    located = text.replace("stablehlo.tanh %0 : tensor<8x16xf32>",
                           'stablehlo.tanh %0 : tensor<8x16xf32> loc("my model.mlir":7:3)')
    opt = hlofuse.optimize(located, pipeline=["fuse-elementwise", "kernelize"])
    assert opt.report.kernels[0].kernel == "hlofuse_elementwise_my_model_mlir_7"


@pytest.mark.filterwarnings("ignore:builtin type event_stats:DeprecationWarning")
def test_a_recorded_trace_resolves_to_the_kernel_names(tmp_path):
    """A ``jax.profiler`` trace recorded around building and running the function.

    hlofuse's own build event for each kernel (``hlofuse/kernel <kind>``) carries the kernel's
    name. XLA:CPU's execution events do not: each is named after the top-level HLO
    instruction it runs (``ynn_fusion.2``, ``broadcast_divide_fusion``: names XLA derives from
    opcodes when it fuses), with the instruction and its module as arguments (``hlo_op``,
    ``hlo_module``), and the cpu trace carries no HLO module to map an instruction to its
    ``op_name`` (its ``/host:metadata`` plane is empty). So the test follows the trace's
    executed instructions into XLA's HLO dump of that same executable (``xla_dump_to``): their
    ``op_name`` metadata, where the kernel names are, must name both kernels. (On GPU the
    Triton kernel itself runs under the name, see the deviceless compile test below.)"""
    args = model_args()
    g = hlofuse.jit(model)
    dump = tmp_path / "dump"
    with jax.profiler.trace(str(tmp_path / "trace")):
        compiled = g.lower(*args).compile({"xla_dump_to": str(dump)})
        for _ in range(2):
            jax.block_until_ready(compiled(*args))
    (path,) = glob.glob(f"{tmp_path}/trace/**/*.xplane.pb", recursive=True)
    built, executed = {}, set()
    for plane in jax.profiler.ProfileData.from_file(path).planes:
        for line in plane.lines:
            for ev in line.events:
                stats = dict(ev.stats)
                if ev.name.startswith("hlofuse/kernel "):
                    built[ev.name[len("hlofuse/kernel "):]] = stats.get("kernel")
                if "hlo_op" in stats:
                    executed.add((stats.get("hlo_module"), stats["hlo_op"]))
    check_names(built)
    want = {r.kind: r.kernel for r in g.report(*args).kernels}
    assert built == want, (built, want)
    assert executed, "no XLA execution events in the trace"
    modules = {m for m, _ in executed}
    op_names = {}   # (module, instruction) -> op_name, from the dumped optimized HLO
    for f in glob.glob(f"{dump}/*after_optimizations.txt"):
        m = re.match(r"module_\d+\.(.+)\.cpu_after_optimizations\.txt$", os.path.basename(f))
        if m and m.group(1) in modules:
            for inst, op_name in re.findall(r'^\s*(?:ROOT )?%([\w.\-]+) = .*op_name="([^"]*)"',
                                            open(f).read(), flags=re.M):
                op_names[(m.group(1), inst)] = op_name
    ran = [op_names[e] for e in executed if e in op_names]
    for name in want.values():
        assert any(f"/{name}/" in n for n in ran), (name, sorted(executed))


def _lowered_kernel(target: str):
    """The kernel text of the one elementwise region of a small module for ``target``."""
    text = """
    func.func @main(%x: tensor<8x128xf32>, %y: tensor<8x128xf32>) -> tensor<8x128xf32> {
      %0 = stablehlo.multiply %x, %y : tensor<8x128xf32>
      %1 = stablehlo.tanh %0 : tensor<8x128xf32>
      %2 = stablehlo.add %1, %x : tensor<8x128xf32>
      return %2 : tensor<8x128xf32>
    }"""
    module = hir.parse(text, hir.new_context())
    ctx = PassContext(target=target, report=Report(target=target))
    PassManager(["fuse-elementwise"]).run(module, ctx)
    (fn,) = [f for f in hir.funcs(module) if hir.func_name(f).startswith("hlofuse_region")]
    text, built, _ = kz.lower_region(fn, "elementwise", ctx.target)
    return text, built


def test_rename_reaches_triton_and_mosaic_payloads():
    """Lowered from this cpu machine: Triton's custom call ``name`` and the function inside its
    serialized module (MLIR bytecode, renamed in its string table) and Mosaic's
    ``kernel_name`` carry the new name; nothing of the build's name is left."""
    new = f"hlofuse_elementwise_{FILE}_{'9' * 40}"   # longer: the string table's sizes change
    text, built = _lowered_kernel("gpu")
    out = naming.rename(text, built, new)
    assert built not in out and f'name = "{new}"' in out
    (payload,) = re.findall(r'\bir = "((?:[^"\\]|\\.)*)"', out)
    data = naming.unescape(payload)
    assert naming.escape(data) == payload and new.encode() in data
    hir.parse(out, hir.new_context())   # still a module
    try:   # the Triton dialect (jaxlib's, as jax's Pallas lowering uses) reads it back
        from jaxlib.triton import dialect as tt
        from jaxlib.mlir import ir
    except ImportError:
        tt = None
    if tt is not None:
        ctx = ir.Context()
        tt.register_dialect(ctx)
        with ctx:
            assert f"tt.func public @{new}(" in str(ir.Module.parse(data))
    text, built = _lowered_kernel("tpu")
    out = naming.rename(text, built, new)
    assert built not in out and f'kernel_name = "{new}"' in out
    # a serialized module holding the name outside its string table is refused, not broken
    with pytest.raises(naming.RenameError):
        naming.rename_bytecode(data + built.encode(), new.encode(), b"x")


def _no_compiler(chip):
    return None if os.environ.get(aot.PYTHON_ENV) else aot.missing_packages(chip)


@pytest.mark.skipif(_no_compiler("h100") is not None or _no_compiler("v5e") is not None,
                    reason="no deviceless GPU/TPU compilers (pip install -e '.[aot]')")
def test_gpu_and_tpu_compilers_emit_kernels_under_the_names():
    """The deviceless compile (hlofuse.runtime.aot): XLA:GPU finds each Triton function by its
    new name and ptxas compiles it under that name; XLA:TPU names the Mosaic kernels so."""
    avals = [jax.ShapeDtypeStruct((2, 256, 4, 64), jnp.bfloat16)] * 3
    avals.append(jax.ShapeDtypeStruct((64, 128), jnp.float32))
    exp = jax.export.export(jax.jit(model), platforms=["cpu"])(*avals)
    for chip, result in aot.compile_for(exp.mlir_module(), "h100,v5e").items():
        assert result.ok, result.summary()
        check_names({k.kind: k.name for k in result.kernels})
        for k in result.kernels:   # the compiled entries (ptxas; Mosaic in XLA:TPU's HLO)
            assert [e["name"] for e in k.resources["entries"]] == [k.name], (chip, k)
