"""conv_winograd: a 3x3, stride-1 convolution by Winograd's minimal filtering F(2x2, 3x3) (cpu).

Each 2x2 output tile is ``Aᵀ [(G g Gᵀ) ⊙ (Bᵀ d B)] A`` of its 4x4 input tile ``d`` and the 3x3
filter ``g``: the multiplies become 16 batched matmuls ``[tiles, Ci] @ [Ci, Co]``, 2.25x fewer
than the direct convolution's (36 per tile and channel pair against 16). The transforms are
adds and subtractions (``B``, ``A``; XLA fuses each into loops) and a small dot with exact
halvings and quarters (``G``). The sums differ from the direct convolution's only in order: within
``reassociate`` (max relative difference 1.2e-6 on a 56x56x64->64 layer, 2.6e-7 on the
ResNet stage against jax.jit's, whose own ynn-off build differs by 2.9e-7).

Why cpu only: XLA:CPU convolves directly (its Eigen or YNNPACK convolution), and on the
2-core host the Winograd form ran 1.19-1.20 ms against XLA's 1.46-1.47 ms (56x56x64->64,
library fusions off, the ResNet stage's autotuned setting) and the ResNet-50 conv2_x stage
0.462 against 0.552 of jax.jit's time (``python -m bench --models resnet_nhwc``). cuDNN and
XLA's TPU emitter choose their own algorithms (Winograd among them), so gpu/tpu keep them.

Non-finite and huge values: the transforms subtract inputs (``inf - inf`` is NaN where the
direct sum is ``inf``) and scale them before the products (an overflow where the direct sum
stays finite, for values near the float32 maximum). Where the inputs' maxima bound every
intermediate below the float32 maximum (``324 Ci max|x| max|w|``, ``16 max|x|`` and
``9 max|w|``, a 4x margin each; NaN and inf fail it) the
16 products run, else the direct convolution, placed in the products' layout so that the
output transform (adds and subtractions only) gives it back exactly (a ``lax.cond`` around the
products only, so the output transform still fuses into what reads it; :data:`FINITE_GUARD`).
Such inputs give what the program gives.

Any dimension numbers: the input is read as NHWC and the filter as HWIO (one transpose each
when the program's layout differs, which XLA folds into the transforms' loops), padding is
explicit (any non-negative low/high amounts) and the output is written in the program's layout.
"""

from __future__ import annotations

import dataclasses
import hashlib

import numpy as np

import jax.numpy as jnp
from jax import lax

from hlofuse.core import ir as hir
from hlofuse.core.ops import EmitError
from hlofuse.core.target import Target
from hlofuse.kernels.naming import named_kernel

__all__ = ["ConvSpec", "spec_from_func", "build_conv_winograd", "conv_winograd_reference",
           "winograd_f2x2_3x3"]

# F(2x2, 3x3) transforms (Lavin & Gray, "Fast Algorithms for Convolutional Neural Networks"):
# G here, Bᵀ and Aᵀ as the adds of _bt and _at
_G = np.array([[1, 0, 0], [.5, .5, .5], [.5, -.5, .5], [0, 0, 1]], np.float32)


@dataclasses.dataclass(frozen=True)
class ConvSpec:
    """One outlined convolution: its operands' places among the region's inputs, layouts and
    padding."""
    x_arg: int                       # index of the input among the region's arguments
    w_arg: int                       # index of the filter
    x_perm: tuple                    # input dims in N, H, W, C order
    w_perm: tuple                    # filter dims in H, W, I, O order
    out_perm: tuple                  # output dims (N, H, W, C) -> the program's output layout
    padding: tuple                   # ((lo, hi), (lo, hi)) over the two spatial dims
    body_text: str = ""

    @property
    def digest(self) -> str:
        return hashlib.sha1(self.body_text.encode()).hexdigest()[:10]

    def lax_dimension_numbers(self) -> lax.ConvDimensionNumbers:
        """The program's layouts as ``lax`` dimension numbers (for the reference)."""
        n, h, w, c = self.x_perm
        kh, kw, ki, ko = self.w_perm
        inv = np.argsort(self.out_perm)             # output position of N, H, W, C
        return lax.ConvDimensionNumbers((n, c, h, w), (ko, ki, kh, kw),
                                        (int(inv[0]), int(inv[3]), int(inv[1]), int(inv[2])))


