"""``kernelize``: replace each outlined region with a Pallas kernel lowered for the target.

For every ``func.call`` of a function carrying ``hlofuse.kind``, the kernel family for that kind
builds a ``pallas_call`` wrapper, lowers it for the target (cpu: interpret mode, plain StableHLO;
gpu: Triton; tpu: Mosaic), imports the lowered functions into the module and points the call at
the kernel. Any failure (unsupported op, lowering error) leaves the region to XLA — the call to
the plain outlined function, which XLA inlines — and the report says why; failures other than
``NotImplementedError`` (unsupported-but-legal) also warn, naming the region and its source line.
Region functions left to XLA are marked ``hlofuse.xla`` and kernel functions are named
``hlofuse_k<id>_*``, so running the pipeline again over its output changes nothing.
Kernel names: each kernel is named after its region's kind and the user's source line, from
its ops' locations (:func:`kernel_name`: ``hlofuse_attention_model_py_42``,
``hlofuse_reduction_softmax_model_py_43``; a second such kernel on that line ``..._py_42_1``;
``..._region<id>`` without a location). Kernels are built once per region body
(:func:`lower_region`'s cache, under the build's own name ``hlofuse_<family>_<digest>``) and
renamed per region in the lowered text before it is imported
(:func:`hlofuse.kernels.naming.rename`): in the kernel ops' name stacks (XLA's ``op_name``
metadata), Triton's kernel function and Mosaic's ``kernel_name`` (what GPU and TPU profiles
show), the ``hlofuse.kernel`` attribute, the report's ``region.kernel`` and the ``kernel``
argument of the ``hlofuse/kernel <kind>`` trace event.
It also records the tiling report (``Report.tiling``): per matmul and convolution, its GEMM
shape against the target's native tile (:func:`~hlofuse.kernels.tiling.native_tile`), the
padding waste in percent and the blocks of the kernel that computes it.
Unmeasured regions on gpu/tpu (option ``unmeasured``): XLA:GPU and XLA:TPU fuse elementwise
chains, row reductions (softmax, layernorm), BatchNorm chains and matmul epilogues themselves
(loop and input fusions, cuBLASLt/Triton GEMM epilogues, TPU output fusions). A kernel that
replaces one of those was never timed against them, so by default (``"auto"``) such a region stays
with XLA on gpu/tpu ("unmeasured: kept XLA (XLA fuses this)") and only what XLA cannot do itself
becomes a kernel unmeasured (:func:`unmeasured_reasons`: flash attention forward and
backward, int8 dots with their epilogues). ``hlofuse.jit`` builds every kernel (``"kernel"``),
measures them on the device and runs each where it won (:mod:`hlofuse.runtime.program`). On cpu every
region the cost model picks is a kernel (the cpu kernels were measured; decisions keep measuring).
Preconditions: regions outlined by a fusion pass. Invariant: results within the tolerance table
(kernels compute the same ops; transcendental approximations can differ per backend).
"""

from __future__ import annotations

import dataclasses
import hashlib
import os
import re
import threading
import warnings

from jaxlib.mlir import ir

from hlofuse.core import ir as hir
from hlofuse.core.pipeline import Pass, trace
from hlofuse.kernels import FAMILIES
from hlofuse.kernels.common import func_avals
from hlofuse.kernels import lowering
from hlofuse.kernels import naming
from hlofuse.core.target import Target
from hlofuse.kernels.support import matmul_dims
from hlofuse.kernels.tiling import native_tile, padding_waste
from hlofuse.passes.fusion.outline import KERNEL_PREFIX, KIND_ATTR, REGION_ATTR, XLA_ATTR, program_blocks
from hlofuse.core.report import HlofuseWarning
from hlofuse.passes import sharding as shd
from hlofuse.passes.kernel_table import KERNEL_INFO_ATTR, ORIGINAL_ATTR, kernel_funcs

_CACHE: dict[tuple, tuple[str, str, str]] = {}
# KERNEL_INFO_ATTR on a kernel's entry function: "kind|region|name|blocks"; ORIGINAL_ATTR beside
# it: the region's original function (hlofuse.runtime.verify checks the kernel against it and
# rolls back to it)
_CACHE_LOCK = threading.Lock()


def body_text(fn_op) -> str:
    """An outlined function's body ops, printed without source locations (what
    :func:`region_hash` and :func:`lower_region` key on; printing is a visible part of a first
    call, so kernelize prints each body once for both)."""
    return hir.ops_text(fn_op.regions[0].blocks[0].operations)


