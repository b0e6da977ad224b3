"""Differential-testing helpers and THE tolerance table; random inputs and random programs.

Every numerical comparison in hlofuse (tests, ``check=True`` verification, ``hlofuse check``)
uses :data:`TOLERANCES`. Rewrites that do not reassociate floating point are compared exactly
(``exact``); kernels recompute the same ops but a backend may pick other transcendental
approximations or contract multiply-adds (``kernel``); rewrites that reassociate sums (online
softmax, tiled reductions, folded BatchNorm) use ``reassociate``.
"""

from __future__ import annotations

import dataclasses
from typing import Any, Sequence

import numpy as np

import jax
import jax.numpy as jnp

from hlofuse.core.ir import np_dtype

# category -> dtype -> (rtol, atol). Integers and bools are always exact.
#: pass options that build every region's kernel on gpu/tpu too (there, unmeasured, only the
#: kernels XLA cannot match are built: ``hlofuse.passes.kernelize.unmeasured_reasons``);
#: for tests and checks of the kernels themselves
ALL_KERNELS = {"kernelize": {"unmeasured": "kernel"}}

TOLERANCES: dict[str, dict[str, tuple[float, float]]] = {
    "exact": {"float64": (0, 0), "float32": (0, 0), "bfloat16": (0, 0), "float16": (0, 0)},
    "kernel": {"float64": (1e-12, 1e-12), "float32": (2e-6, 2e-6), "bfloat16": (1.6e-2, 1e-2),
               "float16": (2e-3, 2e-3)},
    "reassociate": {"float64": (1e-10, 1e-10), "float32": (2e-5, 2e-5), "bfloat16": (3e-2, 3e-2),
                    "float16": (5e-3, 5e-3)},
    # quantize-matmul: a dequant scale applied once to an exact int32 sum instead of to each
    # product of a float dot (the float dot's own rounding error, ~K ulps of the sum of |terms|)
    "quantize": {"float64": (1e-9, 1e-9), "float32": (1e-4, 1e-4), "bfloat16": (3e-2, 3e-2),
                 "float16": (5e-3, 5e-3)},
    # a value requantized to int8 downstream of a reassociated float computation (fused
    # attention's online softmax, a tiled layernorm): where the float input lies within the
    # ``reassociate`` error of a rounding boundary (k + 0.5 steps) the int8 value moves by one
    # step, and every later float output that reads it moves by (activation scale x dequantized
    # weight), possibly flipping later requantizations too. Measured on bench ``int8_block``
    # (S=512, d=768; scales 0.01-0.03): 3 of 393216 attention outputs flipped by one step, output
    # max abs diff 1.95e-2 (3.2e-3 of max |y|). The bound fits activation scales <= 0.03 and
    # |dequantized weights| <= 1; integer results before any reassociation stay ``exact``.
    "requantize": {"float64": (1e-2, 3e-2), "float32": (1e-2, 3e-2), "bfloat16": (3e-2, 6e-2),
                   "float16": (1e-2, 3e-2)},
    "grad": {"float64": (1e-9, 1e-9), "float32": (1e-4, 1e-4), "bfloat16": (6e-2, 6e-2),
             "float16": (1e-2, 1e-2)},
}


def tolerance(dtype, category: str = "kernel") -> tuple[float, float]:
    name = np.dtype(dtype).name
    if not np.issubdtype(np.dtype(dtype), np.inexact) and name != "bfloat16":
        return (0.0, 0.0)
    table = TOLERANCES[category]
    return table.get(name, table["float32"])


