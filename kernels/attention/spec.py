"""The attention spec: what the ``fuse-attention`` pass matched, as pure data.

The pass matches attention once, on the user's program, and records the result on the outlined
region function as the string attribute ``hlofuse.attention`` (:meth:`AttentionSpec.to_attr`;
it round-trips through text and bytecode). :func:`spec_from_func` reads it back and adds what the
function's signature says (shapes, dtypes) and its text; it never matches again, it only checks
that the function agrees with what was recorded.

Values of the outlined function are named by position (:data:`Ref`): ``("arg", i)`` is its
``i``-th argument, ``("op", j)`` the result of the ``j``-th op of its body. Labels name the
logits' non-unit dims: batch labels (shared by Q, K, V and the output), query-row labels and the
key label (the softmax dim); ``"d"``/``"dv"`` are the head dims of Q/K and V.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import math

from jaxlib.mlir import ir

from hlofuse.core import ir as hir
from hlofuse.core.ops import EmitError

__all__ = ["SPEC_ATTR", "Ref", "Repeat", "Splat", "LogitStep", "AttentionSpec", "spec_from_func"]

SPEC_ATTR = "hlofuse.attention"   # on the outlined region function: AttentionSpec.to_attr()
Ref = tuple                       # ("arg", i) | ("op", j): a value of the outlined function


@dataclasses.dataclass(frozen=True)
class Repeat:
    """GQA: K/V head label ``label`` (size H) is ``jnp.repeat`` of ``H // groups`` kv heads."""
    label: str
    groups: int

    @property
    def kv(self) -> str:
        return self.label + ".kv"

    @property
    def g(self) -> str:
        return self.label + ".g"


@dataclasses.dataclass(frozen=True)
class Splat:
    """A literal operand: a splat constant's value (as a float) and the operand's dtype."""
    value: float
    dtype: str


@dataclasses.dataclass(frozen=True)
class LogitStep:
    """One op of the logit chain (QKᵀ -> softmax input), evaluated blockwise by the kernels.

    ``operands`` are :data:`Ref` or :class:`Splat`; a splat ``stablehlo.constant`` step has its
    value as its one operand. ``dims``: the labels of the result's dims (None for unit dims).
    """
    ref: Ref
    name: str
    operands: tuple
    dtype: str
    dims: tuple


@dataclasses.dataclass(frozen=True)
class AttentionSpec:
    """One matched attention region (see the module docstring). Hashable, no IR inside."""
    # labels
    label_sizes: tuple              # ((label, size), ...): logits labels, d, dv, GQA kv/g
    batch_labels: tuple             # batch labels, QKᵀ order (the repeated head label included)
    row_labels: tuple               # query-row labels, Q order
    key: str                        # the softmax (key) label
    repeat: Repeat | None
    head_dim: int
    v_head_dim: int
    # operands, by argument position, with their per-dim labels
    q_arg: int
    k_arg: int
    v_arg: int
    q_dims: tuple                   # 'd' for the contracted head dim
    k_dims: tuple
    v_dims: tuple                   # 'dv' for V's free dim
    out_dims: tuple                 # labels of the P·V result
    side_args: tuple                # ((arg, dims), ...): masks/biases read by the logit chain
    const_sides: tuple              # ((op index, dims), ...): dense constants inside the region
    # the logit chain and the softmax
    steps: tuple                    # LogitStep, program order
    s_ref: Ref                      # the QKᵀ result
    s_dtype: str
    x_ref: Ref                      # the softmax input
    mask_select: tuple | None       # (predicate operand, fill): x = select(position mask, ., fill)
    m_init: float                   # the max-reduction's initial value (folded with maxima)
    x_dtype: str
    p_dtype: str                    # dtype of P as the P·V product reads it
    out_dtype: str
    precision: tuple                # (QKᵀ precision, P·V precision)
    # from the function itself (spec_from_func)
    in_shapes: tuple = ()
    in_dtypes: tuple = ()
    out_shape: tuple = ()
    body_text: str = ""             # the body ops, printed: the kernel name's digest
    func_text: str = ""             # the whole function: the kernels emit the logit ops from it

    # views -------------------------------------------------------------------------------------
    @property
    def digest(self) -> str:
        return hashlib.sha1(self.body_text.encode()).hexdigest()[:10]

    @property
    def sizes(self) -> dict:
        return dict(self.label_sizes)

    @property
    def batch(self) -> list:
        """Batch labels, the repeated head label replaced by the kv-head label."""
        if self.repeat is None:
            return list(self.batch_labels)
        return [self.repeat.kv if b == self.repeat.label else b for b in self.batch_labels]

    @property
    def rows(self) -> list:
        """Query-row labels; with GQA the group label first."""
        return ([self.repeat.g] if self.repeat else []) + list(self.row_labels)

    @property
    def sq(self) -> str:
        """The row label tiled as the query sequence: the largest row (last on ties)."""
        sizes = self.sizes
        return max(reversed(self.rows), key=lambda r: sizes[r])

    @property
    def rows_other(self) -> list:
        sq = self.sq
        return [r for r in self.rows if r != sq]

    @property
    def order(self) -> list:
        """Canonical label order of the logits: batch..., other rows..., sq, key."""
        return self.batch + self.rows_other + [self.sq, self.key]

    @property
    def out_order(self) -> list:
        """Canonical label order of the output: batch..., other rows..., sq, dv."""
        return self.batch + self.rows_other + [self.sq, "dv"]

    @property
    def seq_q(self) -> int:
        return self.sizes[self.sq]

    @property
    def seq_k(self) -> int:
        return self.sizes[self.key]

    @property
    def n_batch(self) -> int:
        return int(math.prod(self.sizes[b] for b in self.batch))

    @property
    def n_group(self) -> int:
        return int(math.prod(self.sizes[r] for r in self.rows_other))

    @property
    def gqa_groups(self) -> int:
        return self.repeat.groups if self.repeat else 1

    @property
    def n_sides(self) -> int:
        return len(self.side_args) + len(self.const_sides)

    def describe(self) -> str:
        s = self.sizes
        return (f"attention batch={[s[b] for b in self.batch]} rows={[s[r] for r in self.rows_other]}"
                f" Sq={self.seq_q} Sk={self.seq_k} D={self.head_dim} Dv={self.v_head_dim}"
                f" gqa={self.gqa_groups} x={self.x_dtype} out={self.out_dtype}")

    # the func attribute ------------------------------------------------------------------------
    def to_attr(self) -> str:
        """The matched fields as JSON (the function's own fields are read from the function)."""
        return json.dumps({f.name: _encode(getattr(self, f.name)) for f in dataclasses.fields(self)
                           if f.name not in _FROM_FUNC}, separators=(",", ":"))

    @classmethod
    def from_attr(cls, text: str, **from_func) -> "AttentionSpec":
        d = json.loads(text)
        names = {f.name for f in dataclasses.fields(cls)} - _FROM_FUNC
        if set(d) != names:
            raise EmitError(f"{SPEC_ATTR} has fields {sorted(d)}, expected {sorted(names)}")
        fields = {k: _decode(v) for k, v in d.items()}
        return cls(**fields, **from_func)


