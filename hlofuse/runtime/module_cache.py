"""Persistent cache of optimized modules: a second process skips the pass pipeline.

``hlofuse.jit``'s first call of a signature exports the function, runs the pipeline (for
BERT-sized layers ~3 s on 2 cores, most of it building Pallas kernels) and compiles with XLA.
The optimized module depends only on the exported module, the optimization options and the
code that optimizes, so it is cached on disk, keyed by

* the sha256 of the exported (input) module's bytecode,
* the options: target (kind and chip), pipeline, disabled passes, pass options, ``check``,
  donated arguments, and the learned cost model in force (its fitted constants),
* versions: jax, jaxlib, and a fingerprint of hlofuse's own source files (name, size,
  modification time of every ``.py`` file of ``hlofuse``, ``hlofuse.passes`` and
  ``hlofuse.kernels``: editing hlofuse invalidates everything),
* the host CPU's features that cpu passes choose by (:func:`hlofuse.core.hostcpu.profile`), so a
  cache directory shared between machines never gives one CPU the forms chosen for another.

An entry is one JSON file ``<dir>/modules/<key>.json`` (``$HLOFUSE_CACHE_DIR`` or
``~/.cache/hlofuse``), written atomically (temporary file + rename), holding the module's
bytecode with its sha256, the report and the region functions kernelize replaced (for
``check``/rollback and measured decisions). A file that does not parse, has the wrong key or a
wrong checksum is a miss (one warning) and is rewritten. Cached measured decisions (regions
kept as XLA's code) are applied after loading, like after optimizing, so they never change what
is cached. Warnings the passes emitted while optimizing are not repeated on a hit (their notes
are in the report).

``HLOFUSE_MODULE_CACHE=0`` (or ``off``) turns it off; with ``dump_dir`` set it is bypassed (the
dumps are the point). Hits and misses are counted in :data:`STATS`.

**Traced entries** (``<dir>/traced/<key>.json``) let a second process skip ``jax.export`` as
well: they are keyed *before* export, by the traced function (its jaxpr printed with source
locations and name stacks, every constant's bytes, sub-jaxprs' constants included), the input
signature and shardings, jax's tracing/lowering configuration (``config.trace_context()``), the
platform, and the same options and versions as above; they hold the optimized ``Exported``
(``Exported.serialize()``: calling convention and optimized module) and the report. A jaxpr that
cannot be keyed reliably (a parameter printed as an object address) has no traced entry: the
module cache above still answers after export. Hits count in ``STATS['hits']`` and
``STATS['traced_hits']``; a traced miss falls through to the module cache (which counts the
miss), and writes count in ``STATS['traced_writes']``.
"""

from __future__ import annotations

import base64
import dataclasses
import functools
import hashlib
import json
import os
import warnings

from hlofuse.core import compat
from hlofuse.core import config
from hlofuse.core import hostcpu
from hlofuse.core import ir as hir
from hlofuse.core.report import HlofuseWarning, PassRecord, Region, Report

ENV = "HLOFUSE_MODULE_CACHE"
# 2: kernels keep their regions' originals in the module (hlofuse.passes.kernel_table), no
# longer beside it in the entry; an entry of format 1 is a miss
FORMAT = 2
#: modules larger than this (frozen weights inlined as constants) are not cached: the entry
#: would cost more disk than the passes cost time. Entries are never evicted otherwise (delete
#: the directory to reclaim the space).
MAX_ENTRY_BYTES = 64 << 20
STATS = {"hits": 0, "misses": 0, "writes": 0, "damaged": 0,
         "traced_hits": 0, "traced_writes": 0}


def enabled() -> bool:
    return config.get(ENV)


def directory() -> str:
    return os.path.join(config.get("HLOFUSE_CACHE_DIR"), "modules")


@functools.lru_cache(maxsize=1)
def code_fingerprint() -> str:
    """Versions the optimized module depends on: jax, jaxlib and hlofuse's source files."""
    import jax
    import jaxlib
    h = hashlib.sha256(f"jax-{jax.__version__}|jaxlib-{jaxlib.__version__}".encode())
    for name, path in source_files():
        st = os.stat(path)
        h.update(f"{name}:{st.st_size}:{st.st_mtime_ns}|".encode())
    return h.hexdigest()[:24]


def source_files() -> list[tuple[str, str]]:
    """(name, path) of every Python file of hlofuse, hlofuse.passes and hlofuse.kernels."""
    from hlofuse import kernels, passes
    # the whole package (hlofuse/core/ir.py is two levels down): since the layers became
    # folders this was hlofuse/core alone, and a change to hlofuse/runtime kept old entries
    roots = [("hlofuse", os.path.dirname(os.path.dirname(os.path.abspath(hir.__file__)))),
             ("hlofuse.passes", os.path.dirname(os.path.abspath(passes.__file__))),
             ("hlofuse.kernels", os.path.dirname(os.path.abspath(kernels.__file__)))]
    out = []
    for name, root in roots:
        for dirpath, dirnames, files in sorted(os.walk(root)):
            dirnames.sort()
            for f in sorted(files):
                if f.endswith(".py"):
                    path = os.path.join(dirpath, f)
                    out.append((f"{name}/{os.path.relpath(path, root)}", path))
    return out


