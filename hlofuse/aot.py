"""Compile optimized programs for real GPUs and TPUs on a machine without one.

Lowering for ``cuda``/``tpu`` from CPU only produces StableHLO; Triton's block, shared-memory and
register rules and Mosaic's tiling and VMEM limits are checked by the device compilers alone.
Those compilers run here without a device: libtpu's compile-only topologies (``v5e:1x1``,
``v4:1x1x1``, ``v6e:1x1``) and the CUDA plugin given a GPU target description (the
``GpuTargetConfigProto`` texts in ``hlofuse/gpu_targets/``, ptxas from the
``nvidia-cuda-nvcc-cu12`` wheel). Install them with ``pip install -e ".[aot]"``.

* :func:`compile_for` compiles a program for chips and returns, per chip, whether the whole
  program compiled, the compile time and, per kernel, ok or the compiler's own message with the
  region's kind, id, source location and block sizes. A program that is not optimized yet is
  optimized for each chip first (:func:`optimize_for`).
* :func:`optimize_for` optimizes for one chip (tiles from that chip's description), compiles,
  and sends every kernel that does not compile back to XLA, with the compiler's message as the
  region's reason in the report: decisions are per chip.

Every chip compiles in its own worker process (``python -m hlofuse.aot --worker``): some
compiler errors abort the process (an LLVM fatal error in Triton), and the CUDA and TPU
plugins are best kept apart. A worker that dies is reported against the kernel it was
compiling and restarted for the rest. The worker runs ``sys.executable`` unless
``HLOFUSE_AOT_PYTHON`` names another interpreter (a virtual environment with the ``aot``
extras, while the caller's has none).
"""

from __future__ import annotations

import dataclasses
import json
import os
import re
import subprocess
import sys
import tempfile
import time
from typing import Iterable, Sequence

from jaxlib.mlir import ir

from hlofuse import chips as _chips
from hlofuse import compat
from hlofuse import ir as hir
from hlofuse.api import Optimized, optimize
from hlofuse.passes.kernelize import KERNEL_INFO_ATTR
from hlofuse.tools import formats
from hlofuse.verify import rollback

__all__ = ["KernelResult", "ChipResult", "compile_for", "optimize_for", "optimize_many", "check_modules",
           "missing_packages", "INSTALL", "parse_chips"]

INSTALL = 'pip install -e ".[aot]"'
PYTHON_ENV = "HLOFUSE_AOT_PYTHON"
KERNEL_TARGETS = {"tpu_custom_call": "tpu", "__gpu$xla.gpu.triton": "gpu", "mosaic_gpu_v2": "gpu"}
_WORKER_ENV = {
    "JAX_PLATFORMS": "cpu",                  # the CUDA plugin's cuInit must not run (no driver)
    "TPU_ACCELERATOR_TYPE": "v5litepod-1",   # silences libtpu's host probing
    "TPU_WORKER_HOSTNAMES": "localhost",
    "TPU_SKIP_MDS_QUERY": "1",
    "TF_CPP_MIN_LOG_LEVEL": "3",
    "ALLOW_MULTIPLE_LIBTPU_LOAD": "1",       # the caller's process may hold libtpu's lockfile
    **compat.MOSAIC_GPU_ENV,                 # 0.10.2: no compiler_params must not mean Mosaic GPU
}


@dataclasses.dataclass
class KernelResult:
    """One kernel compiled for one chip."""
    func: str                  # the kernel's entry function in the module
    kind: str = "?"            # region kind (matmul_epilogue, reduction, ...)
    region: int | None = None  # region id in the report
    name: str = ""             # Pallas kernel name
    blocks: str = ""           # block sizes chosen for the chip
    location: str = "unknown"  # source line of the region
    ok: bool = True
    error: str | None = None   # the compiler's own message
    seconds: float | None = None  # set when the kernel was compiled on its own
    judged: bool = False       # the compiler gave a verdict (not: the worker could not run)

    def describe(self) -> str:
        rid = f" region {self.region}" if self.region is not None else ""
        return f"{self.kind}{rid} ({self.name or self.func}) at {self.location} [{self.blocks}]"


