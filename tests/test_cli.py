"""The ``hlofuse`` command line, run as a real process (``python -m hlofuse.cli.main`` and the
installed console script): round trips for every file format, the error cases, ``--help`` for every
subcommand, and atomic writes."""

from __future__ import annotations

import json
import os
import shlex
import shutil
import signal
import stat
import subprocess
import sys
import textwrap

import numpy as np
import pytest

import jax
import jax.numpy as jnp
from jax import export as jexport

from hlofuse.core import ir as hir
from hlofuse.runtime.testing import assert_same
from hlofuse.runtime import argspec

from hlofuse.runtime import formats
CLI = [sys.executable, "-m", "hlofuse.cli.main"]
FORMATS = ("text", "bytecode", "portable", "exported")
EXT = {"text": ".mlir", "bytecode": ".mlirbc", "portable": ".vhlo", "exported": ".exported"}
SUBCOMMANDS = ("optimize", "run", "check", "report", "export")

MODEL_SRC = '''
import jax.numpy as jnp

def model(x, w, b):
    return jnp.tanh(jnp.maximum(x @ w + b, 0.0) * 2.0) + x.sum() * 0.5

def other(x, w, b):
    return jnp.sin(jnp.maximum(x @ w + b, 0.0) * 2.0) + x.sum() * 0.5
'''


def model(x, w, b):
    return jnp.tanh(jnp.maximum(x @ w + b, 0.0) * 2.0) + x.sum() * 0.5


SHAPES = [((8, 16), np.float32), ((16, 32), np.float32), ((32,), np.float32)]


def hlofuse(*args, cwd, env=None, timeout=300):
    full_env = dict(os.environ, **(env or {}))
    return subprocess.run(CLI + [str(a) for a in args], cwd=cwd, capture_output=True, text=True,
                          timeout=timeout, env=full_env)


def hlofuse_inprocess(capsys, *args, cwd):
    """The same argument parsing and dispatch without a process; returns (exit code, stdout,
    stderr). Only for inputs that cannot crash the process: usage errors, valid modules, text,
    and binary inputs that the loader parses in its subprocess probe first (this process is no
    CLI worker, so ``formats.load`` probes). What needs the process boundary (a parser abort,
    stop signals, the supervisor and its worker, a round trip through the worker) runs
    ``hlofuse``."""
    from hlofuse.cli import main as cli
    old = os.getcwd()
    os.chdir(cwd)
    try:
        capsys.readouterr()
        code = cli._dispatch(["hlofuse", *map(str, args)])
    finally:
        os.chdir(old)
    out = capsys.readouterr()
    return subprocess.CompletedProcess(args, code, out.out, out.err)


def inputs(seed=0):
    rng = np.random.default_rng(seed)
    return [rng.standard_normal(s).astype(d) for s, d in SHAPES]


@pytest.fixture(scope="module")
def files(tmp_path_factory):
    """The model in every format, plus the arguments and jax.jit's results."""
    d = tmp_path_factory.mktemp("cli")
    exp = jexport.export(jax.jit(model), platforms=["cpu"])(
        *[jax.ShapeDtypeStruct(s, dt) for s, dt in SHAPES])
    module = hir.parse(exp.mlir_module())
    blobs = {"text": exp.mlir_module(), "bytecode": hir.to_bytecode(module),
             "portable": hir.to_portable_artifact(module), "exported": bytes(exp.serialize())}
    paths = {}
    for fmt, blob in blobs.items():
        p = d / f"model{EXT[fmt]}"
        p.write_bytes(blob.encode() if isinstance(blob, str) else blob)
        paths[fmt] = p
    (d / "mymodel.py").write_text(MODEL_SRC)
    args = inputs()
    np.savez(d / "in.npz", *args)
    return {"dir": d, "paths": paths, "args": args, "expected": [np.asarray(jax.jit(model)(*args))]}


def one_error_line(proc, *needles):
    """An error: exit code 2, exactly one stderr line naming the culprit, no traceback."""
    lines = [l for l in proc.stderr.splitlines() if l.strip()]
    assert proc.returncode == 2, (proc.returncode, proc.stdout, proc.stderr)
    assert len(lines) == 1, proc.stderr
    assert "error:" in lines[0] and "Traceback" not in proc.stderr, proc.stderr
    for n in needles:
        assert n in lines[0], (n, lines[0])
    return lines[0]


def run_file(path):
    """Load an optimized file independently of hlofuse's loader and run it on the test inputs."""
    data = path.read_bytes()
    args = inputs()
    if hir.detect_format(data) == "exported":
        exp = jexport.deserialize(bytearray(data))
        return [np.asarray(exp.call(*args))]
    import jax.extend.backend as jeb
    be = jeb.get_backend()
    payload = data.decode() if hir.detect_format(data) == "text" else data
    exe = be.compile_and_load(payload, be.local_devices()[:1],
                              jeb.get_compile_options(num_replicas=1, num_partitions=1))
    res = exe.execute_sharded([jax.device_put(a) for a in args])
    return [np.asarray(a[0]) for a in res.disassemble_into_single_device_arrays()]


# ---------------------------------------------------------------------------------------------
# Round trips: optimize -> load -> run -> same results, for every format
# ---------------------------------------------------------------------------------------------

@pytest.mark.parametrize("fmt", FORMATS)
def test_optimize_round_trip(files, fmt, capsys):
    d = files["dir"]
    src = files["paths"][fmt]
    out = d / f"opt_{fmt}{EXT[fmt]}"
    rep = d / f"report_{fmt}.json"
    # bytecode through the real command (its worker loads binary input without the subprocess
    # probe), the other formats in this process (the same command code; the loader probes)
    run = hlofuse if fmt == "bytecode" else (
        lambda *a, cwd: hlofuse_inprocess(capsys, *a, cwd=cwd))
    p = run("optimize", src.name, "-o", out.name, "--report", rep.name, cwd=d)
    assert p.returncode == 0, p.stderr
    assert "kernel(s)" in p.stdout
    data = out.read_bytes()
    assert hir.detect_format(data) == fmt                       # written in the input's format
    report = json.loads(rep.read_text())
    assert report["kernels"] >= 1                               # the rewrite fired
    assert any(r["kernel"] for r in report["regions"])
    if fmt == "exported":
        exp = jexport.deserialize(bytearray(data))
        assert hir.detect_format(bytes(exp.mlir_module_serialized)) == "portable"
        assert exp.in_avals == jexport.deserialize(bytearray(src.read_bytes())).in_avals
        payload = bytes(exp.mlir_module_serialized)
    else:
        payload = data
    if fmt in ("portable", "exported"):
        assert formats.portable_version(payload) == hir.portable_target_default()
    assert report["ops_after"] < report["ops_before"]
    assert hir.verify(hir.parse(payload)) is None
    assert_same(run_file(out), files["expected"], "kernel")


def test_run_and_check_through_the_cli(files, capsys):
    d = files["dir"]
    hlofuse = lambda *a, cwd: hlofuse_inprocess(capsys, *a, cwd=cwd)  # noqa: E731
    src, opt = files["paths"]["bytecode"], d / "rc_opt.mlirbc"
    p = hlofuse("optimize", src.name, "-o", opt.name, "--verify", cwd=d)
    # a matmul-epilogue kernel sums in another order: compared in 'reassociate'
    assert p.returncode == 0 and "match the original (category reassociate" in p.stdout, p.stderr
    p = hlofuse("run", opt.name, "--inputs", "in.npz", "--outputs", "out.npz", cwd=d)
    assert p.returncode == 0, p.stderr
    with np.load(d / "out.npz") as z:
        assert_same([z["arr_0"]], files["expected"], "kernel")
    p = hlofuse("check", files["paths"]["exported"].name, opt.name, "--seed", "3", cwd=d)
    assert p.returncode == 0 and "OK" in p.stdout, p.stderr