def region_hash(fn_op, kind: str, target: Target, body: str | None = None) -> str:
    """Identity of a region for measured decisions (``region.extra['region_hash']``): its
    kind, the target (kind and chip) and its outlined function's type and body without source
    locations, so the same region in another module or process has the same hash.
    ``body``: :func:`body_text` of ``fn_op`` when the caller has it."""
    target = Target.of(target)
    body = body_text(fn_op) if body is None else body
    sig = str(fn_op.attributes["function_type"])
    text = f"{kind}|{target.kind}|{target.chip_name}|{sig}|{body}"
    return hashlib.sha256(text.encode()).hexdigest()[:24]


def lower_region(fn_op, kind: str, target: Target, body: str | None = None,
                 settings: tuple = ()) -> tuple[str, str, str]:
    """(kernel module text, kernel name, block description), cached by region body + target
    + ``settings`` (``(name, value)`` pairs passed to the family's build, e.g.
    ``budget_scale``: :func:`build_settings`). ``body``: :func:`body_text` of ``fn_op``
    when the caller has it."""
    target = Target.of(target)
    family = FAMILIES.get(kind)
    if family is None:
        raise NotImplementedError(f"no kernel family for region kind '{kind}'")
    body = body_text(fn_op) if body is None else body
    sig = str(fn_op.attributes["function_type"])
    # tiles are per chip: the key holds the target's chip
    key = (target.kind, target.chip_name, kind, hashlib.sha1((sig + body).encode()).hexdigest(),
           tuple(settings))
    with _CACHE_LOCK:
        if key in _CACHE:
            return _CACHE[key]
    spec = family.spec_from_func(fn_op)
    fn = family.build(spec, target, **dict(settings))
    text = lowering.lower_to_text(fn, func_avals(fn_op), target)
    result = (text, fn.kernel_name, str(fn.blocks))
    with _CACHE_LOCK:
        _CACHE[key] = result
    return result


def build_settings(kind: str, target: Target, budget_scale: float, rows: str = "auto") -> tuple:
    """What a family's build gets beyond the spec and target, from kernelize's options: the cpu
    attention loops' step-budget scale (``cpu_attention_budget_scale``) where it is not 1, and
    the forward's whole rows forced on or off (``cpu_attention_rows``) where not "auto"."""
    if not (target.is_cpu and kind in _ATTENTION_KINDS):
        return ()
    out = ()
    if budget_scale != 1:
        out += (("budget_scale", float(budget_scale)),)
    if rows != "auto" and kind in _ATTENTION_FWD_KINDS:
        out += (("whole_rows", rows == "whole"),)
    return out


#: the reason of a region left to XLA on gpu/tpu because nothing measured its kernel there
XLA_FUSES = "unmeasured: kept XLA (XLA fuses this)"
UNMEASURED_POLICIES = ("auto", "xla", "kernel")
_ATTENTION_KINDS = ("attention", "attention_fwd_lse", "attention_bwd")
_ATTENTION_FWD_KINDS = ("attention", "attention_fwd_lse")
#: kernelize's ``cpu_attention_rows``: the cpu attention forward in whole rows where it can
#: ("auto": where this release's XLA:CPU fuses them, kernels/attention/blocks.py:
#: CPU_ROW_BUDGET), always where it can ("whole"), or never ("blocks": key blocks)
CPU_ATTENTION_ROWS = ("auto", "whole", "blocks")


#: tpu: flash attention kernels run unmeasured only from this many keys. Compiled for TPU v5e
#: (bench --memory, XLA's memory_analysis), training steps with Mosaic attention kernels needed
#: more memory than XLA's own attention at S=512 (BERT-base, 1.27x) and S=197 (ViT-B/16,
#: 1.63x; 0.999x with the kernels left to XLA) and less at S=1024 (GPT-2-small, 0.77x); on
#: H100 the Triton kernels needed less at every length (0.39-0.81x)
TPU_UNMEASURED_MIN_KEYS = 1024