@dataclasses.dataclass
class ChipResult:
    """A program compiled for one chip."""
    chip: str
    ok: bool                   # the whole program compiled
    seconds: float = 0.0       # compile time of the whole program (as finally compiled)
    kernels: list[KernelResult] = dataclasses.field(default_factory=list)
    error: str | None = None   # program-level error (missing packages, XLA, crash)
    optimized: object = None   # hlofuse.Optimized when the program was optimized for this chip
    left_to_xla: list[KernelResult] = dataclasses.field(default_factory=list)  # sent back to XLA

    @property
    def failed(self) -> list[KernelResult]:
        return [k for k in self.kernels if not k.ok] + list(self.left_to_xla)

    def summary(self) -> str:
        c = _chips.get(self.chip)
        if self.error and not self.kernels and not self.left_to_xla:
            return f"{self.chip} ({c.title}): {self.error}"
        n_ok = sum(1 for k in self.kernels if k.ok)
        head = (f"{self.chip} ({c.title}): program {'compiled' if self.ok else 'FAILED'} in "
                f"{self.seconds:.2f} s; {n_ok} kernel(s) ok")
        if self.failed:
            head += f", {len(self.failed)} did not compile"
        lines = [head]
        for k in self.kernels:
            t = f" {k.seconds:.2f} s" if k.seconds is not None else ""
            lines.append(f"  {'ok  ' if k.ok else 'FAIL'} {k.describe()}{t}")
            if not k.ok:
                lines.append(f"       {k.error}")
        for k in self.left_to_xla:
            lines.append(f"  FAIL {k.describe()}: left to XLA for {self.chip}")
            lines.append(f"       {k.error}")
        if self.error:
            lines.append(f"  error: {self.error}")
        return "\n".join(lines)


# ---------------------------------------------------------------------------------------------
# Chips and packages
# ---------------------------------------------------------------------------------------------

def parse_chips(spec: str | Sequence) -> list[str]:
    """'h100,a100,v5e' (or a list) -> validated chip names."""
    names = [s.strip() for s in (spec.split(",") if isinstance(spec, str) else spec) if str(s).strip()]
    if not names:
        raise ValueError(f"no chip given; known chips: {', '.join(_chips.CHIPS)}")
    return [_chips.get(n).name for n in names]


def missing_packages(chip: str) -> str | None:
    """None when this interpreter can compile for ``chip``, else one line naming the install."""
    import importlib.util
    c = _chips.get(chip)
    if c.target == "tpu":
        need = [] if importlib.util.find_spec("libtpu") else ["libtpu"]
    else:
        need = [p for p in ("jax_cuda12_plugin", "jax_plugins") if importlib.util.find_spec(p) is None][:1]
        if not need and not _ptxas():
            need = ["ptxas (nvidia-cuda-nvcc-cu12)"]
        need = ["jax-cuda12-plugin" if n in ("jax_cuda12_plugin", "jax_plugins") else n for n in need]
    if not need:
        wrong = _mismatched_companion("libtpu" if c.target == "tpu" else "jax-cuda12-plugin")
        return None if wrong is None else (f"compiling for {c.name}: {wrong}: run {INSTALL}")
    return (f"compiling for {c.name} needs {', '.join(need)}, which is not installed: "
            f"run {INSTALL}")


def _mismatched_companion(dist: str) -> str | None:
    """Why the installed ``dist`` (libtpu, jax-cuda12-plugin) cannot compile for the installed
    jax, or None. The version jax needs is read from jax's own metadata (its ``tpu`` and
    ``cuda12`` extras pin the compilers it was released with), so no table here has to follow
    each jax release."""
    import importlib.metadata as md
    try:
        have = md.version(dist)
        reqs = md.requires("jax") or []
    except md.PackageNotFoundError:
        return None
    want = None
    for r in reqs:
        name, _, rest = r.partition(";")
        m = re.match(rf"\s*{re.escape(dist)}(\[[^\]]*\])?\s*(.*)", name)
        if m and m.group(2) and "extra ==" in rest:
            want = m.group(2).strip()
            break
    if want is None or _satisfies(have, want):
        return None
    return f"{dist} {have} is installed, but jax {md.version('jax')} needs {dist}{want}"


