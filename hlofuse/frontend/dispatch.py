"""The third part of a call: which executable runs it.

:class:`Dispatcher` holds the ``jax.jit`` objects of one ``hlofuse.jit`` function (the default
one, whose trace binds hlofuse's program, and compiler-option / region variants of it), the
state of each call signature (:class:`~hlofuse.frontend.tuning.SignatureState`), and the fast
path: when every signature is decided and all run one executable, a call goes straight to
jax's C++ dispatch with no per-call key. It starts tiered first calls' background builds (the
trace asked for one in the call's :class:`~hlofuse.frontend.signature.CallInfo`) and routes the
calls of a signature while its module is built. Decisions come from its
:class:`~hlofuse.frontend.tuning.Tuning` half.
"""

from __future__ import annotations

import logging
import math
import threading
import time

import jax

from hlofuse.core import compat, config
from hlofuse.core.pipeline import trace
from hlofuse.core.target import Target
from hlofuse.frontend.signature import CallInfo, CallSignature
from hlofuse.frontend.tracing import TracedFunction
from hlofuse.frontend.tuning import Exe, SignatureState, Tuning
from hlofuse.runtime import autotune as at
from hlofuse.runtime import memory
from hlofuse.runtime.program import Options, machinery_failed

__all__ = ["Dispatcher", "tiered_mode", "TIERED_ENV"]

log = logging.getLogger("hlofuse")

#: ``tiered=None`` follows this variable: "0"/"off"/"false"/"no" turn tiered first calls off
TIERED_ENV = "HLOFUSE_TIERED"


def tiered_mode(setting) -> bool:
    """``hlofuse.jit(tiered=...)``: True/False, or None for ``$HLOFUSE_TIERED`` (default on)."""
    if setting is None:
        return config.get(TIERED_ENV)
    return bool(setting)


