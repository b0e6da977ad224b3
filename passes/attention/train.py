"""Attention in a training step: the forward match plus the backward ``jax.grad`` built for it.

Used by ``fuse-attention`` when a forward match is refused only because its intermediates (the
probabilities, ``exp``, the row sum) are read outside the region. :func:`match_training` then

1. takes the *backward set* ``B``: the ops that read those intermediates (transitively), up to
   and including the ``dot_general`` ops that end there (dQ, dK, dV), plus the ``dP = dO·Vᵀ``
   product and the layout/convert ops between it and ``B``; a ``B`` value read outside ``B`` is a
   gradient output. GQA with the K/V repeat in the forward: ``dP`` reads the repeated V (a
   forward value, not a gradient product), and the repeat's transpose after the dK/dV products
   (layout ops, a reduce-add over the group dim) joins ``B``, so its outputs are the gradients
   of the unrepeated K/V. The cotangent ``dO`` is the one value (through reshapes/transposes) that
   ``B`` reads from outside besides the forward's inputs and splat constants.
2. checks, by evaluation, that ``B`` computes the vector-Jacobian product of the forward region:
   the forward's ops and ``B``'s ops are evaluated by a small interpreter on the same random
   inputs, every dim shrunk (sizes 2, 3, 4, ... by distinct size, dense constants sliced; the
   repeated head count shrunk to the product of the kv heads' and the group's), and
   ``jax.vjp`` of the forward evaluation must give each output of ``B`` (each up to a
   permutation of its non-unit dims, found here and recorded). Layouts, converts, the order
   jax's transpose rules and the cleanups left the ops in do not matter; what is checked is the
   value. Anything else (returned attention weights, a gradient flowing through the max,
   dropout) fails the check and the report says which part did not match.
3. on success records the rewrite: ``lse`` ops added to the forward (kind
   ``attention_fwd_lse``) and ``B`` outlined as kind ``attention_bwd`` whose body recomputes the
   forward (XLA merges it back when no kernel is built), with a
   :class:`~hlofuse.kernels.attention.backward.BwdSpec`.

The check is an identity test by evaluation at random points: the forward and backward are
compositions of the same elementwise, reduction and dot ops at every size, so a backward that
is not the forward's VJP gives different numbers at random inputs (float rounding aside:
tolerance ``1e-3`` relative, evaluated in f32 with float-to-float converts as identities).

A forward in a loop body whose intermediates leave the loop (a scan over layers saving the
probabilities for the backward loop) has no backward in its block. ``remat-loop-attention``
recomputes them in the backward loop where it can (then both loops match); otherwise the
refusal says so and names the remedy (:data:`LOOP_RESIDUALS`: ``jax.checkpoint`` around the
scanned layer).
"""

from __future__ import annotations

import dataclasses
import hashlib
import itertools
import threading

import numpy as np

import jax
import jax.numpy as jnp
from jax import lax
from jaxlib.mlir import ir
from jaxlib.mlir.dialects import func as func_d
from jaxlib.mlir.dialects import stablehlo

from hlofuse.core import ir as hir
from hlofuse.core.ops import EmitError, const_value, emit_op, splat_scalar
from hlofuse.passes import graph_util as gu

__all__ = ["TrainNoMatch", "Training", "match_training", "unshare_generator_trees"]

_LAYOUT = ("stablehlo.reshape", "stablehlo.transpose")
_FLOATS = ("f32", "bf16", "f16", "f64")
MAX_BWD_OPS = 400        # a backward set larger than this is not one attention's backward
RTOL = 1e-3
#: the backward check's random draws: per draw, integer inputs lie in [0, high); a draw whose
#: results match several inputs' gradients is tried again (:func:`_check_vjp`)
CHECK_INT_RANGES = (2, 4, 8, 16)
# the check runs once per match on tiny arrays: compile it fast, not well
_FAST_COMPILE = {"xla_llvm_disable_expensive_passes": True}


class TrainNoMatch(Exception):
    """The backward around a forward match is not the attention backward; says which part.
    ``op``: the op where it did not match, when known (the report shows its source line)."""

    def __init__(self, msg: str, op=None):
        super().__init__(msg)
        self.op = op


def _users(v) -> list:
    return [hir.as_op(u) for u in hir.users(v)]


def _dtype(v) -> str:
    return hir.tensor_type_info(v.type).dtype


def _shape(v) -> tuple:
    return hir.tensor_type_info(v.type).shape


# ---------------------------------------------------------------------------------------------
# generator trees (masks built from iotas/constants) shared by the forward and the backward
# ---------------------------------------------------------------------------------------------

_GEN_OPS = ("stablehlo.iota", "stablehlo.constant", "stablehlo.broadcast_in_dim", "stablehlo.reshape",
            "stablehlo.transpose", "stablehlo.compare", "stablehlo.and", "stablehlo.or",
            "stablehlo.not", "stablehlo.convert", "stablehlo.add", "stablehlo.subtract",
            "stablehlo.select", "stablehlo.multiply")


def _numel(v) -> int:
    return int(np.prod(_shape(v)))


