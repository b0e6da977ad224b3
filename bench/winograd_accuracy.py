"""How accurate each convolution algorithm is in f32, and why the CPU pipeline stops at F(2x2, 3x3).

    python -m bench.winograd_accuracy      # about 20 s; deterministic (fixed seeds, no timing)

Winograd's larger tile F(4x4, 3x3) needs 2.25 multiplies per output and input channel, against
4 for F(2x2, 3x3) (what ``kernels/conv_winograd.py`` computes) and 9 for the direct
convolution: on the ResNet-50 conv2_x stage it would take the 3x3 convolutions' products from
0.31 to 0.17 GFLOP. This computes, per layer shape (He-initialized filters, unit-normal
inputs), the direct convolution of jax.jit, F(2x2, 3x3) and F(4x4, 3x3) (Lavin and Gray's
points 0, ±1, ±2) in f32 and prints

* each one's largest error against the float64 convolution, relative to the output's largest
  magnitude (the algorithm's own accuracy), and
* how much of the ``reassociate`` tolerance (:data:`hlofuse.runtime.testing.TOLERANCES`, the one
  every rewrite that reorders sums is held to) its difference from jax.jit's output uses, at
  the worst element (above 1 fails the differential tests).

F(2x2, 3x3) is as accurate as XLA's direct convolution and uses a fifth of the tolerance; F(4x4,
3x3) on Lavin and Gray's points is about ten times less accurate and uses more than all of it
(1.3-2.7); on the best points tried (0, ±1, ½, -2) it is three to five times less accurate than
the direct convolution and uses 0.6-1.1 of the tolerance, growing with the channels (over it at
256): so hlofuse does not build it (measured on jax 0.12.1 and 0.10.2, the same figures).
"""

from __future__ import annotations

import argparse

import numpy as np

import jax
import jax.numpy as jnp
from jax import lax

from hlofuse.kernels.conv_winograd import winograd_f2x2_3x3
from hlofuse.runtime.testing import tolerance

#: F(4x4, 3x3)'s interpolation points (the sixth is infinity): Lavin and Gray's, and the best of
#: the sets tried here (as Barabasz et al., "Error analysis and improving the accuracy of
#: Winograd convolution for deep neural networks", suggest: mixing 2 and 1/2)
POINTS = {"F(4x4,3x3)": (0, 1, -1, 2, -2), "F(4x4,3x3) 0,±1,½,-2": (0, 1, -1, 0.5, -2)}


def toom_cook(m: int, r: int, points) -> tuple:
    """``(Aᵀ, G, Bᵀ)`` of F(m, r) on ``points`` and infinity: ``y = Aᵀ[(G g) ⊙ (Bᵀ d)]`` is the
    correlation ``y_i = Σ_k d_(i+k) g_k`` of ``m + r - 1`` samples ``d`` with ``r`` taps ``g``."""
    n = m + r - 1
    pts = [float(p) for p in points]
    at, g, bt = np.zeros((m, n)), np.zeros((n, r)), np.zeros((n, n))
    for j, p in enumerate(pts):
        at[:, j] = [p ** i for i in range(m)]
        g[j] = [p ** k / np.prod([p - q for q in pts if q != p]) for k in range(r)]
        c = np.polynomial.polynomial.polyfromroots([q for q in pts if q != p])
        bt[j, :len(c)] = c
    at[m - 1, n - 1], g[n - 1, r - 1] = 1, 1
    bt[n - 1] = np.polynomial.polynomial.polyfromroots(pts)
    return at, g, bt


#: (spatial size, input channels, output channels): ResNet-50's first two 3x3 layer shapes and a
#: deeper one (16x16: F(4x4) here tiles whole sizes only)
SHAPES = ((56, 64, 64), (28, 128, 128), (16, 256, 256))


def winograd_f4x4_3x3(x, w, points=POINTS["F(4x4,3x3)"]):
    """``x`` [N, H, W, Ci] with H and W multiples of 4, ``w`` [3, 3, Ci, Co] -> the 'SAME'
    convolution by F(4x4, 3x3) on ``points`` in f32 (a reference, not a kernel: written for
    clarity)."""
    n, h, wd, ci = x.shape
    xp = jnp.pad(x, ((0, 0), (1, 1), (1, 1), (0, 0)))
    rows = np.arange(h // 4)[:, None] * 4 + np.arange(6)[None, :]
    cols = np.arange(wd // 4)[:, None] * 4 + np.arange(6)[None, :]
    d = xp[:, rows][:, :, :, cols]                                     # [N, th, 6, tw, 6, Ci]
    at, g, bt = (jnp.asarray(m, jnp.float32) for m in toom_cook(4, 3, points))
    hi = lax.Precision.HIGHEST
    v = jnp.einsum("ai,ntiujc,bj->abntuc", bt, d, bt, precision=hi)
    u = jnp.einsum("ai,ijco,bj->abco", g, w, g, precision=hi)
    m = jnp.einsum("abntuc,abco->abntuo", v, u, precision=hi)
    y = jnp.einsum("ra,abntuo,sb->ntruso", at, m, at, precision=hi)
    return y.reshape(n, h, wd, -1)


def _direct(x, w, precision=None):
    return lax.conv_general_dilated(x, w, (1, 1), ((1, 1), (1, 1)),
                                    dimension_numbers=("NHWC", "HWIO", "NHWC"), precision=precision)


def measure(shapes=SHAPES, seed: int = 0) -> list[dict]:
    rtol, atol = tolerance(np.float32, "reassociate")
    rng = np.random.default_rng(seed)
    rows = []
    for hw, ci, co in shapes:
        x = rng.standard_normal((1, hw, hw, ci)).astype(np.float32)
        w = (rng.standard_normal((3, 3, ci, co)) * np.sqrt(2 / (9 * ci))).astype(np.float32)
        with jax.enable_x64(True):
            truth = np.asarray(_direct(x.astype(np.float64), w.astype(np.float64),
                                       lax.Precision.HIGHEST))
        xla = np.asarray(jax.jit(_direct)(x, w), np.float64)
        algos = {"direct (jax.jit)": xla,
                 "F(2x2,3x3)": jax.jit(lambda a, b: winograd_f2x2_3x3(
                     a, b, ((1, 1), (1, 1)), guard=False))(x, w)}
        for name, points in POINTS.items():
            algos[name] = jax.jit(lambda a, b, p=points: winograd_f4x4_3x3(a, b, p))(x, w)
        scale = np.abs(truth).max()
        for name, y in algos.items():
            y = np.asarray(y, np.float64)
            rows.append({"shape": f"{hw}x{hw}x{ci}->{co}", "algorithm": name,
                         "error": float(np.abs(y - truth).max() / scale),
                         "tolerance_used": float((np.abs(y - xla) / (atol + rtol * np.abs(xla))).max())})
    return rows


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--seed", type=int, default=0, help="inputs' and filters' seed (default 0)")
    args = ap.parse_args(argv)
    print(f"jax {jax.__version__}; f32 convolutions, error against float64 relative to the "
          "output's largest magnitude; tolerance used: the worst element's share of "
          "'reassociate' against jax.jit's output (above 1 fails)")
    print(f"{'layer':<18} {'algorithm':<22} {'error':>9} {'tolerance used':>15}")
    for r in measure(seed=args.seed):
        print(f"{r['shape']:<18} {r['algorithm']:<22} {r['error']:9.2e} {r['tolerance_used']:15.3f}")


if __name__ == "__main__":
    main()
