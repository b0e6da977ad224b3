"""``hlofuse.jit`` behaves like ``jax.jit``: signature cache, static args, donation, errors."""

from __future__ import annotations

import threading

import numpy as np
import pytest

import jax
import jax.numpy as jnp

import hlofuse
from hlofuse.runtime.testing import ALL_KERNELS
from hlofuse.runtime.testing import assert_same


def chain(x, y):
    return jnp.tanh(x * 2.0 + y) * 0.5


def test_cache_per_signature():
    hf = hlofuse.jit(chain)
    a = np.ones((4, 8), np.float32)
    hf(a, a)
    hf(a + 1, a)
    assert hf.compilations == 1
    hf(np.ones((2, 8), np.float32), np.ones((2, 8), np.float32))  # new shape -> recompile
    assert hf.compilations == 2
    hf(a.astype(jnp.bfloat16), a.astype(jnp.bfloat16))  # new dtype -> recompile
    assert hf.compilations == 3


def test_weak_types_follow_jax_promotion():
    f = lambda x, s: x * s
    x = jnp.ones((4,), jnp.bfloat16)
    assert hlofuse.jit(f)(x, 2.0).dtype == jax.jit(f)(x, 2.0).dtype == jnp.bfloat16


def test_static_argnums_and_argnames():
    def f(x, n, *, mode="tanh"):
        for _ in range(n):
            x = jnp.tanh(x) * 1.5 if mode == "tanh" else jnp.sin(x) * 1.5
        return x
    x = np.linspace(-1, 1, 32, dtype=np.float32)
    hf = hlofuse.jit(f, static_argnums=1, static_argnames="mode")
    for n, mode in [(2, "tanh"), (3, "tanh"), (2, "sin")]:
        assert_same(hf(x, n, mode=mode), jax.jit(f, static_argnums=1, static_argnames="mode")(x, n, mode=mode))
    assert hf.compilations == 3
    hf(x, 2, mode="tanh")
    assert hf.compilations == 3


def test_static_argnames_or_argnums_alone_cover_both_ways_of_passing():
    """As jax.jit: an argument named static is static passed by position too, and one numbered
    static is static passed by keyword (hlofuse.jit used to pass jax.jit both lists, and jax
    infers neither then: a string passed by position was traced and refused)."""
    def f(x, cfg, scale=2.0):
        return x * scale if cfg == "mul" else x + scale
    x = np.linspace(-1, 1, 8, dtype=np.float32)
    by_name = hlofuse.jit(f, static_argnames="cfg", autotune=False)
    assert_same(by_name(x, "mul"), jax.jit(f, static_argnames="cfg")(x, "mul"))
    assert_same(by_name(x, cfg="add"), jax.jit(f, static_argnames="cfg")(x, cfg="add"))
    by_num = hlofuse.jit(f, static_argnums=1, autotune=False)
    assert_same(by_num(x, cfg="add"), jax.jit(f, static_argnums=1)(x, cfg="add"))
    assert_same(by_num(x, "mul", 3.0), jax.jit(f, static_argnums=1)(x, "mul", 3.0))


def test_unhashable_static_arg_error():
    hf = hlofuse.jit(lambda x, cfg: x * 2, static_argnums=1)
    with pytest.raises(ValueError, match="Non-hashable static arguments"):
        hf(np.ones(3, np.float32), [1, 2])


def test_non_array_argument_error_names_the_path():
    hf = hlofuse.jit(lambda d: d["x"] * 2)
    with pytest.raises(TypeError, match=r"path d\['name'\]"):
        hf({"x": np.ones(3, np.float32), "name": "hello"})


def test_shape_error_is_jaxs_own():
    hf = hlofuse.jit(lambda a, b: a @ b)
    with pytest.raises(TypeError, match="dot_general requires contracting dimensions to have the same shape"):
        hf(np.ones((2, 3), np.float32), np.ones((4, 5), np.float32))


def test_pytree_structure_change_recompiles():
    hf = hlofuse.jit(lambda t: jax.tree_util.tree_map(lambda v: jnp.tanh(v) * 2 + 1, t))
    a = np.ones((4,), np.float32)
    assert_same(hf({"a": a}), {"a": np.tanh(a) * 2 + 1})
    assert_same(hf((a, a)), (np.tanh(a) * 2 + 1,) * 2)
    assert hf.compilations == 2