def _merges_dims(op) -> bool:
    """A reshape that merges dims (fewer non-unit dims out than in): after a broadcast, a
    repeat along an existing axis (``jnp.repeat`` of K/V over the query heads of a group)."""
    if op.name != "stablehlo.reshape":
        return False
    return sum(d != 1 for d in _shape(op.operands[0])) > sum(d != 1 for d in _shape(op.results[0]))


def _pure_generator(op, depth: int = 0) -> bool:
    """``op`` is made of constants and iotas alone (generator ops, no data leaf)."""
    if depth > 16 or op.name not in _GEN_OPS or len(op.regions):
        return False
    return all(p is not None and _pure_generator(p, depth + 1)
               for p in map(hir.defining_op, op.operands))


def _cheap_tree(op, root_numel: int, depth: int = 0) -> bool:
    """``op`` computes a mask or bias by broadcasting small values: generator ops only, whose
    leaves are constants, iotas or values at most a quarter of the result's size. Not a
    repeat of data along an existing axis (a merging reshape over anything but constants and
    iotas): GQA's K/V repeated over the heads of a group of 4 or more is a quarter of the
    result's size, but it is the attention's operand, not a mask (Llama-3 and Mistral: 32
    query heads over 8 K/V heads)."""
    if depth > 16 or op.name not in _GEN_OPS or len(op.results) != 1 or len(op.regions):
        return False
    if _merges_dims(op) and not _pure_generator(op):
        return False
    for a in op.operands:
        p = hir.defining_op(a)
        if p is not None and p.name == "stablehlo.constant":
            continue
        if p is not None and _cheap_tree(p, root_numel, depth + 1):
            continue
        if _numel(a) * 4 <= root_numel:
            continue
        return False
    return True


def _product_operand(v) -> bool:
    """``v`` is read by a ``dot_general``: an operand of the attention's products (K or V
    broadcast over the query heads, MQA's single K/V head among them), not a mask or bias."""
    return any(u.name == "stablehlo.dot_general" for u in _users(v))


def unshare_generator_trees(block) -> int:
    """Give every user of a shared mask or bias broadcast from small values (a causal mask from
    iotas, a ``[B, 1, 1, Sk]`` padding mask broadcast to the logits) its own copy of the
    computation, so the forward region and the backward each take the small values in instead
    of reading a materialized ``[.., Sq, Sk]`` one. Bit-exact."""
    n = 0
    for op in hir.block_ops(block):
        if op.name == "stablehlo.constant" or len(op.results) != 1:
            continue
        uses = list(op.results[0].uses)
        if len(uses) < 2 or not _cheap_tree(op, _numel(op.results[0])) or \
                _product_operand(op.results[0]):
            continue
        for u in uses[1:]:
            owner = hir.as_op(u.owner)
            if owner.block != block:
                continue
            clone = _clone_tree(op, owner)
            owner.operands[u.operand_number] = clone
            n += 1
    return n


def _clone_tree(op, before):
    """Clone ``op`` and its producers inside the cheap tree right before ``before``."""
    root_numel = _numel(op.results[0])
    return gu.clone_tree(op, before, lambda o: o.name != "stablehlo.constant"
                         and _cheap_tree(o, root_numel))


# ---------------------------------------------------------------------------------------------
# the small interpreter
# ---------------------------------------------------------------------------------------------

class _Shrink:
    """Actual dim sizes -> small sizes (distinct sizes stay distinct; 1 stays 1). ``products``:
    ``(n, a, b)`` with ``n = a·b`` actual sizes (GQA: heads = kv heads × group) keep ``n``
    the product of the small ``a`` and ``b``, so the repeat's reshapes still hold."""

    def __init__(self, values, products=()):
        prod = {n: (a, b) for n, a, b in products}
        sizes = sorted({n for v in values for n in _shape(v) if n > 1} - set(prod))
        self.map, small = {}, 2
        for n in sizes:
            self.map[n] = small
            small += 1
        for n, (a, b) in prod.items():
            for x in (a, b):
                if x > 1 and x not in self.map:
                    self.map[x] = small
                    small += 1
            self.map[n] = self.map.get(a, 1) * self.map.get(b, 1)

    def __call__(self, shape) -> tuple:
        return tuple(self.map.get(n, 1) for n in shape)


def _f(dt: str):
    return np.float32 if dt in _FLOATS else hir.np_dtype(dt)


