"""Nothing of hlofuse's own machinery fails a user's call (issue 47, item 6).

Each fault below makes one step of hlofuse's machinery fail in turn: building the optimized
program (a pass, a kernel build, the export, the module cache), verification, tuning (a variant
that does not compile, a timing that raises MemoryError, a budget that runs out, a variant
dropped for it, a variant whose results differ, the decision cache's writes and reads) and the
caches' directories (a file where the directory should be, a full disk, damaged entries). Every
call of a small program with a reduction and a matmul epilogue (kernels on CPU), run through
the tiered and the in-place first call with tuning on, must return ``jax.jit``'s result; where a
fault cost hlofuse its program, the report says what failed and where, and a decision made
under a fault is not written to disk.

The faults are injected with ``monkeypatch`` at the function that does the step, so the rest of
the call path (tracing, the jax caches, the background thread, the decision logic) runs as it
does for a user.
"""

from __future__ import annotations

import errno
import os

import numpy as np
import pytest

import jax
import jax.numpy as jnp

import hlofuse
from hlofuse.core import pipeline
from hlofuse.runtime import program as runtime
from hlofuse.runtime import autotune as at
from hlofuse.runtime import module_cache as mc

REAL_READ_ALL = at.DecisionCache._read_all
CALLS = 6     # first call, tuning at the second, decided calls after it


def _f(x, w):
    h = jnp.tanh(x @ w) * 2.0 + 1.0
    return jax.nn.softmax(h, -1).sum(0) + jnp.mean(h * h)


R = np.random.default_rng(0)
X = R.standard_normal((256, 128)).astype(np.float32)
W = (R.standard_normal((128, 128)) * 0.1).astype(np.float32)


@pytest.fixture
def caches(tmp_path, monkeypatch):
    """Decision and module caches of their own, tuning on, nothing carried between tests."""
    monkeypatch.setenv("HLOFUSE_CACHE_DIR", str(tmp_path / "cache"))
    monkeypatch.setenv(at.ENV_ENABLE, "on")
    monkeypatch.setenv(mc.ENV, "1")
    monkeypatch.setenv(mc.XLA_ENV, "0")   # never touch jax's global cache config in tests
    at.cache().clear_memory()
    yield tmp_path / "cache"
    at.cache().clear_memory()


def _raise(exc):
    def boom(*a, **k):
        raise exc
    return boom


# -- the faults: name -> function(monkeypatch, cache_dir) that installs it ----------------------
def pass_raises(mp, d):
    cls = pipeline._REGISTRY["fuse-reduction"]
    mp.setattr(cls, "run", _raise(RuntimeError("injected: a pass failed")))


def kernel_build_raises(mp, d):
    from hlofuse.passes import kernelize
    mp.setattr(kernelize, "lower_region", _raise(RuntimeError("injected: a kernel build failed")))


def export_raises(mp, d):
    mp.setattr(runtime, "export_optimized", _raise(RuntimeError("injected: export failed")))


def export_memory_error(mp, d):
    mp.setattr(runtime, "export_optimized", _raise(MemoryError("injected")))


def variant_compile_error(mp, d):
    real = at._Factory.__call__

    def make(self, options):
        if options:
            raise RuntimeError("injected: a variant did not compile")
        return real(self, options)
    mp.setattr(at._Factory, "__call__", make)


def timing_memory_error(mp, d):
    mp.setattr(at, "time_calls", _raise(MemoryError("injected: out of memory while timing")))


def tuning_raises(mp, d):
    mp.setattr(at, "measure", _raise(KeyError("xla:c7a2c64c9e22")))


def budget_runs_out(mp, d):
    mp.setattr(at, "budget", lambda: 0.0)


def variant_results_differ(mp, d):
    real = at._Factory.__call__

    def make(self, options):
        fn = real(self, options)
        if not options:
            return fn
        return lambda *a, **k: jax.tree.map(lambda y: y + 1.0, fn(*a, **k))
    mp.setattr(at._Factory, "__call__", make)


def cache_dir_is_a_file(mp, d):
    d.parent.mkdir(parents=True, exist_ok=True)
    d.write_text("not a directory")


def disk_full(mp, d):
    real = os.replace

    def replace(src, dst, *a, **k):
        if "hlofuse" in str(dst) or str(d) in str(dst):
            raise OSError(errno.ENOSPC, "No space left on device (injected)")
        return real(src, dst, *a, **k)
    mp.setattr(os, "replace", replace)


def decision_cache_read_raises(mp, d):
    mp.setattr(at.DecisionCache, "_read_all", _raise(MemoryError("injected")))


def module_cache_load_raises(mp, d):
    mp.setattr(mc, "load", _raise(OSError(errno.EIO, "injected: I/O error")))
    mp.setattr(mc, "load_traced", _raise(OSError(errno.EIO, "injected: I/O error")))