def test_donation_is_honored_and_aliases_bytes():
    f = lambda x, y: jnp.tanh(x) * 2.0 + y
    x = jnp.ones((256, 256), jnp.float32)
    y = jnp.ones((256, 256), jnp.float32)
    hf = hlofuse.jit(f, donate_argnums=0)
    out = hf(x, y)
    assert x.is_deleted() and not y.is_deleted()
    assert_same(out, f(jnp.ones((256, 256)), y))
    ours = hf.lower(y, y).compile().memory_analysis().alias_size_in_bytes
    theirs = jax.jit(f, donate_argnums=0).lower(y, y).compile().memory_analysis().alias_size_in_bytes
    assert ours == theirs == 256 * 256 * 4  # the whole output aliases the donated input


def test_static_args_cannot_be_donated():
    with pytest.raises(ValueError, match="cannot be donated"):
        hlofuse.jit(lambda x, n: x, static_argnums=1, donate_argnums=1)


def test_gpu_target_lowers_here_but_refuses_to_run_on_cpu():
    hf = hlofuse.jit(chain, target="gpu", options=ALL_KERNELS)
    a = np.ones((8, 128), np.float32)
    text = hf.lower(a, a).as_text()
    assert "__gpu$xla.gpu.triton" in text
    with pytest.raises(RuntimeError, match="optimized for target='gpu'.*as_text"):
        hf(a, a)


def test_bad_target():
    with pytest.raises(ValueError, match="target must be one of"):
        hlofuse.jit(chain, target="npu")


def test_lower_returns_text_report_and_compiles():
    a = np.ones((8, 16), np.float32)
    low = hlofuse.jit(chain).lower(a, a)
    assert "call @hlofuse_k0_main" in low.as_text()
    assert "loc(" in low.as_text(debug_info=True)
    assert low.report.kernels
    compiled = low.compile()
    assert_same(compiled(a, a), chain(a, a), "kernel")


CALLBACK_NOTE = "call(s) back into Python"


def test_host_callbacks_stay_and_the_code_around_them_is_optimized(capfd):
    def f(x):
        jax.debug.print("first={}", x[0])
        return jax.nn.softmax(jnp.tanh(x) * 2 + 1, axis=-1)
    hf = hlofuse.jit(f, autotune=False, tiered=False)
    x = np.random.default_rng(0).standard_normal((8, 16)).astype(np.float32)
    assert_same(hf(x), jax.jit(f)(x), "reassociate")
    out = capfd.readouterr().out
    assert out.count("first=") == 2 and f"first={x[0]}" in out
    rep = hf.report(x)
    assert rep.kernels and any(CALLBACK_NOTE in n and "debug_print" in n for n in rep.notes)
    assert hf.lower(x).exported is None   # the placeholders can only be filled in this process


def test_ordered_effects_run_with_plain_jit_and_say_so(capfd):
    def f(x):
        jax.debug.print("first={}", x[0], ordered=True)
        return jnp.tanh(x) * 2 + 1
    hf = hlofuse.jit(f)
    x = np.ones(4, np.float32)
    assert_same(hf(x), f(x))
    assert "first=1" in capfd.readouterr().out
    assert any("ordered side effects" in n for n in hf.report(x).notes)


def test_host_callbacks_for_another_platform_get_a_plain_error():
    # jax lowers host callbacks only for the machine's own platform; the error says why
    def f(x):
        jax.debug.print("s={}", x.sum())
        return x * 2
    other = "tpu" if jax.default_backend() != "tpu" else "gpu"
    with pytest.raises(ValueError, match=r"^f: cannot lower for .* calls back into Python"):
        hlofuse.jit(f, target=other).lower(np.ones(4, np.float32))


def _calls_like_jax_jit(f, x, tiered: bool):
    """``hlofuse.jit(f)``, checked against ``jax.jit(f)`` on three calls (and, tiered, once
    more when its own program is ready)."""
    hf = hlofuse.jit(f, autotune=False, tiered=tiered)
    want = jax.jit(f)(x)
    for _ in range(3):
        assert_same(hf(x), want, "reassociate")
    if tiered:
        hf.block_until_optimized()
        assert_same(hf(x), want, "reassociate")
    return hf


