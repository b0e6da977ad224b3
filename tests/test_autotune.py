"""hlofuse.autotune: decision cache (memory + atomic file), keys, decisions, wiring into jit.

No timing assertions: measurements are replaced by synthetic ones where a decision must be
deterministic; the one real measurement only checks its structure.
"""

import json
import os
import threading

import numpy as np
import pytest

import jax
import jax.numpy as jnp

import hlofuse
from hlofuse import autotune as at
from hlofuse.testing import assert_same

YNN_OFF = at.VARIANTS["cpu"]["ynn-off"]


def _f(x, w):
    return jnp.tanh(x @ w + 1.0).sum(axis=0)


def _args():
    rng = np.random.default_rng(0)
    return (jnp.asarray(rng.standard_normal((32, 64)), jnp.float32),
            jnp.asarray(rng.standard_normal((64, 64)) * 0.1, jnp.float32))


def _decision(variant="ynn-off"):
    return at.Decision(variant, dict(at.VARIANTS["cpu"][variant]), {"default": 1.0, variant: 0.5},
                       default_s=0.01, rounds=5, tune_s=0.1, reason="synthetic")


@pytest.fixture
def cache_dir(tmp_path, monkeypatch):
    monkeypatch.setenv(at.ENV_CACHE_DIR, str(tmp_path))
    monkeypatch.delenv(at.ENV_ENABLE, raising=False)
    at.cache().clear_memory()   # the process-wide cache must not carry decisions between tests
    yield tmp_path
    at.cache().clear_memory()


@pytest.fixture
def fake_measure(monkeypatch):
    """Replace the timing with a fixed answer; counts calls."""
    calls = []

    def measure(call, args, variants, **kw):
        calls.append(sorted(variants))
        names = [n for n in variants if n != "default"]
        return at.Measurement({"default": 1.0, **{n: 0.5 for n in names}}, names, 0.01, 5, [])

    monkeypatch.setattr(at, "measure", measure)
    return calls


# -- the cache ---------------------------------------------------------------------------------
def test_cache_miss_then_hit_and_persisted(cache_dir):
    c = at.DecisionCache()
    assert c.get("k1") is None and c.misses == 1
    c.put("k1", _decision())
    assert c.get("k1").variant == "ynn-off" and c.hits == 1
    path = cache_dir / "autotune.json"
    data = json.loads(path.read_text())
    assert data["decisions"]["k1"]["options"] == YNN_OFF
    # a fresh cache object (a new process) reads it back from disk
    c2 = at.DecisionCache()
    got = c2.get("k1")
    assert got is not None and got.options == YNN_OFF and c2.hits == 1
    assert c2.get("other") is None


def test_cache_writes_are_atomic(cache_dir, monkeypatch):
    c = at.DecisionCache()
    c.put("a", _decision())
    path = cache_dir / "autotune.json"
    before = path.read_text()

    def broken_dump(obj, fh, **kw):
        fh.write('{"version": 1, "decisions": {"trunc')  # half-written file ...
        raise OSError("disk full")                        # ... then failure

    monkeypatch.setattr(at.json, "dump", broken_dump)
    c.put("b", _decision("ynn-individual-dot"))            # must not raise, must not corrupt
    monkeypatch.undo()
    assert path.read_text() == before                       # old file intact
    assert [p.name for p in cache_dir.iterdir()] == ["autotune.json"]  # no temp files left
    assert c.get("b") is not None                           # kept in memory


