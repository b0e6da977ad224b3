"""Serialized StableHLO on disk: detect, load, optimize, save and run files of every format.

Formats (detected by content, see :func:`hlofuse.ir.detect_format`; the extension only picks the
output format of ``hlofuse export``):

========== ======================================== ==========================================
format     what it is                               written as
========== ======================================== ==========================================
text       ``.mlir`` StableHLO assembly              text, with source locations
bytecode   plain MLIR bytecode (``ML\\xefR``)         MLIR bytecode (same producer version)
portable   StableHLO portable artifact (VHLO)        portable artifact at ``target_version``
exported   ``jax.export`` ``Exported.serialize()``   the same Exported, payload replaced by the
                                                    optimized module (a portable artifact)
========== ======================================== ==========================================

Everything here raises :class:`FileError` (an :class:`~hlofuse.ir.IRError`) with a one-line
message naming the file, op or argument; the command line prints it and exits with code 2.
Outputs are written atomically (temporary file in the target directory + ``os.replace``), and an
input is never overwritten unless the caller says so (``in_place``).

Crash safety: corrupt MLIR bytecode can abort the process inside the parser, so binary inputs
are first parsed in a subprocess (:func:`hlofuse.ir.probe_parse`) unless ``probe=False`` (the
command line runs its work in a supervised child process and skips the probe); text nested too
deeply for the parser's stack is refused (:func:`hlofuse.ir.guard_parse`). Modules with Python
host callbacks are refused on loading and never executed (they segfault outside the process that
traced them). A damaged ``jax.export`` artifact is named as one (flatbuffer header or extension),
not reported as a text parse error.
"""

from __future__ import annotations

import contextlib
import dataclasses
import os
import re
import sys
import tempfile
from typing import Sequence

import numpy as np

from jaxlib.mlir import ir

from hlofuse import ir as hir
from hlofuse.report import Report

__all__ = [
    "FORMATS", "FileError", "Loaded", "ArgSpec", "OptimizeResult", "read_file", "load",
    "load_bytes", "format_for_path", "serialize", "atomic_write", "same_file",
    "parse_arg_specs", "main_arg_types", "input_specs", "refine_shapes", "optimize_loaded",
    "execute", "load_inputs", "save_outputs", "write_report", "report_html",
    "check_target_version", "portable_version",
]

FORMATS = ("text", "bytecode", "portable", "exported")
FORMAT_NAMES = {"text": "StableHLO text", "bytecode": "MLIR bytecode",
                "portable": "StableHLO portable artifact", "exported": "jax.export artifact"}
EXTENSIONS = {".mlir": "text", ".txt": "text", ".mlirbc": "bytecode", ".bc": "bytecode",
              ".vhlo": "portable", ".stablehlo": "portable", ".shlo": "portable",
              ".exported": "exported", ".jax": "exported", ".jaxexport": "exported",
              ".bin": "exported"}
# target -> the jax.export platform a module for that target was exported for
PLATFORM_OF_TARGET = {"cpu": "cpu", "gpu": "cuda", "tpu": "tpu"}
TARGET_OF_PLATFORM = {"cpu": "cpu", "cuda": "gpu", "rocm": "gpu", "tpu": "tpu"}


class FileError(hir.IRError):
    """A user-facing problem with a file, a flag value or a module: one line, names the culprit."""


# ---------------------------------------------------------------------------------------------
# Loading
# ---------------------------------------------------------------------------------------------

@dataclasses.dataclass
class Loaded:
    """A StableHLO module read from a file, with what is needed to write it back alike."""
    module: ir.Module          # lives in its own context (hir.new_context())
    fmt: str                   # one of FORMATS
    source: str                # file name, for messages
    exported: object = None    # jax.export.Exported when fmt == 'exported'
    data: bytes = b""          # the bytes as read
    version: str | None = None  # producer version of a portable artifact (e.g. '1.15.0')

    @property
    def platforms(self) -> tuple[str, ...]:
        return tuple(self.exported.platforms) if self.exported is not None else ()


def read_file(path: str) -> bytes:
    """The bytes of ``path``, or a :class:`FileError` saying why they cannot be read."""
    try:
        with open(path, "rb") as fh:
            data = fh.read()
    except FileNotFoundError:
        raise FileError(f"{path}: no such file") from None
    except IsADirectoryError:
        raise FileError(f"{path}: is a directory, not a StableHLO file") from None
    except PermissionError:
        raise FileError(f"{path}: permission denied") from None
    except OSError as e:
        raise FileError(f"{path}: cannot read: {e.strerror or e}") from None
    if not data.strip():
        raise FileError(f"{path}: empty file")
    return data