@pytest.mark.parametrize("where", ["top", "scan", "while"])
@pytest.mark.parametrize("tiered", [False, True])
def test_pure_callbacks_stay_under_every_call_path(where, tiered):
    # pure_callback has no side effect, yet jax.export cannot serialize it: it is outlined as a
    # placeholder and put back where the module is inlined, anywhere it calls back, and the
    # softmax around it gets its kernel
    calls = []

    def host(a):
        calls.append(1)
        return np.asarray(a) * 2

    def cb(x):
        return jax.pure_callback(host, jax.ShapeDtypeStruct(x.shape, x.dtype), x,
                                 vmap_method="sequential")

    def f(x):
        if where == "top":
            y = cb(x)
        elif where == "scan":
            y = jax.lax.scan(lambda c, r: (c, cb(r)), 0.0, x)[1]
        else:
            y = jax.lax.while_loop(lambda c: c[0] < 2, lambda c: (c[0] + 1, cb(c[1])), (0, x))[1]
        return jax.nn.softmax(y, axis=-1)
    x = np.random.default_rng(0).standard_normal((8, 16)).astype(np.float32)
    hf = _calls_like_jax_jit(f, x, tiered)
    assert calls
    rep = hf.report(x)
    assert rep.kernels and any(CALLBACK_NOTE in n for n in rep.notes)
    xs = np.stack([x, -x])
    assert_same(jax.vmap(hf)(xs), jax.vmap(jax.jit(f))(xs), "reassociate")


def test_callbacks_under_grad_and_in_nested_functions():
    # debug.callback in the forward and (through custom_vjp) in the backward program, and an
    # hlofuse function with its own callback inside another: each placeholder is filled with
    # its own callback, whichever module it ends up in
    seen = []

    @jax.custom_vjp
    def scale(x):
        return x * 2.0

    def scale_fwd(x):
        return scale(x), None

    def scale_bwd(_, g):
        jax.debug.callback(lambda v: seen.append(("bwd", float(v))), g.sum())
        return (g * 2.0,)
    scale.defvjp(scale_fwd, scale_bwd)

    @hlofuse.jit
    def inner(x):
        jax.debug.callback(lambda v: seen.append(("inner", float(v))), x.sum())
        return jnp.tanh(x)

    def loss(x):
        jax.debug.callback(lambda v: seen.append(("fwd", float(v))), x.max())
        return jnp.sum(jax.nn.softmax(inner(scale(x)), axis=-1) ** 2)
    x = np.random.default_rng(1).standard_normal((4, 8)).astype(np.float32)
    want = jax.jit(jax.value_and_grad(loss))(x)
    want_seen, seen[:] = sorted(seen), []
    got = hlofuse.jit(jax.value_and_grad(loss), autotune=False, tiered=False)(x)
    assert_same(got, want, "reassociate")
    got_seen = sorted(seen)
    assert [k for k, _ in got_seen] == [k for k, _ in want_seen]
    np.testing.assert_allclose([v for _, v in got_seen], [v for _, v in want_seen], rtol=1e-5)
    assert {k for k, _ in seen} == {"fwd", "inner", "bwd"}
    seen[:] = []
    assert_same(jax.grad(hlofuse.jit(loss, autotune=False, tiered=False))(x), want[1],
                "reassociate")
    assert {k for k, _ in seen} == {"fwd", "inner", "bwd"}


@pytest.mark.parametrize("outer", ["jax.jit", "hlofuse.jit", "eager", "checkpoint", "scan"])
def test_a_call_whose_outputs_are_unused_still_calls_back(outer):
    # the primitive declares its callbacks' effects: jax's dead-code elimination keeps a call
    # whose outputs nothing uses, as it keeps jax.jit's (it dropped the callbacks before)
    from jax.experimental import io_callback
    seen = []

    def g(x):
        jax.debug.callback(lambda v: seen.append(("debug", float(v))), x.sum())
        io_callback(lambda v: seen.append(("io", float(v))), None, x.max())
        return jnp.tanh(x) * 2

    def user(inner):
        def f(x):
            inner(x)                      # outputs unused
            return x + 1
        if outer == "checkpoint":
            return jax.checkpoint(f)
        if outer == "scan":
            return lambda x: jax.lax.scan(lambda c, r: (f(r), None), x, x[None])[0]
        return f
    wrap = {"jax.jit": jax.jit, "eager": lambda f: f, "checkpoint": jax.jit, "scan": jax.jit,
            "hlofuse.jit": lambda f: hlofuse.jit(f, autotune=False, tiered=False)}[outer]
    x = np.arange(4, dtype=np.float32)
    want = wrap(user(jax.jit(g)))(x)
    jax.effects_barrier()
    want_seen, seen[:] = sorted(seen), []
    got = wrap(user(hlofuse.jit(g, autotune=False, tiered=False)))(x)
    jax.effects_barrier()
    assert_same(got, want)
    assert want_seen == [("debug", 6.0), ("io", 3.0)]
    assert sorted(seen) == want_seen


