"""The persistent cache of optimized modules (a second process skips the pass pipeline):
hit, miss, damage, invalidation by options and versions. No timing assertions."""

import json
import os

import numpy as np
import pytest

import jax
import jax.numpy as jnp

import hlofuse
from hlofuse.core import hostcpu
from hlofuse.runtime import program as runtime
from hlofuse.runtime.testing import assert_same
from hlofuse.runtime import autotune as at
from hlofuse.runtime import module_cache as mc


def _ln(x, g, b):
    m = x.mean(-1, keepdims=True)
    v = ((x - m) ** 2).mean(-1, keepdims=True)
    return (x - m) * jax.lax.rsqrt(v + 1e-5) * g + b


def _args():
    x = jnp.asarray(np.random.default_rng(0).standard_normal((16, 128)), jnp.float32)
    return x, jnp.ones((128,), jnp.float32), jnp.zeros((128,), jnp.float32)


@pytest.fixture
def cache_dir(tmp_path, monkeypatch):
    monkeypatch.setenv("HLOFUSE_CACHE_DIR", str(tmp_path))
    monkeypatch.setenv(mc.ENV, "1")
    monkeypatch.setenv(mc.XLA_ENV, "0")   # never touch jax's global cache config in tests
    at.cache().clear_memory()
    for k in mc.STATS:
        monkeypatch.setitem(mc.STATS, k, 0)
    yield tmp_path
    at.cache().clear_memory()


def _entries(d):
    return sorted(os.listdir(d / "modules")) if (d / "modules").exists() else []


def _no_passes(monkeypatch):
    def boom(*a, **k):
        raise AssertionError("the pass pipeline ran on a cache hit")
    monkeypatch.setattr(runtime, "optimize", boom)


def test_miss_then_hit_skips_the_passes(cache_dir, monkeypatch):
    args = _args()
    want = jax.jit(_ln)(*args)
    f = hlofuse.jit(_ln, autotune="off")
    assert_same(f(*args), want, category="reassociate")
    rep1 = f.report(*args)
    assert mc.STATS["misses"] == 1 and mc.STATS["writes"] == 1
    assert len(_entries(cache_dir)) == 1
    _no_passes(monkeypatch)               # "a second process": only the cache can answer
    g = hlofuse.jit(_ln, autotune="off")
    assert_same(g(*args), want, category="reassociate")
    rep2 = g.report(*args)
    assert mc.STATS["hits"] == 1
    assert len(rep2.kernels) == len(rep1.kernels) == 1
    assert rep2.regions[0].kind == rep1.regions[0].kind
    assert rep2.regions[0].extra["region_hash"] == rep1.regions[0].extra["region_hash"]
    assert rep2.notes == rep1.notes and [p.name for p in rep2.passes] == [p.name for p in rep1.passes]
    assert g.lower(*args).as_text() == f.lower(*args).as_text()
    # the kept original region functions survive in the module (check=True and measured
    # decisions need them)
    from hlofuse.passes.kernel_table import kernel_funcs
    kept = lambda fn: {r: k.original for r, k in kernel_funcs(  # noqa: E731
        fn.lower(*args)._entry.optimized.module).items()}
    assert kept(g) == kept(f) and all(kept(g).values()) and len(kept(g)) == 1


def _traced(d):
    return sorted(os.listdir(d / "traced")) if (d / "traced").exists() else []


