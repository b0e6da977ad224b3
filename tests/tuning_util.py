"""What the tuning tests share (test_autotune, test_recheck, test_threads): a small function
whose dot XLA:CPU hands to its library by default, its arguments, and a runner of calls from
several threads at once."""

from __future__ import annotations

import threading

import numpy as np

import jax.numpy as jnp


def small_fn(x, w):
    return jnp.tanh(x @ w + 1.0).sum(axis=0)


def small_args():
    rng = np.random.default_rng(0)
    return (jnp.asarray(rng.standard_normal((32, 64)), jnp.float32),
            jnp.asarray(rng.standard_normal((64, 64)) * 0.1, jnp.float32))


def run_threads(n, target):
    """``target(i)`` in ``n`` threads started together; their results (asserts none raised or
    hung)."""
    barrier = threading.Barrier(n)
    results, errors = [None] * n, []

    def worker(i):
        try:
            barrier.wait(timeout=60)  # all first calls start together
            results[i] = target(i)
        except BaseException as e:  # noqa: BLE001 - reported below
            errors.append(repr(e))

    threads = [threading.Thread(target=worker, args=(i,)) for i in range(n)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=300)
    assert not any(t.is_alive() for t in threads), "a thread hung"
    assert not errors, errors
    return results
