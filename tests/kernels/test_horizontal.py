"""Horizontal kernel family: several dots sharing their lhs, one lhs tile load per step."""

import numpy as np
import pytest

import jax
import jax.numpy as jnp

from hlofuse.kernels import FAMILIES
from hlofuse.kernels import horizontal as hz
from hlofuse.kernels.tiling import MatmulBlocks
from hlofuse.core.ops import EmitError
from tests.fusion_util import check_kernel_everywhere, outline

FAM = FAMILIES["horizontal"]
R = np.random.default_rng(5)
F32 = np.float32


def test_qkv_kernel_all_targets():
    x = R.standard_normal((2, 12, 64)).astype(F32)
    ws = [(R.standard_normal((64, 32)) * 0.2).astype(F32) for _ in range(3)]
    bs = [R.standard_normal(32).astype(F32) for _ in range(3)]
    fn = lambda x, a, b, c, d, e, g: (x @ a + d, x @ b + e, jax.nn.gelu(x @ c + g))  # noqa: E731
    out = outline(fn, (x, *ws, *bs), "fuse-matmul-epilogue,fuse-horizontal")
    (f,) = out.funcs("horizontal")
    spec = hz.spec_from_func(f)
    assert len(spec.dots) == 3 and len(spec.out_shapes) == 3
    used = check_kernel_everywhere(f, FAM, category="reassociate",
                                   gpu_blocks=MatmulBlocks("gpu", 1, 24, 32, 64, 16, 32, 32, members=3),
                                   tpu_blocks=MatmulBlocks("tpu", 1, 24, 32, 64, 8, 32, 64, members=3))
    assert used["gpu"].grid == (1, 2, 1) and used["tpu"].grid == (1, 3, 1, 1)


def test_single_dot_is_not_horizontal():
    x = R.standard_normal((4, 8)).astype(F32)
    w = R.standard_normal((8, 8)).astype(F32)
    out = outline(lambda x, w: jnp.tanh(x @ w), (x, w), "fuse-matmul-epilogue")
    (f,) = out.funcs("matmul_epilogue")
    with pytest.raises(EmitError, match="needs at least two dots"):
        hz.spec_from_func(f)
