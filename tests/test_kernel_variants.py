"""Kernel variants (:data:`hlofuse.runtime.autotune.KERNEL_VARIANTS`): where two settings of
hlofuse's own kernels measured close on some host, tuning times both. ``attn-budget-x2``: the
cpu attention loops with twice the step budget derived from the host's L2 cache
(kernels/attention/blocks.py); ``attn-key-blocks``: the forward in key blocks where it runs
whole rows. The budget's tests run the key blocks (whole rows off), the budget has no say in
whole rows. The programs are real and run; only the harness's clock is a
test double (tests/fake_clock.py), charging each program by the blocks its kernel has."""

from __future__ import annotations

import re

import numpy as np
import pytest

import jax
import jax.numpy as jnp

import hlofuse
from hlofuse.core.pipeline import OptionError
from hlofuse.frontend import tuning
from hlofuse.kernels.attention import blocks as B
from hlofuse.passes import kernelize
from hlofuse.runtime import autotune as at
from hlofuse.runtime.testing import assert_same
from tests.fake_clock import clock_by_text, is_xla_module

X2 = "attn-budget-x2"
KB = "attn-key-blocks"


def _attn(q, k, v):
    s = jnp.einsum("bqhd,bkhd->bhqk", q, k) / 4.0
    return jnp.einsum("bhqk,bkhd->bqhd", jax.nn.softmax(s, -1), v)


def _ln(x):
    m = x.mean(-1, keepdims=True)
    return (x - m) * jax.lax.rsqrt(((x - m) ** 2).mean(-1, keepdims=True) + 1e-5)


def _args(seq=2048):
    # 2 heads x 2048 x 2048 logits: past the loop-free path, so the cpu loops run
    return [jnp.asarray(np.random.default_rng(i).standard_normal((1, seq, 2, 16)), jnp.float32)
            for i in range(3)]


def _query_block(text: str) -> int:
    (bq,) = set(re.findall(r'hlofuse\.kernel = "attention\|[^"]*cpu loops bq=(\d+)', text))
    return int(bq)


@pytest.fixture
def key_blocks(monkeypatch):
    """The forward in key blocks (where this release would run whole rows), fresh kernels."""
    monkeypatch.setattr(B, "CPU_WHOLE_ROWS", False)
    kernelize._CACHE.clear()
    yield
    kernelize._CACHE.clear()


@pytest.fixture
def cache_dir(tmp_path, monkeypatch):
    monkeypatch.setenv(at.ENV_CACHE_DIR, str(tmp_path))
    monkeypatch.delenv(at.ENV_ENABLE, raising=False)
    monkeypatch.setattr(at, "MIN_CALL_S", 0.0)
    at.cache().clear_memory()
    yield tmp_path
    at.cache().clear_memory()


def test_the_variant_is_a_candidate_only_where_cpu_attention_loops_are(key_blocks):
    args = _args()
    entry = hlofuse.jit(_attn, tiered=False, autotune=False).lower(*args)._entry
    assert isinstance(tuning.candidates(entry)[X2], at.Variant)
    assert tuning.candidates(entry)[X2].settings == at.KERNEL_VARIANTS["cpu"][X2]
    short = hlofuse.jit(_attn, tiered=False, autotune=False).lower(*_args(256))._entry
    assert X2 not in tuning.candidates(short)          # the loop-free path: no step budget
    x = jnp.ones((64, 128), jnp.float32)
    assert X2 not in tuning.candidates(hlofuse.jit(_ln, autotune=False).lower(x)._entry)


