"""The one place that knows JAX's internals and what differs between the supported releases.

hlofuse supports jax/jaxlib 0.10.2 through 0.12.x (Python 3.11 with 0.10.2; jax 0.11 and later
need Python 3.12+). Every use of ``jax._src``, of jaxlib internals, and of behaviour that differs
between those releases goes through this module; ``tests/test_compat.py`` runs one named test
per entry below on both CI legs (oldest and newest), so the next JAX release shows up as a
failing named test rather than a crash inside a user's call. ``tests/test_layering.py`` fails
when any other file imports ``jax._src``.

Where a public API exists across the whole range it is used, and the entry says so; what stays
private has no public form in at least one supported release.

| entry | what hlofuse uses it for | jax 0.10.2 | jax 0.11 / 0.12 | public form |
|---|---|---|---|---|
| jaxpr_types | a traced function's closed jaxpr: isinstance, its consts and equations | ``ClosedJaxpr`` wraps a ``Jaxpr`` | merged (0.11.0): ``Jaxpr`` carries ``consts``, ``.jaxpr`` is itself, ``jax.extend.core.ClosedJaxpr`` is ``Jaxpr`` | ``jax.extend.core`` (both) |
| jaxpr_eval | evaluate/walk jaxprs: ``eval_jaxpr``, ``jaxpr_as_fun``, ``subjaxprs``, ``jaxprs_in_params``, ``Literal`` | same | same (sub-jaxprs carry their consts) | ``jax.core``, ``jax.extend.core`` (both) |
| jaxpr_rebuild | copies of a traced jaxpr's numpy constants and literals, sub-jaxprs included (``map_jaxpr_arrays``: ``JaxprEqn.replace``, ``Jaxpr.replace(eqns=)``, the legacy ``ClosedJaxpr(jaxpr, consts)``) | ``ClosedJaxpr`` of a ``Jaxpr`` | one ``Jaxpr`` with ``consts``; the legacy constructor still works; literals hold ``TypedNdArray`` (an ``ndarray``) | ``jax.extend.core`` types; ``replace`` stays private-by-convention |
| convert_constvars | a closed-over tracer becomes an input of a lifted program | private | same semantics; public only from 0.12 | ``jax.interpreters.partial_eval`` (0.12 only): kept private |
| trace_state | is this call outside every transformation (``trace_ctx.trace``, ``EvalTrace``) | ``jax.core.trace_ctx`` deprecated | ``jax.core.trace_ctx`` removed from ``jax.core`` | none |
| jaxpr_copy | copy a jaxpr's equations into the enclosing jit trace (``DynamicJaxprTrace``, ``source_info_util.current``; ``jaxpr_is_high``: not where it holds high primitives) | private trace, public tracer | same (lost ``process_call``/``cur_qdd``, unused) | ``DynamicJaxprTracer``, ``jax.extend.source_info_util`` (both); the trace stays private |
| trace_context | jax's tracing configuration as cache-key text (``config.trace_context``, ``AxisEnv``) | 46 entries | 51 entries (the key changes with the release: caches key on ``jax.__version__`` too) | none |
| fun_signature | ``static_argnums``/``static_argnames`` inferred as ``jax.jit`` does | private | same | none |
| manual_axis_type | shard_map bodies' avals (``ManualAxisType``) | private | gained ``unreduced_kind=`` | none |
| ir_context | a fresh MLIR context with JAX's dialects, never JAX's own (hazard H1) | ``mlir.make_ir_context()`` is fresh | ``make_ir_context()`` hands out a shared per-thread context (JAX lowers into it): use ``_create_ir_context()`` | none |
| lowering_rules | host-callback re-injection calls a primitive's registered lowering rule (``custom_call``, ``_lowerings``, override rules) | private | same | ``jax.interpreters.mlir`` for ``lower_fun``, ``register_lowering``, ``aval_to_ir_type`` (both) |
| inlined_func_call | inline a ``func.call`` mapping nested-region captures (jaxlib's ``_jax_mlir_ext``) | private | same | none |
| host_callback_primitives | outline ``pure_callback``/``io_callback``/``debug.callback``/``debug.print`` through ``jax.export`` | private | same | none |
| ad_batching | ``hlofuse_call``'s JVP, transpose and batching rules | public ``ad``; ``moveaxis``, ``not_mapped`` private | same | ``jax.interpreters.ad``/``batching`` (both) |
| checkify_rules | ``checkify`` of ``hlofuse_call``: the function's checks, through ``jax.jit``'s own rule (``checkify.error_checks``; the rule takes a ``CheckifyContext`` first in 0.12) | ``error_checks[pjit_p](error, enabled_errors, *vals, **params)`` | ``error_checks[jit_p](ctx, error, enabled_errors, ...)`` | none |
| apply_primitive | eager ``hlofuse_call`` | public | same | ``jax.interpreters.xla.apply_primitive`` (both) |
| meshes | the caller's concrete/abstract mesh, tracing under a program's own mesh, ``check_vma`` off, a value's ``manual_axis_type`` in a ``shard_map`` body | private (abstract-mesh context public) | same | ``jax.sharding.use_abstract_mesh``/``get_abstract_mesh`` (both); the rest none |
| abstract_mesh_auto | the one-device mesh kernels lower under (TPU/GPU abstract devices) | ``AbstractMesh`` axes default to ``Auto`` | default ``Explicit`` (0.12): pass ``AxisType.Auto`` | public |
| gpu_abstract_device | Pallas Triton lowering on a CPU host | lowers without a GPU device | needs an abstract GPU device (0.11.0), else ``RuntimeError: No supported GPU devices found`` | public (``AbstractDevice(platform="cuda")``) |
| triton_deprecation | Pallas Triton is deprecated (0.11.0) | silent | a ``DeprecationWarning`` (id ``jax-pallas-triton``) on every lowering: filtered where hlofuse lowers | n/a |
| mosaic_gpu_env | ``JAX_PALLAS_USE_MOSAIC_GPU=0`` in the deviceless compile workers | read (no ``compiler_params`` -> Mosaic GPU) | removed (no ``compiler_params`` -> Triton); hlofuse always passes Triton params | n/a |
| compilation_cache | hlofuse's own persistent XLA cache directory; every compile cached for a first call | private ``reset_cache``, ``_cache_checked``/``_cache_used``, thread-local min compile time | same; executables with host callbacks are cached too (0.11.0) | ``jax.experimental.compilation_cache.compilation_cache.reset_cache`` (both); the flags stay private |
| python_dispatch | tests: a tiered call must leave jit's Python dispatch path (``pjit._run_python_pjit``) | private | same | none |
| export_backend_init | skip the LAPACK initialisation ``Exported.call`` does when a module has no LAPACK call | called from abstract eval | called from lowering; patched as a module global in both | none |
| pallas_internals | the cpu interpret rule and one-step evaluation of a ``pallas_call`` | ``pallas_call_p`` a ``HiPrimitive``; ``discharge_state`` takes a ``ClosedJaxpr`` | a plain ``Primitive``; ``discharge_state`` takes a ``Jaxpr`` with consts | none |
| xla_client | ``DeviceList``, ``backends_are_initialized`` and ``lib.cuda_path`` (the CUDA directory jax hands XLA: its ``ptxas``) for deviceless compiles | private | same | none |
| rgv3_meshes | collectives in ``shard_map`` (replica groups) | dense ``replica_groups`` | mesh-axis replica groups naming ``sdy.mesh @mesh_0`` (``jax_use_rgv3``, 0.11.0): a second ``sdy.mesh`` kept | n/a |
| loop_bodies | ``scan``/``fori_loop`` bodies in the exported module | outlined as ``func.func private @closed_call`` | inlined in the ``stablehlo.while`` region | n/a |
| serialization | ``Exported.serialize`` version (persistent caches, ``.exported`` files) | 11 | 12 (records the JAX version); 13 from 0.12.1 | ``jax.export`` (both) |
| embedded_constants | kernels' modules self-contained: closed-over constants as ``stablehlo.constant`` (``use_simplified_jaxpr_constants`` off while a kernel lowers) | off (constants embedded) | on by default from 0.12.1: constants over 1 KiB become ``{jax.const = true}`` arguments of ``main``; ``jax.checkpoint`` keeps ``custom_jvp_call`` whole and writes ``reduce_precision`` at its boundaries | none |
| cpu_attention_rows | whether the cpu attention forward runs whole rows (``kernels/attention/blocks.py``): XLA:CPU compiles a softmax row chunk (dot, row max, exp, row sum, dot) as one YNNPACK library fusion, and that fusion is fast | one fusion, but whole rows ran 0.75 of ``jax.jit`` against 0.32 in key blocks (measured): no | one fusion, whole rows 0.34 against 0.43 (0.12.1, measured); 0.11 not measured: no | a compile's text (``jax.jit(...).lower(...).compile().as_text()``) and the jaxlib version |

Everything else hlofuse calls is public and unchanged across the range (``jax.export``,
``jax.extend.mlir``, ``jax.extend.backend``, the Pallas front ends, jaxlib's MLIR bindings).
"""

