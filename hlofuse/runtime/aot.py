"""Compile optimized programs for real GPUs and TPUs on a machine without one.

Lowering for ``cuda``/``tpu`` from CPU only produces StableHLO; Triton's block, shared-memory and
register rules and Mosaic's tiling and VMEM limits are checked by the device compilers alone.
Those compilers run here without a device: libtpu's compile-only topologies (``v5e:1x1``,
``v4:1x1x1``, ``v6e:1x1``) and the CUDA plugin given a GPU target description (the
``GpuTargetConfigProto`` texts in ``hlofuse/core/gpu_targets/``, ptxas from the
``nvidia-cuda-nvcc-cu12`` wheel). Install them with ``pip install -e ".[aot]"``.

* :func:`compile_for` compiles a program for chips and returns, per chip, whether the whole
  program compiled, the compile time and, per kernel, ok or the compiler's own message with the
  region's kind, id, source location and block sizes. A program that is not optimized yet is
  optimized for each chip first (:func:`optimize_for`).
* :func:`optimize_for` optimizes for one chip (tiles from that chip's description), compiles,
  and sends every kernel that does not compile back to XLA, with the compiler's message as the
  region's reason in the report: decisions are per chip.

Kernel quality without a device: every kernel compiled for a chip carries the compiler's own
resource figures (:attr:`KernelResult.resources`). Triton (GPU): XLA's ptxas runs with ``-v``
(a wrapper in a copy of the CUDA directory XLA is pointed at): registers per thread, spill
stores/loads, stack and static shared memory per entry, with the threads and dynamic shared
memory of each launch from XLA's thunk dump; :func:`gpu_occupancy` bounds the resident warps per
SM from them and the chip's description. Mosaic (TPU): the scoped VMEM the Mosaic compiler
asked XLA:TPU for (``used_scoped_memory_configs`` in the compiled HLO), against the chip's
scoped limit and physical VMEM: a real figure, not hlofuse's tiling estimate. A kernel that
spills or cannot reach half occupancy is flagged (:attr:`KernelResult.flags`) in
:meth:`ChipResult.summary`. Figures that cannot be read say "figures unavailable: ...".

Every chip compiles in its own worker process (``python -m hlofuse.runtime.aot --worker``): some
compiler errors abort the process (an LLVM fatal error in Triton), and the CUDA and TPU
plugins are best kept apart. A worker that dies is reported against the kernel it was
compiling and restarted for the rest. The worker runs ``sys.executable`` unless
``HLOFUSE_AOT_PYTHON`` names another interpreter (a virtual environment with the ``aot``
extras, while the caller's has none).
"""

from __future__ import annotations

import dataclasses
import json
import math
import os
import re
import subprocess
import sys
import tempfile
import time
from typing import Iterable, Sequence

from jaxlib.mlir import ir

from hlofuse.core import chips as _chips
from hlofuse.core import compat
from hlofuse.core import config
from hlofuse.core import ir as hir
from hlofuse.runtime.api import Optimized, optimize
from hlofuse.passes.fusion.outline import executable_module
from hlofuse.passes.kernel_table import KERNEL_INFO_ATTR, kernel_funcs
from hlofuse.runtime import formats
from hlofuse.runtime.kernel_choice import rollback

__all__ = ["KernelResult", "ChipResult", "compile_for", "optimize_for", "optimize_many", "check_modules",
           "missing_packages", "INSTALL", "parse_chips", "gpu_occupancy", "kernel_resources",
           "LOW_OCCUPANCY"]

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
#: a kernel whose occupancy bound (resident warps / the SM's maximum) is under this is flagged
LOW_OCCUPANCY = 0.5
# CUDA architecture facts the GpuTargetConfigProto does not carry (CUDA C++ Programming Guide,
# "Technical Specifications per Compute Capability"): resident blocks per SM, and registers are
# given to a warp in units of 256 (8 per thread) on every compute capability hlofuse targets
_MAX_BLOCKS_PER_SM = {(8, 0): 32, (8, 6): 16, (8, 7): 16, (8, 9): 24, (9, 0): 32}
_REGISTER_UNIT_PER_WARP = 256


