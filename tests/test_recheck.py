"""Steady-state re-checks (hlofuse.frontend.tuning, hlofuse.runtime.autotune.recheck): a decided
signature's calls are timed again against XLA's own module now and then, and run whichever is
faster in the process's state now; the disk keeps tuning's decision.

Decisions run on a fake clock (tests/fake_clock.py: programs are real and run, only the
harness's timer is replaced), so nothing here depends on wall-clock time; one test times for
real and asserts only what runs and what it computes.
"""

from __future__ import annotations

import math

import numpy as np
import pytest

import jax
import jax.numpy as jnp

import hlofuse
from hlofuse.core.report import HlofuseWarning
from hlofuse.frontend.dispatch import Dispatcher
from hlofuse.frontend.tuning import SignatureState, _first_interval
from hlofuse.runtime import autotune as at
from hlofuse.runtime.testing import assert_same
from tests.fake_clock import clock_by_text, is_xla_module
from tests.tuning_util import run_threads, small_args as _args, small_fn as _f


@pytest.fixture
def due_at_once(monkeypatch):
    """Re-checks due as soon as allowed: the first right after the decision, no cost bound."""
    monkeypatch.setenv("HLOFUSE_RECHECK_S", "1e-9")
    monkeypatch.setattr(at, "RECHECK_SHARE", 1e12)


@pytest.fixture
def clock(monkeypatch):
    """hlofuse's program takes ``state['hlofuse']`` seconds per call, XLA's own module 2 ms."""
    state = {"hlofuse": 1e-3, "timed": []}

    def cost(text):
        xla = is_xla_module(text)
        state["timed"].append("xla" if xla else "hlofuse")
        return 2e-3 if xla else state["hlofuse"]

    clock_by_text(monkeypatch, cost)
    return state


def _state(f):
    (st,) = f._dispatch.states.values()
    return st


def _recheck(f, x, w):
    """Calls until one re-checked: the first re-check of a signature compiles its two programs
    in the background (that call runs what is decided), the next call re-checks."""
    st = _state(f)
    n = st.rechecks
    out = f(x, w)
    if st.rechecks == n:
        assert st.recheck_ready in ("compiling", "ready")
        st.recheck_thread.join()
        assert st.recheck_ready == "ready"
        out = f(x, w)
    assert st.rechecks == n + 1
    return out


def test_a_program_turned_slower_runs_xla_module_until_it_is_faster_again(
        cache_dir, due_at_once, clock):
    x, w = _args()
    want = jax.jit(_f)(x, w)
    f = hlofuse.jit(_f, autotune=True, tiered=False)
    f(x, w)
    f(x, w)                                   # tuned: hlofuse's program (1 ms) beats XLA's (2 ms)
    st = _state(f)
    tuned = st.decision
    assert tuned is not None and not tuned.xla_module and math.isfinite(st.recheck_at)

    _recheck(f, x, w)                         # still faster: kept, one screening window only
    assert not st.decision.xla_module and "what runs is kept" in st.recheck_last
    assert st.recheck_every > 1e-9            # kept: the interval doubles

    clock["hlofuse"] = 5e-3                   # the process's state changed: now 2.5x slower
    out = _recheck(f, x, w)
    assert st.decision.xla_module, st.recheck_last
    assert f.autotune_decision(x, w).reason.startswith("steady-state re-check")
    assert_same(out, want, "reassociate")
    assert f._dispatch.fast and f._dispatch.fast_fn.plain     # calls run XLA's own module
    assert any("steady-state re-check 2: calls run XLA's own module" in n
               for n in f.report(x, w).notes)
    assert_same(f(x, w), want, "reassociate")

    clock["hlofuse"] = 1e-3                   # and faster again: hlofuse's program returns
    clock["timed"].clear()
    _recheck(f, x, w)
    assert not st.decision.xla_module and st.decision.variant == tuned.variant
    assert st.fn is None or not st.fn.plain
    assert {"xla", "hlofuse"} <= set(clock["timed"])
    assert_same(f(x, w), want, "reassociate")
    # the disk keeps tuning's decision: a re-check decides for this process only
    disk = at.DecisionCache().get(st.key)
    assert disk is not None and disk.variant == tuned.variant and not disk.xla_module


def test_a_close_screening_does_not_switch(cache_dir, due_at_once, clock, monkeypatch):
    """Slower than XLA's module in one short window, but not in the tuning rule's windows:
    hlofuse's program keeps running (a screening only calls the rule, never decides)."""
    x, w = _args()
    f = hlofuse.jit(_f, autotune=True, tiered=False)
    f(x, w)
    f(x, w)
    st = _state(f)
    windows = []
    rule = at._decide_module_measured

    def spell_over(*a, **kw):
        clock["hlofuse"] = 1e-3               # the slow spell is over by the rule's windows
        windows.append(1)
        return rule(*a, **kw)

    monkeypatch.setattr(at, "_decide_module_measured", spell_over)
    clock["hlofuse"] = 2.2e-3
    _recheck(f, x, w)
    assert windows and not st.decision.xla_module, st.recheck_last


