"""The model zoo (bench/zoo: Flax NNX and Linen, Equinox, Haiku, Transformers and Keras models) on
its small configs: every model gives jax.jit's numbers under hlofuse.jit (hlofuse.runtime.testing
tolerances), hlofuse found fusion regions in it and built every region it proposed, and
``python -m bench --zoo`` writes its table, JSON and chart.

Needs the ``zoo`` extra (``pip install -e ".[zoo,test]"``); without it the module skips.
``.ci/run`` runs it in a venv of its own with the extra installed.
"""

import json

import numpy as np
import pytest

from bench import zoo

_MISSING = zoo.missing_libraries()
if _MISSING:
    pytest.skip(f"model zoo libraries not installed ({', '.join(_MISSING)}): run "
                f"pip install -e '.[zoo,test]' to test bench/zoo (.ci/run does, in .venv-zoo)",
                allow_module_level=True)

import jax  # noqa: E402

import hlofuse  # noqa: E402
from hlofuse.runtime.testing import assert_same, compare  # noqa: E402


def test_the_zoo_covers_what_issue_14_asks_for():
    ms = list(zoo.MODELS.values())
    assert len(ms) >= 12
    libs = {m.library.split(".")[0] for m in ms}
    assert {"flax", "equinox", "haiku"} <= libs
    assert {"flax.nnx", "flax.linen"} <= {m.library for m in ms}
    assert {"encoder", "decoder", "vit", "convnet", "mlp"} <= {m.kind for m in ms}
    assert sum(m.mode == "train" for m in ms) >= 3
    assert any(m.small.get("dtype") == "bfloat16" for m in ms)
    for m in ms:
        assert set(m.small) == set(m.real), m.name           # the same knobs, other sizes
        assert m.category in hlofuse.runtime.testing.TOLERANCES, m.name


def _leaves_dtypes(tree):
    return {str(x.dtype) for x in jax.tree_util.tree_leaves(tree)}


def test_configs_mean_what_they_say():
    # bf16 variants really compute in bf16; NCHW/NHWC convnets take the layout they claim
    _, args = zoo.instantiate("nnx_llama_bf16", "small")
    assert "bfloat16" in _leaves_dtypes(args[0]) and "float32" not in _leaves_dtypes(args[0])
    _, args = zoo.instantiate("hk_bert_bf16", "small")
    assert _leaves_dtypes(args[0]) == {"bfloat16"} and args[1].dtype == jax.numpy.bfloat16
    for name, channel_axis in (("eqx_cnn_nchw", 1), ("hk_resnet_nchw", 1), ("linen_resnet_nhwc", 3)):
        _, args = zoo.instantiate(name, "small")
        assert args[-1].ndim == 4 and args[-1].shape[channel_axis] == 3, name


@pytest.mark.parametrize("name", zoo.names())
def test_small_model_matches_jax_jit(name):
    m = zoo.get(name)
    fn, args = m.instantiate("small", seed=0)
    want = jax.jit(fn)(*args)
    hf = hlofuse.jit(fn, autotune=False)
    got = hf(*args)
    assert_same(got, want, m.category)
    rep = hf.report(*args)
    # the rewrite fired: fusion regions were formed, each kernelized or left to XLA with a reason
    assert rep.regions, f"{name}: hlofuse formed no fusion region"
    assert all(r.kernel or r.reason for r in rep.regions), name
    # the region builders propose only regions the emitters can build (a failed build falls
    # back to XLA, correct but a bug: Keras' masked loss once made a scalar region output)
    assert not [r.reason for r in rep.regions if "build failed" in (r.reason or "")], name
    if m.kind in ("encoder", "decoder", "vit"):
        # every zoo transformer gets its attention kernel (the region that pays on cpu): padding
        # masks read as query and key masks, causal masks folded to constants included
        want_kind = "attention" if m.mode == "inference" else "attention_fwd_lse"
        assert any(r.kind == want_kind for r in rep.kernels), \
            (name, [(r.kind, r.reason) for r in rep.left_to_xla], rep.notes)
    if m.kind == "decode":
        # one query row: no attention kernel (XLA's two products and a softmax kernel), but the
        # products read the KV cache unrepeated (grouped-query attention)
        (stats,) = [p.stats for p in rep.passes if p.name == "fold-dot-repeats"]
        assert stats["folded"] == 2 * m.small["layers"], (name, stats)
    for x in jax.tree_util.tree_leaves(got):
        assert np.isfinite(np.asarray(x, np.float64)).all(), name
    if m.mode == "train":
        loss, new_params = got[0], got[1]
        changed = jax.tree_util.tree_map(lambda a, b: bool((np.asarray(a) != np.asarray(b)).any()),
                                         new_params, args[0])
        assert any(jax.tree_util.tree_leaves(changed)), f"{name}: the step updated no parameter"
        assert np.ndim(loss) == 0 and float(loss) > 0


