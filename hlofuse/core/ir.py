"""Thin helpers over jaxlib's MLIR bindings: parse, print, serialize, walk, def-use, surgery.

This module is the one place in hlofuse that knows the crash hazards of the bindings
(``../shared/reference/jax-0.10.2-facts.md``, H1-H8; H9 found here). Every other module goes through it:

* H1  mutating ``Lowered.compiler_ir()`` poisons JAX's lowering cache: we never take the live
      module; :func:`module_from_jax` always re-parses text into a context of our own.
* H2  ``stablehlo.serialize_portable_artifact`` converts its argument to VHLO in place:
      :func:`to_portable_artifact` uses the non-mutating ``jax.extend.mlir`` entry point.
* H3  erasing an op that still has uses segfaults later: :func:`safe_erase` checks first.
* H5  the reference interpreter aborts the process on unsupported ops: :func:`eval_module`
      runs it in a subprocess.
* H6  modules with Python host callbacks segfault when compiled without them:
      :func:`check_no_host_callbacks` rejects them before they reach a compiler.
* H7  ``FuncOp.arg_attrs`` needs an active context: helpers here always enter one.
* H8  cloning across contexts corrupts the destination: :func:`import_funcs` and
      :func:`clone_into` assert both sides share one context.
* The parser itself: :func:`guard_parse` stands in front of every parse. Corrupt bytecode can
  abort it (probed in a subprocess first, :func:`probe_parse`), and text nested thousands of
  levels deep overflows its stack (refused from a cheap scan, :func:`check_text_nesting`).
* H9  jaxlib 0.10.2's canonicalizer and XLA's constant folder divide integer constants with
      the host's division, which traps on a zero divisor (and on INT_MIN / -1): SIGFPE kills the
      process, e.g. ``7 // (argmax(x) * 0)`` or a frozen divisor holding 0.
      :func:`guard_integer_division` writes each integer divide/remainder whose divisor is not
      a constant known to be safe with XLA's semantics spelled out (x / 0 = -1, all ones
      unsigned; x % 0 = x; x / -1 = -x; x % -1 = 0) around a divisor that is never 0 or -1; it
      runs around each pipeline and before every upstream pass that may fold constants
      (:func:`run_upstream_passes`).
* Child interpreters (the probe, :func:`eval_module`) start with ``python -P``
  (:func:`python_command`): modules in the current directory are never imported.
(H4, the compilation cache keyed on module identity, does not arise: hlofuse never mutates a
``Lowered``; see :mod:`hlofuse.runtime.program` for the re-injection route.)
"""

from __future__ import annotations

import dataclasses
import io
import math
import os
import re
import struct
import subprocess
import tempfile
import tokenize
from typing import Callable, Iterable, Iterator, Sequence

import numpy as np

from jaxlib.mlir import ir
from jaxlib.mlir import passmanager
from jaxlib.mlir.dialects import func as func_d
from jaxlib.mlir.dialects import stablehlo

from hlofuse.core import compat
from hlofuse.core.child import python_command  # noqa: F401  (hlofuse.core.ir.python_command)

__all__ = [
    "IRError", "ops_text", "new_context", "parse", "detect_format", "to_text", "to_bytecode",
    "to_portable_artifact", "clone_module", "main_func", "funcs", "walk", "block_ops",
    "users", "has_uses", "safe_erase", "import_funcs", "run_upstream_passes",
    "inline_all_calls", "tensor_type_info", "check_no_host_callbacks", "op_location",
    "portable_target_default", "MAGIC_BYTECODE",
]

MAGIC_BYTECODE = b"ML\xefR"

#: What ``jax.export.deserialize`` raises on bytes that are not a whole, valid artifact
#: (measured on thousands of truncated and bit-flipped artifacts, tests/test_excepts.py): the
#: flatbuffer reader's ``struct.error``, ``IndexError``, ``TypeError`` (a negative uint32),
#: ``AttributeError`` (an absent table), ``AssertionError`` and ``StopIteration``; the pytree,
#: dtype and effect tables' ``ValueError``/``KeyError``/``NotImplementedError``; a damaged
#: name's ``UnicodeDecodeError``; the symbolic-shape parser's ``ValueError`` and
#: ``tokenize.TokenError``; a self-referencing table's ``RecursionError``.
EXPORTED_ERRORS: tuple[type[BaseException], ...] = (
    struct.error, ValueError, TypeError, LookupError, AttributeError, AssertionError,
    StopIteration, NotImplementedError, RecursionError, ArithmeticError, tokenize.TokenError)

#: What parsing serialized StableHLO raises: the MLIR parser's ``ir.MLIRError``, a portable
#: artifact's ``ValueError`` ("failed to deserialize module"), text that does not encode
#: (``UnicodeEncodeError``), and :data:`EXPORTED_ERRORS` for a ``jax.export`` artifact.
PARSE_ERRORS: tuple[type[BaseException], ...] = (ir.MLIRError,) + EXPORTED_ERRORS

_STABLEHLO_PASSES_REGISTERED = False


