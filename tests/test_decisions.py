"""Measured per-region decisions (kernel vs XLA's own code), their cache, and the report.

The decision logic is tested deterministically: the real harness (:func:`autotune.measure`,
interleaved rounds, the decision rule) runs with a fake clock that charges each program by
what it contains (a program that still has the region's kernel is "slow"), so no assertion
depends on wall-clock time.
"""

import json

import numpy as np
import pytest

import jax
import jax.numpy as jnp

import hlofuse
from hlofuse.runtime.testing import assert_same
from hlofuse.runtime import autotune as at
from tests.fake_clock import fake_clock as _fake_clock, is_xla_module as _is_xla_module


def _ln(x, g, b):
    m = x.mean(-1, keepdims=True)
    v = ((x - m) ** 2).mean(-1, keepdims=True)
    return (x - m) * jax.lax.rsqrt(v + 1e-5) * g + b


def _args():
    x = jnp.asarray(np.random.default_rng(0).standard_normal((64, 128)), jnp.float32)
    return x, jnp.ones((128,), jnp.float32), jnp.zeros((128,), jnp.float32)


@pytest.fixture
def cache_dir(tmp_path, monkeypatch):
    monkeypatch.setenv(at.ENV_CACHE_DIR, str(tmp_path))
    monkeypatch.delenv(at.ENV_ENABLE, raising=False)
    monkeypatch.setattr(at, "MIN_CALL_S", 0.0)  # the test function is tiny
    at.cache().clear_memory()
    yield tmp_path
    at.cache().clear_memory()


def test_slower_kernel_keeps_xla_and_the_report_says_so(cache_dir, monkeypatch):
    clock = _fake_clock(monkeypatch, kernel_s=1.9e-3, xla_s=1.0e-3)
    args = _args()
    f = hlofuse.jit(_ln, autotune="on")
    planned = f.report(*args)
    assert len(planned.kernels) == 1  # the region the fake clock makes slow
    h = planned.kernels[0].extra["region_hash"]
    want = jax.jit(_ln)(*args)
    assert_same(f(*args), want, category="reassociate")
    assert_same(f(*args), want, category="reassociate")  # second call: measured here
    assert any(clock) and not all(clock)                 # both programs were timed
    d = f.autotune_decision(*args)
    assert d.xla_regions == {h}
    assert d.regions[h]["choice"] == "xla" and d.regions[h]["ratio"] == pytest.approx(1.9)
    rep = f.report(*args)
    assert not rep.kernels
    (r,) = [r for r in rep.regions if r.extra.get("region_hash") == h]
    assert "kept XLA: kernel 1.90x slower, measured" in r.reason
    assert any("1 kept XLA (kernel 1.90x slower)" in n for n in rep.notes)
    # what runs from now on has no kernel, and the same numbers
    assert "hlofuse_k" not in f.lower(*args).as_text()
    assert_same(f(*args), want, category="reassociate")
    # cached on disk by region hash
    data = json.loads((cache_dir / "autotune.json").read_text())
    (key,) = [k for k in data["regions"] if h in k]
    assert data["regions"][key]["choice"] == "xla"
    assert data["records"] and data["records"][0]["kind"] == "reduction"
    assert data["records"][0]["ratio"] == pytest.approx(1.9)


def test_transformations_of_a_decided_function_match_jax(cache_dir, monkeypatch):
    """A region kept as XLA's code (measured here, and from the cache in a 'new process'):
    grad, vmap and an outer jit still give jax's numbers."""
    _fake_clock(monkeypatch, kernel_s=2e-3, xla_s=1e-3)
    x, g, b = _args()
    for mode in ("on", "cached"):
        f = hlofuse.jit(_ln, autotune=mode)
        f(x, g, b)
        f(x, g, b)
        if mode == "on":
            assert f.autotune_decision(x, g, b).xla_regions
            at.cache().clear_memory()
        else:
            assert not f.report(x, g, b).kernels   # applied when the program was built
        loss = lambda f_: (lambda x_: (f_(x_, g, b) ** 2).sum())  # noqa: E731
        assert_same(jax.grad(loss(f))(x), jax.grad(loss(_ln))(x), category="reassociate")
        assert_same(jax.vmap(lambda r: f(r[None], g, b))(x[:4]),
                    jax.vmap(lambda r: _ln(r[None], g, b))(x[:4]), category="reassociate")
        assert_same(jax.jit(lambda x_: f(x_, g, b) * 2)(x), _ln(x, g, b) * 2,
                    category="reassociate")