def _fmt_bytes(n) -> str:
    if n is None:
        return "?"
    for unit, size in (("MiB", 1 << 20), ("KiB", 1 << 10)):
        if n >= size:
            return f"{n / size:.{0 if n % size == 0 else 1}f} {unit}"
    return f"{n} B"


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
    # the compiler's resource figures (see :func:`kernel_resources`): {"target": "gpu",
    # "source", "entries": [ptxas figures and occupancy per Triton entry]}, {"target": "tpu",
    # "source", "entries": [VMEM per Mosaic kernel]}, or {"unavailable": why}; None: not compiled
    resources: dict | None = None

    def describe(self) -> str:
        rid = f" region {self.region}" if self.region is not None else ""
        return f"{self.kind}{rid} ({self.name or self.func}) at {self.location} [{self.blocks}]"

    @property
    def _entries(self) -> list[dict]:
        return list((self.resources or {}).get("entries") or [])

    @property
    def spill_bytes(self) -> int | None:
        """Spill stores + loads of all its Triton entries (ptxas), None without GPU figures."""
        es = [e for e in self._entries if "registers" in e]
        return sum(e["spill_stores"] + e["spill_loads"] for e in es) if es else None

    @property
    def occupancy(self) -> float | None:
        """The lowest occupancy bound of its Triton entries (resident warps / the SM's maximum)."""
        occ = [e["occupancy"] for e in self._entries if e.get("occupancy") is not None]
        return min(occ) if occ else None

    @property
    def vmem_bytes(self) -> int | None:
        """The largest scoped VMEM of its Mosaic kernels (as compiled), None without TPU figures."""
        vm = [e["vmem_bytes"] for e in self._entries if "vmem_bytes" in e]
        return max(vm) if vm else None

    @property
    def flags(self) -> list[str]:
        """Why this kernel's code is poor on the chip: register spills, occupancy under half."""
        out = []
        for e in self._entries:
            spilled = e.get("spill_stores", 0) + e.get("spill_loads", 0)
            if spilled:
                out.append(f"{self._entry_label(e)}spills {e['spill_stores']} B stores, "
                           f"{e['spill_loads']} B loads to local memory")
            occ = e.get("occupancy")
            if occ is not None and occ < LOW_OCCUPANCY:
                out.append(f"{self._entry_label(e)}occupancy {occ:.2f} < {LOW_OCCUPANCY} "
                           f"(limited by {e['limiter']})")
        return out

    def _entry_label(self, e: dict) -> str:
        """An entry's name as shown under the kernel: nothing for the kernel itself, the
        suffix for its other launches (``[_dkv]``), the whole name otherwise."""
        n = e["name"]
        if n == self.name:
            return ""
        return f"[{n[len(self.name):]}] " if self.name and n.startswith(self.name) else f"[{n}] "

    def resource_lines(self) -> list[str]:
        """The resource figures, one line per compiled entry ("figures unavailable: ..." when
        they could not be read; nothing when the kernel was not compiled)."""
        r = self.resources
        if not r:
            return []
        if r.get("unavailable"):
            return [f"figures unavailable: {r['unavailable']}"]
        lines = []
        for e in r.get("entries", []):
            if "registers" in e:
                spilled = e["spill_stores"] + e["spill_loads"]
                spill = (f"spills {e['spill_stores']} B stores + {e['spill_loads']} B loads"
                         if spilled else "no spills")
                occ = (f"{e['blocks_per_sm']} block(s)/SM, occupancy <= {e['occupancy']:.2f} "
                       f"({e['limiter']})" if e.get("occupancy") is not None
                       else "occupancy unknown (no launch dims)")
                lines.append(
                    f"{self._entry_label(e)}ptxas {e['arch']}: {e['registers']} registers/thread, "
                    f"{spill}, stack {e['stack_bytes']} B, smem {_fmt_bytes(e['smem_bytes'])}/block"
                    f"{' (+ dynamic: no launch dims)' if e.get('smem_dynamic') is None else ''}, "
                    f"{e['threads'] or '?'} threads/block -> {occ}")
            elif "vmem_bytes" in e:
                lines.append(
                    f"{self._entry_label(e)}Mosaic VMEM {_fmt_bytes(e['vmem_bytes'])} of the "
                    f"{_fmt_bytes(e['vmem_limit'])} scoped limit ({e['vmem_fraction']:.0%}; "
                    f"{_fmt_bytes(e['vmem_capacity'])} physical)")
        return lines


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

    @property
    def flagged(self) -> list[KernelResult]:
        """Kernels that compiled into poor code for the chip (spills, occupancy under half)."""
        return [k for k in self.kernels if k.ok and k.flags]

    def summary(self) -> str:
        c = _chips.get(self.chip)
        if self.error and not self.kernels and not self.left_to_xla:
            return f"{self.chip} ({c.title}): {self.error}"
        n_ok = sum(1 for k in self.kernels if k.ok)
        head = (f"{self.chip} ({c.title}): program {'compiled' if self.ok else 'FAILED'} in "
                f"{self.seconds:.2f} s; {n_ok} kernel(s) ok")
        if self.failed:
            head += f", {len(self.failed)} did not compile"
        if self.flagged:
            head += f", {len(self.flagged)} flagged (spills or occupancy < {LOW_OCCUPANCY})"
        lines = [head]
        for k in self.kernels:
            t = f" {k.seconds:.2f} s" if k.seconds is not None else ""
            mark = "FAIL" if not k.ok else "FLAG" if k.flags else "ok  "
            lines.append(f"  {mark} {k.describe()}{t}")
            if not k.ok:
                lines.append(f"       {k.error}")
            lines += [f"       {l}" for l in k.resource_lines()]
            lines += [f"       flagged: {f}" for f in k.flags]
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
# Resource figures: ptxas -v (Triton), scoped VMEM (Mosaic), occupancy
# ---------------------------------------------------------------------------------------------