def _eval_op(op, args, shrink: _Shrink):
    name = op.name
    out_t = hir.tensor_type_info(op.results[0].type) if len(op.results) == 1 else None
    if name == "stablehlo.constant":
        small = shrink(out_t.shape)
        sv = splat_scalar(op)
        if sv is not None:      # numpy: no eager jax op (each would compile)
            return np.full(small, sv.astype(np.float64) if out_t.dtype in _FLOATS else sv,
                           _f(out_t.dtype))
        val = np.asarray(const_value(op))
        return np.ascontiguousarray(val[tuple(slice(0, n) for n in small)].astype(_f(out_t.dtype)))
    if name == "stablehlo.iota":
        d = ir.IntegerAttr(op.attributes["iota_dimension"]).value
        small = shrink(out_t.shape)
        return lax.broadcasted_iota(_f(out_t.dtype), small, d)
    if name == "stablehlo.broadcast_in_dim":
        dims = [int(x) for x in ir.DenseI64ArrayAttr(op.attributes["broadcast_dimensions"])]
        return lax.broadcast_in_dim(args[0], shrink(out_t.shape), dims)
    if name == "stablehlo.reshape":
        return args[0].reshape(shrink(out_t.shape))
    if name == "stablehlo.transpose":
        return jnp.transpose(args[0], [int(x) for x in ir.DenseI64ArrayAttr(op.attributes["permutation"])])
    if name == "stablehlo.convert":
        src = _dtype(op.operands[0])
        if src in _FLOATS and out_t.dtype in _FLOATS:
            return args[0]
        return args[0].astype(_f(out_t.dtype))
    if name == "stablehlo.reduce":
        kind = _reducer_kind(op)
        if kind is None:
            raise TrainNoMatch("a reduce that is not a single add/max", op)
        dims = tuple(int(x) for x in ir.DenseI64ArrayAttr(op.attributes["dimensions"]))
        if kind == "add":
            return jnp.sum(args[0], axis=dims) + args[1]
        return jnp.maximum(jnp.max(args[0], axis=dims), args[1])
    if name == "stablehlo.dot_general":
        dn = stablehlo.DotDimensionNumbers(op.attributes["dot_dimension_numbers"])
        return lax.dot_general(args[0], args[1], ((tuple(dn.lhs_contracting_dimensions),
                                                   tuple(dn.rhs_contracting_dimensions)),
                                                  (tuple(dn.lhs_batching_dimensions),
                                                   tuple(dn.rhs_batching_dimensions))),
                               precision=lax.Precision.HIGHEST,
                               preferred_element_type=jnp.float32)
    if len(op.regions):
        raise TrainNoMatch(f"'{name}' with a region", op)
    try:
        res = emit_op(op, list(args))
    except EmitError as e:
        raise TrainNoMatch(f"cannot evaluate '{name}': {e}", op) from None
    if len(res) != 1:
        raise TrainNoMatch(f"'{name}' with several results", op)
    r = res[0]
    if out_t is not None and out_t.dtype in _FLOATS:
        r = r.astype(jnp.float32)
    return r


def _reducer_kind(op) -> str | None:
    """'add' / 'max' for a single-operand reduce whose body is one add / maximum."""
    if len(op.operands) != 2 or len(op.results) != 1:
        return None
    body = [o.operation for o in op.regions[0].blocks[0].operations]
    if len(body) != 2 or body[1].name != "stablehlo.return":
        return None
    return {"stablehlo.add": "add", "stablehlo.maximum": "max"}.get(body[0].name)


def _canonical(ops: list, roots: list) -> list:
    """``ops`` in a topological order fixed by their structure alone: depth-first from
    ``roots`` (then any op not reached, in list order), operands in operand order. Two layers
    of one model list their ops in different program orders; evaluated in this order they
    trace to the same HLO, so :func:`_compiled` compiles their checks once."""
    inside = set(ops)
    seen: set = set()
    out: list = []
    for start in list(roots) + list(ops):
        if start not in inside or start in seen:
            continue
        seen.add(start)
        stack = [(start, iter(start.operands))]
        while stack:
            op, it = stack[-1]
            for v in it:
                p = hir.defining_op(v)
                if p is not None and p in inside and p not in seen:
                    seen.add(p)
                    stack.append((p, iter(p.operands)))
                    break
            else:
                stack.pop()
                out.append(op)
    return out


def _run(ops: list, env: dict, shrink: _Shrink) -> dict:
    for op in ops:
        args = []
        for a in op.operands:
            k = hir.value_key(a)
            if k not in env:
                p = hir.defining_op(a)
                if p is not None and p.name == "stablehlo.constant":
                    env[k] = _eval_op(p, [], shrink)
                else:
                    src = f"'{p.name}' at {hir.op_location(p)}" if p is not None else "an argument"
                    raise TrainNoMatch(f"'{op.name}' reads a value computed outside the matched "
                                       f"forward and backward ({src}): the gradient would need "
                                       f"ops the match did not take", op)
            args.append(env[k])
        env[hir.value_key(op.results[0])] = _eval_op(op, args, shrink)
    return env


def _random_input(v, shrink: _Shrink, rng, high: int = 2):
    """A random value for a boundary input at its small shape: floats normal, booleans true
    with probability 0.8, integers in ``[0, high)``."""
    dt = _dtype(v)
    small = shrink(_shape(v))
    if dt in _FLOATS:
        return rng.standard_normal(small).astype(np.float32)
    if dt == "i1":
        return rng.random(small) < 0.8
    return rng.integers(0, high, small).astype(hir.np_dtype(dt))


# ---------------------------------------------------------------------------------------------
# the match
# ---------------------------------------------------------------------------------------------

@dataclasses.dataclass
class Training:
    """A forward match with its backward (see the module docstring)."""
    att: object                 # match.Attention
    bwd_ops: list               # B, program order
    outputs: list               # B results read outside B (the gradients), program order
    grads: list                 # per output: (forward input value, perm)
    do_root: ir.Value
    do_chain: list              # ops between do_root and B (outside B), program order
    do_dims: tuple              # labels of do_root
    fwd_inputs: list            # the forward region's inputs (region_boundary order)