def test_faster_kernel_is_kept(cache_dir, monkeypatch):
    _fake_clock(monkeypatch, kernel_s=1.0e-3, xla_s=1.5e-3)
    args = _args()
    f = hlofuse.jit(_ln, autotune="on")
    f(*args)
    f(*args)
    d = f.autotune_decision(*args)
    assert not d.xla_regions and d.regions
    (c,) = d.regions.values()
    assert c["choice"] == "kernel" and "kept kernel" in c["reason"]
    assert len(f.report(*args).kernels) == 1
    assert "hlofuse_k" in f.lower(*args).as_text()


def test_noise_inside_the_margin_keeps_the_kernel(cache_dir, monkeypatch):
    _fake_clock(monkeypatch, kernel_s=1.02e-3, xla_s=1.0e-3)  # 2% < MARGIN
    args = _args()
    f = hlofuse.jit(_ln, autotune="on")
    f(*args)
    f(*args)
    assert not f.autotune_decision(*args).xla_regions


def test_shipped_decision_applies_in_cached_mode_without_measuring(cache_dir, monkeypatch):
    clock = _fake_clock(monkeypatch, kernel_s=3e-3, xla_s=1e-3)
    args = _args()
    f = hlofuse.jit(_ln, autotune="on")
    f(*args)
    f(*args)
    assert f.autotune_decision(*args).xla_regions
    n_timed = len(clock)
    # a later process: decisions only on disk, measuring never allowed
    at.cache().clear_memory()
    g = hlofuse.jit(_ln, autotune="cached")
    want = jax.jit(_ln)(*args)
    assert_same(g(*args), want, category="reassociate")  # first call already without kernel
    rep = g.report(*args)
    assert not rep.kernels
    assert "(cached decision)" in rep.regions[0].reason
    assert "hlofuse_k" not in g.lower(*args).as_text()
    for _ in range(3):
        assert_same(g(*args), want, category="reassociate")
    assert len(clock) == n_timed  # nothing measured
    # autotune off ignores decisions: the kernel as the passes made it
    h = hlofuse.jit(_ln, autotune="off")
    assert len(h.report(*args).kernels) == 1


def test_damaged_cache_keeps_kernels_and_is_rewritten(cache_dir, monkeypatch):
    (cache_dir / "autotune.json").write_text('{"decisions": {}, "regions": {"region:zz": '
                                             '{"choice": "maybe"}}, "records": [1, {"kind": 3}]}')
    args = _args()
    with pytest.warns(UserWarning, match="damaged"):
        f = hlofuse.jit(_ln, autotune="cached")
        f(*args)
    assert len(f.report(*args).kernels) == 1
    (cache_dir / "autotune.json").write_text("{not json")
    at.cache().clear_memory()
    g = hlofuse.jit(_ln, autotune="cached")
    g(*args)
    assert len(g.report(*args).kernels) == 1


def test_choices_are_confirmed_together(cache_dir, monkeypatch):
    """Two choices that each won alone (an option variant and a region as XLA's code) are
    timed together; when the combination does not win, only the best single one is kept."""
    seen, known = [], {}

    def time_once(fn, args, reps, kwargs=None):
        if id(fn) not in known:
            lowered = fn.lower(*args, **(kwargs or {}))
            # the option variant compiles without YNNPACK fusions
            known[id(fn)] = ("hlofuse_k" in lowered.as_text(),
                             "ynn" not in lowered.compile().as_text(), fn,  # fn kept alive
                             _is_xla_module(lowered.as_text()))
        has_kernel, ynn_off, _, xla_module = known[id(fn)]
        if xla_module:
            return 4.0e-3         # XLA's own module: slower than every hlofuse program
        seen.append((has_kernel, ynn_off))
        if has_kernel and not ynn_off:
            return 2.0e-3         # the program as optimized
        if has_kernel or not ynn_off:
            return 1.5e-3 if has_kernel else 1.0e-3   # each choice alone wins
        return 3.0e-3             # both together: slower than either

    monkeypatch.setattr(at, "time_calls", time_once)
    args = _args()
    f = hlofuse.jit(_ln, autotune="on")
    f(*args)
    f(*args)
    d = f.autotune_decision(*args)
    (c,) = d.regions.values()
    if not any(yo for _, yo in seen):
        pytest.skip("XLA compiled the option variant to the same program here")
    assert d.variant == "default" and c["choice"] == "xla"   # the better single choice
    assert "kept only" in d.reason


