"""Shardings of a program (Shardy ``sdy.sharding`` after propagation) and per-shard kernels.

A region of a sharded program can run as a kernel on each shard when its computation is
*shard-local*: every output element of a shard depends only on that shard's input elements.
:func:`check_region` decides it op by op from the propagated shardings (elementwise ops with one
sharding, broadcasts that keep sharded dims, reductions over unsharded dims, dot_general whose
contracting dims are unsharded, transposes, reshapes that keep every sharded dim and what lies
before it, splat constants, iotas along unsharded dims, convolutions sharded along the batch or
the output features only, concatenations along unsharded dims; any other op only when it touches
no sharded dim). Ops made after propagation carry no annotation: :func:`check_region` and
:func:`input_sharding` carry their operands' shardings to them by the same rules
(:func:`_infer_sharding`), and :func:`local_function` also localizes the sizes an attention
spec records (forward, forward with row statistics, backward).
:func:`local_function` types a copy of the region function for one shard, and
:func:`manual_wrapper` builds ``sdy.manual_computation`` around the kernel built from it, with
the region's shardings, so XLA's SPMD partitioner never sees (and never gathers for) the kernel.

A sharding is a tuple with, per dimension, the tuple of mesh axes it is split over
(``(("data",), (), ())``). ``None`` means not known (no annotation): such a region stays with
XLA, the caller says why.
"""

from __future__ import annotations

import json
import math
import re

from jaxlib.mlir import ir
from jaxlib.mlir.dialects import stablehlo

from hlofuse.core import ir as hir
from hlofuse.core import ops as hops
from hlofuse.kernels.support import conv_groups, is_splat_constant

__all__ = ["mesh_of", "several_meshes", "is_sharded_module", "value_sharding", "check_region",
           "slice_replicated_inputs", "local_function", "manual_wrapper", "NotShardLocal"]

SHARDING_ATTR = "sdy.sharding"
PROPAGATED_ATTR = "hlofuse.shardings_propagated"   # on the module, set by propagate-shardings
# a while op's propagated shardings (one per carried value), moved off ``sdy.sharding`` by
# propagate-shardings: XLA's import turns loop invariants into implicit captures without
# updating a while's ``sdy.sharding`` and then fails on the count ("has 4 leaf nodes while this
# sharding has 6"); jax itself never annotates a while
LOOP_SHARDING_ATTR = "hlofuse.loop_shardings"


class NotShardLocal(Exception):
    """The region's computation needs data of other shards (the message says which op)."""


def mesh_of(module) -> tuple[str, str, dict[str, int]] | None:
    """(symbol, op text, {axis: size}) of the module's ``sdy.mesh``, or None."""
    for op in module.body.operations:
        if op.operation.name == "sdy.mesh":
            text = str(op)
            name = ir.StringAttr(op.operation.attributes["sym_name"]).value
            m = re.search(r"<\[(.*?)\]", text)
            axes = dict((a, int(s)) for a, s in re.findall(r'"([^"]+)"=(\d+)', m.group(1))) if m else {}
            return name, text, axes
    return None


def _parse_dims(text: str) -> tuple | None:
    """``[{"data"}, {}, {"a", "b"}]`` -> (("data",), (), ("a", "b")); None for sub-axes."""
    if ":(" in text:
        return None
    dims = re.findall(r"\{([^{}]*)\}", text)
    return tuple(tuple(re.findall(r'"([^"]+)"', d)) for d in dims)


def _parse_sharding(text: str) -> tuple | None:
    m = re.search(r"<@\w+,\s*(\[.*?\])", text)
    return _parse_dims(m.group(1)) if m else None


def _per_value(attr) -> list:
    text = str(attr)
    inner = re.findall(r"<@\w+,\s*(\[[^\]]*\])", text)
    return [_parse_dims(t) for t in inner]


def is_propagated(module) -> bool:
    """``propagate-shardings`` ran over this sharded module (every op has its sharding)."""
    return PROPAGATED_ATTR in module.operation.attributes and is_sharded_module(module)