def test_quantized_model_runs_unsigned_int8_dots():
    # the Linen int8 encoder: every quantized Dense is an int8 dot, each one rewritten to the
    # u8 x s8 form (int8-dot-unsigned, forced: CPUs with signed int8 dots keep those), inside
    # a matmul kernel with its scale epilogue
    fn, args = zoo.instantiate("linen_int8_bert", "small")
    hf = hlofuse.jit(fn, autotune=False, options={"int8-dot-unsigned": {"shift": "always"}})
    rep = hf.report(*args)
    (stats,) = [p.stats for p in rep.passes if p.name == "int8-dot-unsigned"]
    assert stats["rewritten"] == 6, stats
    assert sum(r.kind == "matmul_epilogue" for r in rep.kernels) >= 3
    assert hf.lower(*args).as_text().count("xui8>, tensor<") == 12   # each dot and its correction


def test_compare_would_catch_a_wrong_model():
    # the check above can fail: a perturbed output of a zoo model is caught at its tolerance
    m = zoo.get("eqx_mlp")
    fn, args = m.instantiate("small", seed=0)
    want = jax.jit(fn)(*args)
    assert compare(want * (1 + 1e-3), want, m.category)


def test_bench_zoo_cli_small(tmp_path, monkeypatch):
    from bench import __main__ as cli
    monkeypatch.setenv("HLOFUSE_CACHE_DIR", str(tmp_path / "cache"))
    out = {k: str(tmp_path / f"zoo.{k}") for k in ("json", "md", "png")}
    rc = cli.main(["--zoo", "--zoo-size", "small", "--quick", "--rounds", "2", "--models",
                   "eqx_mlp,nnx_mlp_train", "--json", out["json"], "--markdown", out["md"],
                   "--plot", out["png"]])
    assert rc == 0
    data = json.load(open(out["json"]))
    assert [r["name"] for r in data["results"]] == ["eqx_mlp", "nnx_mlp_train"]
    for r in data["results"]:
        assert r["correct"] and not r["mismatches"], r
        assert r["latency"]["rounds"] == 2 and r["latency"]["median_ratio"] > 0
        assert r["first_call_ratio"] > 0 and r["tune_s"] >= 0
        assert r["decisions"]["kernels"] >= 0 and "left_to_xla_reasons" in r["decisions"]
    assert data["summary"]["models"] == 2 and data["summary"]["mismatches"] == 0
    md = open(out["md"]).read()
    assert "| eqx_mlp |" in md and "1st ratio" in md
    png = open(out["png"], "rb").read()
    assert png[:8] == b"\x89PNG\r\n\x1a\n" and len(png) > 1000


def test_bf16_parity_against_the_f32_model():
    # the bf16 fallback of the zoo's correctness check: the f32 build of a bf16 model agrees
    # with it to bf16 accuracy, jax.jit's own output is (trivially) at parity, and an output
    # 5% off is not
    m = zoo.get("eqx_mlp_bf16")
    fn, args = m.instantiate("small", seed=0)
    want = jax.jit(fn)(*args)
    ref = zoo.f32_reference(m.name, "small", 0, args)()
    assert ref.dtype == jax.numpy.float32
    assert_same(want.astype(jax.numpy.float32).astype(jax.numpy.bfloat16),
                ref.astype(jax.numpy.bfloat16), "reassociate")
    assert zoo.bf16_parity(want, want, ref)["ok"]
    assert not zoo.bf16_parity(want * 1.05, want, ref)["ok"]
    assert zoo.f32_reference("eqx_mlp", "small", 0, args) is None  # f32 models: no fallback