def test_decide_regions_rule():
    m = at.Measurement({"default": 1.0, "xla:a": 0.5, "xla:b": 0.97, "xla:c": 0.5},
                       ["xla:a", "xla:c"], 0.01, 5, ["xla:d"])
    m.eligible = ["xla:a"]  # c won too few rounds
    got = at.decide_regions(m, {"xla:a": "a" * 12, "xla:b": "b" * 12, "xla:c": "c" * 12,
                                "xla:d": "d" * 12, "xla:e": "e" * 12})
    assert got["a" * 12]["choice"] == "xla" and got["a" * 12]["ratio"] == 2.0
    assert got["b" * 12]["choice"] == "kernel"
    assert got["c" * 12]["choice"] == "kernel"
    assert got["d" * 12]["choice"] == "kernel" and "identical HLO" in got["d" * 12]["reason"]
    assert "e" * 12 not in got  # not measured (budget): no decision
    skipped = at.Measurement({"default": 1.0}, [], 0.001, 0, [], "too short")
    assert at.decide_regions(skipped, {"xla:a": "a" * 12}) == {}


def test_decision_with_damaged_region_entry_is_rejected():
    d = at.Decision("default", {}, {}, regions={"abcdef0123": {"choice": "xla", "ratio": 2.0}})
    assert at.Decision.from_json(d.to_json()).xla_regions == {"abcdef0123"}
    bad = dict(d.to_json(), regions={"abcdef0123": {"choice": "drop_everything"}})
    with pytest.raises(ValueError):
        at.Decision.from_json(bad)
    with pytest.raises(ValueError):
        at.Decision.from_json(dict(d.to_json(), regions={"../x": {"choice": "xla"}}))


def test_cli_tune_measures_and_names_the_cache(tmp_path):
    """``hlofuse tune`` offline: structure only (the measurement itself is real, so which
    side wins is not asserted; a busy machine keeps the decision in memory and says so)."""
    import os
    import subprocess
    import sys
    (tmp_path / "lnmod.py").write_text(
        "import jax\n"
        "def ln(x, g, b):\n"
        "    m = x.mean(-1, keepdims=True)\n"
        "    v = ((x - m) ** 2).mean(-1, keepdims=True)\n"
        "    return (x - m) * jax.lax.rsqrt(v + 1e-5) * g + b\n")
    env = dict(os.environ, HLOFUSE_CLI_INPROCESS="1", HLOFUSE_XLA_CACHE="0")
    env.pop("HLOFUSE_AUTOTUNE", None)
    p = subprocess.run([sys.executable, "-m", "hlofuse.cli.main", "tune", "lnmod:ln", "--args",
                        "f32[64,128],f32[128],f32[128]", "--cache-dir", str(tmp_path / "ship"),
                        "--budget", "20"], cwd=tmp_path, env=env, capture_output=True, text=True,
                       timeout=300)
    assert p.returncode == 0, p.stderr[-2000:]
    assert "region 0 (reduction, lnmod.py:" in p.stdout
    assert ("kept kernel" in p.stdout) or ("kept XLA" in p.stdout)
    path = tmp_path / "ship" / "autotune.json"
    # written, or (measured while other processes used the machine) said not to be
    assert (f"decisions in {path}" in p.stdout and path.exists()) or \
        (f"the decisions were not written to {path}" in p.stdout)


def _int8_linear(x, w, s, b):
    xq = jnp.clip(jnp.round(x / 0.05), -127, 127).astype(jnp.int8)
    acc = jax.lax.dot_general(xq, w, (((1,), (0,)), ((), ())), preferred_element_type=jnp.int32)
    return acc.astype(jnp.float32) * (0.05 * s) + b


