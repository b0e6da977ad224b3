"""Host callbacks through ``jax.export``: outlined as placeholders, put back when inlined.

``jax.export`` cannot serialize a module that calls back into Python (``jax.debug.print``,
``jax.debug.callback``, ``pure_callback``, ``io_callback``, and every library check built on
them, such as Equinox's ``eqx.error_if`` inside diffrax, optimistix and lineax): the lowered
callback holds a pointer into this process. hlofuse exports through it all the same:

1. **Export** (:func:`export_rules`): while the function is exported, each callback primitive
   lowers to a placeholder, ``stablehlo.custom_call @hlofuse.host_callback`` with its index as
   ``backend_config`` and a side effect (no pass moves, merges or drops it). The primitive,
   its parameters and avals are kept, in lowering order, in a :class:`Slots` list. Callbacks
   that a library primitive emits only in its own lowering rule are caught the same way: the
   override applies to everything lowered in that module.
2. **Optimize**: the passes see an opaque op with a side effect and fuse around it.
3. **Inline** (:func:`reinject`): where hlofuse's primitive inlines the optimized module into
   the caller's module, each placeholder is replaced by what jax's own lowering rule for the
   kept primitive emits there, in the caller's lowering context: the callback is registered
   with that module (kept alive, compiled for that platform and sharding), exactly as
   ``jax.jit`` would have lowered it.

The indices are per export, in lowering order, so the optimized module is the same text in
every process (the module cache keys on it) and maps to this process's callbacks by position.
Ordered effects (``jax.debug.print(ordered=True)``, ``io_callback(ordered=True)``) thread
tokens through the module and are not outlined: such functions still run as traced
(:meth:`hlofuse.runtime.program.Program.runs_as_traced`).
"""

from __future__ import annotations

import dataclasses

from jaxlib.mlir import ir

from hlofuse.core import compat
from hlofuse.core import ir as hir

#: the placeholder's ``call_target_name`` (a host callback to :func:`hlofuse.core.ir.is_host_callback`:
#: the CLI and the module runner refuse a module that holds one)
PLACEHOLDER = hir.HOST_CALLBACK_PLACEHOLDER

#: primitives outlined as placeholders
PRIMITIVES = compat.host_callback_primitives().primitives

#: effects of the outlined primitives that need no token (unordered): a function whose
#: effects are all among these goes through export
UNORDERED_EFFECTS = compat.host_callback_primitives().unordered_effects


@dataclasses.dataclass(frozen=True)
class Slot:
    """One outlined callback: the primitive and what its lowering rule is called with."""
    primitive: object
    params: dict
    avals_in: tuple
    avals_out: tuple


class Slots(list):
    """The outlined callbacks of one export, by placeholder index."""


def export_rules(slots: Slots) -> tuple:
    """``jax.export``'s ``_override_lowering_rules``: each primitive of :data:`PRIMITIVES`
    lowers to a placeholder and is recorded in ``slots``."""
    def rule_for(prim):
        def rule(ctx, *args, **params):
            index = len(slots)
            slots.append(Slot(prim, params, tuple(ctx.avals_in), tuple(ctx.avals_out)))
            types = [compat.aval_to_ir_type(ctx.module_context, a) for a in ctx.avals_out]
            op = compat.custom_call(PLACEHOLDER, result_types=types, operands=list(args),
                                  backend_config=str(index), has_side_effect=True,
                                  api_version=1)
            return list(op.results)
        return rule
    return tuple((p, rule_for(p)) for p in PRIMITIVES)


def top_level_symbols(module) -> set[str]:
    """The symbol names of ``module``'s top-level ops (taken before inlining: what
    :func:`reinject` must leave alone)."""
    return {n for n in map(_symbol, module.body.operations) if n is not None}


def _symbol(op) -> str | None:
    return ir.StringAttr(op.attributes["sym_name"]).value if "sym_name" in op.attributes else None


def reinject(ctx, slots: Slots, before: set[str]) -> int:
    """Replace the placeholders in the functions added to ``ctx``'s module since ``before``
    (:func:`top_level_symbols`) by what the kept primitives' lowering rules emit in ``ctx``
    (an override of the caller's lowering first: a module being exported itself outlines them
    again, into its own slots). Returns how many were replaced."""
    module = ctx.module_context.module
    found = []
    for top in module.body.operations:
        name = _symbol(top)
        if name is not None and name not in before:
            hir.walk(top, lambda op: found.append(op) if _is_placeholder(op) else None)
    platform = ctx.module_context.platforms[0]
    for op in found:
        index = int(ir.StringAttr(op.attributes["backend_config"]).value)
        if index >= len(slots):
            raise hir.IRError(f"internal: host callback placeholder {index} of {len(slots)} "
                              f"at {hir.op_location(op)}")
        slot = slots[index]
        rule = _rule(ctx, slot.primitive, platform)
        sub = ctx.replace(primitive=slot.primitive, avals_in=slot.avals_in,
                          avals_out=slot.avals_out)
        with ir.InsertionPoint(op), op.location:
            results = rule(sub, *op.operands, **slot.params)
        results = [r for v in (results or ()) for r in (v if isinstance(v, (list, tuple)) else [v])]
        if len(results) != len(op.results):
            raise hir.IRError(f"internal: {slot.primitive} lowered to {len(results)} results, "
                              f"its placeholder has {len(op.results)}")
        for old, new in zip(op.results, results):
            old.replace_all_uses_with(new)
        hir.safe_erase(op)
    return len(found)


def _is_placeholder(op) -> bool:
    return (op.name == "stablehlo.custom_call"
            and ir.StringAttr(op.attributes["call_target_name"]).value == PLACEHOLDER)


def _rule(ctx, prim, platform: str):
    return compat.lowering_rule(ctx.module_context, prim, platform)