def _satisfies(version: str, spec: str) -> bool:
    """``version`` against a requirement's comma-separated ``==``, ``<=``, ``>=`` clauses (the
    forms jax's metadata uses; ``==X.*`` as a prefix)."""
    import operator
    ops = {"==": operator.eq, "<=": operator.le, ">=": operator.ge, "<": operator.lt,
           ">": operator.gt, "!=": operator.ne, None: operator.eq}
    have = compat.version_tuple(version)
    for clause in (c.strip() for c in spec.split(",") if c.strip()):
        op, v = re.match(r"(==|<=|>=|<|>|!=)?\s*(.*)", clause).groups()
        if op == "==" and v.endswith(".*"):
            prefix = compat.version_tuple(v[:-2])
            if have[:len(prefix)] != prefix:
                return False
        elif not ops[op](have, compat.version_tuple(v)):
            return False
    return True


def _ptxas() -> str | None:
    import importlib.util
    import shutil
    spec = importlib.util.find_spec("nvidia")
    for root in (spec.submodule_search_locations or []) if spec else []:
        p = os.path.join(root, "cuda_nvcc", "bin", "ptxas")
        if os.path.exists(p):
            return p
    return shutil.which("ptxas")


# ---------------------------------------------------------------------------------------------
# Programs: normalize, find kernels, cut one kernel out as its own module
# ---------------------------------------------------------------------------------------------

def _normalize(program):
    """-> (ir.Module in hlofuse's context, report or None, target or None)."""
    if hasattr(program, "exported") and hasattr(program, "report") and hasattr(program, "as_text"):
        return hir.parse(program.as_text(debug_info=True), hir.new_context()), program.report, None
    if isinstance(program, Optimized):
        return program.module, program.report, program.report.target
    if hasattr(program, "mlir_module_serialized"):        # jax.export.Exported
        return hir.parse(bytes(program.mlir_module_serialized), hir.new_context()), None, None
    if isinstance(program, ir.Module):
        return hir.parse(hir.to_bytecode(program), hir.new_context()), None, None
    if isinstance(program, (bytes, bytearray, str)):
        data = program.encode() if isinstance(program, str) else bytes(program)
        loaded = formats.load_bytes(data, source="<program>", probe=False)
        return loaded.module, None, None
    raise TypeError(f"cannot compile a {type(program).__name__}: pass an Exported, an ir.Module, "
                    f"StableHLO text/bytes, hlofuse.Optimized or hlofuse.jit(...).lower(...)")


def kernel_target(module: ir.Module) -> str | None:
    """'gpu' or 'tpu' when the module holds device kernels, else None (platform-neutral)."""
    found = {KERNEL_TARGETS.get(t) for t in hir.custom_call_targets(module)} - {None}
    if len(found) > 1:
        raise ValueError(f"module holds kernels for several targets: {sorted(found)}")
    return found.pop() if found else None


def _kernel_funcs(module: ir.Module) -> list:
    out = []
    for f in hir.funcs(module):
        name = hir.func_name(f)
        if KERNEL_INFO_ATTR in f.operation.attributes or re.fullmatch(r"hlofuse_k\d+(_\d+)?_main", name):
            out.append(f)
    return out


def _callees(module: ir.Module, root: str) -> list[str]:
    table = ir.SymbolTable(module.operation)
    seen, todo = [], [root]
    while todo:
        n = todo.pop()
        if n in seen:
            continue
        seen.append(n)
        for op in hir.all_ops(table[n]):
            if op.name == "func.call":
                todo.append(ir.FlatSymbolRefAttr(op.attributes["callee"]).value)
    return seen


def kernels_of(module: ir.Module, report=None) -> list[tuple[KernelResult, bytes]]:
    """Every kernel of an optimized module, described, with a module of its own (bytecode)."""
    calls: dict[str, str] = {}
    for op in hir.all_ops(module):
        if op.name == "func.call":
            calls.setdefault(ir.FlatSymbolRefAttr(op.attributes["callee"]).value, hir.op_location(op))
    out = []
    for f in _kernel_funcs(module):
        name = hir.func_name(f)
        k = KernelResult(func=name, location=calls.get(name, "unknown"))
        if KERNEL_INFO_ATTR in f.operation.attributes:
            kind, rid, kname, blocks = ir.StringAttr(f.operation.attributes[KERNEL_INFO_ATTR]).value.split("|", 3)
            k.kind, k.region, k.name, k.blocks = kind, int(rid), kname, blocks
        if report is not None and k.region is not None and k.region < len(report.regions):
            r = report.region(k.region)
            k.location = ", ".join(r.locations[:2]) or k.location
        out.append((k, _extract(module, name)))
    return out