def test_check_reports_a_mismatch(files, capsys):
    d = files["dir"]
    hlofuse = lambda *a, cwd: hlofuse_inprocess(capsys, *a, cwd=cwd)  # noqa: E731
    other = lambda x, w, b: jnp.sin(jnp.maximum(x @ w + b, 0.0) * 2.0) + x.sum() * 0.5
    exp = jexport.export(jax.jit(other), platforms=["cpu"])(
        *[jax.ShapeDtypeStruct(s, dt) for s, dt in SHAPES])
    (d / "other.exported").write_bytes(bytes(exp.serialize()))
    p = hlofuse("check", files["paths"]["text"].name, "other.exported", cwd=d)
    assert p.returncode == 1
    assert "MISMATCH" in p.stderr and "other.exported" in p.stderr


def test_export_then_optimize_other_formats(files, capsys):
    d = files["dir"]
    hlofuse = lambda *a, cwd: hlofuse_inprocess(capsys, *a, cwd=cwd)  # noqa: E731
    p = hlofuse("export", "mymodel.py:model", "--args", "f32[8,16],f32[16,32],f32[32]",
                "-o", "exp.exported", cwd=d)
    assert p.returncode == 0, p.stderr
    exp = jexport.deserialize(bytearray((d / "exp.exported").read_bytes()))
    assert_same([np.asarray(exp.call(*files["args"]))], files["expected"], "exact")
    # --format converts (exported -> portable), at an older --target-version
    p = hlofuse("optimize", "exp.exported", "-o", "exp.vhlo", "--format", "portable",
                "--target-version", "1.10.0", cwd=d)
    assert p.returncode == 0, p.stderr
    assert formats.portable_version((d / "exp.vhlo").read_bytes()) == "1.10.0"
    assert_same(run_file(d / "exp.vhlo"), files["expected"], "kernel")


def test_report_prints_the_plan_and_writes_nothing_else(files, capsys):
    d = files["dir"]
    hlofuse = lambda *a, cwd: hlofuse_inprocess(capsys, *a, cwd=cwd)  # noqa: E731
    before = set(os.listdir(d))
    p = hlofuse("report", files["paths"]["portable"].name, "--report", "plan.html",
                "--target", "gpu", cwd=d)
    assert p.returncode == 0, p.stderr
    assert "target gpu" in p.stdout and "kernel(s)" in p.stdout and "elementwise" in p.stdout
    assert set(os.listdir(d)) - before == {"plan.html"}
    assert "<table>" in (d / "plan.html").read_text()


def test_gpu_and_tpu_exports_keep_their_kernels(files, capsys):
    d = files["dir"]
    hlofuse = lambda *a, cwd: hlofuse_inprocess(capsys, *a, cwd=cwd)  # noqa: E731
    for target, marker, plat in (("gpu", "__gpu$xla.gpu.triton", "cuda"),
                                 ("tpu", "tpu_custom_call", "tpu")):
        exp = jexport.export(jax.jit(model), platforms=[plat])(
            *[jax.ShapeDtypeStruct(s, dt) for s, dt in SHAPES])
        (d / f"{target}.exported").write_bytes(bytes(exp.serialize()))
        # unmeasured, gpu/tpu keep these regions with XLA (XLA fuses them itself): say so
        p = hlofuse("optimize", f"{target}.exported", "-o", f"{target}_xla.exported",
                    "--report", f"{target}_xla.md", cwd=d)
        assert p.returncode == 0, p.stderr
        assert "unmeasured: kept XLA (XLA fuses this)" in (d / f"{target}_xla.md").read_text()
        assert "0 kernel(s)" in p.stdout
        p = hlofuse("optimize", f"{target}.exported", "-o", f"{target}_opt.exported",
                    "--options", '{"kernelize": {"unmeasured": "kernel"}}', cwd=d)
        assert p.returncode == 0, p.stderr
        assert f"target {target}" in p.stdout
        exp = jexport.deserialize(bytearray((d / f"{target}_opt.exported").read_bytes()))
        assert exp.platforms == (plat,)
        avals = [jax.ShapeDtypeStruct(a.shape, a.dtype) for a in exp.in_avals]
        text = jax.jit(exp.call).trace(*avals).lower(lowering_platforms=(plat,)).as_text()
        assert marker in text
    # usage errors (no kernel is built): in this process, as in test_usage_errors
    p = hlofuse_inprocess(capsys, "optimize", "gpu.exported", "-o", "x.exported", "--options",
                          '{"kernelize": 3}', cwd=d)
    assert p.returncode != 0 and "--options" in p.stderr
    # --chip: the tiling's chip, as options={'chip': ...}; the report names it
    p = hlofuse("optimize", "gpu.exported", "-o", "a100.exported", "--chip", "a100",
                "--options", '{"kernelize": {"unmeasured": "kernel"}}', "--report", "a100.json",
                cwd=d)
    assert p.returncode == 0, p.stderr
    assert json.loads((d / "a100.json").read_text())["chip"] == "a100"
    p = hlofuse_inprocess(capsys, "optimize", "gpu.exported", "-o", "x.exported", "--chip", "z80",
                          cwd=d)
    assert p.returncode == 2 and "--chip: unknown chip 'z80'" in p.stderr, p.stderr


# ---------------------------------------------------------------------------------------------
# Dynamic shapes
# ---------------------------------------------------------------------------------------------

DYNAMIC = """module {
  func.func public @main(%arg0: tensor<?x4xf32>) -> tensor<?x4xf32> {
    %0 = stablehlo.add %arg0, %arg0 : tensor<?x4xf32>
    %1 = stablehlo.tanh %0 : tensor<?x4xf32>
    %2 = stablehlo.multiply %1, %arg0 : tensor<?x4xf32>
    return %2 : tensor<?x4xf32>
  }
}
"""


def test_dynamic_shapes_need_shapes_to_run(tmp_path, capsys):
    (tmp_path / "dyn.mlir").write_text(DYNAMIC)
    one_error_line(hlofuse_inprocess(capsys, "run", "dyn.mlir", cwd=tmp_path), "dyn.mlir",
                   "dynamic shape", "--shapes")


def test_dynamic_shapes_pass_through_or_refine(tmp_path, capsys):
    hlofuse = lambda *a, cwd: hlofuse_inprocess(capsys, *a, cwd=cwd)  # noqa: E731
    (tmp_path / "dyn.mlir").write_text(DYNAMIC)
    p = hlofuse("optimize", "dyn.mlir", "-o", "same.mlir", cwd=tmp_path)
    assert p.returncode == 0, p.stderr
    assert "unchanged" in p.stdout and "--shapes" in p.stderr and "tensor<?x4xf32>" in p.stderr
    assert (tmp_path / "same.mlir").read_text() == DYNAMIC     # passed through byte for byte
    p = hlofuse("optimize", "dyn.mlir", "-o", "ref.mlir", "--shapes", "f32[3,4]",
                "--report", "r.json", cwd=tmp_path)
    assert p.returncode == 0, p.stderr
    assert json.loads((tmp_path / "r.json").read_text())["kernels"] == 1
    assert "tensor<3x4xf32>" in (tmp_path / "ref.mlir").read_text()
    x = np.random.default_rng(1).standard_normal((3, 4)).astype(np.float32)
    np.savez(tmp_path / "x.npz", x)
    p = hlofuse("run", "ref.mlir", "--inputs", "x.npz", "--outputs", "y.npz", cwd=tmp_path)
    assert p.returncode == 0, p.stderr
    with np.load(tmp_path / "y.npz") as z:
        assert_same(z["arr_0"], np.tanh(x + x) * x, "kernel")



