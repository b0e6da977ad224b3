"""``buffer-aliasing``: liveness, a memory plan, and output<->argument aliasing for donations.

Rewrites: for every ``@main`` argument the caller donates (``PassContext.donated_args``,
``hlofuse.optimize(..., donated_args=...)``, ``hlofuse.jit(..., donate_argnums=...)``), the
argument gets ``tf.aliasing_output = j`` for one output ``j`` of identical shape and element
type that no other argument aliases yet (XLA then writes that output into the donated buffer).
Outputs computed in place from the argument (``dynamic_update_slice(arg, ...)``, ``arg + y``,
the argument itself) are preferred, then the first free output in order (as ``jax.jit`` does).
Aliases already present in the module (``tf.aliasing_output``) are kept and reported.

**Donation auditor**: a donation that cannot be used (no output of that type, all such outputs
already taken, dynamic shape, index out of range) raises a :class:`DonationWarning` naming the
argument and the reason, and the same text goes to ``report.notes``. Silent donation failures
are what users complain about; here they are loud. The other way round, arguments the caller
did not donate whose type matches an output no argument aliases (a training step's parameters
and optimizer state, called without ``donate_argnums``) are named in one report note with the
bytes donating them would save (option ``advise_bytes``: from 1 MiB).

**Memory plan** (estimate, recorded in ``report.memory`` and the pass statistics): liveness of
every top-level value of ``@main`` (an op result lives from its op to its last top-level user;
values used in nested regions count at the enclosing op; outputs live to the end; arguments are
caller-owned and live throughout; constants are program data and not counted), and the peak
of live bytes without aliasing ("before") and with the chosen aliases and in-place kernels
("after": an aliased output occupies its argument's buffer, an in-place kernel's output its
dying input's buffer).
``report.aliases`` lists which outputs alias which arguments.

**In-place kernels** (gpu/tpu): an elementwise Pallas kernel whose input is a temporary that
dies at the kernel, with the output's shape and dtype, gets ``output_operand_aliases`` on its
custom call (what ``pallas_call(input_output_aliases=...)`` emits), so XLA reuses the input's
buffer; see :func:`in_place_kernels`. On cpu kernels run in interpret mode (plain StableHLO) and
XLA's own buffer assignment already reuses dead buffers.

Preconditions: ``@main`` with static shapes (others are skipped by the auditor with a reason).
Invariant: results unchanged (XLA copies when an aliased buffer is still needed); the module
verifies; rerunning the pass changes nothing (existing aliases are kept, none are added twice).
"""

from __future__ import annotations

import dataclasses
import re
import warnings

from jaxlib.mlir import ir

from hlofuse.core import ir as hir
from hlofuse.core.pipeline import Pass
from hlofuse.passes import graph_util as gu

ALIAS_ATTR = "tf.aliasing_output"
DONOR_ATTR = "jax.buffer_donor"
# ops whose result is naturally computed in the buffer of their first operand
IN_PLACE_OPS = {"stablehlo.dynamic_update_slice", "stablehlo.scatter", "stablehlo.add",
                "stablehlo.subtract", "stablehlo.multiply", "stablehlo.divide",
                "stablehlo.maximum", "stablehlo.minimum", "stablehlo.select", "stablehlo.convert"}


# in-place kernels: custom calls of Pallas kernels, and the kernel families whose every grid
# step reads an input block before writing the same output block
IN_PLACE_TARGETS = ("__gpu$xla.gpu.triton", "tpu_custom_call")
IN_PLACE_FAMILIES = ("hlofuse_elementwise_",)


class DonationWarning(UserWarning):
    """A donated argument could not be aliased to any output (its buffer is not reused)."""


@dataclasses.dataclass
class MemoryPlan:
    peak_bytes: int
    peak_at: str          # the op at which the peak occurs
    argument_bytes: int
    output_bytes: int
    alias_bytes: int
    # the largest values live at the peak: (bytes, type, op name, source location), largest first
    live_at_peak: tuple = ()