def _forward_internal_uses(att) -> dict:
    members = set(att.members)
    out = {}
    for op in att.members:
        if op is att.pv:
            continue
        for r in op.results:
            if any(u not in members for u in _users(r)):
                out[hir.value_key(r)] = r
    return out


#: the refusal when the forward saves its intermediates as a loop's outputs (see
#: :func:`_saved_across_loop`)
LOOP_RESIDUALS = ("the forward runs in a loop body (a scan over layers) that passes its "
                  "probabilities out as residuals for the backward, which runs in another loop, "
                  "and remat-loop-attention could not recompute them there (its note says why). "
                  "Wrap the scanned function in jax.checkpoint (remat): the backward loop then "
                  "recomputes the forward and both are fused there")


def _saved_across_loop(block, att, limit: int = 64) -> bool:
    """``block`` is a ``while`` body and a forward intermediate reaches its terminator, through
    ops without regions (``dynamic_update_slice`` into a scan's stacked outputs, converts,
    layout ops): the values a scan saves for its backward leave the loop."""
    owner = getattr(block, "owner", None)
    if owner is None or hir.as_op(owner).name != "stablehlo.while":
        return False
    members = set(att.members)
    todo, seen = list(_forward_internal_uses(att).values()), set()
    while todo and len(seen) < limit:
        v = todo.pop()
        if hir.value_key(v) in seen:
            continue
        seen.add(hir.value_key(v))
        for u in _users(v):
            if u in members or len(u.regions):
                continue
            if u.name == "stablehlo.return":
                return True
            if u.name in _SAVING:       # not a backward's arithmetic (a backward loop's
                todo.extend(u.results)  # gradient stacks also reach its terminator)
    return False


# the ops between a saved intermediate and the loop's terminator
_SAVING = ("stablehlo.reshape", "stablehlo.broadcast_in_dim", "stablehlo.transpose",
           "stablehlo.convert", "stablehlo.dynamic_update_slice",
           "stablehlo.concatenate")   # an unrolled scan saves its iterations' values together


def match_training(att, block, index: dict, boundary) -> Training:
    """The backward of the forward match ``att`` in ``block``; raises :class:`TrainNoMatch`
    (:data:`LOOP_RESIDUALS` when the forward's intermediates leave a loop body instead)."""
    try:
        return _match_training(att, block, index, boundary)
    except TrainNoMatch as e:
        if _saved_across_loop(block, att):
            raise TrainNoMatch(LOOP_RESIDUALS) from e
        raise