class IRError(ValueError):
    """Bad or unsupported IR. The message names the source (file, op, argument)."""


def portable_target_default() -> str:
    """The StableHLO version target ``jax.export`` uses for portable artifacts (WEEK_4)."""
    try:
        return stablehlo.get_version_from_compatibility_requirement(
            stablehlo.StablehloCompatibilityRequirement.WEEK_4)
    except (AttributeError, ValueError):  # older bindings: fall back to the verified value
        return "1.15.0"


def new_context() -> ir.Context:
    """A fresh MLIR context with every dialect JAX emits registered.

    Each optimization gets its own context so nothing is ever shared with JAX's live
    modules (H1) and all modules a rewrite touches live in the same context (H8).
    """
    global _STABLEHLO_PASSES_REGISTERED
    if not _STABLEHLO_PASSES_REGISTERED:
        stablehlo.register_stablehlo_passes()
        _STABLEHLO_PASSES_REGISTERED = True
    ctx = compat.new_ir_context()   # fresh on every jax release (0.12's make_ir_context is not)
    ctx.allow_unregistered_dialects = False
    return ctx


def detect_format(data: str | bytes | bytearray) -> str:
    """Classify serialized StableHLO by content: 'text', 'bytecode', 'portable' or 'exported'.

    'portable' and 'bytecode' share the MLIR bytecode magic; a portable artifact names the
    ``vhlo`` dialect in its producer/dialect section, which plain bytecode of StableHLO does not.
    'exported' is a ``jax.export`` flatbuffer (``Exported.serialize()``).
    """
    if isinstance(data, str):
        return "text"
    data = bytes(data)
    if data.startswith(MAGIC_BYTECODE):
        # the producer string follows the magic and version: "StableHLO_v1.15.0" for portable
        # artifacts (also when truncated), "MLIR..." for plain bytecode
        return "portable" if (b"StableHLO_v" in data[:32] or b"vhlo" in data[:4096]) else "bytecode"
    head = data[:64].lstrip()
    if head.startswith((b"module", b"func.func", b"#", b"//", b"\"builtin.module\"")):
        return "text"
    # flatbuffers: 4-byte root offset, then a vtable; Exported has no fixed magic, so we
    # recognize it by attempting the (safe, Python-level) deserializer.
    try:
        from jax import export as jexport
        jexport.deserialize(bytearray(data))
        return "exported"
    except EXPORTED_ERRORS:
        pass   # not a jax.export artifact
    try:
        data.decode("utf-8")
        return "text"
    except UnicodeDecodeError:
        return "unknown"


# sha1 digests of binary payloads known to parse without crashing: produced by this process
# (to_bytecode / to_portable_artifact) or already parsed cleanly by :func:`probe_parse`.
_SAFE_BINARY: set[bytes] = set()
_BAD_BINARY: dict[bytes, str] = {}  # digest -> why the probe rejected it (not probed twice)


def _digest(data) -> bytes:
    import hashlib
    return hashlib.sha1(bytes(data)).digest()


def parse(data, ctx: ir.Context | None = None, *, source: str = "<input>",
          probe: bool = True) -> ir.Module:
    """Parse StableHLO from text, MLIR bytecode, a portable artifact or an ``ir.Module``.

    An ``ir.Module`` from another context (for instance JAX's own) is re-parsed from its text
    (never cloned across contexts, H8). Raises :class:`IRError` naming ``source`` on failure.
    Input that would crash the parser is refused first (:func:`guard_parse`): text nested too
    deeply, and binary input this process did not produce itself, which is first parsed in a
    subprocess (:func:`probe_parse`, once per payload); ``probe=False`` skips the subprocess for
    input known to be sound.
    """
    ctx = ctx or new_context()
    if isinstance(data, ir.Module):
        if data.context is ctx:
            return data
        data = data.operation.get_asm(enable_debug_info=True)
    fmt = detect_format(data)
    guard_parse(data, fmt, source=source, probe=probe)
    try:
        if fmt == "portable":
            return stablehlo.deserialize_portable_artifact(ctx, bytes(data))
        if fmt == "exported":
            from jax import export as jexport
            exp = jexport.deserialize(bytearray(data))
            return parse(exp.mlir_module_serialized, ctx, source=source, probe=probe)
        if fmt == "unknown":
            raise IRError(f"{source}: not StableHLO (neither MLIR text, MLIR bytecode, a portable "
                          f"artifact nor a jax.export artifact)")
        with ctx:
            mod = ir.Module.parse(data if isinstance(data, str) else bytes(data))
    except IRError:
        raise
    except PARSE_ERRORS as e:  # MLIRError carries the diagnostics; keep them, name the source
        msg = str(e).strip().splitlines()
        if '"quant"' in str(e):  # !quant.uniform types: uniform_quantize/uniform_dequantize
            raise IRError(f"{source}: cannot parse StableHLO: quantized types (!quant.uniform, "
                          "uniform_quantize/uniform_dequantize) need the MLIR quant dialect, which "
                          "jaxlib's bindings do not register; write the quantization as integer math "
                          "(convert to int8, int8 dot_general with an int32 result, scale multiplies), "
                          "which hlofuse fuses (quantize-matmul)") from None
        raise IRError(f"{source}: cannot parse StableHLO: " + " | ".join(m.strip() for m in msg[:6])) from None
    if any(op.operation.name.startswith("vhlo.") for op in mod.body.operations):
        raise IRError(f"{source}: module is in the vhlo dialect; load it as a portable artifact")
    return mod