def portable_version(data: bytes) -> str | None:
    """The StableHLO version a portable artifact was written for, from its producer string."""
    m = re.match(rb"ML\xefR.StableHLO_v(\d+\.\d+\.\d+)", bytes(data[:40]), re.S)
    return m.group(1).decode() if m else None


def load(path: str, *, probe: bool = True) -> Loaded:
    """Read and parse a StableHLO file of any format (see module docstring). Text keeps the
    file's name in its source locations (``loc("model.mlir":3:7)``)."""
    return load_bytes(read_file(path), source=path, probe=probe, path=path)


def load_bytes(data: bytes, *, source: str = "<input>", probe: bool = True,
               path: str | None = None) -> Loaded:
    """Parse serialized StableHLO (text, bytecode, portable artifact or jax.export artifact).

    Args:
      data: the serialized module.
      source: name used in error messages.
      probe: parse binary formats in a subprocess first (corrupt bytecode can abort the parser).
      path: the file ``data`` was read from; text is then parsed from it, so that source
        locations name the file instead of ``"-"``.
    """
    data = bytes(data)
    fmt = hir.detect_format(data)
    ext = os.path.splitext(source)[1].lower()
    if fmt in ("text", "unknown") and (_flatbuffer_header(data) or (
            ext in (".exported", ".jax", ".jaxexport") and not _looks_like_text(data))):
        raise FileError(f"{source}: truncated or corrupt jax.export artifact ({len(data)} bytes): "
                        f"{_exported_error(data)}")
    if fmt == "unknown":
        raise FileError(f"{source}: not StableHLO: neither MLIR text, MLIR bytecode, a StableHLO "
                        f"portable artifact nor a jax.export artifact")
    exported = None
    payload = data
    if fmt == "exported":
        from jax import export as jexport
        try:
            exported = jexport.deserialize(bytearray(data))
        except Exception as e:  # detect_format succeeded, so this is unexpected; keep it clear
            raise FileError(f"{source}: cannot read jax.export artifact: {_first_line(e)}") from None
        payload = bytes(exported.mlir_module_serialized)
    ctx = hir.new_context()
    portable = hir.detect_format(payload) == "portable"
    try:
        # portable-artifact deserialization prints its diagnostics to the native stderr only
        with _native_stderr(enabled=portable) as native:
            module = None
            if path is not None and fmt == "text":
                module = _parse_text_file(path, payload, ctx, source)
            if module is None:
                module = hir.parse(payload, ctx, source=source, probe=probe)
    except hir.IRError as e:
        msg = _clean_diagnostics(str(e), source)
        detail = [l.split("error:", 1)[1].strip() for l in native.lines if "error:" in l]
        if detail and detail[0] not in msg:
            msg += f" ({detail[0]})"
        raise FileError(msg) from None
    hir.main_func(module, source=source)
    hir.check_no_host_callbacks(module, source=source)
    version = portable_version(payload) if hir.detect_format(payload) == "portable" else None
    return Loaded(module, fmt, source, exported, data, version)


def _parse_text_file(path: str, data: bytes, ctx: ir.Context, source: str) -> ir.Module | None:
    """Parse the text file ``path`` (whose contents are ``data``) with ``ir.Module.parseFile``,
    so locations name the file; None when that fails (:func:`hlofuse.ir.parse` then produces the
    error message) or yields VHLO."""
    hir.guard_parse(data, "text", source=source)  # the parser's crash guard, as in hir.parse
    try:
        with ctx:
            module = ir.Module.parseFile(path)
    except Exception:
        return None
    if any(op.operation.name.startswith("vhlo.") for op in module.body.operations):
        return None
    return module


def describe(loaded: Loaded) -> str:
    """What a loaded file is, for messages: its format, and its dialects unless StableHLO."""
    from hlofuse.api import STABLEHLO_DIALECTS, STRUCTURAL_DIALECTS, module_dialects
    name = FORMAT_NAMES[loaded.fmt]
    found = module_dialects(loaded.module)
    if "mhlo" in found:
        return name.replace("StableHLO", "MHLO") if "StableHLO" in name else f"{name} (MHLO)"
    if STABLEHLO_DIALECTS & set(found) or not set(found) - STRUCTURAL_DIALECTS:
        return name
    what = f"{', '.join(found) or 'no'} ops, no StableHLO"
    return f"MLIR text ({what})" if loaded.fmt == "text" else f"{name} ({what})"


def _looks_like_text(data: bytes) -> bool:
    """MLIR assembly: no NUL bytes, starts like a module, an op, an alias or a comment."""
    head = data[:4096]
    return b"\x00" not in head and head.lstrip().startswith(
        (b"module", b"func.func", b"#", b"!", b"//", b"\"", b"{-#"))