def _extract(module: ir.Module, entry: str) -> bytes:
    """A module whose ``main`` is ``entry`` (with every function it calls)."""
    names = _callees(module, entry)
    ctx = module.context
    with ctx, ir.Location.unknown():
        new = ir.Module.create()
        table = ir.SymbolTable(module.operation)
        for n in names:
            f = table[n].operation.clone()
            new.body.append(f)
        ir.SymbolTable.replace_all_symbol_uses(entry, "main", new.operation)
        main = ir.SymbolTable(new.operation)[entry]
        ir.SymbolTable.set_symbol_name(main, "main")
        ir.SymbolTable.set_visibility(main, "public")
    return hir.to_bytecode(new)


# ---------------------------------------------------------------------------------------------
# Running the worker
# ---------------------------------------------------------------------------------------------

@dataclasses.dataclass
class _Item:
    label: str
    program: bytes
    kernels: list[tuple[KernelResult, bytes]]


def _python() -> str:
    return os.environ.get(PYTHON_ENV) or sys.executable


def check_modules(items: Sequence[tuple[str, ir.Module, object]], chip: str, *,
                  per_kernel: bool = False, timeout: float = 1800) -> list[ChipResult]:
    """Compile optimized modules for ``chip`` in one worker process (restarted after a crash).

    ``items``: (label, module, report or None). Each program is compiled whole; when that fails
    (or with ``per_kernel``), each of its kernels is compiled alone to say which one fails and
    why. Returns one :class:`ChipResult` per item, in order.
    """
    chip = _chips.get(chip).name
    work = [_Item(label, hir.to_bytecode(m), kernels_of(m, rep)) for label, m, rep in items]
    if _python() == sys.executable:
        missing = missing_packages(chip)
        if missing:
            return [ChipResult(chip, False, error=missing,
                               kernels=[dataclasses.replace(k, ok=False, error=missing) for k, _ in it.kernels])
                    for it in work]
    with tempfile.TemporaryDirectory(prefix="hlofuse-aot-") as d:
        jobs = []
        for i, it in enumerate(work):
            p = os.path.join(d, f"p{i}.mlirbc")
            with open(p, "wb") as fh:
                fh.write(it.program)
            kpaths = []
            for j, (_, data) in enumerate(it.kernels):
                kp = os.path.join(d, f"p{i}_k{j}.mlirbc")
                with open(kp, "wb") as fh:
                    fh.write(data)
                kpaths.append(kp)
            jobs.append({"id": i, "program": p, "kernels": kpaths, "per_kernel": per_kernel})
        raw = _run_worker(chip, jobs, d, timeout)
    out = []
    for it, job in zip(work, jobs):
        r = raw.get(job["id"], {})
        res = ChipResult(chip, bool(r.get("ok")), r.get("seconds", 0.0), error=r.get("error"))
        kres = r.get("kernels", {})
        for j, (k, _) in enumerate(it.kernels):
            k = dataclasses.replace(k)
            if str(j) in kres:
                kr = kres[str(j)]
                k.ok, k.error, k.seconds = kr["ok"], kr.get("error"), kr.get("seconds")
                k.judged = True
            else:   # not compiled alone: the whole program compiled (or could not be tried)
                k.ok = k.judged = res.ok
                k.error = None if res.ok else (res.error or "not compiled")
            res.kernels.append(k)
        out.append(res)
    return out