def to_text(module: ir.Module, *, debug_info: bool = False) -> str:
    return module.operation.get_asm(enable_debug_info=debug_info)


def op_text(op) -> str:
    """``str(op)`` without verifying ``op`` first: the same text, ~20x faster (printing an op
    verifies it and everything it holds each time, which made hashing region bodies op by op
    a visible part of the first call). Only for ops of a module that verified (every pass's
    output does)."""
    return op.get_asm(assume_verified=True)


def _isolated_parent(op):
    """The nearest ``func.func`` (or module) holding ``op``: SSA names restart there."""
    p = as_op(op).parent
    while p is not None and p.name not in ("func.func", "builtin.module"):
        p = p.parent
    return p


def ops_text(ops: Sequence) -> str:
    """``"\n".join(op_text(op) for op in ops)``, the same text, for ops of one function.

    ``op_text`` numbers every SSA value of the whole module again for each op it prints (MLIR
    builds its printing state from the top-level op), so printing a region's ops one by one
    cost O(ops x module): 2-4 ms per op in a training step's module, seconds of a first call.
    Here one ``AsmState`` of the enclosing function names the values once. Falls back to
    ``op_text`` per op when the ops do not share one enclosing function."""
    ops = [as_op(o) for o in ops]
    if not ops:
        return ""
    scope = _isolated_parent(ops[0])
    if scope is None or any(_isolated_parent(o) != scope for o in ops[1:]):
        return "\n".join(op_text(o) for o in ops)
    state = ir.AsmState(scope)
    out = []
    for o in ops:
        buf = io.StringIO()
        o.print(state, file=buf)
        out.append(buf.getvalue())
    return "\n".join(out)


def to_bytecode(module: ir.Module) -> bytes:
    buf = io.BytesIO()
    module.operation.write_bytecode(buf)
    out = buf.getvalue()
    _SAFE_BINARY.add(_digest(out))  # written by us from a live module: parses safely
    return out


def to_portable_artifact(module: ir.Module, target: str | None = None) -> bytes:
    """Serialize to a versioned StableHLO portable artifact without mutating ``module`` (H2)."""
    import jax.extend.mlir as jem
    target = target or portable_target_default()
    out = jem.serialize_portable_artifact(to_bytecode(module), target)
    _SAFE_BINARY.add(_digest(out))
    return out


def clone_module(module: ir.Module, ctx: ir.Context | None = None) -> ir.Module:
    """A deep copy (in ``ctx`` or the module's own context)."""
    ctx = ctx or module.context
    with ctx:
        return ir.Module.parse(to_bytecode(module)) if ctx is module.context else \
            ir.Module.parse(to_text(module, debug_info=True))


# ---------------------------------------------------------------------------------------------
# Navigation
# ---------------------------------------------------------------------------------------------

def funcs(module: ir.Module) -> list:
    return [op for op in module.body.operations if op.operation.name == "func.func"]


def main_func(module: ir.Module, *, source: str = "<input>"):
    for f in funcs(module):
        if ir.StringAttr(f.attributes["sym_name"]).value == "main":
            return f
    raise IRError(f"{source}: module has no 'main' function")


def func_name(f) -> str:
    return ir.StringAttr(f.operation.attributes["sym_name"]).value


def function_type(fn) -> ir.FunctionType:
    """The signature of a ``func.func`` (its ``function_type`` attribute, typed)."""
    op = fn.operation if hasattr(fn, "operation") else fn
    return ir.FunctionType(ir.TypeAttr(op.attributes["function_type"]).value)


def block_ops(block: ir.Block) -> list:
    return [op.operation for op in block.operations]


def as_op(op) -> ir.Operation:
    """The ``ir.Operation`` behind an op view (``stablehlo.AddOp``...) or an Operation."""
    return op.operation if hasattr(op, "operation") else op


def ancestor_in(op, block: ir.Block) -> ir.Operation | None:
    """``op`` itself, or the op of ``block`` that holds it in one of its regions; None when
    ``op`` lies outside ``block``."""
    op = as_op(op)
    while op is not None:
        if op.block == block:
            return op
        parent = op.parent
        op = as_op(parent) if parent is not None else None
    return None


def defining_op(v: ir.Value) -> ir.Operation | None:
    """The op producing ``v``, or None for a block argument."""
    owner = v.owner
    if isinstance(owner, ir.Block):
        return None
    return as_op(owner)


def value_key(v: ir.Value) -> tuple:
    """A hashable identity for a value (``ir.Value`` objects are not uniqued by the bindings)."""
    owner = v.owner
    if isinstance(owner, ir.Block):
        return ("arg", owner, ir.BlockArgument(v).arg_number)
    return ("res", as_op(owner), ir.OpResult(v).result_number)


