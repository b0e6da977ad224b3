"""Tiered first calls: XLA's code at once, hlofuse's module built in the background.

The rest of the suite runs with ``HLOFUSE_TIERED=0`` (conftest), so its first calls run
hlofuse's module; these tests turn tiering on per function (``tiered=True``).
"""

import threading
import warnings

import numpy as np
import pytest

import jax
import jax.numpy as jnp

import hlofuse
from hlofuse.core import compat
from hlofuse.runtime import program as runtime
from hlofuse.runtime.program import Program
from hlofuse.runtime.testing import assert_same
from hlofuse.runtime import module_cache as mc


def model(x, b):
    return jnp.tanh(x * 1.5 + b) * x - 0.25


def _args(rows=8, cols=128, seed=0):
    r = np.random.default_rng(seed)
    return (jnp.asarray(r.standard_normal((rows, cols), np.float32)),
            jnp.asarray(r.standard_normal(cols, np.float32)))


@pytest.fixture
def gated(monkeypatch):
    """Hold every background build until the test opens the gate (deterministic 'building')."""
    gate = threading.Event()
    orig = runtime.Program.entry

    def entry(self, *a, **k):
        if threading.current_thread().name.startswith("hlofuse-build-"):
            assert gate.wait(60), "gate never opened"
        return orig(self, *a, **k)
    monkeypatch.setattr(runtime.Program, "entry", entry)
    yield gate
    gate.set()


def _compiles():
    events = []
    jax.monitoring.register_event_duration_secs_listener(
        lambda ev, secs, **kw: events.append(ev) if ev.endswith("backend_compile_duration") else None)
    return events


def test_first_call_runs_xlas_code_then_switches_to_the_kernels(gated):
    args = _args()
    want = jax.jit(model)(*args)
    f = hlofuse.jit(model, tiered=True, autotune=False)
    first = f(*args)
    assert f.tier_status(*args)["state"] == "building"
    np.testing.assert_array_equal(np.asarray(first), np.asarray(want))   # XLA's own code
    second = f(*args)                                                     # still building
    np.testing.assert_array_equal(np.asarray(second), np.asarray(want))
    assert f.compilations == 0   # nothing optimized yet: the build waits at the gate

    gated.set()
    assert f.block_until_optimized(timeout=120)
    st = f.tier_status(*args)
    assert st["state"] == "ready" and st["seconds"] > 0 and st["error"] is None
    assert f.compilations == 1
    events = _compiles()
    out = f(*args)                           # hlofuse's executable, compiled in the background
    assert events == [], "the call after the switch compiled again"
    assert len(f.report(*args).kernels) == 1   # the rewrite fired (elementwise kernel)
    assert_same(out, want, category="reassociate")


def test_tiering_off_builds_during_the_first_call(monkeypatch):
    args = _args(seed=1)
    f = hlofuse.jit(model, tiered=False, autotune=False)
    f(*args)
    assert f.compilations == 1 and f.tier_status(*args)["state"] is None
    monkeypatch.setenv("HLOFUSE_TIERED", "1")           # tiered=None follows the variable
    g = hlofuse.jit(model, autotune=False)
    g(*args)
    assert g.block_until_optimized(timeout=120) and g.tier_status(*args)["state"] == "ready"


def test_transformations_and_lowering_never_tier():
    args = _args(seed=2)
    f = hlofuse.jit(model, tiered=True, autotune=False)
    x, b = args
    g = jax.grad(lambda x: f(x, b).sum())(x)
    assert_same(g, jax.grad(lambda x: model(x, b).sum())(x), category="grad")
    v = jax.vmap(lambda x: f(x, b))(jnp.stack([x, x + 1]))
    assert_same(v, jax.vmap(lambda x: model(x, b))(jnp.stack([x, x + 1])), category="reassociate")
    assert_same(jax.jit(f)(*args), model(*args), category="reassociate")
    # none of these ran XLA's stand-in: every program was built in place
    assert all(st.tier is None for st in f._tuning.values())
    assert len(f.lower(*args).report.kernels) == 1


def test_static_keyword_and_donated_arguments():
    def scaled(x, b, n=2, s=1.0):
        for _ in range(n):
            x = model(x, b) * s
        return x
    args = _args(seed=3)
    f = hlofuse.jit(scaled, tiered=True, autotune=False, static_argnames="n",
                    donate_argnums=0)
    want = [jax.jit(scaled, static_argnames="n")(*args, n=n, s=0.5) for n in (2, 3)]
    for n, w in zip((2, 3), want):
        x = jnp.array(args[0])
        out = f(x, args[1], n=n, s=0.5)
        assert x.is_deleted()                 # the stand-in call donates like jax.jit does
        np.testing.assert_array_equal(np.asarray(out), np.asarray(w))
    assert f.block_until_optimized(timeout=120)
    for n, w in zip((2, 3), want):
        assert f.tier_status(jnp.array(args[0]), args[1], n=n, s=0.5)["state"] == "ready"
        x = jnp.array(args[0])
        assert_same(f(x, args[1], n=n, s=0.5), w, category="reassociate")
        assert x.is_deleted()
    assert f.compilations == 2