def _run_worker(chip: str, jobs: list, d: str, timeout: float) -> dict:
    """Run the worker until every job has an answer; a crash fails the step it was on (the
    whole program, or one kernel) and the worker restarts after it."""
    results: dict[int, dict] = {}
    crashes: dict[int, dict] = {}     # job id -> {"program": why, "kernels": {j: why}}
    pending = [dict(j) for j in jobs]
    env = dict(os.environ, **_WORKER_ENV)
    deadline = time.monotonic() + timeout
    jpath, progress = os.path.join(d, "jobs.json"), os.path.join(d, "progress")
    while pending:
        with open(jpath, "w") as fh:
            json.dump(pending, fh)
        if os.path.exists(progress):
            os.unlink(progress)
        try:
            proc = subprocess.run([_python(), "-m", "hlofuse.aot", "--worker", chip, jpath, progress],
                                  capture_output=True, text=True, env=env,
                                  timeout=max(1.0, deadline - time.monotonic()))
            rc, stdout, stderr = proc.returncode, proc.stdout, proc.stderr
        except subprocess.TimeoutExpired as e:
            out = e.stdout.decode() if isinstance(e.stdout, bytes) else (e.stdout or "")
            rc, stdout, stderr = -9, out, f"timed out after {timeout:.0f} s"
        for line in stdout.splitlines():
            if not line.startswith("{"):
                continue
            msg = json.loads(line)
            if "missing" in msg:
                return {j["id"]: {"ok": False, "error": msg["missing"]} for j in jobs}
            cr = crashes.get(msg["id"])
            if cr:
                if "program" in cr:
                    msg.update(ok=False, error=f"compiler crashed: {cr['program']}", seconds=0.0)
                for j, why in cr["kernels"].items():
                    msg["kernels"][j] = {"ok": False, "error": f"compiler crashed: {why}", "seconds": None}
            results[msg["id"]] = msg
        pending = [j for j in pending if j["id"] not in results]
        if not pending:
            break
        why = _crash_line(stderr, rc)
        try:
            with open(progress) as fh:
                step = json.load(fh)
        except (OSError, ValueError):
            step = None
        if rc == 0 or step is None or time.monotonic() >= deadline:
            for j in pending:
                results[j["id"]] = {"ok": False, "error": f"compiler worker failed: {why}", "kernels": {}}
            break
        jid, what = step["id"], step["what"]
        cr = crashes.setdefault(jid, {"kernels": {}})
        job = next(j for j in pending if j["id"] == jid)
        job["per_kernel"] = True
        job["skip_program"] = True      # crashed, or compiled already without a verdict printed
        if what == "program":
            cr["program"] = why
        else:
            cr["kernels"][str(what)] = why
            job["skip_kernels"] = sorted(int(k) for k in cr["kernels"])
            cr.setdefault("program", f"the kernel {what} crashed the compiler")
    return results


def _crash_line(stderr: str, rc: int) -> str:
    lines = [l.strip() for l in (stderr or "").splitlines() if l.strip()]
    for key in ("LLVM ERROR", "Fatal Error", "Check failed", "what():", "error:"):
        for l in lines:
            if key in l:
                return l[:400]
    return f"exit code {rc}" + (f": {lines[-1][:300]}" if lines else "")


# ---------------------------------------------------------------------------------------------
# The worker (runs in its own process, one chip)
# ---------------------------------------------------------------------------------------------

def compiler_message(e: BaseException, limit: int = 600) -> str:
    """The compiler's own message, first meaningful lines (no bytecode dumps)."""
    lines = []
    for l in str(e).splitlines():
        l = l.strip()
        if not l or l.startswith("input ir:") or "\\x" in l or not l.isprintable():
            continue
        if l.startswith(("=== Source Location", "learning/", "third_party/")):
            continue
        lines.append(l)
        if len(lines) >= 3:
            break
    msg = " | ".join(lines) or type(e).__name__
    return msg if len(msg) <= limit else msg[: limit - 3] + "..."


def _device(chip):
    from jax.experimental import topologies
    if chip.target == "tpu":
        topo = topologies.get_topology_desc(chip.topology, platform="tpu",
                                            chips_per_host_bounds=(1, 1, 1))
    else:
        topo = topologies.get_topology_desc(platform="cuda", topology="1x1x1",
                                            target_config=chip.target_config)
    return topo.devices[0]


