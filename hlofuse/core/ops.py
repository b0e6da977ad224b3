"""Per-op rule table for StableHLO: fusibility class, cost, and a JAX emitter.

Every op hlofuse reasons about has one :class:`OpRule` row: its class (elementwise,
broadcast, reduction, ...), its modeled flops per output element, and ``emit`` — how to compute
it with ``jax.lax`` on concrete or traced values. The emitter is what turns an outlined region
into the body of a Pallas kernel (and its plain-jnp reference), so an op without an emitter can
never be kernelized. Trivial ops are one line; ops needing attributes read them from the op.
"""

from __future__ import annotations

import contextlib
import contextvars
import dataclasses
import enum
from typing import Callable

import numpy as np

from jaxlib.mlir import ir
from jaxlib.mlir.dialects import stablehlo

__all__ = ["OpClass", "OpRule", "RULES", "rule_for", "op_class", "element_dtype", "const_value",
           "EmitError", "emit_op", "transcendentals_in_f32"]


class OpClass(enum.Enum):
    """What an op is to the fusion passes (its fusibility class): the per-op rule table's
    first column (:class:`OpRule`)."""
    ELEMENTWISE = "elementwise"      # one output element from the same-index input elements
    BROADCAST = "broadcast"          # broadcast_in_dim
    CONSTANT = "constant"
    IOTA = "iota"
    DATA_MOVEMENT = "data-movement"  # reshape, transpose, slice, concatenate, pad, reverse
    REDUCTION = "reduction"
    DOT = "dot"
    CONVOLUTION = "convolution"
    GATHER_SCATTER = "gather-scatter"
    CONTROL = "control"              # while, case, if, call
    OPAQUE = "opaque"                # custom_call, effects, collectives, rng, infeed/outfeed
    OTHER = "other"


class EmitError(NotImplementedError):
    """Legal StableHLO that hlofuse's emitter does not support; the region goes to XLA."""


@dataclasses.dataclass(frozen=True)
class OpRule:
    cls: OpClass
    emit: Callable | None = None   # emit(op, *args) -> value or list of values
    flops: int = 1                 # modeled flops per output element
    transcendental: bool = False


def element_dtype(t: ir.Type):
    from hlofuse.core.ir import np_dtype
    return np_dtype(str(ir.RankedTensorType(t).element_type))


def splat_scalar(op) -> np.ndarray | None:
    """The one value of a splat ``stablehlo.constant`` as a 0-d numpy array of its element type,
    or None when the constant is not a splat (or its attribute is not a ``DenseElementsAttr``).

    Reads ``DenseElementsAttr.is_splat`` / ``get_splat_value`` only: a splat of any size is one
    element in the IR (``dense<1.0> : tensor<16384x16384xf32>`` is a few bytes of text).
    """
    try:
        attr = ir.DenseElementsAttr(op.attributes["value"])
    except (TypeError, ValueError, KeyError):  # e.g. complex element types
        return None
    if not attr.is_splat:
        return None
    dt = element_dtype(op.results[0].type)
    v = attr.get_splat_value()
    if isinstance(v, ir.BoolAttr):  # i1 splats (dense<true>/dense<false>)
        val = ir.BoolAttr(v).value
    elif isinstance(v, ir.FloatAttr):
        val = ir.FloatAttr(v).value
    elif isinstance(v, ir.IntegerAttr):
        val = ir.IntegerAttr(v).value
        if dt == np.bool_:
            val = bool(val)
        elif dt.kind == "u" and val < 0:
            val += 1 << (8 * dt.itemsize)
    else:
        raise EmitError(f"unsupported splat constant element {v}")
    return np.array(val, dtype=dt)