def test_the_setting_doubles_the_query_block_and_keeps_the_results(key_blocks):
    args = _args()
    want = jax.jit(_attn)(*args)
    plain = hlofuse.jit(_attn, tiered=False, autotune=False)
    x2 = hlofuse.jit(_attn, tiered=False, autotune=False,
                     options={"kernelize": {"cpu_attention_budget_scale": 2.0}})
    bq, bq2 = _query_block(plain.lower(*args).as_text()), _query_block(x2.lower(*args).as_text())
    fwd = B.cpu_budgets()[0]
    assert bq == min(2048, fwd // (2 * B.CPU_MAX_BLOCK_K)) and bq2 == min(2048, 2 * bq)
    assert_same(x2(*args), want, category="reassociate")
    with pytest.raises(OptionError, match="cpu_attention_budget_scale=100.0: expected a factor"):
        hlofuse.jit(_attn, options={"kernelize": {"cpu_attention_budget_scale": 100.0},
                                    "strict": True})(*args)


@pytest.mark.parametrize("x2_wins", [True, False])
def test_tuning_times_the_variant_and_a_later_process_applies_it(key_blocks, cache_dir, monkeypatch,
                                                                 x2_wins):
    args = _args()
    want = jax.jit(_attn)(*args)
    host_bq = _query_block(hlofuse.jit(_attn, tiered=False, autotune=False).lower(*args)
                           .as_text())

    def cost(text):
        if is_xla_module(text):
            return 3e-3
        if 'hlofuse.kernel = "attention' not in text:
            return 2e-3                                 # the region left to XLA
        return 0.8e-3 if (_query_block(text) > host_bq) == x2_wins else 1e-3

    clock_by_text(monkeypatch, cost)
    f = hlofuse.jit(_attn, tiered=False, autotune="on")
    assert_same(f(*args), want, category="reassociate")
    assert_same(f(*args), want, category="reassociate")       # tuned here
    d = f.autotune_decision(*args)
    assert X2 in d.ratios and d.variant == (X2 if x2_wins else "default"), d
    assert at.options_of(d) == {}                               # nothing for XLA's compiler
    assert at.settings_of(d) == (at.KERNEL_VARIANTS["cpu"][X2] if x2_wins else ())
    assert_same(f(*args), want, category="reassociate")
    # a later process: the decision from disk builds the variant's program, nothing measured
    at.cache().clear_memory()
    built = []
    real = kernelize.build_settings
    monkeypatch.setattr(kernelize, "build_settings",
                        lambda kind, target, scale, rows: built.append(scale) or real(
                            kind, target, scale, rows))
    kernelize._CACHE.clear()
    monkeypatch.setattr(at, "time_calls", lambda *a, **k: pytest.fail("measured again"))
    g = hlofuse.jit(_attn, tiered=False, autotune="cached")
    for _ in range(2):
        assert_same(g(*args), want, category="reassociate")
    assert g.autotune_decision(*args).variant == d.variant
    assert (2.0 in built) == x2_wins, built


# ---------------------------------------------------------------------------------------------
# attn-key-blocks: the forward's whole rows against key blocks
# ---------------------------------------------------------------------------------------------

def _whole_rows(monkeypatch):
    monkeypatch.setattr(B, "CPU_WHOLE_ROWS", True)
    kernelize._CACHE.clear()


def _row_block(text: str) -> str:
    (blk,) = set(re.findall(r'hlofuse\.kernel = "attention\|[^"]*cpu ((?:row )?loops bq=\d+ bk=\d+)',
                            text))
    return blk


def test_key_blocks_are_a_candidate_only_where_whole_rows_run(monkeypatch):
    _whole_rows(monkeypatch)
    args = _args()                                      # 2 heads x 2048: 2048 rows fit
    lowered = hlofuse.jit(_attn, tiered=False, autotune=False).lower(*args)
    assert _row_block(lowered.as_text()) == "row loops bq=2048 bk=2048"
    cands = tuning.candidates(lowered._entry)
    assert cands[KB].settings == at.KERNEL_VARIANTS["cpu"][KB] and X2 not in cands
    monkeypatch.setattr(B, "CPU_WHOLE_ROWS", False)     # key blocks already: nothing to try
    kernelize._CACHE.clear()
    entry = hlofuse.jit(_attn, tiered=False, autotune=False).lower(*args)._entry
    assert KB not in tuning.candidates(entry) and X2 in tuning.candidates(entry)
    kernelize._CACHE.clear()


def test_the_key_block_setting_keeps_the_results(monkeypatch):
    _whole_rows(monkeypatch)
    args = _args()
    want = jax.jit(_attn)(*args)
    rows = hlofuse.jit(_attn, tiered=False, autotune=False)
    kb = hlofuse.jit(_attn, tiered=False, autotune=False,
                     options={"kernelize": {"cpu_attention_rows": "blocks"}})
    assert _row_block(rows.lower(*args).as_text()) == "row loops bq=2048 bk=2048"
    assert _row_block(kb.lower(*args).as_text()).startswith("loops bq=")
    assert_same(rows(*args), want, category="reassociate")
    assert_same(kb(*args), want, category="reassociate")
    with pytest.raises(OptionError, match="cpu_attention_rows='rows': expected one of"):
        hlofuse.jit(_attn, options={"kernelize": {"cpu_attention_rows": "rows"},
                                    "strict": True})(*args)
    kernelize._CACHE.clear()


@pytest.mark.parametrize("rows_win", [True, False])
def test_tuning_times_key_blocks_against_whole_rows(cache_dir, monkeypatch, rows_win):
    _whole_rows(monkeypatch)
    args = _args()
    want = jax.jit(_attn)(*args)

    def cost(text):
        if is_xla_module(text):
            return 3e-3
        if 'hlofuse.kernel = "attention' not in text:
            return 2e-3                                 # the region left to XLA
        return 0.8e-3 if _row_block(text).startswith("row") == rows_win else 1e-3

    clock_by_text(monkeypatch, cost)
    f = hlofuse.jit(_attn, tiered=False, autotune="on")
    for _ in range(3):                                  # tuned on the second call
        assert_same(f(*args), want, category="reassociate")
    d = f.autotune_decision(*args)
    assert KB in d.ratios and d.variant == ("default" if rows_win else KB), d
    assert at.settings_of(d) == (() if rows_win else at.KERNEL_VARIANTS["cpu"][KB])
    kernelize._CACHE.clear()