def _flatbuffer_header(data: bytes) -> bool:
    """Whether ``data`` starts like a flatbuffer (what ``Exported.serialize()`` writes and no
    MLIR text or bytecode does): a small, aligned little-endian root offset, then a vtable of
    little-endian 16-bit offsets."""
    import struct
    if len(data) < 8 or data.startswith(hir.MAGIC_BYTECODE):
        return False
    root, vtable_size = struct.unpack_from("<IH", data, 0)
    return root % 4 == 0 and 8 <= root <= 4096 and vtable_size % 2 == 0 and 4 <= vtable_size < 256


def _exported_error(data: bytes) -> str:
    from jax import export as jexport
    try:
        jexport.deserialize(bytearray(data))
    except Exception as e:
        return _first_line(e)[:200]
    return "it does not deserialize"


def format_for_path(path: str, default: str = "exported") -> str:
    """Output format implied by a file name's extension (``default`` when it implies none)."""
    return EXTENSIONS.get(os.path.splitext(path)[1].lower(), default)


# ---------------------------------------------------------------------------------------------
# Saving
# ---------------------------------------------------------------------------------------------

def check_target_version(version: str) -> str:
    """Validate a StableHLO portable-artifact version (``X.Y.Z`` within the supported range)."""
    from jaxlib.mlir.dialects import stablehlo
    if not re.fullmatch(r"\d+\.\d+\.\d+", version or ""):
        raise FileError(f"--target-version: {version!r} is not a version like 1.15.0")
    lo, hi = stablehlo.get_minimum_version(), stablehlo.get_current_version()
    key = lambda v: tuple(int(x) for x in v.split("."))
    if not key(lo) <= key(version) <= key(hi):
        raise FileError(f"--target-version: {version} is outside the supported range {lo} .. {hi}")
    return version


def serialize(module: ir.Module, fmt: str, *, target_version: str | None = None,
              exported=None, target: str | None = None, source: str = "<output>") -> bytes | str:
    """Serialize ``module`` as ``fmt`` (text is returned as ``str``, the rest as ``bytes``).

    For ``exported``, ``exported`` is the original :class:`jax.export.Exported`; its payload is
    replaced by the module (as a portable artifact at ``target_version``) and the result is
    re-serialized, keeping the stored VJPs.
    """
    if fmt not in FORMATS:
        raise FileError(f"--format: unknown format {fmt!r}; expected one of {', '.join(FORMATS)}")
    if fmt == "text":
        return hir.to_text(module, debug_info=True)
    if fmt == "bytecode":
        return hir.to_bytecode(module)
    version = check_target_version(target_version or hir.portable_target_default())
    try:
        artifact = hir.to_portable_artifact(module, version)
    except Exception as e:
        raise FileError(f"{source}: cannot write a StableHLO {version} portable artifact: "
                        f"{_first_line(e)}") from None
    if fmt == "portable":
        return artifact
    if exported is None:
        raise FileError(f"{source}: --format exported needs a jax.export input (the calling "
                        f"convention is not in a plain module); use `hlofuse export` to make one")
    from jax import export as jexport
    checks = tuple(exported.disabled_safety_checks)
    if target == "gpu":
        triton = jexport.DisabledSafetyCheck.custom_call("__gpu$xla.gpu.triton")
        if triton not in checks:
            checks += (triton,)
    exp = dataclasses.replace(exported, mlir_module_serialized=artifact,
                              disabled_safety_checks=checks)
    try:
        return bytes(exp.serialize(vjp_order=_vjp_order(exported)))
    except Exception as e:
        raise FileError(f"{source}: cannot serialize the jax.export artifact: {_first_line(e)}") from None


def _vjp_order(exp, limit: int = 8) -> int:
    """How many levels of VJPs a deserialized Exported carries (kept when re-serializing)."""
    n = 0
    while n < limit and getattr(exp, "_get_vjp", None) is not None:
        try:
            exp = exp.vjp()
        except Exception:
            break
        n += 1
    return n


def same_file(a: str, b: str) -> bool:
    """Whether two paths name the same file (symlinks and hard links included)."""
    try:
        return os.path.samefile(a, b)
    except OSError:
        return os.path.realpath(a) == os.path.realpath(b)


