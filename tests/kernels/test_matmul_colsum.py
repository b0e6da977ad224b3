"""Bias gradients as column outputs of the matmul-epilogue kernel.

In the backward of ``act(x @ W + b)`` the matmul dY @ W2ᵀ carries the activation's derivative as
its epilogue; d(b) is the column sum of that product. ``fuse-matmul-epilogue`` (column
reductions on: gpu/tpu by default) puts the sum into the matmul's region, and the kernel writes
one partial per row block, summed after the kernel. Checked against the unfused region on every
target's blocks (partial last row and column blocks included) and end to end against jax.jit
with the ``grad`` tolerance; each test asserts the column output exists.
"""

import numpy as np
import pytest

import jax
import jax.numpy as jnp

import hlofuse
from hlofuse.kernels import FAMILIES
from hlofuse.kernels.tiling import MatmulBlocks
from hlofuse.runtime.testing import assert_same
from tests.fusion_util import check_kernel_everywhere, kernels, outline

FAM = FAMILIES["matmul_epilogue"]
R = np.random.default_rng(17)
M, D, F = 40, 32, 48     # 40 rows: the last 16-row gpu block is partial; F = 48: bn 32 is too


def mlp(act):
    def loss(p, x):
        return jnp.sum((act(x @ p[0] + p[1]) @ p[2]).astype(jnp.float32) ** 2)
    return loss


def _args(dtype):
    p = tuple((R.standard_normal(s) * 0.3).astype(dtype) for s in ((D, F), (F,), (F, D)))
    return p, R.standard_normal((M, D)).astype(dtype)


def _colsum_region(fn, args, target="gpu"):
    keep = outline(fn, args, "fuse-matmul-epilogue", target=target)
    found = [f for f in keep.funcs("matmul_epilogue") if FAM.spec_from_func(f).col_outputs]
    return keep, found


@pytest.mark.parametrize("act,dtype", [(jax.nn.gelu, np.float32), (jax.nn.silu, jnp.bfloat16)],
                         ids=["gelu-f32", "silu-bf16"])
def test_bias_grad_is_a_column_output_on_gpu_and_tpu_blocks(act, dtype):
    keep, found = _colsum_region(jax.value_and_grad(mlp(act)), _args(dtype))
    assert len(found) == 1, [str(f)[:200] for f in keep.funcs("matmul_epilogue")]
    f = found[0]
    spec = FAM.spec_from_func(f)
    assert (spec.m, spec.n) == (M, F)
    check_kernel_everywhere(f, FAM, category="grad",
                            gpu_blocks=MatmulBlocks("gpu", 1, M, F, spec.k, 16, 32, 32),
                            tpu_blocks=MatmulBlocks("tpu", 1, M, F, spec.k, 8, F, spec.k))


def test_end_to_end_and_off_on_cpu_by_default():
    p, x = _args(np.float32)
    step = jax.value_and_grad(mlp(jax.nn.gelu))
    # cpu: off by default (no measurement shows it faster there): the sum stays outside
    _, found = _colsum_region(step, (p, x), target="cpu")
    assert not found
    outside = f"dimensions = [0] : (tensor<{M}x{F}xf32>"
    assert outside in hlofuse.jit(step, target="cpu", autotune=False).lower(p, x).as_text()
    f = hlofuse.jit(step, target="cpu", autotune=False,
                    options={"fuse-matmul-epilogue": {"column_reductions": "on"}})
    assert outside not in f.lower(p, x).as_text(), "the bias-gradient sum stayed outside"
    assert kernels(f.report(p, x), "matmul_epilogue")
    assert_same(f(p, x), jax.jit(step)(p, x), "grad")