def test_check_after_optimize_with_shapes_refines_the_original(tmp_path, capsys):
    """Issue 11 #13: ``check`` of the original against ``optimize --shapes``'s output said 'the
    inputs differ' unless --shapes was passed again. Also: text read from a file keeps the file's
    name in its locations (it was loc("-":1:17))."""
    hlofuse = lambda *a, cwd: hlofuse_inprocess(capsys, *a, cwd=cwd)  # noqa: E731
    (tmp_path / "dyn.mlir").write_text(DYNAMIC)
    p = hlofuse("optimize", "dyn.mlir", "-o", "ref.mlir", "--shapes", "f32[3,4]", cwd=tmp_path)
    assert p.returncode == 0, p.stderr
    c = hlofuse("check", "dyn.mlir", "ref.mlir", cwd=tmp_path)
    assert c.returncode == 0, c.stderr
    assert "OK" in c.stdout and "refined dyn.mlir to the argument types of ref.mlir (f32[3,4])" in c.stderr
    text = (tmp_path / "ref.mlir").read_text()
    assert 'loc("dyn.mlir":3:' in text and 'loc("-"' not in text


def test_a_bad_shapes_refinement_names_the_real_cause(tmp_path, capsys):
    """Issue 11 #13: the message stopped at 'Failure while executing pass pipeline:'."""
    (tmp_path / "dyn.mlir").write_text(DYNAMIC)
    p = hlofuse_inprocess(capsys, "optimize", "dyn.mlir", "-o", "o.mlir", "--shapes", "f32[3,5]",
                          cwd=tmp_path)
    line = one_error_line(p, "dyn.mlir", "f32[3,5]", "invalid refinement",
                          "tensor<?x4xf32> -> tensor<3x5xf32>", "dyn.mlir:2:")
    assert "Failure while executing" not in line