def several_meshes(module) -> bool:
    """The module has meshes of more than one layout (axes and devices). jax's axis-less
    ``@empty_mesh`` and ``@maximal_mesh_N`` do not count, nor do copies of one mesh under two
    names (a ``shard_map``'s mesh made apart from the inputs': ``@mesh`` and ``@mesh_0``)."""
    layouts = set()
    for op in module.body.operations:
        if op.operation.name == "sdy.mesh":
            text = str(op)
            m = re.search(r"<\[(.*?)\]", text)
            if m and m.group(1).strip():
                layouts.add(text[text.index("<"):])
    return len(layouts) > 1


def is_sharded_module(module) -> bool:
    """The module has one mesh, of more than one device, and a sharded ``@main`` argument.
    A module with several meshes (a constraint onto another mesh of the same devices) is not
    one hlofuse's per-shard machinery handles: every sharding it writes names one mesh, and
    the other's axes were unknown there (``kernelize`` failed: the whole program ran
    unoptimized, with a warning). Its regions are built for whole arrays, left to Shardy."""
    mesh = mesh_of(module)
    if mesh is None or math.prod(mesh[2].values() or [1]) <= 1:
        return False
    if several_meshes(module):
        return False
    main = hir.main_func(module)
    if "arg_attrs" not in main.attributes:
        return False
    return any(SHARDING_ATTR in str(a) and "{\"" in str(a)
               for a in ir.ArrayAttr(main.attributes["arg_attrs"]))


def value_sharding(v: ir.Value, replicated_if_open: bool = False) -> tuple | None:
    """The propagated sharding of ``v`` (an op result or a function argument), or None.
    ``replicated_if_open``: a ranked value Shardy left without a sharding after propagation
    over the whole program is replicated (nothing shards it)."""
    s = _value_sharding(v)
    if s is None and replicated_if_open and isinstance(v.type, ir.RankedTensorType):
        return tuple(() for _ in ir.RankedTensorType(v.type).shape)
    return s


def _value_sharding(v: ir.Value) -> tuple | None:
    owner = v.owner
    if isinstance(owner, ir.Block):
        fn = owner.owner
        parent = hir.as_op(fn)
        if parent.name == "stablehlo.while":
            # a loop-carried value: Shardy keeps one sharding per carried value (its data-flow
            # edge) on the while op's result of the same index, for the operand, the body and
            # condition arguments and the result alike
            return _value_sharding(parent.results[ir.BlockArgument(v).arg_number])
        if "arg_attrs" not in fn.attributes:
            return None
        attrs = ir.ArrayAttr(fn.attributes["arg_attrs"])
        idx = ir.BlockArgument(v).arg_number
        a = ir.DictAttr(attrs[idx])
        if SHARDING_ATTR not in a:
            return None
        return _parse_sharding(str(a[SHARDING_ATTR]))
    op = owner
    if op.name == "sdy.sharding_constraint":   # its result has the sharding it asks for
        return _parse_sharding(str(op.attributes["sharding"]))
    key = LOOP_SHARDING_ATTR if LOOP_SHARDING_ATTR in op.attributes else SHARDING_ATTR
    if key not in op.attributes:
        return None
    vals = _per_value(op.attributes[key])
    idx = ir.OpResult(v).result_number
    return vals[idx] if idx < len(vals) else None


def input_sharding(v: ir.Value, depth: int = 0) -> tuple | None:
    """:func:`value_sharding` of a region input, or, for a value made after propagation (the
    lse a training match adds, the layout ops around it), its operands' carried forward by the
    rules of :func:`check_region`; replicated when nothing shards it. None for a result of a
    region call :func:`annotate_calls` left unannotated (a region not shard-local): what it
    holds is not known, and read as replicated a forward's row statistics reached its
    backward's per-shard kernel whole."""
    s = value_sharding(v)
    if s is not None:
        return s
    op = hir.defining_op(v)
    if op is not None and op.name == "func.call":
        return None
    if (depth < 32 and op is not None and op.name != "func.call" and len(op.results) == 1
            and not len(op.regions)):
        ins = []
        for a in op.operands:
            p = hir.defining_op(a)
            ins.append("*" if p is not None and is_splat_constant(p) else input_sharding(a, depth + 1))
        guess = _infer_sharding(op, ins)
        if guess is not None:
            return guess
    return value_sharding(v, True)


