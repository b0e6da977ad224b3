"""``hlofuse.filter_jit``: Equinox's ``filter_jit`` calling convention over ``hlofuse.jit``.

A model pytree whose leaves mix arrays with a function and a string (what an Equinox module
is; built here with ``jax.tree_util`` so the core install tests it, ``tests/test_zoo.py`` runs a
real ``eqx.nn.MLP`` training step). ``jax.jit`` rejects it; ``filter_jit`` traces the arrays,
keeps the rest static, returns non-array outputs as they were, fuses (the rewrite fired), and
gives jax.jit's numbers on the partitioned program.
"""

from __future__ import annotations

import dataclasses
import warnings

import numpy as np
import pytest

import jax
import jax.numpy as jnp

import hlofuse
from hlofuse.runtime.testing import assert_same


@jax.tree_util.register_dataclass
@dataclasses.dataclass
class Layer:
    w: jax.Array
    b: jax.Array
    act: object          # a function: a leaf jax.jit cannot trace
    name: str            # a string leaf


def _model(seed=0, act=jax.nn.gelu):
    r = np.random.default_rng(seed)
    return [Layer(jnp.asarray(r.standard_normal((64, 64), np.float32) * 0.1),
                  jnp.asarray(r.standard_normal(64, np.float32)), act, f"layer{i}")
            for i in range(2)]


def forward(model, x, *, scale=1.0):
    for layer in model:
        x = layer.act(x @ layer.w + layer.b) * scale
    return x


def _plain(model, x, scale=1.0):
    """The same program under jax.jit, the static leaves closed over."""
    arrays = [(m.w, m.b) for m in model]
    acts = [m.act for m in model]

    def f(arrays, x):
        for (w, b), act in zip(arrays, acts):
            x = act(x @ w + b) * scale
        return x
    return jax.jit(f)(arrays, x)


X = jnp.asarray(np.random.default_rng(9).standard_normal((32, 64), np.float32))


def test_jax_jit_rejects_the_model_and_filter_jit_runs_it():
    with pytest.raises(TypeError):
        jax.jit(forward)(_model(), X)
    f = hlofuse.filter_jit(forward)
    model = _model()
    out = f(model, X)
    assert_same(np.asarray(out), np.asarray(_plain(model, X)), "reassociate")
    rep = f.report(model, X)
    assert rep.kernels, str(rep)                      # the rewrite fired
    assert f.compilations == 1
    f(_model(seed=1), X)                              # new array values: no new compilation
    assert f.compilations == 1
    out2 = f(model, X, scale=0.5)                     # a Python float is static: compiles again
    assert f.compilations == 2
    assert_same(np.asarray(out2), np.asarray(_plain(model, X, 0.5)), "reassociate")
    f(_model(act=jax.nn.relu), X)                     # another function: another program
    assert f.compilations == 3


def test_non_array_outputs_come_back_as_they_were():
    @hlofuse.filter_jit
    def step(model, x):
        y = forward(model, x)
        new = [dataclasses.replace(m, w=m.w - 0.01 * jnp.mean(y), b=m.b * 2) for m in model]
        return new, {"loss": jnp.sum(y ** 2), "tag": "done", "n": len(model)}
    model = _model()
    new, aux = step(model, X)
    assert [m.act for m in new] == [m.act for m in model]
    assert [m.name for m in new] == ["layer0", "layer1"] and aux["tag"] == "done"
    assert aux["n"] == 2 and isinstance(aux["n"], int)
    assert_same(np.asarray(new[1].b), np.asarray(model[1].b) * 2, "exact")
    new2, _ = step(new, X)                           # feeds its own output back: same program
    assert step.compilations == 1 and isinstance(new2[0], Layer)


def test_transformations_and_methods():
    model = _model()
    f = hlofuse.filter_jit(forward)
    g = jax.grad(lambda x: jnp.sum(f(model, x) ** 2))(X)
    g0 = jax.grad(lambda x: jnp.sum(forward(model, x) ** 2))(X)
    assert_same(np.asarray(g), np.asarray(g0), "grad")
    xs = jnp.stack([X, X * 0.5])
    v = jax.vmap(lambda x: f(model, x))(xs)
    assert_same(np.asarray(v[1]), np.asarray(_plain(model, X * 0.5)), "reassociate")

    class Net:
        def __init__(self, model):
            self.model = model

        @hlofuse.filter_jit
        def __call__(self, x):
            return forward(self.model, x)

        def __hash__(self):      # static (not a pytree): compared by identity
            return id(self)
    net = Net(model)
    assert_same(np.asarray(net(X)), np.asarray(_plain(model, X)), "reassociate")


def test_donation_modes():
    model = _model()
    x = X + 0
    f = hlofuse.filter_jit(lambda m, x: (forward(m, x), x * 2), donate="all-except-first")
    with warnings.catch_warnings():
        warnings.simplefilter("error", hlofuse.HlofuseWarning)
        warnings.filterwarnings("error", message="donation of")
        f(model, x)
    assert x.is_deleted() and not model[0].w.is_deleted()
    y = X + 0
    hlofuse.filter_jit(forward)(model, y)
    assert not y.is_deleted()
    with pytest.raises(ValueError, match="donate='some'"):
        hlofuse.filter_jit(forward, donate="some")
    with pytest.raises(TypeError, match="static_argnums"):
        hlofuse.filter_jit(forward, static_argnums=(0,))


def test_unhashable_static_leaf_is_named():
    class Config:
        __hash__ = None

    f = hlofuse.filter_jit(lambda cfg, x: x * 2)
    with pytest.raises(TypeError, match=r"argument 0\['cfg'\] is a Config"):
        f({"cfg": Config()}, X)
    with pytest.raises(TypeError, match=r"argument 'opt' is a Config"):
        hlofuse.filter_jit(lambda x, opt=None: x)(X, opt=Config())


def test_lower_compile_is_called_with_the_functions_own_arguments():
    """``filter_jit(f).lower(*args).compile()`` was the inner function's, callable only with
    the split arguments (a pytree mismatch for ``f``'s; adversarial round)."""
    def apply(params, x):
        return {"y": params["act"](x @ params["w"]) * params["scale"], "tag": "out"}
    params = {"w": jnp.ones((64, 16)), "act": jax.nn.relu, "scale": 0.5}
    x = jnp.ones((32, 64))
    fj = hlofuse.filter_jit(apply, autotune=False, tiered=False)
    lowered = fj.lower(params, x)
    assert "stablehlo" in lowered.as_text() and lowered.report is not None
    out = lowered.compile()(params, x)
    assert out["tag"] == "out"
    assert_same(out["y"], apply(params, x)["y"], "kernel")