def _match_training(att, block, index: dict, boundary) -> Training:
    _stat_layouts(att)        # the lse can be formed (raises here, never while committing)
    members = set(att.members)
    leaked = _forward_internal_uses(att)
    if not leaked:
        raise TrainNoMatch("no backward reads the forward")
    ops = hir.block_ops(block)
    start = index[att.members[0]]
    tainted = set(leaked)
    # GQA with the repeat inside: dP = dO·Vᵀ reads the repeated V, a forward value; it is an
    # intermediate of the backward, not one of its gradient products
    rep_keys = {hir.value_key(r) for o in getattr(att, "repeat_ops", []) for r in o.results}
    bset, dots = set(), set()
    v_val = att.pv.operands[1 - _p_index(att)]
    for op in ops[start:]:
        if op in members:
            continue
        if not any(hir.value_key(a) in tainted for a in op.operands):
            continue
        if not len(op.results):        # the function's return: an outside user
            continue
        if any(hir.value_key(a) in {hir.value_key(r) for d in dots for r in d.results}
               for a in op.operands):
            raise TrainNoMatch(f"'{op.name}' combines a gradient with the backward", op)
        if len(op.regions) and op.name != "stablehlo.reduce":
            raise TrainNoMatch(f"the backward reads the forward in '{op.name}'", op)
        bset.add(op)
        if op.name == "stablehlo.dot_general" and not all(
                hir.value_key(a) in rep_keys for a in op.operands if hir.value_key(a) in tainted):
            dots.add(op)
            continue
        for r in op.results:
            tainted.add(hir.value_key(r))
        if len(bset) > MAX_BWD_OPS:
            raise TrainNoMatch("the ops reading the forward are too many to be its backward")
    if not bset:
        raise TrainNoMatch("no op reads them but the program's return (returned attention weights)")
    if att.repeat is not None:
        _absorb_group_sums(att, bset, dots)
    fwd_in = {hir.value_key(v) for v in boundary.inputs}
    # absorb dP = dO·Vᵀ (it reads no forward intermediate) and its layout/convert chain
    changed = True
    while changed:
        changed = False
        for op in list(bset):
            for a in op.operands:
                chain, v = [], a
                while True:
                    p = hir.defining_op(v)
                    if p is None or p in bset or p in members or hir.value_key(v) in fwd_in:
                        break
                    if p.name == "stablehlo.dot_general" and any(
                            _same_value(x, v_val) for x in p.operands):
                        chain.append(p)
                        if all(u in bset or u in chain for c in chain for r in c.results
                               for u in _users(r)):
                            bset.update(chain)
                            changed = True
                        break
                    if p.name not in _LAYOUT + ("stablehlo.convert",) or _splits(p):
                        break
                    chain.append(p)
                    v = p.operands[0]
    bwd_ops = sorted(bset, key=lambda o: index[o])
    # what B reads from outside: forward inputs, forward intermediates, constants, generated
    # masks, and dO
    outside, seen, reader = [], set(), {}
    for op in list(bwd_ops):
        for a in op.operands:
            k = hir.value_key(a)
            p = hir.defining_op(a)
            if k in seen or k in fwd_in or (p is not None and (p in bset or p in members)):
                continue
            if p is not None and p.name == "stablehlo.constant":
                continue                   # cloned into the backward function
            if p is not None and _cheap_tree(p, _numel(a)) and not _product_operand(a) and all(
                    u in bset for u in _users(a)):
                _absorb_tree(p, bset)      # a mask or bias broadcast from small values
                continue
            seen.add(k)
            outside.append(a)
            reader[k] = op
    roots, do_chain, root_reader = {}, [], {}
    for a in outside:
        v, chain = a, []
        while True:
            p = hir.defining_op(v)
            if p is None or p.name not in _LAYOUT or hir.value_key(v) in fwd_in or _splits(p):
                break
            chain.append(p)
            v = p.operands[0]
        roots[hir.value_key(v)] = v
        root_reader.setdefault(hir.value_key(v), reader[hir.value_key(a)])
        do_chain += [c for c in chain if c not in do_chain]
    if len(roots) != 1:
        # where: the first op reading one of them that is no product (dO is read by the
        # dP = dO·Vᵀ and dV = Pᵀ·dO products; an extra value is added or multiplied in)
        odd = [root_reader[k] for k in roots if root_reader[k].name != "stablehlo.dot_general"]
        raise TrainNoMatch(f"the backward reads {len(roots)} values besides the forward's "
                           "(expected one cotangent dO)" if roots else "the backward reads no cotangent",
                           odd[0] if odd else None)
    do_root = next(iter(roots.values()))
    bwd_ops = sorted(bset, key=lambda o: index[o])
    if _dtype(do_root) not in _FLOATS:
        raise TrainNoMatch("the cotangent is not floating point", root_reader[hir.value_key(do_root)])
    do_chain.sort(key=lambda o: index[o])
    outputs = []
    for op in bwd_ops:
        for r in op.results:
            if any(u not in bset for u in _users(r)):
                outputs.append(r)
    if not outputs:
        raise TrainNoMatch("the backward has no outputs")
    # no output may feed B back (B is replaced by one call after its last op)
    grads, do_dims = _check_vjp(att, boundary, bwd_ops, outputs, do_root, do_chain)
    return Training(att, bwd_ops, outputs, grads, do_root, do_chain, do_dims, list(boundary.inputs))


def _absorb_group_sums(att, bset: set, dots: set) -> None:
    """GQA with the K/V repeat inside the region: the gradients of the repeated K and V (dot
    results) are summed over each group of query heads by the repeat's transpose (layout ops,
    then a reduce-add over a dim of the group size). Those ops join ``B``, so its outputs are
    the gradients of the unrepeated K/V (the check by evaluation confirms it)."""
    groups = att.repeat.groups
    for d in list(dots):
        v, chain = d.results[0], []
        while True:
            us = _users(v)
            if len(us) != 1 or us[0] in bset:
                break
            u = us[0]
            if u.name in _LAYOUT + ("stablehlo.convert",):
                chain.append(u)
                v = u.results[0]
                continue
            if u.name == "stablehlo.reduce" and _reducer_kind(u) == "add" and \
                    hir.value_key(u.operands[0]) == hir.value_key(v):
                red = [int(x) for x in ir.DenseI64ArrayAttr(u.attributes["dimensions"])]
                init = hir.defining_op(u.operands[1])
                # (unit dims may be reduced with the group: jax folds B=1 into the sum)
                if [_shape(v)[i] for i in red if _shape(v)[i] != 1] == [groups] and \
                        init is not None and \
                        init.name == "stablehlo.constant" and splat_scalar(init) == 0:
                    bset.update(chain + [u])
            break


def _same_value(a, b, depth: int = 0) -> bool:
    """``a`` is ``b`` or the same computation of the same values: a copy of a cheap broadcast
    tree (``unshare_generator_trees`` gives the forward and the backward each their own copy of
    ``broadcast_to``/``repeat`` of K and V)."""
    if hir.value_key(a) == hir.value_key(b):
        return True
    pa, pb = hir.defining_op(a), hir.defining_op(b)
    if depth > 8 or pa is None or pb is None or pa.name != pb.name or a.type != b.type or \
            pa.name == "stablehlo.constant" or len(pa.regions) or len(pa.results) != 1 or \
            len(pa.operands) != len(pb.operands):
        return False
    def attrs(op):
        return {str(getattr(n, "name", n)): str(op.attributes[str(getattr(n, "name", n))])
                for n in op.attributes}
    if attrs(pa) != attrs(pb):
        return False
    return all(_same_value(x, y, depth + 1) for x, y in zip(pa.operands, pb.operands))


