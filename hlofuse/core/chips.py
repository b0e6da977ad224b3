"""Chip descriptions: the one place that knows per-chip figures.

Tiling (:mod:`hlofuse.kernels.tiling`), the cost model (:mod:`hlofuse.passes.fusion.cost`) and the
deviceless compile check (:mod:`hlofuse.runtime.aot`) all read a :class:`Chip` from here; no per-chip
constant is written anywhere else.

Sources, so that nothing is typed twice:

* GPUs: the ``GpuTargetConfigProto`` text that ships in ``hlofuse/core/gpu_targets/`` (the same text
  XLA's compiler gets in :mod:`hlofuse.runtime.aot`): shared memory per block (opt-in), registers,
  threads, SM count, FP32 units, clock, HBM bandwidth, compute capability. The tensor-core rate
  is not in that proto; :data:`_GPU_TENSOR_FLOPS` holds it (dense bf16/f16, NVIDIA's data sheets).
* TPUs: JAX's own hardware table (``pltpu.get_tpu_info_for_chip``: VMEM capacity, lanes,
  sublanes, MXU size, HBM bandwidth, bf16/int8 rates) plus :data:`_TPU` below: libtpu's topology
  name and the *default scoped VMEM limit* XLA:TPU enforces on a kernel that does not raise
  ``vmem_limit_bytes`` -- measured with the compile-only topologies of libtpu 0.0.42.1: a
  kernel needing 20 MiB compiles for v6e, not for v5e or v4 (``CompileTimeScopedVmemOom``).

Which chip is in force: an explicit ``chip=`` argument, else the one set by :func:`use` (the
pass manager sets it from the pass option ``chip``, e.g. ``hlofuse.optimize(m, target="gpu",
options={"chip": "a100"})``), else the target's default (:data:`DEFAULT`: h100, v5e).
"""

from __future__ import annotations

import contextlib
import contextvars
import dataclasses
import functools
from importlib import resources

__all__ = ["Chip", "CHIPS", "DEFAULT", "get", "resolve", "use", "current", "parse_textproto"]

DEFAULT = {"gpu": "h100", "tpu": "v5e"}

# name -> (target config file, tensor-core dense bf16/f16 FLOP/s)
_GPU = {
    "h100": ("h100_sxm.txtpb", 989e12),
    "a100": ("a100_sxm_80.txtpb", 312e12),
}
_GPU_LAUNCH_S = 5e-6

# name -> (libtpu topology, jax ChipVersion value, device kind, default scoped VMEM limit)
_TPU = {
    "v5e": ("v5e:1x1", "v5e", "TPU v5 lite", 16 << 20),
    "v4": ("v4:1x1x1", "v4", "TPU v4", 16 << 20),
    "v6e": ("v6e:1x1", "v6e", "TPU v6 lite", 32 << 20),
}
_TPU_LAUNCH_S = 2e-6


