"""``python -m hlofuse.cli.demo``: a transformer MLP block under ``@hlofuse.jit``, its fusion report,
and its results checked against plain ``jax.jit``.

Also shows the same program lowered for GPU (Triton) and TPU (Mosaic) from this machine.
"""

from __future__ import annotations

import sys
import time

import numpy as np

import jax
import jax.numpy as jnp

import hlofuse
from hlofuse.passes.kernelize import XLA_FUSES
from hlofuse.runtime.testing import ALL_KERNELS, compare


def layernorm(x, g, b, eps=1e-6):
    m = x.mean(-1, keepdims=True)
    v = ((x - m) ** 2).mean(-1, keepdims=True)
    return (x - m) * jax.lax.rsqrt(v + eps) * g + b


def mlp_block(params, x):
    """Pre-LN transformer MLP block: x + W2·gelu(W1·LN(x) + b1) + b2, then a bias-scale-clip."""
    h = layernorm(x, params["g"], params["b"])
    h = jax.nn.gelu(h @ params["w1"] + params["b1"])
    y = x + h @ params["w2"] + params["b2"]
    return jnp.clip(y * 0.5 + 0.1, -3.0, 3.0)


def make_inputs(seed=0, tokens=256, d=256):
    rng = np.random.default_rng(seed)
    f = lambda *s, scale=1.0: jnp.asarray(rng.standard_normal(s).astype(np.float32) * scale)
    params = {"g": 1 + f(d, scale=0.1), "b": f(d, scale=0.1), "w1": f(d, 4 * d, scale=d ** -0.5),
              "b1": f(4 * d, scale=0.1), "w2": f(4 * d, d, scale=(4 * d) ** -0.5), "b2": f(d, scale=0.1)}
    return params, f(tokens, d)


def main() -> int:
    params, x = make_inputs()
    fused = hlofuse.jit(mlp_block)

    t0 = time.perf_counter()
    jax.block_until_ready(fused(params, x))
    t_first = time.perf_counter() - t0
    # the first call is tiered: it ran XLA's code while hlofuse optimized in the background
    fused.block_until_optimized()
    tier = fused.tier_status(params, x)
    out = fused(params, x)     # hlofuse's optimized code from here on
    expected = jax.jit(mlp_block)(params, x)

    print("=== hlofuse.jit(mlp_block) on", jax.default_backend(), "===")
    print(fused.report(params, x))
    problems = compare(out, expected, "kernel")
    err = float(jnp.max(jnp.abs(out - expected)))
    ready = (f"; hlofuse's code, built in the background, ready {tier['seconds']:.2f}s after "
             f"the call started"
             if tier["state"] == "ready" else "")
    print(f"\nresult check vs jax.jit: {'OK' if not problems else 'MISMATCH'} "
          f"(max abs err {err:.3g}; first call {t_first:.2f}s{ready})")
    for p in problems:
        print("  ", p)

    for target, marker in (("gpu", "__gpu$xla.gpu.triton"), ("tpu", "tpu_custom_call")):
        # nothing measured on a gpu/tpu yet: regions XLA fuses itself stay with XLA there
        low = hlofuse.jit(mlp_block, target=target).lower(params, x)
        held = sum(r.reason == XLA_FUSES for r in low.report.regions)
        every = hlofuse.jit(mlp_block, target=target, options=ALL_KERNELS).lower(params, x)
        n = every.as_text().count(marker)
        print(f"lowered for {target}: {len(low.report.kernels)} kernel(s) unmeasured "
              f"({held} region(s) kept with XLA, which fuses them itself, until measured on the "
              f"device); options=hlofuse.runtime.testing.ALL_KERNELS: {len(every.report.kernels)} "
              f"kernel(s), {n} '{marker}' custom call(s)")
    return 0 if not problems else 1


if __name__ == "__main__":
    sys.exit(main())