def unmeasured_reasons(kind: str, fn_op, target: Target | None = None
                       ) -> tuple[str | None, str | None]:
    """For a region nothing measured on the device yet: ``(why a kernel, None)`` when it is
    worth a kernel on gpu/tpu unmeasured, else ``(None, why XLA keeps it)``. Kernels are what
    XLA cannot do: it materializes attention's S x S scores (and their gradient) in device
    memory, and it runs an int8 dot's int32 result through a separate dequantization pass. On
    tpu, attention only from :data:`TPU_UNMEASURED_MIN_KEYS` keys."""
    if kind in _ATTENTION_KINDS:
        keys = _attention_keys(kind, fn_op) if target is not None and Target.of(target).is_tpu \
            else None
        if keys is not None and keys < TPU_UNMEASURED_MIN_KEYS:
            return None, (f"unmeasured: kept XLA (tpu attention over {keys} keys, fewer than "
                          f"{TPU_UNMEASURED_MIN_KEYS}: XLA's own needs less memory there)")
        return ("flash attention: XLA materializes the S x S scores"
                + (" and their gradient" if kind == "attention_bwd" else "")
                + " in device memory"), None
    if kind == "matmul_epilogue" and _has_integer_dot(fn_op):
        return "int8 dot: XLA writes its int32 product out before the dequantizing epilogue", None
    return None, XLA_FUSES


def _attention_keys(kind: str, fn_op) -> int | None:
    """The key (softmax) length of an attention region, or None when its spec is not read."""
    try:
        spec = FAMILIES[kind].spec_from_func(fn_op)
    except Exception:  # noqa: BLE001 - kernel-building boundary: the build records what is wrong
        return None
    spec = getattr(spec, "fwd", spec)
    return dict(spec.label_sizes).get(spec.key)


def _has_integer_dot(fn_op) -> bool:
    for op in hir.all_ops(fn_op):
        if op.name in ("stablehlo.dot_general", "stablehlo.dot", "stablehlo.convolution"):
            t = hir.tensor_type_info(op.operands[0].type)
            if t is not None and t.dtype.lstrip("u").startswith("i"):
                return True
    return False


def unmeasured_policy(option: str, target: Target) -> str:
    """``"xla"`` or ``"kernel"``: what the ``unmeasured`` option means on ``target``
    (``"auto"``: ``"xla"`` on gpu/tpu, ``"kernel"`` on cpu)."""
    if option == "auto":
        return "kernel" if Target.of(target).is_cpu else "xla"
    return option


def leave_to_xla(fn_op, reason: str) -> None:
    """Mark an outlined region function as left to XLA, so later runs do not retry it."""
    with fn_op.context:
        fn_op.attributes[XLA_ATTR] = ir.StringAttr.get(reason)


def _unique_prefix(module, rid: int) -> str:
    """``hlofuse_k<rid>_``, or with a suffix when a module optimized before already has it."""
    names = [hir.func_name(f) for f in hir.funcs(module)]
    prefix, k = f"{KERNEL_PREFIX}{rid}_", 0
    while any(n.startswith(prefix) for n in names):
        k += 1
        prefix = f"{KERNEL_PREFIX}{rid}_{k}_"
    return prefix


# the spec digest that ends a kernel family's build name (hlofuse_reduction_softmax_<digest>)
_BUILD_DIGEST = re.compile(r"_[0-9a-f]{10}$")


def kernel_name(kind: str, fn_op, rid: int, built: str = "", taken=()) -> str:
    """The name of the kernel for region ``rid`` (outlined function ``fn_op``), built as
    ``built``: the build's name without its digest (``hlofuse_<kind>`` and the family's
    variant: ``hlofuse_attention_cpu``, ``hlofuse_reduction_softmax``), then the user's file
    and line, from the first of the region's ops whose location has a frame in the user's code
    (:func:`hlofuse.core.ir.user_frame`), sanitised to ``[A-Za-z0-9_]``:
    ``hlofuse_reduction_softmax_model_py_42``; ``..._region<rid>`` when none has. A name in
    ``taken`` (another such kernel on that line) gets ``_1``, ``_2``, ..."""
    prefix = f"hlofuse_{kind}"
    if built.startswith(prefix) and _BUILD_DIGEST.search(built):
        prefix = _BUILD_DIGEST.sub("", built)
    base = f"{prefix}_region{rid}"
    for op in hir.all_ops(fn_op):
        frame = hir.user_frame(op.location)
        if frame is not None:
            file = re.sub(r"[^A-Za-z0-9]+", "_", os.path.basename(frame[0])).strip("_")[-64:]
            base = f"{prefix}_{file or 'line'}_{frame[1]}"
            break
    name, k = base, 0
    while name in taken:
        k += 1
        name = f"{base}_{k}"
    return name