def annotate_calls(module, calls, table) -> None:
    """Give each region ``func.call`` the propagated shardings of its callee's results (Shardy
    does not look into calls), so a region fed by another region knows its inputs'. Results
    computed by ops made after propagation (a training match's lse) take the shardings
    :func:`check_region` carries to them from the call's inputs."""
    mesh, _, axes = mesh_of(module)
    for call in calls:
        if SHARDING_ATTR in call.attributes:
            continue
        fn = table[ir.FlatSymbolRefAttr(call.attributes["callee"]).value]
        ret = hir.block_ops(fn.regions[0].blocks[0])[-1]
        per = [value_sharding(v, True) for v in ret.operands]
        if any(value_sharding(v) is None for v in ret.operands):
            # with the replicated inputs sliced as kernelize slices them (a GQA forward's
            # replicated K/V beside head-sharded Q); where the region is not shard-local the
            # call stays unannotated: reading the lse as replicated gave the backward's
            # per-shard kernel the global row statistics (a failed build, with a warning)
            args = slice_replicated_inputs(fn, [input_sharding(a) for a in call.operands], axes)
            try:
                shard = check_region(fn, args, axes)
                per = [shard.get(hir.value_key(v)) for v in ret.operands]
                per = [None if x == "*" else x for x in per]
            except NotShardLocal:
                continue
        if not per or any(p is None for p in per):
            continue
        set_shardings(call, mesh, per)


def set_shardings(op, mesh: str, per_value: list) -> None:
    """Annotate ``op`` (made after propagation) with one closed sharding per result."""
    text = "#sdy.sharding_per_value<[" + ", ".join(_sharding_text(mesh, p) for p in per_value) + "]>"
    with op.context:
        op.attributes[SHARDING_ATTR] = ir.Attribute.parse(text)


def _unsharded(s) -> bool:
    return s is not None and all(not d for d in s)


def _indivisible(shape, s, axes: dict[str, int]) -> tuple | None:
    """The first dim of ``shape`` that does not divide by the product ``k`` of the mesh axes
    sharding it, as ``(size, k)`` (``k`` 0: an axis the mesh does not have); None when all
    do."""
    for n, ax in zip(shape, s):
        k = math.prod(axes.get(a, 0) for a in ax) if ax else 1
        if k == 0 or n % k:
            return n, k
    return None


def _pointwise(op) -> bool:
    """Each result element reads the operand elements at its own index (a shard's result reads
    that shard's operands)."""
    return hops.op_class(op) is hops.OpClass.ELEMENTWISE or op.name in (
        "stablehlo.convert", "stablehlo.select", "stablehlo.compare", "stablehlo.clamp")


def _shape(v) -> tuple:
    return tuple(ir.RankedTensorType(v.type).shape)


def _ints(op, key: str) -> list[int]:
    a = op.attributes[key]
    try:
        return list(ir.DenseI64ArrayAttr(a))
    except ValueError:  # older attribute kinds: not castable to DenseI64ArrayAttr
        return [int(x) for x in re.findall(r"-?\d+", str(a))]


def _keyed(shape, s) -> dict:
    """Sharded dims keyed by (elements before the dim, its size): what a reshape can keep."""
    out, pre = {}, 1
    for n, axes in zip(shape, s):
        if axes:
            out[(pre, n)] = axes
        pre *= n
    return out


def reshape_keeps(src: tuple, dst: tuple, s_in, s_out) -> bool:
    """A reshape from ``src`` sharded ``s_in`` to ``dst`` sharded ``s_out`` moves no data
    between shards: every sharded dim has a dim sharded over the same axes on the other side,
    with the same elements before it. Its size may differ: a shard is the slice of the index
    space after those elements (row-major: ``(index mod period) // (period / shards)``,
    ``period`` fixed by what lies before), so merging the dim with unsharded dims after it, or
    splitting off its major part (the axes divide it: both sides' annotations are valid), moves
    no data between shards (a GQA product's query heads ``(kv, g)`` merged back to ``kv*g``
    sharded on ``kv``)."""
    def by_offset(shape, sh):
        return {pre: axes for (pre, _), axes in _keyed(shape, sh).items()}
    return by_offset(src, s_in) == by_offset(dst, s_out)