def test_a_failed_background_build_keeps_xlas_code_and_warns(monkeypatch):
    def broken(self, *a, **k):
        raise RuntimeError("planted build failure")
    args = _args(seed=4)
    f = hlofuse.jit(model, tiered=True, autotune=False)
    monkeypatch.setattr(runtime.Program, "entry", broken)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        out = f(*args)
        assert f.block_until_optimized(timeout=120)
    st = f.tier_status(*args)
    assert st["state"] == "failed" and "planted build failure" in st["error"]
    assert any(issubclass(w.category, hlofuse.HlofuseWarning) and "planted" in str(w.message)
               for w in caught)
    want = jax.jit(model)(*args)
    np.testing.assert_array_equal(np.asarray(out), np.asarray(want))
    np.testing.assert_array_equal(np.asarray(f(*args)), np.asarray(want))


def test_a_warm_module_cache_builds_in_place(tmp_path, monkeypatch):
    monkeypatch.setenv("HLOFUSE_CACHE_DIR", str(tmp_path))
    monkeypatch.setenv(mc.ENV, "1")
    monkeypatch.setenv(mc.XLA_ENV, "0")
    args = _args(seed=5)
    first = hlofuse.jit(model, tiered=True, autotune=False)
    first(*args)
    assert first.block_until_optimized(timeout=120)
    assert first.tier_status(*args)["state"] == "ready"
    again = hlofuse.jit(model, tiered=True, autotune=False)   # as in a second process
    out = again(*args)
    assert again.tier_status(*args)["state"] is None          # cheap: no stand-in
    assert again.compilations == 1 and len(again.report(*args).kernels) == 1
    assert_same(out, model(*args), category="reassociate")


def test_concurrent_first_calls_build_once(gated):
    args = _args(seed=6)
    f = hlofuse.jit(model, tiered=True, autotune=False)
    want = np.asarray(jax.jit(model)(*args))
    barrier = threading.Barrier(4)
    outs, errors = [], []

    def worker():
        try:
            barrier.wait(timeout=60)
            outs.append(np.asarray(f(*args)))
        except BaseException as e:  # noqa: BLE001 - reported below
            errors.append(repr(e))
    threads = [threading.Thread(target=worker) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=120)
    assert not errors, errors
    for o in outs:
        np.testing.assert_array_equal(o, want)
    gated.set()
    assert f.block_until_optimized(timeout=120)
    assert f.compilations == 1
    assert_same(f(*args), want, category="reassociate")


def test_thread_local_jax_settings_build_in_place():
    """A background thread would not see ``jax.default_matmul_precision`` set as a context
    manager around the call: such calls build hlofuse's module during the call."""
    def mm(x, w):
        return jnp.tanh(x @ w) * 2.0
    r = np.random.default_rng(7)
    x = jnp.asarray(r.standard_normal((16, 64), np.float32))
    w = jnp.asarray(r.standard_normal((64, 32), np.float32))
    f = hlofuse.jit(mm, tiered=True, autotune=False)
    with jax.default_matmul_precision("highest"):
        out = f(x, w)
        assert f.tier_status(x, w)["state"] is None and f.compilations == 1
        want = jax.jit(mm)(x, w)
    assert_same(out, want, category="reassociate")
    g = hlofuse.jit(mm, tiered=True, autotune=False)
    g(x, w)                                   # no settings: tiered
    assert g.tier_status(x, w)["state"] in ("building", "ready")
    assert g.block_until_optimized(timeout=120)


def test_a_process_that_exits_during_the_build_finishes_it_cleanly(tmp_path):
    """The background build is not a daemon thread: a script that returns right after its
    first call waits for the build (no teardown under a running XLA compile) and leaves the
    optimized module in the cache for its next run."""
    import os
    import subprocess
    import sys
    script = (
        "import jax.numpy as jnp, hlofuse\n"
        "f = hlofuse.jit(lambda x, b: jnp.tanh(x * 1.5 + b) * x - 0.25, tiered=True)\n"
        "y = f(jnp.ones((8, 128)), jnp.ones(128))\n"
        "print(float(y[0, 0]))\n")
    env = dict(os.environ, HLOFUSE_CACHE_DIR=str(tmp_path), HLOFUSE_MODULE_CACHE="1",
               HLOFUSE_XLA_CACHE="0", HLOFUSE_AUTOTUNE="0")
    p = subprocess.run([sys.executable, "-c", script], env=env, capture_output=True,
                       text=True, timeout=300)
    assert p.returncode == 0, p.stderr[-2000:]
    assert abs(float(p.stdout.split()[-1]) - (np.tanh(2.5) - 0.25)) < 1e-5
    assert list((tmp_path / "traced").glob("*.json")), "the build did not finish before exit"