def _int8_args():
    r = np.random.default_rng(1)
    return (jnp.asarray(r.standard_normal((32, 96)), jnp.float32),
            jnp.asarray(r.integers(-128, 128, (96, 64)), jnp.int8),
            jnp.asarray(r.uniform(1e-3, 1e-2, 64), jnp.float32), jnp.zeros((64,), jnp.float32))


def _has_kernel(text: str) -> bool:
    return 'hlofuse.kernel = "matmul_epilogue' in text


def _has_unsigned_int8_dot(text: str) -> bool:
    return any("stablehlo.dot_general" in l and "xui8>, tensor<" in l and "xi32>" in l.split("->")[-1]
               for l in text.splitlines())


@pytest.mark.parametrize("xla_faster", [True, False])
def test_cpu_int8_matmul_choice_is_measured(cache_dir, monkeypatch, xla_faster):
    """On cpu the int8 matmul kernel and the region left to XLA are both candidates; the region
    measurement picks one. Both compute the product as the u8 x s8 dot int8-dot-unsigned
    makes of the program's int8 dot (forced: on CPUs with signed int8 dots it keeps them);
    both exact."""
    _fake_clock(monkeypatch, 0, 0)
    texts = {}

    def time_once(fn, args, reps, kwargs=None):   # charged by which int8 product it runs
        if id(fn) not in texts:   # fn is kept alive with its text: its id is never reused
            texts[id(fn)] = (fn, fn.lower(*args, **(kwargs or {})).as_text())
        if _is_xla_module(texts[id(fn)][1]):
            return 3.0e-3         # XLA's own module: slower than both of hlofuse's
        return 1.0e-3 if (not _has_kernel(texts[id(fn)][1])) == xla_faster else 1.5e-3

    monkeypatch.setattr(at, "time_calls", time_once)
    args = _int8_args()
    f = hlofuse.jit(_int8_linear, autotune="on", options={"int8-dot-unsigned": {"shift": "always"}})
    (k,) = [r for r in f.report(*args).kernels if r.kind == "matmul_epilogue"]
    text = f.lower(*args).as_text()
    assert k.extra.get("region_hash") and _has_kernel(text) and _has_unsigned_int8_dot(text)
    f(*args)
    out = f(*args)
    d = f.autotune_decision(*args)
    assert d.regions[k.extra["region_hash"]]["choice"] == ("xla" if xla_faster else "kernel")
    text = f.lower(*args).as_text()
    assert _has_kernel(text) != xla_faster and _has_unsigned_int8_dot(text)
    assert_same(out, jax.jit(_int8_linear)(*args), "exact")


# -- hlofuse's program against XLA's own module --------------------------------------------
def _runs_xla_module(f, *args) -> bool:
    """Whether calls of ``f`` on these arguments' signature run XLA's own module."""
    (st,) = [s for k, s in f._tuning.items() if k == f._call_key(args, {})]
    return st.fn is not None and st.fn == f._variant_jit({}, donate=True, plain=True)


def test_program_not_faster_than_xla_module_runs_xla_module(cache_dir, monkeypatch):
    """A program whose kernel is kept (it beats the region's own ops) but that is not faster
    than what jax.jit compiles: calls run jax.jit's code, the report says why, and a later
    process applies the cached decision without measuring."""
    clock = _fake_clock(monkeypatch, kernel_s=1.0e-3, xla_s=1.5e-3, xla_module_s=1.0e-3)
    args = _args()
    want = jax.jit(_ln)(*args)
    f = hlofuse.jit(_ln, autotune="on")
    f(*args)
    assert_same(f(*args), want, category="reassociate")   # measured here
    d = f.autotune_decision(*args)
    assert d.xla_module and d.variant == at.XLA_MODULE and at.options_of(d) == {}
    assert "1.00x of XLA's own module's time" in d.reason
    (c,) = d.regions.values()
    assert c["choice"] == "kernel"                 # the region decision stands as measured
    assert _runs_xla_module(f, *args)
    assert_same(f(*args), want, category="exact")  # jax.jit's own executable
    assert any("autotune: xla-module" in n and "calls run XLA's own module" in n
               for n in f.report(*args).notes)
    n_timed = len(clock)
    at.cache().clear_memory()                      # a later process, decisions on disk only
    g = hlofuse.jit(_ln, autotune="cached")
    g(*args)
    assert g.autotune_decision(*args).xla_module and _runs_xla_module(g, *args)
    assert_same(g(*args), want, category="exact")
    assert len(clock) == n_timed
    # transformations run hlofuse's program as before (tracers never take a tuned path)
    loss = lambda f_: (lambda x_: (f_(x_, *args[1:]) ** 2).sum())  # noqa: E731
    assert_same(jax.grad(loss(g))(args[0]), jax.grad(loss(_ln))(args[0]), "reassociate")