def _arg_attrs(func) -> list[dict]:
    n = len(func.regions[0].blocks[0].arguments)
    if "arg_attrs" not in func.attributes:
        return [{} for _ in range(n)]
    arr = ir.ArrayAttr(func.attributes["arg_attrs"])
    out = []
    for a in arr:
        d = ir.DictAttr(a)
        out.append({d[i].name: d[i].attr for i in range(len(d))})
    return out


def _set_arg_attrs(func, attrs: list[dict]) -> None:
    func.attributes["arg_attrs"] = ir.ArrayAttr.get([ir.DictAttr.get(d) for d in attrs])


def arg_name(arg: ir.Value, index: int) -> str:
    m = re.search(r'loc\("([^"]+)"', str(arg.location))
    t = gu.info(arg)
    ty = f"{t.dtype}[{','.join(map(str, t.shape))}]" if t else str(arg.type)
    return f"argument {index}" + (f" ('{m.group(1)}')" if m else "") + f" of type {ty}"


def donation_candidates(args, outs, aliases: dict[int, int], donated: set) -> tuple[list, int]:
    """Arguments the caller did not donate that could give their buffer to an output: one per
    output of identical static type that no argument aliases (in order, as the donation pass
    would pair them). Returns ``(argument indices, their bytes)``."""
    free = [j for j in range(len(outs)) if j not in aliases]
    taken: set = set()
    picked, nbytes = [], 0
    for i, a in enumerate(args):
        t = gu.info(a)
        if i in donated or i in aliases.values() or t is None or not t.nbytes:
            continue
        j = next((j for j in free if j not in taken and outs[j].type == a.type), None)
        if j is not None:
            taken.add(j)
            picked.append(i)
            nbytes += t.nbytes
    return picked, nbytes


def memory_plan(func, aliases: dict[int, int], in_place: frozenset = frozenset(),
                top: int = 8) -> MemoryPlan:
    """Peak live bytes of ``func``'s body, with ``aliases`` (output index -> argument index);
    ops in ``in_place`` (op keys) write their result into an operand that dies there. ``top``:
    how many of the largest values live at the peak to list."""
    block = func.regions[0].blocks[0]
    ops = hir.block_ops(block)
    pos = {gu.op_key(op): i for i, op in enumerate(ops)}
    n = len(ops)
    args = list(block.arguments)
    arg_bytes = sum(gu.info(a).nbytes for a in args if gu.info(a))
    ret = ops[-1]
    outs = list(ret.operands)
    aliased_out_values = set()
    for j, i in aliases.items():
        if 0 <= j < len(outs):
            aliased_out_values.add(j)
    out_bytes = sum(gu.info(v).nbytes for v in outs if gu.info(v))
    alias_bytes = sum(gu.info(outs[j]).nbytes for j in aliased_out_values if gu.info(outs[j]))
    # bytes that become live at op i and die after op k
    delta = [0] * (n + 2)
    spans = []   # (start, end, bytes, value) of every buffer, for what is live at the peak
    for i, op in enumerate(ops[:-1]):
        if op.name == "stablehlo.constant":
            continue  # program data (read-only literals), not buffers the plan allocates
        for r in op.results:
            t = gu.info(r)
            if t is None:
                continue
            end = i
            for u in hir.users(r):
                end = max(end, pos.get(gu.op_key(hir.ancestor_in(u, block)), i))
            size = t.nbytes
            returned = [j for j, v in enumerate(outs) if v == r]
            if returned:
                end = n
                if all(j in aliased_out_values for j in returned):
                    size = 0  # lives in the donated argument's buffer
            start = i + 1 if gu.op_key(op) in in_place else i  # shares the dying operand's buffer
            delta[start] += size
            delta[end + 1] -= size
            if size:
                spans.append((start, end, size, r, op))
    live, peak, peak_i = arg_bytes, arg_bytes, 0
    for i in range(n):
        live += delta[i]
        if live > peak:
            peak, peak_i = live, i
    at_peak = sorted((s for s in spans if s[0] <= peak_i <= s[1]), key=lambda s: -s[2])[:top]
    live_at_peak = tuple((size, _type_text(gu.info(r)), op.name, hir.op_location(op))
                         for _, _, size, r, op in at_peak)
    return MemoryPlan(peak, ops[peak_i].name if ops else "", arg_bytes, out_bytes, alias_bytes,
                      live_at_peak)