def _renamed(text: str, built: str, name: str) -> tuple[str, str]:
    """(kernel module text, kernel name): the lowered kernel renamed from its build's name to
    the region's; the build's name where it cannot be renamed everywhere."""
    try:
        return naming.rename(text, built, name), name
    except naming.RenameError:
        return text, built


def _short(e: Exception) -> str:
    msg = str(e).strip().splitlines()
    return f"{type(e).__name__}: {msg[0][:200] if msg else ''}"


def tiling_rows(module, ctx, table, calls) -> list:
    """(region id or None, row) per matmul/convolution of the program and of its regions (the
    tiling report; blocks are filled in once the regions are kernelized)."""
    found = [(None, op) for block in program_blocks(module) for op in hir.block_ops(block)]
    for call in calls:
        fn_op = table[ir.FlatSymbolRefAttr(call.attributes["callee"]).value]
        if KIND_ATTR in fn_op.attributes and REGION_ATTR in fn_op.attributes:
            rid = ir.IntegerAttr(fn_op.attributes[REGION_ATTR]).value
            found += [(rid, op) for op in hir.block_ops(fn_op.regions[0].blocks[0])]
    rows = []
    for rid, op in found:
        dims = matmul_dims(op)
        if dims is None:
            continue
        tile = native_tile(ctx.target, max(1, hir.dtype_bytes(dims["dtype"])))
        rows.append((rid, dict(op=op.name.split(".", 1)[-1], where=hir.op_location(op), region=rid,
                               tile=list(tile) if tile else None,
                               waste_pct=padding_waste(dims["m"], dims["n"], dims["k"], tile), **dims)))
    return rows


def _fill_tiling(ctx, rows) -> None:
    for rid, row in rows:
        if rid is not None and rid < len(ctx.report.regions) and ctx.report.region(rid).kernel:
            row["blocks"] = ctx.report.region(rid).block
        ctx.report.tiling.append(row)


