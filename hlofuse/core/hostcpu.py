"""The host CPU, for the cpu passes that choose between exact forms of one product.

XLA:CPU compiles for the machine it runs on, and its library (YNNPACK) picks each dot's
instructions from that machine's features, so which of two bit-identical forms of a product
runs faster depends on the CPU. Two cpu choices read it from here:

* **int8 x int8 dots** (``int8-dot-unsigned``). x86 VNNI instructions (``vpdpbusd``: AVX512-VNNI,
  AVX-VNNI) multiply an *unsigned* 8-bit operand by a signed one, so on such CPUs the u8 x s8
  form of a signed dot runs 2.2-2.7x faster (2-core Zen 4). CPUs that multiply signed x signed
  int8 themselves run the program's dot fastest as written: AMX-INT8 (Sapphire Rapids and
  later: 256x1024 @ 1024x4096 took 1.36 ms as s8 x s8, 2.11 ms as u8 x s8 on a 2-core
  Sapphire Rapids), AVX-VNNI-INT8 (``vpdpbssd``), and Arm (``sdot``, where the shift would
  only cost). :func:`int8_signed_native` names the feature, or None.
* **matrix-vector products computed as small matrix products** (``int8-dot-unsigned``,
  ``dot-f32-accumulate``): XLA:CPU runs an int8 or bf16 vector x matrix dot in a slow loop, a
  product of a few rows in its library GEMM. With AMX tiles 8 rows are fastest (1x4096 @
  4096x4096 int8: 15.8 ms as a vector, 4.9 ms as 2 rows, 1.9 ms as 8; bf16 1x1024 @ 1024x32000:
  29.9, 9.6, 6.7 ms), elsewhere 2 rows (measured on Zen 4). :func:`gemv_rows`.

* **cache sizes** (:func:`l2_per_core`, :func:`caches`): the cpu attention kernels size their
  per-step logits blocks from the L2 cache of one core (``kernels/attention/blocks.py``): a
  block that is a few times the L2 streams through it five times per step, and a larger one
  spills to L3 (and to DRAM when other processes share it). Read from Linux's
  ``/sys/devices/system/cpu/cpu0/cache``; where that is absent, :data:`DEFAULT_L2` (the
  reference host's 2 MiB).
* **vector width** (:func:`vector_bits`): 512 with AVX-512F, 256 with AVX2, 128 otherwise
  (SSE, NEON): reported and in the cache key, for the choices that depend on it.

The features come from ``/proc/cpuinfo`` (Linux; elsewhere only the architecture is known,
and the choices are those of a CPU without the features above), read once per process; so
does the model name that keys autotune's measured decisions (:func:`model`).
:func:`profile` is the short text of the features that matter, part of the optimized-module
cache key: a cache shared between machines never hands one CPU's choice to another.
"""

from __future__ import annotations

import functools
import os
import platform as _platform

__all__ = ["arch", "flags", "model", "int8_signed_native", "gemv_rows", "check_rows", "rows_option",
           "caches", "l2_per_core", "vector_bits", "profile", "DEFAULT_L2"]

#: flags whose presence changes a choice above (also what :func:`profile` shows)
RELEVANT = ("amx_int8", "amx_bf16", "amx_tile", "avx_vnni_int8", "avx512_vnni", "avx_vnni",
            "avx512_bf16")


@functools.cache
def arch() -> str:
    """``x86_64``, ``aarch64`` (``arm64`` too), or what the platform says."""
    m = _platform.machine().lower()
    return {"amd64": "x86_64", "x64": "x86_64", "arm64": "aarch64"}.get(m, m)


def _cpuinfo(keys: tuple) -> str | None:
    """The value of the first ``/proc/cpuinfo`` line whose key is one of ``keys``, or None
    (no such line, or no ``/proc/cpuinfo``)."""
    try:
        with open("/proc/cpuinfo") as fh:
            for line in fh:
                key, _, value = line.partition(":")
                if key.strip() in keys:
                    return value.strip()
    except OSError:
        pass
    return None


