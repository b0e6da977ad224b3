"""Argument types of StableHLO files: parse them, read them from ``main``, refine a dynamic
module to them, and make, check and run inputs that fit them.

``f32[8,128],i32[8],bf16[]`` is the command line's spelling (``--args``, ``--shapes``); a named
dimension (``f32[b,128]``) makes ``hlofuse export`` write a shape-polymorphic function. Errors
are :class:`~hlofuse.runtime.formats.FileError`: one line naming the flag, file or argument.
"""

from __future__ import annotations

import dataclasses
import re
from typing import Sequence

import numpy as np

import jax
import jax.extend as jex
import jax.extend.mlir as jem
from jaxlib.mlir import ir

from hlofuse.core import ir as hir
from hlofuse.runtime.execute import compile_module, run_compiled
from hlofuse.runtime.testing import random_inputs
from hlofuse.runtime.formats import FileError, Loaded, first_line, mlir_cause, native_stderr, \
    xla_error_line

__all__ = ["ArgSpec", "parse_arg_specs", "main_arg_types", "main_result_types",
           "dynamic_signature", "donated_args", "input_specs", "refine_shapes", "check_inputs",
           "random_inputs_for", "execute"]


# ---------------------------------------------------------------------------------------------
# Argument types: from the command line and from main's signature
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
    """The argument types of ``main``."""
    return list(hir.function_type(hir.main_func(module)).inputs)


def main_result_types(module: ir.Module) -> list[ir.Type]:
    """The result types of ``main``."""
    return list(hir.function_type(hir.main_func(module)).results)


def _is_static_tensor(t: ir.Type) -> bool:
    return hir.tensor_type_info(t) is not None


def _is_tuple(t: ir.Type) -> bool:
    return str(t).startswith("tuple<")


def tuple_signature(module: ir.Module) -> str | None:
    """Describe the first tuple-typed argument/result of ``main`` (None when there is none)."""
    for kind, types in (("argument", main_arg_types(module)), ("result", main_result_types(module))):
        for i, t in enumerate(types):
            if _is_tuple(t):
                return f"main {kind} {i} is a tuple ({t})"
    return None


def dynamic_signature(module: ir.Module) -> str | None:
    """Describe the first dynamic argument/result type of ``main`` (None when all static;
    tuples are :func:`tuple_signature`'s)."""
    for kind, types in (("argument", main_arg_types(module)), ("result", main_result_types(module))):
        for i, t in enumerate(types):
            if _is_tuple(t):
                continue
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
        with native_stderr() as native:  # jax's refinement prints its diagnostics natively
            hir.run_upstream_passes(loaded.module,
                                    f"builtin.module(stablehlo-refine-arguments{{types={opt}}})")
            refined = jem.refine_polymorphic_shapes(hir.to_bytecode(loaded.module),
                                                    enable_shape_assertions=True,
                                                    validate_static_shapes=True)
    except (ir.MLIRError, ValueError, RuntimeError) as e:
        # MLIRError: the refinement pass fails (its diagnostics); ValueError: a pipeline that
        # does not parse; JaxRuntimeError (a RuntimeError): jax's refinement refuses the module
        raise FileError(f"{src}: cannot refine shapes to {', '.join(map(str, specs))}: "
                        f"{mlir_cause(e, native.lines, src)}") from None
    # produced by jax's serializer from our own module: no subprocess probe needed
    loaded.module = hir.parse(bytes(refined), loaded.module.context, source=src, probe=False)


# ---------------------------------------------------------------------------------------------
# Inputs, and running a loaded file on them
# ---------------------------------------------------------------------------------------------

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


def random_inputs_for(specs: Sequence[ArgSpec], seed: int, loaded: Loaded) -> list[np.ndarray]:
    """Random inputs of static ``specs`` of ``loaded``; a dynamic shape is an error suggesting
    ``--inputs``, and ``--shapes`` too unless ``loaded`` is a jax.export artifact (whose shapes
    it cannot refine)."""
    for i, s in enumerate(specs):
        if not s.is_static:
            how = "give --inputs" if loaded.exported is not None else "give --inputs or --shapes"
            raise FileError(f"{loaded.source}: input {i} has a dynamic shape ({s}); {how}")
    avals = [np.empty(s.shape, s.np_dtype) for s in specs]
    return random_inputs(avals, seed)


#: element types that exist in jax only in its 64-bit mode (``jax_enable_x64``)
X64_DTYPES = frozenset({"float64", "int64", "uint64", "complex128"})


def execute(loaded: Loaded, inputs: Sequence[np.ndarray]) -> list[np.ndarray]:
    """Run a loaded file through XLA on the default backend; returns the flat outputs.

    jax.export artifacts run through ``Exported.call`` (platform, shape and dtype checks, pytrees,
    tokens); plain modules through :mod:`hlofuse.runtime.execute` after our own dtype/shape checks.
    Both in jax's 64-bit mode: the file's types are explicit, and without it jax would hand a
    ``f64``/``i64`` input to XLA as 32 bits (a size mismatch, or ``Exported.call``'s dtype
    check).
    """
    with jax.enable_x64(True):
        return _execute(loaded, inputs)


def _execute(loaded: Loaded, inputs: Sequence[np.ndarray]) -> list[np.ndarray]:
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
        except (ValueError, TypeError, RuntimeError) as e:
            # Exported.call's shape, dtype and pytree checks (ValueError, TypeError; jax's
            # concretization errors are TypeErrors), XLA's compile and run (JaxRuntimeError),
            # an effect it does not implement (NotImplementedError)
            raise FileError(f"{src}: running the jax.export artifact failed: {first_line(e)}") from None
    backend = jex.backend.get_backend()
    try:
        exe, device = compile_module(loaded.module, backend, source=src)
    except (RuntimeError, ValueError) as e:  # JaxRuntimeError; IRError (host callbacks)
        raise FileError(f"{src}: XLA ({backend.platform}) cannot compile the module: "
                        f"{xla_error_line(e)}") from None
    try:
        return run_compiled(exe, device, inputs)
    except (RuntimeError, ValueError, TypeError) as e:  # JaxRuntimeError; device_put's checks
        raise FileError(f"{src}: XLA execution failed: {xla_error_line(e)}") from None
