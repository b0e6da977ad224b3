"""``hlofuse.jit(step, memory_limit=...)`` (issue 45): the plan that fits runs, the report says
which and what it costs, and a step that fits nowhere fails before it runs, saying by how much
and what is live at the peak. On cpu: an attention training step, where hlofuse's flash
kernels need a third of the memory of XLA's own module (which holds the S x S scores)."""

from __future__ import annotations

import numpy as np
import pytest

import jax
import jax.numpy as jnp

import hlofuse
from hlofuse.runtime import memory
from hlofuse.core.report import fmt_bytes
from hlofuse.core.target import Target
from hlofuse.runtime.testing import assert_same
from hlofuse.runtime import autotune as at
from tests.fake_clock import fake_clock as _fake_clock


def _loss(q, k, v):
    s = jnp.einsum("bqhd,bkhd->bhqk", q, k) / 8.0
    return (jnp.einsum("bhqk,bkhd->bqhd", jax.nn.softmax(s, -1), v) ** 2).sum()


STEP = jax.value_and_grad(_loss, argnums=(0, 1, 2))
Q = jnp.asarray(np.random.default_rng(0).standard_normal((1, 1024, 4, 64)), jnp.float32)


def _peaks():
    plain = memory.figures(jax.jit(STEP).lower(Q, Q, Q).compile())
    ours = memory.figures(hlofuse.jit(STEP, autotune=False).lower(Q, Q, Q).compile())
    return ours.peak, plain.peak


def _memory_note(f):
    (note,) = [n for n in f.report(Q, Q, Q).notes if n.startswith("memory_limit")]
    return note


def test_the_plan_that_fits_runs_and_the_report_says_so():
    ours, plain = _peaks()
    assert ours < plain / 2          # the flash kernels: no S x S scores in memory
    f = hlofuse.jit(STEP, memory_limit="1GiB")
    assert_same(f(Q, Q, Q), STEP(Q, Q, Q), category="grad")
    assert "every plan fits" in _memory_note(f)
    # between the two: hlofuse's program runs, and the report names XLA's as over the limit
    g = hlofuse.jit(STEP, memory_limit=(ours + plain) // 2)
    assert_same(g(Q, Q, Q), STEP(Q, Q, Q), category="grad")
    note = _memory_note(g)
    assert "runs hlofuse's program" in note and "over the limit: XLA's own module" in note


def test_tuning_never_picks_a_plan_over_the_limit(tmp_path, monkeypatch):
    """Measured faster, XLA's own module would be chosen (the fake clock says so); over the
    limit, hlofuse's program stays, and the decision says why."""
    monkeypatch.setenv(at.ENV_CACHE_DIR, str(tmp_path))
    monkeypatch.setattr(at, "MIN_CALL_S", 0.0)
    at.cache().clear_memory()
    _fake_clock(monkeypatch, kernel_s=2e-3, xla_s=2e-3, xla_module_s=1e-3)
    ours, plain = _peaks()
    free = hlofuse.jit(STEP, autotune="on")
    free(Q, Q, Q)
    free(Q, Q, Q)
    assert free.autotune_decision(Q, Q, Q).xla_module   # without a limit: XLA's module
    at.cache().clear_memory()
    f = hlofuse.jit(STEP, autotune="on", memory_limit=(ours + plain) // 2)
    for _ in range(3):
        assert_same(f(Q, Q, Q), STEP(Q, Q, Q), category="grad")
    d = f.autotune_decision(Q, Q, Q)
    assert not d.xla_module and "not XLA's own module: memory_limit" in d.reason
    at.cache().clear_memory()


def test_no_plan_fits_names_the_excess_and_the_buffers_at_the_peak():
    ours, _ = _peaks()
    f = hlofuse.jit(STEP, memory_limit=ours // 4)
    with pytest.raises(hlofuse.MemoryLimitError) as e:
        f(Q, Q, Q)
    msg = str(e.value)
    over = fmt_bytes(ours - ours // 4)
    assert f"hlofuse's program, is {over} over" in msg
    assert "largest buffers live at the peak" in msg and "test_memory_limit.py:" in msg
    assert "donate_argnums" in msg


def test_limits_are_read_once_and_bad_ones_named():
    cpu = Target.of("cpu")
    assert memory.resolve_limit("12GiB", cpu) == 12 << 30
    assert memory.resolve_limit("800MB", cpu) == 800 * 10**6
    assert memory.resolve_limit(1234, cpu) == 1234
    assert memory.resolve_limit("device", Target.of("gpu", "h100")) > 79 << 30
    assert memory.resolve_limit("device", Target.of("tpu", "v5e")) == 17_200_000_000
    assert memory.resolve_limit("device", cpu) > 1 << 30   # the host's physical memory
    for bad in ("lots", -1, "12 parsecs", True, float("nan"), float("inf")):
        with pytest.raises(ValueError, match="memory_limit="):
            hlofuse.jit(STEP, memory_limit=bad)


def test_a_tuning_budget_that_is_not_a_finite_number_is_named():
    f = hlofuse.jit(lambda x: x * 2)
    for bad in (float("nan"), float("inf"), -1.0):
        with pytest.raises(ValueError, match="budget_s="):
            f.tune(np.ones(3, np.float32), budget_s=bad)