@pytest.mark.parametrize("name", ["nnx_llama_train", "eqx_mlp", "hk_bert_bf16"])
def test_tiered_first_call_on_library_models(name):
    """As a user gets it (tiered first call, the default outside this suite): the first call
    runs XLA's own code for the model (jax.jit's numbers exactly) while hlofuse builds in the
    background, over each library's pytrees (NNX state, Linen/Haiku dicts, Equinox modules);
    later calls run hlofuse's kernels."""
    m = zoo.get(name)
    fn, args = m.instantiate("small", seed=0)
    want = jax.jit(fn)(*args)
    hf = hlofuse.jit(fn, autotune=False, tiered=True)
    first = hf(*args)
    for a, b in zip(jax.tree_util.tree_leaves(first), jax.tree_util.tree_leaves(want)):
        np.testing.assert_array_equal(np.asarray(a), np.asarray(b))
    assert hf.block_until_optimized(timeout=600)
    assert hf.tier_status(*args)["state"] == "ready", hf.tier_status(*args)
    assert_same(hf(*args), want, m.category)
    assert hf.report(*args).kernels, name


def test_filter_jit_runs_an_equinox_training_step_as_eqx_filter_jit_does():
    """``@hlofuse.filter_jit`` in place of ``@eqx.filter_jit`` on an unpartitioned Equinox
    model (``eqx.nn.MLP`` keeps its activation functions as leaves) with an optax step that
    returns the updated model: the same numbers as Equinox's own ``filter_jit``, the model's
    non-array leaves back unchanged, kernels built, one compilation over several steps."""
    import equinox as eqx
    import jax.numpy as jnp
    import optax

    model = eqx.nn.MLP(32, 8, 64, 2, key=jax.random.key(0))
    opt = optax.adamw(1e-3)
    state = opt.init(eqx.filter(model, eqx.is_array))
    r = np.random.default_rng(0)
    x = jnp.asarray(r.standard_normal((16, 32), np.float32))
    y = jnp.asarray(r.standard_normal((16, 8), np.float32))

    def step(model, state, x, y):
        def loss(m):
            return jnp.mean((jax.vmap(m)(x) - y) ** 2)
        value, grads = eqx.filter_value_and_grad(loss)(model)
        updates, state = opt.update(grads, state, eqx.filter(model, eqx.is_array))
        return eqx.apply_updates(model, updates), state, value

    ref, got = eqx.filter_jit(step), hlofuse.filter_jit(step, autotune=False)
    m1, s1, m2, s2 = model, state, model, state
    for _ in range(3):
        m1, s1, l1 = ref(m1, s1, x, y)
        m2, s2, l2 = got(m2, s2, x, y)
    assert m2.activation is model.activation and m2.final_activation is model.final_activation
    assert_same(np.asarray(l2), np.asarray(l1), "grad")
    for a, b in zip(jax.tree_util.tree_leaves(eqx.filter(m2, eqx.is_array)),
                    jax.tree_util.tree_leaves(eqx.filter(m1, eqx.is_array))):
        assert_same(np.asarray(a), np.asarray(b), "grad")
    assert got.report(m2, s2, x, y).kernels
    assert got.compilations == 1