@functools.cache
def flags() -> frozenset:
    """The CPU's feature flags (``flags`` on x86, ``Features`` on Arm), empty when unknown."""
    return frozenset((_cpuinfo(("flags", "Features")) or "").split())


@functools.cache
def model() -> str:
    """The CPU's model name (part of the measured decisions' device key), or what the
    platform says."""
    return _cpuinfo(("model name",)) or _platform.processor() or _platform.machine()


def int8_signed_native() -> str | None:
    """The feature with which this CPU multiplies signed x signed int8 itself (``amx_int8``,
    ``avx_vnni_int8``, or ``aarch64``), or None (x86 without them: the u8 x s8 form is
    the fast one)."""
    if arch() == "aarch64":
        return "aarch64"
    if arch() != "x86_64":
        return None
    for f in ("amx_int8", "avx_vnni_int8"):
        if f in flags():
            return f
    return None


def gemv_rows() -> int:
    """Rows of the matrix product a large matrix-vector dot is computed as: 8 with AMX tiles,
    else 2."""
    return 8 if "amx_tile" in flags() else 2


def check_rows(value: int, name: str = "gemv_rows") -> None:
    """Check a pass's rows option ``name`` (from its options' ``__post_init__``): 0 for
    :func:`gemv_rows`, else at least 2 (one row would be the matrix-vector dot again)."""
    if value != 0 and value < 2:
        raise ValueError(f"option {name!r} must be 0 (this CPU's best: {gemv_rows()}) or at "
                         f"least 2, got {value}")


def rows_option(value: int) -> int:
    """The rows a checked ``gemv_rows`` option means."""
    return value or gemv_rows()


#: the L2 bytes per core assumed where the caches cannot be read: the reference host's
#: (the 2-core Sapphire Rapids on which the cpu attention budgets were first measured)
DEFAULT_L2 = 2 << 20
CACHE_DIR = "/sys/devices/system/cpu/cpu0/cache"


def _size(text: str) -> int | None:
    """``32K`` / ``1024K`` / ``32M`` / ``65536`` (sysfs's cache sizes) in bytes, None if not one."""
    text = text.strip().upper()
    mult = {"K": 1 << 10, "M": 1 << 20, "G": 1 << 30}.get(text[-1:], 1)
    digits = text[:-1] if text[-1:] in "KMG" else text
    return int(digits) * mult if digits.isdigit() else None


@functools.cache
def caches() -> dict:
    """``{(level, type): bytes}`` of the caches of CPU 0 (``(1, "Data")``, ``(2, "Unified")``,
    ``(3, "Unified")``...), from sysfs; empty where it cannot be read."""
    out = {}
    try:
        entries = sorted(e for e in os.listdir(CACHE_DIR) if e.startswith("index"))
    except OSError:
        return out
    for e in entries:
        try:
            with open(os.path.join(CACHE_DIR, e, "level")) as fh:
                level = int(fh.read())
            with open(os.path.join(CACHE_DIR, e, "type")) as fh:
                kind = fh.read().strip()
            with open(os.path.join(CACHE_DIR, e, "size")) as fh:
                size = _size(fh.read())
        except (OSError, ValueError):
            continue
        if size:
            out[(level, kind)] = size
    return out


def l2_per_core() -> int:
    """Bytes of the L2 cache of one core (a private L2 on current x86 and Arm server cores),
    :data:`DEFAULT_L2` when unknown."""
    c = caches()
    return c.get((2, "Unified")) or c.get((2, "Data")) or DEFAULT_L2


def vector_bits() -> int:
    """The widest vector registers: 512 (AVX-512F), 256 (AVX2), else 128 (SSE, NEON...)."""
    if "avx512f" in flags():
        return 512
    if "avx2" in flags():
        return 256
    return 128


def profile() -> str:
    """``<arch> l2=<KiB>k v<bits> <relevant flags...>``: what the cpu choices of this module and
    of the kernels that read it depend on (part of the optimized-module cache key)."""
    return " ".join([arch(), f"l2={l2_per_core() >> 10}k", f"v{vector_bits()}",
                     *sorted(f for f in RELEVANT if f in flags())])