@pytest.mark.parametrize("damage", ["truncate", "checksum", "garbage", "wrong_key"])
def test_damaged_entry_is_a_miss_and_rewritten(cache_dir, damage):
    args = _args()
    want = jax.jit(_ln)(*args)
    hlofuse.jit(_ln, autotune="off")(*args)
    (name,) = _entries(cache_dir)
    (cache_dir / "traced" / _traced(cache_dir)[0]).unlink()   # the module entry answers
    path = cache_dir / "modules" / name
    raw = path.read_text()
    if damage == "truncate":
        path.write_text(raw[: len(raw) // 2])
    elif damage == "garbage":
        path.write_bytes(b"\x00\xff" * 100)
    else:
        d = json.loads(raw)
        if damage == "checksum":
            d["module_sha256"] = "0" * 64
        else:
            d["key"] = "other"
        path.write_text(json.dumps(d))
    with pytest.warns(hlofuse.HlofuseWarning, match="damaged module cache entry"):
        f = hlofuse.jit(_ln, autotune="off")
        assert_same(f(*args), want, category="reassociate")
    assert mc.STATS["damaged"] == 1 and len(f.report(*args).kernels) == 1
    assert json.loads(path.read_text())["key"] == name[:-5]   # rewritten whole


def test_options_and_versions_invalidate(cache_dir, monkeypatch):
    args = _args()
    hlofuse.jit(_ln, autotune="off")(*args)
    hlofuse.jit(_ln, autotune="off", options={"no_kernels": True})(*args)
    assert mc.STATS["misses"] == 2 and len(_entries(cache_dir)) == 2
    hlofuse.jit(_ln, autotune="off", options={"no_kernels": True})(*args)
    assert mc.STATS["hits"] == 1
    # another hlofuse/jax version: a different key, the old entry is not used
    monkeypatch.setattr(mc, "code_fingerprint", lambda: "another-version")
    hlofuse.jit(_ln, autotune="off")(*args)
    assert mc.STATS["misses"] == 3 and len(_entries(cache_dir)) == 3
    # key(): the input module, the options and the versions all count
    k = mc.key(b"module", {"a": 1})
    assert k == mc.key(b"module", {"a": 1})
    assert k != mc.key(b"module2", {"a": 1}) and k != mc.key(b"module", {"a": 2})
    assert mc.key(b"module", {"a": object()}) is None   # cannot be keyed: not cached
    # another CPU (the features cpu passes choose forms by): another key, another entry
    monkeypatch.setattr(hostcpu, "profile", lambda: "x86_64 avx512_vnni")
    assert mc.key(b"module", {"a": 1}) != k
    hlofuse.jit(_ln, autotune="off")(*args)
    assert mc.STATS["misses"] == 4 and len(_entries(cache_dir)) == 4


def test_off_and_dump_dir_bypass(cache_dir, monkeypatch, tmp_path):
    args = _args()
    monkeypatch.setenv(mc.ENV, "0")
    hlofuse.jit(_ln, autotune="off")(*args)
    assert _entries(cache_dir) == []
    monkeypatch.setenv(mc.ENV, "1")
    hlofuse.jit(_ln, autotune="off", dump_dir=str(tmp_path / "dumps"))(*args)
    assert _entries(cache_dir) == [] and os.listdir(tmp_path / "dumps")


def test_cached_region_decisions_apply_on_top_of_a_hit(cache_dir):
    """The cached module is the passes' output; measured decisions are applied after loading,
    so a decision made later still takes effect and never changes what is cached."""
    args = _args()
    want = jax.jit(_ln)(*args)
    f = hlofuse.jit(_ln, autotune="cached")
    f(*args)
    h = f.report(*args).kernels[0].extra["region_hash"]
    at.cache().put_regions({at.region_key(h, at.device_key()): {
        "choice": "xla", "ratio": 1.5, "reason": "kept XLA: kernel 1.50x slower, measured"}})
    g = hlofuse.jit(_ln, autotune="cached")
    assert_same(g(*args), want, category="reassociate")
    assert mc.STATS["hits"] == 1 and not g.report(*args).kernels
    assert len(hlofuse.jit(_ln, autotune="off").report(*args).kernels) == 1  # cache untouched


def test_xla_cache_left_alone_when_off(cache_dir):
    assert mc.enable_xla_cache() is None   # HLOFUSE_XLA_CACHE=0


def test_lapack_calls_still_lower_after_a_cache_hit(cache_dir):
    """hlofuse skips jax's LAPACK initialization when lowering its own call only for modules
    without LAPACK custom calls; a module with them (here from a cache hit) still works."""
    def f(a):
        return jnp.linalg.inv(a) @ a
    a = jnp.asarray(np.random.default_rng(1).standard_normal((8, 8)) + 8 * np.eye(8), jnp.float32)
    want = jax.jit(f)(a)
    assert_same(hlofuse.jit(f, autotune="off")(a), want, category="reassociate")
    g = hlofuse.jit(f, autotune="off")
    assert b"lapack" in g.lower(a).exported.mlir_module_serialized
    assert_same(g(a), want, category="reassociate")
    assert mc.STATS["hits"] == 1


def test_oversized_modules_are_not_cached(cache_dir, monkeypatch):
    monkeypatch.setattr(mc, "MAX_ENTRY_BYTES", 10)
    hlofuse.jit(_ln, autotune="off")(*_args())
    assert _entries(cache_dir) == [] and mc.STATS["writes"] == 0


def test_traced_entry_skips_export_and_composes(cache_dir, monkeypatch):
    """A second process finds the optimized Exported by the traced function, before
    jax.export: neither export nor the passes run, and grad, vmap and an outer jit still work
    (their derived programs hit their own traced entries)."""
    args = _args()
    want = jax.jit(_ln)(*args)

    def loss(x, g, b):
        return (_ln(x, g, b) ** 2).sum()
    want_grad = jax.jit(jax.grad(loss))(*args)
    want_vmap = jax.jit(jax.vmap(_ln, in_axes=(0, None, None)))(args[0][None], *args[1:])
    f = hlofuse.jit(_ln, autotune="off")
    f(*args)
    jax.grad(lambda *a: (f(*a) ** 2).sum())(*args)
    jax.vmap(f, in_axes=(0, None, None))(args[0][None], *args[1:])
    text1 = f.lower(*args).as_text()
    n_traced, misses = len(_traced(cache_dir)), mc.STATS["misses"]
    assert mc.STATS["traced_writes"] == n_traced >= 3   # primal, forward, backward, vmap
    _no_passes(monkeypatch)

    def no_export(*a, **k):
        raise AssertionError("jax.export ran on a traced hit")
    monkeypatch.setattr(runtime.jexport, "export", no_export)
    g = hlofuse.jit(_ln, autotune="off")
    assert_same(g(*args), want, category="reassociate")
    assert mc.STATS["traced_hits"] == mc.STATS["hits"] == 1
    assert g.lower(*args).as_text() == text1
    assert len(g.report(*args).kernels) == 1
    assert_same(jax.grad(lambda *a: (g(*a) ** 2).sum())(*args), want_grad, category="reassociate")
    assert_same(jax.vmap(g, in_axes=(0, None, None))(args[0][None], *args[1:]), want_vmap,
                category="reassociate")
    assert_same(jax.jit(g)(*args), want, category="reassociate")
    assert mc.STATS["misses"] == misses and len(_traced(cache_dir)) == n_traced


def test_traced_key_covers_constants_options_and_source(cache_dir):
    """The traced key changes with a closed-over constant's values (not shown in the jaxpr's
    text), with the options and with the source location; an unkeyable jaxpr has none."""
    args = _args()
    x = args[0]

    def make(scale):
        c = np.full((128,), scale, np.float32)
        return lambda x: _ln(x, jnp.asarray(c), jnp.asarray(c))
    f1, f2 = hlofuse.jit(make(1.0), autotune="off"), hlofuse.jit(make(2.0), autotune="off")
    r1 = f1(x)
    assert_same(f2(x), 2 * r1, category="reassociate")  # not the cached module of f1
    assert mc.STATS["traced_hits"] == 0 and len(_traced(cache_dir)) == 2
    sig = runtime.signature_of([jax.typeof(x)])
    j = jax.make_jaxpr(lambda x: x * 2.0)(x)
    j_other_line = jax.make_jaxpr(
        lambda x: x * 2.0)(x)
    opts = runtime.Options(target=None)

    def key(jaxpr, o=opts):
        return runtime._traced_cache_key(jaxpr, sig, o, runtime.CPU, "f", (), None, o.pass_options,
                                         None, 1)
    assert key(j) is not None and key(j) == key(j)
    assert key(j) != key(j_other_line)
    o2 = runtime.Options(target=None, pass_options={"kernelize": {"no_kernels": True}})
    assert key(j) != key(j, o2)

    # a parameter printed as an object's address (here a Python callback): no traced key
    assert runtime._jaxpr_digest(jax.make_jaxpr(
        lambda x: jax.pure_callback(lambda v: v, jax.ShapeDtypeStruct(x.shape, x.dtype), x))(x)
    ) is None


def test_traced_key_covers_nested_programs_and_pallas_index_maps(cache_dir):
    """What the jaxpr's text does not show is in the traced key too (adversarial round: both
    ran another function's cached module, silently): an ``hlofuse.jit`` function called inside
    another prints as its name only (so the outer function with another static value, or a
    factory's second model, got the first's numbers), and ``pallas_call`` prints its block
    specs without their index maps."""
    from jax.experimental import pallas as pl
    x = jnp.arange(8.0)
    inner = hlofuse.jit(lambda a, n: a * n, static_argnums=1, tiered=False, autotune="off")
    outer = hlofuse.jit(lambda a, n: inner(a, n) + 1.0, static_argnums=1, tiered=False,
                        autotune="off")
    for n in (3, 5):
        np.testing.assert_array_equal(np.asarray(outer(x, n)), np.asarray(x * n + 1.0))

    def model(k):
        helper = hlofuse.jit(lambda a: jnp.tanh(a * k), tiered=False, autotune="off")
        return hlofuse.jit(lambda a: helper(a) + a, tiered=False, autotune="off")
    for k in (2.0, 3.0):
        np.testing.assert_allclose(np.asarray(model(k)(x)), np.tanh(np.asarray(x) * k) + np.asarray(x),
                                   rtol=1e-6)

    def kernel(x_ref, o_ref):
        o_ref[...] = x_ref[...] * 2.0

    def make(index_map):
        return lambda x: pl.pallas_call(
            kernel, out_shape=jax.ShapeDtypeStruct(x.shape, x.dtype), grid=(4,),
            in_specs=[pl.BlockSpec((2,), index_map)], out_specs=pl.BlockSpec((2,), lambda i: (i,)),
            interpret=True)(x)
    for index_map in (lambda i: (i,), lambda i: (3 - i,)):
        f = make(index_map)
        np.testing.assert_array_equal(np.asarray(hlofuse.jit(f, tiered=False, autotune="off")(x)),
                                      np.asarray(jax.jit(f)(x)))
    # both programs are keyed (a traced entry each), not left unkeyed
    assert runtime._jaxpr_digest(jax.make_jaxpr(make(lambda i: (i,)))(x)) is not None
    assert runtime._jaxpr_digest(jax.make_jaxpr(make(lambda i: (i,)))(x)) != \
        runtime._jaxpr_digest(jax.make_jaxpr(make(lambda i: (3 - i,)))(x))


@pytest.mark.parametrize("damage", ["truncate", "checksum"])
def test_damaged_traced_entry_falls_back_to_the_module_entry(cache_dir, damage):
    args = _args()
    want = jax.jit(_ln)(*args)
    hlofuse.jit(_ln, autotune="off")(*args)
    (name,) = _traced(cache_dir)
    path = cache_dir / "traced" / name
    raw = path.read_text()
    if damage == "truncate":
        path.write_text(raw[: len(raw) // 2])
    else:
        d = json.loads(raw)
        d["exported_sha256"] = "0" * 64
        path.write_text(json.dumps(d))
    with pytest.warns(hlofuse.HlofuseWarning, match="damaged module cache entry"):
        f = hlofuse.jit(_ln, autotune="off")
        assert_same(f(*args), want, category="reassociate")
    assert mc.STATS["hits"] == 1 and mc.STATS["traced_hits"] == 0   # the module entry answered
    assert json.loads(path.read_text())["key"] == name[:-5]   # rewritten whole


def test_disable_env_is_part_of_both_keys(cache_dir, monkeypatch):
    """``HLOFUSE_DISABLE_PASSES`` changes what the pipeline makes: neither entry of a run
    without it answers a run with it."""
    args = _args()
    monkeypatch.delenv("HLOFUSE_DISABLE_PASSES", raising=False)
    assert len(hlofuse.jit(_ln, autotune="off").report(*args).kernels) == 1
    monkeypatch.setenv("HLOFUSE_DISABLE_PASSES", "kernelize")
    g = hlofuse.jit(_ln, autotune="off")
    assert_same(g(*args), jax.jit(_ln)(*args), category="reassociate")
    assert not g.report(*args).kernels and mc.STATS["hits"] == 0


def test_cpu_attention_parts_is_part_of_both_keys(cache_dir, monkeypatch):
    """``HLOFUSE_CPU_ATTENTION_PARTS`` (read when the kernels load) splits the cpu attention
    kernels' loops: a module cached under one setting never answers another."""
    from hlofuse.runtime import program as runtime
    from hlofuse.kernels.attention import cpu as attention_cpu
    from hlofuse.core.target import CPU
    key = lambda: runtime._optimization_key(runtime.Options(None), CPU, "f", (), None, {})
    one = key()
    parts = lambda k: k["settings"]["HLOFUSE_CPU_ATTENTION_PARTS"]
    monkeypatch.setenv("HLOFUSE_CPU_ATTENTION_PARTS", str(parts(one) + 1))
    assert parts(key()) == parts(one) + 1
    # as in effect: an A/B harness (bench.attention_parts) sets it in the kernels' module
    monkeypatch.setattr(attention_cpu, "CPU_PARTS", parts(one) + 2)
    assert parts(key()) == parts(one) + 2


def test_cpu_attention_whole_rows_are_part_of_both_keys(monkeypatch):
    """The forward's whole rows (from the release, or set by an A/B harness) change the kernel:
    a module cached under one setting never answers another; other targets do not read it."""
    from hlofuse.runtime import program as runtime
    from hlofuse.kernels.attention import blocks
    from hlofuse.core import compat
    from hlofuse.core.target import CPU, Target
    key = lambda t=CPU: runtime._optimization_key(runtime.Options(None), t, "f", (), None, {})
    # from the release: keyed by what the probe depends on besides the versions (XLA_FLAGS),
    # without compiling it
    monkeypatch.setattr(compat, "cpu_fuses_attention_rows",
                        lambda: pytest.fail("the key compiled the probe"))
    monkeypatch.setenv("XLA_FLAGS", "")
    auto = key()["cpu_attention_whole_rows"]
    monkeypatch.setenv("XLA_FLAGS", "--xla_cpu_experimental_ynn_fusion_type=")
    assert key()["cpu_attention_whole_rows"] not in (auto, True, False)
    for rows in (True, False):
        monkeypatch.setattr(blocks, "CPU_WHOLE_ROWS", rows)
        assert key()["cpu_attention_whole_rows"] is rows
    assert key(Target.of("gpu"))["cpu_attention_whole_rows"] is None


_XLA_CACHE_CHILD = """
import os, sys
import numpy as np
import jax, jax.numpy as jnp
import hlofuse
from hlofuse.core import compat
d = os.path.join(os.environ["HLOFUSE_CACHE_DIR"], "xla")
def n():
    return len(os.listdir(d)) if os.path.isdir(d) else 0
f = hlofuse.jit(lambda x: jnp.tanh(x) * 2.0 + 1.0, autotune="off")
f(jnp.ones((4, 8), jnp.float32)).block_until_ready()
after_call = n()
restored = compat.persistent_cache_min_compile_time()
(jnp.arange(7.0) * 3.0).block_until_ready()   # an eager op of the application: not cached
print(after_call, n(), restored)
"""


def test_hlofuse_compiles_enter_its_own_xla_cache_however_short(tmp_path):
    """A second process skips XLA's compile of hlofuse's call even when it took less than
    XLA_MIN_COMPILE_S (warm first calls of small models), while the application's own short
    compiles stay out of the cache (fresh process: jax's cache configuration is global)."""
    import subprocess
    import sys
    env = dict(os.environ, HLOFUSE_CACHE_DIR=str(tmp_path), HLOFUSE_XLA_CACHE="1",
               HLOFUSE_MODULE_CACHE="1", JAX_PLATFORMS="cpu")
    p = subprocess.run([sys.executable, "-c", _XLA_CACHE_CHILD], capture_output=True, text=True,
                       env=env, timeout=300)
    assert p.returncode == 0, p.stderr[-2000:]
    after_call, after_eager, restored = p.stdout.split()
    assert int(after_call) >= 1                 # hlofuse's compile is in jax's cache
    assert int(after_eager) == int(after_call)  # the eager op after it is not
    assert float(restored) == mc.XLA_MIN_COMPILE_S


def test_the_code_fingerprint_covers_every_layer():
    """Every source file of the package is part of the key's code fingerprint: a change in
    the runtime or the front end (not only the core) makes a new key."""
    names = {n for n, _ in mc.source_files()}
    for want in ("hlofuse/core/ir.py", "hlofuse/runtime/program.py", "hlofuse/frontend/jit.py",
                 "hlofuse.passes/kernelize.py", "hlofuse.kernels/common.py"):
        assert want in names, want


@pytest.mark.parametrize("where", ["is-a-file", "under-a-file"])
def test_a_cache_directory_that_cannot_be_one_warns_once(cache_dir, monkeypatch, where):
    """HLOFUSE_CACHE_DIR naming a file (or a path under one): every call was right, but each
    entry warned that it was damaged and "will be rewritten" (it cannot be). Now one
    HlofuseWarning says the directory is unusable, and nothing is written there."""
    import warnings
    f = cache_dir / "a-file"
    f.write_text("not a directory")
    root = f if where == "is-a-file" else f / "cache"
    monkeypatch.setenv("HLOFUSE_CACHE_DIR", str(root))
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        for n in (8, 16, 8):
            g = hlofuse.jit(lambda x: jax.nn.softmax(jnp.tanh(x) * 2.0, -1), tiered=False,
                            autotune=False)
            x = np.ones((4, n), np.float32)
            assert_same(g(x), jax.jit(lambda x: jax.nn.softmax(jnp.tanh(x) * 2.0, -1))(x),
                        "reassociate")
    ours = [w for w in caught if issubclass(w.category, hlofuse.HlofuseWarning)]
    assert len(ours) == 1 and "is not a directory" in str(ours[0].message), \
        [str(w.message) for w in caught]
    assert mc.STATS["damaged"] == 0 and mc.STATS["writes"] == 0
    assert f.read_text() == "not a directory"


@pytest.mark.parametrize("form", ["closure", "inner_jit", "zero_d"])
def test_a_closed_over_numpy_array_changed_in_place_keeps_the_traced_values(tmp_path, monkeypatch,
                                                                            form):
    """jax.jit lowers once, with the values a closed-over numpy array has at the first call.
    hlofuse's background build (tiered first call) lowered the traced jaxpr again after the
    caller changed the array in place: later calls got the new values, and the module cache
    stored them under the key of the old ones, so a second process with the original values
    got wrong numbers (max error 0.47; adversarial round). The trace owns copies now."""
    import numpy as np
    import jax
    import jax.numpy as jnp
    import hlofuse
    monkeypatch.setenv("HLOFUSE_CACHE_DIR", str(tmp_path))

    def make():
        w = np.eye(128, dtype=np.float32)
        c = np.ones((128,), np.float32) if form != "zero_d" else np.array(1.0, np.float32)
        if form == "inner_jit":            # the constants of an inner jax.jit (review)
            inner = jax.jit(lambda x: x @ w + c)
            return (lambda x: jax.nn.softmax(inner(x), -1)), w, c
        return (lambda x: jax.nn.softmax(x @ w + c, -1)), w, c
    x = jax.random.normal(jax.random.key(0), (64, 128))
    f, w, c = make()
    want = np.asarray(jax.jit(make()[0])(x))
    hf = hlofuse.jit(f, tiered=True)
    first = hf(x)
    w *= 2
    c[...] = 5.0                           # a 0-d array is a literal of the jaxpr (review)
    assert hf.block_until_optimized(120)
    assert hf.report(x).kernels
    for out in (first, hf(x), hf(x)):
        np.testing.assert_allclose(np.asarray(out), want, rtol=2e-5, atol=2e-6)
    g = hlofuse.jit(make()[0])                       # the same code, the original values: the
    np.testing.assert_allclose(np.asarray(g(x)), want, rtol=2e-5, atol=2e-6)  # cache's entry


def test_an_unreadable_cache_folder_warns_once_per_folder(cache_dir, monkeypatch):
    """Entries this process may not read (another user's folder, mode 000) warned per entry,
    twice per signature, that the "damaged" entry "will be rewritten" (it cannot be): one
    warning per folder now, saying its entries are not used (adversarial round)."""
    import builtins
    import warnings
    args = _args()
    want = jax.jit(_ln)(*args)
    hlofuse.jit(_ln, autotune="off")(*args)
    real_open = builtins.open

    def denied(file, *a, **k):
        if str(file).startswith(str(cache_dir)) and str(file).endswith(".json") and \
                "autotune" not in str(file):
            raise PermissionError(13, "Permission denied", str(file))
        return real_open(file, *a, **k)
    monkeypatch.setattr(builtins, "open", denied)
    mc._UNUSABLE_WARNED.clear()
    with warnings.catch_warnings(record=True) as seen:
        warnings.simplefilter("always")
        for _ in range(2):
            f = hlofuse.jit(_ln, autotune="off")
            assert_same(f(*args), want, category="reassociate")
    msgs = [str(w.message) for w in seen if "module cache" in str(w.message)]
    assert msgs and all("cannot read the module cache" in m for m in msgs), msgs
    assert len(msgs) == len(set(msgs)) <= 2                 # modules/ and traced/, once each
    assert mc.STATS["damaged"] == 0
