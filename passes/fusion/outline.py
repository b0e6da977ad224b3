"""Step 3 of fusion: outline a region into a private function and call it.

The region's ops are cloned into ``func.func private @<name>``; splat constants they use are
cloned in too (they cost nothing and let the kernel see literal values). The call is placed at
the region's last member; outside ops between the first and last member that depend on a
region result move after the call (the region is cycle-free, so none of them feeds it). The
call and the function carry a fused location of the members so errors point at user code.
"""

from __future__ import annotations

import dataclasses
import functools

from jaxlib.mlir import ir
from jaxlib.mlir.dialects import func as func_d

from hlofuse.core import ir as hir
from hlofuse.kernels.support import is_splat_constant

REGION_ATTR = "hlofuse.region"
KIND_ATTR = "hlofuse.kind"
XLA_ATTR = "hlofuse.xla"          # on a region function left to XLA: why (kernelize skips it)
KERNEL_PREFIX = "hlofuse_k"       # functions imported by kernelize: hlofuse_k<region id>_*


def is_hlofuse_func(f) -> bool:
    """An outlined region (``hlofuse.kind``) or an imported kernel function (``hlofuse_k*``).

    These are hlofuse's own output: only ``kernelize`` and :mod:`hlofuse.runtime.verify` look inside
    them. Every other pass leaves them alone, so running the pipeline again over its output
    changes nothing (idempotence, passes/README.md)."""
    return KIND_ATTR in f.operation.attributes or hir.func_name(f).startswith(KERNEL_PREFIX)


def inline_xla_regions(module: ir.Module) -> int:
    """Inline, in place, every call of a region left to XLA (a function carrying
    :data:`XLA_ATTR`) back into its caller, and drop those functions; returns how many calls.

    The form XLA compiles (``Optimized.bytecode``): XLA:TPU fuses and assigns buffers across a
    call boundary differently from the same ops inline (measured on the ViT-B/16 training step
    compiled for v5e with every region left to XLA: 63 KiB more temporaries, 78 MB fewer bytes
    accessed than ``jax.jit``'s; inlined, both equal jax.jit's). The module a pass pipeline
    returns keeps the calls: the report, Model Explorer and :func:`kernel_choice.rollback` read
    them. Results are bit-exact (the same ops)."""
    n = hir.inline_all_calls(   # kernels stay opaque; the program's functions are scanned
        module, keep=lambda f: is_hlofuse_func(f) and XLA_ATTR not in f.operation.attributes)
    if n:
        hir.run_upstream_passes(module, "builtin.module(symbol-dce)")
    return n


def executable_module(module: ir.Module) -> ir.Module:
    """``module`` in the form XLA compiles: a copy with :func:`inline_xla_regions` applied, or
    ``module`` itself when no region was left to XLA (never mutated either way)."""
    if not any(XLA_ATTR in f.operation.attributes for f in hir.funcs(module)):
        return module
    flat = hir.clone_module(module)
    inline_xla_regions(flat)
    return flat


def program_funcs(module: ir.Module) -> list:
    """The module's functions that hold the user's program (hlofuse-made ones excluded)."""
    return [f for f in hir.funcs(module) if not is_hlofuse_func(f)]


# Ops whose regions hold program code (loop bodies, branches). Regions of other ops are
# scalar computations applied per element (reduce/sort/scatter bodies).
CODE_REGION_OPS = ("func.func", "stablehlo.while", "stablehlo.case", "stablehlo.if",
                   "sdy.manual_computation")   # shard_map bodies: per-device code


def program_blocks(module: ir.Module, *, scalar_bodies: bool = False) -> list:
    """The blocks of the user's program: function bodies and the bodies of while/case/if, each
    block before the blocks nested in it; with ``scalar_bodies`` also the bodies of
    reduce/sort/scatter/... Outlined regions and kernels are excluded (:func:`program_funcs`):
    passes never rewrite them, so a second run over the output changes nothing."""
    blocks = []
    for f in program_funcs(module):
        stack = [hir.as_op(f)]
        while stack:
            op = stack.pop()
            if not scalar_bodies and op.name not in CODE_REGION_OPS:
                continue
            for region in op.regions:
                for block in region.blocks:
                    blocks.append(block)
                    stack.extend(hir.as_op(o) for o in block.operations)
    return blocks


@dataclasses.dataclass
class Boundary:
    inputs: list        # ir.Values defined outside, in first-use order
    outputs: list       # member results used outside, in program order
    constants: list     # splat constant ops cloned into the region