_FROM_FUNC = frozenset({"in_shapes", "in_dtypes", "out_shape", "body_text", "func_text"})
_TYPES = {"Repeat": Repeat, "Splat": Splat, "LogitStep": LogitStep}


def _encode(x):
    if dataclasses.is_dataclass(x):
        return {"@": type(x).__name__, **{f.name: _encode(getattr(x, f.name))
                                          for f in dataclasses.fields(x)}}
    if isinstance(x, (tuple, list)):
        return [_encode(e) for e in x]
    return x


def _decode(x):
    if isinstance(x, dict):
        x = dict(x)
        cls = _TYPES[x.pop("@")]
        return cls(**{k: _decode(v) for k, v in x.items()})
    if isinstance(x, list):
        return tuple(_decode(e) for e in x)
    return x


def spec_from_func(fn_op) -> AttentionSpec:
    """The :class:`AttentionSpec` recorded on an outlined attention region (``func.func``).

    Raises :class:`EmitError` when the function has no spec or does not agree with it.
    """
    if SPEC_ATTR not in fn_op.attributes:
        raise EmitError(f"attention region without a {SPEC_ATTR} attribute")
    ftype = hir.function_type(fn_op)
    ins = [hir.tensor_type_info(t) for t in ftype.inputs]
    outs = [hir.tensor_type_info(t) for t in ftype.results]
    if any(i is None for i in ins + outs):
        raise EmitError("dynamic shapes")
    if len(outs) != 1:
        raise EmitError("attention region must return exactly one value")
    ops = hir.block_ops(fn_op.regions[0].blocks[0])
    spec = AttentionSpec.from_attr(
        ir.StringAttr(fn_op.attributes[SPEC_ATTR]).value,
        in_shapes=tuple(i.shape for i in ins), in_dtypes=tuple(hir.np_dtype(i.dtype) for i in ins),
        out_shape=outs[0].shape, body_text=hir.ops_text(ops),
        func_text=fn_op.operation.get_asm(assume_verified=True))
    _check_agrees(spec, ops, outs[0])
    return spec


def _check_agrees(spec: AttentionSpec, ops: list, out) -> None:
    """The recorded spec names this function's arguments and ops (a cheap consistency check)."""
    def bad(what):
        raise EmitError(f"attention region does not agree with its {SPEC_ATTR}: {what}")

    n_in = len(spec.in_shapes)
    for arg, dims in [(spec.q_arg, spec.q_dims), (spec.k_arg, spec.k_dims),
                      (spec.v_arg, spec.v_dims)] + list(spec.side_args):
        if not 0 <= arg < n_in or len(dims) != len(spec.in_shapes[arg]):
            bad(f"argument {arg}")
    if len(spec.out_dims) != len(out.shape) or out.dtype != spec.out_dtype:
        bad("result type")
    if ops[-2].name != "stablehlo.dot_general" or len(ops[-1].operands) != 1:
        bad("the region does not end with the P·V product")

    def op_named(ref, name=None):
        if ref[0] == "arg":
            return 0 <= ref[1] < n_in or bad(f"argument {ref[1]}")
        if not 0 <= ref[1] < len(ops) - 1 or (name and ops[ref[1]].name != name):
            bad(f"op {ref[1]} is not '{name}'")
        return True

    op_named(spec.s_ref, "stablehlo.dot_general")
    for j, _ in spec.const_sides:
        op_named(("op", j), "stablehlo.constant")
    for st in spec.steps:
        op_named(st.ref, st.name)
        for a in st.operands:
            if not isinstance(a, Splat):
                op_named(a)