def test_program_faster_than_xla_module_by_the_margin_is_kept(cache_dir, monkeypatch):
    _fake_clock(monkeypatch, kernel_s=1.0e-3, xla_s=1.5e-3,
                xla_module_s=1.0e-3 / (1 - at.KEEP_MARGIN) * 1.01)
    args = _args()
    f = hlofuse.jit(_ln, autotune="on")
    f(*args)
    f(*args)
    d = f.autotune_decision(*args)
    assert d.variant == "default" and not _runs_xla_module(f, *args)
    assert "of XLA's own module's time" in d.reason
    assert "hlofuse_k" in f.lower(*args).as_text()


def test_xla_module_decision_keeps_donation(cache_dir, monkeypatch):
    _fake_clock(monkeypatch, kernel_s=1.0e-3, xla_s=1.5e-3, xla_module_s=0.5e-3)
    x, g, b = _args()
    want = jax.jit(_ln)(x, g, b)
    f = hlofuse.jit(_ln, autotune="on", donate_argnums=0)
    for _ in range(3):
        xi = x + 0
        assert_same(f(xi, g, b), want, category="reassociate")
    assert f.autotune_decision(x, g, b).xla_module and _runs_xla_module(f, x, g, b)
    xi = x + 0
    assert_same(f(xi, g, b), want, category="exact")
    assert xi.is_deleted()                         # donated, as jax.jit with donate_argnums


def test_decide_module_rule():
    m = at.Measurement({"default": 1.0, at.XLA_MODULE: 1.01, "ynn-off": 0.9}, ["ynn-off"],
                       0.01, 5, [])
    # the program as optimized, 1% faster than XLA's own module: not enough
    assert at.decide_module(m, "default", "r", 1.0)[0] == at.XLA_MODULE
    # with an option 10% faster: kept
    best, why = at.decide_module(m, "ynn-off", "r", 0.9)
    assert best == "ynn-off" and "0.89x of XLA's own module" in why
    # XLA's own module compiled to the same program (a duplicate) or nothing timed: unchanged
    dup = at.Measurement({"default": 1.0}, [], 0.01, 5, [at.XLA_MODULE])
    assert at.decide_module(dup, "default", "r", 1.0) == ("default", "r")
    short = at.Measurement({"default": 1.0}, [], 0.001, 0, [], "too short")
    assert at.decide_module(short, "default", "r", 1.0) == ("default", "r")


def test_decide_module_wants_most_rounds_won_not_a_median():
    """Zoo, linen_resnet_train: hlofuse's program measured 0.98x of XLA's module (median of 13
    rounds) and was kept, then ran 1.04x in the steady measurement; the previous run had
    decided the other way. Like an option, the program must also win most rounds."""
    lucky = [0.95, 0.96, 1.04, 1.05, 0.97, 1.03, 1.06, 0.96, 1.04, 1.04, 0.97, 1.05]
    m = at.Measurement({"default": 1.0, at.XLA_MODULE: 1.035}, [], 0.15, 12, [],
                       round_ratios={"default": [1.0] * 12, at.XLA_MODULE: lucky})
    best, why = at.decide_module(m, "default", "r", 1.0)    # median: 0.97x, enough alone
    assert best == at.XLA_MODULE and "faster in 7 of 12 rounds" in why, why
    clear = [1.03, 1.05, 1.02, 1.04, 1.06, 1.03, 1.05, 0.99, 1.04, 1.03, 1.05, 1.04]
    m.round_ratios[at.XLA_MODULE] = clear
    m.ratios[at.XLA_MODULE] = 1.04
    assert at.decide_module(m, "default", "r", 1.0)[0] == "default"
    # the decided variant (options, regions as XLA's code) against XLA's module, per round
    m.round_ratios["decided"] = [r + 0.04 for r in clear]        # loses every round
    m.ratios["decided"] = 1.08
    assert at.decide_module(m, "ynn-off", "r", 0.95, program="decided")[0] == at.XLA_MODULE