def clone_mapped(op, mapping: dict):
    """Clone ``op`` at the current insertion point, each operand read through ``mapping``
    (:func:`value_key` -> the value that replaces it; operands not in it are read as they
    are), and record the clone's results there in place of ``op``'s. Returns the clone. The
    one way passes copy ops into a new body (outlining a region, inlining a call, a training
    region's function)."""
    new = op.clone()
    for i, v in enumerate(op.operands):
        k = value_key(v)
        if k in mapping:
            new.operands[i] = mapping[k]
    for r, nr in zip(op.results, new.results):
        mapping[value_key(r)] = nr
    return new


def walk(root, fn: Callable) -> None:
    """Pre-order walk calling ``fn(op)`` for every nested operation (``op`` is an Operation)."""
    def cb(op):
        fn(op.operation if hasattr(op, "operation") else op)
        return ir.WalkResult.ADVANCE
    root.operation.walk(cb, ir.WalkOrder.PRE_ORDER)


def all_ops(root) -> list:
    out = []
    walk(root, out.append)
    return out


def users(value: ir.Value) -> list:
    """The ops using ``value`` (as ``ir.Operation``, once per use)."""
    return [as_op(u.owner) for u in value.uses]


def has_uses(op) -> bool:
    return any(True for r in op.results for _ in r.uses)


def safe_erase(op) -> None:
    """Erase ``op`` only when none of its results has a use (H3: otherwise a later segfault)."""
    op = op.operation if hasattr(op, "operation") else op
    if has_uses(op):
        raise IRError(f"internal: refusing to erase '{op.name}' at {op_location(op)}: "
                      f"its results still have uses")
    op.erase()


def op_location(op) -> str:
    """Short human-readable source location of ``op`` (file:line where known)."""
    op = op.operation if hasattr(op, "operation") else op
    return location_str(op.location)


def location_str(loc) -> str:
    """``file:line`` of the first frame in the user's code (not a library's); see
    :func:`hlofuse.core.report.source_location`."""
    from hlofuse.core.report import source_location
    return source_location(str(loc))


# a file frame of a location's text: "path":line (a FileLineColLoc or FileLineColRange)
_FILE_FRAME = re.compile(r'"([^"]+)":(\d+)')


def user_frame(loc) -> tuple[str, int] | None:
    """``(path, line)`` of the innermost frame of ``loc`` (an MLIR location or its text) in
    the user's own code: not jax's, not a model library's, not hlofuse's own files
    (:func:`hlofuse.core.report.is_library_path`). None when it names no such frame: no file
    at all (``loc(unknown)``, a bare name), only library frames, or only ``"-"`` (the name the
    parser gives text that came without locations). JAX's locations are call-site stacks,
    innermost first, so this is the line of the user's model that made the op."""
    from hlofuse.core.report import is_library_path
    for path, line in _FILE_FRAME.findall(loc if isinstance(loc, str) else str(loc)):
        if path != "-" and not is_library_path(path):
            return path, int(line)
    return None


@dataclasses.dataclass(frozen=True)
class TensorInfo:
    shape: tuple
    dtype: str  # MLIR element type spelling: f32, bf16, i1, i32, ui8, complex<f32>, ...

    @property
    def size(self) -> int:
        return math.prod(self.shape)  # Python ints: np.prod wraps around past 2**63

    @property
    def nbytes(self) -> int:
        return self.size * dtype_bytes(self.dtype)


def tensor_type_info(t: ir.Type) -> TensorInfo | None:
    """Shape and element type of a ranked, static tensor type; None otherwise."""
    if not isinstance(t, ir.RankedTensorType):
        return None
    rt = ir.RankedTensorType(t)
    if not rt.has_static_shape:
        return None
    return TensorInfo(tuple(rt.shape), str(rt.element_type))


_DTYPE_BYTES = {"i1": 1, "i4": 1, "i8": 1, "ui8": 1, "i16": 2, "ui16": 2, "f16": 2, "bf16": 2,
                "i32": 4, "ui32": 4, "f32": 4, "i64": 8, "ui64": 8, "f64": 8,
                "complex<f32>": 8, "complex<f64>": 16}


def dtype_bytes(dt: str) -> int:
    return _DTYPE_BYTES.get(dt, 1 if dt.startswith("f8") else 4)


def np_dtype(dt: str):
    """numpy (ml_dtypes) dtype of an MLIR element type spelling."""
    import ml_dtypes
    table = {"i1": np.bool_, "i8": np.int8, "i16": np.int16, "i32": np.int32, "i64": np.int64,
             "ui8": np.uint8, "ui16": np.uint16, "ui32": np.uint32, "ui64": np.uint64,
             "f16": np.float16, "f32": np.float32, "f64": np.float64,
             "bf16": ml_dtypes.bfloat16, "complex<f32>": np.complex64, "complex<f64>": np.complex128,
             "f8E4M3FN": ml_dtypes.float8_e4m3fn, "f8E5M2": ml_dtypes.float8_e5m2,
             "i4": ml_dtypes.int4, "ui4": ml_dtypes.uint4}
    if dt not in table:
        raise IRError(f"unsupported element type '{dt}'")
    return np.dtype(table[dt])