class Kernelize(Pass):
    name = "kernelize"

    @dataclasses.dataclass(frozen=True)
    class Options:
        no_kernels: bool = False  # leave every region to XLA (regions are still outlined)
        # regions no measurement on the device decided yet: "auto" (gpu/tpu: only kernels
        # XLA cannot match, see unmeasured_reasons; cpu: every region), "xla" (that rule
        # on every target), "kernel" (every region the cost model picks: what is measured)
        unmeasured: str = "auto"
        # cpu attention loops: their step budgets (kernels/attention/blocks.py: cpu_budgets,
        # from the host's L2) times this; autotune measures 2 against 1 where the two block
        # sizes ran close (hlofuse.runtime.autotune.KERNEL_VARIANTS)
        cpu_attention_budget_scale: float = 1.0
        # cpu attention forward: whole rows or key blocks (CPU_ATTENTION_ROWS); autotune
        # measures "blocks" where "auto" chose whole rows (KERNEL_VARIANTS: attn-key-blocks)
        cpu_attention_rows: str = "auto"

        def __post_init__(self):
            if self.unmeasured not in UNMEASURED_POLICIES:
                raise ValueError(f"unmeasured={self.unmeasured!r}: expected one of "
                                 f"{', '.join(UNMEASURED_POLICIES)}")
            if self.cpu_attention_rows not in CPU_ATTENTION_ROWS:
                raise ValueError(f"cpu_attention_rows={self.cpu_attention_rows!r}: expected one "
                                 f"of {', '.join(CPU_ATTENTION_ROWS)}")
            if not 1 / 16 <= self.cpu_attention_budget_scale <= 16:
                raise ValueError(f"cpu_attention_budget_scale={self.cpu_attention_budget_scale!r}"
                                 f": expected a factor from 1/16 to 16")

    def run(self, module, ctx):
        table = ir.SymbolTable(module.operation)
        calls = [op for op in hir.all_ops(module) if op.name == "func.call"]
        rows = tiling_rows(module, ctx, table, calls)
        n_kernels = n_failed = n_per_shard = n_not_local = n_unmeasured = 0
        policy = unmeasured_policy(self.options.unmeasured, ctx.target)
        # per-shard kernels need every op's sharding: without propagate-shardings, kernels
        # are built for the whole arrays (XLA partitions cpu ones; see runtime for gpu/tpu)
        mesh = shd.mesh_of(module) if shd.is_propagated(module) else None
        if mesh is not None:
            shd.annotate_calls(module, calls, table)
        several_meshes = shd.several_meshes(module)
        # kernel names in use (a module optimized before keeps its kernels' names)
        names = {k.kernel for k in kernel_funcs(module).values()}
        for call in calls:
            callee = ir.FlatSymbolRefAttr(call.attributes["callee"]).value
            fn_op = table[callee]
            if KIND_ATTR not in fn_op.attributes or XLA_ATTR in fn_op.attributes:
                continue  # not a region, or one left to XLA by an earlier run (idempotence)
            kind = ir.StringAttr(fn_op.attributes[KIND_ATTR]).value
            rid = ir.IntegerAttr(fn_op.attributes[REGION_ATTR]).value
            if rid >= len(ctx.report.regions) or ctx.report.region(rid).kind != kind:
                continue  # outlined by an earlier run whose report we do not have
            region = ctx.report.region(rid)
            if self.options.no_kernels:
                region.reason = "kernels disabled by option"
                leave_to_xla(fn_op, region.reason)
                continue
            if not ctx.target.is_cpu and several_meshes:
                # no per-shard kernels there (shd.is_sharded_module), and XLA would gather a
                # whole-array Pallas kernel's operands onto every device
                region.reason = ("a program on several meshes: no per-shard kernel, and a "
                                 "whole-array kernel would gather its operands on every device")
                leave_to_xla(fn_op, region.reason)
                continue
            body = body_text(fn_op)
            region.extra["region_hash"] = region_hash(fn_op, kind, ctx.target, body)
            # whether XLA fuses this itself, recorded on every build: a runtime that built all
            # kernels ("kernel") to measure them holds these back until measured
            why, xla_why = unmeasured_reasons(kind, fn_op, ctx.target)
            region.extra["xla_fuses"] = why is None
            if policy == "xla" and why is None:
                region.reason = xla_why
                leave_to_xla(fn_op, region.reason)
                n_unmeasured += 1
                continue
            if why is not None and (policy == "xla" or not ctx.target.is_cpu):
                # the report says why a kernel runs before it was measured (gpu/tpu)
                region.extra["unmeasured"] = f"kernel ({why})"
            # (every pass's output verified: printing need not verify the function again)
            original = fn_op.operation.get_asm(enable_debug_info=True, assume_verified=True)
            per_shard = None
            manual = _enclosing_manual(call)
            if manual is not None and not manual[1]:
                region.reason = (f"inside a shard_map body that is manual over "
                                 f"{', '.join(manual[0]) or 'no axes'} only: the free axes "
                                 f"would partition the kernel")
                leave_to_xla(fn_op, region.reason)
                n_not_local += 1
                continue
            if mesh is not None and manual is None:
                try:
                    per_shard = _per_shard_plan(call, fn_op, mesh, module.context)
                except shd.NotShardLocal as e:
                    region.reason = f"not shard-local in this sharded program: {e}"
                    leave_to_xla(fn_op, region.reason)
                    n_not_local += 1
                    continue
            try:
                with trace(f"kernel {kind}", region=rid, at=", ".join(region.locations[:2]),
                           target=ctx.target.kind) as event:
                    if per_shard is not None:
                        local_mod = per_shard[0]
                        text, kname, blocks = lower_region(
                            hir.funcs(local_mod)[0], kind, ctx.target, None, build_settings(
                                kind, ctx.target, self.options.cpu_attention_budget_scale,
                                self.options.cpu_attention_rows))
                    else:
                        text, kname, blocks = lower_region(
                            fn_op, kind, ctx.target, body, build_settings(
                                kind, ctx.target, self.options.cpu_attention_budget_scale,
                                self.options.cpu_attention_rows))
                    # cached per body: renamed for this region before it is parsed
                    text, kname = _renamed(text, kname,
                                           kernel_name(kind, fn_op, rid, kname, names))
                    if hasattr(event, "set_metadata"):   # jax.profiler.TraceAnnotation
                        event.set_metadata(kernel=kname)
                kmod = hir.parse(text, module.context, source=f"kernel for region {rid}")
                # the cleanups later runs apply to the whole module, applied now (idempotence)
                hir.run_upstream_passes(kmod, "builtin.module(canonicalize,cse,canonicalize)")
                mapping = hir.import_funcs(module, kmod, _unique_prefix(module, rid))
                target_fn = mapping["main"]
                if per_shard is not None:
                    _, args_s, res_s = per_shard
                    ft, kft = hir.function_type(fn_op), hir.function_type(
                        ir.SymbolTable(module.operation)[mapping["main"]])
                    target_fn = shd.manual_wrapper(
                        module, mapping["main"] + "_per_shard", mapping["main"], args_s, res_s,
                        list(ft.inputs), list(ft.results), list(kft.inputs), list(kft.results))
                    region.extra["per_shard"] = ", ".join(
                        _spec_text(s) for s in args_s) + " -> " + ", ".join(
                        _spec_text(s) for s in res_s)
                    n_per_shard += 1
                with module.context:
                    call.attributes["callee"] = ir.FlatSymbolRefAttr.get(target_fn)
                    # what a compile check of the module alone (hlofuse.runtime.aot) reports per kernel
                    kfn = ir.SymbolTable(module.operation)[mapping["main"]]
                    kfn.attributes[KERNEL_INFO_ATTR] = ir.StringAttr.get(
                        f"{kind}|{rid}|{kname}|{blocks}")
                    # the module keeps what it replaced (hlofuse.passes.kernel_table)
                    kfn.attributes[ORIGINAL_ATTR] = ir.StringAttr.get(original)
                region.kernel = kname
                names.add(kname)
                region.block = blocks
                n_kernels += 1
            except Exception as e:  # noqa: BLE001 - kernel-building boundary: XLA keeps it, says why
                region.reason = f"kernel build failed ({_short(e)})"
                leave_to_xla(fn_op, region.reason)
                n_failed += 1
                if ctx.strict:
                    raise
                if not isinstance(e, NotImplementedError):  # unsupported-but-legal: report only
                    where = ", ".join(region.locations[:3]) or "unknown location"
                    warnings.warn(f"hlofuse: region {rid} ({kind}, at {where}) left to XLA: "
                                  f"{region.reason}", HlofuseWarning, stacklevel=2)
        _fill_tiling(ctx, rows)
        stats = {"kernels": n_kernels, "left_to_xla": n_failed}
        if policy == "xla":
            stats["unmeasured_xla"] = n_unmeasured
        if mesh is not None:
            stats.update(per_shard=n_per_shard, not_shard_local=n_not_local)
        return stats


