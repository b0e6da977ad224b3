"""Serialized StableHLO on disk: detect, load and save files of every format; ``.npz`` arrays;
report files.

Formats (detected by content, see :func:`hlofuse.core.ir.detect_format`; the extension only picks the
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

Argument types, shape refinement and running a loaded file are in :mod:`hlofuse.runtime.argspec`;
optimizing one is :func:`hlofuse.runtime.api.optimize_loaded`.

Everything here raises :class:`FileError` (an :class:`~hlofuse.core.ir.IRError`) with a one-line
message naming the file, op or argument; the command line prints it and exits with code 2.
Outputs are written atomically (temporary file in the target directory + ``os.replace``), and an
input is never overwritten unless the caller says so (``in_place``).

Crash safety: corrupt MLIR bytecode can abort the process inside the parser, so binary inputs
are first parsed in a subprocess (:func:`hlofuse.core.ir.probe_parse`) unless ``probe=False`` (the
command line runs its work in a supervised child process and skips the probe); text nested too
deeply for the parser's stack is refused (:func:`hlofuse.core.ir.guard_parse`). Modules with Python
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
import tokenize
import zipfile
import zlib
from typing import Sequence

import numpy as np

from jaxlib.mlir import ir

from hlofuse.core import files
from hlofuse.core import ir as hir
from hlofuse.core.report import Report
from hlofuse.core.target import Target
from hlofuse.core import report_html as html

__all__ = [
    "FORMATS", "FileError", "Loaded", "read_file", "load", "load_bytes", "format_for_path",
    "serialize", "atomic_write", "same_file", "load_inputs", "save_outputs", "write_report",
    "check_target_version", "portable_version", "native_stderr", "mlir_cause", "first_line",
    "xla_error_line",
]

FORMATS = ("text", "bytecode", "portable", "exported")
FORMAT_NAMES = {"text": "StableHLO text", "bytecode": "MLIR bytecode",
                "portable": "StableHLO portable artifact", "exported": "jax.export artifact"}
EXTENSIONS = {".mlir": "text", ".txt": "text", ".mlirbc": "bytecode", ".bc": "bytecode",
              ".vhlo": "portable", ".stablehlo": "portable", ".shlo": "portable",
              ".exported": "exported", ".jax": "exported", ".jaxexport": "exported",
              ".bin": "exported"}


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
        except hir.EXPORTED_ERRORS as e:  # detect_format succeeded: unexpected; keep it clear
            raise FileError(f"{source}: cannot read jax.export artifact: {first_line(e)}") from None
        payload = bytes(exported.mlir_module_serialized)
    ctx = hir.new_context()
    portable = hir.detect_format(payload) == "portable"
    try:
        # portable-artifact deserialization prints its diagnostics to the native stderr only
        with native_stderr(enabled=portable) as native:
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
    so locations name the file; None when that fails (:func:`hlofuse.core.ir.parse` then produces the
    error message) or yields VHLO."""
    hir.guard_parse(data, "text", source=source)  # the parser's crash guard, as in hir.parse
    if not os.path.isfile(path):
        # a pipe, FIFO or /dev/stdin: already read to its end, opening it again reads nothing
        # (or waits for a writer that never comes); hir.parse of the bytes read does it
        return None
    try:
        with ctx:
            module = ir.Module.parseFile(path)
    except (ir.MLIRError, TypeError, ValueError):  # hir.parse of the bytes read says why
        # MLIRError: a parse error, or a file it cannot open; TypeError: a file name that is
        # not UTF-8 (surrogate escapes; the binding takes only encodable str)
        return None
    if any(op.operation.name.startswith("vhlo.") for op in module.body.operations):
        return None
    return module


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
    root = struct.unpack_from("<I", data, 0)[0]
    if not (root % 4 == 0 and 8 <= root <= 4096):
        return False

    def vtable_at(pos: int) -> bool:
        if not 4 <= pos <= len(data) - 4 or pos % 2:
            return False
        size, table = struct.unpack_from("<HH", data, pos)
        return size % 2 == 0 and 4 <= size < 256 and 4 <= table < 65536
    if len(data) >= root + 4:   # the root table's signed offset names its vtable
        return vtable_at(root - struct.unpack_from("<i", data, root)[0])
    # cut before the root table: the vtable follows the root offset, after alignment padding
    # (jax 0.10.2 writes none, 0.12 two bytes)
    return vtable_at(4) or vtable_at(6)


def _exported_error(data: bytes) -> str:
    from jax import export as jexport
    try:
        jexport.deserialize(bytearray(data))
    except hir.EXPORTED_ERRORS as e:
        return first_line(e)[:200]
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
              exported=None, target: Target | str | None = None, source: str = "<output>") -> bytes | str:
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
    except (RuntimeError, ValueError, ir.MLIRError) as e:  # JaxRuntimeError: "Failed to serialize"
        raise FileError(f"{source}: cannot write a StableHLO {version} portable artifact: "
                        f"{first_line(e)}") from None
    if fmt == "portable":
        return artifact
    if exported is None:
        raise FileError(f"{source}: --format exported needs a jax.export input (the calling "
                        f"convention is not in a plain module); use `hlofuse export` to make one")
    from jax import export as jexport
    checks = tuple(exported.disabled_safety_checks)
    if target is not None and Target.of(target).is_gpu:
        triton = jexport.DisabledSafetyCheck.custom_call("__gpu$xla.gpu.triton")
        if triton not in checks:
            checks += (triton,)
    exp = dataclasses.replace(exported, mlir_module_serialized=artifact,
                              disabled_safety_checks=checks)
    try:
        return bytes(exp.serialize(vjp_order=_vjp_order(exported)))
    except hir.EXPORTED_ERRORS as e:  # the serializer's ValueError/TypeError/NotImplementedError,
        # and the stored VJPs' deserialization
        raise FileError(f"{source}: cannot serialize the jax.export artifact: {first_line(e)}") from None