# ---------------------------------------------------------------------------------------------
# Surgery
# ---------------------------------------------------------------------------------------------

def _check_same_context(a, b, what: str) -> None:
    if a.context is not b.context:
        raise IRError(f"internal: {what} across MLIR contexts (would corrupt the module, H8); "
                      f"re-parse into one context first")


def import_funcs(dst: ir.Module, src: ir.Module, prefix: str) -> dict[str, str]:
    """Clone every function of ``src`` into ``dst`` as private, names prefixed.

    Returns the old→new symbol map. ``jax.*``/``mhlo.*`` argument and result attributes of the
    imported entry are dropped (they describe the source module's public signature).
    """
    _check_same_context(dst, src, "import_funcs")
    src = clone_module(src)  # never mutate the caller's module
    with src.context:
        table = ir.SymbolTable(src.operation)
        names = [func_name(f) for f in funcs(src)]
        mapping = {}
        for n in names:
            new = prefix + n
            ir.SymbolTable.replace_all_symbol_uses(n, new, src.operation)
            ir.SymbolTable.set_symbol_name(table[n], new)
            mapping[n] = new
        dst_table = ir.SymbolTable(dst.operation)
        for f in funcs(src):
            if func_name(f) in dst_table:
                raise IRError(f"internal: symbol {func_name(f)} already exists in destination")
            ir.SymbolTable.set_visibility(f.operation, "private")
            for key in ("arg_attrs", "res_attrs"):
                if key in f.operation.attributes:
                    del f.operation.attributes[key]
            dst.body.append(f.operation.clone())
    return mapping


def inline_all_calls(module: ir.Module, *, keep: Callable | None = None) -> int:
    """Inline every ``func.call`` (jaxlib's ``inline`` pass does not; see facts §2).

    Uses jaxlib's ``inlined_func_call`` (it maps nested-region captures correctly), innermost
    callees first, bounded by the number of call sites. Returns how many calls were inlined.
    ``keep(func_op) -> bool`` marks functions that stay opaque: calls to them are not inlined
    and calls inside them are left alone (hlofuse's kernels and outlined regions).
    """
    count = 0
    with module.context, ir.Location.unknown():
        for _ in range(10_000):
            table = ir.SymbolTable(module.operation)

            def inlinable(op) -> bool:
                return op.name == "func.call" and not (keep is not None and keep(
                    table[ir.FlatSymbolRefAttr(op.attributes["callee"]).value]))

            calls = [op for f in funcs(module) if keep is None or not keep(f)
                     for op in all_ops(f) if inlinable(op)]
            if not calls:
                break
            progressed = False
            for call in calls:
                callee_name = ir.FlatSymbolRefAttr(call.attributes["callee"]).value
                callee = table[callee_name]
                # inline leaves first: skip callees that still contain calls to inline
                if any(inlinable(o) for o in all_ops(callee)):
                    continue
                if len(callee.regions[0].blocks) != 1:
                    continue
                with ir.InsertionPoint(call), call.location:
                    new_vals = compat.inlined_func_call(callee.operation, call.operands)
                for old, new in zip(call.results, new_vals):
                    old.replace_all_uses_with(new)
                safe_erase(call)
                count += 1
                progressed = True
            if not progressed:  # recursive or multi-block callees stay calls; XLA judges them
                break
    return count


#: upstream passes that fold no constants: no H9 guard before a pipeline of only these (the
#: guard walks the whole module, 11 ms at 7600 ops, and the pipeline runs many of them)
_NON_FOLDING_UPSTREAM = frozenset({"cse", "symbol-dce"})


def run_upstream_passes(module: ir.Module, pipeline: str) -> None:
    """Run an upstream MLIR pass pipeline string, e.g. ``'builtin.module(cse,canonicalize)'``
    (integer divisions guarded first when a pass of it may fold constants, H9)."""
    inner = pipeline[pipeline.find("(") + 1:pipeline.rfind(")")]
    if {p.split("{")[0].strip() for p in inner.split(",")} - _NON_FOLDING_UPSTREAM:
        guard_integer_division(module)
    with module.context:
        pm = passmanager.PassManager.parse(pipeline)
        pm.run(module.operation)


def _int_constant(v: ir.Value) -> np.ndarray | None:
    """The values of an integer ``stablehlo.constant`` producing ``v`` (None otherwise)."""
    op = defining_op(v)
    if op is None or op.name != "stablehlo.constant":
        return None
    try:
        dense = ir.DenseIntElementsAttr(op.attributes["value"])
        if dense.is_splat:
            return np.asarray([ir.IntegerAttr(dense.get_splat_value()).value])
        return np.asarray([dense[i] for i in range(len(dense))]) if len(dense) <= 4096 else None
    except (ValueError, TypeError):
        return None