def const_value(op) -> np.ndarray:
    """The value of a ``stablehlo.constant`` as a numpy array (bf16 and splats included).
    Splats are read-only broadcast views: a 1 GiB splat costs one element, not 1 GiB."""
    attr = ir.DenseElementsAttr(op.attributes["value"])
    t = ir.RankedTensorType(op.results[0].type)
    dt = element_dtype(op.results[0].type)
    if attr.is_splat:
        return np.broadcast_to(splat_scalar(op), tuple(t.shape))
    try:
        arr = np.array(attr)
    except (TypeError, ValueError, RuntimeError) as e:  # e.g. bf16 without buffer-protocol support
        raise EmitError(f"cannot read non-splat constant of type {t}: {e}") from None
    if arr.dtype != dt:
        arr = arr.view(dt) if arr.dtype.itemsize == dt.itemsize else arr.astype(dt)
    return arr.reshape(tuple(t.shape))


def _attr_enum(op, key: str) -> str | None:
    if key not in op.attributes:
        return None
    s = str(op.attributes[key])  # '#stablehlo<comparison_direction LT>'
    return s.rstrip(">").split()[-1]


def _lax():
    from jax import lax
    return lax


def _jnp():
    import jax.numpy as jnp
    return jnp


def _compare(op, a, b):
    lax = _lax()
    direction = _attr_enum(op, "comparison_direction")
    ctype = _attr_enum(op, "compare_type")
    if ctype == "TOTALORDER":
        raise EmitError("compare with TOTALORDER has no lax emitter")
    fn = {"EQ": lax.eq, "NE": lax.ne, "LT": lax.lt, "LE": lax.le, "GT": lax.gt, "GE": lax.ge}[direction]
    return fn(a, b)


def _convert(op, x):
    return _lax().convert_element_type(x, element_dtype(op.results[0].type))


def _select(op, p, a, b):
    return _jnp().where(p, a, b)


def _clamp(op, lo, x, hi):
    jnp = _jnp()
    return jnp.minimum(jnp.maximum(x, lo), hi)


def _broadcast_in_dim(op, x):
    dims = list(ir.DenseI64ArrayAttr(op.attributes["broadcast_dimensions"]))
    shape = tuple(ir.RankedTensorType(op.results[0].type).shape)
    return _lax().broadcast_in_dim(x, shape, dims)


def _constant(op):
    return const_value(op)


def _round_even(op, x):
    lax = _lax()
    return lax.round(x, lax.RoundingMethod.TO_NEAREST_EVEN)


def _round_afz(op, x):
    lax = _lax()
    return lax.round(x, lax.RoundingMethod.AWAY_FROM_ZERO)


def _reduce_precision(op, x):
    e = ir.IntegerAttr(op.attributes["exponent_bits"]).value
    m = ir.IntegerAttr(op.attributes["mantissa_bits"]).value
    return _lax().reduce_precision(x, exponent_bits=e, mantissa_bits=m)


def _un(name):
    return lambda op, x: getattr(_lax(), name)(x)


#: set by :func:`transcendentals_in_f32` while a kernel body is traced for Mosaic
_WIDE_TRANSCENDENTALS = contextvars.ContextVar("hlofuse_wide_transcendentals", default=False)


@contextlib.contextmanager
def transcendentals_in_f32():
    """Within it, transcendental ops on 16-bit floats are emitted as f32 ops rounded back
    (a TPU kernel's logit chain; the Triton paths convert every 16-bit op to f32 themselves).
    Outside it they are emitted on the 16-bit values, as the program has them: written as
    ``convert(f32) -> op -> convert(bf16)``, XLA:CPU (which allows excess precision) removed
    the rounding to bf16 of the op before (``exp(x @ w + b)`` took the exp of the unrounded
    f32 sum: 12% off in 320 of 6144 elements against jax.jit; adversarial round)."""
    token = _WIDE_TRANSCENDENTALS.set(True)
    try:
        yield
    finally:
        _WIDE_TRANSCENDENTALS.reset(token)


def _un_wide(name):
    """A transcendental op: on 16-bit floats, in f32 and rounded back within
    :func:`transcendentals_in_f32`, else on the 16-bit values (as jax.jit's program)."""
    def emit(op, x):
        lax = _lax()
        if x.dtype in (_jnp().bfloat16, _jnp().float16) and _WIDE_TRANSCENDENTALS.get():
            return getattr(lax, name)(x.astype(_jnp().float32)).astype(x.dtype)
        return getattr(lax, name)(x)
    return emit