def module_cache_store_raises(mp, d):
    mp.setattr(mc, "store", _raise(OSError(errno.ENOSPC, "injected")))
    mp.setattr(mc, "store_traced", _raise(OSError(errno.ENOSPC, "injected")))


FAULTS = [pass_raises, kernel_build_raises, export_raises, export_memory_error,
          variant_compile_error, timing_memory_error, tuning_raises, budget_runs_out,
          variant_results_differ, cache_dir_is_a_file, disk_full, decision_cache_read_raises,
          module_cache_load_raises, module_cache_store_raises]


#: what the report says after each fault that cost hlofuse its program or its tuning
SAYS = {
    "pass_raises": "failed in pass 'fuse-reduction'",
    "kernel_build_raises": "kernel build failed (RuntimeError: injected: a kernel build failed)",
    "export_raises": "hlofuse's program build failed for _f (RuntimeError: injected: export failed)",
    "export_memory_error": "hlofuse's program build failed for _f (MemoryError",
    "module_cache_load_raises": "hlofuse's program build failed for _f (OSError",
    "timing_memory_error": "hlofuse's tuning failed for _f (MemoryError",
    "tuning_raises": "hlofuse's tuning failed for _f (KeyError: 'xla:c7a2c64c9e22')",
    "decision_cache_read_raises": "hlofuse's tuning (first sight) failed for _f (MemoryError",
}


def _said(report) -> str:
    return "\n".join(list(report.notes) + [r.reason or "" for r in report.regions])


@pytest.mark.parametrize("tiered", [False, True], ids=["in-place", "tiered"])
@pytest.mark.parametrize("fault", FAULTS, ids=lambda f: f.__name__)
def test_every_call_returns_jax_jit_result_whatever_fails(fault, tiered, caches, monkeypatch):
    import warnings
    want = np.asarray(jax.jit(_f)(X, W))
    fault(monkeypatch, caches)
    g = hlofuse.jit(_f, tiered=tiered)
    outs = []
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")   # the fallbacks warn; what they say is checked below
        for i in range(CALLS):
            outs.append(np.asarray(g(X, W)))
            if i == 0:
                g.block_until_optimized(60)
        said = _said(g.report(X, W))
    for i, o in enumerate(outs):
        np.testing.assert_allclose(o, want, rtol=2e-5, atol=2e-5, err_msg=f"call {i + 1}")
    if fault.__name__ in SAYS:
        assert SAYS[fault.__name__] in said, said
    if "tuning" in SAYS.get(fault.__name__, ""):
        monkeypatch.setattr(at.DecisionCache, "_read_all", REAL_READ_ALL)
        on_disk = at.DecisionCache(str(caches / "autotune.json"))._read_all()[0]
        assert not on_disk, f"a decision made under a fault was cached: {on_disk}"


def test_without_faults_the_program_is_hlofuse_s_and_tuned(caches):
    """The reference for the faults above: the same calls build kernels and tune."""
    g = hlofuse.jit(_f, tiered=False)
    for _ in range(CALLS):
        g(X, W)
    report = g.report(X, W)
    assert report.kernels, report
    assert "failed" not in _said(report), _said(report)


def test_strict_raises_what_the_fallback_hides(caches, monkeypatch):
    export_raises(monkeypatch, caches)
    with pytest.raises(RuntimeError, match="injected: export failed"):
        hlofuse.jit(_f, tiered=False, options={"strict": True})(X, W)


def test_tuning_on_a_loaded_machine_returns_jax_jit_results(caches, monkeypatch):
    """Two other processes keep both cores busy while a program long enough to be tuned (a
    few ms per call) is called with tuning on, tiered and in place: every call returns
    ``jax.jit``'s result, the signature is decided, and a measurement the load disturbed is
    used in this process but not written to disk (a later process measures again)."""
    import subprocess
    import sys
    monkeypatch.setenv(at.ENV_BUDGET, "4")
    x = R.standard_normal((768, 512)).astype(np.float32)
    w = (R.standard_normal((512, 512)) * 0.05).astype(np.float32)
    want = np.asarray(jax.jit(_f)(x, w))
    hogs = [subprocess.Popen([sys.executable, "-c", "while True: pass"]) for _ in range(2)]
    try:
        for tiered in (False, True):
            at.cache().clear_memory()    # each path measures for itself
            g = hlofuse.jit(_f, tiered=tiered)
            for i in range(CALLS):
                np.testing.assert_allclose(np.asarray(g(x, w)), want, rtol=2e-5, atol=2e-5,
                                           err_msg=f"tiered={tiered} call {i + 1}")
                if i == 0:
                    g.block_until_optimized(120)
            (st,) = g._tuning.values()
            assert st.decision is not None and st.decision.rounds > 0, st.decision
            if "machine busy" in st.decision.reason:
                on_disk = at.DecisionCache(str(caches / "autotune.json"))._read_all()[0]
                assert not on_disk, on_disk
    finally:
        for h in hogs:
            h.kill()
            h.wait()
