"""Depthwise convolutions on CPU: XLA's convolution against ``depthwise-conv-taps``.

    python -m bench.depthwise_cpu [--shapes 112x32x1,112x96x2,...] [--rounds 7]

Each shape ``HxCxS`` is a MobileNetV2 depthwise layer: a batch-1 ``HxHxC`` NHWC input, a 3x3
filter per channel, stride ``S``, SAME padding, then ReLU6. ``jax.jit`` runs XLA:CPU's
depthwise convolution; ``hlofuse.jit`` (autotune off) runs the sum of the filter's nine taps
that the ``depthwise-conv-taps`` pass writes, fused by XLA with the ReLU6 into one loop.
Prints the median per-round time ratio ``hlofuse / jax.jit`` (interleaved rounds,
:func:`bench.runner.interleaved`) and the largest difference relative to jax.jit's output.
"""

from __future__ import annotations

import argparse
import sys

import numpy as np

# MobileNetV2's depthwise layers at 224x224 (input size, channels, stride), one of each kind
SHAPES = "112x32x1,112x96x2,56x144x1,56x144x2,28x192x1,14x384x1,14x576x2,7x960x1"


def layer(stride: int):
    import jax.numpy as jnp
    from jax import lax

    def fn(x, w):
        y = lax.conv_general_dilated(x, w, (stride, stride), "SAME",
                                     dimension_numbers=("NHWC", "HWIO", "NHWC"),
                                     feature_group_count=x.shape[-1])
        return jnp.clip(y, 0.0, 6.0)
    return fn


def main(argv=None) -> int:
    import jax
    import hlofuse
    from bench.runner import Config, interleaved
    ap = argparse.ArgumentParser(prog="python -m bench.depthwise_cpu",
                                 description=__doc__.split("\n\n")[0])
    ap.add_argument("--shapes", default=SHAPES, help="HxCxS,...")
    ap.add_argument("--rounds", type=int, default=7)
    a = ap.parse_args(argv)
    cfg = Config.quick()
    cfg.rounds = a.rounds
    rng = np.random.default_rng(0)
    print("hlofuse.jit / jax.jit time, median of per-round ratios (<1: hlofuse is faster)")
    for shape in a.shapes.split(","):
        h, c, s = (int(v) for v in shape.split("x"))
        x = rng.standard_normal((1, h, h, c)).astype(np.float32)
        w = rng.standard_normal((3, 3, 1, c)).astype(np.float32)
        fn = layer(s)
        fa, fb = jax.jit(fn), hlofuse.jit(fn, autotune=False, tiered=False)
        rep = fb.report(x, w)
        (stats,) = [p.stats for p in rep.passes if p.name == "depthwise-conv-taps"]
        want, got = np.asarray(fa(x, w)), np.asarray(fb(x, w))
        rel = float(np.abs(got - want).max() / max(np.abs(want).max(), 1e-30))
        res = interleaved(fa, fb, (x, w), cfg)
        print(f"  {h}x{h}x{c} stride {s}: jax.jit {res['jax_median_s'] * 1e3:.2f} ms, hlofuse "
              f"{res['hlofuse_median_s'] * 1e3:.2f} ms, ratio {res['median_ratio']:.3f} (p25 "
              f"{res['ratio_p25']:.3f}, p75 {res['ratio_p75']:.3f}, {res['rounds']} rounds, "
              f"{res['flagged_rounds']} under foreign load); rewritten {stats['rewritten']}, "
              f"rel diff {rel:.1e}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