from __future__ import annotations

import contextlib
import functools
import re
import types
import warnings
from typing import Callable

import numpy as np

import jax
import jax.core as _jax_core
import jax.extend.core as jex_core
from jax.interpreters import ad as _ad
from jax.interpreters import batching as _batching
from jax.interpreters import mlir as _pub_mlir
from jax.interpreters import xla as _pub_xla

from jax._src import api_util as _api_util
from jax._src import config as _config
from jax._src import core as _core
from jax._src import mesh as _mesh
from jax._src import sharding_impls as _sharding_impls
from jax._src import source_info_util as _source_info_util
from jax._src.interpreters import batching as _priv_batching
from jax._src.interpreters import mlir as _mlir
from jax._src.interpreters import partial_eval as _pe

__all__ = [
    "JAX_VERSION", "JAXLIB_VERSION", "ENTRIES", "PRIVATE_MODULES", "version_tuple",
    # jaxpr_types / jaxpr_eval / convert_constvars
    "Jaxpr", "ClosedJaxpr", "Literal", "Tracer", "is_jaxpr", "is_closed_jaxpr", "jaxpr_consts",
    "jaxpr_body", "close_jaxpr", "eval_jaxpr", "jaxpr_as_fun", "subjaxprs", "jaxprs_in_params",
    "convert_constvars_jaxpr",
    # trace_state / jaxpr_copy / trace_context / fun_signature / manual_axis_type
    "at_top_level", "current_trace", "DynamicJaxprTrace", "DynamicJaxprTracer", "jaxpr_is_high",
    "current_source_info", "trace_context", "AxisEnv", "fun_signature",
    "infer_argnums_and_argnames", "ManualAxisType",
    # ir_context / lowering_rules / inlined_func_call / host_callback_primitives
    "new_ir_context", "lower_fun", "register_lowering", "aval_to_ir_type", "custom_call",
    "lowering_rule", "inlined_func_call", "host_callback_primitives",
    # ad_batching / apply_primitive
    "ad", "batching", "moveaxis", "not_mapped", "apply_primitive", "register_checkify",
    # meshes / abstract_mesh_auto / gpu_abstract_device / triton_deprecation / mosaic_gpu_env
    "get_concrete_mesh", "get_abstract_mesh", "use_abstract_mesh", "empty_abstract_mesh",
    "empty_concrete_mesh", "use_concrete_mesh", "check_vma", "manual_axis_type", "ShardingContext",
    "abstract_mesh", "gpu_abstract_device", "quiet_triton_deprecation", "MOSAIC_GPU_ENV",
    # compilation_cache / export_backend_init / pallas_internals / xla_client
    "compilation_cache_decided_off", "reset_compilation_cache", "persistent_cache_min_compile_time",
    "python_dispatch",
    "install_export_backend_guard", "pallas", "GPU_TPU_INTERPRET_MODULES", "DeviceList", "backends_are_initialized", "cuda_path",
    # rgv3_meshes / loop_bodies / serialization / embedded_constants
    "HAS_RGV3", "outlines_loop_bodies", "serialization_version", "embedded_constants",
    # cpu_attention_rows
    "cpu_fuses_attention_rows",
]