def _decided_xla_module(monkeypatch):
    """``_ln`` under hlofuse.jit, tuned on its second call to run XLA's own module (a faked
    clock), and its arguments."""
    _fake_clock(monkeypatch, kernel_s=1.0e-3, xla_s=1.5e-3, xla_module_s=0.5e-3)
    args = _args()
    f = hlofuse.jit(_ln, autotune="on")
    f(*args)
    f(*args)
    assert f.autotune_decision(*args).xla_module
    return f, args


def test_the_fast_path_under_a_transformation_runs_hlofuse_program(cache_dir, monkeypatch):
    """A signature decided to run XLA's own module takes the fast path at top level; under
    grad, vmap and an outer jit (told by the current trace, not by scanning the arguments for
    tracers) the call is hlofuse's program, with jax's numbers."""
    f, (x, g, b) = _decided_xla_module(monkeypatch)
    f(x, g, b)
    assert f._fast and f._fast_fn is not None           # top level: XLA's own module
    loss = lambda x_: (f(x_, g, b) ** 2).sum()          # noqa: E731
    for jaxpr in (jax.make_jaxpr(jax.grad(loss))(x),
                  jax.make_jaxpr(jax.vmap(lambda r: f(r[None], g, b)))(x[:4]),
                  jax.make_jaxpr(lambda x_: f(x_, g, b) * 2)(x)):
        assert "hlofuse_call" in str(jaxpr)
    assert_same(jax.grad(loss)(x), jax.grad(lambda x_: (_ln(x_, g, b) ** 2).sum())(x),
                category="reassociate")


def test_decided_calls_take_the_fast_path_and_a_new_signature_is_still_tuned(cache_dir,
                                                                            monkeypatch):
    """Calls of signatures that all run XLA's own module skip the per-call signature key
    (the fast path); a new signature arriving there still gets its first call and tuning."""
    f, (x, g, b) = _decided_xla_module(monkeypatch)
    keyed = []
    call_key = f._sig.call_key
    monkeypatch.setattr(f._sig, "call_key", lambda *a, **k: keyed.append(1) or call_key(*a, **k))
    for _ in range(3):
        assert_same(f(x, g, b), jax.jit(_ln)(x, g, b), category="exact")
    assert not keyed                                   # no per-call signature key
    x2 = x[:32]
    assert_same(f(x2, g, b), jax.jit(_ln)(x2, g, b), category="exact")   # XLA's code
    f(x2, g, b)                                        # its second call: measured
    assert keyed and f.autotune_decision(x2, g, b).xla_module
    n = len(keyed)
    for a in ((x, g, b), (x2, g, b)):
        assert_same(f(*a), jax.jit(_ln)(*a), category="exact")
    assert len(keyed) == n                             # both decided alike: fast again


@pytest.mark.parametrize("alone", [0.60, 0.90])
def test_regions_kept_as_xla_are_checked_again_under_the_chosen_options(monkeypatch, alone):
    """A region measured slower as a kernel under XLA's default options is timed again under
    the option variant chosen: the options alone (kernel kept) against the options with the
    region as XLA's code. The faster of the two is kept."""
    calls = []

    def fake_measure(make, args, variants, **kw):
        calls.append(sorted(variants))
        rr = {"default": [1.0] * 5, "combined": [0.80] * 5, "ynn-off": [alone] * 5}
        return at.Measurement({n: rr[n][0] for n in variants},
                              [n for n in variants if n != "default"], 1e-2, 5,
                              round_ratios={n: rr[n] for n in variants})
    monkeypatch.setattr(at, "measure", fake_measure)
    variants = {"default": {}, "ynn-off": at.VARIANTS["cpu"]["ynn-off"],
                "xla:abc": at.Variant(xla=frozenset(["h"]))}
    regions = {"xla:abc": {"hash": "h"}}
    chosen = {"h": {"choice": "xla", "ratio": 1.08, "reason": "kept XLA: kernel 1.08x slower, measured"}}
    m = at.Measurement({"default": 1.0, "ynn-off": 0.75, "xla:abc": 0.93}, ["ynn-off", "xla:abc"],
                       1e-2, 5)
    best, reason = at._confirm_combination(lambda spec: None, (), {}, variants, regions, m,
                                           "ynn-off", "r", chosen, 5.0, None, lambda msg: None)
    assert calls == [["combined", "default", "ynn-off"]] and best == "ynn-off"
    if alone < 0.80:      # the kernel wins under ynn-off: kept
        assert chosen["h"]["choice"] == "kernel", chosen
        assert "with ynn-off the kernel's program measured 0.75x of XLA's" in chosen["h"]["reason"]
        assert "kernels kept" in reason
    else:                 # XLA's code still wins: the combination stands
        assert chosen["h"]["choice"] == "xla" and "confirmed together: 0.80x" in reason