def _lowering_rule_callback_primitive(direct: bool):
    """A primitive that calls back into Python only in its lowering rule, as Equinox's runtime
    checks do inside lineax's ``linear_solve``: its jaxpr shows no callback. ``direct``: the
    rule emits the callback itself (jax's ``emit_python_callback``), which no placeholder
    catches; else it lowers a ``pure_callback``."""
    from hlofuse.core import compat
    from jax.extend.core import Primitive
    from jax.interpreters import batching, mlir

    calls = []

    def host(a):
        calls.append(1)
        return np.asarray(a) * 2

    p = Primitive(f"hlofuse_test_lowering_callback_{direct}")
    p.def_abstract_eval(lambda x: x)
    p.def_impl(lambda x: x * 2)
    if direct:
        def rule(ctx, x):
            out, _, _ = compat.host_callback_primitives().emit_python_callback(
                ctx, lambda a: (host(a),), None, [x], ctx.avals_in, ctx.avals_out,
                has_side_effect=False, returns_token=False)
            return out
    else:
        rule = mlir.lower_fun(
            lambda x: jax.pure_callback(host, jax.ShapeDtypeStruct(x.shape, x.dtype), x,
                                        vmap_method="sequential"), multiple_results=False)
    mlir.register_lowering(p, rule)
    batching.primitive_batchers[p] = lambda args, dims: (p.bind(*args), dims[0])
    return p, calls


@pytest.mark.parametrize("direct", [False, True])
@pytest.mark.parametrize("tiered", [False, True])
def test_a_callback_in_a_lowering_rule(direct, tiered):
    # a pure_callback lowered by a primitive's rule is outlined like any other; one the rule
    # emits itself makes jax.export refuse the module, and the function runs as traced
    p, calls = _lowering_rule_callback_primitive(direct)

    def f(x):
        return jax.nn.softmax(p.bind(x), axis=-1)
    x = np.random.default_rng(0).standard_normal((8, 16)).astype(np.float32)
    hf = _calls_like_jax_jit(f, x, tiered)
    assert calls, "the callback never ran"
    notes = hf.report(x).notes
    if direct:
        assert any("runs it as traced" in n for n in notes)
    else:
        assert hf.report(x).kernels and any(CALLBACK_NOTE in n for n in notes)
    xs = np.stack([x, -x])
    assert_same(jax.vmap(hf)(xs), jax.vmap(jax.jit(f))(xs), "reassociate")


def test_custom_call_program_runs_and_report_says_why():
    f = lambda x: jnp.linalg.inv(x @ x.T + 4 * jnp.eye(4)) * 2.0 + 1.0
    x = np.random.default_rng(0).standard_normal((4, 4)).astype(np.float32)
    hf = hlofuse.jit(f)
    assert_same(hf(x), jax.jit(f)(x), "reassociate")
    notes = " ".join(hf.report(x).notes)
    assert "custom_call @lapack" in notes and "opaque" in notes


def test_custom_calls_without_a_compatibility_guarantee_run():
    # jax.export refuses LAPACK's ormqr (no compatibility guarantee) unless told; jax.jit runs
    # it, and so must hlofuse: its module is inlined in this process, never shipped
    def f(a, taus, c):
        return jnp.tanh(jax.lax.linalg.ormqr(a, taus, c, left=True, transpose=True)) * 2.0
    r = np.random.default_rng(0)
    a, taus, c = (r.standard_normal(s).astype(np.float32) for s in ((8, 3), (3,), (8, 2)))
    hf = hlofuse.jit(f, autotune=False, tiered=False)
    assert_same(hf(a, taus, c), jax.jit(f)(a, taus, c), "reassociate")
    assert "lapack_sormqr" in hf.lower(a, taus, c).as_text()


