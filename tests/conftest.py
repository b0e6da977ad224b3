"""Shared pytest setup: deterministic seeds, CPU platform, one XLA compile per distinct program."""

import atexit
import functools
import os
import shutil
import tempfile

os.environ.setdefault("JAX_PLATFORMS", "cpu")

import numpy as np
import pytest


@pytest.fixture
def rng():
    return np.random.default_rng(0)


@pytest.fixture
def cache_dir(tmp_path, monkeypatch):
    """Tuning's decision cache in a fresh directory, tuning's mode from the call (not the
    suite's HLOFUSE_AUTOTUNE), and no decision in memory from another test. Modules that need
    more define their own."""
    from hlofuse.runtime import autotune as at
    monkeypatch.setenv(at.ENV_CACHE_DIR, str(tmp_path))
    monkeypatch.delenv(at.ENV_ENABLE, raising=False)
    at.cache().clear_memory()   # the process-wide cache must not carry decisions between tests
    yield tmp_path
    at.cache().clear_memory()


os.environ.setdefault("HLOFUSE_AUTOTUNE", "0")  # no timing-based tuning inside unit tests
os.environ.setdefault("HLOFUSE_MODULE_CACHE", "0")  # no optimized modules from earlier runs
# elementwise regions are the suite's smallest kernels (kernelize, verify, jit front end); on cpu
# the cost model leaves them to XLA by default, so ask for them (tests of that rule unset this)
os.environ.setdefault("HLOFUSE_CPU_ELEMENTWISE_KERNELS", "1")
# first calls build hlofuse's module in place, so every test's first call runs it (tiered
# first calls, XLA's code while the module builds in the background, have tests/test_tiered.py)
os.environ.setdefault("HLOFUSE_TIERED", "0")


#: a test module whose source holds one of these reads what an XLA compile does besides making
#: an executable (its dump files, jax's compile events): a cache hit would skip it
FRESH_COMPILES = ("xla_dump_to", "backend_compile")


def _share_xla_compiles() -> str | None:
    """jax's persistent compilation cache in a directory of this session only (removed at its
    end), every compile written: the suite compiles the same programs many times (jax.jit
    references, the same module under several autotune states, a kernel checked per target),
    and the second compile of an identical module (same HLO and compile options; locations are
    not in the key) loads the first's executable. Only this process: the children tests start
    see jax's defaults (tests/test_module_cache.py checks hlofuse's own cache there); modules
    that count compiles or read dumps compile afresh (FRESH_COMPILES).
    ``HLOFUSE_TEST_XLA_CACHE=0`` compiles everything afresh."""
    if os.environ.get("HLOFUSE_TEST_XLA_CACHE", "1") == "0":
        return None
    import jax
    if jax.config.jax_compilation_cache_dir:   # the person running the tests set one
        return None
    path = tempfile.mkdtemp(prefix="hlofuse-tests-xla-")
    atexit.register(shutil.rmtree, path, ignore_errors=True)
    jax.config.update("jax_compilation_cache_dir", path)
    jax.config.update("jax_persistent_cache_min_compile_time_secs", 0.0)
    jax.config.update("jax_persistent_cache_min_entry_size_bytes", 0)
    return path


_XLA_CACHE = _share_xla_compiles()


@functools.lru_cache(maxsize=None)
def _needs_fresh_compiles(path: str) -> bool:
    try:
        with open(path, encoding="utf-8") as fh:
            src = fh.read()
    except OSError:
        return False
    return any(s in src for s in FRESH_COMPILES)


@pytest.fixture(autouse=True)
def _fresh_xla_compiles(request):
    """The shared compilation cache off for the tests of a module that reads compile side
    effects (FRESH_COMPILES), on again after each."""
    path = getattr(request.module, "__file__", None)
    if _XLA_CACHE is None or not path or not _needs_fresh_compiles(path):
        yield
        return
    import jax
    from jax.experimental.compilation_cache import compilation_cache as cc
    jax.config.update("jax_enable_compilation_cache", False)
    cc.reset_cache()   # jax decides at the next compile whether a cache is in use
    try:
        yield
    finally:
        jax.config.update("jax_enable_compilation_cache", True)
        cc.reset_cache()