#: module prefixes that only this module may name (tests/test_layering.py searches every other
#: file of the repository for them)
PRIVATE_MODULES: tuple[str, ...] = ("jax._src", "jaxlib.mlir._mlir_libs", "_jax_mlir_ext")


def version_tuple(text: str) -> tuple[int, ...]:
    """The numbers of a release string, in order: ``"0.12.0.1"`` -> ``(0, 12, 0, 1)``."""
    return tuple(int(p) for p in re.findall(r"\d+", text))


JAX_VERSION: tuple[int, ...] = version_tuple(jax.__version__)
JAXLIB_VERSION: tuple[int, ...] = version_tuple(__import__("jaxlib").__version__)

#: the entries of the table above, in its order (tests/test_compat.py has one test each)
ENTRIES: tuple[str, ...] = (
    "jaxpr_types", "jaxpr_eval", "jaxpr_rebuild", "convert_constvars", "trace_state", "jaxpr_copy",
    "trace_context", "fun_signature", "manual_axis_type", "ir_context", "lowering_rules",
    "inlined_func_call", "host_callback_primitives", "ad_batching", "checkify_rules",
    "apply_primitive", "meshes",
    "abstract_mesh_auto", "gpu_abstract_device", "triton_deprecation", "mosaic_gpu_env",
    "compilation_cache", "python_dispatch", "export_backend_init", "pallas_internals",
    "xla_client", "rgv3_meshes",
    "loop_bodies", "serialization", "embedded_constants", "cpu_attention_rows",
)