def test_concurrent_first_calls_compile_once():
    hf = hlofuse.jit(chain)
    a = np.full((16, 16), 0.5, np.float32)
    results, errors = [], []

    def worker():
        try:
            results.append(np.asarray(hf(a, a)))
        except Exception as e:  # pragma: no cover - reported below
            errors.append(e)

    threads = [threading.Thread(target=worker) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors and len(results) == 4
    assert hf.compilations == 1
    for r in results:
        assert_same(r, chain(a, a), "kernel")


def test_method_decoration():
    class M:
        scale = 3.0

        @hlofuse.jit
        def __call__(self, x):
            return jnp.tanh(x) * 2.0
    x = np.ones(4, np.float32)
    # self is not an array: as with jax.jit, methods need self static or a partial
    with pytest.raises(TypeError, match="abstract array"):
        M()(x)


def test_report_aliases_are_the_compiled_executables():
    """Issue 11 item 10: the outer jax.jit's donation decides the aliases, not the payload's
    tf.aliasing_output; the report reads them back from XLA."""
    from hlofuse.frontend.jit import compiled_aliases
    fn = lambda x, y: (y @ y, x.at[0].set(0.))  # noqa: E731
    x, y = jnp.ones((4, 4)), jnp.ones((4, 4))
    f = hlofuse.jit(fn, donate_argnums=0)
    rep = f.report(x, y)
    want = compiled_aliases(jax.jit(fn, donate_argnums=0).lower(x, y).compile())
    assert want == {0: 0}
    assert {r["output"]: r["argument"] for r in rep.aliases} == want
    assert rep.memory["aliases_from"] == "compiled executable"
    assert not any("output 1 aliases" in n for n in rep.alias_notes() + rep.notes)
    assert "output 0 aliases argument 0" in str(rep)
    assert f.lower(x, y).compile().aliases() == want


def test_report_without_arguments_is_the_last_signature_called():
    """``f.report()`` after a call reports that call's signature (static arguments included);
    before any call it says what it needs, naming the function."""
    def f(x, n, *, scale):
        return jnp.tanh(x * scale) + n
    g = hlofuse.jit(f, static_argnums=1, autotune=False)
    with pytest.raises(TypeError, match=r"f\.report\(\) needs the arguments of a call.*"
                                        r"has not been called yet"):
        g.report()
    x = jnp.ones((8, 128), jnp.float32)
    g(x, 2, scale=0.5)
    rep, again = g.report(), g.report(x, 2, scale=0.5)
    assert str(rep) == str(again) and any(r.kernel for r in rep.regions)
    y = jnp.ones((4, 64), jnp.bfloat16)
    g(y, 3, scale=1.0)
    assert str(g.report()) == str(g.report(y, 3, scale=1.0)) != str(rep)
    # a function that takes no arguments still reports its own (empty) signature
    h = hlofuse.jit(lambda: jnp.tanh(jnp.arange(8.0)), autotune=False)
    assert str(h.report()) == str(h.report())


def test_disable_jit_runs_the_function_op_by_op():
    """Under ``jax.disable_jit()`` jax.jit runs the Python function on concrete arrays (users
    debug with print and breakpoints there); hlofuse.jit does the same, with no trace."""
    seen = []

    def f(x, n):
        seen.append(type(x))
        return jnp.tanh(x) * n

    x = jnp.arange(4.0)
    hf = hlofuse.jit(f, static_argnums=1)
    with jax.disable_jit():
        out = hf(x, 2)
        assert seen == [type(x)]  # concrete, called once
        want = jax.jit(f, static_argnums=1)(x, 2)
    np.testing.assert_array_equal(np.asarray(out), np.asarray(want))
    seen.clear()
    hf(x, 2)  # outside, it traces as usual
    assert seen and all(t is not type(x) for t in seen)


def test_updates_assigned_inside_arguments_are_reported():
    """A function that assigns into its arguments (what an NNX module's BatchNorm or an
    optimizer step does to the module) loses those updates under jax.jit semantics: hlofuse.jit
    says so once, naming the first leaf; a function that only reads them is quiet."""
    import warnings

    def bump(state, x):
        state["count"] = state["count"] + 1
        return x * 2

    f = hlofuse.jit(bump)
    state = {"count": jnp.zeros(()), "scale": jnp.ones(())}
    with pytest.warns(hlofuse.HlofuseWarning, match=r"1 leaves of its arguments \(first: "
                      r"argument 0\['count'\]\).*old values"):
        f(state, jnp.ones(3))
    assert float(state["count"]) == 0.0
    with warnings.catch_warnings():
        warnings.simplefilter("error", hlofuse.HlofuseWarning)
        f(state, jnp.ones(3))                                   # warned once per program
        hlofuse.jit(lambda s, x: x * s["scale"])(state, jnp.ones(3))

    def grow(items, x):
        items.append(x)
        return x + 1
    with pytest.warns(hlofuse.HlofuseWarning, match="changed the structure of its arguments"):
        hlofuse.jit(grow)([jnp.ones(2)], jnp.ones(2))


def test_donation_with_an_unused_argument_jax_drops():
    """jax drops an unused argument from the module (keep_unused=False): donation is by the
    module's own positions, so buffer-aliasing neither warns nor reports a mismatch, and the
    compiled executable aliases the donated argument as jax.jit's does."""
    import warnings
    fn = lambda a, b: jnp.tanh(b) * 2  # noqa: E731
    f = hlofuse.jit(fn, donate_argnums=1, tiered=False)
    a, b = jnp.ones(4), jnp.ones(4)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        rep = f.report(a, b)
    assert [(r["output"], r["argument"]) for r in rep.aliases] == [(0, 1)]
    assert not any("buffer-aliasing" in n for n in rep.notes), rep.notes
    assert_same(f(a, jnp.ones(4)), jax.jit(fn)(a, jnp.ones(4)), "exact")


def test_the_exported_program_is_called_like_the_function():
    """``lower(...).exported`` takes and returns the function's pytrees, as
    ``jax.export.export(jax.jit(f))`` does (it had the program's flat inputs and outputs:
    ``call(p, x)`` of a dict of parameters failed, outputs came back as a flat tuple), and
    survives serialization; its module is hlofuse's (a kernel)."""
    def f(p, x, *, scale=1.0):
        h = jnp.tanh(x @ p["w"] + p["b"]) * scale
        return {"h": h, "norm": (jax.nn.softmax(h, -1),)}
    rng = np.random.default_rng(0)
    p = {"w": jnp.asarray(rng.standard_normal((16, 32)), jnp.float32),
         "b": jnp.asarray(rng.standard_normal(32), jnp.float32)}
    x = jnp.asarray(rng.standard_normal((8, 16)), jnp.float32)
    low = hlofuse.jit(f, static_argnames=("scale",), autotune=False).lower(p, x, scale=2.0)
    exp = low.exported
    want = jax.jit(f, static_argnames=("scale",))(p, x, scale=2.0)
    ref = jax.export.export(jax.jit(f, static_argnames=("scale",)))(p, x, scale=2.0)
    assert (exp.in_tree, exp.out_tree) == (ref.in_tree, ref.out_tree)
    assert_same(exp.call(p, x), want, "reassociate")
    back = jax.export.deserialize(exp.serialize())
    assert_same(back.call(p, x), want, "reassociate")
    assert "hlofuse" in exp.mlir_module() and low.report.kernels


@pytest.mark.parametrize("tiered", [True, False])
def test_a_signature_follows_jaxs_configuration_as_jax_jit_does(tiered):
    """Changing ``jax_enable_x64`` or ``jax_threefry_partitionable`` after a signature ran
    must give what jax.jit gives under the new configuration: hlofuse kept the executable
    (and the trace) of the configuration the signature first ran under (float32 where jax
    gives float64, or a crash; the previous random numbers)."""
    def wide(x):
        return x + jnp.arange(x.shape[0], dtype=float) * 1.0000000001

    def noisy(x):
        return x * jax.random.normal(jax.random.key(0), x.shape)
    x = np.ones((4,), np.float32)
    f = hlofuse.jit(wide, tiered=tiered)
    for _ in range(2):
        assert f(x).dtype == np.float32
    f.block_until_optimized()
    with jax.enable_x64(True):
        got, want = f(x), jax.jit(wide)(x)
        assert got.dtype == want.dtype == np.float64
        assert_same(got, want, "exact")
    assert f(x).dtype == np.float32                 # and back
    g = hlofuse.jit(noisy, tiered=tiered)
    g(x), g.block_until_optimized(), g(x)
    flag = jax.config.jax_threefry_partitionable
    try:
        jax.config.update("jax_threefry_partitionable", not flag)
        assert_same(g(x), jax.jit(noisy)(x), "exact")
    finally:
        jax.config.update("jax_threefry_partitionable", flag)
    assert_same(g(x), jax.jit(noisy)(x), "exact")


def test_lowered_and_compiled_offer_the_rest_of_jaxs_stages_api():
    """``in_tree``, ``args_info``, ``out_info``, ``as_text(dialect='hlo')``, ``compiler_ir()``,
    ``cost_analysis()``; ``input_shardings``, ``output_shardings``, ``in_tree``, ``args_info``,
    ``input_formats``, ``runtime_executable()``: AttributeError or TypeError where jax's objects
    have them (adversarial round)."""
    def f(x, n, y=1.0):
        return jnp.tanh(x) * n + y
    x = jnp.ones((4, 8))
    lj = jax.jit(f, static_argnums=1).lower(x, 3)
    lh = hlofuse.jit(f, static_argnums=1, autotune=False, tiered=False).lower(x, 3)
    assert lh.in_tree == lj.in_tree and str(lh.args_info) == str(lj.args_info)
    assert lh.out_info == lj.out_info
    assert "HloModule" in lh.as_text(dialect="hlo") and "stablehlo" in lh.as_text()
    assert lh.compiler_ir() is not None and lh.cost_analysis() is not None
    cj, ch = lj.compile(), lh.compile()
    assert ch.input_shardings == cj.input_shardings and ch.output_shardings == cj.output_shardings
    assert ch.in_tree == cj.in_tree and str(ch.args_info) == str(cj.args_info)
    assert ch.input_formats == cj.input_formats and ch.runtime_executable() is not None
    np.testing.assert_allclose(np.asarray(ch(x)), np.asarray(cj(x)), rtol=1e-6)
    with pytest.raises(AttributeError):
        ch.no_such_attribute


def test_compiled_refuses_other_static_or_frozen_values_than_it_was_lowered_for():
    """``Compiled(x, w, 100.0)`` ran the program lowered for ``scale=0.5`` (its result: 0.42
    for 84.1), a frozen argument's new values were ignored, and a variadic call lost its first
    array as 'the static argument' (adversarial round). jax's Compiled refuses such calls."""
    x, w = jnp.ones((4, 8)), jnp.ones((8, 8))

    def f(x, w, scale):
        return jnp.tanh(x @ w) * scale
    c = hlofuse.jit(f, static_argnums=2, autotune=False, tiered=False).lower(x, w, 0.5).compile()
    np.testing.assert_allclose(np.asarray(c(x, w, 0.5)), np.asarray(f(x, w, 0.5)), rtol=1e-6)
    np.testing.assert_allclose(np.asarray(c(x, w)), np.asarray(f(x, w, 0.5)), rtol=1e-6)
    with pytest.raises(TypeError, match="compiled for static argument 2 = 0.5"):
        c(x, w, 100.0)
    g = hlofuse.jit(lambda w, x: jnp.tanh(x @ w), freeze_argnums=0, autotune=False, tiered=False)
    cg = g.lower(w, x).compile()
    np.testing.assert_allclose(np.asarray(cg(w, x)), np.asarray(jnp.tanh(x @ w)), rtol=1e-6)
    with pytest.raises(TypeError, match="frozen argument 0"):
        cg(w * 3, x)
    v = hlofuse.jit(lambda n, *xs: sum(xs) * n, static_argnums=0, autotune=False, tiered=False)
    a = jnp.ones(3)
    cv = v.lower(2.0, a, a).compile()
    with pytest.raises(TypeError, match="static argument 0"):
        cv(a, a, a)
    k = hlofuse.jit(f, static_argnames="scale", autotune=False, tiered=False)
    ck = k.lower(x, w, scale=0.5).compile()
    np.testing.assert_allclose(np.asarray(ck(x, w, scale=0.5)), np.asarray(f(x, w, 0.5)), rtol=1e-6)
    with pytest.raises(TypeError, match="static argument 'scale'"):
        ck(x, w, scale=2.0)
    # lowered by position, passed by name (it ran before): the same value runs, another is refused
    np.testing.assert_allclose(np.asarray(c(x, w, scale=0.5)), np.asarray(f(x, w, 0.5)), rtol=1e-6)
    with pytest.raises(TypeError, match="static argument 'scale' = 0.5"):
        c(x, w, scale=3.0)
    # only the static and frozen values are kept: not the lowering call's arrays (review)
    import gc
    import weakref
    big = jnp.ones((256, 8))
    ref = weakref.ref(big)
    kept = hlofuse.jit(f, static_argnums=2, autotune=False, tiered=False).lower(big, w, 1.0).compile()
    del big
    gc.collect()
    assert ref() is None and kept is not None


def test_multi_platform_and_gpu_exports_are_jax_jits():
    """``jax.export`` of an hlofuse function for several platforms raised 'hlofuse lowers for
    one platform at a time', and for 'cuda' the Triton call it embedded had no compatibility
    guarantee ('Cannot serialize code with custom calls'; adversarial round). Both export the
    function as jax.jit would; a cpu export keeps hlofuse's program."""
    from jax import export as jexport
    q = jnp.asarray(np.random.default_rng(0).standard_normal((1, 128, 4, 32)), jnp.float32)

    def attn(q):
        return jax.nn.dot_product_attention(q, q, q)
    for target in (None, "gpu"):
        h = hlofuse.jit(attn, target=target, autotune=False, tiered=False)
        multi = jexport.export(h, platforms=["cpu", "cuda", "tpu"])(q)
        np.testing.assert_allclose(np.asarray(multi.call(q)), np.asarray(jax.jit(attn)(q)),
                                   rtol=2e-5, atol=2e-5)
        gpu = jexport.export(h, platforms=["cuda"])(q)
        assert "triton" not in gpu.mlir_module() and gpu.serialize()
    cpu = jexport.export(hlofuse.jit(attn, autotune=False, tiered=False), platforms=["cpu"])(q)
    assert "hlofuse_attention" in cpu.mlir_module()
    np.testing.assert_allclose(np.asarray(cpu.call(q)), np.asarray(jax.jit(attn)(q)),
                               rtol=2e-5, atol=2e-5)


def test_api_misuse_gets_a_clear_error_where_it_happens():
    """Found by an adversarial round: autotune='bogus' accepted until the first call; a
    disable= string split into letters; freeze_argnums='w' a '<=' TypeError; optimize(None),
    optimize(3) and optimize(<Exported>) unrelated messages; a private main optimized into an
    empty module; verify_module's category/trials unchecked; an unknown option's fallback
    warning ending in 'known options:'."""
    import copy
    from jax import export as jexport
    from hlofuse.core.pipeline import OptionError, PassManager
    from hlofuse.runtime.verify import verify_module
    f = lambda x: jnp.tanh(x) * 2.0   # noqa: E731
    x = jnp.ones((8, 8))
    with pytest.raises(ValueError, match="autotune='bogus'"):
        hlofuse.jit(f, autotune="bogus")
    assert "kernelize" in PassManager("default", disable="kernelize").disabled
    np.testing.assert_allclose(np.asarray(hlofuse.jit(f, disable="kernelize")(x)), np.asarray(f(x)))
    with pytest.raises(TypeError, match="freeze_argnums='w'"):
        hlofuse.jit(f, freeze_argnums="w")
    for bad in (None, 3):
        with pytest.raises(TypeError, match="hlofuse.optimize takes StableHLO text"):
            hlofuse.optimize(bad)
    exp = jexport.export(jax.jit(f))(x)
    with pytest.raises(TypeError, match="serialize"):
        hlofuse.optimize(exp)
    text = exp.mlir_module().replace("func.func public @main", "func.func private @main")
    with pytest.raises(hlofuse.IRError, match="main is private"):
        hlofuse.optimize(text, pipeline="cleanup")
    opt = hlofuse.optimize(exp.mlir_module())
    with pytest.raises(ValueError, match="category='bogus'"):
        verify_module(opt, category="bogus")
    with pytest.raises(ValueError, match="trials"):
        verify_module(opt, trials=("bogus",))
    with pytest.raises(OptionError) as e:
        hlofuse.optimize(exp.mlir_module(), options={"no_kernel": True})
    assert "did you mean 'no_kernels'" in str(e.value).splitlines()[0]
    h = hlofuse.jit(f, autotune=False, tiered=False)
    h(x)
    held = copy.deepcopy({"fn": h})
    np.testing.assert_allclose(np.asarray(held["fn"](x)), np.asarray(f(x)))


def test_a_compiled_hlofuse_function_serializes_as_jaxs_does():
    from jax.experimental import serialize_executable as se
    f = lambda x: jax.nn.softmax(x * 2.0, -1)   # noqa: E731
    x = jnp.ones((8, 64))
    c = hlofuse.jit(f, autotune=False, tiered=False).lower(x).compile()
    payload, in_tree, out_tree = se.serialize(c)
    loaded = se.deserialize_and_load(payload, in_tree, out_tree)
    np.testing.assert_allclose(np.asarray(loaded(x)), np.asarray(f(x)), rtol=1e-6)


@pytest.mark.parametrize("mode", ["nans", "infs"])
def test_debug_nans_and_infs_name_the_op_as_under_jax_jit(mode):
    """Under ``jax.debug_nans()`` / ``debug_infs()`` jax runs a jit function's Python again, as
    if the decorator were removed, to name the op that made the value. hlofuse's inner function
    traced the program again there and returned without raising, so the error said "the
    de-optimized function did not produce invalid values" (with kernels, or XLA's module); it
    now runs the user's function, and names the op jax.jit names (adversarial round)."""
    def f(x, scale):
        y = jnp.log(x) if mode == "nans" else 1.0 / x
        return jax.nn.softmax(y * scale, axis=-1), y
    x = np.random.default_rng(0).standard_normal((64, 256)).astype(np.float32)
    x[0, 0] = -1.0 if mode == "nans" else 0.0
    ctx = jax.debug_nans if mode == "nans" else jax.debug_infs

    def message(g):
        with pytest.raises(FloatingPointError) as e, ctx(True):
            jax.block_until_ready(g(x, 2.0))
        return str(e.value).split("\n")[0]
    want = message(jax.jit(f))
    assert want.startswith("invalid value") and "encountered in " in want
    if mode == "nans":
        assert want.endswith("encountered in log")
    for kw in ({"tiered": False}, {"tiered": False, "freeze_argnums": (1,)}, {}):
        g = hlofuse.jit(f, **kw)
        if kw.get("tiered") is False:
            assert g.report(x, 2.0).kernels             # a kernel runs the softmax
        assert message(g) == want
        assert np.asarray(g(x, 2.0)[0]).shape == (64, 256)   # off again: no error