def _splits(op) -> bool:
    """A reshape that splits or merges non-unit dims (heads out of the model dim): the small
    evaluation cannot shrink across it, so the cotangent is taken after it."""
    if op.name != "stablehlo.reshape":
        return False
    return ([n for n in _shape(op.operands[0]) if n != 1]
            != [n for n in _shape(op.results[0]) if n != 1])


def _absorb_tree(op, bset: set, root_numel: int | None = None) -> None:
    """Add a cheap tree's non-constant ops to ``bset`` (they were unshared: B's own)."""
    root_numel = root_numel or _numel(op.results[0])
    if op.name == "stablehlo.constant" or op in bset or not _cheap_tree(op, root_numel):
        return
    bset.add(op)
    for a in op.operands:
        p = hir.defining_op(a)
        if p is not None and all(u in bset for u in _users(a)):
            _absorb_tree(p, bset, root_numel)


def _p_index(att) -> int:
    """Which P·V operand is P (the one in the forward's softmax ops). GQA with the repeat
    inside: the repeated V is made by members too (the repeat's ops), so those do not count;
    jnp.einsum may put V first."""
    p0 = hir.defining_op(att.pv.operands[0])
    softmax_ops = set(att.members) - set(getattr(att, "repeat_ops", []))
    return 0 if p0 is not None and p0 in softmax_ops else 1


def _perms(a_shape, b_shape):
    """Permutations of ``a``'s non-unit dims giving ``b``'s non-unit dims (sizes)."""
    a = [n for n in a_shape if n != 1]
    b = [n for n in b_shape if n != 1]
    if sorted(a) != sorted(b):
        return []
    return [p for p in itertools.permutations(range(len(a))) if [a[i] for i in p] == b]


def _squeeze(x):
    return x.reshape([n for n in x.shape if n != 1])


def _close(a, b) -> bool:
    a, b = np.asarray(a, np.float64), np.asarray(b, np.float64)
    if a.shape != b.shape:
        return False
    scale = max(1.0, float(np.nanmax(np.abs(b))) if b.size and not np.isnan(b).all() else 1.0)
    return bool(np.allclose(a, b, rtol=RTOL, atol=RTOL * scale, equal_nan=True))


_COMPILED: dict[str, object] = {}      # HLO text hash -> executable of a check (_check_vjp)
_COMPILED_LOCK = threading.Lock()
_COMPILED_MAX = 16


def _compiled(lowered):
    """``lowered`` compiled with :data:`_FAST_COMPILE`, reusing the executable of an earlier
    check with the same HLO: a model's attention layers are one structure repeated, and each
    check's XLA compile (0.42 s for a Llama layer) was most of fuse-attention's time."""
    key = hashlib.sha256(lowered.as_text().encode()).hexdigest()
    with _COMPILED_LOCK:
        exe = _COMPILED.get(key)
    if exe is None:
        exe = lowered.compile(_FAST_COMPILE)
        with _COMPILED_LOCK:
            if len(_COMPILED) >= _COMPILED_MAX:
                _COMPILED.pop(next(iter(_COMPILED)))
            _COMPILED[key] = exe
    return exe