# -- jaxpr_types ----------------------------------------------------------------------------
Jaxpr = jex_core.Jaxpr
#: on 0.11+ the same class as :data:`Jaxpr`
ClosedJaxpr = jex_core.ClosedJaxpr
Literal = jex_core.Literal
Tracer = _jax_core.Tracer
#: 0.10.2's separate class, None from 0.11 on
_LEGACY_CLOSED = getattr(_core, "ClosedJaxpr", None) if ClosedJaxpr is not Jaxpr else None


def is_jaxpr(x) -> bool:
    """A jaxpr of either kind (open or closed) on every supported release."""
    return isinstance(x, (Jaxpr, ClosedJaxpr))


def is_closed_jaxpr(x) -> bool:
    """A jaxpr that carries its constants: 0.10.2's ``ClosedJaxpr``, any ``Jaxpr`` from 0.11."""
    return isinstance(x, ClosedJaxpr)


def jaxpr_consts(x) -> tuple:
    """The constants a closed jaxpr carries (() for an open one)."""
    return tuple(getattr(x, "consts", ()) or ())


def jaxpr_body(x):
    """The jaxpr whose ``eqns``, ``invars``, ``constvars`` and ``outvars`` describe ``x``
    (``x.jaxpr`` on 0.10.2, ``x`` itself from 0.11)."""
    return getattr(x, "jaxpr", x)


def close_jaxpr(jaxpr, consts=()):
    """A closed jaxpr of ``jaxpr`` and ``consts`` (the legacy constructor works on both)."""
    return ClosedJaxpr(jaxpr, list(consts))


# -- jaxpr_rebuild --------------------------------------------------------------------------
def map_jaxpr_arrays(closed, fn):
    """``closed`` with ``fn`` applied to every numpy array it holds: its constants, the
    literal operands of its equations (0-d arrays), and the same of every sub-jaxpr in an
    equation's parameters (an inner ``jax.jit``'s constants, a ``cond``'s branches, a
    ``scan``'s body). Returns ``closed`` itself where ``fn`` changed nothing. New jaxpr
    objects throughout (``replace`` and the legacy ``ClosedJaxpr`` constructor, on both
    releases): jax's own cached jaxprs are never modified."""
    memo: dict = {}

    def arr(a):
        return fn(a) if isinstance(a, np.ndarray) else a

    def one(x):
        if id(x) in memo:
            return memo[id(x)][1]
        if is_jaxpr(x):
            y = jaxpr_of(x)
        elif isinstance(x, (tuple, list)):
            items = [one(i) for i in x]
            if all(a is b for a, b in zip(items, x)):
                y = x
            else:   # a named tuple (a linear solve's jaxprs) takes its fields one by one
                y = type(x)(*items) if hasattr(x, "_fields") else type(x)(items)
        else:
            y = x
        memo[id(x)] = (x, y)          # x kept alive: its id is not reused meanwhile
        return y

    def atom(v):
        if isinstance(v, Literal) and isinstance(v.val, np.ndarray):
            val = arr(v.val)
            if val is not v.val:
                return Literal(val, v.aval)
        return v

    def eqn_of(e):
        invars = [atom(v) for v in e.invars]
        params = {k: one(v) for k, v in e.params.items()}
        if all(a is b for a, b in zip(invars, e.invars)) and \
                all(params[k] is e.params[k] for k in params):
            return e
        return e.replace(invars=invars, params=params)

    def jaxpr_of(x):
        body = jaxpr_body(x)
        eqns = [eqn_of(e) for e in body.eqns]
        new_body = body if all(a is b for a, b in zip(eqns, body.eqns)) else body.replace(eqns=eqns)
        consts = jaxpr_consts(x)
        new_consts = [arr(c) for c in consts]
        if new_body is body and all(a is b for a, b in zip(new_consts, consts)):
            return x
        # 0.10.2's ClosedJaxpr, or a jaxpr that carries its constants (0.11 on): closed again
        # with the new ones; 0.10.2's open Jaxpr (a parameter of some primitives) as it is
        closed_form = body is not x or hasattr(x, "consts")
        return close_jaxpr(new_body, new_consts) if closed_form else new_body

    return one(closed)