def _gpu_limits(chip) -> dict:
    """Per-SM limits from the chip's GpuTargetConfigProto (the text XLA compiles against)."""
    info = _chips.parse_textproto(chip.target_config)["gpu_device_info"]
    smem_sm = int(info.get("shared_memory_per_core", 0))
    optin = int(info.get("shared_memory_per_block_optin", info.get("shared_memory_per_block", 0)))
    return {"registers": int(info.get("registers_per_core_limit", chip.registers_per_block)),
            "threads": int(info.get("threads_per_core_limit", 2048)),
            "smem": smem_sm, "smem_reserved": max(0, smem_sm - optin) if smem_sm else 0,
            "warp": int(info.get("threads_per_warp", 32)),
            "blocks": _MAX_BLOCKS_PER_SM.get(tuple(chip.compute_capability), 32)}


def gpu_occupancy(chip, registers: int, threads: int, smem_bytes: int = 0) -> dict:
    """The occupancy bound of one kernel on one SM of ``chip`` (a name or Chip): how many of its
    blocks fit at once by registers (``registers`` per thread, given per warp in units of 256),
    threads, shared memory (``smem_bytes`` per block plus the per-block reservation) and the
    resident-block limit; ``occupancy`` is their warps over the SM's maximum warps and
    ``limiter`` what bounds it. What is resident, not what is achieved (no latency model)."""
    c = chip if isinstance(chip, _chips.Chip) else _chips.get(chip)
    lim = _gpu_limits(c)
    warps = max(1, -(-threads // lim["warp"]))
    per_warp = -(-max(1, registers) * lim["warp"] // _REGISTER_UNIT_PER_WARP) * _REGISTER_UNIT_PER_WARP
    bounds = {
        "registers": (lim["registers"] // per_warp) // warps,
        "threads": (lim["threads"] // lim["warp"]) // warps,
        "blocks": lim["blocks"],
    }
    if smem_bytes and lim["smem"]:
        bounds["shared memory"] = lim["smem"] // (-(-smem_bytes // 128) * 128 + lim["smem_reserved"])
    limiter = min(bounds, key=lambda k: (bounds[k], k != "registers"))
    blocks = bounds[limiter]
    max_warps = lim["threads"] // lim["warp"]
    return {"blocks_per_sm": blocks, "occupancy": round(blocks * warps / max_warps, 4),
            "limiter": limiter, "warps_per_block": warps}


_ENTRY_RE = re.compile(r"Compiling entry function '([^']+)' for '([^']+)'")
_PROPS_RE = re.compile(r"Function properties for (\S+)")
_FRAME_RE = re.compile(r"(\d+) bytes stack frame, (\d+) bytes spill stores, (\d+) bytes spill loads")
_USED_RE = re.compile(r"Used (\d+) registers")
_SMEM_RE = re.compile(r"(\d+) bytes smem")
_THUNK_RE = re.compile(r"(\S+) grid: \[([\d, ]+)\] threads: \[([\d, ]+)\]\s+shared_memory: (\d+) bytes")
_NTID_RE = re.compile(r"\.(?:reqntid|maxntid)\s+(\d+)(?:\s*,\s*(\d+))?(?:\s*,\s*(\d+))?")
_PTX_ENTRY_RE = re.compile(r"\.entry\s+([\w$.]+)")


def parse_ptxas_log(text: str) -> dict[str, dict]:
    """``ptxas -v`` output -> {entry: {arch, registers, spill_stores, spill_loads, stack_bytes,
    smem_static}} (entries only; device functions are inlined by Triton)."""
    out: dict[str, dict] = {}
    cur = props = None
    for line in text.splitlines():
        if m := _ENTRY_RE.search(line):
            cur = m.group(1)
            out[cur] = {"arch": m.group(2), "registers": None, "spill_stores": 0, "spill_loads": 0,
                        "stack_bytes": 0, "smem_static": 0}
        elif m := _PROPS_RE.search(line):
            props = m.group(1)
        elif (m := _FRAME_RE.search(line)) and props in out:
            out[props].update(stack_bytes=int(m.group(1)), spill_stores=int(m.group(2)),
                              spill_loads=int(m.group(3)))
        elif (m := _USED_RE.search(line)) and cur in out:
            out[cur]["registers"] = int(m.group(1))
            sm = _SMEM_RE.search(line)
            out[cur]["smem_static"] = int(sm.group(1)) if sm else 0
    return {k: v for k, v in out.items() if v["registers"] is not None}


def parse_thunks(text: str) -> dict[str, dict]:
    """XLA:GPU's thunk sequence dump -> {kernel: {grid, threads, smem_dynamic}} (launch dims)."""
    out = {}
    for m in _THUNK_RE.finditer(text):
        t = [int(x) for x in m.group(3).split(",")]
        out[m.group(1)] = {"grid": [int(x) for x in m.group(2).split(",")],
                           "threads": t[0] * (t[1] if len(t) > 1 else 1) * (t[2] if len(t) > 2 else 1),
                           "smem_dynamic": int(m.group(4))}
    return out


def _parse_ntid(text: str) -> dict[str, int]:
    """PTX ``.entry`` lines and their ``.reqntid``/``.maxntid`` -> {entry: threads per block}."""
    out, cur = {}, None
    for line in text.splitlines():
        if m := _PTX_ENTRY_RE.search(line):
            cur = m.group(1)
        elif (m := _NTID_RE.search(line)) and cur:
            out[cur] = math.prod(int(g) for g in m.groups() if g)
    return out


_CUSTOM_CALL_NAME_RE = re.compile(r"^\s*(?:ROOT\s+)?%?([\w.\-]+)\s*=")
_OP_NAME_RE = re.compile(r'op_name="[^"]*?([\w.\-]+)/pallas_call')
_USED_SCOPED_RE = re.compile(r'"used_scoped_memory_configs":\[([^\]]*)\]')
_SCOPED_ITEM_RE = re.compile(r'"memory_space":"?(\d+)"?[^}]*?"size":"?(\d+)"?')
_VMEM_SPACE = 1     # XLA:TPU's memory-space color of VMEM (its memory-usage report: "vmem (color=1)")


def parse_mosaic_vmem(hlo_text: str) -> dict[str, dict]:
    """XLA:TPU's compiled HLO -> {Mosaic kernel: {vmem_bytes}}: the scoped VMEM each
    ``tpu_custom_call`` was given (``used_scoped_memory_configs``), what Mosaic asked for."""
    out = {}
    for line in hlo_text.splitlines():
        if 'custom_call_target="tpu_custom_call"' not in line:
            continue
        used = _USED_SCOPED_RE.search(line)
        if not used:
            continue
        m = _OP_NAME_RE.search(line) or _CUSTOM_CALL_NAME_RE.match(line)
        if not m:
            continue
        name = re.sub(r"\.\d+$", "", m.group(1))
        vmem = sum(int(sz) for space, sz in _SCOPED_ITEM_RE.findall(used.group(1))
                   if int(space) == _VMEM_SPACE)
        prev = out.get(name, {}).get("vmem_bytes", 0)
        out[name] = {"vmem_bytes": max(prev, vmem)}
    return out


_PTXAS_WRAPPER = """#!/bin/sh
# hlofuse.runtime.aot: the ptxas XLA runs, run with -v; its resource lines go to one file per run
in=
for a in "$@"; do
  case "$a" in -*) ;; *) if [ -z "$in" ] && [ -f "$a" ]; then in=$a; fi ;; esac
done
if [ -z "$in" ]; then exec {real} "$@"; fi
grep -E '[.]entry[[:space:]]|[.]reqntid|[.]maxntid' "$in" > {runs}/$$.ntid 2>/dev/null
{real} "$@" -v 2> {runs}/$$.log
rc=$?
grep -v -e '^ptxas info' -e 'bytes stack frame' {runs}/$$.log >&2
exit $rc
"""


class _PtxasProbe:
    """The figures of XLA's own ptxas runs: XLA is pointed (``xla_gpu_cuda_data_dir``) at a copy
    of its CUDA directory (symlinks) whose ``bin/ptxas`` runs the real one with ``-v``, and each
    compile dumps its thunk sequence (launch threads, dynamic shared memory). Nothing is
    compiled twice. ``unavailable``: why no figures can be read (then XLA is left as it was)."""

    def __init__(self, root: str):
        self.unavailable: str | None = None
        self.root = root
        self.runs = os.path.join(root, "runs")
        self.dump = os.path.join(root, "dump")
        self.cuda_dir = os.path.join(root, "cuda")
        self.seen: dict[str, dict] = {}     # entry -> figures, for a compile XLA served from a cache
        try:
            self._make()
        except Exception as e:  # noqa: BLE001 - no figures (in .unavailable), compiles go on
            self.unavailable = f"{type(e).__name__}: {e}" if not isinstance(e, LookupError) else str(e)

    def _make(self):
        import shlex
        real_dir = compat.cuda_path()   # the CUDA directory jax gives XLA
        real = os.path.join(real_dir, "bin", "ptxas") if real_dir else None
        if not real or not os.access(real, os.X_OK):
            real = _ptxas()
            real_dir = os.path.dirname(os.path.dirname(real)) if real else None
        if not real:
            raise LookupError("no ptxas to run with -v (nvidia-cuda-nvcc-cu12 is not installed)")
        if not os.path.isdir(os.path.join(real_dir, "nvvm", "libdevice")):
            raise LookupError(f"ptxas at {real} is not in a CUDA directory with nvvm/libdevice")
        os.makedirs(os.path.join(self.cuda_dir, "bin"))
        os.makedirs(self.runs)
        for e in os.listdir(real_dir):
            if e != "bin":
                os.symlink(os.path.join(real_dir, e), os.path.join(self.cuda_dir, e))
        for e in os.listdir(os.path.join(real_dir, "bin")):
            if e != "ptxas":
                os.symlink(os.path.join(real_dir, "bin", e), os.path.join(self.cuda_dir, "bin", e))
        wrapper = os.path.join(self.cuda_dir, "bin", "ptxas")
        with open(wrapper, "w") as fh:
            fh.write(_PTXAS_WRAPPER.replace("{real}", shlex.quote(real))
                     .replace("{runs}", shlex.quote(self.runs)))
        os.chmod(wrapper, 0o755)

    def configure(self, options) -> None:
        """Point one compile's options at the wrapper and a fresh dump directory."""
        if self.unavailable:
            return
        import shutil
        for d in (self.runs, self.dump):
            shutil.rmtree(d, ignore_errors=True)
            os.makedirs(d)
        dbg = options.executable_build_options.debug_options
        dbg.xla_gpu_cuda_data_dir = self.cuda_dir
        dbg.xla_dump_to = self.dump

    def collect(self) -> dict:
        """The figures of the compile just run: {"entries": {name: figures}} or {"unavailable"}."""
        if self.unavailable:
            return {"unavailable": self.unavailable}
        figures: dict[str, dict] = {}
        ntid: dict[str, int] = {}
        runs = 0
        for f in sorted(os.listdir(self.runs)):
            with open(os.path.join(self.runs, f), errors="replace") as fh:
                text = fh.read()
            if f.endswith(".log"):
                runs += 1
                figures.update(parse_ptxas_log(text))
            elif f.endswith(".ntid"):
                ntid.update(_parse_ntid(text))
        launches: dict[str, dict] = {}
        for f in os.listdir(self.dump) if os.path.isdir(self.dump) else []:
            if f.endswith("thunk_sequence.txt"):
                with open(os.path.join(self.dump, f), errors="replace") as fh:
                    launches.update(parse_thunks(fh.read()))
        for name in launches:          # a kernel XLA did not hand to ptxas this time (cached)
            if name not in figures and name in self.seen:
                figures[name] = dict(self.seen[name], cached=True)
        if not figures:
            why = ("XLA ran no ptxas (an in-process PTX compiler, e.g. "
                   "--xla_gpu_enable_libnvptxcompiler?)" if not runs else
                   "ptxas -v printed no entry figures")
            return {"unavailable": why}
        for name, fig in figures.items():
            self.seen.setdefault(name, {k: v for k, v in fig.items() if k != "cached"})
            launch = launches.get(name, {})
            fig["threads"] = launch.get("threads") or ntid.get(name)
            fig["smem_dynamic"] = launch.get("smem_dynamic")     # None: no launch dims read
            if launch.get("grid"):
                fig["grid"] = launch["grid"]
        return {"entries": figures}


def _tpu_figures(executable) -> dict:
    try:
        entries: dict[str, dict] = {}
        for hm in executable.hlo_modules():
            entries.update(parse_mosaic_vmem(hm.to_string()))
    except Exception as e:  # noqa: BLE001 - figures never fail a compile: recorded as unavailable
        return {"unavailable": f"could not read the compiled HLO: {type(e).__name__}: {e}"}
    return {"entries": entries}


def _matching(name: str, entries: dict) -> list[str]:
    """Compiled entries of the kernel named ``name`` (a region may launch several Pallas
    kernels, named ``name_stats``, ``name_dkv``, ...; XLA may add ``.N``)."""
    if not name:
        return []
    return sorted(n for n in entries if n == name or n.startswith((name + "_", name + ".")))


def kernel_resources(k: KernelResult, chip, own: dict | None, program: dict | None) -> dict | None:
    """The resource figures of kernel ``k`` for ``chip`` from the compile of the kernel alone
    (``own``) or else of its whole program (``program``), as the worker reported them; with
    occupancy bounds (GPU) and the VMEM limits (TPU). None when neither compile ran."""
    c = chip if isinstance(chip, _chips.Chip) else _chips.get(chip)
    for src in (own, program):
        if src and _matching(k.name, src.get("entries") or {}):
            break
    else:
        src = own or program
        if not src:
            return None
        if src.get("unavailable"):
            return {"unavailable": src["unavailable"]}
        # the compile ran and was read, but XLA emitted no such kernel (e.g. one inside a
        # composite's decomposition that XLA lowers itself): it does not run in this program
        return {"unavailable": f"the {c.name} compile emitted no kernel named {k.name or k.func} "
                               f"(XLA dropped or replaced it; compile it alone, per_kernel=True, "
                               f"for its figures)", "absent": True}
    entries = []
    for n in _matching(k.name, src["entries"]):
        e = dict(src["entries"][n], name=n)
        if c.target == "gpu":
            e["smem_bytes"] = e.get("smem_static", 0) + (e.get("smem_dynamic") or 0)
            if e.get("threads"):
                e.update(gpu_occupancy(c, e["registers"], e["threads"], e["smem_bytes"]))
            else:
                e.update(occupancy=None, blocks_per_sm=None, limiter=None)
        else:
            e.update(vmem_limit=c.scoped_vmem_bytes, vmem_capacity=c.vmem_capacity_bytes,
                     vmem_fraction=e["vmem_bytes"] / c.scoped_vmem_bytes if c.scoped_vmem_bytes else 0.0)
        entries.append(e)
    source = ("ptxas -v (XLA's own run) and XLA's thunk launch dims" if c.target == "gpu" else
              "Mosaic's scoped VMEM as compiled by XLA:TPU (used_scoped_memory_configs)")
    return {"target": c.target, "source": source, "entries": entries}


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
    return config.get(PYTHON_ENV) or sys.executable


def check_modules(items: Sequence[tuple[str, ir.Module, object]], chip: str, *,
                  per_kernel: bool = False, timeout: float = 1800) -> list[ChipResult]:
    """Compile optimized modules for ``chip`` in one worker process (restarted after a crash).

    ``items``: (label, module, report or None). Each program is compiled whole; when that fails
    (or with ``per_kernel``), each of its kernels is compiled alone to say which one fails and
    why. Returns one :class:`ChipResult` per item, in order.
    """
    chip = _chips.get(chip).name
    work = [_Item(label, hir.to_bytecode(executable_module(m)), kernels_of(m, rep))
            for label, m, rep in items]
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
            own = None
            if str(j) in kres:
                kr = kres[str(j)]
                k.ok, k.error, k.seconds = kr["ok"], kr.get("error"), kr.get("seconds")
                k.judged = True
                own = kr.get("resources")
            else:   # not compiled alone: the whole program compiled (or could not be tried)
                k.ok = k.judged = res.ok
                k.error = None if res.ok else (res.error or "not compiled")
            if k.ok:
                k.resources = kernel_resources(k, chip, own, r.get("resources") if res.ok else None)
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
            proc = subprocess.run([_python(), "-m", "hlofuse.runtime.aot", "--worker", chip, jpath, progress],
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

    # resource figures: XLA's ptxas run with -v (gpu), the compiled HLO's scoped VMEM (tpu)
    probe_dir = tempfile.mkdtemp(prefix="res-", dir=os.path.dirname(os.path.abspath(jobs_path)))
    probe = _PtxasProbe(probe_dir) if chip.target == "gpu" else None

    def figures(executable) -> dict:
        try:
            return probe.collect() if probe is not None else _tpu_figures(executable)
        except Exception as e:  # noqa: BLE001 - figures never fail a compile: recorded as unavailable
            return {"unavailable": f"{type(e).__name__}: {e}"}

    def compile_one(path: str) -> tuple[bool, str | None, float, dict | None]:
        with open(path, "rb") as fh:
            data = fh.read()
        t0 = time.perf_counter()
        # Triton's MLIR diagnostics go to the native stderr, not into the exception: keep them
        with tempfile.TemporaryFile() as cap:
            saved = os.dup(2)
            os.dup2(cap.fileno(), 2)
            try:
                module = ir.Module.parse(data, context=ctx)
                options = jeb.get_compile_options(num_replicas=1, num_partitions=1)
                if probe is not None:
                    probe.configure(options)
                executable = client.compile(module, devices, options)
                secs = time.perf_counter() - t0
                return True, None, secs, figures(executable)
            except Exception as e:  # noqa: BLE001 - the compiler's verdict on this kernel: recorded
                secs = time.perf_counter() - t0
                os.dup2(saved, 2)
                cap.seek(0)
                diag = [l.split("error:", 1)[1].strip() for l in cap.read().decode("utf-8", "replace").splitlines()
                        if "error:" in l and "\\x" not in l]
                msg = compiler_message(e)
                if diag and diag[0] not in msg:
                    msg = compiler_message(Exception(diag[0] + "\n" + str(e)))
                return False, msg, secs, None
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
            ok, err, secs, figs = compile_one(job["program"])
            res.update(ok=ok, error=err, seconds=secs, resources=figs)
        else:
            res.update(ok=False, error="compiler crashed on the whole program", seconds=0.0)
        if job.get("per_kernel") or not res["ok"]:
            for j, kp in enumerate(job["kernels"]):
                if j in job.get("skip_kernels", []):
                    continue
                mark(job["id"], j)
                ok, err, secs, figs = compile_one(kp)
                res["kernels"][str(j)] = {"ok": ok, "error": err, "seconds": secs, "resources": figs}
        print(json.dumps(res), flush=True)
    if os.path.exists(progress_path):
        os.unlink(progress_path)
    import shutil
    shutil.rmtree(probe_dir, ignore_errors=True)
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
    # every kernel hlofuse may run on the chip (hlofuse.jit builds them all to measure them
    # there; optimize() alone leaves the unmeasured ones XLA fuses itself with XLA), unless
    # the caller's options say otherwise
    opts["kernelize"] = {"unmeasured": "kernel", **dict(opts.get("kernelize") or {})}
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
            if region.id in kernel_funcs(opt.module):
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
      chips: a chip name or several ('h100', 'a100', 'v5e', 'v4', 'v6e'; see hlofuse.core.chips).
      optimize: None: optimize (with :func:`optimize_for`) unless the program already holds
        hlofuse kernels; True/False to force.
      per_kernel: compile every kernel alone too (per-kernel compile times); otherwise kernels
        are compiled alone only when the program fails, to say which one fails and why.

    Returns:
      One :class:`ChipResult` for a single chip name, else ``{chip: ChipResult}``. Each compiled
      kernel carries the compiler's resource figures (:attr:`KernelResult.resources`: ptxas
      registers, spills, shared memory and occupancy bound per Triton launch; scoped VMEM per
      Mosaic kernel), from the whole program's compile (or the kernel's own, ``per_kernel``).
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
    print("usage: python -m hlofuse.runtime.aot --worker CHIP JOBS.json PROGRESS", file=sys.stderr)
    sys.exit(2)