def _is_guarded_divisor(v: ir.Value) -> bool:
    """``select(bad, 1, d)``: the divisor :func:`guard_integer_division` writes."""
    op = defining_op(v)
    if op is None or op.name != "stablehlo.select":
        return False
    one = _int_constant(op.operands[1])
    return one is not None and one.size == 1 and int(one[0]) == 1


def guard_integer_division(module: ir.Module) -> int:
    """H9: rewrite integer ``divide``/``remainder`` ops whose divisor may be 0 (or -1, signed)
    so that no divide ever sees one, with the results XLA defines for them; returns how many
    were rewritten. A divisor that is a constant without 0 and -1, or one already guarded, is
    left as it is (rerunning changes nothing)."""
    todo = []

    def visit(op):
        if op.name not in ("stablehlo.divide", "stablehlo.remainder") or len(op.operands) != 2:
            return
        if tensor_type_info(op.results[0].type) is None:
            return
        t = ir.RankedTensorType(op.results[0].type)
        if not isinstance(t.element_type, ir.IntegerType) or ir.IntegerType(t.element_type).width <= 1:
            return
        d = op.operands[1]
        c = _int_constant(d)
        unsigned = ir.IntegerType(t.element_type).is_unsigned
        if (c is not None and not np.any(c == 0) and (unsigned or not np.any(c == -1))) \
                or _is_guarded_divisor(d):
            return
        if c is None and op.operands[0] == d and compat.xla_simplifies_self_division():
            # x / x and x % x: this XLA simplifies them to 1 and 0 itself, also where x is 0
            # (jax 0.12; 0.10.2's run them: -1 and 0, what the guard writes out). Guarded
            # they gave -1 where jax.jit gives 1 (long fuzz run); written as XLA's constant
            # they are that and leave no division a folder could trap on
            selfs.append(op)
            return
        todo.append(op)

    selfs: list = []
    walk(module, visit)
    with module.context:
        for op in todo:
            _guard_one(op)
        for op in selfs:
            with op.location:
                t = ir.RankedTensorType(op.results[0].type)
                value = 1 if op.name == "stablehlo.divide" else 0
                attr = ir.DenseElementsAttr.get_splat(t, ir.IntegerAttr.get(t.element_type, value))
                c = ir.Operation.create("stablehlo.constant", results=[t], attributes={"value": attr},
                                        loc=op.location, ip=ir.InsertionPoint(op)).results[0]
                op.results[0].replace_all_uses_with(c)
                safe_erase(op)
    return len(todo) + len(selfs)


def _guard_one(op) -> None:
    with op.location:   # types are made with a location in context (jaxlib 0.10.2)
        _guard_one_here(op)


def _guard_one_here(op) -> None:
    t = ir.RankedTensorType(op.results[0].type)
    et = ir.IntegerType(t.element_type)
    unsigned = et.is_unsigned
    i1 = ir.RankedTensorType.get(t.shape, ir.IntegerType.get_signless(1))
    x, d = op.operands[0], op.operands[1]
    ip, loc = ir.InsertionPoint(op), op.location

    def make(name, operands, result, attrs=None):
        return ir.Operation.create(name, results=[result], operands=operands,
                                   attributes=attrs or {}, loc=loc, ip=ip).results[0]

    def splat(value):
        attr = ir.DenseElementsAttr.get_splat(t, ir.IntegerAttr.get(et, value))
        return make("stablehlo.constant", [], t, {"value": attr})

    def eq(a, b):
        return make("stablehlo.compare", [a, b], i1, {
            "comparison_direction": stablehlo.ComparisonDirectionAttr.get("EQ"),
            "compare_type": stablehlo.ComparisonTypeAttr.get("UNSIGNED" if unsigned else "SIGNED")})

    zero, one = splat(0), splat(1)
    is0 = eq(d, zero)
    bad = is0
    if not unsigned:
        minus1 = splat(-1)
        is_m1 = eq(d, minus1)
        bad = make("stablehlo.or", [is0, is_m1], i1)
    safe = make("stablehlo.select", [bad, one, d], t)
    q = make(op.name, [x, safe], t)
    if op.name == "stablehlo.divide":
        if not unsigned:      # x / -1 = -x (INT_MIN wraps to itself)
            q = make("stablehlo.select", [is_m1, make("stablehlo.negate", [x], t), q], t)
        at0 = splat(-1) if unsigned else minus1       # all ones
    else:
        if not unsigned:      # x % -1 = 0
            q = make("stablehlo.select", [is_m1, zero, q], t)
        at0 = x
    r = make("stablehlo.select", [is0, at0, q], t)
    op.results[0].replace_all_uses_with(r)
    safe_erase(op)


def verify(module: ir.Module) -> None:
    try:
        module.operation.verify()
    except ir.MLIRError as e:
        raise IRError("module does not verify: " + " | ".join(str(e).strip().splitlines()[:8])) from None


# ---------------------------------------------------------------------------------------------
# Guards for things that crash the process
# ---------------------------------------------------------------------------------------------