def reshaped(src: tuple, dst: tuple, s_in, axes: dict | None = None) -> tuple:
    """The sharding of ``dst`` keeping each of ``s_in``'s sharded dims on the ``dst`` dim with
    the same elements before it (:func:`reshape_keeps`): the same size, a merge with dims after
    it (a multiple of its size), or, with the mesh's ``axes`` sizes known, its major part when
    the axes divide it. Unsharded elsewhere, which :func:`reshape_keeps` then refuses."""
    keys, out, pre = _keyed(src, s_in), [], 1
    by_pre = {p: (n, ax) for (p, n), ax in keys.items()}
    for n in dst:
        n0, ax = by_pre.get(pre, (None, ()))
        k = math.prod(axes.get(a, 0) for a in ax) if axes is not None and ax else 0
        if ax and not (n % n0 == 0 or (k and n0 % n == 0 and n % k == 0)):
            ax = ()
        out.append(ax)
        pre *= n
    return tuple(out)


def _infer_sharding(op, ins: list, axes: dict | None = None) -> tuple | None:
    """The sharding of ``op``'s single result implied by its operands' ``ins`` (the rules of
    :func:`check_region`, read forwards); None when no operand is sharded or no rule applies."""
    if len(op.results) != 1 or not isinstance(op.results[0].type, ir.RankedTensorType):
        return None
    name = op.name
    real = [(v, s) for v, s in zip(op.operands, ins) if s not in (None, "*")]
    if not real or all(_unsharded(s) for _, s in real):
        return None
    shape = _shape(op.results[0])
    if _pointwise(op):
        same = [s for v, s in real if _shape(v) == shape]
        return same[0] if same else None
    v, s = real[0]
    if name == "stablehlo.reduce":
        dims = _ints(op, "dimensions")
        return tuple(s[d] for d in range(len(s)) if d not in dims)
    if name == "stablehlo.broadcast_in_dim":
        out = [()] * len(shape)
        for i, d in enumerate(_ints(op, "broadcast_dimensions")):
            if _shape(v)[i] == shape[d]:
                out[d] = s[i]
        return tuple(out)
    if name == "stablehlo.transpose":
        return tuple(s[p] for p in _ints(op, "permutation"))
    if name == "stablehlo.reshape":
        return reshaped(_shape(v), shape, s, axes)
    if name == "stablehlo.concatenate":
        return s
    return None


def _read_as(op, v) -> tuple | None:
    """The sharding ``op`` reads its operand ``v`` with, from ``op``'s propagated result: a
    broadcast's kept dims, an elementwise op's result of ``v``'s shape; None for other ops or
    when the result's sharding is not known."""
    if len(op.results) != 1 or not isinstance(op.results[0].type, ir.RankedTensorType):
        return None
    out = value_sharding(op.results[0])
    if out is None:
        return None
    if op.name == "stablehlo.broadcast_in_dim":
        src, dst = _shape(v), _shape(op.results[0])
        return tuple(out[d] if src[i] == dst[d] else ()
                     for i, d in enumerate(_ints(op, "broadcast_dimensions")))
    if _pointwise(op) and _shape(v) == _shape(op.results[0]):
        return out
    return None


def slice_replicated_inputs(fn_op, arg_shardings: list, axes: dict[str, int]) -> list:
    """``arg_shardings`` with each replicated region input that every use in the region reads
    as one sharded layout (the replicated bias of a column-parallel ``x @ w + b``, broadcast
    onto the product's sharded columns) given that layout. Each device already holds the whole
    value, so the sharded input of the per-shard kernel is a local slice (no communication),
    and the region runs per shard instead of staying with XLA. Other inputs as given."""
    block = fn_op.regions[0].blocks[0]
    out = list(arg_shardings)
    for i, (a, s) in enumerate(zip(block.arguments, arg_shardings)):
        if not (_unsharded(s) and isinstance(a.type, ir.RankedTensorType)):
            continue
        reads = {_read_as(op, a) for op in hir.users(a)}
        if len(reads) != 1:
            continue
        want = reads.pop()
        if want is None or _unsharded(want) or len(want) != len(s):
            continue
        if _indivisible(_shape(a), want, axes) is None:
            out[i] = want
    return out