class Dispatcher(Tuning):
    """Runs the calls of one ``hlofuse.jit`` function (see the module docstring)."""

    def __init__(self, name: str, opts: Options, sig: CallSignature, traced: TracedFunction,
                 *, autotune, tiered, memory_limit):
        self.name, self.opts, self.sig, self.traced = name, opts, sig, traced
        self.default = Exe(jax.jit(traced.fn(), **sig.jit_kwargs))
        self.states: dict[tuple, SignatureState] = {}
        self.variants: dict[tuple, Exe] = {}
        self.lock = threading.RLock()
        self.autotune = autotune   # None follows HLOFUSE_AUTOTUNE / the platform
        self.tiered = tiered
        self.memory_limit = memory_limit
        self.fast = True       # every signature seen so far is decided and runs fast_fn
        self.fast_fn = None    # the one executable they all run (None: self.default)
        self.recheck_at = math.inf   # when a signature's steady-state re-check is due next
        if memory_limit is not None:
            # the plan is chosen before a signature's first call runs anything (a tiered first
            # call would run XLA's module, which may be the plan over the limit)
            self.tiered, self.fast = False, False

    def mode(self) -> str:
        return at.mode(self.autotune, jax.default_backend())

    def tiering(self) -> bool:
        return tiered_mode(self.tiered)

    # -- calls -------------------------------------------------------------------------------
    def first_call(self, info: CallInfo, args, kwargs, out) -> None:
        """A call on the fast path (:meth:`hlofuse.frontend.jit.HlofuseFunction.__call__`:
        one executable for every signature, straight to jax's C++ dispatch) traced a new
        signature (``out``: its outputs)."""
        if info.tier is not None:   # XLA's code ran for it: hlofuse's module in the background
            self._start_tier(info, args, kwargs, out)
            return
        self.traced_new(info)       # its first call, for tuning
        if not self.fast:
            self.tuned_call(info, args, kwargs, out)

    def traced_new(self, info: CallInfo) -> None:
        """A trace of a new signature ran (a call, ``lower``, a transformation): calls leave
        the fast path until it is decided (XLA's own module's, or when tuning is on)."""
        if info.traced and (info.plain or self.mode() != "off"):
            self.fast = False

    def tuned_call(self, info: CallInfo, args, kwargs, done=None):
        """A call while some signature's options are undecided or not XLA's defaults.
        ``done``: the output when the fast path already ran this (first) call."""
        key = self.sig.call_key(args, kwargs)
        if key is None:  # under a transformation (tracers), or unhashable: the default
            return done if done is not None else self.default.run(info, args, kwargs)
        st = self.states.get(key)
        if st is None:
            with self.lock:
                st = self.states.setdefault(key, SignatureState())
        if st.tier == "building":   # hlofuse's executable is still being built
            return done if done is not None else self._xla_code().run(info, args, kwargs)
        if done is not None:  # already ran (a retrace after jax evicted it, or a new one)
            with self.lock:
                st.calls += 1
                if st.calls == 1:
                    self.guarded(st, "tuning (first sight)", self.first_sight, st, args, kwargs)
            return done
        if st.decision is not None:
            if st.recheck_at <= time.perf_counter():
                self.recheck_call(st, args, kwargs)
            self.maybe_fast()
            return (st.fn or self.default).run(info, args, kwargs)
        with self.lock:
            if st.calls == 0:
                out = self.default.run(info, args, kwargs)
                if info.tier is not None:   # XLA's code ran: hlofuse's module in the background
                    self._start_tier(info, args, kwargs, out)
                    return out
                st.calls = 1
                self.guarded(st, "tuning (first sight)", self.first_sight, st, args, kwargs)
                return out
            st.calls += 1
            if st.decision is None and st.calls >= at.TUNE_AT_CALL:
                ok, out = self.guarded(st, "tuning", self.tune, st, info, args, kwargs)
                if ok:
                    return out
        return (st.fn or self.default).run(info, args, kwargs)

    def maybe_fast(self):
        """Calls take the fast path (one jit object, no per-call signature key: ~30 us for a
        BERT layer's 18 arguments) when every signature is decided and all run the same
        executable: the default, or e.g. XLA's own module for a single decided signature. A
        new signature traced there leaves it (:meth:`traced_new`), and its call is then handed
        to :meth:`tuned_call` as a first call."""
        sts = list(self.states.values())
        if not all(s.decision is not None and s.tier != "building" for s in sts):
            return
        fns = {s.fn or self.default: s.fn for s in sts}
        if len(fns) <= 1:
            self.fast_fn = next(iter(fns.values()), None)
            self.fast = True

    def variant(self, options: dict, donate: bool, xla: frozenset = frozenset(),
                plain: bool = False, full: bool = False, settings: tuple = ()) -> Exe:
        """The executable of this function with extra compiler ``options`` and the regions
        ``xla`` (hashes) run without their kernels (one ``jax.jit`` object per variant, so the
        executables compiled while measuring are the ones calls reuse). ``donate=False``:
        without the donation (measurements must not consume arguments). ``plain``: XLA's own
        module for the function (what ``jax.jit`` runs; the tiered first call's executable).
        ``settings``: pass options of a kernel variant (``(pass, option, value)`` triples)."""
        settings = () if plain else tuple(settings)
        if not options and not xla and not full and not settings and \
                (donate or not self.sig.donating):
            return Exe(self.default.jitted, plain)
        key = (tuple(sorted(options.items())), donate and self.sig.donating,
               frozenset() if plain else frozenset(xla), full and not plain, settings)
        jitted = self.variants.get(key)
        if jitted is None:
            kw = dict(self.sig.jit_kwargs)
            if not donate:
                kw.pop("donate_argnums", None)
                kw.pop("donate_argnames", None)
            if options:
                kw["compiler_options"] = dict(kw.get("compiler_options") or {}, **options)
            fn = self.traced.fn() if plain else self.traced.fn(frozenset(xla), full=full,
                                                               settings=settings)
            jitted = self.variants.setdefault(key, jax.jit(fn, **kw))
        return Exe(jitted, plain)

    def _xla_code(self) -> Exe:
        """XLA's own module for the function, in the default ``jax.jit`` object (where a
        tiered first call compiled it)."""
        return Exe(self.default.jitted, True)

    # -- tiered first calls ------------------------------------------------------------------
    def _start_tier(self, info: CallInfo, args, kwargs, out) -> None:
        """The call's trace ran XLA's code for a new signature (``info.tier``: its specs):
        build hlofuse's executable for it in the background."""
        self.fast = False
        key, specs = info.tier
        with self.lock:
            st = self.states.setdefault(key, SignatureState())
            if st.tier is not None:
                return
            st.tier, st.calls, st.tier_started = "building", 0, time.perf_counter()
            t = threading.Thread(target=self._tier_build, args=(st, *specs, [out]),
                                 name=f"hlofuse-build-{self.name}")
            st.tier_thread = t
            t.start()

    def _tier_build(self, st: SignatureState, args, kwargs, first_out: list):
        """Background thread: lower and compile hlofuse's executable for the signature of
        ``args`` (shape/dtype specs), as the call path would, so later calls find it in
        jax's caches. Then the first sight of autotune (the XLA-code call was call 1).
        ``first_out``: the first call's outputs; the build starts when they are computed, so
        it does not take CPU from that first run."""
        try:
            jax.block_until_ready(first_out.pop())
        except Exception:  # noqa: BLE001 - e.g. already donated to a later call: computed
            pass
        try:
            with trace("tiered build", function=self.name):
                self.default.lower(*args, **kwargs).compile()
            with self.lock:
                st.tier, st.calls = "ready", 1
                st.tier_s = time.perf_counter() - st.tier_started
                self.guarded(st, "tuning (first sight)", self._after_tier, st, args, kwargs)
                self.maybe_fast()
            log.log(logging.INFO if st.tier_s >= at.LOG_AFTER_S else logging.DEBUG,
                    "%s optimized in the background in %.2f s", self.name, st.tier_s)
        except BaseException as e:  # noqa: BLE001 - the calls keep XLA's code; say why
            note = machinery_failed("background build", e, self.name,
                                    "calls of this signature run XLA's code for the function")
            with self.lock:
                st.tier, st.tier_error = "failed", f"{type(e).__name__}: {e}"
                st.tier_s = time.perf_counter() - st.tier_started
                st.decision = at.Decision("default", {}, {}, reason=note)
                st.fn = self._xla_code()

    def _after_tier(self, st: SignatureState, args, kwargs) -> None:
        """The module is built: its report says how the first calls ran; then autotune's
        first sight of the signature."""
        _, entry = self.entry_of(args, kwargs)
        if entry is not None:
            entry.report.note(
                f"tiered first call: the first call ran XLA's code for the function while "
                f"hlofuse optimized and compiled this module in the background; calls run it "
                f"since {st.tier_s:.2f}s after the first call started (tiered=False or "
                f"HLOFUSE_TIERED=0 builds it during the first call)")
        self.first_sight(st, args, kwargs)

    def block_until_optimized(self, timeout: float | None = None) -> bool:
        deadline = None if timeout is None else time.perf_counter() + timeout
        for st in list(self.states.values()):
            t = st.tier_thread
            if t is not None:
                t.join(None if deadline is None else max(0.0, deadline - time.perf_counter()))
        return not any(st.tier == "building" for st in list(self.states.values()))

    # -- memory_limit ------------------------------------------------------------------------
    def plan_memory(self, args, kwargs, lower) -> None:
        """``memory_limit``: before a signature's first call, compile hlofuse's program
        (``lower``: the function's :meth:`~hlofuse.frontend.jit.HlofuseFunction.lower`) and XLA's
        own module for it, and run the one with the fewest flops that fits
        (:func:`hlofuse.runtime.memory.choose`; raises
        :class:`hlofuse.runtime.memory.MemoryLimitError` when none does). Top-level calls only
        (under a transformation the outer program decides)."""
        key = self.sig.call_key(args, kwargs)
        if key is None:
            return
        st = self.states.get(key)
        if st is not None and st.memory is not None:
            return
        with self.lock:
            st = self.states.setdefault(key, SignatureState())
            if st.memory is not None:
                return
            specs = self.sig.specs(args, kwargs)   # compiling must not consume donated args
            if specs is None:
                return
            sargs, skw = specs
            lowered = lower(*sargs, **skw)
            plans = {"hlofuse's program": memory.figures(lowered.compile()),
                     "XLA's own module": memory.figures(
                         self._xla_code().lower(*sargs, **skw).compile())}
            entry = lowered._entry
            target = entry.target if entry is not None else Target.of(None)
            limit = memory.resolve_limit(self.memory_limit, target, jax.devices()[0])
            pick, note = memory.choose(
                plans, limit, name=self.name,
                module=entry.optimized.module if entry is not None else None)
            st.memory = note
            st.plain_over_limit = plans["XLA's own module"].peak > limit
            if entry is not None:
                entry.report.note(note)
            if pick == "XLA's own module" and entry is not None:
                self.decide(st, at.Decision(at.XLA_MODULE, {}, {}, reason=note),
                            cached=False, record=False)

    def clear(self) -> None:
        self.default.jitted.clear_cache()
        with self.lock:
            for jitted in self.variants.values():
                jitted.clear_cache()
            self.states.clear()
            self.variants.clear()
            self.fast, self.fast_fn, self.recheck_at = True, None, math.inf