# -- jaxpr_eval -----------------------------------------------------------------------------
eval_jaxpr = _jax_core.eval_jaxpr
jaxpr_as_fun = jex_core.jaxpr_as_fun
subjaxprs = jex_core.subjaxprs
jaxprs_in_params = jex_core.jaxprs_in_params

# -- convert_constvars ----------------------------------------------------------------------
convert_constvars_jaxpr = _pe.convert_constvars_jaxpr

# -- trace_state ----------------------------------------------------------------------------


def current_trace():
    """The innermost active trace."""
    return _core.trace_ctx.trace


def at_top_level() -> bool:
    """Whether this call is outside every JAX transformation (no tracer can reach it)."""
    return isinstance(_core.trace_ctx.trace, _core.EvalTrace)


# -- jaxpr_copy -----------------------------------------------------------------------------
DynamicJaxprTrace = _pe.DynamicJaxprTrace
DynamicJaxprTracer = _pe.DynamicJaxprTracer
current_source_info = _source_info_util.current


def jaxpr_is_high(jaxpr) -> bool:
    """Whether ``jaxpr`` holds "high" JAX primitives or types (``call_hi_primitive``:
    ``jnp.searchsorted``, ``jnp.unique(size=)``, ``jnp.frexp`` ... on jax 0.12), which jax
    lowers to plain primitives only where a trace records that it saw one: copying such
    equations into a trace (``emit_eqn``) would not record it."""
    return bool(getattr(jaxpr, "is_high", False))

# -- trace_context --------------------------------------------------------------------------
trace_context = _config.trace_context
AxisEnv = _core.AxisEnv

# -- fun_signature --------------------------------------------------------------------------
fun_signature = _api_util.fun_signature
infer_argnums_and_argnames = _api_util.infer_argnums_and_argnames

# -- manual_axis_type -----------------------------------------------------------------------
ManualAxisType = _core.ManualAxisType

# -- ir_context -----------------------------------------------------------------------------


def new_ir_context():
    """A fresh MLIR context with every dialect JAX emits (stablehlo, chlo, sdy, func) loaded,
    never the context JAX lowers into: from 0.12 ``make_ir_context`` hands out a shared
    per-thread one, so its private fresh-context constructor is used where it exists."""
    make = getattr(_mlir, "_create_ir_context", None) or _mlir.make_ir_context
    return make()


# -- checkify_rules -------------------------------------------------------------------------
def register_checkify(prim, flat_fun: Callable) -> None:
    """``checkify`` of ``prim``: the checks of ``flat_fun(**params)`` (a function of the flat
    inputs returning the flat outputs) as ``jax.jit`` of it would make them. Without a rule,
    checkify saw ``prim`` as opaque: ``checkify(hlofuse.jit(f))`` reported no NaN, index or
    division error where ``checkify(jax.jit(f))`` did (adversarial round). The checked program
    is the function as traced (checks need its own ops), not hlofuse's."""
    from jax._src import checkify as _checkify

    def rule(*args, **params):
        lead = 3 if args and type(args[0]).__name__ == "CheckifyContext" else 2
        head, vals = args[:lead], args[lead:]
        avals = [jax.ShapeDtypeStruct(jax.typeof(v).shape, jax.typeof(v).dtype) for v in vals]
        closed = jax.make_jaxpr(jax.jit(flat_fun(**params)))(*avals)
        jaxpr = jaxpr_body(closed)
        if len(jaxpr.eqns) != 1:
            raise NotImplementedError("checkify of hlofuse_call: jax.jit's trace is not one call")
        (eqn,) = jaxpr.eqns
        env = dict(zip(jaxpr.invars, vals))
        env.update(zip(jaxpr.constvars, jaxpr_consts(closed)))

        def read(env, v):
            return v.val if isinstance(v, jex_core.Literal) else env[v]
        err, outs = _checkify.error_checks[eqn.primitive](
            *head, *[read(env, v) for v in eqn.invars], **eqn.params)
        env = dict(zip(eqn.outvars, outs))
        return err, [read(env, v) for v in jaxpr.outvars]

    _checkify.error_checks[prim] = rule


# -- lowering_rules -------------------------------------------------------------------------
lower_fun = _pub_mlir.lower_fun
register_lowering = _pub_mlir.register_lowering
aval_to_ir_type = _pub_mlir.aval_to_ir_type
custom_call = _mlir.custom_call


