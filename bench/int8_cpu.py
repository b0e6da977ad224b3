"""Which int8 matmul should a CPU program run? (the measurement behind ``int8-dot-unsigned``)

    python -m bench.int8_cpu [--shapes 256x1024x4096,256x4096x1024] [--rounds 7]

Three exact ways to compute an int8 x int8 -> int32 product on XLA:CPU:

* ``xla_int8``: ``dot_general(int8, int8) -> int32``, what the program says (XLA:CPU gives it
  to its library, YNNPACK);
* ``u8s8``: the same function through ``hlofuse.jit`` with the ``int8-dot-unsigned`` pass
  (``shift=always``): ``dot(a + 128 as uint8, b) - 128 * sum_k(b)``, the unsigned x signed
  form x86 VNNI int8 dot instructions compute natively -- bit-identical, checked here. By
  default the pass shifts only on CPUs without signed x signed int8 dots (AMX-INT8,
  AVX-VNNI-INT8, Arm: :mod:`hlofuse.core.hostcpu`), which the figures below justify or refute;
* ``bf16_chunks``: the int8 values converted to bf16 (exact) and multiplied with f32
  accumulation in K chunks of 1024 (every partial sum stays below 2^24, so each chunk is
  exact), the chunks summed in int32 -- what hlofuse's cpu kernels did before ``u8s8``.

Prints the median per-round time ratio ``alternative / xla_int8`` (interleaved rounds,
:func:`bench.runner.interleaved`): below 1 means the alternative is faster.
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


def bf16_chunks(a, b):
    import jax.numpy as jnp
    return _chunks(a, b, jnp.bfloat16)


def u8s8():
    """``xla_int8`` in the u8 x s8 form: the int8-dot-unsigned pass alone, its shift forced
    (``shift="auto"`` keeps the signed dot on CPUs that multiply it natively)."""
    import hlofuse
    return hlofuse.jit(xla_int8, pipeline="inline-calls,int8-dot-unsigned{shift=always}",
                       autotune=False)


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
    from hlofuse.core import hostcpu
    native = hostcpu.int8_signed_native()
    print(f"host: {hostcpu.profile()}; int8-dot-unsigned's default here: "
          + (f"keep s8 x s8 (native: {native})" if native else "the u8 x s8 form"))
    print("alternative / xla_int8 time, median of per-round ratios (<1: the alternative is faster)")
    for shape in a.shapes.split(","):
        m, k, n = (int(x) for x in shape.split("x"))
        x = rng.integers(-128, 128, (m, k)).astype(np.int8)
        w = rng.integers(-128, 128, (k, n)).astype(np.int8)
        fa = jax.jit(xla_int8)
        for name, fb in (("u8s8", u8s8()), ("bf16_chunks", jax.jit(bf16_chunks))):
            assert np.array_equal(np.asarray(fa(x, w)), np.asarray(fb(x, w))), "not bit-identical"
            res = interleaved(fa, fb, (x, w), cfg)
            print(f"  M={m} K={k} N={n}: xla_int8 {res['jax_median_s'] * 1e3:.2f} ms, {name} "
                  f"{res['hlofuse_median_s'] * 1e3:.2f} ms, ratio {res['median_ratio']:.2f} "
                  f"(p25 {res['ratio_p25']:.2f}, p75 {res['ratio_p75']:.2f}, CPU-time ratio "
                  f"{res['median_cpu_time_ratio']:.2f}, {res['rounds']} rounds, "
                  f"{res['flagged_rounds']} under foreign load)", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