def check_region(fn_op, arg_shardings: list, axes: dict[str, int]) -> dict:
    """Decide whether the region function ``fn_op`` is shard-local.

    ``arg_shardings``: the sharding of each argument (from the call site). Returns the
    sharding of every value of the body (``hir.value_key`` -> sharding, ``"*"`` for splat
    constants, which take their users' sharding). Raises :class:`NotShardLocal` naming the op.
    """
    block = fn_op.regions[0].blocks[0]
    shard: dict = {}
    for a, s in zip(block.arguments, arg_shardings):
        if s is None:
            raise NotShardLocal("the sharding of a region input is not known")
        shard[hir.value_key(a)] = s

    def of(v):
        return shard.get(hir.value_key(v))

    def need_divisible(v, s):
        bad = _indivisible(_shape(v), s, axes)
        if bad is not None:
            raise NotShardLocal(f"a dim of size {bad[0]} is not divisible by its {bad[1]} shards")

    for op in hir.block_ops(block):
        name = op.name
        if name == "func.return":
            continue
        if is_splat_constant(op):
            shard[hir.value_key(op.results[0])] = "*"
            continue
        ins = [of(v) for v in op.operands]
        outs = [value_sharding(r) for r in op.results]
        if any(o is None for o in outs):
            # an op made after propagation (a training match's lse ops, the forward its
            # backward recomputes) carries no sharding: its operands' as Shardy would propagate
            # them; a value nothing shards is replicated
            guess = _infer_sharding(op, ins, axes)
            outs = [o if o is not None else guess if guess is not None else value_sharding(r, True)
                    for o, r in zip(outs, op.results)]
        loc = hir.op_location(op)
        where = f"{name} at {loc}"
        if any(o is None for o in outs):
            raise NotShardLocal(f"{where}: its sharding is not known")
        for r, s in zip(op.results, outs):
            if isinstance(r.type, ir.RankedTensorType):
                need_divisible(r, s)
            shard[hir.value_key(r)] = s
        real = [s for s in ins if s != "*"]
        if all(_unsharded(s) for s in real + outs):
            continue                       # replicated: any op computes the same on every shard
        if _pointwise(op):
            out = outs[0]
            for v, s in zip(op.operands, ins):
                if s == "*" or (not _shape(v) and s is not None):
                    continue
                if s != out:
                    raise NotShardLocal(f"{where}: an operand is sharded {s}, the result {out}")
            continue
        if name == "stablehlo.broadcast_in_dim":
            s_in, out = ins[0], outs[0]
            if s_in == "*":
                continue
            dims = _ints(op, "broadcast_dimensions")
            src, dst = _shape(op.operands[0]), _shape(op.results[0])
            for i, d in enumerate(dims):
                if src[i] == dst[d] and s_in[i] != out[d]:
                    raise NotShardLocal(f"{where}: dim {i} sharded {s_in[i]} becomes {out[d]}")
                if src[i] != dst[d] and s_in[i]:
                    raise NotShardLocal(f"{where}: a sharded dim of size 1 is broadcast")
            continue
        if name == "stablehlo.reduce":
            n = len(op.operands) // 2
            dims = _ints(op, "dimensions")
            for s in ins[:n]:
                if any(s[d] for d in dims):
                    raise NotShardLocal(f"{where}: reduces over a sharded dim")
                kept = [s[d] for d in range(len(s)) if d not in dims]
                if any(tuple(kept) != o for o in outs):
                    raise NotShardLocal(f"{where}: kept dims change sharding")
            continue
        if name == "stablehlo.dot_general":
            dn = op.attributes["dot_dimension_numbers"]
            text = str(dn)
            def grab(key):
                m = re.search(key + r" = \[([\d, ]*)\]", text)
                return [int(x) for x in m.group(1).split(",") if x.strip()] if m else []
            lb, rb = grab("lhs_batching_dimensions"), grab("rhs_batching_dimensions")
            lc, rc = grab("lhs_contracting_dimensions"), grab("rhs_contracting_dimensions")
            sl, sr, out = ins[0], ins[1], outs[0]
            if "*" in (sl, sr):
                raise NotShardLocal(f"{where}: a constant operand")
            if any(sl[d] for d in lc) or any(sr[d] for d in rc):
                raise NotShardLocal(f"{where}: the contraction is sharded (needs an all-reduce)")
            lf = [d for d in range(len(sl)) if d not in lb + lc]
            rf = [d for d in range(len(sr)) if d not in rb + rc]
            want = [sl[d] for d in lb] + [sl[d] for d in lf] + [sr[d] for d in rf]
            if any(sl[a] != sr[b] for a, b in zip(lb, rb)) or tuple(want) != out:
                raise NotShardLocal(f"{where}: operand and result shardings disagree")
            continue
        if name == "stablehlo.convolution":
            # batch-parallel (input batch dim) and output-feature-parallel (filter output
            # features) shardings are shard-local; a sharded window dim needs a halo, a sharded
            # input feature dim an all-reduce
            dn = stablehlo.ConvDimensionNumbers(op.attributes["dimension_numbers"])
            sl, sr, out = ins[0], ins[1], outs[0]
            if "*" in (sl, sr):
                raise NotShardLocal(f"{where}: a constant operand")
            if conv_groups(op) != (1, 1):
                raise NotShardLocal(f"{where}: a grouped convolution with a sharded operand")
            if any(sl[d] for d in (*dn.input_spatial_dimensions, dn.input_feature_dimension)) or any(
                    sr[d] for d in (*dn.kernel_spatial_dimensions, dn.kernel_input_feature_dimension)):
                raise NotShardLocal(f"{where}: a window or contracted dim is sharded (needs a halo "
                                    "or an all-reduce)")
            want = [()] * len(out)
            want[dn.output_batch_dimension] = sl[dn.input_batch_dimension]
            want[dn.output_feature_dimension] = sr[dn.kernel_output_feature_dimension]
            if tuple(want) != tuple(out):
                raise NotShardLocal(f"{where}: operand and result shardings disagree")
            continue
        if name == "stablehlo.transpose":
            perm = _ints(op, "permutation")
            if ins[0] != "*" and tuple(ins[0][p] for p in perm) != outs[0]:
                raise NotShardLocal(f"{where}: permuted sharding disagrees")
            continue
        if name == "stablehlo.reshape":
            if ins[0] == "*" or reshape_keeps(_shape(op.operands[0]), _shape(op.results[0]),
                                            ins[0], outs[0]):
                continue
            raise NotShardLocal(f"{where}: reshapes a sharded dim")
        if name == "stablehlo.concatenate":
            # along an unsharded dim, of operands sharded as the result: each shard
            # concatenates its own pieces
            d = ir.IntegerAttr(op.attributes["dimension"]).value
            if outs[0][d] or any(s != "*" and s != outs[0] for s in ins):
                raise NotShardLocal(f"{where}: concatenates along or across a sharded dim")
            continue
        if name == "stablehlo.iota":
            d = ir.IntegerAttr(op.attributes["iota_dimension"]).value
            if outs[0][d]:
                raise NotShardLocal(f"{where}: iota along a sharded dim")
            continue
        raise NotShardLocal(f"{where}: touches a sharded dim")
    return shard