def atomic_write(path: str, data: bytes | str, *, inputs: Sequence[str] = (),
                 in_place: bool = False) -> str:
    """Write ``data`` to ``path`` atomically: a temporary file in the same directory, fsync,
    then ``os.replace``. An interrupted write leaves neither a partial ``path`` nor the temporary.

    Refuses to overwrite any of ``inputs`` unless ``in_place``. Returns the path written (a
    symlink ``path`` is followed, so the link stays a link). File mode: the replaced file's, or
    the default for new files (0666 minus the umask).
    """
    if isinstance(data, str):
        data = data.encode()
    for inp in inputs:
        if os.path.exists(path) and same_file(path, inp) and not in_place:
            raise FileError(f"{path}: refusing to overwrite the input file; pass --in-place to "
                            f"replace it, or -o another file")
    target = os.path.realpath(path)
    directory = os.path.dirname(target) or "."
    if os.path.isdir(target):
        raise FileError(f"{path}: is a directory")
    if not os.path.isdir(directory):
        raise FileError(f"{path}: directory {directory} does not exist")
    try:
        fd, tmp = tempfile.mkstemp(dir=directory, prefix=f".{os.path.basename(target)}.",
                                   suffix=".tmp")
    except OSError as e:
        raise FileError(f"{path}: cannot write in {directory}: {e.strerror or e}") from None
    try:
        with os.fdopen(fd, "wb") as fh:
            fh.write(data)
            fh.flush()
            os.fsync(fh.fileno())
        if os.path.exists(target):
            mode = os.stat(target).st_mode & 0o7777
        else:
            umask = os.umask(0)
            os.umask(umask)
            mode = 0o666 & ~umask
        os.chmod(tmp, mode)
        os.replace(tmp, target)
    except BaseException as e:  # KeyboardInterrupt included: never leave the temporary behind
        try:
            os.unlink(tmp)
        except OSError:
            pass
        if isinstance(e, OSError):
            raise FileError(f"{path}: cannot write: {e.strerror or e}") from None
        raise
    return target


# ---------------------------------------------------------------------------------------------
# Signatures and shapes
# ---------------------------------------------------------------------------------------------

_DTYPE_ALIASES = {
    "f16": "f16", "float16": "f16", "half": "f16", "bf16": "bf16", "bfloat16": "bf16",
    "f32": "f32", "float32": "f32", "float": "f32", "f64": "f64", "float64": "f64",
    "i8": "i8", "int8": "i8", "i16": "i16", "int16": "i16", "i32": "i32", "int32": "i32",
    "i64": "i64", "int64": "i64", "u8": "ui8", "ui8": "ui8", "uint8": "ui8", "u16": "ui16",
    "ui16": "ui16", "uint16": "ui16", "u32": "ui32", "ui32": "ui32", "uint32": "ui32",
    "u64": "ui64", "ui64": "ui64", "uint64": "ui64", "bool": "i1", "pred": "i1", "i1": "i1",
    "c64": "complex<f32>", "complex64": "complex<f32>", "c128": "complex<f64>",
    "complex128": "complex<f64>",
}


@dataclasses.dataclass(frozen=True)
class ArgSpec:
    """One argument type from the command line: ``f32[8,128]``, ``i32[]``, ``f32[b,128]``."""
    shape: tuple            # ints, or str for a symbolic dimension (export only)
    dtype: str              # MLIR element type spelling (f32, bf16, i1, ui8, complex<f32>)

    @property
    def np_dtype(self):
        return hir.np_dtype(self.dtype)

    @property
    def is_static(self) -> bool:
        return all(isinstance(d, int) for d in self.shape)

    def mlir_type(self) -> str:
        return "tensor<" + "".join(f"{d}x" for d in self.shape) + self.dtype + ">"

    def __str__(self) -> str:
        return f"{self.dtype}[{','.join(str(d) for d in self.shape)}]"


def parse_arg_specs(text: str, *, flag: str = "--args") -> list[ArgSpec]:
    """Parse ``'f32[8,128],i32[8],f32[]'`` (dims may be symbolic names for ``export``)."""
    out = []
    text = (text or "").strip()
    if not text:
        return out
    items, depth, cur = [], 0, ""
    for ch in text:
        depth += {"[": 1, "]": -1}.get(ch, 0)
        if ch == "," and depth == 0:
            items.append(cur)
            cur = ""
        else:
            cur += ch
    items.append(cur)
    for item in (i.strip() for i in items):
        m = re.fullmatch(r"([A-Za-z0-9_]+)\s*\[([^\[\]]*)\]", item)
        if not m:
            raise FileError(f"{flag}: cannot parse {item!r}; expected dtype[dims], e.g. f32[8,128]")
        dt = _DTYPE_ALIASES.get(m.group(1).lower())
        if dt is None:
            raise FileError(f"{flag}: unknown dtype {m.group(1)!r} in {item!r}; known: "
                            f"{', '.join(sorted(set(_DTYPE_ALIASES)))}")
        dims = []
        for d in (x.strip() for x in m.group(2).split(",") if x.strip()):
            if re.fullmatch(r"\d+", d):
                dims.append(int(d))
            elif re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*", d):
                dims.append(d)
            else:
                raise FileError(f"{flag}: bad dimension {d!r} in {item!r}")
        out.append(ArgSpec(tuple(dims), dt))
    return out