def test_cache_concurrent_writers_leave_valid_json(cache_dir):
    caches = [at.DecisionCache() for _ in range(4)]

    def work(i):
        for j in range(10):
            caches[i].put(f"k{i}-{j}", _decision())

    threads = [threading.Thread(target=work, args=(i,)) for i in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    data = json.loads((cache_dir / "autotune.json").read_text())
    assert len(data["decisions"]) >= 10
    assert not [p for p in os.listdir(cache_dir) if p.endswith(".tmp")]


def test_corrupt_cache_file_is_ignored_and_replaced(cache_dir):
    (cache_dir / "autotune.json").write_text("{not json")
    c = at.DecisionCache()
    assert c.get("x") is None
    c.put("x", _decision())
    assert json.loads((cache_dir / "autotune.json").read_text())["decisions"]["x"]["variant"] == "ynn-off"


# -- keys and decisions --------------------------------------------------------------------------
def test_key_depends_on_module_device_and_versions():
    dev = at.device_key()
    assert dev.startswith("cpu:")
    h1, h2 = at.module_hash("module A"), at.module_hash("module B")
    assert h1 != h2 and at.module_hash(b"module A") == h1
    k = at.cache_key(h1, dev)
    assert h1 in k and dev in k and jax.__version__ in k and f"v{at.VARIANTS_VERSION}" in k
    assert at.cache_key(h1, "gpu:H100") != k


def test_decide_requires_margin_and_majority():
    m = at.Measurement({"default": 1.0, "ynn-off": 0.97}, ["ynn-off"], 0.01, 5)
    assert at.decide(m)[0] == "default"                    # within the margin
    m = at.Measurement({"default": 1.0, "ynn-off": 0.8, "ynn-individual-dot": 0.7},
                       ["ynn-off", "ynn-individual-dot"], 0.01, 5)
    assert at.decide(m)[0] == "ynn-individual-dot"          # fastest eligible
    m = at.Measurement({"default": 1.0, "ynn-off": 0.8}, [], 0.01, 5)
    assert at.decide(m)[0] == "default"                    # did not win most rounds
    m = at.Measurement({"default": 1.0}, [], 5.0, 0, [], "too slow")
    variant, reason = at.decide(m)
    assert variant == "default" and "too slow" in reason


def test_applicable_variants_filtered_by_ops():
    v = at.applicable_variants("cpu", "%0 = stablehlo.dot_general %a, %b")
    assert "ynn-individual-dot" in v and "ynn-individual-conv" not in v and "ynn-off" in v
    v = at.applicable_variants("cpu", "%0 = stablehlo.convolution(%a, %b)")
    assert "ynn-individual-conv" in v and "ynn-individual-dot" not in v
    assert list(at.applicable_variants("gpu", "anything")) == ["default"]


def test_enabled_by_default(monkeypatch):
    monkeypatch.delenv(at.ENV_ENABLE, raising=False)
    assert at.enabled_by_default("cpu") and not at.enabled_by_default("gpu")
    monkeypatch.setenv(at.ENV_ENABLE, "0")
    assert not at.enabled_by_default("cpu")
    monkeypatch.setenv(at.ENV_ENABLE, "1")
    assert at.enabled_by_default("tpu")


# -- the tuner -------------------------------------------------------------------------------------
def test_tuner_tunes_on_second_call_then_hits_cache(cache_dir, fake_measure):
    x, w = _args()
    c = at.DecisionCache()
    t = at.Autotuner(_f, "stablehlo.dot_general module-1", decision_cache=c, enabled=True)
    assert t.decision is None
    t(x, w)
    assert t.decision is None and not fake_measure             # first call: defaults, no tuning
    out = t(x, w)
    assert len(fake_measure) == 1 and t.decision.variant in ("ynn-off", "ynn-individual-dot")
    t(x, w)
    assert len(fake_measure) == 1                               # decided once
    assert_same(out, jax.jit(_f)(x, w), "reassociate")
    # same module text -> same key -> decision applied at construction, nothing measured
    seen = []
    t2 = at.Autotuner(_f, "stablehlo.dot_general module-1", decision_cache=c, enabled=True,
                      on_decision=lambda d, cached: seen.append(cached))
    assert t2.decision is not None and t2.decision.variant == t.decision.variant and seen == [True]
    t2(x, w)
    t2(x, w)
    assert len(fake_measure) == 1
    # another module hash -> a miss -> measured again on its second call
    t3 = at.Autotuner(_f, "stablehlo.dot_general module-2", decision_cache=c, enabled=True)
    assert t3.decision is None
    t3(x, w)
    t3(x, w)
    assert len(fake_measure) == 2


def test_disabled_tuner_never_measures(cache_dir, fake_measure):
    x, w = _args()
    t = at.Autotuner(_f, "m", decision_cache=at.DecisionCache(), enabled=False)
    for _ in range(3):
        t(x, w)
    assert t.decision is None and not fake_measure and t.compiler_options == {}


def test_decision_really_changes_the_compiled_program(cache_dir):
    """The cached 'ynn-off' decision reaches XLA: no YNN library fusion in the executable."""
    x, w = _args()
    c = at.DecisionCache()
    text = "stablehlo.dot_general decided"
    c.put(at.cache_key(at.module_hash(text), at.device_key()), _decision("ynn-off"))
    t = at.Autotuner(_f, text, decision_cache=c, enabled=True)
    assert t.compiler_options == YNN_OFF
    tuned = t._fn.lower(x, w).compile().as_text()
    default = jax.jit(_f).lower(x, w).compile().as_text()
    assert "__ynn_fusion" in default          # XLA:CPU's default uses YNNPACK for this dot
    assert "__ynn_fusion" not in tuned
    assert_same(t(x, w), jax.jit(_f)(x, w), "reassociate")


def test_real_measurement_structure(cache_dir, monkeypatch):
    monkeypatch.setattr(at, "MIN_CALL_S", 0.0)   # time even this small function
    x, w = _args()
    m = at.measure(_f, (x, w), at.applicable_variants("cpu", "stablehlo.dot_general"), budget_s=5)
    assert "default" in m.ratios and m.ratios["default"] == 1.0
    assert all(np.isfinite(v) for v in m.ratios.values())
    assert set(m.ratios) | set(m.duplicates) <= set(at.VARIANTS["cpu"])
    assert m.skipped or m.rounds >= at.MIN_ROUNDS


# -- hlofuse.jit wiring ----------------------------------------------------------------------------
def test_jit_records_decision_in_report(cache_dir, fake_measure):
    x, w = _args()
    f = hlofuse.jit(_f, autotune=True)
    f(x, w)
    assert f.autotune_decision(x, w) is None
    out = f(x, w)
    d = f.autotune_decision(x, w)
    assert d is not None and d.variant != "default"
    assert any(n.startswith("autotune: " + d.variant) for n in f.report(x, w).notes)
    assert_same(out, jax.jit(_f)(x, w), "reassociate")
    # a new hlofuse.jit of the same function finds the decision on disk (module hash key)
    at.cache().clear_memory()
    g = hlofuse.jit(_f, autotune=True)
    g(x, w)
    assert g.autotune_decision(x, w).variant == d.variant and len(fake_measure) == 1
    assert any("cached decision" in n for n in g.report(x, w).notes)


def test_jit_autotune_off(cache_dir, fake_measure):
    x, w = _args()
    f = hlofuse.jit(_f, autotune=False)
    for _ in range(3):
        f(x, w)
    assert f.autotune_decision(x, w) is None and not fake_measure
    assert not any(n.startswith("autotune") for n in f.report(x, w).notes)


def test_short_calls_are_not_tuned_nor_persisted(cache_dir):
    x, w = _args()   # microseconds per call: below MIN_CALL_S
    c = at.DecisionCache()
    t = at.Autotuner(_f, "stablehlo.dot_general small", decision_cache=c, enabled=True)
    t(x, w)
    t(x, w)
    assert t.decision is not None and t.decision.variant == "default"
    assert "too short" in t.decision.reason and t.decision.rounds == 0
    assert not (cache_dir / "autotune.json").exists()      # kept in memory only


def test_no_tuning_under_an_outer_transformation(cache_dir, fake_measure):
    x, w = _args()
    f = hlofuse.jit(_f, autotune=True)
    outer = jax.jit(lambda a, b: f(a, b) * 2.0)
    for _ in range(3):
        y = outer(x, w)
    g = jax.grad(lambda a: f(a, w).sum())
    g(x)
    g(x)
    assert not fake_measure                                 # tracers are never timed
    assert_same(y, 2.0 * jax.jit(_f)(x, w), "reassociate")


def test_lowered_compile_uses_the_cached_decision(cache_dir, fake_measure):
    x, w = _args()
    f = hlofuse.jit(_f, autotune=True)
    assert "__ynn_fusion" in f.lower(x, w).compile().as_text()   # nothing decided yet
    f(x, w)
    f(x, w)                                                       # fake measure: ynn-off wins
    assert f.autotune_decision(x, w).options == YNN_OFF
    assert at.cached_options(f.lower(x, w)._entry.optimized.text) == YNN_OFF
    assert "__ynn_fusion" not in f.lower(x, w).compile().as_text()


def test_busy_measurement_is_used_but_not_persisted(cache_dir, monkeypatch):
    def busy_measure(call, args, variants, **kw):
        return at.Measurement({"default": 1.0, "ynn-off": 0.5}, ["ynn-off"], 0.01, 5, [],
                              foreign_load=0.9)

    monkeypatch.setattr(at, "measure", busy_measure)
    x, w = _args()
    c = at.DecisionCache()
    t = at.Autotuner(_f, "stablehlo.dot_general busy", decision_cache=c, enabled=True)
    t(x, w)
    t(x, w)
    assert t.decision.variant == "ynn-off" and "not cached on disk" in t.decision.reason
    assert t.decision.foreign_load == 0.9
    assert not (cache_dir / "autotune.json").exists()
    assert at.DecisionCache().get(t.key) is None          # a new process measures again


def test_foreign_load_probe():
    with at.ForeignLoad() as p:
        sum(range(20000))
    assert p.wall > 0 and p.foreign >= 0
