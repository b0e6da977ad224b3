"""hlofuse.jit called from several threads at once: one compilation per signature, right results."""

import numpy as np

import jax
import jax.numpy as jnp

import hlofuse
from hlofuse.runtime.testing import assert_same
from tests.tuning_util import run_threads as _run_threads


def model(x, b):
    return jnp.tanh(x * 1.5 + b) * x - 0.25


def other(x):
    return jnp.exp(-x * x) + x * 0.5


def test_concurrent_first_calls_compile_once_per_signature():
    r = np.random.default_rng(0)
    args = {
        0: (jnp.asarray(r.standard_normal((8, 128), np.float32)), jnp.asarray(r.standard_normal(128, np.float32))),
        1: (jnp.asarray(r.standard_normal((4, 256), np.float32)), jnp.asarray(r.standard_normal(256, np.float32))),
    }
    fn = hlofuse.jit(model)
    g = hlofuse.jit(other)
    xo = jnp.asarray(r.standard_normal((16, 32), np.float32))

    def call(i):
        if i % 4 == 3:
            return ("other", g(xo))
        return (i % 2, fn(*args[i % 2]))

    results = _run_threads(8, call)
    assert fn.compilations == 2  # two signatures, however many threads raced
    assert g.compilations == 1
    for key, out in results:
        want = jax.jit(other)(xo) if key == "other" else jax.jit(model)(*args[key])
        assert_same(out, want)
    assert all(fn.report(*a).kernels for a in args.values())  # the kernel path ran


def test_concurrent_grad_and_check_compile_once():
    x = jnp.asarray(np.random.default_rng(1).standard_normal((8, 64), np.float32))
    b = jnp.zeros((64,), jnp.float32)
    fn = hlofuse.jit(model, check=True)
    loss = lambda x, b: fn(x, b).sum()  # noqa: E731
    grads = _run_threads(4, lambda i: jax.grad(loss)(x, b))
    want = jax.grad(lambda x, b: model(x, b).sum())(x, b)
    for gr in grads:
        assert_same(gr, want, "grad")
    # each program compiled once: the forward with residuals and the backward
    assert fn.compilations == 2
    assert all(p.builds <= 1 for p in fn.all_programs())
    backward = [p for p in fn.all_programs() if p.name.startswith("T(")]
    assert len(backward) == 1 and backward[0].builds == 1
    entry, = backward[0].entries()
    assert entry.report.kernels                             # and was checked, not rolled back