def winograd_reason(op) -> str | None:
    """None when ``op`` is a convolution this family computes: 2 spatial dims, a 3x3 filter,
    stride 1, no dilation or reversal, one group, non-negative padding, f32, static shapes."""
    from hlofuse.kernels.support import conv_filter_size, conv_window_reason, value_info
    if op.name != "stablehlo.convolution":
        return "not a convolution"
    x, out, size = value_info(op.operands[0]), value_info(op.results[0]), conv_filter_size(op)
    if x is None or out is None or size is None:
        return "dynamic shape"
    if len(x.shape) != 4:
        return f"{len(x.shape) - 2} spatial dims (Winograd F(2x2,3x3) handles 2)"
    if x.dtype != "f32" or value_info(op.operands[1]).dtype != "f32" or out.dtype != "f32":
        return f"{x.dtype} convolution (Winograd is built for f32 only)"
    if size != (3, 3):
        return f"{'x'.join(map(str, size))} filter (only 3x3)"
    return conv_window_reason(op, lambda pad: "negative padding" if min(pad) < 0 else None)


def spec_from_func(fn_op) -> ConvSpec:
    """Read an outlined region holding one convolution of its two arguments."""
    from jaxlib.mlir.dialects import stablehlo
    from hlofuse.kernels.support import conv_padding
    entry = fn_op.regions[0].blocks[0]
    ops = [o.operation for o in entry.operations]
    convs = [o for o in ops if o.name == "stablehlo.convolution"]
    if len(convs) != 1 or len(ops) != 2 or ops[-1].operands[0] != convs[0].results[0]:
        raise EmitError("conv_winograd region must be one convolution and its return")
    conv = convs[0]
    why = winograd_reason(conv)
    if why is not None:
        raise EmitError(f"convolution not computed by Winograd F(2x2,3x3): {why}")
    args = list(entry.arguments)
    if conv.operands[0] not in args or conv.operands[1] not in args:
        raise EmitError("convolution operands must be region inputs")
    dn = stablehlo.ConvDimensionNumbers(conv.attributes["dimension_numbers"])
    pad = conv_padding(conv)
    out_dims = (dn.output_batch_dimension, *dn.output_spatial_dimensions, dn.output_feature_dimension)
    out_perm = tuple(int(i) for i in np.argsort(out_dims))   # NHWC result -> output layout
    return ConvSpec(
        x_arg=args.index(conv.operands[0]), w_arg=args.index(conv.operands[1]),
        x_perm=(dn.input_batch_dimension, *dn.input_spatial_dimensions, dn.input_feature_dimension),
        w_perm=(*dn.kernel_spatial_dimensions, dn.kernel_input_feature_dimension,
                dn.kernel_output_feature_dimension),
        out_perm=out_perm, padding=((pad[0], pad[1]), (pad[2], pad[3])),
        body_text=hir.ops_text(ops))


def _bt(d0, d1, d2, d3) -> list:
    """``Bᵀ`` = [[1, 0, -1, 0], [0, 1, 1, 0], [0, -1, 1, 0], [0, 1, 0, -1]] on a tile's four
    samples along one axis: adds and subtractions."""
    return [d0 - d2, d1 + d2, d2 - d1, d1 - d3]


def _at(m0, m1, m2, m3) -> list:
    """``Aᵀ`` = [[1, 1, 1, 0], [0, 1, -1, -1]] on four transformed values along one axis."""
    return [m0 + m1 + m2, m1 - m2 - m3]