# hlofuse.jit's stand-in for a host callback while its module is exported and optimized
# (hlofuse/runtime/host_callbacks.py): only the process that exported it can put the callback back
HOST_CALLBACK_PLACEHOLDER = "hlofuse.host_callback"

# custom_call targets of Python host callbacks (jax.pure_callback, io_callback, debug.print,
# buffer_callback): their backend_config holds an index into (or a pointer to) the callbacks of
# the process that traced them, so outside that process they segfault (H6)
HOST_CALLBACK_TARGETS = ("xla_ffi_python_cpu_callback", "xla_ffi_python_gpu_callback",
                         "xla_ffi_partitioned_python_cpu_callback",
                         "xla_ffi_partitioned_python_gpu_callback",
                         "xla_python_cpu_callback", "xla_python_gpu_callback",
                         "xla_buffer_python_cpu_callback", "xla_buffer_python_gpu_callback",
                         HOST_CALLBACK_PLACEHOLDER)


def is_host_callback(target: str) -> bool:
    return target in HOST_CALLBACK_TARGETS or (
        target.startswith("xla_") and "python" in target and target.endswith("_callback"))


def custom_call_targets(module: ir.Module) -> list[str]:
    return [t for t, _ in _custom_calls(module)]


def _custom_calls(module: ir.Module) -> list[tuple[str, object]]:
    out = []
    for op in all_ops(module):
        if op.name in ("stablehlo.custom_call", "mhlo.custom_call"):
            out.append((ir.StringAttr(op.attributes["call_target_name"]).value, op))
    return out


def check_no_host_callbacks(module: ir.Module, *, source: str = "<input>") -> None:
    """Raise instead of compiling, running or shipping a module with Python host callbacks (H6):
    they point into the Python process that traced them (a segfault anywhere else)."""
    bad = [(t, op) for t, op in _custom_calls(module) if is_host_callback(t)]
    if bad:
        target, op = bad[0]
        more = f" (and {len(bad) - 1} more)" if len(bad) > 1 else ""
        where = op_location(op)
        at = f" at {where}" if where not in ("-", "unknown") else ""
        raise IRError(f"{source}: {op.name} @{target}{at}{more} is a Python "
                      f"host callback (jax.pure_callback, io_callback or jax.debug.print); host "
                      f"callbacks call into the process that traced them and cannot be "
                      f"serialized or run offline: remove them before exporting")


def eval_module(module_text: str, inputs: Sequence[np.ndarray], *, timeout: float = 300) -> list[np.ndarray]:
    """Run the StableHLO reference interpreter in a subprocess (it aborts the process on
    unsupported ops, H5). Raises :class:`IRError` when the interpreter fails."""
    with tempfile.TemporaryDirectory() as d:
        mpath = os.path.join(d, "m.mlir")
        with open(mpath, "w") as fh:
            fh.write(module_text)
        np.savez(os.path.join(d, "in.npz"), *inputs)
        code = (
            "import sys, numpy as np\n"
            "from jaxlib.mlir import ir\n"
            "from jaxlib.mlir.dialects import stablehlo\n"
            "from hlofuse.core import ir as hir\n"
            "ctx = hir.new_context()\n"
            "m = hir.parse(open(sys.argv[1]).read(), ctx)\n"
            "z = np.load(sys.argv[2]); ins = [z[f'arr_{i}'] for i in range(len(z.files))]\n"
            "with ctx:\n"
            "    outs = stablehlo.eval_module(m, [ir.DenseElementsAttr.get(a) for a in ins])\n"
            "    np.savez(sys.argv[3], *[np.array(o) for o in outs])\n")
        opath = os.path.join(d, "out.npz")
        argv, env = python_command()
        p = subprocess.run(argv + ["-c", code, mpath, os.path.join(d, "in.npz"), opath],
                           capture_output=True, text=True, timeout=timeout, env=env)
        if p.returncode != 0:
            raise IRError("reference interpreter failed: " + (p.stderr.strip().splitlines() or ["(no output)"])[-1])
        z = np.load(opath)
        return [z[f"arr_{i}"] for i in range(len(z.files))]


def guard_parse(data, fmt: str, *, source: str = "<input>", probe: bool = True) -> None:
    """The crash guard in front of the MLIR parser: raise :class:`IRError` for input that would
    take the process down instead of failing cleanly.

    * Text nested deeper than :data:`MAX_TEXT_NESTING` (``[`` * 20000 in a constant) overflows
      the recursive-descent parser's stack (a segfault): refused from a cheap scan, always.
    * Binary input (MLIR bytecode, portable artifacts) this process did not write itself is
      parsed once in a subprocess first (:func:`probe_parse`, unless ``probe=False``); its
      verdict is remembered per payload, but only a verdict on the bytes (a parse error, a
      parser crash), never a failure of the probe itself.
    """
    if fmt == "text":
        check_text_nesting(data, source=source)
        return
    if fmt not in ("bytecode", "portable") or not probe:
        return
    digest = _digest(data)
    if digest in _SAFE_BINARY:
        return
    if digest in _BAD_BINARY:
        raise IRError(f"{source}: {_BAD_BINARY[digest]}")
    probe_parse(bytes(data), source=source)