def main_arg_types(module: ir.Module) -> list[ir.Type]:
    main = hir.main_func(module)
    return list(ir.FunctionType(ir.TypeAttr(main.attributes["function_type"]).value).inputs)


def _main_result_types(module: ir.Module) -> list[ir.Type]:
    main = hir.main_func(module)
    return list(ir.FunctionType(ir.TypeAttr(main.attributes["function_type"]).value).results)


def _is_static_tensor(t: ir.Type) -> bool:
    return hir.tensor_type_info(t) is not None


def dynamic_signature(module: ir.Module) -> str | None:
    """Describe the first dynamic argument/result type of ``main`` (None when all static)."""
    for kind, types in (("argument", main_arg_types(module)), ("result", _main_result_types(module))):
        for i, t in enumerate(types):
            if isinstance(t, ir.RankedTensorType) or "tensor" in str(t):
                if not _is_static_tensor(t):
                    return f"main {kind} {i} has type {t}"
    return None


def _global_constant_args(module: ir.Module) -> list[int]:
    """Indices of main arguments jax fills in itself (platform index, dimension variables)."""
    main = hir.main_func(module)
    if "arg_attrs" not in main.attributes:
        return []
    out = []
    for i, d in enumerate(ir.ArrayAttr(main.attributes["arg_attrs"])):
        if "jax.global_constant" in str(d):
            out.append(i)
    return out


def donated_args(module: ir.Module) -> tuple[int, ...]:
    """Indices of main arguments marked donated (``tf.aliasing_output`` / ``jax.buffer_donor``)."""
    main = hir.main_func(module)
    if "arg_attrs" not in main.attributes:
        return ()
    return tuple(i for i, d in enumerate(ir.ArrayAttr(main.attributes["arg_attrs"]))
                 if "tf.aliasing_output" in str(d) or "jax.buffer_donor" in str(d))


def input_specs(loaded: Loaded) -> list[ArgSpec]:
    """The flat input signature of a loaded file (what ``hlofuse run`` must be given)."""
    if loaded.exported is not None:
        out = []
        for i, a in enumerate(loaded.exported.in_avals):
            shape = tuple(d if isinstance(d, int) else str(d) for d in a.shape)
            out.append(ArgSpec(shape, _mlir_dtype(np.dtype(a.dtype))))
        return out
    module = loaded.module
    if _global_constant_args(module):
        raise FileError(f"{loaded.source}: main takes arguments jax computes itself (platform "
                        f"index / shape-polymorphism dimension); run the jax.export artifact "
                        f"instead, or re-export with one platform and concrete shapes")
    out = []
    for i, t in enumerate(main_arg_types(module)):
        if not isinstance(t, ir.RankedTensorType):
            raise FileError(f"{loaded.source}: main argument {i} has type {t}, which hlofuse run "
                            f"cannot supply (only tensors)")
        rt = ir.RankedTensorType(t)
        shape = tuple(d if not ir.ShapedType.is_dynamic_size(d) else "?" for d in rt.shape)
        out.append(ArgSpec(shape, str(rt.element_type)))
    return out


def _mlir_dtype(dt: np.dtype) -> str:
    names = {"bool": "i1", "int8": "i8", "int16": "i16", "int32": "i32", "int64": "i64",
             "uint8": "ui8", "uint16": "ui16", "uint32": "ui32", "uint64": "ui64",
             "float16": "f16", "bfloat16": "bf16", "float32": "f32", "float64": "f64",
             "complex64": "complex<f32>", "complex128": "complex<f64>",
             "float8_e4m3fn": "f8E4M3FN", "float8_e5m2": "f8E5M2"}
    if dt.name not in names:
        raise FileError(f"unsupported dtype {dt.name}")
    return names[dt.name]