def test_xla_module_chosen_by_tuning_is_rechecked_too(cache_dir, due_at_once, clock):
    x, w = _args()
    clock["hlofuse"] = 3e-3                   # tuning finds hlofuse's program slower
    f = hlofuse.jit(_f, autotune=True, tiered=False)
    f(x, w)
    f(x, w)
    st = _state(f)
    assert st.decision.xla_module
    clock["hlofuse"] = 1e-3
    _recheck(f, x, w)
    assert not st.decision.xla_module, st.recheck_last
    assert_same(f(x, w), jax.jit(_f)(x, w), "reassociate")


def test_a_failing_recheck_keeps_what_runs_and_stops(cache_dir, due_at_once, clock,
                                                     monkeypatch):
    x, w = _args()
    f = hlofuse.jit(_f, autotune=True, tiered=False)
    f(x, w)
    f(x, w)
    st = _state(f)
    decided = st.decision

    def boom(*a, **kw):
        raise RuntimeError("re-check exploded")

    monkeypatch.setattr(at, "recheck", boom)
    f(x, w)
    st.recheck_thread.join()
    with pytest.warns(HlofuseWarning, match="steady-state re-check failed"):
        out = f(x, w)
    assert_same(out, jax.jit(_f)(x, w), "reassociate")
    assert st.decision is decided and st.recheck_at == math.inf
    assert f._dispatch.recheck_at == math.inf
    assert any("re-check exploded" in n for n in f.report(x, w).notes)
    f(x, w)                                   # no further re-check
    assert st.rechecks == 0


@pytest.mark.parametrize("how", ["env-zero", "autotune-cached", "memory-limit"])
def test_no_rechecks_when_off(cache_dir, clock, monkeypatch, how):
    x, w = _args()
    kw = {"autotune": True, "tiered": False}
    if how == "env-zero":
        monkeypatch.setenv("HLOFUSE_RECHECK_S", "0")
    elif how == "memory-limit":
        kw["memory_limit"] = "64GiB"
    f = hlofuse.jit(_f, **kw)
    f(x, w)
    f(x, w)
    if how == "autotune-cached":   # a decision from the cache, in production mode
        g = hlofuse.jit(_f, autotune="cached", tiered=False)
        g(x, w)
        g(x, w)
        assert _state(g).decision is not None
        f = g
    assert _state(f).recheck_at == math.inf and f._dispatch.recheck_at == math.inf


def test_a_cached_decision_is_rechecked_in_a_later_process(cache_dir, due_at_once, clock):
    x, w = _args()
    f = hlofuse.jit(_f, autotune=True, tiered=False)
    f(x, w)
    f(x, w)
    at.cache().clear_memory()                 # a later process: the decision comes from disk
    g = hlofuse.jit(_f, autotune=True, tiered=False)
    g(x, w)
    st = _state(g)
    assert st.cached and math.isfinite(st.recheck_at)
    clock["hlofuse"] = 5e-3
    _recheck(g, x, w)
    assert st.decision.xla_module
    assert_same(g(x, w), jax.jit(_f)(x, w), "reassociate")


def test_recheck_of_a_donating_function_times_for_real_without_consuming(cache_dir, due_at_once,
                                                                         monkeypatch):
    """Real timing: the re-check runs the non-donating twins on the call's arguments, then the
    call itself donates them, as under jax.jit."""
    monkeypatch.setenv("HLOFUSE_AUTOTUNE_BUDGET_S", "2")

    def step(p, x):
        return jax.tree_util.tree_map(lambda a: a - 0.1 * jnp.tanh(a @ x).sum(), p)

    rng = np.random.default_rng(1)
    x = jnp.asarray(rng.standard_normal((64, 64)), jnp.float32)

    def params():
        return {"w": jnp.asarray(rng.standard_normal((64, 64)), jnp.float32)}

    f = hlofuse.jit(step, donate_argnums=0, autotune=True, tiered=False)
    ref = jax.jit(step)
    for _ in range(2):
        f(params(), x)
    st = _state(f)
    assert st.decision is not None and math.isfinite(st.recheck_at)
    f(params(), x)
    st.recheck_thread.join()
    assert st.recheck_ready == "ready"
    p = params()
    want = ref(p, x)
    out = f(p, x)
    assert st.rechecks == 1, st.recheck_last
    assert p["w"].is_deleted()               # donated by the call, not by the re-check
    assert_same(out, want, "reassociate")