def _worker(chip_name: str, jobs_path: str, progress_path: str) -> int:
    chip = _chips.get(chip_name)
    missing = missing_packages(chip.name)
    if missing:
        print(json.dumps({"missing": missing}), flush=True)
        return 0
    import jax.extend.backend as jeb
    dev = _device(chip)
    client = dev.client
    devices = compat.DeviceList((dev,))
    ctx = compat.new_ir_context()

    def compile_one(path: str) -> tuple[bool, str | None, float]:
        with open(path, "rb") as fh:
            data = fh.read()
        t0 = time.perf_counter()
        # Triton's MLIR diagnostics go to the native stderr, not into the exception: keep them
        with tempfile.TemporaryFile() as cap:
            saved = os.dup(2)
            os.dup2(cap.fileno(), 2)
            try:
                module = ir.Module.parse(data, context=ctx)
                client.compile(module, devices, jeb.get_compile_options(num_replicas=1, num_partitions=1))
                return True, None, time.perf_counter() - t0
            except Exception as e:  # the compiler's verdict
                secs = time.perf_counter() - t0
                os.dup2(saved, 2)
                cap.seek(0)
                diag = [l.split("error:", 1)[1].strip() for l in cap.read().decode("utf-8", "replace").splitlines()
                        if "error:" in l and "\\x" not in l]
                msg = compiler_message(e)
                if diag and diag[0] not in msg:
                    msg = compiler_message(Exception(diag[0] + "\n" + str(e)))
                return False, msg, secs
            finally:
                os.dup2(saved, 2)
                os.close(saved)

    def mark(jid, what):
        with open(progress_path, "w") as fh:
            json.dump({"id": jid, "what": what}, fh)

    with open(jobs_path) as fh:
        jobs = json.load(fh)
    for job in jobs:
        res = {"id": job["id"], "ok": False, "kernels": {}}
        if not job.get("skip_program"):
            mark(job["id"], "program")
            ok, err, secs = compile_one(job["program"])
            res.update(ok=ok, error=err, seconds=secs)
        else:
            res.update(ok=False, error="compiler crashed on the whole program", seconds=0.0)
        if job.get("per_kernel") or not res["ok"]:
            for j, kp in enumerate(job["kernels"]):
                if j in job.get("skip_kernels", []):
                    continue
                mark(job["id"], j)
                ok, err, secs = compile_one(kp)
                res["kernels"][str(j)] = {"ok": ok, "error": err, "seconds": secs}
        print(json.dumps(res), flush=True)
    if os.path.exists(progress_path):
        os.unlink(progress_path)
    return 0


# ---------------------------------------------------------------------------------------------
# Public API
# ---------------------------------------------------------------------------------------------

def optimize_for(module, chip: str, *, pipeline=None, options: dict | None = None,
                 source: str = "<module>", per_kernel: bool = False) -> ChipResult:
    """Optimize ``module`` for ``chip``, compile it there, and send every kernel that does not
    compile back to XLA (the region's reason in the report is the compiler's message).

    Returns the :class:`ChipResult` of the final program; ``.optimized`` is the
    :class:`hlofuse.Optimized` (module and report) for this chip, ``.left_to_xla`` the kernels
    sent back.
    """
    return optimize_many([(source, module)], chip, pipeline=pipeline, options=options,
                         per_kernel=per_kernel)[0]


def optimize_many(items: Sequence[tuple[str, object]], chip: str, *, pipeline=None,
                  options: dict | None = None, per_kernel: bool = False) -> list[ChipResult]:
    """:func:`optimize_for` over several (label, module) pairs with one compiler worker."""
    c = _chips.get(chip)
    opts = dict(options or {}, chip=c.name)
    opts_ = [optimize(m, target=c.target, pipeline=pipeline, options=opts, source=label)
             for label, m in items]
    first = check_modules([(label, o.module, o.report) for (label, _), o in zip(items, opts_)],
                          c.name, per_kernel=per_kernel)
    redo = []
    for i, (res, opt) in enumerate(zip(first, opts_)):
        res.optimized = opt
        bad = [k for k in res.kernels if not k.ok and k.judged]
        if res.ok or not bad:
            continue
        for k in bad:
            if k.region is None or k.region >= len(opt.report.regions):
                continue
            region = opt.report.region(k.region)
            if "kernel_func" in region.extra:
                rollback(opt, region, f"does not compile for {c.name}: {k.error}")
        redo.append((i, bad))
    if redo:   # the programs as they will run on this chip
        again = check_modules([(items[i][0], opts_[i].module, opts_[i].report) for i, _ in redo], c.name)
        for (i, bad), res in zip(redo, again):
            res.left_to_xla = bad
            res.optimized = opts_[i]
            first[i] = res
    return first