def lowering_rule(module_context, prim, platform: str):
    """The rule ``prim`` lowers with in ``module_context`` for ``platform``: an override given
    to ``jax.export`` first, then the platform's own rule, then the generic one."""
    override = _mlir._get_override_lowering_rule(module_context, prim)
    if override is not None:
        return override
    entry = (_mlir._platform_specific_lowerings[platform].get(prim)
             or _mlir._lowerings.get(prim))
    if entry is None:
        raise NotImplementedError(f"{prim} has no lowering for {platform}")
    return entry.rule


# -- inlined_func_call ----------------------------------------------------------------------


def inlined_func_call(callee_op, operands):
    """jaxlib's inliner for one ``func.call`` at the current insertion point (maps captures of
    nested regions correctly, which the upstream ``inline`` pass does not)."""
    from jaxlib.mlir._mlir_libs import _jax_mlir_ext
    return _jax_mlir_ext.inlined_func_call(callee_op, list(operands))


# -- host_callback_primitives ---------------------------------------------------------------


@functools.cache
def xla_simplifies_self_division() -> bool:
    """Whether this jaxlib's XLA simplifies an integer ``x / x`` to 1 (and ``x % x`` to 0)
    itself, also where x is 0 (jax 0.12's does; 0.10.2's runs them: 0 / 0 = -1). Asked once,
    of XLA:CPU (one small compile), by :func:`hlofuse.core.ir.guard_integer_division`."""
    import numpy as np
    try:
        with jax.default_device(jax.devices("cpu")[0]), jax.disable_jit(False):
            out = jax.jit(lambda v: jax.lax.div(v, v))(np.zeros(2, np.int32))
        return bool(np.all(np.asarray(out) == 1))
    except Exception:  # noqa: BLE001 - no cpu backend: guard as before
        return False


@functools.cache
def host_callback_primitives() -> types.SimpleNamespace:
    """``primitives`` (outlined as placeholders), ``unordered_effects`` (need no token), and
    the two callback primitives hlofuse tests by name."""
    from jax._src import callback as _callback
    from jax._src import debugging as _debugging
    return types.SimpleNamespace(
        pure_callback_p=_callback.pure_callback_p, io_callback_p=_callback.io_callback_p,
        debug_callback_p=_debugging.debug_callback_p, debug_print_p=_debugging.debug_print_p,
        emit_python_callback=_callback.emit_python_callback,
        primitives=(_callback.pure_callback_p, _callback.io_callback_p,
                    _debugging.debug_callback_p, _debugging.debug_print_p),
        unordered_effects=(_debugging.debug_effect, _callback._IOEffect))


# -- ad_batching / apply_primitive ----------------------------------------------------------
ad = _ad
batching = _batching
moveaxis = _priv_batching.moveaxis
#: the batch dimension of an unmapped argument (None on every supported release)
not_mapped = getattr(_priv_batching, "not_mapped", None)
apply_primitive = _pub_xla.apply_primitive

# -- meshes ---------------------------------------------------------------------------------
get_concrete_mesh = _mesh.get_concrete_mesh
get_abstract_mesh = jax.sharding.get_abstract_mesh
use_abstract_mesh = jax.sharding.use_abstract_mesh
empty_abstract_mesh = _mesh.empty_abstract_mesh
empty_concrete_mesh = _mesh.empty_concrete_mesh
use_concrete_mesh = _sharding_impls._internal_use_concrete_mesh
ShardingContext = _sharding_impls.ShardingContext


def manual_axis_type(aval):
    """The manual axes ``aval`` varies over (or is unreduced/reduced along) in a ``shard_map``
    body, as ``ShapeDtypeStruct(manual_axis_type=...)`` takes it; None when it has none (the
    default: outside ``shard_map``, or invariant)."""
    m = getattr(aval, "manual_axis_type", None)
    if m is None or not (m.varying or m.unreduced or m.reduced):
        return None
    return m


def check_vma(on: bool):
    """Context manager: shard_map's varying-manual-axes check on/off (this thread)."""
    return _config._check_vma(on)


# -- abstract_mesh_auto / gpu_abstract_device -----------------------------------------------