def compare(actual, expected, category: str = "kernel", *, finite_floats: bool = True) -> list[str]:
    """Compare two pytrees leaf by leaf; returns a list of mismatch descriptions (empty = same).

    NaNs must match NaNs, infinities must match exactly, and -0.0 equals 0.0.
    ``finite_floats=False`` ignores float elements that are finite on both sides (it keeps
    NaN/inf mismatches, integer and bool leaves, and shape or dtype differences): the part of a
    comparison that does not depend on a backend's accuracy (see :data:`EDGE_DOMAIN`).
    """
    problems = []
    a_leaves, a_tree = jax.tree_util.tree_flatten(actual)
    e_leaves, e_tree = jax.tree_util.tree_flatten(expected)
    if a_tree != e_tree:
        return [f"tree structure differs: {a_tree} vs {e_tree}"]
    for i, (a, e) in enumerate(zip(a_leaves, e_leaves)):
        a, e = np.asarray(a), np.asarray(e)
        if a.shape != e.shape or a.dtype != e.dtype:
            problems.append(f"leaf {i}: {a.dtype}{list(a.shape)} vs {e.dtype}{list(e.shape)}")
            continue
        rtol, atol = tolerance(e.dtype, category)
        if e.dtype.kind == "c":   # real and imaginary parts, each as a float (a last axis of 2)
            a, e = (np.stack([x.real, x.imag], axis=-1) for x in (a, e))
        if e.dtype.kind in "biu" or (rtol == 0 and atol == 0):
            same = (a == e) | (_isnan(a) & _isnan(e))
        else:
            af, ef = a.astype(np.float64), e.astype(np.float64)
            same = np.isclose(af, ef, rtol=rtol, atol=atol, equal_nan=True)
            same |= (af == ef)  # matching infinities
            if not finite_floats:
                same |= np.isfinite(af) & np.isfinite(ef)
        if not np.all(same):
            bad = np.argwhere(~same)
            idx = tuple(int(i) for i in bad[0]) if bad.size else ()
            err = ""
            if _is_float(e.dtype):
                with np.errstate(invalid="ignore"):
                    diff = np.abs(a.astype(np.float64) - e.astype(np.float64))
                err = f", max abs err {np.nanmax(np.where(np.isfinite(diff), diff, 0)):.3g}"
            problems.append(f"leaf {i} ({e.dtype}{list(e.shape)}): {bad.shape[0]} of {e.size} elements "
                            f"differ beyond rtol={rtol}, atol={atol} (first at {idx}: "
                            f"{a[idx] if a.ndim else a} vs {e[idx] if e.ndim else e}{err})")
    return problems


def _clip_finite(values: np.ndarray, bound: float) -> np.ndarray:
    if values.dtype.kind in "iu":
        info = np.iinfo(values.dtype)
        lo, hi = max(int(info.min), -int(bound)), min(int(info.max), int(bound))
        return np.clip(values, lo, hi).astype(values.dtype)
    wide = values.astype(np.float64)
    with np.errstate(invalid="ignore"):
        clipped = np.where(np.isfinite(wide), np.clip(wide, -bound, bound), wide)
    return clipped.astype(values.dtype)


def _is_float(dtype) -> bool:
    """numpy's floats and complex, and ml_dtypes' (bfloat16, the float8 and float4 types)."""
    return np.dtype(dtype).kind in "fc" or bool(jnp.issubdtype(dtype, jnp.inexact))


def _isnan(x: np.ndarray) -> np.ndarray:
    if x.dtype.kind in "fc":
        return np.isnan(x)
    if _is_float(x.dtype):          # ml_dtypes' floats: numpy's isnan does not take them
        return np.isnan(x.astype(np.float64))
    return np.zeros(x.shape, bool)


def assert_same(actual, expected, category: str = "kernel") -> None:
    problems = compare(actual, expected, category)
    assert not problems, "results differ:\n  " + "\n  ".join(problems)


def random_inputs(avals, seed: int = 0) -> list[np.ndarray]:
    """Seeded random arrays matching avals (floats ~N(0,1), ints in [-8, 8), bools 50/50)."""
    rng = np.random.default_rng(seed)
    out = []
    for a in avals:
        dt = np.dtype(a.dtype)
        shape = tuple(a.shape)
        if dt == np.bool_:
            out.append(rng.random(shape) < 0.5)
        elif dt.kind in "iu":
            lo = 0 if dt.kind == "u" else -8
            out.append(rng.integers(lo, 8, shape).astype(dt))
        elif dt.kind == "c":
            out.append((rng.standard_normal(shape) + 1j * rng.standard_normal(shape)).astype(dt))
        else:
            out.append(rng.standard_normal(shape).astype(dt))
    return out