@pytest.mark.parametrize("running_xla", [False, True])
@pytest.mark.parametrize("window, want", [
    ("untimed", "not timed (too long): what runs is kept"),
    ("same", "hlofuse's program compiles to XLA's own module"),
])
def test_a_recheck_that_cannot_compare_keeps_what_runs(monkeypatch, running_xla, window, want):
    seen = []

    def measure(make, args, variants, **kw):
        seen.append(sorted(variants))
        if window == "untimed":
            return at.Measurement({"default": 1.0}, [], 0.5, 0, [], "too long")
        return at.Measurement({"default": 1.0}, [], 0.5, 0, [at.XLA_MODULE])

    monkeypatch.setattr(at, "measure", measure)
    run_xla, why = at.recheck(lambda spec: None, (), {}, running_xla)
    assert run_xla == running_xla and why == want
    assert seen == [["default", at.XLA_MODULE]]          # the screening only


def test_recheck_intervals_keep_its_cost_under_its_share(monkeypatch):
    """The first re-check of a long program comes late enough for its cost to stay under
    RECHECK_SHARE of the time (a 2 s training step: 5 rounds of two programs, ~20 s)."""
    monkeypatch.delenv("HLOFUSE_RECHECK_S", raising=False)
    short = at.Decision("default", {}, {}, default_s=1e-3)
    long = at.Decision("default", {}, {}, default_s=2.0)
    assert _first_interval(short) == 30.0
    assert _first_interval(long) == pytest.approx(at.recheck_cost_s(2.0) / at.RECHECK_SHARE)
    assert at.recheck_cost_s(2.0) / _first_interval(long) <= at.RECHECK_SHARE + 1e-12


def test_rechecks_while_threads_call(cache_dir, due_at_once, clock):
    """Calls from several threads while re-checks switch what runs: every call right, one
    re-check at a time (the others' calls run what is decided meanwhile), none hangs."""
    x, w = _args()
    want = jax.jit(_f)(x, w)
    f = hlofuse.jit(_f, autotune=True, tiered=False)
    f(x, w)
    f(x, w)
    st = _state(f)

    def calls(i):
        outs = []
        for k in range(40):
            if i == 0 and k % 10 == 0:   # the process's state flips now and then
                clock["hlofuse"] = 5e-3 if clock["hlofuse"] < 2e-3 else 1e-3
            outs.append(f(x, w))
        return outs

    for outs in run_threads(4, calls):
        for out in outs:
            assert_same(out, want, "reassociate")
    assert st.rechecks >= 2, st.recheck_last


@pytest.mark.parametrize("call_s", [1e-3, 10.0])
def test_recheck_intervals_double_up_to_the_longest(monkeypatch, call_s):
    """Each re-check that keeps what runs doubles the interval, up to RECHECK_MAX_S, or up to
    what keeps a long program's re-checks under RECHECK_SHARE (a 10 s step: ~2.9 hours)."""
    monkeypatch.delenv("HLOFUSE_RECHECK_S", raising=False)
    monkeypatch.setattr(at, "recheck", lambda *a, **kw: (False, "kept"))
    monkeypatch.setattr(Dispatcher, "_recheck_exes", lambda self, st: (None, None))
    d = at.Decision("default", {}, {}, default_s=call_s)
    st = SignatureState(decision=d, recheck_prog=d, recheck_every=_first_interval(d))
    disp = Dispatcher.__new__(Dispatcher)   # only _recheck runs: no function behind it
    disp.name = "f"
    seen = []
    for _ in range(12):
        disp._recheck(st, (), {})
        seen.append(st.recheck_every)
    assert seen == sorted(seen) and st.rechecks == 12
    assert seen[-1] == max(at.RECHECK_MAX_S, _first_interval(d))
    assert all(at.recheck_cost_s(call_s) / s <= at.RECHECK_SHARE + 1e-12 for s in seen)


def test_recheck_of_a_function_with_static_and_keyword_arguments(cache_dir, due_at_once, clock):
    """The background compile lowers from the call's specs (statics as they are, keywords)."""
    def g(x, w, *, scale, act):
        return (jnp.tanh if act == "tanh" else jax.nn.relu)(x @ w * scale).sum(axis=0)

    x, w = _args()
    f = hlofuse.jit(g, static_argnames="act", autotune=True, tiered=False)
    f(x, w, scale=2.0, act="tanh")
    f(x, w, scale=2.0, act="tanh")
    st = _state(f)
    clock["hlofuse"] = 5e-3
    n = st.rechecks
    f(x, w, scale=2.0, act="tanh")
    st.recheck_thread.join()
    assert st.recheck_ready == "ready"
    out = f(x, w, scale=2.0, act="tanh")
    assert st.rechecks == n + 1 and st.decision.xla_module, st.recheck_last
    assert_same(out, jax.jit(g, static_argnames="act")(x, w, scale=2.0, act="tanh"),
                "reassociate")
