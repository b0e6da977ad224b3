"""Measured decisions for one signature: which executable its calls run.

:class:`Tuning` is the dispatcher's half that decides (:class:`hlofuse.frontend.dispatch.Dispatcher`
runs what it decided): on a signature's first call it looks for a cached decision; on the
second it measures XLA compiler-option variants and each kernelized region against XLA's own
code (:mod:`hlofuse.runtime.autotune`), and keeps the winner. Whether a region runs as a
kernel or as XLA's code under a decision is :func:`hlofuse.runtime.kernel_choice.xla_to_apply`,
with the module's other kernel-or-XLA rules. Every step runs through :meth:`Tuning.guarded`:
tuning never fails the call it tunes.
"""

from __future__ import annotations

import dataclasses
import logging
import math
import threading
import time
from typing import Any

import jax

from hlofuse.core import config
from hlofuse.core.pipeline import trace
from hlofuse.frontend.signature import CallInfo
from hlofuse.runtime import autotune as at
from hlofuse.runtime.kernel_choice import measured_form, xla_to_apply
from hlofuse.runtime.program import find_calls, machinery_failed

__all__ = ["SignatureState", "Exe", "Tuning", "report_decision", "EFFECTS_NOT_TIMED"]

log = logging.getLogger("hlofuse")

#: why a function with side effects is never measured (its report says so)
EFFECTS_NOT_TIMED = (
    "autotune: not measured: the function has side effects (jax.debug.print, "
    "jax.debug.callback, io_callback) that timing its variants would run again")


@dataclasses.dataclass(frozen=True)
class Exe:
    """One executable choice of a signature: a ``jax.jit`` object of the traced function
    (with its compiler options, donation and regions left to XLA) and whether its calls trace
    XLA's own module for the function (``plain``: what ``jax.jit`` runs)."""
    jitted: Any
    plain: bool = False

    def run(self, info: CallInfo, args, kwargs):
        info.plain = self.plain
        return self.jitted(info, *args, **kwargs)

    def __call__(self, *args, **kwargs):
        info = CallInfo((args, kwargs), plain=self.plain)
        try:
            return self.jitted(info, *args, **kwargs)
        finally:
            info.leave()

    def lower(self, *args, **kwargs):
        info = CallInfo((args, kwargs), plain=self.plain)
        try:
            return self.jitted.lower(info, *args, **kwargs)
        finally:
            info.leave()

    def trace(self, *args, **kwargs):
        info = CallInfo((args, kwargs), plain=self.plain)
        try:
            return self.jitted.trace(info, *args, **kwargs)
        finally:
            info.leave()


@dataclasses.dataclass
class SignatureState:
    """What the dispatcher knows of one call signature."""
    calls: int = 0
    decision: at.Decision | None = None
    fn: Exe | None = None             # the executable of a non-default decision
    key: str | None = None            # decision-cache key (None: nothing to tune)
    entry: Any = None
    cached: bool = False              # the decision came from the cache
    # tiered first call: None (built synchronously), "building" (calls run XLA's code),
    # "ready" (hlofuse's executable compiled), "failed" (XLA's code for good, error says why)
    tier: str | None = None
    tier_thread: Any = None
    tier_started: float = 0.0
    tier_s: float | None = None       # seconds from the first call to hlofuse's code ready
    tier_error: str | None = None
    # memory_limit: the report's sentence once planned, and whether XLA's own module is over
    # the limit (tuning must then not choose it)
    memory: str | None = None
    plain_over_limit: bool = False
    # steady-state re-checks (Tuning.recheck_call): when the next is due (perf_counter
    # seconds), the interval now, the decision that runs hlofuse's program (the other runs
    # XLA's own module), the two executables' background compile (None, "compiling", "ready",
    # "failed"), how many ran and what the last one found
    recheck_at: float = math.inf
    recheck_every: float = 0.0
    recheck_prog: Any = None
    recheck_ready: str | None = None
    recheck_thread: Any = None
    rechecks: int = 0
    recheck_last: str | None = None