@dataclasses.dataclass(frozen=True)
class Chip:
    """What tiling, the cost model and the compile check need to know about one chip."""
    name: str                     # 'h100', 'a100', 'v5e', 'v4', 'v6e'
    target: str                   # 'gpu' | 'tpu'
    title: str                    # human name, e.g. 'NVIDIA H100 80GB HBM3'
    hbm_bytes_per_s: float
    flops_per_s: float            # f32 (GPU: CUDA cores; TPU: MXU multi-pass bf16, a third)
    flops_per_s_lowp: float       # bf16/f16 (tensor cores / MXU)
    launch_s: float
    on_chip_bytes: int            # fast memory one kernel instance may use without opting in
    hbm_capacity_bytes: int = 0   # device memory of one device (GPU; TPU chip or megacore)
    # gpu
    compute_capability: tuple = ()
    smem_per_block: int = 0       # shared memory one block may use (opt-in maximum)
    registers_per_block: int = 0
    threads_per_block: int = 0
    warp_size: int = 32
    target_config: str = ""       # GpuTargetConfigProto text for XLA's compile-only client
    # tpu
    generation: int = 0
    topology: str = ""            # libtpu compile-only topology name
    device_kind: str = ""
    vmem_capacity_bytes: int = 0  # physical VMEM per core
    scoped_vmem_bytes: int = 0    # default scoped VMEM limit per kernel
    lanes: int = 128
    sublanes: int = 8
    mxu: int = 128
    int8_matmul: bool = False

    @property
    def platform(self) -> str:
        return {"gpu": "cuda", "tpu": "tpu"}[self.target]

    def sublane_tile(self, itemsize: int) -> int:
        """TPU second-minor tile for an element size: 8 rows of 32-bit, 16 of 16-bit, 32 of 8."""
        return self.sublanes * max(1, 4 // max(1, itemsize))

    def __str__(self) -> str:
        return self.name


def parse_textproto(text: str) -> dict:
    """A minimal protobuf text-format reader (nested messages, scalars, strings) into dicts."""
    import shlex
    lex = shlex.shlex(text, posix=True)
    lex.wordchars += ".-_"
    lex.commenters = "#"
    stack: list[dict] = [{}]
    toks = list(lex)
    i = 0
    while i < len(toks):
        t = toks[i]
        if t == "}":
            stack.pop()
            i += 1
        elif i + 1 < len(toks) and toks[i + 1] == "{":
            child: dict = {}
            stack[-1][t] = child
            stack.append(child)
            i += 2
        elif i + 2 < len(toks) and toks[i + 1] == ":":
            v = toks[i + 2]
            try:
                val: object = int(v)
            except ValueError:
                try:
                    val = float(v)
                except ValueError:
                    val = v
            stack[-1][t] = val
            i += 3
        else:
            raise ValueError(f"cannot read text proto near {' '.join(toks[i:i + 3])!r}")
    return stack[0]


def gpu_target_config(name: str) -> str:
    """The ``GpuTargetConfigProto`` text shipped for GPU chip ``name``."""
    return (resources.files("hlofuse.core") / "gpu_targets" / _GPU[name][0]).read_text()


def _gpu_chip(name: str) -> Chip:
    text = gpu_target_config(name)
    info = parse_textproto(text)["gpu_device_info"]
    cc = info.get("cuda_compute_capability", {})
    fp32 = info["core_count"] * info["fpus_per_core"] * 2 * info["clock_rate_ghz"] * 1e9
    title = parse_textproto(text).get("device_description_str", name)
    smem = info.get("shared_memory_per_block_optin", info["shared_memory_per_block"])
    return Chip(name, "gpu", title, float(info["memory_bandwidth"]), fp32, _GPU[name][1],
                _GPU_LAUNCH_S, smem, hbm_capacity_bytes=int(info.get("device_memory_size", 0)),
                compute_capability=(cc.get("major", 0), cc.get("minor", 0)),
                smem_per_block=smem, registers_per_block=info["registers_per_block_limit"],
                threads_per_block=info["threads_per_block_limit"],
                warp_size=info["threads_per_warp"], target_config=text)


def _tpu_chip(name: str) -> Chip:
    from jax.experimental.pallas import tpu as pltpu
    topology, version, kind, scoped = _TPU[name]
    cv = pltpu.ChipVersion(version)
    # the compile-only topology gives one device per chip: megacore chips (v4) as one
    # logical device with both TensorCores
    cores = 2 if cv.supports_megacore else 1
    ti = pltpu.get_tpu_info_for_chip(cv, cores)
    bf16 = float(ti.bf16_ops_per_second) * cores
    int8 = pltpu.TpuInfo.is_matmul_supported(ti, "int8", "int8")
    return Chip(name, "tpu", kind, float(ti.mem_bw_bytes_per_second) * cores, bf16 / 3, bf16,
                _TPU_LAUNCH_S, scoped, generation=ti.generation, topology=topology,
                hbm_capacity_bytes=int(getattr(ti, "hbm_capacity_bytes", 0) or 0) * cores,
                device_kind=kind, vmem_capacity_bytes=ti.vmem_capacity_bytes,
                scoped_vmem_bytes=scoped, lanes=ti.num_lanes, sublanes=ti.num_sublanes,
                mxu=ti.mxu_column_size, int8_matmul=bool(int8))


@functools.cache
def get(name: str) -> Chip:
    """The :class:`Chip` called ``name`` (case-insensitive; 'tpu-v5e' and 'v5e' alike)."""
    key = str(name).lower().removeprefix("tpu-").removeprefix("tpu_").removeprefix("nvidia-")
    if key in _GPU:
        return _gpu_chip(key)
    if key in _TPU:
        return _tpu_chip(key)
    raise ValueError(f"unknown chip {name!r}; known chips: {', '.join(CHIPS)}")


CHIPS: tuple[str, ...] = tuple(_GPU) + tuple(_TPU)

_CURRENT: contextvars.ContextVar = contextvars.ContextVar("hlofuse_chip", default=None)


@contextlib.contextmanager
def use(chip):
    """Make ``chip`` (a name or :class:`Chip`; None: no change) the chip in force."""
    if chip is None:
        yield
        return
    c = chip if isinstance(chip, Chip) else get(chip)
    token = _CURRENT.set(c)
    try:
        yield c
    finally:
        _CURRENT.reset(token)


def current() -> Chip | None:
    return _CURRENT.get()


def resolve(target: str, chip=None) -> Chip:
    """The chip for ``target``: ``chip`` if given, else the one in force, else the default."""
    if chip is not None:
        c = chip if isinstance(chip, Chip) else get(chip)
    else:
        c = _CURRENT.get()
        if c is None or c.target != target:
            c = get(DEFAULT[target])
    if c.target != target:
        raise ValueError(f"chip {c.name} is a {c.target} chip, not a {target} one")
    return c