def test_nnx_jit_writes_module_state_back_as_nnx_jit_does():
    """``@hlofuse.nnx_jit`` in place of ``@nnx.jit`` on an NNX train step that mutates its
    arguments (BatchNorm statistics, Dropout's RNG count, ``nnx.Optimizer.update``): the
    caller's module and optimizer get the same new state as under ``nnx.jit``, over hlofuse's
    program (kernels built). ``hlofuse.jit`` on the same step loses those updates, as
    ``jax.jit`` does, and says so."""
    import jax.numpy as jnp
    import optax
    from flax import nnx

    class M(nnx.Module):
        def __init__(self, rngs):
            # no bias before the BatchNorm: its gradient is 0 up to rounding, which Adam
            # scales to steps of the learning rate (then no two programs agree)
            self.l1 = nnx.Linear(16, 64, use_bias=False, rngs=rngs)
            self.bn = nnx.BatchNorm(64, rngs=rngs)
            self.do = nnx.Dropout(0.1, rngs=rngs)
            self.l2 = nnx.Linear(64, 8, rngs=rngs)

        def __call__(self, x):
            return self.l2(self.do(jax.nn.gelu(self.bn(self.l1(x)))))

    def make():
        m = M(nnx.Rngs(0, dropout=1))
        return m, nnx.Optimizer(m, optax.adam(1e-2), wrt=nnx.Param)

    def step(m, opt, x, y):
        def loss(m):
            return jnp.mean((m(x) - y) ** 2)
        value, grads = nnx.value_and_grad(loss)(m)
        opt.update(m, grads)
        return value

    r = np.random.default_rng(0)
    x = jnp.asarray(r.standard_normal((32, 16), np.float32) + 2)
    y = jnp.asarray(r.standard_normal((32, 8), np.float32))
    (m1, o1), (m2, o2) = make(), make()
    ref, got = nnx.jit(step), hlofuse.nnx_jit(step, autotune=False, tiered=False)
    for _ in range(3):
        l1, l2 = ref(m1, o1, x, y), got(m2, o2, x, y)
    assert_same(np.asarray(l2), np.asarray(l1), "grad")
    s1, s2 = nnx.state((m1, o1)), nnx.state((m2, o2))
    for a, b in zip(jax.tree_util.tree_leaves(s2), jax.tree_util.tree_leaves(s1)):
        a, b = np.asarray(jax.random.key_data(a) if jnp.issubdtype(a.dtype, jax.dtypes.prng_key)
                          else a), \
            np.asarray(jax.random.key_data(b) if jnp.issubdtype(b.dtype, jax.dtypes.prng_key)
                       else b)
        assert_same(a, b, "grad")
    assert float(jnp.abs(m2.bn.mean[...]).max()) > 0           # the statistics came back
    assert int(o2.step[...]) == 3
    assert got.report(m2, o2, x, y).kernels and got.compilations == 1

    m3, o3 = make()
    before = np.asarray(m3.l1.kernel[...])
    with pytest.warns(hlofuse.HlofuseWarning, match="use hlofuse.nnx_jit"):
        hlofuse.jit(step, autotune=False, tiered=False)(m3, o3, x, y)
    np.testing.assert_array_equal(np.asarray(m3.l1.kernel[...]), before)   # lost, as jax.jit


def test_a_neural_ode_training_step_is_optimized_around_its_runtime_checks():
    """diffrax (with lineax and optimistix inside) checks its results with Equinox's
    ``error_if``, which calls back into Python: the whole step used to be left to XLA. The
    callbacks stay where they are and the code around them gets kernels; the numbers are
    ``jax.jit``'s, and a failing check raises as under ``jax.jit``."""
    import diffrax
    import equinox as eqx
    import jax.numpy as jnp
    import optax

    mlp = eqx.nn.MLP(4, 4, 64, 2, activation=jax.nn.softplus, key=jax.random.key(0))
    params, static = eqx.partition(mlp, eqx.is_array)
    ts = jnp.linspace(0.0, 1.0, 8)
    y0 = jnp.asarray(np.random.default_rng(0).standard_normal((16, 4), np.float32))
    target = jnp.sin(ts)[:, None, None] * y0
    opt = optax.adam(1e-3)

    def loss(params):
        f = eqx.combine(params, static)
        term = diffrax.ODETerm(lambda t, y, args: jax.vmap(f)(y))
        sol = diffrax.diffeqsolve(term, diffrax.Tsit5(), 0.0, 1.0, 0.1, y0,
                                  saveat=diffrax.SaveAt(ts=ts),
                                  stepsize_controller=diffrax.PIDController(rtol=1e-4, atol=1e-6))
        return jnp.mean((sol.ys - target) ** 2)

    def step(params, state):
        value, grads = jax.value_and_grad(loss)(params)
        updates, state = opt.update(grads, state)
        return optax.apply_updates(params, updates), state, value

    state = opt.init(params)
    hf = hlofuse.jit(step, autotune=False, tiered=False)
    want, got = jax.jit(step)(params, state), hf(params, state)
    for a, b in zip(jax.tree_util.tree_leaves(got), jax.tree_util.tree_leaves(want)):
        assert_same(np.asarray(a), np.asarray(b), "grad")
    rep = hf.report(params, state)
    assert rep.kernels and any("call(s) back into Python" in n for n in rep.notes)

    def checked(x):
        x = eqx.error_if(x, jnp.any(x > 100.0), "x is too big")
        return jax.nn.softmax(jnp.tanh(x) * 2.0, axis=-1)
    hc = hlofuse.jit(checked, autotune=False, tiered=False)
    x = np.asarray(y0)
    assert_same(hc(x), jax.jit(checked)(x), "reassociate")
    assert hc.report(x).kernels
    with pytest.raises(Exception, match="x is too big"):
        jax.block_until_ready(hc(x * 1e3))