def compile_for(program, chips: str | Sequence[str], *, optimize: bool | None = None,
                per_kernel: bool = False, source: str = "<program>"):
    """Compile ``program`` for each chip (each in its own process).

    Args:
      program: an optimized program (``hlofuse.jit(...).lower(...)``, ``hlofuse.Optimized``, a
        ``jax.export.Exported`` whose payload hlofuse optimized, an ``ir.Module`` or StableHLO
        text/bytes), or one not optimized yet.
      chips: a chip name or several ('h100', 'a100', 'v5e', 'v4', 'v6e'; see hlofuse.chips).
      optimize: None: optimize (with :func:`optimize_for`) unless the program already holds
        hlofuse kernels; True/False to force.
      per_kernel: compile every kernel alone too (per-kernel compile times); otherwise kernels
        are compiled alone only when the program fails, to say which one fails and why.

    Returns:
      One :class:`ChipResult` for a single chip name, else ``{chip: ChipResult}``.
    """
    single = isinstance(chips, str) and "," not in chips
    names = parse_chips(chips)
    module, report, _ = _normalize(program)
    ktarget = kernel_target(module)
    has_kernels = bool(ktarget) or bool(_kernel_funcs(module))
    do_opt = (not has_kernels) if optimize is None else optimize
    out = {}
    for n in names:
        c = _chips.get(n)
        if do_opt:
            out[n] = optimize_for(module, n, source=source, per_kernel=per_kernel)
        elif ktarget and ktarget != c.target:
            out[n] = ChipResult(n, False, error=f"the program holds {ktarget} kernels; optimize it for "
                                                f"{c.target} to compile it for {n}")
        else:
            (out[n],) = check_modules([(source, module, report)], n, per_kernel=per_kernel)
    return out[names[0]] if single else out


# ---------------------------------------------------------------------------------------------
# CLI: hlofuse check --compile-for CHIPS FILE
# ---------------------------------------------------------------------------------------------

def cli_compile_for(chips_flag: str, paths: Sequence[str], *, per_kernel: bool = False,
                    out=None) -> int:
    """``hlofuse check --compile-for h100,v5e FILE``: exit 0 when every kernel compiles for every
    chip, 1 when one does not (it then runs on XLA for that chip), 2 when packages are missing."""
    import jax
    if not compat.backends_are_initialized():
        # this process only parses and optimizes: keep the GPU/TPU plugins asleep (no driver)
        jax.config.update("jax_platforms", "cpu")
    out = out or sys.stdout
    if len(paths) != 1:
        raise ValueError(f"--compile-for takes one FILE, got {len(paths)}")
    names = parse_chips(chips_flag)
    path = paths[0]
    loaded = formats.load(path, probe=False)
    module = loaded.module
    missing = [m for m in (missing_packages(n) for n in names) if m] if _python() == sys.executable else []
    if missing:
        print(f"hlofuse check: error: {missing[0]}", file=sys.stderr)
        return 2
    results = compile_for(module, names, per_kernel=per_kernel, source=path)
    n_ok = n_bad = 0
    for n in names:
        r = results[n]
        print(r.summary(), file=out)
        n_ok += sum(1 for k in r.kernels if k.ok)
        n_bad += len(r.failed) + (0 if r.ok else 1 if not r.failed else 0)
    print(f"{n_ok} passed, {n_bad} failed", file=out)
    return 0 if n_bad == 0 else 1


if __name__ == "__main__":
    if len(sys.argv) == 5 and sys.argv[1] == "--worker":
        sys.exit(_worker(sys.argv[2], sys.argv[3], sys.argv[4]))
    print("usage: python -m hlofuse.aot --worker CHIP JOBS.json PROGRESS", file=sys.stderr)
    sys.exit(2)