# -- gpu/tpu: kernels XLA would fuse itself run only once measured (issue 46) ------------------------
# The gpu/tpu decision path runs here on cpu: ``unmeasured="xla"`` is the gpu/tpu default policy
# (kernelize's "auto" there), the device key is a gpu's, and the fake clock above times the
# programs; the programs themselves are real and run.
HOLD = {"kernelize": {"unmeasured": "xla"}}


@pytest.fixture
def gpu_key(monkeypatch):
    monkeypatch.setattr(at, "device_key", lambda device=None: "gpu:NVIDIA H100 80GB HBM3")


def test_unmeasured_policy_keeps_xla_and_says_so(cache_dir, gpu_key):
    from hlofuse.passes.kernelize import XLA_FUSES
    args = _args()
    f = hlofuse.jit(_ln, autotune=False, options=HOLD)
    rep = f.report(*args)
    assert not rep.kernels
    (r,) = [r for r in rep.regions if r.kind == "reduction"]
    assert r.reason == XLA_FUSES and "hlofuse_k" not in f.lower(*args).as_text()
    assert_same(f(*args), jax.jit(_ln)(*args), category="reassociate")
    # the cpu default is unchanged: the same region is a kernel
    assert len(hlofuse.jit(_ln, autotune=False).report(*args).kernels) == 1


def test_held_back_kernel_measured_faster_runs_and_is_cached(cache_dir, monkeypatch, gpu_key):
    from hlofuse.passes.kernelize import XLA_FUSES
    clock = _fake_clock(monkeypatch, kernel_s=1.0e-3, xla_s=1.5e-3)
    args = _args()
    want = jax.jit(_ln)(*args)
    f = hlofuse.jit(_ln, autotune="on", options=HOLD)
    assert_same(f(*args), want, category="reassociate")
    before = f.report(*args)            # built with every kernel, the unmeasured held back
    assert not before.kernels and [r.reason for r in before.regions] == [XLA_FUSES]
    assert_same(f(*args), want, category="reassociate")   # second call: measured here
    # the fake clock saw both programs: the all-kernels one and the one with the region as XLA
    assert any(clock) and not all(clock)
    d = f.autotune_decision(*args)
    (c,) = d.regions.values()
    assert c["choice"] == "kernel" and not d.xla_regions
    assert len(f.report(*args).kernels) == 1 and "hlofuse_k" in f.lower(*args).as_text()
    assert_same(f(*args), want, category="reassociate")
    # a later process (memory cache cleared; the decision is on disk): built with the kernel
    at.cache().clear_memory()
    g = hlofuse.jit(_ln, autotune="cached", options=HOLD)
    (k,) = g.report(*args).kernels
    assert "cached decision" in k.extra["measured"]
    assert_same(g(*args), want, category="reassociate")


def test_held_back_kernel_measured_slower_stays_xla(cache_dir, monkeypatch, gpu_key):
    _fake_clock(monkeypatch, kernel_s=1.9e-3, xla_s=1.0e-3)
    args = _args()
    f = hlofuse.jit(_ln, autotune="on", options=HOLD)
    f(*args)
    f(*args)
    d = f.autotune_decision(*args)
    assert d.xla_regions and all(c["choice"] == "xla" for c in d.regions.values())
    rep = f.report(*args)
    assert not rep.kernels and "kernel 1.90x slower, measured" in rep.regions[0].reason
    assert_same(f(*args), jax.jit(_ln)(*args), category="reassociate")