def refine_shapes(loaded: Loaded, specs: Sequence[ArgSpec]) -> None:
    """Give ``main`` the static argument types ``specs`` and propagate them through the module
    (upstream ``stablehlo-refine-arguments`` + jax's ``refine_polymorphic_shapes``)."""
    import jax.extend.mlir as jem
    src = loaded.source
    if loaded.exported is not None:
        raise FileError(f"{src}: --shapes is not supported for jax.export artifacts (their calling "
                        f"convention fixes the shapes); re-export with concrete shapes")
    types = main_arg_types(loaded.module)
    if len(specs) != len(types):
        raise FileError(f"--shapes: {len(specs)} type(s) given but main of {src} takes {len(types)}")
    for i, (s, t) in enumerate(zip(specs, types)):
        if not s.is_static:
            raise FileError(f"--shapes: argument {i} ({s}) must have a static shape")
        info = str(ir.RankedTensorType(t).element_type) if isinstance(t, ir.RankedTensorType) else str(t)
        if info != s.dtype:
            raise FileError(f"--shapes: argument {i} of {src} has element type {info}, not {s.dtype}")
    opt = ",".join(s.mlir_type() for s in specs)
    try:
        with _native_stderr() as native:  # jax's refinement prints its diagnostics natively
            hir.run_upstream_passes(loaded.module,
                                    f"builtin.module(stablehlo-refine-arguments{{types={opt}}})")
            refined = jem.refine_polymorphic_shapes(hir.to_bytecode(loaded.module),
                                                    enable_shape_assertions=True,
                                                    validate_static_shapes=True)
    except Exception as e:
        raise FileError(f"{src}: cannot refine shapes to {', '.join(map(str, specs))}: "
                        f"{_mlir_cause(e, native.lines, src)}") from None
    # produced by jax's serializer from our own module: no subprocess probe needed
    loaded.module = hir.parse(bytes(refined), loaded.module.context, source=src, probe=False)


# ---------------------------------------------------------------------------------------------
# Optimizing
# ---------------------------------------------------------------------------------------------

@dataclasses.dataclass
class OptimizeResult:
    module: ir.Module
    report: Report
    target: str
    changed: bool              # False when the module was passed through unchanged

    @property
    def notes(self) -> list[str]:
        return self.report.notes


def resolve_target(loaded: Loaded, target: str | None) -> str:
    """The optimization target: ``target``, else the exported platform, else jax's backend."""
    from hlofuse.api import normalize_target
    plats = loaded.platforms
    if target is not None:
        target = normalize_target(target)
        if len(plats) == 1 and TARGET_OF_PLATFORM.get(plats[0]) != target:
            raise FileError(f"{loaded.source}: was exported for platform {plats[0]}, but --target is "
                            f"{target}; its kernels could not run there (re-export for "
                            f"{PLATFORM_OF_TARGET[target]})")
        return target
    if len(plats) == 1 and plats[0] in TARGET_OF_PLATFORM:
        return TARGET_OF_PLATFORM[plats[0]]
    return normalize_target(None)


def optimize_loaded(loaded: Loaded, *, target: str | None = None, pipeline=None,
                    disable: Sequence[str] = (), dump_dir: str | None = None,
                    options: dict | None = None,
                    shapes: Sequence[ArgSpec] | None = None) -> OptimizeResult:
    """Optimize a loaded file with :func:`hlofuse.optimize`, or pass it through with a note.

    Passed through unchanged (``changed=False``): modules without StableHLO ops (MHLO raises,
    see :func:`hlofuse.api.check_dialects`), jax.export artifacts for several platforms
    (kernels are per platform) and modules whose ``main`` has dynamic shapes that ``shapes``
    does not refine. The optimized ``main`` of an exported artifact must keep its signature.
    """
    import hlofuse
    from hlofuse.api import check_dialects
    target = resolve_target(loaded, target)
    src = loaded.source
    foreign = check_dialects(loaded.module, source=src)  # raises for MHLO
    if foreign:
        return _passthrough(loaded, target, foreign)
    if len(loaded.platforms) > 1:
        return _passthrough(loaded, target, f"{src} was exported for platforms "
                            f"{', '.join(loaded.platforms)}; hlofuse optimizes single-platform "
                            f"artifacts (kernels are per platform), so it is written unchanged")
    if shapes:
        refine_shapes(loaded, shapes)
    dyn = dynamic_signature(loaded.module)
    if dyn:
        how = ("re-export with concrete shapes" if loaded.exported is not None
               else "refine it with --shapes")
        return _passthrough(loaded, target, f"{src}: {dyn} (dynamic shape); written unchanged; {how}")
    before_sig = (main_arg_types(loaded.module), _main_result_types(loaded.module))
    before_sig = tuple(tuple(str(t) for t in ts) for ts in before_sig)
    opt = hlofuse.optimize(loaded.module, target=target, pipeline=pipeline, disable=disable,
                           dump_dir=dump_dir, options=options, source=src,
                           donated_args=donated_args(loaded.module))
    after_sig = tuple(tuple(str(t) for t in ts)
                      for ts in (main_arg_types(opt.module), _main_result_types(opt.module)))
    if after_sig != before_sig:
        raise FileError(f"{src}: internal: optimization changed the signature of main "
                        f"{before_sig} -> {after_sig}")
    return OptimizeResult(opt.module, opt.report, target, True)