def abstract_mesh(device: jax.sharding.AbstractDevice | None = None):
    """The one-device ``AbstractMesh`` kernels lower under, with ``Auto`` axes on every release
    (0.12's default is ``Explicit``, under which a kernel's body gets sharding ops)."""
    return jax.sharding.AbstractMesh((1,), ("x",), axis_types=(jax.sharding.AxisType.Auto,),
                                     abstract_device=device)


def gpu_abstract_device(device_kind: str) -> jax.sharding.AbstractDevice:
    """The abstract CUDA device Pallas Triton needs to lower on a host without a GPU (0.11+;
    harmless on 0.10.2)."""
    return jax.sharding.AbstractDevice(device_kind=device_kind, num_cores=None, platform="cuda")


# -- triton_deprecation ---------------------------------------------------------------------


@contextlib.contextmanager
def quiet_triton_deprecation():
    """Lower Pallas Triton kernels without 0.11+'s per-lowering deprecation warning: hlofuse
    chooses the backend itself (a user cannot act on the warning), and says in its docs which
    backend it uses."""
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message=r".*Pallas Triton backend is deprecated.*",
                                category=DeprecationWarning)
        yield


# -- mosaic_gpu_env -------------------------------------------------------------------------
#: set in deviceless compile workers: 0.10.2 otherwise sends a ``pallas_call`` without
#: ``compiler_params`` to Mosaic GPU; 0.12 reads no such variable (Triton is its default)
MOSAIC_GPU_ENV = ({"JAX_PALLAS_USE_MOSAIC_GPU": "0"}
                  if hasattr(jax.config, "jax_pallas_use_mosaic_gpu") else {})

# -- compilation_cache ----------------------------------------------------------------------


def compilation_cache_decided_off() -> bool:
    """Whether jax already decided, at an earlier compile, to use no persistent cache."""
    from jax._src import compilation_cache as cc
    return bool(getattr(cc, "_cache_checked", False) and not getattr(cc, "_cache_used", True))


def reset_compilation_cache() -> None:
    from jax.experimental.compilation_cache import compilation_cache as cc
    cc.reset_cache()


def persistent_cache_min_compile_time(seconds: float | None = None):
    """Context manager: this thread's minimum compile time for the persistent cache; with no
    argument, the value in force in this thread."""
    if seconds is None:
        return _config.persistent_cache_min_compile_time_secs.value
    return _config.persistent_cache_min_compile_time_secs(seconds)


# -- python_dispatch ------------------------------------------------------------------------


def python_dispatch():
    """jit's dispatch module; its ``_run_python_pjit`` is the Python path a call takes when
    the C++ fast path cannot (tests/test_tiered.py spies on it: tiered calls must leave it)."""
    from jax._src import pjit
    return pjit


# -- export_backend_init --------------------------------------------------------------------


def install_export_backend_guard(skip) -> bool:
    """Make ``Exported.call``'s backend initialisation (LAPACK's FFI handlers, an import of
    scipy.linalg) a no-op while ``skip()`` is true. Returns whether the guard is installed."""
    from jax._src.export import _export
    orig = getattr(_export, "_ensure_backends_initialized", None)
    if orig is None:
        return False
    if getattr(orig, "_hlofuse_guard", False):
        return True

    def ensure(platforms):
        if not skip():
            orig(platforms)
    ensure._hlofuse_guard = True
    _export._ensure_backends_initialized = ensure
    return True


# -- pallas_internals -----------------------------------------------------------------------


@functools.cache
def pallas() -> types.SimpleNamespace:
    """Pallas internals for the cpu interpret rule and one-step evaluation, imported on first
    use (a cold process that builds no kernel never pays for them)."""
    from jax._src.pallas import core as pallas_core
    from jax._src.pallas import hlo_interpreter
    from jax._src.pallas import pallas_call as pc
    from jax._src.pallas import primitives as pallas_primitives
    from jax._src.state import discharge as state_discharge
    from jax._src.state import types as state_types
    return types.SimpleNamespace(
        pallas_call_p=pc.pallas_call_p, pallas_call_lowering=pc._pallas_call_lowering,
        hlo_interpret=hlo_interpreter.pallas_call_hlo_interpret,
        initialize_output_vals=hlo_interpreter._initialize_output_vals,
        Blocked=pallas_core.Blocked, GridAxis=pallas_core.GridAxis, grid_env=pallas_core.grid_env,
        uninitialized_value=pallas_primitives.uninitialized_value,
        AbstractRef=state_types.AbstractRef,
        discharge_state=lambda jaxpr: state_discharge.discharge_state(close_jaxpr(jaxpr, ())))