def _enclosing_manual(op):
    """(manual axes, all mesh axes manual?) of the innermost ``sdy.manual_computation`` (a
    shard_map body) holding ``op``, or None at the top level. A kernel in a body manual over
    every axis already runs per device (its values are per-device)."""
    parent = op.parent
    while parent is not None and parent.name != "func.func":
        if parent.name == "sdy.manual_computation":
            axes = re.findall(r'"([^"]+)"', str(parent.attributes["manual_axes"]))
            module_op = parent
            while module_op.parent is not None:
                module_op = module_op.parent
            mesh_axes = []
            for o in module_op.regions[0].blocks[0].operations:
                if o.operation.name == "sdy.mesh":
                    mesh_axes = re.findall(r'"([^"]+)"=(\d+)', str(o))
            free = [a for a, n in mesh_axes if a not in axes and int(n) > 1]
            return axes, not free
        parent = parent.parent
    return None


def _spec_text(s) -> str:
    return "P(" + ", ".join(("(" + ", ".join(repr(a) for a in ax) + ")" if len(ax) > 1
                             else repr(ax[0])) if ax else "None" for ax in s) + ")"


def _per_shard_plan(call, fn_op, mesh, context):
    """(module with the per-shard region function, input shardings, output shardings); a
    replicated region runs whole on every shard. Raises
    :class:`hlofuse.passes.sharding.NotShardLocal` when the region is not shard-local."""
    _, mesh_text, axes = mesh
    args_s = shd.slice_replicated_inputs(fn_op, [shd.input_sharding(v) for v in call.operands],
                                         axes)
    shard = shd.check_region(fn_op, args_s, axes)
    ret = hir.block_ops(fn_op.regions[0].blocks[0])[-1]
    res_s = []
    for v in ret.operands:
        s = shard.get(hir.value_key(v))
        if s is None or s == "*":
            raise shd.NotShardLocal("the sharding of a region output is not known")
        res_s.append(s)
    local = shd.local_function(fn_op, shard, args_s, res_s, axes, context, mesh_text)
    return local, args_s, res_s