def test_a_stand_in_that_fails_raises_and_is_retried(monkeypatch):
    """When XLA's stand-in call itself raises, the error reaches the caller and the signature
    is not left 'building' with nothing building it."""
    args = _args(seed=8)
    f = hlofuse.jit(model, tiered=True, autotune=False)
    real = Program.traced_fun
    calls = []

    def failing(self, *a, **k):   # XLA's code for the call: the traced jaxpr inlined
        calls.append(1)
        if len(calls) == 1:
            raise RuntimeError("planted stand-in failure")
        return real(self, *a, **k)
    monkeypatch.setattr(Program, "traced_fun", failing)
    with pytest.raises(RuntimeError, match="planted stand-in failure"):
        f(*args)
    assert f.tier_status(*args)["state"] is None
    out = f(*args)                                  # tried again: tiered this time
    assert f.block_until_optimized(timeout=120)
    assert f.tier_status(*args)["state"] == "ready"
    np.testing.assert_array_equal(np.asarray(out), np.asarray(jax.jit(model)(*args)))


def test_calls_after_the_switch_take_jaxs_cpp_dispatch(monkeypatch):
    """After the switch a call costs what a jax.jit call costs: no Python dispatch (~0.1 ms
    per call otherwise). (The first call's trace once left jax.jit's C++ dispatch by an
    exception, which marks that signature "fall back to Python" for good; now the trace runs
    XLA's code and says so in the call's CallInfo.)"""
    pjit = compat.python_dispatch()
    python_calls = []
    orig = pjit._run_python_pjit

    def spy(*a, **k):
        python_calls.append(1)
        return orig(*a, **k)
    monkeypatch.setattr(pjit, "_run_python_pjit", spy)
    args = _args()
    f = hlofuse.jit(model, tiered=True, autotune=False)
    f(*args)
    assert f.block_until_optimized(timeout=120)
    assert f.tier_status(*args)["state"] == "ready"
    jax.block_until_ready(f(*args))       # fills the C++ entry (Python path once)
    python_calls.clear()
    for _ in range(5):
        jax.block_until_ready(f(*args))
    assert python_calls == [], f"{len(python_calls)} of 5 calls took jax's Python dispatch"


def test_the_traced_function_is_traced_once_and_copied_not_evaluated(monkeypatch, gated):
    """The user's Python runs once (``Program.jaxpr``); the tiered first call's plain jit and
    the background export copy that jaxpr's equations into their traces instead of binding
    every primitive again (:func:`hlofuse.runtime.program.run_jaxpr`). Outside a jit trace (an eager
    call, under vmap) the jaxpr is evaluated, with the same values."""
    calls = []

    def counted(x, b):
        calls.append(1)
        return model(x, b)

    evaluated = []
    orig_eval = jax.core.eval_jaxpr
    spy = lambda *a, **k: evaluated.append(1) or orig_eval(*a, **k)  # noqa: E731
    monkeypatch.setattr(compat, "eval_jaxpr", spy)          # hlofuse's own evaluations
    monkeypatch.setattr(compat._core, "eval_jaxpr", spy)    # what jaxpr_as_fun evaluates with
    args = _args()
    want = jax.jit(model)(*args)
    f = hlofuse.jit(counted, tiered=True, autotune=False)
    first = f(*args)
    assert f.tier_status(*args)["state"] == "building"
    gated.set()
    assert f.block_until_optimized(60)
    assert f.tier_status(*args)["state"] == "ready"
    later = f(*args)
    assert len(calls) == 1 and not evaluated      # one trace of the Python; nothing evaluated
    np.testing.assert_array_equal(np.asarray(first), np.asarray(want))
    assert_same(later, want, "reassociate")

    program = f.all_programs()[0]
    closed = program.jaxpr(runtime.signature_of([jax.typeof(a) for a in args]))
    copied = jax.make_jaxpr(lambda *xs: runtime.run_jaxpr(closed, xs))(*args)
    assert [e.primitive for e in copied.jaxpr.eqns] == [e.primitive for e in closed.jaxpr.eqns]
    assert not evaluated
    eager = runtime.run_jaxpr(closed, args)                          # no trace: evaluated
    batched = jax.vmap(lambda x: runtime.run_jaxpr(closed, (x, args[1]))[0])(
        jnp.stack([args[0], args[0]]))
    assert evaluated
    assert_same(eager[0], want, "reassociate")     # op by op: XLA fuses tanh differently
    assert_same(batched, jnp.stack([want, want]), "reassociate")


@pytest.mark.parametrize("threshold,level", [(1e9, "DEBUG"), (0.0, "INFO")])
def test_the_background_build_logs_at_info_only_when_it_took_long(monkeypatch, caplog,
                                                                  threshold, level):
    """A user waits on builds that take seconds and should see them; every small jitted helper
    printing a line of its own is noise (its build is logged at DEBUG)."""
    from hlofuse.runtime import autotune as at
    monkeypatch.setattr(at, "LOG_AFTER_S", threshold)
    args = _args(seed=7)
    f = hlofuse.jit(model, tiered=True, autotune=False)
    with caplog.at_level("DEBUG", logger="hlofuse"):
        f(*args)
        assert f.block_until_optimized(timeout=120)
    got = [r.levelname for r in caplog.records if "optimized in the background" in r.getMessage()]
    assert got == [level]