def test_a_truncated_jax_export_artifact_is_named_so(files, tmp_path, capsys):
    """Issue 11 #13: a truncated .exported was reported as a text parse error (or as 'not
    StableHLO'); by its flatbuffer header or its extension it is a damaged jax.export artifact."""
    blob = files["paths"]["exported"].read_bytes()
    for name, data in [("a.exported", blob[:30]), ("b.exported", blob[: len(blob) // 3]),
                       ("c.exported", blob[:-9]), ("d.bin", blob[: len(blob) // 2]),
                       ("e.mlirbc", blob[:100]), ("f.exported", b"module {\n  func.func @ma")]:
        (tmp_path / name).write_bytes(data)
        p = hlofuse_inprocess(capsys, "run", name, cwd=tmp_path)
        if name.startswith("f"):  # text after all: a text error, named as such
            one_error_line(p, name, "cannot parse")
        else:
            one_error_line(p, name, "truncated or corrupt jax.export artifact")


# ---------------------------------------------------------------------------------------------
# Errors: one line on stderr, exit code 2, no traceback
# ---------------------------------------------------------------------------------------------

def test_bad_inputs_give_one_clear_line(files, tmp_path, capsys):
    d = tmp_path
    bc = files["paths"]["bytecode"].read_bytes()
    (d / "random.bin").write_bytes(np.random.default_rng(0).bytes(4000))
    (d / "truncated.mlirbc").write_bytes(bc[: len(bc) // 2])
    (d / "unknown.mlir").write_text("module {\n  func.func @main(%a: tensor<4xf32>) -> tensor<4xf32> {\n"
                                    "    %0 = foo.bar %a : tensor<4xf32>\n    return %0 : tensor<4xf32>\n  }\n}\n")
    (d / "nomain.mlir").write_text("module {\n  func.func @f(%a: tensor<4xf32>) -> tensor<4xf32> {\n"
                                   "    return %a : tensor<4xf32>\n  }\n}\n")
    # a missing file fails before anything is read
    p = hlofuse_inprocess(capsys, "optimize", "missing.mlir", "-o", "out.mlir", cwd=d)
    one_error_line(p, "missing.mlir", "no such file")
    cases = [
        (["random.bin"], ["random.bin", "not StableHLO"]),
        (["truncated.mlirbc"], ["truncated.mlirbc", "cannot parse"]),
        (["unknown.mlir"], ["unknown.mlir", "foo.bar"]),
        (["nomain.mlir"], ["nomain.mlir", "no 'main'"]),
    ]
    # the rest in this process too: the binary ones are parsed in the loader's subprocess probe
    # first (a parser abort through the real command: test_parser_abort_is_reported_not_crashed)
    for args, needles in cases:
        p = hlofuse_inprocess(capsys, "optimize", *args, "-o", "out.mlir", cwd=d)
        one_error_line(p, *needles)
        assert not (d / "out.mlir").exists()



def test_non_stablehlo_files_say_what_they_are(tmp_path, capsys):
    """Issue 11 #8: func+arith and MHLO files were optimized with exit 0 and described as
    StableHLO text. MHLO is refused; a file without StableHLO ops is copied unchanged, saying so."""
    from tests.bad_inputs import ARITH_ONLY, MHLO
    (tmp_path / "arith.mlir").write_text(ARITH_ONLY)
    (tmp_path / "mhlo.mlir").write_text(MHLO)
    p = hlofuse_inprocess(capsys, "optimize", "arith.mlir", "-o", "out.mlir", cwd=tmp_path)
    assert p.returncode == 0, p.stderr
    assert "StableHLO text" not in p.stdout and "no StableHLO" in p.stdout and "unchanged" in p.stdout
    assert "no StableHLO ops (dialects: arith, func); passed through unchanged" in p.stderr
    assert (tmp_path / "out.mlir").read_text() == ARITH_ONLY      # byte for byte
    for cmd in (["optimize", "mhlo.mlir", "-o", "out2.mlir"], ["report", "mhlo.mlir"]):
        one_error_line(hlofuse_inprocess(capsys, *cmd, cwd=tmp_path), "mhlo.mlir",
                       "an MHLO module", "hlo-legalize-to-stablehlo")
    assert not (tmp_path / "out2.mlir").exists()


def test_parser_abort_is_reported_not_crashed(files, tmp_path):
    """A corrupt bytecode string table makes the MLIR parser abort the process (nanobind
    conversion error -> std::terminate); the command still exits 2 with one line."""
    bc = bytearray(files["paths"]["bytecode"].read_bytes())
    i = bc.find(b"stablehlo")
    assert i > 0
    bc[i + 1] = 0xFF
    (tmp_path / "corrupt.mlirbc").write_bytes(bytes(bc))
    p = hlofuse("optimize", "corrupt.mlirbc", "-o", "out.mlirbc", cwd=tmp_path)
    one_error_line(p, "corrupt.mlirbc", "corrupt input")
    assert not (tmp_path / "out.mlirbc").exists()
    # the library path guards the same input with a subprocess probe
    with pytest.raises(hir.IRError, match="corrupt"):
        formats.load(str(tmp_path / "corrupt.mlirbc"))


def test_verbose_adds_the_traceback(tmp_path, capsys):
    (tmp_path / "random.bin").write_bytes(np.random.default_rng(0).bytes(4000))
    p = hlofuse_inprocess(capsys, "optimize", "random.bin", "-o", "o.mlir", "--verbose",
                          cwd=tmp_path)
    assert p.returncode == 2 and "Traceback" in p.stderr and "random.bin" in p.stderr


def test_usage_errors(files, capsys):
    d = files["dir"]
    hlofuse = lambda *a, cwd: hlofuse_inprocess(capsys, *a, cwd=cwd)  # noqa: E731
    src = files["paths"]["text"].name
    for args, needles in [
        ((src,), ["missing -o"]),
        ((src, "-o", src), ["refusing to overwrite", "--in-place"]),
        ((src, "-o", "x.mlir", "--target", "xpu"), ["--target"]),
        ((src, "-o", "x.mlir", "--bogus"), ["bogus"]),
        ((src, "-o", "x.mlir", "--disable-pass", "no-such-pass"), ["no-such-pass"]),
        ((src, "-o", "x.mlir", "--report", "r.pdf"), ["r.pdf"]),
        ((src, "-o", "x.mlir", "--format", "exported"), ["jax.export input"]),
        ((src, "-o", "x.vhlo", "--format", "portable", "--target-version", "0.1.0"), ["0.1.0"]),
        ((files["paths"]["exported"].name, "-o", "x.exported", "--target", "gpu"), ["platform cpu"]),
    ]:
        one_error_line(hlofuse("optimize", *args, cwd=d), *needles)
    one_error_line(hlofuse("frobnicate", cwd=d), "frobnicate")
    one_error_line(hlofuse("run", src, "--inputs", "missing.npz", cwd=d), "missing.npz")
    one_error_line(hlofuse("export", "mymodel:nope", "--args", "f32[3]", "-o", "x", cwd=d), "nope")
    one_error_line(hlofuse("export", "mymodel:model", "--args", "q32[3]", "-o", "x", cwd=d), "q32")
    assert not (d / "x.mlir").exists() and not (d / "x").exists()


def test_every_output_path_is_checked_before_any_work(files, tmp_path, capsys):
    """Issue 11 #11: --report was checked after -o had been written, --report equal to -o gave a
    wrong message, and a bad --dump-dir was blamed on the input file. Every case here fails
    before anything is written, naming the flag and the path."""
    shutil.copy(files["paths"]["text"], tmp_path / "m.mlir")
    np.savez(tmp_path / "in.npz", *inputs())
    (tmp_path / "afile").write_text("x")
    (tmp_path / "d").mkdir()
    run = lambda *a: hlofuse_inprocess(capsys, *a, cwd=tmp_path)  # noqa: E731
    for args, needles in [
        (("-o", "o.mlir", "--report", "nodir/r.json"), ["--report", "nodir/r.json", "does not exist"]),
        (("-o", "r.json", "--report", "r.json"), ["--report", "r.json", "same file as -o"]),
        (("-o", "nodir/o.mlir"), ["-o", "nodir/o.mlir", "does not exist"]),
        (("-o", "."), ["-o", "is a directory"]),
        (("-o", "o.mlir", "--dump-dir", "afile"), ["--dump-dir", "afile", "not a directory"]),
        (("-o", "o.mlir", "--dump-dir", "afile/sub"), ["--dump-dir", "afile/sub", "not a directory"]),
        (("-o", "d/000_input.mlir", "--dump-dir", "d"), ["--dump-dir", "000_input.mlir"]),
    ]:
        p = run("optimize", "m.mlir", *args)
        line = one_error_line(p, *needles)
        assert "m.mlir" not in line.replace("o.mlir", ""), line      # not blamed on the input
    one_error_line(run("report", "m.mlir", "--report", "m.mlir.json", "--dump-dir", "afile"),
                   "--dump-dir", "afile")
    one_error_line(run("run", "m.mlir", "--inputs", "in.npz", "--outputs", "in.npz"),
                   "--outputs", "in.npz", "refusing to overwrite")
    one_error_line(run("run", "m.mlir", "--outputs", "nodir/out.npz"), "--outputs", "nodir")
    one_error_line(run("export", "mymodel:model", "--args", "f32[3]", "-o", "nodir/x.exported"),
                   "-o", "nodir")
    assert sorted(os.listdir(tmp_path)) == ["afile", "d", "in.npz", "m.mlir"]
    assert os.listdir(tmp_path / "d") == []


def test_in_place_and_another_output_conflict(files, capsys):
    d = files["dir"]
    p = hlofuse_inprocess(capsys, "optimize", "model.mlir", "--in-place", "-o", "other.mlir", cwd=d)
    one_error_line(p, "--in-place", "-o other.mlir")
    assert not (d / "other.mlir").exists()


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="RLIMIT_FSIZE")
def test_a_failing_dump_leaves_no_truncated_file_and_names_the_dump(files, tmp_path):
    """Issue 11 #11: a dump write that failed half-way (here: a file size limit, as on a full
    disk) left a truncated dump and was reported as an error of the input file."""
    text = jax.jit(model).lower(*[jax.ShapeDtypeStruct(s, dt) for s, dt in SHAPES]).as_text()
    (tmp_path / "m.mlir").write_text(text)                      # no locations: small dumps
    limit = 8000  # the early dumps are ~2-3 KB, the one after kernelize ~17 KB
    small_files = (f"import os, resource, sys; resource.setrlimit(resource.RLIMIT_FSIZE, "
                   f"({limit}, {limit})); os.execv(sys.argv[1], sys.argv[1:])")
    p = subprocess.run([sys.executable, "-c", small_files, SCRIPT, "optimize", "m.mlir", "-o",
                        "o.mlir", "--dump-dir", "dumps"],
                       cwd=tmp_path, capture_output=True, text=True, timeout=300)
    line = one_error_line(p, "--dump-dir", "dumps/", "File too large")
    assert "m.mlir" not in line.replace("o.mlir", "")
    dumps = sorted(os.listdir(tmp_path / "dumps"))
    assert dumps and all(n.endswith(".mlir") and not n.startswith(".") for n in dumps), dumps
    for n in dumps:                                             # every dump is whole
        hir.verify(hir.parse((tmp_path / "dumps" / n).read_text()))
    assert not (tmp_path / "o.mlir").exists()


def test_in_place_replaces_the_input_atomically(files, tmp_path):
    src = tmp_path / "m.mlir"
    shutil.copy(files["paths"]["text"], src)
    os.chmod(src, 0o640)
    p = hlofuse("optimize", "m.mlir", "--in-place", cwd=tmp_path)
    assert p.returncode == 0, p.stderr
    assert stat.S_IMODE(os.stat(src).st_mode) == 0o640
    assert_same(run_file(src), files["expected"], "kernel")
    assert sorted(os.listdir(tmp_path)) == ["m.mlir"]           # no temporary left behind


def test_atomic_write_leaves_no_partial_file(tmp_path, monkeypatch):
    out = tmp_path / "out.mlir"
    out.write_text("old")

    def interrupted(src, dst):
        raise KeyboardInterrupt

    monkeypatch.setattr(os, "replace", interrupted)
    with pytest.raises(KeyboardInterrupt):
        formats.atomic_write(str(out), b"new contents")
    assert out.read_text() == "old"
    assert os.listdir(tmp_path) == ["out.mlir"]
    monkeypatch.undo()
    with pytest.raises(formats.FileError, match="refusing to overwrite"):
        formats.atomic_write(str(out), b"x", inputs=[str(out)])
    formats.atomic_write(str(out), b"x", inputs=[str(out)], in_place=True)
    assert out.read_text() == "x"


# ---------------------------------------------------------------------------------------------
# Host callbacks: refused in every format, never run (they segfault outside their process)
# ---------------------------------------------------------------------------------------------

def _with_callback(x):
    y = jax.pure_callback(np.sin, jax.ShapeDtypeStruct(x.shape, x.dtype), x)
    return jnp.tanh(y) * 2


@pytest.fixture(scope="module")
def callback_files(tmp_path_factory):
    """A jax.pure_callback lowering as text, bytecode and a jax.export artifact (jax.export
    refuses to serialize host callbacks, so the payload of a plain export is replaced, as a
    hand-edited or foreign artifact would be)."""
    import dataclasses
    d = tmp_path_factory.mktemp("callbacks")
    x = jax.ShapeDtypeStruct((4,), jnp.float32)
    text = jax.jit(_with_callback).lower(x).as_text()
    assert "xla_ffi_python_cpu_callback" in text
    module = hir.parse(text)
    exp = jexport.export(jax.jit(jnp.tanh), platforms=["cpu"])(x)
    exp = dataclasses.replace(exp, mlir_module_serialized=hir.to_portable_artifact(module))
    (d / "cb.mlir").write_text(text)
    (d / "cb.mlirbc").write_bytes(hir.to_bytecode(module))
    (d / "cb.exported").write_bytes(bytes(exp.serialize()))
    return d


NO_CALLBACK = ("xla_ffi_python_cpu_callback", "host callback", "cannot be serialized or run offline")


@pytest.mark.parametrize("name", ["cb.mlir", "cb.mlirbc", "cb.exported"])
def test_host_callbacks_are_refused_in_every_format(callback_files, name, capsys):
    """Issue 11 #6: optimize and report accepted them with exit 0."""
    d = callback_files
    one_error_line(hlofuse_inprocess(capsys, "optimize", name, "-o", "o" + name, cwd=d),
                   name, *NO_CALLBACK)
    one_error_line(hlofuse_inprocess(capsys, "report", name, cwd=d), name, *NO_CALLBACK)
    assert not (d / ("o" + name)).exists()


def test_running_a_host_callback_artifact_is_refused_not_a_segfault(callback_files):
    """Issue 11 #6: ``hlofuse run`` on such a jax.export artifact segfaulted its worker, and the
    Python API's execute path (argspec.execute) would take the caller's process down."""
    one_error_line(hlofuse("run", "cb.exported", cwd=callback_files), "cb.exported", *NO_CALLBACK)
    code = textwrap.dedent("""
        import sys, numpy as np
        from jax import export as jexport
        from hlofuse.core import ir as hir
        from hlofuse.runtime import argspec
        from hlofuse.runtime import formats
        data = open(sys.argv[1], "rb").read()
        exp = jexport.deserialize(bytearray(data))
        module = hir.parse(bytes(exp.mlir_module_serialized), probe=False)
        loaded = formats.Loaded(module, "exported", "cb.exported", exp, data)  # not via load()
        try:
            argspec.execute(loaded, [np.ones(4, np.float32)])
        except hir.IRError as e:
            print("REFUSED", e)
        """)
    p = subprocess.run([sys.executable, "-c", code, str(callback_files / "cb.exported")],
                       capture_output=True, text=True, timeout=300)
    assert p.returncode == 0, f"rc {p.returncode}: {p.stderr[-2000:]}"
    assert "REFUSED" in p.stdout and "host callback" in p.stdout, p.stdout


def test_every_host_callback_flavour_is_recognized():
    for t in ("xla_ffi_python_cpu_callback", "xla_ffi_python_gpu_callback",
              "xla_ffi_partitioned_python_cpu_callback", "xla_python_gpu_callback",
              "xla_python_cpu_callback", "xla_buffer_python_gpu_callback",
              "hlofuse.host_callback"):   # hlofuse.jit's placeholder for one
        assert hir.is_host_callback(t), t
    for t in ("lapack_sgetrf_ffi", "__gpu$xla.gpu.triton", "tpu_custom_call", "Sharding"):
        assert not hir.is_host_callback(t), t


# ---------------------------------------------------------------------------------------------
# Security: nothing from the current directory is ever imported by a child process
# ---------------------------------------------------------------------------------------------

SCRIPT = shutil.which("hlofuse") or os.path.join(os.path.dirname(sys.executable), "hlofuse")


def plant_modules(d, marker, names=("absl", "ml_dtypes")):
    """Modules that would shadow real ones if ``d`` were on sys.path: importing one writes
    ``marker`` (and then breaks the import, as a real attack might not)."""
    for name in names:
        (d / f"{name}.py").write_text(f"open({str(marker)!r}, 'a').write({name!r} + '\\n')\n"
                                      f"raise ImportError('planted {name}')\n")


def test_cli_child_ignores_modules_in_the_working_directory(files, tmp_path):
    """Issue 11 #4: the worker ran as ``python -m hlofuse.cli``, which puts the current directory
    first on sys.path, so an absl.py there was executed (it is ``python -P -m hlofuse.cli.main``
    now)."""
    marker = tmp_path / "PWNED"
    plant_modules(tmp_path, marker)
    shutil.copy(files["paths"]["text"], tmp_path / "m.mlir")
    p = subprocess.run([SCRIPT, "optimize", "m.mlir", "-o", "o.mlir"], cwd=tmp_path,
                       capture_output=True, text=True, timeout=300)
    assert not marker.exists(), marker.read_text()
    assert p.returncode == 0, p.stderr
    assert (tmp_path / "o.mlir").exists()


def test_probe_and_interpreter_ignore_modules_in_the_working_directory(files, tmp_path,
                                                                        monkeypatch):
    """The parser probe and the reference interpreter run ``python -c``, which puts the current
    directory first on sys.path too."""
    marker = tmp_path / "PWNED"
    plant_modules(tmp_path, marker)
    monkeypatch.chdir(tmp_path)
    m = hir.parse(files["paths"]["text"].read_text())
    data = hir.to_bytecode(m) + b""  # a payload this process has not vouched for
    hir._SAFE_BINARY.discard(hir._digest(data))
    hir.probe_parse(data, source="m.mlirbc")
    x = np.ones((2,), np.float32)
    text = "func.func @main(%a: tensor<2xf32>) -> tensor<2xf32> { func.return %a : tensor<2xf32> }"
    np.testing.assert_array_equal(hir.eval_module(text, [x])[0], x)
    assert not marker.exists(), marker.read_text()


def test_a_failing_probe_is_no_verdict_on_the_file(files, tmp_path, monkeypatch):
    """A probe that cannot even start (here: a broken ``jax`` first on PYTHONPATH) must not call
    a valid file corrupt, nor remember that verdict for later loads."""
    broken = tmp_path / "broken" / "jax"
    broken.mkdir(parents=True)
    (broken / "__init__.py").write_text("raise ImportError('broken environment')\n")
    data = files["paths"]["bytecode"].read_bytes()
    digest = hir._digest(data)
    hir._SAFE_BINARY.discard(digest)
    hir._BAD_BINARY.pop(digest, None)
    monkeypatch.setenv("PYTHONPATH", str(tmp_path / "broken"))
    with pytest.raises(hir.IRError) as e:
        hir.parse(data, source="model.mlirbc")
    assert "corrupt" not in str(e.value) and "broken environment" in str(e.value), str(e.value)
    assert type(e.value).__name__ == "ProbeFailed"
    assert digest not in hir._BAD_BINARY
    monkeypatch.delenv("PYTHONPATH")
    hir.verify(hir.parse(data, source="model.mlirbc"))          # probed again, and fine


# ---------------------------------------------------------------------------------------------
# Signals: the worker dies with the supervisor, nothing is written or left behind
# ---------------------------------------------------------------------------------------------

def children_of(pid):
    out = []
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                with open(f"/proc/{entry}/stat") as fh:
                    fields = fh.read().rsplit(")", 1)[1].split()
            except OSError:
                continue
            if int(fields[1]) == pid:
                out.append(int(entry))
    return out


def alive(pid):
    try:
        with open(f"/proc/{pid}/stat") as fh:
            return fh.read().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False


def start_paused(args, cwd, pause, tmpdir):
    """Start ``hlofuse ARGS`` with the worker stalled at a stage; returns once it stalls."""
    import select
    import time
    env = dict(os.environ, HLOFUSE_CLI_TEST_PAUSE=pause, TMPDIR=str(tmpdir))
    proc = subprocess.Popen([SCRIPT, *args], cwd=cwd, env=env, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)
    deadline, seen = time.monotonic() + 120, ""
    while "pausing" not in seen and time.monotonic() < deadline and proc.poll() is None:
        if select.select([proc.stdout], [], [], 1)[0]:
            seen += proc.stdout.readline()
    if "pausing" not in seen:
        proc.kill()
        out, err = proc.communicate()
        pytest.fail(f"the worker never paused (rc {proc.returncode}): {seen}{out}{err}")
    return proc


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc")
@pytest.mark.parametrize("sig,code,pause", [
    (signal.SIGTERM, 143, "writing=60"), (signal.SIGHUP, 129, "writing=60"),
    (signal.SIGINT, 130, "writing=60"),
    (signal.SIGTERM, 143, "writing=60!"),   # worker deaf to signals (native code): killed
])
def test_a_stop_signal_to_the_supervisor_stops_the_worker(files, tmp_path, sig, code, pause):
    """Issue 11 #5: SIGTERM/SIGHUP left the worker running (it wrote the output ~45 s later),
    SIGINT was not forwarded, and /tmp/hlofuse-cli-* folders leaked."""
    import time
    shutil.copy(files["paths"]["text"], tmp_path / "m.mlir")
    tmpdir = tmp_path / "tmp"
    tmpdir.mkdir()
    proc = start_paused(["optimize", "m.mlir", "-o", "o.mlir"], tmp_path, pause, tmpdir)
    workers = children_of(proc.pid)
    assert workers
    t0 = time.monotonic()
    proc.send_signal(sig)
    out, err = proc.communicate(timeout=60)
    assert time.monotonic() - t0 < 30
    assert proc.returncode == code, (proc.returncode, err)
    lines = [l for l in err.splitlines() if l.strip()]
    assert lines == [f"hlofuse optimize: interrupted by {sig.name}; no output written"], err
    assert not any(alive(w) for w in workers)
    assert sorted(os.listdir(tmp_path)) == ["m.mlir", "tmp"]      # no output, no temporary
    assert os.listdir(tmpdir) == []                                # no temporary folder


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc")
def test_an_interruption_names_what_was_already_written(files, tmp_path):
    shutil.copy(files["paths"]["text"], tmp_path / "m.mlir")
    proc = start_paused(["optimize", "m.mlir", "-o", "o.mlir", "--report", "r.json"], tmp_path,
                        "writing r.json=60", tmp_path)
    proc.send_signal(signal.SIGTERM)
    out, err = proc.communicate(timeout=60)
    assert proc.returncode == 143
    assert err.strip() == "hlofuse optimize: interrupted by SIGTERM; already written: o.mlir"
    assert sorted(os.listdir(tmp_path)) == ["m.mlir", "o.mlir"]


def test_what_the_worker_starts_is_not_marked_as_a_worker(tmp_path):
    """The worker's own settings (its supervisor's pid, its stage pipe) must not leak into what
    it starts: a nested ``hlofuse`` would take itself for an orphaned worker and exit."""
    (tmp_path / "spy.py").write_text(
        "import json, os\n"
        "json.dump(sorted(k for k in os.environ if k.startswith('HLOFUSE_CLI')), open('env.json', 'w'))\n"
        "def f(x):\n    return x * 2\n")
    p = subprocess.run([SCRIPT, "export", "spy:f", "--args", "f32[3]", "-o", "f.exported"],
                       cwd=tmp_path, capture_output=True, text=True, timeout=300)
    assert p.returncode == 0, p.stderr
    assert json.loads((tmp_path / "env.json").read_text()) == []


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="prctl")
def test_the_worker_dies_when_the_supervisor_is_killed(files, tmp_path):
    """SIGKILL cannot be forwarded: the worker's parent-death signal is the backstop."""
    import time
    shutil.copy(files["paths"]["text"], tmp_path / "m.mlir")
    proc = start_paused(["optimize", "m.mlir", "-o", "o.mlir"], tmp_path, "writing=60", tmp_path)
    workers = children_of(proc.pid)
    proc.kill()
    proc.communicate(timeout=60)
    deadline = time.monotonic() + 10
    while any(alive(w) for w in workers) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert not any(alive(w) for w in workers)
    assert sorted(os.listdir(tmp_path)) == ["m.mlir"]


# ---------------------------------------------------------------------------------------------
# Help and entry points
# ---------------------------------------------------------------------------------------------

@pytest.mark.parametrize("sub", SUBCOMMANDS)
def test_help_for_every_subcommand(sub, tmp_path, capsys):
    p = hlofuse_inprocess(capsys, sub, "--help", cwd=tmp_path)
    assert p.returncode == 0, p.stderr
    assert p.stdout.startswith(f"usage: hlofuse {sub}")
    listed = p.stdout.replace("--[no]", "--")                     # boolean flags
    assert "--verbose" in listed
    expected = {"optimize": ["--target", "--pipeline", "--disable-pass", "--report", "--dump-dir",
                             "--verify", "--format", "--target-version", "--in-place", "-o"],
                "run": ["--inputs", "--outputs", "--seed"], "check": ["--category", "--inputs"],
                "report": ["--target", "--report"], "export": ["--args", "--target", "-o"]}[sub]
    for flag in expected:
        assert flag in listed, flag


def test_installed_console_script(tmp_path):
    script = shutil.which("hlofuse") or os.path.join(os.path.dirname(sys.executable), "hlofuse")
    assert os.path.exists(script), "console script not installed: pip install -e ."
    p = subprocess.run([script, "--help"], capture_output=True, text=True, timeout=120)
    assert p.returncode == 0 and all(s in p.stdout for s in SUBCOMMANDS)
    p = hlofuse("export", "--help", cwd=tmp_path)                 # python -m hlofuse.cli.main
    assert p.returncode == 0 and p.stdout.startswith("usage: hlofuse export"), p.stderr


def test_arg_spec_parsing():
    specs = argspec.parse_arg_specs("f32[8,128], i32[8],bf16[],f32[b,4]")
    assert [str(s) for s in specs] == ["f32[8,128]", "i32[8]", "bf16[]", "f32[b,4]"]
    assert specs[0].mlir_type() == "tensor<8x128xf32>" and not specs[3].is_static
    for bad in ("f32[8", "x32[3]", "f32", "f32[1-2]"):
        with pytest.raises(formats.FileError):
            argspec.parse_arg_specs(bad)


@pytest.mark.parametrize("pipeline, needles", [
    ("cse,constant-fold{max_byte=3}", ("--pipeline", "unknown option(s) 'max_byte'",
                                       "known: max_bytes")),
    ("cse,constant-fold{max_bytes=lots}", ("--pipeline", "expected int, got 'lots'")),
    ("cse,nope", ("--pipeline", "unknown pass 'nope'")),
])
def test_bad_pipeline_text_is_a_usage_error_naming_the_flag(tmp_path, capsys, pipeline, needles):
    (tmp_path / "m.mlir").write_text(DYNAMIC)
    p = hlofuse_inprocess(capsys, "optimize", "m.mlir", "-o", "o.mlir", "--pipeline", pipeline,
                          cwd=tmp_path)
    one_error_line(p, *needles)
    assert not (tmp_path / "o.mlir").exists()


def test_verify_category_follows_what_the_optimization_did():
    """--verify's default tolerance (hlofuse.runtime.verify.program_category): 'kernel' for elementwise
    kernels only, the loosest category any kernel declares, and the category of a
    numerics-changing pass that rewrote something (a dequant scale moved: 'quantize')."""
    from hlofuse.core.report import PassRecord, Region, Report
    from hlofuse.runtime.verify import program_category

    def report(kinds, passes=()):
        r = Report()
        r.regions = [Region(i, k, [], kernel=f"k{i}") for i, k in enumerate(kinds)]
        r.regions.append(Region(99, "reduction", [], reason="left to XLA"))   # not a kernel
        r.passes = [PassRecord(n, 0.0, st) for n, st in passes]
        return r
    assert program_category(report([])) == "kernel"
    assert program_category(report(["elementwise"])) == "kernel"
    assert program_category(report(["elementwise", "attention"])) == "reassociate"
    assert program_category(report(["elementwise"], [("batchnorm-fold", {"folded": 0})])) == "kernel"
    assert program_category(report(["elementwise"], [("batchnorm-fold", {"folded": 2})])) == "reassociate"
    assert program_category(report(["matmul_epilogue"], [("quantize-matmul", {"rewrites": 1})])) == "quantize"


def test_the_shipped_example_optimizes_and_verifies(tmp_path):
    """``hlofuse.examples``: the file a fresh install tries the CLI on (the wheel check in CI
    runs the same command from the installed wheel) parses here, fuses and verifies; an
    unknown name lists the shipped ones."""
    import hlofuse.examples as examples
    src = examples.path()
    assert examples.names() == ["mlp_block.mlir"]
    p = hlofuse("optimize", src, "-o", "out.mlir", "--verify", cwd=tmp_path)
    assert p.returncode == 0, p.stderr
    assert "3 kernel(s)" in p.stdout and "match the original" in p.stdout, p.stdout
    with pytest.raises(FileNotFoundError, match="shipped: mlp_block.mlir"):
        examples.path("nope.mlir")


def test_a_reader_that_leaves_early_is_no_error(tmp_path):
    """``hlofuse report FILE | head``: the reader closes the pipe before the report is written
    (``true`` reads nothing); the command ends quietly with exit code 0."""
    src = os.path.join(os.path.dirname(formats.__file__), "..", "examples", "mlp_block.mlir")
    cmd = " ".join(shlex.quote(c) for c in CLI) + f" report {shlex.quote(src)}"
    p = subprocess.run(cmd + " | true; exit ${PIPESTATUS[0]}", shell=True,
                       executable="/bin/bash", cwd=tmp_path, capture_output=True, text=True,
                       timeout=300)
    assert p.returncode == 0 and p.stderr == "", p


# -- found by an adversarial run of the command line ------------------------------------------

F64_MODULE = """
module {
  func.func public @main(%a: tensor<4xf64>, %b: tensor<4xi64>) -> (tensor<4xf64>, tensor<4xi64>) {
    %0 = stablehlo.sine %a : tensor<4xf64>
    %1 = stablehlo.add %b, %b : tensor<4xi64>
    return %0, %1 : tensor<4xf64>, tensor<4xi64>
  }
}
"""


def test_64_bit_inputs_run_and_verify(tmp_path, capsys):
    """A file whose main takes f64/i64 runs in jax's 64-bit mode: without it jax handed XLA
    32-bit buffers, and ``--verify``, ``run`` and ``check`` failed on every such file (139 of
    255 sampled corpus modules)."""
    (tmp_path / "f64.mlir").write_text(F64_MODULE)
    r = hlofuse_inprocess(capsys, "optimize", "f64.mlir", "-o", "f64.opt.mlir", "--verify",
                          cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    assert "2 output(s) match the original" in r.stdout
    r = hlofuse_inprocess(capsys, "run", "f64.mlir", cwd=tmp_path)
    assert r.returncode == 0 and "float64[4]" in r.stdout and "int64[4]" in r.stdout, r
    r = hlofuse_inprocess(capsys, "check", "f64.mlir", "f64.opt.mlir", cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    assert not jax.config.jax_enable_x64          # the mode is scoped to the runs


def test_export_of_64_bit_arguments_needs_the_64_bit_mode(tmp_path, capsys):
    """jax traces f64 arguments as f32 without its 64-bit mode (a warning only): the export
    wrote an artifact taking f32. It is refused, naming the flag that turns the mode on."""
    (tmp_path / "m64.py").write_text("def g(x):\n    return x * 2\n")
    r = hlofuse_inprocess(capsys, "export", "m64:g", "--args", "f64[4]", "-o", "g.exported",
                          cwd=tmp_path)
    one_error_line(r, "f64[4]", "JAX_ENABLE_X64=1")
    assert not (tmp_path / "g.exported").exists()


def test_export_never_overwrites_its_source_module(tmp_path, capsys):
    src = "import jax.numpy as jnp\ndef f(x):\n    return jnp.tanh(x)\n"
    (tmp_path / "mm.py").write_text(src)
    r = hlofuse_inprocess(capsys, "export", "mm:f", "--args", "f32[4]", "-o", "mm.py",
                          cwd=tmp_path)
    one_error_line(r, "mm.py", "source file")
    assert (tmp_path / "mm.py").read_text() == src


@pytest.mark.skipif(not hasattr(os, "mkfifo"), reason="no FIFOs on this OS")
def test_an_output_that_is_not_a_regular_file_is_refused(tmp_path, capsys):
    """Outputs are written to a new file renamed over the path: a FIFO (or a device node,
    /dev/null as root) was replaced by a regular file."""
    (tmp_path / "f64.mlir").write_text(F64_MODULE)
    os.mkfifo(tmp_path / "pipe")
    r = hlofuse_inprocess(capsys, "optimize", "f64.mlir", "-o", "pipe", cwd=tmp_path)
    one_error_line(r, "pipe", "not a regular file")
    assert stat.S_ISFIFO(os.stat(tmp_path / "pipe").st_mode)


def test_shapes_with_verify_runs_the_refined_original(tmp_path, capsys):
    """``--shapes`` refined the module inside the optimizer, in place: ``--verify`` then ran a
    half-refined original (static arguments, dynamic ops) that XLA cannot compile."""
    (tmp_path / "dyn.mlir").write_text("""
module {
  func.func public @main(%a: tensor<?xf32>) -> tensor<?xf32> {
    %0 = stablehlo.tanh %a : tensor<?xf32>
    return %0 : tensor<?xf32>
  }
}
""")
    for pipeline in ([], ["--pipeline", "none"]):
        r = hlofuse_inprocess(capsys, "optimize", "dyn.mlir", "-o", "dyn.opt.mlir", "--shapes",
                              "f32[8]", "--verify", *pipeline, cwd=tmp_path)
        assert r.returncode == 0, r.stderr
        assert "1 output(s) match the original" in r.stdout
        assert "tensor<8xf32>" in (tmp_path / "dyn.opt.mlir").read_text()   # refined


def test_a_private_main_and_a_tuple_result_are_named_so(tmp_path, capsys):
    (tmp_path / "priv.mlir").write_text("""
module {
  func.func private @main(%a: tensor<4xf32>) -> tensor<4xf32> {
    %0 = stablehlo.add %a, %a : tensor<4xf32>
    return %0 : tensor<4xf32>
  }
}
""")
    r = hlofuse_inprocess(capsys, "optimize", "priv.mlir", "-o", "p.mlir", cwd=tmp_path)
    one_error_line(r, "priv.mlir", "main is private")
    (tmp_path / "tup.mlir").write_text("""
module {
  func.func public @main(%a: tensor<8xf32>) -> tuple<tensor<8xf32>, tensor<8xf32>> {
    %0 = stablehlo.add %a, %a : tensor<8xf32>
    %1 = stablehlo.tuple %0, %a : tuple<tensor<8xf32>, tensor<8xf32>>
    return %1 : tuple<tensor<8xf32>, tensor<8xf32>>
  }
}
""")
    r = hlofuse_inprocess(capsys, "optimize", "tup.mlir", "-o", "t.mlir", cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    assert "main result 0 is a tuple" in r.stderr and "dynamic" not in r.stderr


def test_user_code_that_exits_is_an_error_not_a_success(tmp_path, capsys):
    """A model script without a ``__main__`` guard that ends in ``sys.exit(0)`` made export and
    tune exit 0 with nothing written and no message; ``os._exit(0)`` at import the same, past
    every handler (adversarial round). Both are errors naming the module now."""
    (tmp_path / "script_model.py").write_text(
        "import sys\nimport jax.numpy as jnp\ndef forward(x):\n    return jnp.tanh(x)\n"
        "print('training done')\nsys.exit(0)\n")
    r = hlofuse_inprocess(capsys, "export", "script_model:forward", "--args", "f32[8]", "-o",
                          "out.exported", cwd=tmp_path)
    one_error_line(r, "script_model", "sys.exit(0)", "__main__")
    (tmp_path / "osexit_model.py").write_text("import os\nos._exit(0)\n")
    r = hlofuse("export", "osexit_model:f", "--args", "f32[8]", "-o", "out2.exported",
                cwd=tmp_path)
    one_error_line(r, "importing osexit_model", "os._exit")
    assert not (tmp_path / "out.exported").exists() and not (tmp_path / "out2.exported").exists()
    (tmp_path / "exits.py").write_text("import sys\ndef f(x):\n    sys.exit(0)\n")
    r = hlofuse_inprocess(capsys, "tune", "exits:f", "--args", "f32[8]", "--budget", "5",
                          "--cache-dir", "tc", cwd=tmp_path)     # traced by tune (review)
    one_error_line(r, "exits:f", "sys.exit(0)")


def test_flags_out_of_range_are_named(tmp_path, capsys):
    """A negative seed was "m.exported: ValueError: expected non-negative integer" (blaming the
    input), a negative or infinite budget blamed the function, a --cache-dir that is a file
    showed a bare FileExistsError (adversarial round)."""
    (tmp_path / "afile").write_text("x")
    (tmp_path / "mm.py").write_text("import jax.numpy as jnp\ndef f(x):\n    return jnp.tanh(x)\n")
    for args, needles in [(("check", "afile", "afile", "--seed", "-1"), ("--seed",)),
                          (("tune", "mm:f", "--args", "f32[8]", "--budget", "-1"), ("--budget",)),
                          (("tune", "mm:f", "--args", "f32[8]", "--budget", "inf"), ("--budget",)),
                          (("tune", "mm:f", "--args", "f32[8]", "--cache-dir", "afile"),
                           ("--cache-dir", "afile"))]:
        r = hlofuse_inprocess(capsys, *args, cwd=tmp_path)
        one_error_line(r, *needles)


def test_text_from_a_pipe_or_a_process_substitution(tmp_path, files):
    """StableHLO text through a pipe (``/dev/stdin``) parsed an empty module (the file was
    opened again after it was read to its end), a FIFO hung, and ``<(...)`` named a descriptor
    the worker did not inherit (adversarial round)."""
    src = files["paths"]["text"]
    script = (f"cat {src} | {' '.join(CLI)} optimize /dev/stdin -o piped.mlir && "
              f"{' '.join(CLI)} optimize <(cat {src}) -o subst.mlir")
    r = subprocess.run(["bash", "-c", script], cwd=tmp_path, capture_output=True, text=True,
                       timeout=300)
    assert r.returncode == 0, r.stderr
    assert "kernel(s)" in r.stderr or "kernel(s)" in r.stdout
    for name in ("piped.mlir", "subst.mlir"):
        assert "func.func" in (tmp_path / name).read_text()
    # a descriptor the shell never opened is no file, not the supervisor's stage pipe (review:
    # passing the supervisor's own descriptors made this hang)
    for fd in (3, 4):
        r = hlofuse("optimize", f"/dev/fd/{fd}", "-o", "x.mlir", cwd=tmp_path, timeout=120)
        one_error_line(r, f"/dev/fd/{fd}")


def test_an_output_named_through_dev_or_proc_is_refused(tmp_path, capsys):
    """``-o /dev/stdout >> build.log``: /dev/stdout resolved to build.log, and the atomic write
    renamed a new file over it, losing the log (adversarial round). A path through /dev or
    /proc names a stream: refused, as a FIFO is."""
    (tmp_path / "f64.mlir").write_text(F64_MODULE)
    os.symlink("/dev/stdout", tmp_path / "link.mlir")       # a link to one too (review)
    for out in ("/dev/stdout", "/dev/fd/1", "/proc/self/fd/1", "link.mlir"):
        r = hlofuse_inprocess(capsys, "optimize", "f64.mlir", "-o", out, cwd=tmp_path)
        one_error_line(r, out, "not a regular file")
    assert os.path.islink(tmp_path / "link.mlir")


def test_a_long_output_name_is_written(tmp_path, capsys):
    """The temporary file beside the output was ``.NAME.XXXXXXXX.tmp``: a valid 245-character
    name went past the file system's 255 (adversarial round)."""
    (tmp_path / "f64.mlir").write_text(F64_MODULE)
    name = "L" * 240 + ".mlir"
    r = hlofuse_inprocess(capsys, "optimize", "f64.mlir", "-o", name, cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    assert (tmp_path / name).exists()