def region_boundary(members: list) -> Boundary:
    mset = set(members)
    inputs, constants, seen = [], [], set()
    for op in members:
        for v in op.operands:
            prod = hir.defining_op(v)
            if prod is not None and prod in mset:
                continue
            if prod is not None and is_splat_constant(prod):
                if prod not in seen:
                    seen.add(prod)
                    constants.append(prod)
                continue
            key = hir.value_key(v)
            if key not in seen:
                seen.add(key)
                inputs.append(v)
    outputs = []
    for op in members:
        for r in op.results:
            if any(u not in mset for u in hir.users(r)):
                outputs.append(r)
    return Boundary(inputs, outputs, constants)


def outline_region(module: ir.Module, members: list, name: str, *, region_id: int, kind: str):
    """Replace ``members`` (ops of one block) with a call to a new function.

    The members are taken in program order, whatever order they come in (merged sibling
    groups come group by group, and a later group may start before an earlier one): the body
    is cloned in that order and the call goes after the last of them.

    Returns (call_op, func_op, boundary).
    """
    members = in_program_order(members)
    b = region_boundary(members)
    if not b.outputs:
        raise hir.IRError(f"internal: region {name} has no outputs")
    ctx = module.context
    with ctx:
        table = ir.SymbolTable(module.operation)
        base, k = name, 0
        while name in table:  # a module optimized before may hold the same name
            k += 1
            name = f"{base}_{k}"
        loc = ir.Location.fused([m.location for m in members])
        in_types = [v.type for v in b.inputs]
        out_types = [v.type for v in b.outputs]
        with ir.InsertionPoint(module.body), loc:
            fn = func_d.FuncOp(name, (in_types, out_types), visibility="private")
            fn.operation.attributes[REGION_ATTR] = ir.IntegerAttr.get(ir.IntegerType.get_signless(64), region_id)
            fn.operation.attributes[KIND_ATTR] = ir.StringAttr.get(kind)
            entry = fn.add_entry_block()
        mapping = {hir.value_key(v): entry.arguments[i] for i, v in enumerate(b.inputs)}
        with ir.InsertionPoint(entry), loc:
            for c in b.constants:
                new = c.clone()
                mapping[hir.value_key(c.results[0])] = new.results[0]
            for op in members:
                hir.clone_mapped(op, mapping)
            func_d.ReturnOp([mapping[hir.value_key(v)] for v in b.outputs])

        last = members[-1]
        with ir.InsertionPoint(last), loc:
            call = func_d.CallOp(out_types, ir.FlatSymbolRefAttr.get(name), b.inputs)
        # the call sits before `last`; move it after, then fix up outside users in between
        call.operation.move_after(last)
        _sink_dependents(members, call.operation, b.outputs)
        mset = set(members)
        for old, new in zip(b.outputs, call.results):
            for u in list(old.uses):
                if hir.as_op(u.owner) not in mset:
                    u.owner.operands[u.operand_number] = new
        for op in reversed(members):
            hir.safe_erase(op)
    return call, fn, b


def in_program_order(ops: list) -> list:
    """``ops`` (of one block) sorted by their position in it."""
    return sorted(ops, key=functools.cmp_to_key(
        lambda a, b: 0 if a == b else (-1 if a.is_before_in_block(b) else 1)))


def _sink_dependents(members: list, call, outputs: list) -> None:
    """Move outside ops between the first member and the call that (transitively) use a
    region output to just after the call, keeping their order.

    Walks the outputs' users (an op nested in a region counts as its ancestor in the call's
    block: an implicit capture) instead of scanning the block: outlining a train step's 114
    elementwise regions scanned 5000-op blocks each time (0.6 of fuse-elementwise's 1.2 s)."""
    block = call.block
    mset = set(hir.as_op(m) for m in members)
    call = hir.as_op(call)
    moving: list = []
    seen: set = set()
    stack = list(outputs)
    while stack:
        v = stack.pop()
        for u in v.uses:
            op = hir.ancestor_in(u.owner, block)
            if op is None or op in mset or op in seen or op == call:
                continue
            seen.add(op)
            if not op.is_before_in_block(call):
                continue           # after the call already, and so are its users
            moving.append(op)
            stack.extend(op.results)
    moving = in_program_order(moving)
    anchor = call
    for op in moving:
        op.move_after(anchor)
        anchor = op