def _type_text(t) -> str:
    return f"{t.dtype}[{','.join(map(str, t.shape))}]" if t else "?"


def _kernel_name_matches(cc) -> bool:
    for key in ("mhlo.backend_config", "kernel_name", "backend_config"):
        if key in cc.attributes and any(f in str(cc.attributes[key]) for f in IN_PLACE_FAMILIES):
            return True
    return False


def in_place_kernels(module, func) -> tuple[list[str], list[int]]:
    """Let elementwise Pallas kernels write into an input that dies at the kernel.

    For every call in ``@main`` of a kernel function (one Triton / Mosaic custom call of an
    in-place-safe family, single result, one call site) whose operand is a temporary of ``@main``
    used only by that call and reaching the custom call through bitcast reshapes only, with the
    result's type: set ``output_operand_aliases`` on the custom call — exactly what
    ``pallas_call(input_output_aliases={m: 0})`` emits. Safe for elementwise kernels: each grid
    step reads its input block before writing the same block of the output. Returns messages
    and the op keys of the calls made in place.
    """
    table = ir.SymbolTable(module.operation)
    main_block = func.regions[0].blocks[0]
    calls = [op for op in hir.all_ops(module) if op.name == "func.call"]
    sites: dict = {}
    for c in calls:
        sites.setdefault(ir.FlatSymbolRefAttr(c.attributes["callee"]).value, []).append(c)
    done, keys = [], []
    for call in hir.block_ops(main_block):
        if call.name != "func.call":
            continue
        name = ir.FlatSymbolRefAttr(call.attributes["callee"]).value
        if len(sites.get(name, ())) != 1:
            continue
        callee = table[name]
        body = callee.regions[0].blocks[0]
        ccs = [o for o in hir.block_ops(body) if o.name == "stablehlo.custom_call"]
        if len(ccs) != 1:
            continue
        cc = ccs[0]
        target = ir.StringAttr(cc.attributes["call_target_name"]).value
        if target not in IN_PLACE_TARGETS or "output_operand_aliases" in cc.attributes \
                or len(cc.results) != 1 or not _kernel_name_matches(cc):
            continue
        for k, v in enumerate(call.operands):
            if hir.defining_op(v) is None or gu.n_uses(v) != 1:
                continue  # arguments are caller-owned; live values are still needed
            cur = body.arguments[k]
            while gu.n_uses(cur) == 1 and hir.users(cur)[0].name == "stablehlo.reshape":
                cur = hir.users(cur)[0].results[0]
            if gu.n_uses(cur) != 1 or hir.users(cur)[0] != cc or cur.type != cc.results[0].type:
                continue
            m = [i for i, o in enumerate(cc.operands) if o == cur][0]
            cc.attributes["output_operand_aliases"] = ir.ArrayAttr.get([ir.Attribute.parse(
                f"#stablehlo.output_operand_alias<output_tuple_indices = [], operand_index = {m}, "
                f"operand_tuple_indices = []>")])
            done.append(f"{name} writes its output into operand {m}")
            keys.append(gu.op_key(call))
            break
    return done, keys


def _prefer(outs, arg) -> list[int]:
    """Output indices computed in place from ``arg`` (returned as-is or via an in-place op)."""
    out = []
    for j, v in enumerate(outs):
        d = hir.defining_op(v)
        if v == arg or (d is not None and d.name in IN_PLACE_OPS and len(d.operands) and
                        any(o == arg for o in d.operands)):
            out.append(j)
    return out


