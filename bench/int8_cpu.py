"""Which int8 matmul should a CPU kernel run? (the measurement behind the CPU decision)

    python -m bench.int8_cpu [--shapes 256x1024x4096,256x4096x1024] [--rounds 7]

On CPU a quantized matmul-epilogue kernel is one grid step in interpret mode, so XLA:CPU
compiles the dot inside it. Two exact ways to compute an int8 x int8 -> int32 product:

* ``xla_int8``: ``dot_general(int8, int8) -> int32``, XLA:CPU's own integer dot (what the
  program says);
* ``f32_chunks``: the int8 values converted to f32 and multiplied by XLA's float GEMM in K
  chunks of 1024 (every partial sum stays below 2^24, so each chunk's f32 result is exact), the
  chunks summed in int32 -- bit-identical, checked here;
* ``bf16_chunks``: the same with bf16 operands (int8 values are exact in bf16) and f32
  accumulation;
* ``bf16_chunks_const_w``: ``bf16_chunks`` with the weights a constant (frozen parameters):
  XLA folds their int8 -> bf16 conversion at compile time, so no call pays for it.

Prints the median per-round time ratio ``alternative / xla_int8`` (interleaved rounds,
:func:`bench.runner.interleaved`): above 1 means XLA's int8 dot is faster. hlofuse's cpu
kernels use ``bf16_chunks`` (:data:`hlofuse.kernels.matmul_epilogue.CPU_INT8_DOT`), and
autotune measures each int8 matmul region against XLA's own int8 dot in the whole program
(region variants) and keeps XLA's where that is faster.
"""

from __future__ import annotations

import argparse
import sys

import numpy as np

CHUNK = 1024   # K * 128 * 128 <= 2^24: an f32 sum of int8 x int8 products is exact


def _chunks(a, b, dtype):
    import jax.numpy as jnp
    out = None
    for s in range(0, a.shape[1], CHUNK):
        part = jnp.dot(a[:, s:s + CHUNK].astype(dtype), b[s:s + CHUNK].astype(dtype),
                       preferred_element_type=jnp.float32).astype(jnp.int32)
        out = part if out is None else out + part
    return out


def f32_chunks(a, b):
    import jax.numpy as jnp
    return _chunks(a, b, jnp.float32)


def bf16_chunks(a, b):
    import jax.numpy as jnp
    return _chunks(a, b, jnp.bfloat16)


def xla_int8(a, b):
    from jax import lax
    import jax.numpy as jnp
    return lax.dot_general(a, b, (((1,), (0,)), ((), ())), preferred_element_type=jnp.int32)


def main(argv=None) -> int:
    import jax
    from bench.runner import Config, interleaved
    ap = argparse.ArgumentParser(prog="python -m bench.int8_cpu", description=__doc__.split("\n\n")[0])
    ap.add_argument("--shapes", default="256x1024x4096,256x4096x1024", help="MxKxN,...")
    ap.add_argument("--rounds", type=int, default=7)
    a = ap.parse_args(argv)
    cfg = Config.quick()
    cfg.rounds = a.rounds
    rng = np.random.default_rng(0)
    print("alternative / xla_int8 time, median of per-round ratios (>1: XLA's int8 dot is faster)")
    for shape in a.shapes.split(","):
        m, k, n = (int(x) for x in shape.split("x"))
        x = rng.integers(-128, 128, (m, k)).astype(np.int8)
        w = rng.integers(-128, 128, (k, n)).astype(np.int8)
        fa = jax.jit(xla_int8)
        const_w = lambda a, _b, w=w: bf16_chunks(a, w)  # noqa: E731   w closed over
        const_w.__name__ = "bf16_chunks_const_w"
        for alt in (f32_chunks, bf16_chunks, const_w):
            fb = jax.jit(alt)
            assert np.array_equal(np.asarray(fa(x, w)), np.asarray(fb(x, w))), "not bit-identical"
            res = interleaved(fa, fb, (x, w), cfg)
            print(f"  M={m} K={k} N={n}: xla_int8 {res['jax_median_s'] * 1e3:.2f} ms, {alt.__name__} "
                  f"{res['hlofuse_median_s'] * 1e3:.2f} ms, ratio {res['median_ratio']:.2f} "
                  f"(p25 {res['ratio_p25']:.2f}, p75 {res['ratio_p75']:.2f}, CPU-time ratio "
                  f"{res['median_cpu_time_ratio']:.2f}, {res['rounds']} rounds, "
                  f"{res['flagged_rounds']} under foreign load)", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