def _passthrough(loaded: Loaded, target: str, note: str) -> OptimizeResult:
    from hlofuse.api import count_main_ops
    report = Report(target=target, source=loaded.source)
    report.ops_before = report.ops_after = count_main_ops(loaded.module)
    report.note(note)
    return OptimizeResult(loaded.module, report, target, False)


# ---------------------------------------------------------------------------------------------
# Running
# ---------------------------------------------------------------------------------------------

def load_inputs(path: str, specs: Sequence[ArgSpec] | None = None) -> list[np.ndarray]:
    """Arrays of an ``.npz`` file, in ``arr_0, arr_1, ...`` order when so named, else file order."""
    try:
        with np.load(path, allow_pickle=False) as z:
            names = list(z.files)
            if all(re.fullmatch(r"arr_\d+", n) for n in names):
                names.sort(key=lambda n: int(n[4:]))
            arrays = [np.asarray(z[n]) for n in names]
    except FileNotFoundError:
        raise FileError(f"{path}: no such file") from None
    except Exception as e:
        raise FileError(f"{path}: not a readable .npz file: {_first_line(e)}") from None
    return arrays


def save_outputs(path: str, outputs: Sequence[np.ndarray], *, inputs: Sequence[str] = ()) -> None:
    """Write outputs as ``.npz`` (``arr_0, arr_1, ...``) atomically."""
    import io
    buf = io.BytesIO()
    np.savez(buf, *[np.asarray(o) for o in outputs])
    atomic_write(path, buf.getvalue(), inputs=inputs)


def check_inputs(specs: Sequence[ArgSpec], arrays: Sequence[np.ndarray], source: str) -> None:
    """XLA only checks byte sizes (an int32 array would be read as f32): check dtype and shape."""
    if len(arrays) != len(specs):
        raise FileError(f"{source}: takes {len(specs)} input(s) "
                        f"({', '.join(map(str, specs)) or 'none'}), got {len(arrays)}")
    for i, (s, a) in enumerate(zip(specs, arrays)):
        want = s.np_dtype
        shape_ok = len(a.shape) == len(s.shape) and all(
            not isinstance(d, int) or d == n for d, n in zip(s.shape, a.shape))
        if a.dtype != want or not shape_ok:
            got = f"{_mlir_dtype(a.dtype) if a.dtype.name in _NP_OK else a.dtype.name}[{','.join(map(str, a.shape))}]"
            raise FileError(f"{source}: input {i} must be {s}, got {got}")


_NP_OK = {"bool", "int8", "int16", "int32", "int64", "uint8", "uint16", "uint32", "uint64",
          "float16", "bfloat16", "float32", "float64", "complex64", "complex128"}


def random_inputs_for(specs: Sequence[ArgSpec], seed: int, source: str) -> list[np.ndarray]:
    from hlofuse.testing import random_inputs
    for i, s in enumerate(specs):
        if not s.is_static:
            raise FileError(f"{source}: input {i} has a dynamic shape ({s}); give --inputs or "
                            f"--shapes")
    avals = [np.empty(s.shape, s.np_dtype) for s in specs]
    return random_inputs(avals, seed)


def execute(loaded: Loaded, inputs: Sequence[np.ndarray]) -> list[np.ndarray]:
    """Run a loaded module through XLA on the default backend; returns the flat outputs.

    jax.export artifacts run through ``Exported.call`` (platform, shape and dtype checks, pytrees,
    tokens); plain modules through ``compile_and_load`` after our own dtype/shape checks.
    """
    import jax
    src = loaded.source
    hir.check_no_host_callbacks(loaded.module, source=src)  # they would segfault (H6)
    specs = input_specs(loaded)
    inputs = [np.asarray(a) for a in inputs]
    check_inputs(specs, inputs, src)
    if loaded.exported is not None:
        exp = loaded.exported
        plat = jax.default_backend()
        plat = {"gpu": "cuda"}.get(plat, plat)
        if plat not in exp.platforms:
            raise FileError(f"{src}: exported for platform(s) {', '.join(exp.platforms)}; this host "
                            f"runs {plat}")
        try:
            args, kwargs = jax.tree_util.tree_unflatten(exp.in_tree, list(inputs))
            outs = exp.call(*args, **kwargs)
            return [np.asarray(o) for o in jax.tree_util.tree_leaves(outs)]
        except Exception as e:
            raise FileError(f"{src}: running the jax.export artifact failed: {_first_line(e)}") from None
    import jax.extend.backend as jeb
    module = loaded.module
    backend = jeb.get_backend()
    devices = backend.local_devices()[:1]
    try:
        exe = backend.compile_and_load(hir.to_bytecode(module), devices,
                                       jeb.get_compile_options(num_replicas=1, num_partitions=1))
    except Exception as e:
        raise FileError(f"{src}: XLA ({backend.platform}) cannot compile the module: "
                        f"{_xla_error_line(e)}") from None
    try:
        args = [jax.device_put(a, devices[0]) for a in inputs]
        res = exe.execute_sharded(args)
        return [np.asarray(a[0]) for a in res.disassemble_into_single_device_arrays()]
    except Exception as e:
        raise FileError(f"{src}: XLA execution failed: {_xla_error_line(e)}") from None