def key(module_bytes: bytes, options: dict) -> str | None:
    """The cache key, or None when the options cannot be keyed reliably (an object without a
    stable text form, e.g. a callable in the pass options)."""
    opts = json.dumps(options, sort_keys=True, default=repr)
    if " at 0x" in opts:
        return None
    h = hashlib.sha256()
    h.update(hashlib.sha256(bytes(module_bytes)).digest())
    h.update(opts.encode())
    h.update(code_fingerprint().encode())
    h.update(hostcpu.profile().encode())
    return h.hexdigest()[:40]


def _path(k: str) -> str:
    return os.path.join(directory(), f"{k}.json")


def traced_directory() -> str:
    return os.path.join(os.path.dirname(directory()), "traced")


def _traced_path(k: str) -> str:
    return os.path.join(traced_directory(), f"{k}.json")


def _report_from_dict(d: dict) -> Report:
    names = {f.name for f in dataclasses.fields(Report)}
    rep = Report(**{k: v for k, v in d.items()
                    if k in names and k not in ("regions", "passes")})
    rfields = {f.name for f in dataclasses.fields(Region)}
    rep.regions = [Region(**{k: v for k, v in r.items() if k in rfields}) for r in d["regions"]]
    pfields = {f.name for f in dataclasses.fields(PassRecord)}
    rep.passes = [PassRecord(**{k: v for k, v in p.items() if k in pfields}) for p in d["passes"]]
    return rep


def load(k: str, ctx=None):
    """``(module, report)`` for key ``k``, or None (missing, damaged: one warning)."""
    path = _path(k)
    try:
        with open(path) as fh:
            raw = json.load(fh)
    except FileNotFoundError:
        STATS["misses"] += 1
        return None
    except (OSError, ValueError, RecursionError, UnicodeDecodeError) as e:
        return _damaged(path, e)
    try:
        if not isinstance(raw, dict) or raw.get("format") != FORMAT or raw.get("key") != k:
            raise ValueError("wrong format or key")
        data = base64.b64decode(raw["module"], validate=True)
        if hashlib.sha256(data).hexdigest() != raw["module_sha256"]:
            raise ValueError("module checksum mismatch")
        rep = _report_from_dict(raw["report"])
        # the checksum matches what this cache wrote from a live module: no subprocess probe
        module = hir.parse(data, ctx or hir.new_context(), source=f"module cache {k}", probe=False)
    except Exception as e:  # noqa: BLE001 - cache boundary: any damage is a miss, warned by _damaged
        return _damaged(path, e)
    STATS["hits"] += 1
    return module, rep


_UNUSABLE_WARNED: set = set()


def _unusable(miss: bool = True):
    """A miss because the cache directory (or a folder on its path) is a file: one warning
    per directory and process, not one per entry saying it "will be rewritten" (it cannot
    be)."""
    if miss:
        STATS["misses"] += 1
    root = config.get("HLOFUSE_CACHE_DIR")
    if root not in _UNUSABLE_WARNED:
        _UNUSABLE_WARNED.add(root)
        warnings.warn(f"hlofuse: HLOFUSE_CACHE_DIR={root} is not a directory (or lies under a "
                      f"file), so no module is cached there; point it at a directory",
                      HlofuseWarning, stacklevel=4)
    return None


def _under_a_file(path: str) -> bool:
    """Whether ``path`` or a folder on its way is a file (no directory can be made there)."""
    p = os.path.abspath(path)   # the path setting is expanded in config
    while True:
        if os.path.exists(p):
            return not os.path.isdir(p)
        parent = os.path.dirname(p)
        if parent == p:
            return False
        p = parent


def _damaged(path: str, e: BaseException, miss: bool = True):
    if isinstance(e, NotADirectoryError):
        return _unusable(miss)
    if isinstance(e, PermissionError):
        # not damage: another user's entry, or a folder this process may not read; one
        # warning per folder, not one per entry saying it "will be rewritten" (it cannot be)
        if miss:
            STATS["misses"] += 1
        folder = os.path.dirname(path)
        if folder not in _UNUSABLE_WARNED:
            _UNUSABLE_WARNED.add(folder)
            warnings.warn(f"hlofuse: cannot read the module cache in {folder} "
                          f"({e.strerror or e}); its entries are not used", HlofuseWarning,
                          stacklevel=3)
        return None
    STATS["damaged"] += 1
    if miss:
        STATS["misses"] += 1
    warnings.warn(f"hlofuse: ignoring the damaged module cache entry {path} "
                  f"({type(e).__name__}: {str(e)[:100]}); it will be rewritten", HlofuseWarning,
                  stacklevel=3)
    return None