class Tuning:
    """The deciding half of :class:`hlofuse.frontend.dispatch.Dispatcher` (which provides
    ``name``, ``opts``, ``sig``, ``default``, ``states``, ``lock``, ``memory_limit``,
    ``recheck_at``, ``mode()``, ``variant()`` and ``maybe_fast()``)."""

    def guarded(self, st: SignatureState, where: str, step, *a) -> tuple[bool, object]:
        """The boundary of tuning and measured decisions: ``(True, step(*a))``, or, when the
        step raised, ``(False, None)`` with this signature decided for XLA's own program (what
        ``jax.jit`` runs) in this process only, the failure in its report, warned and logged
        once (:func:`hlofuse.runtime.program.machinery_failed`). Tuning is an optimization: it
        never fails the call it was tuning. ``options={'strict': True}`` raises instead."""
        try:
            return True, step(*a)
        except Exception as e:  # noqa: BLE001 - the boundary: tuning never fails the call (report, log)
            if self.opts.pass_options.get("strict"):
                raise
            note = machinery_failed(where, e, self.name,
                                    "this signature runs XLA's program (jax.jit's) in this process")
            self.decide(st, at.Decision(at.XLA_MODULE, {}, {}, reason=note), cached=False,
                        record=False)
            entry = st.entry
            if entry is None:
                try:
                    _, entry = self.entry_of(*a[1:])
                except Exception:  # noqa: BLE001 - no report to write it to: warned and logged
                    entry = None
            if entry is not None:
                entry.report.note(note)
            return False, None

    def entry_of(self, args, kwargs, platform=None):
        """(jax Traced, hlofuse Entry or None) for concrete arguments."""
        traced = self.default.trace(*args, **kwargs)
        calls = find_calls(traced.jaxpr)
        if not calls:
            return traced, None
        program, sig = calls[0]
        platform = platform or jax.default_backend()
        return traced, program.entry(sig, program.target_for(platform))

    def first_sight(self, st: SignatureState, args, kwargs):
        """After the first call of a signature: find its program and a cached decision."""
        mode = self.mode()
        traced, entry = self.entry_of(args, kwargs)
        if entry is not None and mode != "off" and _not_timed(traced, entry):
            self.decide(st, at.Decision("default", {}, {}, reason=EFFECTS_NOT_TIMED),
                        cached=False, record=False)
            return
        # the optimized module's text, printed once for both (a first call pays for it)
        text = entry.optimized.text if entry is not None else None
        variants = candidates(entry, text) if entry is not None else {}
        if entry is None or len(variants) < 2 or mode == "off":
            self.decide(st, at.Decision("default", {}, {}, reason="nothing to tune"),
                        cached=False, record=False)
            return
        st.entry = entry
        st.key = decision_key(entry, text)
        cached = at.cache().get(st.key)
        if cached is not None:
            self.decide(st, cached, cached=True)
            self.schedule_recheck(st)
        elif mode == "cached":
            self.decide(st, at.Decision("default", {}, {}, reason="autotune=cached: no cached "
                                        "decision for this program"), cached=False)

    def _region_info(self, entry, variants: dict) -> dict:
        """Features, hash and the learned cost model's prediction per region variant."""
        from hlofuse.passes.fusion import cost as cost_model
        from hlofuse.runtime.program import learned_for
        info = {}
        kernels = measured_form(entry.optimized).report.kernels
        by_hash = {r.extra.get("region_hash"): r for r in kernels}
        with cost_model.learned_model(entry.target.kind, learned_for(entry.target)):
            for n, v in variants.items():
                if not n.startswith(at.REGION_PREFIX):
                    continue
                (h,) = v.xla
                feats = at.record_of(by_hash[h], entry.target.kind)
                info[n] = {"hash": h, "features": feats,
                           "predicted": cost_model.predicted_ratio(feats, entry.target)}
        return info

    def tune(self, st: SignatureState, info: CallInfo | None, args, kwargs, **tune_kw):
        """Second call of an undecided signature: measure the variants (compiler options and
        each region's kernel against XLA's code), then run the call (``info``: the call's;
        None for offline tuning, which does not run it)."""
        variants = candidates(st.entry)
        regions = self._region_info(st.entry, variants)
        # with kernels held back unmeasured, every variant (``default`` too) starts from the
        # module with all kernels built, so each held-back kernel is timed against XLA's code
        full = st.entry.optimized.full is not None

        def make(spec):
            v = at.Variant.of(spec)
            return self.variant(v.options_dict, donate=False, xla=v.xla, plain=v.plain,
                                full=full and not v.plain, settings=v.settings)

        if info is None:  # offline tuning (HlofuseFunction.tune): the call itself is not needed
            d = at.tune(make, args, kwargs, variants, name=self.name, key=st.key,
                        regions=regions, **tune_kw)
            self.decide(st, d, cached=False)
            self.schedule_recheck(st)
            return None
        out, t = None, None
        if not self.sig.donating:  # this call runs anyway: time it warm, so a module too slow
            t0 = time.perf_counter()   # to tune costs nothing
            out = jax.block_until_ready(self.default.run(info, args, kwargs))
            t = time.perf_counter() - t0
            if t < 10 * at.MIN_CALL_S:  # short: one preempted call must not decide alone
                for _ in range(2):
                    t0 = time.perf_counter()
                    jax.block_until_ready(self.default(*args, **kwargs))
                    t = min(t, time.perf_counter() - t0)
        d = at.tune(make, args, kwargs, variants, name=self.name, key=st.key, default_s=t,
                    regions=regions)
        self.decide(st, d, cached=False)
        self.schedule_recheck(st)
        if out is None:
            out = (st.fn or self.default).run(info, args, kwargs)
        return out

    def decide(self, st: SignatureState, d: at.Decision, *, cached: bool, record: bool = True):
        if d.xla_module and st.plain_over_limit:
            d = dataclasses.replace(d, variant="default", reason=(
                f"{d.reason}; not XLA's own module: {st.memory}"))
        # None: the default jit object (XLA's defaults, every kernel); set on every decision,
        # so one replacing another (a re-check's) never keeps the other's executable
        fn = self.exe_of(st, d, donate=True)
        st.fn = None if fn == self.default else fn
        st.decision = d
        st.cached = cached
        if record and st.entry is not None:
            report_decision(st.entry.report, d, cached)
        self.maybe_fast()

    def exe_of(self, st: SignatureState, d: at.Decision, *, donate: bool) -> Exe:
        """The executable that runs decision ``d``'s program for signature ``st``: XLA's own
        module, or hlofuse's with the decision's compiler options, kernel settings and the
        regions it runs as XLA's code (:func:`~hlofuse.runtime.kernel_choice.xla_to_apply`);
        ``donate=False``: without the function's donation (to time it)."""
        if d.xla_module:   # hlofuse's program was not measurably faster than jax.jit's
            return self.variant({}, donate=donate, plain=True)
        xla, full = xla_to_apply(st.entry, d)
        return self.variant(at.options_of(d), donate=donate, xla=xla, full=full,
                            settings=at.settings_of(d))

    # -- steady-state re-checks --------------------------------------------------------------
    def schedule_recheck(self, st: SignatureState) -> None:
        """A signature was decided by tuning (measured here, or its decision found in the
        cache) with tuning on: its calls are re-checked against XLA's own module
        ``HLOFUSE_RECHECK_S`` seconds later, then at doubling intervals
        (:func:`hlofuse.runtime.autotune.recheck`), never more often than keeps the re-checks
        under :data:`~hlofuse.runtime.autotune.RECHECK_SHARE` of the time. Tuning measures once;
        a program can turn slower in the process's later state (a GroupNorm block measured
        0.63x of XLA's module when tuned ran 1.36x of jax.jit's time minutes later, in about
        one run in four of one script; docs/guide/tuning.md)."""
        every = config.get("HLOFUSE_RECHECK_S")
        d = st.decision
        if every <= 0 or self.mode() != "on" or self.memory_limit is not None \
                or st.entry is None or d is None:
            return
        # hlofuse's program as tuning decided it (its regions), also where XLA's module won
        st.recheck_prog = (dataclasses.replace(d, variant="default", options={})
                           if d.xla_module else d)
        st.recheck_every, st.recheck_ready = _first_interval(d), None
        st.recheck_at = time.perf_counter() + st.recheck_every
        self.recheck_at = min(self.recheck_at, st.recheck_at)

    def recheck_call(self, st: SignatureState, args, kwargs) -> None:
        """Before a call of a signature whose re-check is due: the first time, compile the two
        programs it times in the background (a decision from the cache may have neither
        non-donating executable; the call path never waits for a compile); once they are
        compiled, re-check on this call's arguments and run what it found. Never fails the
        call: a failure keeps what runs, stops this signature's re-checks, and says why."""
        if not self.lock.acquire(blocking=False):
            return   # another thread tunes or re-checks: this call runs what is decided
        try:
            if st.recheck_at > time.perf_counter() or st.decision is None:
                return
            if st.recheck_ready is None:
                st.recheck_ready, st.recheck_at = "compiling", math.inf
                specs = self.sig.specs(args, kwargs)
                st.recheck_thread = threading.Thread(
                    target=self._recheck_compile, args=(st, specs),
                    name=f"hlofuse-recheck-{self.name}")
                st.recheck_thread.start()
                return
            self._recheck(st, args, kwargs)
        except Exception as e:  # noqa: BLE001 - the boundary: a re-check never fails the call
            if self.opts.pass_options.get("strict"):
                raise
            self._recheck_failed(st, e)
        finally:
            self.recheck_at = min((s.recheck_at for s in list(self.states.values())),
                                  default=math.inf)
            self.lock.release()

    def _recheck_exes(self, st: SignatureState) -> tuple[Exe, Exe]:
        """(hlofuse's program as decided, XLA's own module), both without donation."""
        return (self.exe_of(st, st.recheck_prog, donate=False),
                self.exe_of(st, _xla_module_of(st.recheck_prog), donate=False))

    def _recheck_compile(self, st: SignatureState, specs) -> None:
        """Background thread: compile the re-check's two programs (jax's caches keep them for
        the timed calls), then make the re-check due."""
        try:
            if specs is not None:
                with trace("recheck compile", function=self.name):
                    for exe in self._recheck_exes(st):
                        exe.lower(*specs[0], **specs[1]).compile()
            st.recheck_ready = "ready"
            st.recheck_at = time.perf_counter()
        except Exception as e:  # noqa: BLE001 - a background step never fails a call
            self._recheck_failed(st, e)
        with self.lock:
            self.recheck_at = min(self.recheck_at, st.recheck_at)

    def _recheck(self, st: SignatureState, args, kwargs) -> None:
        prog, plain = self._recheck_exes(st)
        running_xla = st.decision.xla_module
        run_xla, why = at.recheck(lambda spec: plain if at.Variant.of(spec).plain else prog,
                                  args, kwargs, running_xla, name=self.name)
        st.rechecks += 1
        st.recheck_last = why
        if run_xla == running_xla:   # what runs is kept: the next re-check comes later
            st.recheck_every = min(2 * st.recheck_every,
                                   max(at.RECHECK_MAX_S, _first_interval(st.recheck_prog)))
        else:
            d = _xla_module_of(st.recheck_prog) if run_xla else st.recheck_prog
            self.decide(st, dataclasses.replace(d, reason=f"steady-state re-check: {why}"),
                        cached=False, record=False)
            st.recheck_every = _first_interval(d)   # a switch is watched closely again
            if st.entry is not None:
                st.entry.report.note(
                    f"autotune: steady-state re-check {st.rechecks}: "
                    + ("calls run XLA's own module, as jax.jit" if run_xla
                       else "calls run hlofuse's program again") + f" ({why}); this process only")
        st.recheck_at = time.perf_counter() + st.recheck_every

    def _recheck_failed(self, st: SignatureState, e: BaseException) -> None:
        note = machinery_failed("steady-state re-check", e, self.name,
                                "its calls run what was decided, without further re-checks")
        st.recheck_at, st.recheck_ready = math.inf, "failed"
        if st.entry is not None:
            st.entry.report.note(note)

    def decided_options(self, entry) -> dict:
        for st in list(self.states.values()):
            if st.entry is entry and st.decision is not None:
                return at.options_of(st.decision)
        if self.mode() == "off":
            return {}
        d = at.cache().get(decision_key(entry))
        return at.options_of(d) if d is not None else {}

    def tune_now(self, key, args, kwargs, budget_s: float | None):
        """:meth:`hlofuse.frontend.jit.HlofuseFunction.tune`: measure now, short calls included."""
        traced, entry = self.entry_of(args, kwargs)
        if entry is not None and _not_timed(traced, entry):
            return None
        jax.block_until_ready(self.default(*args, **kwargs))
        variants = candidates(entry) if entry is not None else {}
        if entry is None or len(variants) < 2:
            return None
        with self.lock:
            st = self.states.setdefault(key, SignatureState())
            st.calls = max(st.calls, 1)
            st.entry, st.key, st.decision, st.fn = entry, decision_key(entry), None, None
            self.fast = False
            self.tune(st, None, args, kwargs, min_call_s=0.0,
                      budget_s=at.budget() if budget_s is None else budget_s)
        return st.decision