def edge_values(dtype) -> np.ndarray:
    """Values that break careless kernels: ±inf, NaN, ±0, subnormals, the largest finite
    values, and for integers the extremes, 0 and ±1."""
    import ml_dtypes
    dt = np.dtype(dtype)
    if dt == np.bool_:
        return np.array([False, True])
    if dt.kind in "iu":
        info = np.iinfo(dt)
        return np.array(sorted({info.min, info.max, 0, 1, info.max // 2} | ({-1} if dt.kind == "i" else set())),
                        dtype=dt)
    info = ml_dtypes.finfo(dt) if dt.name == "bfloat16" else np.finfo(dt)
    sub = float(info.smallest_subnormal)
    vals = [np.inf, -np.inf, np.nan, -0.0, 0.0, sub, -sub, float(info.max), -float(info.max),
            float(info.tiny), float(info.max) / 4, 1.0, -1.0]
    with np.errstate(over="ignore"):
        return np.array(vals, dtype=np.float64).astype(dt)


# Where an op's backends agree. Edge trials (``hlofuse.runtime.verify``, ``check=True``) probe a region
# with extreme inputs; for most ops every backend gives the same answer there (exp(huge) = inf,
# log(-1) = NaN, tanh(inf) = 1), but the periodic functions need an exact (Payne-Hanek) range
# reduction for huge arguments, which XLA, Triton and Mosaic do not all do: sin(3.4e38) was
# 0.998 on one backend and -0.38 on another (a Gemma-2 RoPE region, issue 11). op -> largest
# finite |input| an edge trial may feed a region holding that op (inf and NaN are still fed:
# sin(inf) is NaN everywhere).
EDGE_DOMAIN: dict[str, float] = {
    "stablehlo.sine": 1024.0, "stablehlo.cosine": 1024.0, "stablehlo.tan": 1024.0,
    "chlo.tan": 1024.0,
}


def edge_bound(op_names) -> float | None:
    """The largest finite edge magnitude safe for a region made of ``op_names`` (None: any)."""
    bounds = [EDGE_DOMAIN[n] for n in op_names if n in EDGE_DOMAIN]
    return min(bounds) if bounds else None


def edge_inputs(avals, seed: int = 0, fraction: float = 0.25, *,
                bound: float | None = None) -> list[np.ndarray]:
    """Like :func:`random_inputs`, with about ``fraction`` of the elements replaced by
    :func:`edge_values` of the dtype (seeded). With ``bound`` (see :func:`edge_bound`), finite
    edge values are clipped to ``[-bound, bound]`` (NaN and ±inf are kept)."""
    rng = np.random.default_rng(seed + 1_000_003)
    out = []
    for a, x in zip(avals, random_inputs(avals, seed)):
        x = np.array(x, copy=True)
        if x.dtype.kind != "c" and x.size:
            ev = edge_values(x.dtype)
            if bound is not None and x.dtype != np.bool_:
                ev = _clip_finite(ev, bound)
            mask = rng.random(x.shape) < fraction
            picks = ev[rng.integers(0, len(ev), x.shape)]
            x = np.where(mask, picks, x).astype(x.dtype)
        out.append(x)
    return out


# ---------------------------------------------------------------------------------------------
# Random StableHLO graphs for differential fuzzing (hypothesis strategies; tests/test_fuzz.py)
# ---------------------------------------------------------------------------------------------
#
# A graph is a straight-line program over ``jax.lax`` (each node one StableHLO op: elementwise,
# broadcast_in_dim, reduce, dot_general, transpose, reshape, select, convert, concatenate,
# slice, constant) on inputs of random shapes and dtypes, traced by ``jax.export``. Every node
# is fully resolved at generation time (operands are coerced by explicit broadcast/convert/
# constant nodes), so a failing example prints as a small runnable program (``.source()``).
# The oracle that runs one through the pipeline is :func:`hlofuse.runtime.verify.check_graph`.

FUZZ_DTYPES = ("f32", "bf16", "f16", "i32", "i1")
FUZZ_DIMS = (1, 2, 3, 4, 5, 8, 16, 17, 128, 130)
FUZZ_MAX_ELEMS = 4096

_UNARY = {
    "float": ("neg", "abs", "exp", "log", "tanh", "sqrt", "rsqrt", "sin", "cos", "floor", "ceil",
              "round", "sign", "logistic", "expm1", "log1p", "is_finite", "cbrt", "tan", "erf"),
    "int": ("neg", "abs", "sign", "bitwise_not", "population_count", "clz"),
    "bool": ("bitwise_not",),
}
_BINARY = {
    "float": ("add", "sub", "mul", "div", "max", "min", "pow", "atan2", "rem"),
    "int": ("add", "sub", "mul", "div", "rem", "max", "min", "bitwise_and", "bitwise_or",
            "bitwise_xor", "shift_left", "shift_right_arithmetic", "shift_right_logical"),
    "bool": ("bitwise_and", "bitwise_or", "bitwise_xor"),
}
_COMPARE = {"float": ("eq", "ne", "lt", "le", "gt", "ge"), "int": ("eq", "ne", "lt", "le", "gt", "ge"),
            "bool": ("eq", "ne")}
_REDUCE = {"float": ("add", "max", "min"), "int": ("add", "max", "min"), "bool": ("bitwise_or", "bitwise_and")}


def _family(dt: str) -> str:
    return "bool" if dt == "i1" else "int" if dt.startswith(("i", "ui")) else "float"


def _size(shape) -> int:
    n = 1
    for d in shape:
        n *= d
    return n


@dataclasses.dataclass(frozen=True)
class Node:
    op: str          # const unary binary compare select convert broadcast reduce dot transpose
                     # reshape concat slice
    args: tuple      # operand value indices
    params: tuple    # op-specific, fully resolved


@dataclasses.dataclass(frozen=True)
class GraphSpec:
    """A random straight-line program: ``inputs`` are (shape, dtype) pairs, value ``i`` is
    input ``i`` or node ``i - len(inputs)``; ``outputs`` index values."""
    inputs: tuple
    nodes: tuple
    outputs: tuple
    seed: int = 0
    edge: bool = False

    # -- running ---------------------------------------------------------------------------
    def avals(self) -> list:
        return [jax.ShapeDtypeStruct(s, np_dtype(d)) for s, d in self.inputs]

    def input_values(self) -> list[np.ndarray]:
        avals = self.avals()
        return edge_inputs(avals, self.seed) if self.edge else random_inputs(avals, self.seed)

    def build(self):
        """The program as a JAX function of the inputs."""
        from jax import lax

        def fn(*args):
            vals = list(args)
            for n in self.nodes:
                a = [vals[i] for i in n.args]
                p = n.params
                if n.op == "const":
                    value, shape, dt = p
                    v = lax.full(shape, np.array(value).astype(np_dtype(dt)), np_dtype(dt))
                elif n.op in ("unary", "binary"):
                    v = getattr(lax, p[0])(*a)
                elif n.op == "compare":
                    v = getattr(lax, p[0])(*a)
                elif n.op == "select":
                    v = lax.select(*a)
                elif n.op == "convert":
                    v = lax.convert_element_type(a[0], np_dtype(p[0]))
                elif n.op == "broadcast":
                    v = lax.broadcast_in_dim(a[0], p[0], p[1])
                elif n.op == "reduce":
                    kind, axes = p
                    x = a[0]
                    v = lax.reduce(x, _reduce_init(kind, x.dtype), getattr(lax, kind), axes)
                elif n.op == "dot":
                    x, y = a
                    v = lax.dot_general(x, y, (((x.ndim - 1,), (y.ndim - 1,)), ((), ())))
                elif n.op == "transpose":
                    v = lax.transpose(a[0], p[0])
                elif n.op == "reshape":
                    v = lax.reshape(a[0], p[0])
                elif n.op == "concat":
                    v = lax.concatenate(a, p[0])
                elif n.op == "slice":
                    v = lax.slice(a[0], p[0], p[1], p[2])
                else:  # pragma: no cover
                    raise ValueError(n.op)
                vals.append(v)
            return tuple(vals[i] for i in self.outputs)

        return fn

    def source(self) -> str:
        """The program as Python source (paste into a regression test)."""
        n_in = len(self.inputs)
        lines = [f"# inputs: {', '.join(f'{d}{list(s)}' for s, d in self.inputs)}; seed={self.seed}, "
                 f"edge={self.edge}",
                 "# from hlofuse.runtime.testing import _reduce_init; from jax import lax",
                 f"def f({', '.join(f'v{i}' for i in range(n_in))}):"]
        for k, n in enumerate(self.nodes):
            v = f"v{n_in + k}"
            a = [f"v{i}" for i in n.args]
            p = n.params
            if n.op == "const":
                rhs = f"lax.full({p[1]}, {_lit(p[0])}, {_np_name(p[2])})"
            elif n.op in ("unary", "binary", "compare"):
                rhs = f"lax.{p[0]}({', '.join(a)})"
            elif n.op == "select":
                rhs = f"lax.select({', '.join(a)})"
            elif n.op == "convert":
                rhs = f"lax.convert_element_type({a[0]}, {_np_name(p[0])})"
            elif n.op == "broadcast":
                rhs = f"lax.broadcast_in_dim({a[0]}, {p[0]}, {p[1]})"
            elif n.op == "reduce":
                rhs = f"lax.reduce({a[0]}, _reduce_init({p[0]!r}, {a[0]}.dtype), lax.{p[0]}, {p[1]})"
            elif n.op == "dot":
                rhs = f"lax.dot_general({a[0]}, {a[1]}, ((({a[0]}.ndim-1,), ({a[1]}.ndim-1,)), ((), ())))"
            elif n.op == "transpose":
                rhs = f"lax.transpose({a[0]}, {p[0]})"
            elif n.op == "reshape":
                rhs = f"lax.reshape({a[0]}, {p[0]})"
            elif n.op == "concat":
                rhs = f"lax.concatenate([{', '.join(a)}], {p[0]})"
            else:
                rhs = f"lax.slice({a[0]}, {p[0]}, {p[1]}, {p[2]})"
            lines.append(f"    {v} = {rhs}")
        lines.append(f"    return ({', '.join(f'v{i}' for i in self.outputs)},)")
        return "\n".join(lines)


def _np_name(dt: str) -> str:
    return {"f32": "np.float32", "bf16": "jnp.bfloat16", "f16": "np.float16", "i32": "np.int32",
            "i1": "np.bool_"}[dt]


def _lit(v) -> str:
    if isinstance(v, float) and (np.isnan(v) or np.isinf(v)):
        return f"float('{v}')"
    return repr(v)


def _reduce_init(kind: str, dtype):
    dt = np.dtype(dtype)
    if kind == "add":
        return np.array(0, dt)
    if kind == "bitwise_or":
        return np.array(False)
    if kind == "bitwise_and":
        return np.array(True)
    if dt.kind in "iu":
        info = np.iinfo(dt)
        return np.array(info.min if kind == "max" else info.max, dt)
    return np.array(-np.inf if kind == "max" else np.inf, dt)


def stablehlo_graphs(max_nodes: int = 14, dtypes: Sequence[str] = FUZZ_DTYPES):
    """Hypothesis strategy of :class:`GraphSpec` programs (import hypothesis lazily)."""
    from hypothesis import strategies as st

    @st.composite
    def graphs(draw):
        def shape_of(rank):
            dims = [draw(st.sampled_from(FUZZ_DIMS)) for _ in range(rank)]
            while _size(dims) > FUZZ_MAX_ELEMS:
                dims[dims.index(max(dims))] = draw(st.sampled_from(FUZZ_DIMS[:5]))
            return tuple(dims)

        base = shape_of(draw(st.sampled_from([0, 1, 2, 2, 2, 3, 3])))
        values: list[tuple] = []   # (shape, dtype) of each value
        inputs = []
        for k in range(draw(st.integers(1, 3))):
            how = draw(st.sampled_from(["base", "base", "base", "suffix", "scalar", "other"])) if k else "base"
            if how == "base":
                s = base
            elif how == "suffix":
                s = base[draw(st.integers(0, len(base))):]
            elif how == "scalar":
                s = ()
            else:
                s = shape_of(draw(st.integers(0, 3)))
            inputs.append((s, draw(st.sampled_from(list(dtypes)))))
        values.extend(inputs)
        nodes: list[Node] = []

        def emit(op, args, params, shape, dt) -> int:
            nodes.append(Node(op, tuple(args), tuple(params)))
            values.append((tuple(shape), dt))
            return len(values) - 1

        def const(shape, dt) -> int:
            fam = _family(dt)
            if fam == "bool":
                val = draw(st.booleans())
            elif fam == "int":
                val = draw(st.sampled_from([0, 1, -1, 2, 3, 7, -8, 31, 2**31 - 1, -2**31]))
            else:
                ev = [float(x) for x in edge_values(np.float32 if dt == "f32" else
                                                    np.float16 if dt == "f16" else jnp.bfloat16)]
                val = draw(st.sampled_from([0.5, 2.0, -3.0, 1.0] + ev))
            return emit("const", (), (val, tuple(shape), dt), shape, dt)

        def pick(pred=lambda s, d: True) -> int | None:
            cands = [i for i, (s, d) in enumerate(values) if pred(s, d)]
            if not cands:
                return None
            if draw(st.booleans()):  # prefer recent values: chains are what fusion works on
                return cands[-1 - draw(st.integers(0, min(2, len(cands) - 1)))]
            return draw(st.sampled_from(cands))

        def coerce(i: int, shape, dt) -> int:
            s, d = values[i]
            if s != shape:
                r, rs = len(shape), len(s)
                dims = None
                if rs <= r:
                    for cand in (tuple(range(r - rs, r)), tuple(range(rs))):
                        if all(s[k] in (1, shape[cand[k]]) for k in range(rs)):
                            dims = cand
                            break
                if dims is None:
                    return const(shape, dt)
                i = emit("broadcast", (i,), (tuple(shape), dims), shape, d)
            if d != dt:
                i = emit("convert", (i,), (dt,), shape, dt)
            return i

        kinds = ["unary"] * 4 + ["binary"] * 5 + ["const_binary"] * 3 + ["select"] + [
            "compare", "select", "convert", "broadcast", "reduce", "dot", "transpose", "reshape",
            "concat", "slice"]
        for _ in range(draw(st.integers(1, max_nodes))):
            kind = draw(st.sampled_from(kinds))
            x = pick()
            s, d = values[x]
            fam = _family(d)
            if kind == "unary":
                fn = draw(st.sampled_from(_UNARY[fam]))
                emit("unary", (x,), (fn,), s, "i1" if fn == "is_finite" else d)
            elif kind in ("binary", "const_binary", "compare"):
                y = const(s, d) if kind == "const_binary" else coerce(pick(), s, d)
                if kind == "compare":
                    emit("compare", (x, y), (draw(st.sampled_from(_COMPARE[fam])),), s, "i1")
                else:
                    fn = draw(st.sampled_from(_BINARY[fam]))
                    emit("binary", (x, y) if draw(st.booleans()) else (y, x), (fn,), s, d)
            elif kind == "select":
                p = coerce(pick(lambda s2, d2: d2 == "i1") or pick(), s, "i1")
                y = coerce(pick(), s, d)
                emit("select", (p, x, y), (), s, d)
            elif kind == "convert":
                to = draw(st.sampled_from(list(dtypes)))
                emit("convert", (x,), (to,), s, to)
            elif kind == "broadcast":
                new = draw(st.sampled_from(FUZZ_DIMS[:6]))
                if _size(s) * new > FUZZ_MAX_ELEMS or len(s) >= 4:
                    continue
                lead = draw(st.booleans())
                shape = (new,) + s if lead else s + (new,)
                dims = tuple(range(1, len(s) + 1)) if lead else tuple(range(len(s)))
                emit("broadcast", (x,), (shape, dims), shape, d)
            elif kind == "reduce":
                if not s:
                    continue
                axes = tuple(sorted(draw(st.sets(st.integers(0, len(s) - 1), min_size=1))))
                shape = tuple(n for k, n in enumerate(s) if k not in axes)
                emit("reduce", (x,), (draw(st.sampled_from(_REDUCE[fam])), axes), shape, d)
            elif kind == "dot":
                if fam == "bool" or not 1 <= len(s) <= 2:
                    continue
                y = pick(lambda s2, d2: d2 == d and 1 <= len(s2) <= 2 and s2[-1] == s[-1])
                shape = s[:-1] + values[y][0][:-1]
                if _size(shape) > FUZZ_MAX_ELEMS:
                    continue
                emit("dot", (x, y), (), shape, d)
            elif kind == "transpose":
                if len(s) < 2:
                    continue
                perm = tuple(draw(st.permutations(range(len(s)))))
                emit("transpose", (x,), (perm,), tuple(s[k] for k in perm), d)
            elif kind == "reshape":
                if not s:
                    shape = (1,)
                elif len(s) == 1:
                    n = s[0]
                    divs = [k for k in range(1, n + 1) if n % k == 0]
                    a = draw(st.sampled_from(divs))
                    shape = (a, n // a)
                else:
                    shape = (_size(s),) if draw(st.booleans()) else (_size(s[:2]),) + s[2:]
                emit("reshape", (x,), (shape,), shape, d)
            elif kind == "concat":
                if not s:
                    continue
                axis = draw(st.integers(0, len(s) - 1))
                y = pick(lambda s2, d2: d2 == d and len(s2) == len(s) and all(
                    a == b for k, (a, b) in enumerate(zip(s, s2)) if k != axis))
                shape = tuple(n + (values[y][0][axis] if k == axis else 0) for k, n in enumerate(s))
                if _size(shape) > FUZZ_MAX_ELEMS:
                    continue
                emit("concat", (x, y), (axis,), shape, d)
            elif kind == "slice":
                if not s:
                    continue
                start, limit, stride, shape = [], [], [], []
                for n in s:
                    a = draw(st.integers(0, n - 1))
                    b = draw(st.integers(a + 1, n))
                    st_ = draw(st.sampled_from([1, 1, 2]))
                    start.append(a), limit.append(b), stride.append(st_)
                    shape.append((b - a + st_ - 1) // st_)
                emit("slice", (x,), (tuple(start), tuple(limit), tuple(stride)), tuple(shape), d)
        n_in = len(inputs)
        if not nodes:
            x = 0
            emit("unary", (x,), (_UNARY[_family(values[x][1])][0],), values[x][0], values[x][1])
        last = len(values) - 1
        outs = [i for i in range(n_in, last) if draw(st.integers(0, 4)) == 0] + [last]
        return GraphSpec(tuple(inputs), tuple(nodes), tuple(outs), draw(st.integers(0, 2**16)),
                         draw(st.booleans()))

    return graphs()