class BufferAliasing(Pass):
    """See the module docstring."""
    name = "buffer-aliasing"

    @dataclasses.dataclass(frozen=True)
    class Options:
        # False: an unusable donation is a report note only, no DonationWarning (the caller
        # donated every array on purpose: hlofuse.filter_jit(donate='all'))
        warn_unusable: bool = True
        # the report advises donate_argnums when at least this many bytes could be reused
        advise_bytes: int = 1 << 20

    def run(self, module, ctx):
        func = hir.main_func(module)
        block = func.regions[0].blocks[0]
        args = list(block.arguments)
        outs = list(hir.block_ops(block)[-1].operands)
        with module.context, ir.Location.unknown():
            attrs = _arg_attrs(func)
            aliases: dict[int, int] = {}   # output -> argument
            for i, a in enumerate(attrs):
                if ALIAS_ATTR in a:
                    aliases[ir.IntegerAttr(a[ALIAS_ATTR]).value] = i
            before = memory_plan(func, {})
            added, failed = 0, 0
            for i in sorted(set(ctx.donated_args)):
                if not 0 <= i < len(args):
                    self._warn(ctx, f"donated argument index {i} is out of range: @main has "
                                    f"{len(args)} arguments")
                    failed += 1
                    continue
                if ALIAS_ATTR in attrs[i]:
                    continue
                arg = args[i]
                name = arg_name(arg, i)
                if gu.info(arg) is None:
                    self._warn(ctx, f"donation of {name} cannot be used: dynamic or unranked "
                                    "shape")
                    failed += 1
                    continue
                same = [j for j, v in enumerate(outs) if v.type == arg.type]
                free = [j for j in same if j not in aliases]
                if not free:
                    if not same:
                        types = ", ".join(sorted({gu.info(v).dtype + str(list(gu.info(v).shape))
                                                  for v in outs if gu.info(v)})) or "none"
                        why = f"no output has the same shape and dtype (outputs: {types})"
                    else:
                        taken = ", ".join(f"output {j} by argument {aliases[j]}" for j in same)
                        why = f"every output of that type is already aliased ({taken})"
                    self._warn(ctx, f"donation of {name} cannot be used: {why}; its buffer is "
                                    f"not reused")
                    failed += 1
                    continue
                pref = [j for j in _prefer(outs, arg) if j in free]
                j = pref[0] if pref else free[0]
                attrs[i] = dict(attrs[i])
                attrs[i][ALIAS_ATTR] = ir.IntegerAttr.get(ir.IntegerType.get_signless(32), j)
                attrs[i].pop(DONOR_ATTR, None)
                aliases[j] = i
                added += 1
            if added:
                _set_arg_attrs(func, attrs)
            in_place, in_place_calls = in_place_kernels(module, func)
            after = memory_plan(func, aliases, frozenset(in_place_calls))
        report = ctx.report
        rows = []
        for j, i in sorted(aliases.items()):
            t = gu.info(outs[j])
            nbytes = t.nbytes if t else 0
            rows.append({"output": j, "argument": i, "bytes": nbytes,
                         "type": f"{t.dtype}[{','.join(map(str, t.shape))}]" if t else "",
                         "name": arg_name(args[i], i)})
        memory = {"peak_live_bytes_before": before.peak_bytes,
                  "peak_live_bytes_after": after.peak_bytes, "peak_at": after.peak_at,
                  "argument_bytes": after.argument_bytes, "output_bytes": after.output_bytes,
                  "alias_bytes": after.alias_bytes}
        if hasattr(report, "aliases"):
            report.aliases = rows
        if hasattr(report, "memory"):
            report.memory = memory
        for msg in in_place:
            report.note(f"buffer-aliasing: in-place kernel: {msg}")
        could, could_bytes = donation_candidates(args, outs, aliases, set(ctx.donated_args))
        if could and could_bytes >= self.options.advise_bytes:
            names = "; ".join(arg_name(args[i], i) for i in could[:4]) + \
                (f"; and {len(could) - 4} more" if len(could) > 4 else "")
            report.note(f"buffer-aliasing: {len(could)} argument(s) not donated have the shape "
                        f"and dtype of an output no argument aliases ({could_bytes / 2**20:.1f} "
                        f"MiB: {names}): donating them (donate_argnums) would let XLA write "
                        f"those outputs into their buffers, {could_bytes / 2**20:.1f} MiB less "
                        f"at the peak, when the caller no longer needs them")
        return {"aliases_added": added, "aliases": len(aliases), "donations_unusable": failed,
                "in_place_kernels": len(in_place), "donation_candidate_bytes": could_bytes,
                **{k: v for k, v in memory.items() if k != "peak_at"}}

    def _warn(self, ctx, msg: str) -> None:
        if self.options.warn_unusable:
            warnings.warn(msg, DonationWarning, stacklevel=2)
        ctx.report.note(msg)