# The parser recurses once per nesting level; 10,000 levels crash it on an 8 MiB stack (3,000 do
# not). Real StableHLO nests a few dozen levels (regions, tensor literals of rank r: r + 1).
MAX_TEXT_NESTING = 1000
_STRING_LITERAL = re.compile(rb'"(?:[^"\\\n]|\\.)*"')
_NEST_DELTA = np.zeros(256, np.int8)
_NEST_DELTA[[ord(c) for c in "([{<"]] = 1
_NEST_DELTA[[ord(c) for c in ")]}>"]] = -1


def check_text_nesting(text, *, source: str = "<input>", limit: int = MAX_TEXT_NESTING) -> None:
    """Raise :class:`IRError` when brackets, braces, parentheses or angle brackets outside
    string literals nest deeper than ``limit`` in MLIR text (``->`` is no bracket)."""
    data = text.encode("utf-8", "replace") if isinstance(text, str) else bytes(text)
    opening = sum(data.count(c) for c in (b"(", b"[", b"{", b"<"))
    if opening <= limit:  # cannot nest deeper: skip the scan (almost every module)
        return
    data = _STRING_LITERAL.sub(b'""', data)  # keeps the line count (no raw newlines in strings)
    arr = np.frombuffer(data, np.uint8)
    depth, chunk = 0, 1 << 22
    for start in range(0, len(arr), chunk):
        part = arr[start:start + chunk]
        delta = _NEST_DELTA[part].astype(np.int32)
        prev = np.empty_like(part)
        prev[0] = arr[start - 1] if start else 0
        prev[1:] = part[:-1]
        delta[(part == ord(">")) & (prev == ord("-"))] = 0
        levels = np.cumsum(delta) + depth
        over = np.flatnonzero(levels > limit)
        if over.size:
            line = data.count(b"\n", 0, start + int(over[0])) + 1
            raise IRError(f"{source}: nested more than {limit} levels deep (brackets, braces or "
                          f"parentheses) at line {line}; refusing to parse it: the MLIR parser "
                          f"would overflow its stack and crash the process")
        depth = int(levels[-1]) if levels.size else depth


class ProbeFailed(IRError):
    """The probe subprocess failed for a reason other than the input (an import error, a
    timeout, out of memory): no verdict on the file, and none is remembered."""


def probe_parse(data: bytes, *, source: str = "<input>", timeout: float = 120) -> None:
    """Parse serialized StableHLO in a subprocess first: a corrupt MLIR bytecode stream can abort
    the process inside the parser (``nanobind ... conversion error`` -> ``terminate``), which no
    ``try`` catches. Raises :class:`IRError` naming ``source`` when the parser rejects the bytes
    or dies on them (remembered for the same bytes), :class:`ProbeFailed` when the probe could
    not judge them; when this returns, :func:`parse` of the same bytes is safe in-process
    (parsing is deterministic)."""
    digest = _digest(data)
    with tempfile.TemporaryDirectory(prefix="hlofuse-probe-") as d:
        path = os.path.join(d, "in.bin")
        with open(path, "wb") as fh:
            fh.write(bytes(data))
        code = ("import sys\nfrom hlofuse.core import ir as hir\n"
                "try:\n    hir.parse(open(sys.argv[1], 'rb').read(), source=sys.argv[2], probe=False)\n"
                "except hir.IRError as e:\n    print(e, file=sys.stderr); sys.exit(3)\n")
        argv, env = python_command()
        try:
            p = subprocess.run(argv + ["-c", code, path, source], capture_output=True, env=env,
                               text=True, errors="replace", timeout=timeout)
        except subprocess.TimeoutExpired:
            raise ProbeFailed(f"{source}: parsing did not finish within {timeout:.0f}s") from None
    if p.returncode == 0:
        _SAFE_BINARY.add(digest)
        return
    lines = [l for l in p.stderr.strip().splitlines() if l.strip()]
    if p.returncode == 3 and lines:  # the parser rejected the bytes: a verdict
        why = lines[-1][len(source) + 2:] if lines[-1].startswith(f"{source}: ") else lines[-1]
    elif p.returncode < 0 and p.returncode != -9:  # the parser died on the bytes: a verdict
        why = (f"corrupt MLIR bytecode: the MLIR parser aborted while reading it "
               f"(signal {-p.returncode})")
    else:  # killed (out of memory?) or the probe itself failed: no verdict, nothing remembered
        how = "killed (SIGKILL, out of memory?)" if p.returncode == -9 else \
            f"exit code {p.returncode}: {lines[-1] if lines else 'no output'}"
        raise ProbeFailed(f"{source}: cannot check the file: the parser probe subprocess failed "
                          f"before judging it ({how}); this is a problem of the environment, "
                          f"not a verdict on the file")
    _BAD_BINARY[digest] = why
    raise IRError(f"{source}: {why}")