def _check_vjp(att, boundary, bwd_ops, outputs, do_root, do_chain):
    """Evaluate forward and backward at small sizes; each output must be one input's gradient,
    and only that one's. Returns ([(input value, perm)] per output, labels of dO).

    An output that matches the gradients of two inputs (or one's under two layouts) says
    nothing about which it is: the random draw was degenerate. A key mask built from an integer
    input drawn as 0 or 1 masks every key, or all but one, so ``dS = 0`` and dQ and dK are both
    zero (a backward returning only dK was once taken for dQ's and returned dQ). Such a draw is
    tried again with other random inputs, the integers from a wider range
    (:data:`CHECK_INT_RANGES`); if every draw is ambiguous, the match is refused and XLA keeps
    the backward."""
    values = list(boundary.inputs) + [r for o in att.members + bwd_ops + do_chain for r in o.results]
    values += [do_root]
    products = ()
    if att.repeat is not None:
        sz = att.label_sizes()
        products = [(sz[att.repeat.label], sz[att.repeat.kv], sz[att.repeat.g])]
    shrink = _Shrink(values, products)
    float_in = [i for i, v in enumerate(boundary.inputs) if _dtype(v) in _FLOATS]
    other_in = [i for i in range(len(boundary.inputs)) if i not in float_in]
    fwd_consts = {hir.value_key(c.results[0]): _eval_op(c, [], shrink) for c in boundary.constants}
    pv_key = hir.value_key(att.pv.results[0])
    fwd_order = _canonical(att.members, [att.pv])
    bwd_order = _canonical(do_chain + bwd_ops, [hir.defining_op(r) for r in outputs])

    def forward(xs, others):
        env = dict(fwd_consts)
        for i, x in zip(float_in + other_in, list(xs) + list(others)):
            env[hir.value_key(boundary.inputs[i])] = x
        _run(fwd_order, env, shrink)
        return env[pv_key], env

    do_shape = shrink(_shape(do_root))
    o_shape = shrink(_shape(att.pv.results[0]))
    perms = _perms(do_shape, o_shape)
    if not perms:
        raise TrainNoMatch("the cotangent does not have the attention output's dims")

    def check(xs, others, do):
        # one jitted evaluation: the backward's outputs and the VJP for each cotangent layout
        o_small, env = forward(xs, others)
        env = dict(env)
        env[hir.value_key(do_root)] = do
        _run(bwd_order, env, shrink)
        _, vjp = jax.vjp(lambda *ys: forward(ys, others)[0], *xs)
        cts = [vjp(jnp.transpose(_squeeze(do), perm).reshape(o_small.shape)) for perm in perms]
        return [env[hir.value_key(r)] for r in outputs], cts

    out_dims = [d for d in att.out_dims if d is not None]
    best = -1
    for attempt, high in enumerate(CHECK_INT_RANGES):
        rng = np.random.default_rng(attempt)
        ins = [_random_input(v, shrink, rng, high) for v in boundary.inputs]
        do = rng.standard_normal(do_shape).astype(np.float32)
        xs, others = [ins[i] for i in float_in], [ins[i] for i in other_in]
        try:
            # lowered and compiled explicitly: runs on these arrays even when the pass runs
            # under a jax trace (no eager ops, which would each compile); the integer inputs
            # are arguments, so a second draw reuses the executable
            outs, all_cts = _compiled(jax.jit(check).lower(xs, others, do))(xs, others, do)
        except TrainNoMatch:
            raise
        except Exception as e:  # noqa: BLE001 - matching boundary: recorded as TrainNoMatch, XLA keeps it
            # jax runs hlofuse's emitters on shrunk shapes: shapes that do not shrink
            # consistently, unsupported ops, whatever the emitters raise
            msg = (str(e).strip().splitlines() or [""])[0][:160]
            raise TrainNoMatch(f"the backward could not be evaluated ({type(e).__name__}: {msg})") from None
        outs = [np.asarray(o) for o in outs]
        ambiguous = False
        for perm, cts in zip(perms, all_cts):
            cts = [np.asarray(c) for c in cts]
            found, unsure = [], False
            for out in outs:
                hits = [(boundary.inputs[i], gp) for i, g in zip(float_in, cts)
                        for gp in _perms(g.shape, out.shape)
                        if _close(np.transpose(_squeeze(g), gp), _squeeze(out))]
                if not hits:
                    best = max(best, len(found))
                    break
                unsure |= len(hits) > 1
                found.append(hits[0])
            if len(found) < len(outs):
                continue
            if unsure:
                ambiguous = True
                continue
            inv = [0] * len(perm)
            for a, b in enumerate(perm):
                inv[b] = a
            # do_root's non-unit dims carry the output labels permuted back
            labs = [out_dims[inv[i]] for i in range(len(perm))]
            it = iter(labs)
            do_dims = tuple(next(it) if n != 1 else None for n in _shape(do_root))
            return found, do_dims
        if not ambiguous:
            break
    else:
        raise TrainNoMatch(f"the backward's results match the gradients of several inputs at "
                           f"every one of {len(CHECK_INT_RANGES)} random draws at small sizes "
                           f"(e.g. a mask from an integer input that hides every key): which "
                           f"gradient each is cannot be told")
    # where: the first output that is no input's gradient under the best cotangent layout
    raise TrainNoMatch("the ops reading the forward do not compute its gradient (they are not "
                       "the attention backward: e.g. returned weights, a gradient through the max)",
                       hir.defining_op(outputs[best]) if best >= 0 else None)


# ---------------------------------------------------------------------------------------------
# the rewrite
# ---------------------------------------------------------------------------------------------

def add_lse(att, module):
    """Insert the row statistics ``stats = [max(m, init), l]`` (f32, a trailing dim of 2) after
    the row sum, for the backward's ``p = exp(x - m) / l`` (the program's own arithmetic: a
    single ``m + log(l)`` loses ``log(l)`` next to a huge finite fill in fully masked rows).
    Returns (ops, value, labels of the rows)."""
    sm = att.softmax
    r_max, r_sum = sm.r_max, sm.r_sum
    m, l = r_max.results[0], r_sum.results[0]
    lse_dims, l_perm = _stat_layouts(att)
    shape = list(_shape(m))
    with module.context, r_sum.location:
        f32 = ir.F32Type.get()
        t = ir.RankedTensorType.get(shape, f32)
        t1 = ir.RankedTensorType.get(shape + [1], f32)
        anchor = r_sum if att.members.index(r_sum) > att.members.index(r_max) else r_max
        new = []
        with ir.InsertionPoint.after(anchor):
            mm = m if _dtype(m) == "f32" else _append(new, stablehlo.ConvertOp(t, m))
            ll = l
            if l_perm is not None:
                # the sum in the max's layout (layout-assignment may have moved the exp)
                if l_perm != sorted(l_perm):
                    ll = _append(new, stablehlo.TransposeOp(
                        ll, ir.DenseI64ArrayAttr.get(l_perm)))
                ll = _append(new, stablehlo.ReshapeOp(
                    ir.RankedTensorType.get(shape, ir.RankedTensorType(l.type).element_type), ll))
            ll = ll if _dtype(l) == "f32" else _append(new, stablehlo.ConvertOp(t, ll))
            init = _append(new, stablehlo.ConstantOp(ir.DenseElementsAttr.get_splat(
                t, ir.FloatAttr.get(f32, float(att.m_init)))))
            mx = _append(new, stablehlo.MaxOp(mm, init))
            m1 = _append(new, stablehlo.ReshapeOp(t1, mx))
            l1 = _append(new, stablehlo.ReshapeOp(t1, ll))
            stats = _append(new, stablehlo.ConcatenateOp([m1, l1], len(shape)))
    return new, stats, lse_dims