def _vjp_order(exp, limit: int = 8) -> int:
    """How many levels of VJPs a deserialized Exported carries (kept when re-serializing)."""
    n = 0
    while n < limit and getattr(exp, "_get_vjp", None) is not None:
        try:
            exp = exp.vjp()
        except hir.EXPORTED_ERRORS:  # "No VJP is available", or a stored VJP that does not read
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
        files.replace_atomically(target, data)
    except files.TempFileError as e:
        raise FileError(f"{path}: cannot write in {directory}: {e.strerror or e}") from None
    except OSError as e:
        raise FileError(f"{path}: cannot write: {e.strerror or e}") from None
    return target


# ---------------------------------------------------------------------------------------------
# Arrays (.npz)
# ---------------------------------------------------------------------------------------------

#: What ``np.load`` of a file that is not a whole ``.npz`` raises (measured on truncated and
#: bit-flipped archives): ``OSError``, ``EOFError``; ``ValueError`` (pickled data, a bad header);
#: ``TypeError`` (a plain ``.npy``: an array, not an archive); ``zipfile.BadZipFile``,
#: ``zlib.error``; ``RuntimeError`` (an encrypted member, ``NotImplementedError`` for a zip
#: version); ``tokenize.TokenError`` from the header's literal; ``MemoryError`` for a header
#: that claims a huge array; ``KeyError`` for a missing member.
NPZ_ERRORS: tuple[type[BaseException], ...] = (
    OSError, EOFError, ValueError, TypeError, KeyError, RuntimeError, MemoryError,
    zipfile.BadZipFile, zlib.error, tokenize.TokenError)


def load_inputs(path: str, specs: Sequence | None = None) -> list[np.ndarray]:
    """Arrays of an ``.npz`` file, in ``arr_0, arr_1, ...`` order when so named, else file order."""
    try:
        with np.load(path, allow_pickle=False) as z:
            names = list(z.files)
            if all(re.fullmatch(r"arr_\d+", n) for n in names):
                names.sort(key=lambda n: int(n[4:]))
            arrays = [np.asarray(z[n]) for n in names]
    except FileNotFoundError:
        raise FileError(f"{path}: no such file") from None
    except NPZ_ERRORS as e:
        raise FileError(f"{path}: not a readable .npz file: {first_line(e)}") from None
    return arrays


def save_outputs(path: str, outputs: Sequence[np.ndarray], *, inputs: Sequence[str] = ()) -> None:
    """Write outputs as ``.npz`` (``arr_0, arr_1, ...``) atomically."""
    import io
    buf = io.BytesIO()
    np.savez(buf, *[np.asarray(o) for o in outputs])
    atomic_write(path, buf.getvalue(), inputs=inputs)


# ---------------------------------------------------------------------------------------------
# Reports
# ---------------------------------------------------------------------------------------------

REPORT_FORMATS = {".json": "json", ".md": "md", ".markdown": "md", ".html": "html", ".htm": "html",
                  ".txt": "text"}


def write_report(report: Report, path: str, *, inputs: Sequence[str] = ()) -> None:
    """Write the report as JSON, Markdown, HTML or text, chosen by the file extension."""
    kind = REPORT_FORMATS.get(os.path.splitext(path)[1].lower())
    if kind is None:
        raise FileError(f"--report: {path}: unknown report format; use .json, .md, .html or .txt")
    text = {"json": report.to_json, "md": report.to_markdown, "html": lambda: html.render(report),
            "text": lambda: str(report) + "\n"}[kind]()
    atomic_write(path, text, inputs=inputs)


# ---------------------------------------------------------------------------------------------
# Native diagnostics and one-line error messages
# ---------------------------------------------------------------------------------------------

class _Captured:
    lines: list = []


@contextlib.contextmanager
def native_stderr(enabled: bool = True):
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


def mlir_cause(e: BaseException, native_lines: Sequence[str], source: str) -> str:
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
    return first_line(e)


def first_line(e: BaseException) -> str:
    lines = [l.strip() for l in str(e).strip().splitlines() if l.strip()]
    return (lines[0] if lines else type(e).__name__)[:400]


def xla_error_line(e: BaseException) -> str:
    lines = [l.strip() for l in str(e).strip().splitlines() if l.strip()]
    for l in lines:
        if "error" in l.lower() or "not found" in l.lower() or "unimplemented" in l.lower():
            return l[:400]
    return (lines[0] if lines else type(e).__name__)[:400]