# ---------------------------------------------------------------------------------------------
# Reports
# ---------------------------------------------------------------------------------------------

def report_html(report: Report) -> str:
    """A self-contained HTML page of the fusion plan (same units as the text report)."""
    return report.to_html()


REPORT_FORMATS = {".json": "json", ".md": "md", ".markdown": "md", ".html": "html", ".htm": "html",
                  ".txt": "text"}


def write_report(report: Report, path: str, *, inputs: Sequence[str] = ()) -> None:
    """Write the report as JSON, Markdown, HTML or text, chosen by the file extension."""
    kind = REPORT_FORMATS.get(os.path.splitext(path)[1].lower())
    if kind is None:
        raise FileError(f"--report: {path}: unknown report format; use .json, .md, .html or .txt")
    text = {"json": report.to_json, "md": report.to_markdown, "html": lambda: report_html(report),
            "text": lambda: str(report) + "\n"}[kind]()
    atomic_write(path, text, inputs=inputs)


# ---------------------------------------------------------------------------------------------

class _Captured:
    lines: list = []


@contextlib.contextmanager
def _native_stderr(enabled: bool = True):
    """Capture what native code writes to file descriptor 2 (``.lines`` after the block)."""
    cap = _Captured()
    cap.lines = []
    if not enabled:
        yield cap
        return
    sys.stderr.flush()
    saved = os.dup(2)
    with tempfile.TemporaryFile() as tmp:
        os.dup2(tmp.fileno(), 2)
        try:
            yield cap
        finally:
            os.dup2(saved, 2)
            os.close(saved)
            tmp.seek(0)
            cap.lines = tmp.read().decode("utf-8", "replace").splitlines()


def _clean_diagnostics(msg: str, source: str) -> str:
    """Parser messages name the buffer '-'; name the file, and drop the dialect inventory."""
    msg = msg.replace('"-":', f"{source}:")
    msg = re.sub(r"\s*\|\s*note: [^|]*Available dialects[^|]*", "", msg)
    return msg.replace("Unable to parse module assembly: | error: ", "")


def _mlir_cause(e: BaseException, native_lines: Sequence[str], source: str) -> str:
    """The real cause of a failed MLIR pass pipeline: its first error diagnostic (carried by
    ``MLIRError``, or printed to the native stderr), not the generic 'Failure while executing
    pass pipeline:' headline; with its location when it has one."""
    for d in getattr(e, "error_diagnostics", None) or ():
        loc = str(d.location)
        where = "" if loc in ("loc(unknown)", 'loc("-":0:0)') else \
            f" (at {loc[4:-1].replace(chr(34) + '-' + chr(34), source).replace(chr(34), '')})"
        return f"{d.message}{where}"[:400]
    for line in native_lines:
        if "error:" in line:
            return _clean_diagnostics(line.split("error:", 1)[1].strip(), source)[:400]
    lines = [l.strip() for l in str(e).strip().splitlines() if l.strip()]
    for line in lines:
        if line.startswith("error:"):
            return _clean_diagnostics(line[6:].strip(), source)[:400]
    return _first_line(e)


def _first_line(e: BaseException) -> str:
    lines = [l.strip() for l in str(e).strip().splitlines() if l.strip()]
    return (lines[0] if lines else type(e).__name__)[:400]


def _xla_error_line(e: BaseException) -> str:
    lines = [l.strip() for l in str(e).strip().splitlines() if l.strip()]
    for l in lines:
        if "error" in l.lower() or "not found" in l.lower() or "unimplemented" in l.lower():
            return l[:400]
    return (lines[0] if lines else type(e).__name__)[:400]