def _stat_layouts(att):
    """Labels of the row max (the lse's layout) and the permutation putting the row sum's dims
    in that order (None when it has the max's shape already). Raises :class:`TrainNoMatch` when
    the two do not reduce the same rows."""
    sm = att.softmax
    x_dims = att.dims[att.x_key]
    m_dims = tuple(d for i, d in enumerate(x_dims) if i != sm.key_axis)
    e_dims = att.dims.get(hir.value_key(sm.ex.results[0]))
    axis = [int(x) for x in ir.DenseI64ArrayAttr(sm.r_sum.attributes["dimensions"])]
    if e_dims is None or len(axis) != 1:
        raise TrainNoMatch("the softmax sum's layout is unknown", sm.r_sum)
    l_dims = tuple(d for i, d in enumerate(e_dims) if i != axis[0])
    m, l = sm.r_max.results[0], sm.r_sum.results[0]
    if _shape(m) == _shape(l) and m_dims == l_dims:
        return m_dims, None
    m_real = [d for d in m_dims if d is not None]
    l_pos = {d: i for i, d in enumerate(l_dims) if d is not None}
    if sorted(m_real) != sorted(l_pos) or len(m_real) != len(set(m_real)):
        raise TrainNoMatch("the softmax max and sum reduce different rows", sm.r_sum)
    if [d for d in l_dims if d is not None] == m_real:
        return m_dims, list(range(len(l_dims)))          # a reshape does it
    units = [i for i, d in enumerate(l_dims) if d is None]
    return m_dims, [l_pos[d] for d in m_real] + units


def _append(lst, opview):
    lst.append(hir.as_op(opview))
    return opview.result


def outline_backward(module, tr: Training, fwd_boundary, o_val, lse_val, name: str,
                     region_id: int, kind: str):
    """Replace B with a call to a new function ``(fwd inputs.., o, lse, dO) -> gradients``
    whose body is the forward's ops (recomputed) followed by B. Returns (call, func)."""
    from hlofuse.passes.fusion.outline import KIND_ATTR, REGION_ATTR, _sink_dependents
    att = tr.att
    inputs = list(fwd_boundary.inputs) + [o_val, lse_val, tr.do_root]
    outs = tr.outputs
    ctx = module.context
    bset = set(tr.bwd_ops)
    with ctx:
        table = ir.SymbolTable(module.operation)
        base, k = name, 0
        while name in table:
            k += 1
            name = f"{base}_{k}"
        loc = ir.Location.fused([m.location for m in tr.bwd_ops])
        with ir.InsertionPoint(module.body), loc:
            fn = func_d.FuncOp(name, ([v.type for v in inputs], [v.type for v in outs]),
                               visibility="private")
            fn.operation.attributes[REGION_ATTR] = ir.IntegerAttr.get(
                ir.IntegerType.get_signless(64), region_id)
            fn.operation.attributes[KIND_ATTR] = ir.StringAttr.get(kind)
            entry = fn.add_entry_block()
        mapping = {hir.value_key(v): entry.arguments[i] for i, v in enumerate(inputs)}
        body_ops = list(fwd_boundary.constants) + list(att.members) + list(tr.do_chain) + list(tr.bwd_ops)
        with ir.InsertionPoint(entry), loc:
            for j, op in enumerate(body_ops):
                if j >= len(fwd_boundary.constants):
                    for a in op.operands:   # splats B reads from outside: cloned in
                        p = hir.defining_op(a)
                        if hir.value_key(a) not in mapping and p is not None and \
                                p.name == "stablehlo.constant":
                            mapping[hir.value_key(a)] = p.clone().results[0]
                hir.clone_mapped(op, mapping)
            func_d.ReturnOp([mapping[hir.value_key(v)] for v in outs])
        # the splat clones went between body ops: the spec's op positions must stay those of
        # the forward region's body (constants, then members), checked here
        last = tr.bwd_ops[-1]
        with ir.InsertionPoint(last), loc:
            call = func_d.CallOp([v.type for v in outs], ir.FlatSymbolRefAttr.get(name), inputs)
        call.operation.move_after(last)
        _sink_dependents(tr.bwd_ops, call.operation, outs)
        for old, new in zip(outs, call.results):
            for u in list(old.uses):
                if hir.as_op(u.owner) not in bset:
                    u.owner.operands[u.operand_number] = new
        for op in reversed(tr.bwd_ops):
            hir.safe_erase(op)
    return call, fn