#: run the direct convolution where the inputs are not finite or so large that an
#: intermediate could overflow (see the module docstring); off only for an A/B of its cost
#: (a condition around the whole kernel, on its inputs or its output's finiteness, cost 1.06-
#: 1.11x on the ResNet-50 conv2_x stage: the output transform no longer fused into the
#: BatchNorm and ReLU after it; around the products only 1.05x on the NHWC stage, 0.99-1.08x on
#: the NCHW one: the cost left is reading the input once more for its maximum)
FINITE_GUARD = True

_GG = np.kron(_G, _G)      # [16, 9]: G g Gᵀ of a filter's 9 taps, row-major (entries 0, ±¼, ½, 1)


def winograd_f2x2_3x3(x, w, padding, guard: bool = True):
    """``x`` [N, H, W, Ci] (NHWC), ``w`` [3, 3, Ci, Co] (HWIO), explicit ``padding``
    ((lo, hi), (lo, hi)) -> [N, Ho, Wo, Co], Ho = H + lo + hi - 2 (a stride-1 'VALID'
    convolution of the padded input), in f32. ``guard``: inputs that are not finite, or so
    large that an intermediate could overflow, get the direct convolution (see the module
    docstring).

    Written for XLA:CPU's compile time as much as its run time: each transform is two
    vectorized stages (rows, then columns) over whole arrays, and ``G g Gᵀ`` one small dot.
    Sixteen strided tile slices, each combined on its own, made fusions that took 240 of a
    kernel's 330 ms to compile (4x32x32x64->64), and 8 of them made a diffusion UNet's first
    call 4.4x jax.jit's. Measured against that form: compile 330 -> 180 ms, run 2.9 -> 2.1 ms
    (4x32x32x64->64), 3.3 -> 1.7 ms (4x16x16x128->128); V and Y bit for bit the same."""
    n, _, _, ci = x.shape
    co = w.shape[-1]
    (pt, pb), (pl_, pr) = padding
    ho, wo = x.shape[1] + pt + pb - 2, x.shape[2] + pl_ + pr - 2
    th, tw = -(-ho // 2), -(-wo // 2)                    # 2x2 output tiles
    # pad to [N, 2th+2, 2tw+2, Ci] (high amounts >= the program's: past an odd output size
    # the last tiles read zeros, and their extra row/column is cropped at the end)
    xp = lax.pad(x, jnp.zeros((), x.dtype), ((0, 0, 0), (pt, 2 * th + 2 - x.shape[1] - pt, 0),
                                             (pl_, 2 * tw + 2 - x.shape[2] - pl_, 0), (0, 0, 0)))
    # V = Bᵀ d B. Tile (i, j) reads rows 2i..2i+3, i.e. row pairs i and i+1 (and columns
    # likewise): its samples are slices of the pairs, [N, th+1, 2, tw+1, 2, Ci]
    p = xp.reshape(n, th + 1, 2, tw + 1, 2, ci)
    lo, hi = p[:, :th], p[:, 1:]
    r = jnp.stack(_bt(lo[:, :, 0], lo[:, :, 1], hi[:, :, 0], hi[:, :, 1]))     # [4, N, th, tw+1, 2, Ci]
    lo, hi = r[:, :, :, :tw], r[:, :, :, 1:]
    v = jnp.stack(_bt(lo[..., 0, :], lo[..., 1, :], hi[..., 0, :], hi[..., 1, :]), axis=1)
    v = v.reshape(16, n * th * tw, ci)                                         # [4·4, tiles, Ci]
    u = lax.dot_general(jnp.asarray(_GG), w.astype(jnp.float32).reshape(9, ci * co),
                        (((1,), (0,)), ((), ())), precision=lax.Precision.HIGHEST)
    u = u.reshape(16, ci, co)                                                  # G g Gᵀ

    def products(_):
        return lax.dot_general(v, u, (((2,), (1,)), ((0,), (0,))),
                               preferred_element_type=jnp.float32)

    def direct(_):
        # the direct convolution D, placed where Aᵀ M A gives it back exactly: M[0,0] = D00,
        # M[0,3] = -D01, M[3,0] = -D10, M[3,3] = D11, zeros elsewhere (the output transform
        # only adds and subtracts: D + 0 and 0 - (-D) are D, inf and NaN included)
        d = lax.conv_general_dilated(x, w.astype(x.dtype), (1, 1), [tuple(p) for p in padding],
                                     dimension_numbers=("NHWC", "HWIO", "NHWC"))
        d = lax.pad(d, jnp.zeros((), d.dtype), ((0, 0, 0), (0, 2 * th - ho, 0),
                                                (0, 2 * tw - wo, 0), (0, 0, 0)))
        d = d.reshape(n, th, 2, tw, 2, co).astype(jnp.float32)
        md = jnp.zeros((4, 4, n, th, tw, co), jnp.float32)
        md = md.at[0, 0].set(d[:, :, 0, :, 0]).at[0, 3].set(-d[:, :, 0, :, 1])
        md = md.at[3, 0].set(-d[:, :, 1, :, 0]).at[3, 3].set(d[:, :, 1, :, 1])
        return md.reshape(16, n * th * tw, co)

    if guard:
        # every intermediate is at most 4 max|x| (V), 2.25 max|w| (U) or 81 Ci max|x| max|w|
        # (the products, Aᵀ.A sums 9): each with a 4x margin below the float32 maximum, the
        # Winograd form runs (a huge input with a tiny filter overflows V alone); NaN and inf
        # inputs fail the comparison and get the direct convolution
        mx = jnp.max(jnp.abs(x)).astype(jnp.float32)
        mw = jnp.max(jnp.abs(w)).astype(jnp.float32)
        bound = jnp.maximum(jnp.maximum(mx * mw * jnp.float32(324.0 * ci), mx * jnp.float32(16.0)),
                            mw * jnp.float32(9.0))
        m = lax.cond(bound < jnp.float32(3.0e38), products, direct, None)
    else:
        m = products(None)
    m = m.reshape(4, 4, n, th, tw, co)
    y = jnp.stack(_at(m[0], m[1], m[2], m[3]))                                 # Y = Aᵀ M A
    y = jnp.stack(_at(y[:, 0], y[:, 1], y[:, 2], y[:, 3]), axis=1)            # [2, 2, N, th, tw, Co]
    y = jnp.transpose(y, (2, 3, 0, 4, 1, 5))                                   # [N, th, 2, tw, 2, Co]
    return y.reshape(n, 2 * th, 2 * tw, co)[:, :ho, :wo, :]


def build_conv_winograd(spec: ConvSpec, target: Target | str, **_):
    """The region as ``f(*inputs) -> (output,)``: Winograd F(2x2, 3x3) in plain JAX (cpu)."""
    if not Target.of(target).is_cpu:
        raise EmitError("conv_winograd is built for cpu only (cuDNN / the TPU emitter choose "
                        "their own convolution algorithm)")

    def fn(*inputs):
        x = jnp.transpose(inputs[spec.x_arg], spec.x_perm)
        w = jnp.transpose(inputs[spec.w_arg], spec.w_perm)
        y = winograd_f2x2_3x3(x, w, spec.padding, guard=FINITE_GUARD)
        return (jnp.transpose(y, spec.out_perm),)

    fn = named_kernel(fn, f"hlofuse_conv_winograd_{spec.digest}")
    fn.blocks = "winograd F(2x2,3x3)"
    return fn


def conv_winograd_reference(spec: ConvSpec):
    """Plain-jnp reference: the direct convolution with the program's layouts."""
    def ref(*inputs):
        y = lax.conv_general_dilated(inputs[spec.x_arg], inputs[spec.w_arg], (1, 1),
                                     [tuple(p) for p in spec.padding],
                                     dimension_numbers=spec.lax_dimension_numbers(),
                                     precision=lax.Precision.HIGHEST)
        return (y,)
    return ref