def store(k: str, module, report: Report) -> None:
    """Write an entry atomically; a failed write (read-only home, full disk) is ignored."""
    from hlofuse.runtime import formats
    data = hir.to_bytecode(module)
    if len(data) > MAX_ENTRY_BYTES:
        return
    payload = {"format": FORMAT, "key": k,
               "module": base64.b64encode(data).decode(),
               "module_sha256": hashlib.sha256(data).hexdigest(),
               "report": report.to_dict()}
    try:
        os.makedirs(directory(), exist_ok=True)
        formats.atomic_write(_path(k), json.dumps(payload, default=str))
        STATS["writes"] += 1
    except (OSError, formats.FileError):
        pass


def has_traced(k: str) -> bool:
    """Whether a traced entry exists for ``k`` (not read: :func:`load_traced` checks it)."""
    return os.path.exists(_traced_path(k))


def load_traced(k: str, ctx=None):
    """``(serialized Exported, module, report)`` for the traced key ``k``, or None (missing:
    silent, the module cache is asked next; damaged: one warning)."""
    path = _traced_path(k)
    try:
        with open(path) as fh:
            raw = json.load(fh)
    except FileNotFoundError:
        return None
    except (OSError, ValueError, RecursionError, UnicodeDecodeError) as e:
        return _damaged(path, e, miss=False)
    try:
        if not isinstance(raw, dict) or raw.get("format") != FORMAT or raw.get("key") != k:
            raise ValueError("wrong format or key")
        data = base64.b64decode(raw["exported"], validate=True)
        if hashlib.sha256(data).hexdigest() != raw["exported_sha256"]:
            raise ValueError("exported checksum mismatch")
        from jax import export as jexport
        exp = jexport.deserialize(bytearray(data))
        rep = _report_from_dict(raw["report"])
        module = hir.parse(exp.mlir_module_serialized, ctx or hir.new_context(),
                           source=f"module cache {k}", probe=False)
    except Exception as e:  # noqa: BLE001 - cache boundary: any damage is a miss, warned by _damaged
        return _damaged(path, e, miss=False)
    STATS["hits"] += 1
    STATS["traced_hits"] += 1
    return exp, module, rep


def store_traced(k: str, exported_bytes: bytes, report: Report) -> None:
    """Write a traced entry atomically (same limits as :func:`store`)."""
    from hlofuse.runtime import formats
    data = bytes(exported_bytes)
    if len(data) > MAX_ENTRY_BYTES:
        return
    payload = {"format": FORMAT, "key": k,
               "exported": base64.b64encode(data).decode(),
               "exported_sha256": hashlib.sha256(data).hexdigest(),
               "report": report.to_dict()}
    try:
        os.makedirs(traced_directory(), exist_ok=True)
        formats.atomic_write(_traced_path(k), json.dumps(payload, default=str))
        STATS["traced_writes"] += 1
    except (OSError, formats.FileError):
        pass


# ---------------------------------------------------------------------------------------------
# jax's persistent compilation cache
# ---------------------------------------------------------------------------------------------
XLA_ENV = "HLOFUSE_XLA_CACHE"
#: compiles shorter than this are not written to jax's cache (jax's own default is 1 s, which
#: leaves out most single-layer programs; a cache entry costs one file write)
XLA_MIN_COMPILE_S = 0.25
_xla_cache_set = False


def enable_xla_cache() -> str | None:
    """Point jax's persistent compilation cache at ``<cache dir>/xla`` so a second process
    skips XLA's compile too, unless the application configured one itself (then theirs is
    used, untouched), the module cache is off, or ``HLOFUSE_XLA_CACHE=0``. Called when an
    ``hlofuse.jit`` function is made; returns the directory in use (None: not ours)."""
    global _xla_cache_set
    if _xla_cache_set:
        return os.path.join(os.path.dirname(directory()), "xla")
    if not enabled() or not config.get(XLA_ENV):
        return None
    import jax
    if jax.config.jax_compilation_cache_dir:
        return None
    root = os.path.dirname(directory())
    if _under_a_file(root):
        _unusable(miss=False)     # jax's cache would warn once per compile there
        return None
    path = os.path.join(root, "xla")
    jax.config.update("jax_compilation_cache_dir", path)
    if jax.config.jax_persistent_cache_min_compile_time_secs > XLA_MIN_COMPILE_S:
        jax.config.update("jax_persistent_cache_min_compile_time_secs", XLA_MIN_COMPILE_S)
    if compat.compilation_cache_decided_off():
        compat.reset_compilation_cache()  # jax decided "no cache" at an earlier compile: decide again
    _xla_cache_set = True
    return path


def cache_every_compile():
    """A context manager under which every XLA compile of this thread is written to jax's
    persistent cache, whatever it took (``hlofuse.jit`` enters it for the call that traces a
    new signature, so the second process also skips compiles under
    :data:`XLA_MIN_COMPILE_S`: a 0.15 s compile is half a small model's first call); None
    when the cache in use is not hlofuse's own (an application's settings stay untouched)."""
    if not _xla_cache_set:
        return None
    return compat.persistent_cache_min_compile_time(0.0)   # this thread only