def _bin(name):
    return lambda op, a, b: getattr(_lax(), name)(a, b)


def _div(op, a, b):
    return _lax().div(a, b)


E, T = OpClass.ELEMENTWISE, True
RULES: dict[str, OpRule] = {
    # binary elementwise
    "stablehlo.add": OpRule(E, _bin("add")),
    "stablehlo.subtract": OpRule(E, _bin("sub")),
    "stablehlo.multiply": OpRule(E, _bin("mul")),
    "stablehlo.divide": OpRule(E, _div),
    "stablehlo.remainder": OpRule(E, _bin("rem")),
    "stablehlo.maximum": OpRule(E, _bin("max")),
    "stablehlo.minimum": OpRule(E, _bin("min")),
    "stablehlo.power": OpRule(E, _bin("pow"), 4, T),
    "stablehlo.atan2": OpRule(E, _bin("atan2"), 4, T),
    "stablehlo.and": OpRule(E, _bin("bitwise_and")),
    "stablehlo.or": OpRule(E, _bin("bitwise_or")),
    "stablehlo.xor": OpRule(E, _bin("bitwise_xor")),
    "stablehlo.shift_left": OpRule(E, _bin("shift_left")),
    "stablehlo.shift_right_arithmetic": OpRule(E, _bin("shift_right_arithmetic")),
    "stablehlo.shift_right_logical": OpRule(E, _bin("shift_right_logical")),
    "stablehlo.compare": OpRule(E, _compare),
    "stablehlo.select": OpRule(E, _select),
    "stablehlo.clamp": OpRule(E, _clamp, 2),
    # unary elementwise
    "stablehlo.abs": OpRule(E, _un("abs")),
    "stablehlo.negate": OpRule(E, _un("neg")),
    "stablehlo.not": OpRule(E, _un("bitwise_not")),
    "stablehlo.sign": OpRule(E, _un("sign")),
    "stablehlo.floor": OpRule(E, _un("floor")),
    "stablehlo.ceil": OpRule(E, _un("ceil")),
    "stablehlo.round_nearest_even": OpRule(E, _round_even),
    "stablehlo.round_nearest_afz": OpRule(E, _round_afz),
    "stablehlo.is_finite": OpRule(E, _un("is_finite")),
    "stablehlo.popcnt": OpRule(E, _un("population_count")),
    "stablehlo.count_leading_zeros": OpRule(E, _un("clz")),
    "stablehlo.exponential": OpRule(E, _un_wide("exp"), 4, T),
    "stablehlo.exponential_minus_one": OpRule(E, _un_wide("expm1"), 4, T),
    "stablehlo.log": OpRule(E, _un_wide("log"), 4, T),
    "stablehlo.log_plus_one": OpRule(E, _un_wide("log1p"), 4, T),
    "stablehlo.logistic": OpRule(E, _un_wide("logistic"), 4, T),
    "stablehlo.sqrt": OpRule(E, _un_wide("sqrt"), 2, T),
    "stablehlo.rsqrt": OpRule(E, _un_wide("rsqrt"), 2, T),
    "stablehlo.cbrt": OpRule(E, _un_wide("cbrt"), 4, T),
    "stablehlo.tanh": OpRule(E, _un_wide("tanh"), 4, T),
    "stablehlo.sine": OpRule(E, _un_wide("sin"), 4, T),
    "stablehlo.cosine": OpRule(E, _un_wide("cos"), 4, T),
    "stablehlo.tan": OpRule(E, _un_wide("tan"), 4, T),
    "stablehlo.convert": OpRule(E, _convert, 0),
    "stablehlo.reduce_precision": OpRule(E, _reduce_precision),
    "chlo.erf": OpRule(E, _un_wide("erf"), 8, T),
    # shape
    "stablehlo.broadcast_in_dim": OpRule(OpClass.BROADCAST, _broadcast_in_dim, 0),
    "stablehlo.constant": OpRule(OpClass.CONSTANT, _constant, 0),
    "stablehlo.iota": OpRule(OpClass.IOTA, None, 0),
    "stablehlo.reshape": OpRule(OpClass.DATA_MOVEMENT, None, 0),
    "stablehlo.transpose": OpRule(OpClass.DATA_MOVEMENT, None, 0),
    "stablehlo.slice": OpRule(OpClass.DATA_MOVEMENT, None, 0),
    "stablehlo.dynamic_slice": OpRule(OpClass.DATA_MOVEMENT, None, 0),
    "stablehlo.dynamic_update_slice": OpRule(OpClass.DATA_MOVEMENT, None, 0),
    "stablehlo.concatenate": OpRule(OpClass.DATA_MOVEMENT, None, 0),
    "stablehlo.pad": OpRule(OpClass.DATA_MOVEMENT, None, 0),
    "stablehlo.reverse": OpRule(OpClass.DATA_MOVEMENT, None, 0),
    "stablehlo.bitcast_convert": OpRule(OpClass.DATA_MOVEMENT, None, 0),
    # reductions and contractions
    "stablehlo.reduce": OpRule(OpClass.REDUCTION, None, 1),
    "stablehlo.reduce_window": OpRule(OpClass.REDUCTION, None, 1),
    "stablehlo.dot_general": OpRule(OpClass.DOT, None, 2),
    "stablehlo.dot": OpRule(OpClass.DOT, None, 2),
    "stablehlo.convolution": OpRule(OpClass.CONVOLUTION, None, 2),
    "stablehlo.gather": OpRule(OpClass.GATHER_SCATTER),
    "stablehlo.scatter": OpRule(OpClass.GATHER_SCATTER),
    "stablehlo.select_and_scatter": OpRule(OpClass.GATHER_SCATTER),
    "stablehlo.sort": OpRule(OpClass.OTHER),
    # control flow
    "stablehlo.while": OpRule(OpClass.CONTROL),
    "stablehlo.case": OpRule(OpClass.CONTROL),
    "stablehlo.if": OpRule(OpClass.CONTROL),
    "func.call": OpRule(OpClass.CONTROL),
    "func.return": OpRule(OpClass.CONTROL),
    "stablehlo.return": OpRule(OpClass.CONTROL),
    # opaque: never fused, never moved across
    "stablehlo.custom_call": OpRule(OpClass.OPAQUE),
    "stablehlo.rng": OpRule(OpClass.OPAQUE),
    "stablehlo.rng_bit_generator": OpRule(OpClass.OPAQUE),
    "stablehlo.optimization_barrier": OpRule(OpClass.OPAQUE),
    "stablehlo.infeed": OpRule(OpClass.OPAQUE),
    "stablehlo.outfeed": OpRule(OpClass.OPAQUE),
    "stablehlo.send": OpRule(OpClass.OPAQUE),
    "stablehlo.recv": OpRule(OpClass.OPAQUE),
    "stablehlo.after_all": OpRule(OpClass.OPAQUE),
    "stablehlo.all_reduce": OpRule(OpClass.OPAQUE),
    "stablehlo.all_gather": OpRule(OpClass.OPAQUE),
    "stablehlo.all_to_all": OpRule(OpClass.OPAQUE),
    "stablehlo.reduce_scatter": OpRule(OpClass.OPAQUE),
    "stablehlo.collective_permute": OpRule(OpClass.OPAQUE),
    "stablehlo.collective_broadcast": OpRule(OpClass.OPAQUE),
}

_OTHER = OpRule(OpClass.OTHER)


def rule_for(name: str) -> OpRule:
    return RULES.get(name, _OTHER)


def op_class(op) -> OpClass:
    return rule_for(op.operation.name if hasattr(op, "operation") else op.name).cls


def emit_op(op, args: list) -> list:
    """Compute ``op`` with jax on ``args``; returns the list of result values."""
    r = rule_for(op.name)
    if r.emit is None:
        raise EmitError(f"no emitter for '{op.name}'")
    out = r.emit(op, *args)
    return list(out) if isinstance(out, (list, tuple)) else [out]