#: modules jax's own interpret lowering imports only to test ``isinstance`` against (0.25-1.9 s
#: of a cold first call); hlofuse's cpu rule must never import them (tests/test_import.py)
GPU_TPU_INTERPRET_MODULES = (
    "jax._src.pallas.mosaic_gpu.interpret.interpret_pallas_call", "jax._src.pallas.mosaic_gpu.core",
    "jax._src.pallas.mosaic.interpret.interpret_pallas_call", "jax.experimental.pallas.triton",
    "jax.experimental.mosaic.gpu")


# -- xla_client -----------------------------------------------------------------------------


def DeviceList(devices):  # noqa: N802 - jaxlib's class name
    from jax._src.lib import xla_client
    return xla_client.DeviceList(tuple(devices))


def backends_are_initialized() -> bool:
    from jax._src import xla_bridge
    return xla_bridge.backends_are_initialized()


def cuda_path() -> str | None:
    """The CUDA directory jax points XLA:GPU at (where XLA finds ``ptxas``), or None."""
    try:
        from jax._src import lib as _lib
    except ImportError:  # a jaxlib without it: XLA searches PATH
        return None
    return getattr(_lib, "cuda_path", None)


# -- rgv3_meshes / loop_bodies / serialization ----------------------------------------------
#: whether shard_map collectives may name a mesh (``sdy.mesh @mesh_0``) in their replica groups
HAS_RGV3: bool = bool(getattr(jax.config, "jax_use_rgv3", False))


@functools.cache
def outlines_loop_bodies() -> bool:
    """Whether this release lowers a loop body as an outlined ``func.func private
    @closed_call`` (0.10.2) rather than inline in the ``stablehlo.while`` region (0.12),
    read from a lowering (``closed_call_p`` itself still exists on 0.12)."""
    def f(x):
        return jax.lax.fori_loop(0, 3, lambda i, c: c * 2.0 + 1.0, x)
    return "@closed_call" in jax.jit(f).lower(jax.ShapeDtypeStruct((2,), "float32")).as_text()


def embedded_constants():
    """A context in which jax traces and lowers closed-over constants into the module as
    ``stablehlo.constant`` ops. From jax 0.12.1 (``jax_use_simplified_jaxpr_constants`` on by
    default) a constant over ``jax_embedded_constants_max_bytes`` (1 KiB) becomes an argument
    of ``main`` (``{jax.const = true}``) that jax passes at call time; a kernel's module must be
    self-contained to be imported into the user's program. A no-op on releases without it."""
    flag = getattr(_config, "use_simplified_jaxpr_constants", None)
    return flag(False) if flag is not None else contextlib.nullcontext()


def serialization_version() -> int:
    """The version ``Exported.serialize`` writes (11 on 0.10.2, 12 on 0.12.0, 13 on 0.12.1)."""
    from jax._src.export import serialization
    return int(serialization._SERIALIZATION_VERSION)


@functools.cache
def cpu_fuses_attention_rows() -> bool:
    """Whether the cpu attention forward should run whole rows: jaxlib 0.12 or later (measured
    fast on 0.12.1; on 0.10.2 the same single fusion ran 2.3x slower than key blocks, and 0.11
    could not be measured here) and XLA:CPU compiles a whole-row chunk, ``softmax(q·Kᵀ)·V``
    over 512 rows of 8 heads and 1024 keys, as ONE library fusion (``kind=kCustom``), read
    from a compile on the cpu backend (``XLA_FLAGS`` may turn YNNPACK's fusions off). False
    when no cpu backend compiles it: key blocks need no such fusion."""
    if JAXLIB_VERSION < (0, 12):
        return False
    import jax.numpy as jnp
    from jax import lax

    def chunk(q, kt, v):
        s = lax.dot_general(q, kt, (((2,), (1,)), ((0,), (0,))))
        p = jnp.exp(s - jnp.max(s, axis=-1, keepdims=True))
        return lax.dot_general(p, v, (((2,), (1,)), ((0,), (0,)))) / jnp.sum(p, -1)[..., None]
    try:
        shapes = [jax.ShapeDtypeStruct(s, jnp.float32)
                  for s in ((8, 512, 64), (8, 64, 1024), (8, 1024, 64))]
        with jax.default_device(jax.devices("cpu")[0]):
            text = jax.jit(chunk).lower(*shapes).compile().as_text()
    except Exception:  # noqa: BLE001 - no cpu backend here: the key blocks need nothing
        return False
    return text.count("kind=kCustom") == 1