def _local_type(t: ir.Type, s, axes: dict[str, int]) -> ir.Type:
    rt = ir.RankedTensorType(t)
    shape = [n // math.prod(axes[a] for a in ax) if ax else n for n, ax in zip(rt.shape, s)]
    return ir.RankedTensorType.get(shape, rt.element_type)


def local_function(fn_op, shard: dict, arg_shardings: list, result_shardings: list,
                   axes: dict[str, int], ctx, mesh_text: str = "") -> ir.Module:
    """A module holding ``@main``: ``fn_op`` typed for one shard (sdy attributes dropped)."""
    text = fn_op.operation.get_asm(enable_debug_info=True)
    mod = hir.parse("module {\n" + mesh_text + "\n" + text + "\n}", ctx, source="per-shard region", probe=False)
    with ctx, ir.Location.unknown():
        fn = hir.funcs(mod)[0]
        ir.SymbolTable.set_symbol_name(fn.operation, "main")
        ir.SymbolTable.set_visibility(fn.operation, "public")
        orig_block = fn_op.regions[0].blocks[0]
        block = fn.regions[0].blocks[0]
        for a, s in zip(block.arguments, arg_shardings):
            a.set_type(_local_type(a.type, s, axes))
        orig_ops = hir.block_ops(orig_block)
        new_ops = hir.block_ops(block)
        # splat constants take their (first) sharded user's local type
        const_type: dict = {}
        for o_op, n_op in zip(orig_ops, new_ops):
            for o_v, n_v in zip(o_op.operands, n_op.operands):
                owner = hir.defining_op(n_v)
                if (owner is not None and owner.name == "stablehlo.constant"
                        and _shape(n_v) and o_op.results and len(o_op.results) == 1
                        and _shape(o_op.results[0]) == _shape(n_v)):
                    s = shard.get(hir.value_key(o_op.results[0]))
                    if s not in (None, "*"):
                        t = _local_type(n_v.type, s, axes)
                        # by position: op wrappers are not stable dictionary keys
                        at = next(i for i, o in enumerate(new_ops) if o == owner)
                        prev = const_type.setdefault(at, t)
                        if prev != t:
                            raise NotShardLocal("a constant is used with two shardings")
        for at, (o_op, n_op) in enumerate(zip(orig_ops, new_ops)):
            if n_op.name == "func.return":
                continue
            if SHARDING_ATTR in n_op.attributes:
                del n_op.attributes[SHARDING_ATTR]
            for o_r, n_r in zip(o_op.results, n_op.results):
                s = shard.get(hir.value_key(o_r))
                if s == "*":
                    t = const_type.get(at)
                    if t is not None:
                        n_op.attributes["value"] = ir.DenseElementsAttr.get_splat(
                            t, ir.DenseElementsAttr(n_op.attributes["value"]).get_splat_value())
                        n_r.set_type(t)
                    continue
                if s is not None and isinstance(n_r.type, ir.RankedTensorType):
                    n_r.set_type(_local_type(n_r.type, s, axes))
        ins = [a.type for a in block.arguments]
        outs = [_local_type(t, s, axes) for t, s in
                zip(hir.function_type(fn).results, result_shardings)]
        fn.attributes["function_type"] = ir.TypeAttr.get(ir.FunctionType.get(ins, outs))
        # attention specs record label sizes: per shard (the forward's own attribute, and the
        # forward inside the training pair's: its output is the lse kernel's result or the
        # backward's input)
        if "hlofuse.attention" in fn.attributes:
            spec = json.loads(ir.StringAttr(fn.attributes["hlofuse.attention"]).value)
            _localize_attention(spec, ins, outs[0])
            fn.attributes["hlofuse.attention"] = ir.StringAttr.get(json.dumps(spec))
        for key, o_of in (("hlofuse.attention_fwd_lse", lambda d: outs[int(d["o_index"])]),
                          ("hlofuse.attention_bwd", lambda d: ins[int(d["o_arg"])])):
            if key in fn.attributes:
                d = json.loads(ir.StringAttr(fn.attributes[key]).value)
                spec = json.loads(d["fwd"])
                _localize_attention(spec, ins, o_of(d))
                d["fwd"] = json.dumps(spec, separators=(",", ":"))
                if "outs" in d:
                    glob = list(hir.function_type(fn_op).inputs)
                    d["outs"] = [[g, _local_perm(perm, ir.RankedTensorType(glob[g]).shape,
                                                 ir.RankedTensorType(ins[g]).shape)]
                                 for g, perm in d["outs"]]
                fn.attributes[key] = ir.StringAttr.get(json.dumps(d))
        for key in ("arg_attrs", "res_attrs"):
            if key in fn.attributes:
                del fn.attributes[key]
        for op in list(mod.body.operations):
            if op.operation.name == "sdy.mesh":
                op.operation.erase()
    hir.verify(mod)
    return mod


def _local_perm(perm, global_shape, local_shape) -> list:
    """A gradient's recorded permutation of its input's non-unit dims, for the local shapes: a
    dim sharded down to size 1 is a unit dim there, and leaves the permutation."""
    nonunit = [i for i, n in enumerate(global_shape) if n != 1]
    kept = [nonunit[p] for p in perm if local_shape[nonunit[p]] != 1]
    local_nonunit = [i for i, n in enumerate(local_shape) if n != 1]
    return [local_nonunit.index(i) for i in kept]


def _localize_attention(spec: dict, ins: list, o_type) -> None:
    """An attention spec's recorded label sizes, from the local types of Q, K, V and the P·V
    result (``o_type``)."""
    sizes = dict(spec["label_sizes"])
    for arg, dims in (("q_arg", "q_dims"), ("k_arg", "k_dims"), ("v_arg", "v_dims")):
        sizes.update(zip(spec[dims], ir.RankedTensorType(ins[spec[arg]]).shape))
    sizes.update(zip(spec["out_dims"], ir.RankedTensorType(o_type).shape))
    spec["label_sizes"] = [[k, sizes[k]] for k, _ in spec["label_sizes"]]


def _sharding_text(mesh: str, s) -> str:
    dims = ", ".join("{" + ", ".join(f'"{a}"' for a in ax) + "}" for ax in s)
    return f"<@{mesh}, [{dims}]>"


def manual_wrapper(module, name: str, kernel: str, arg_shardings: list, result_shardings: list,
                   global_in: list, global_out: list, local_in: list, local_out: list) -> str:
    """Add ``func.func private @name`` to ``module``: ``sdy.manual_computation`` over every mesh
    axis with the region's shardings, whose body calls the per-shard ``@kernel``."""
    mesh_name, mesh_text, axes = mesh_of(module)
    t = lambda ts: ", ".join(str(x) for x in ts)  # noqa: E731
    n_in, n_out = len(global_in), len(global_out)
    args = ", ".join(f"%arg{i}: {global_in[i]}" for i in range(n_in))
    largs = ", ".join(f"%l{i}: {local_in[i]}" for i in range(n_in))
    res = "%0" if n_out == 1 else f"%0:{n_out}"
    kres = "%1" if n_out == 1 else f"%1:{n_out}"
    kvals = "%1" if n_out == 1 else ", ".join(f"%1#{i}" for i in range(n_out))
    vals = "%0" if n_out == 1 else ", ".join(f"%0#{i}" for i in range(n_out))
    ins = ", ".join(_sharding_text(mesh_name, s) for s in arg_shardings)
    outs = ", ".join(_sharding_text(mesh_name, s) for s in result_shardings)
    manual = ", ".join(f'"{a}"' for a in axes)
    text = f"""module {{
  {mesh_text}
  func.func private @{kernel}({t(local_in)}) -> ({t(local_out)})
  func.func private @{name}({args}) -> ({t(global_out)}) {{
    {res} = sdy.manual_computation({", ".join(f"%arg{i}" for i in range(n_in))}) in_shardings=[{ins}] out_shardings=[{outs}] manual_axes={{{manual}}} ({largs}) {{
      {kres} = func.call @{kernel}({", ".join(f"%l{i}" for i in range(n_in))}) : ({t(local_in)}) -> ({t(local_out)})
      sdy.return {kvals} : {t(local_out)}
    }} : ({t(global_in)}) -> ({t(global_out)})
    return {vals} : {t(global_out)}
  }}
}}"""
    tmp = hir.parse(text, module.context, source="per-shard wrapper", probe=False)
    with module.context:
        for f in hir.funcs(tmp):
            if hir.func_name(f) == name:
                module.body.append(f.operation.clone())
    return name