def _xla_module_of(d: at.Decision) -> at.Decision:
    """The decision to run XLA's own module in place of ``d``'s program (its regions kept)."""
    return dataclasses.replace(d, variant=at.XLA_MODULE, options={})


def _first_interval(d: at.Decision) -> float:
    """Seconds from a decision to its first re-check: ``HLOFUSE_RECHECK_S``, or longer where a
    re-check of this program would take more than
    :data:`~hlofuse.runtime.autotune.RECHECK_SHARE` of that time."""
    return max(config.get("HLOFUSE_RECHECK_S"),
               at.recheck_cost_s(d.default_s) / at.RECHECK_SHARE)


def decision_key(entry, text: str | None = None) -> str:
    """Module decisions are keyed by the module as the passes made it (before cached region
    decisions changed it), so a later process finds them. ``text``: the optimized module's
    text when the caller has it."""
    opt = entry.optimized
    return at.cache_key(opt.base_hash or at.module_hash(text if text is not None else opt.text),
                        at.device_key())


def candidates(entry, text: str | None = None) -> dict:
    """What tuning times against the program as optimized: XLA-option variants, kernel
    variants (hlofuse's own settings, :data:`hlofuse.runtime.autotune.KERNEL_VARIANTS`), then
    one variant per distinct kernelized region with that region left to XLA."""
    text = text if text is not None else entry.optimized.text
    opts = at.applicable_variants(jax.default_backend(), text)
    out = {"default": at.Variant()}
    # second: when the budget allows few variants, this comparison is the one kept
    out[at.XLA_MODULE] = at.Variant(plain=True)
    out.update((n, at.Variant.of(o)) for n, o in opts.items() if n != "default")
    out.update((n, at.Variant(settings=s)) for n, s in
               at.applicable_kernel_variants(jax.default_backend(), text).items())
    # regions held back unmeasured (gpu/tpu) are timed too: from the module with every
    # kernel (``default`` is then that module; see Tuning.tune)
    out.update(at.region_variants(measured_form(entry.optimized).report.kernels))
    return out


def _not_timed(traced, entry) -> bool:
    """Whether autotune must not time this function: running it has side effects (host
    callbacks other than ``pure_callback``, which jax may run any number of times). Its report
    says so."""
    if not traced.jaxpr.effects:
        return False
    entry.report.note(EFFECTS_NOT_TIMED)
    return True


def report_decision(report, d: at.Decision, cached: bool) -> None:
    """Put a measured decision into a report: the options note, and per region the outcome
    with the measured kernel/XLA ratio (and the cost model's prediction) in
    ``region.extra['measured']``. (The report of what runs, ``f.report(...)``, is the decided
    variant's: there the regions kept as XLA's code say so as their reason.)"""
    report.note(d.note(cached))
    for r in report.regions:
        c = d.regions.get(r.extra.get("region_hash"))
        if c is None:
            continue
        text = c.get("reason", "") + (" (cached decision)" if cached else "")
        r.extra["measured"] = text
        if c.get("choice") == "xla" and not r.kernel and "merged_into" not in r.extra:
            r.reason = text
