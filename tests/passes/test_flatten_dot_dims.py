"""flatten-dot-dims: multi-head projections (several rhs free dims, several contracting dims)
and their gradients become one-contracting-dim products with jax.jit's numbers, their bias and
activation fuse as the product's epilogue; interleaved dims are left alone."""

from __future__ import annotations

import numpy as np
import pytest

import jax
import jax.numpy as jnp

import hlofuse
from hlofuse.core import ir as hir
from hlofuse.kernels.support import dot_layout
from hlofuse.runtime.testing import assert_same
from tests.fusion_util import kernels, outline, pipe
from hlofuse.runtime.testing import ALL_KERNELS

R = np.random.default_rng(0)
B, S, D, H, DH = 2, 16, 32, 4, 8
F32 = np.float32
PIPE = pipe("flatten-dot-dims", kernelize=False)


def _args():
    return (R.standard_normal((B, S, D)).astype(F32),
            (R.standard_normal((D, H, DH)) * 0.1).astype(F32),
            R.standard_normal((H, DH)).astype(F32),
            (R.standard_normal((H, DH, D)) * 0.1).astype(F32),
            R.standard_normal((D,)).astype(F32))


def _block(x, wq, bq, wo, bo):
    # Flax LinearGeneral / Keras EinsumDense: x[B,S,D].W[D,H,Dh] + b[H,Dh],
    # then a[B,S,H,Dh].W[H,Dh,D]
    q = jax.nn.gelu(jnp.einsum("bsd,dhk->bshk", x, wq) + bq)
    return jnp.einsum("bshk,hkd->bsd", q, wo) + bo


def _stats(report) -> dict:
    (stats,) = [p.stats for p in report.passes if p.name == "flatten-dot-dims"]
    return stats


def _none(**nonzero) -> dict:
    """The pass's statistics when it rewrote nothing."""
    return {"flattened": 0, "sunk": 0, "left_sharded": 0, "left_as_written": 0, **nonzero}


def _kernel_form(text: str) -> list[bool]:
    """Per dot_general of the module: is it in the matmul kernels' form?"""
    module = hir.parse(text)     # alive while its ops are read
    return [dot_layout(op) is not None for op in hir.all_ops(module)
            if op.name == "stablehlo.dot_general"]


@pytest.mark.parametrize("grad", [False, True], ids=["forward", "grad"])
def test_projections_become_kernel_form_products_with_jax_jit_numbers(grad):
    fn = jax.grad(lambda *a: (_block(*a) ** 2).sum(), (0, 1, 2, 3, 4)) if grad else _block
    args = _args()
    f = hlofuse.jit(fn, target="cpu", pipeline=PIPE)
    assert_same(f(*args), jax.jit(fn)(*args), "reassociate")
    text = f.lower(*args).as_text()
    stats = _stats(f.report(*args))
    # forward: Q and output projections; the gradient adds dx and the two weight gradients
    assert stats["flattened"] == (6 if grad else 2), stats
    assert stats["sunk"] >= 1, stats           # the bias add (and gelu) moved above the reshape
    assert all(_kernel_form(text))
    # rerun over its own output: nothing more to do, the same module
    again = hlofuse.optimize(text, target="cpu", pipeline=PIPE)
    assert _stats(again.report) == _none()
    assert again.text == hlofuse.optimize(again.text, target="cpu", pipeline=PIPE).text


@pytest.mark.parametrize("target", ["cpu", "gpu", "tpu"])
def test_the_bias_and_activation_fuse_as_the_epilogue(target):
    on_tpu = {"flatten-dot-dims": {"on_tpu": True}}   # tpu: off unless asked (measured memory)
    out = outline(_block, _args(), "flatten-dot-dims,fuse-matmul-epilogue", target=target,
                  options=on_tpu)
    regions = [r for r in out.report.regions if r.kind == "matmul_epilogue"]
    assert len(regions) == 2 and all(r.reason is None for r in regions), regions
    ops = sorted(regions, key=lambda r: len(r.ops))[-1].ops
    assert "stablehlo.add" in ops and "stablehlo.tanh" in ops     # bias + gelu in the epilogue
    assert not any("not canonical" in n for n in out.report.notes), out.report.notes


def test_kernels_match_jax_jit_and_siblings_merge():
    # Q/K/V projections of one input: after flattening they are sibling dots that merge
    def qkv(x, wq, wk, wv):
        return tuple(jnp.einsum("bsd,dhk->bshk", x, w) for w in (wq, wk, wv))
    x, wq, _, _, _ = _args()
    ws = (wq, wq * 0.5, wq * 2.0)
    f = hlofuse.jit(qkv, target="cpu", autotune=False, tiered=False)
    assert_same(f(x, *ws), jax.jit(qkv)(x, *ws), "reassociate")
    rep = f.report(x, *ws)
    assert kernels(rep, "horizontal"), rep
    assert _stats(rep)["flattened"] == 3


def test_interleaved_dims_are_left_alone_with_the_reason():
    # contracting dims 1 and 3 of the lhs are not adjacent: flattening would need a transpose
    x = R.standard_normal((B, H, S, DH)).astype(F32)
    w = R.standard_normal((H, DH, D)).astype(F32)
    fn = lambda x, w: jnp.einsum("bhsk,hkd->bsd", x, w)  # noqa: E731
    f = hlofuse.jit(fn, target="gpu", pipeline=pipe("flatten-dot-dims", "fuse-matmul-epilogue",
                                                    kernelize=False))
    rep = f.report(x, w)
    assert _stats(rep) == _none(left_as_written=1)
    assert any("not canonical" in n for n in rep.notes), rep.notes
    g = hlofuse.jit(fn, target="cpu", pipeline=PIPE)
    assert_same(g(x, w), jax.jit(fn)(x, w), "exact")


def test_disable_turns_it_off():
    args = _args()
    f = hlofuse.jit(_block, target="cpu", pipeline=PIPE, disable=["flatten-dot-dims"])
    assert _stats(f.report(*args)) == {}
    assert not all(_kernel_form(f.lower(*args).as_text()))


def _w_at_x(case: str):
    # a vmapped W @ x (Equinox's Linear under vmap): W[O,I] . x[B,S,I] -> [O,B,S]
    def fn(w, x, b):
        y = jnp.einsum("oi,bsi->obs", w, x)
        if case == "transposed at once":
            return jnp.transpose(y, (1, 2, 0)) + b
        if case == "bias, then transposed":      # what vmap of Equinox's Linear makes
            return jnp.transpose(jax.nn.gelu(y + b[:, None, None]), (1, 2, 0))
        return y * b[:, None, None]               # read as [O,B,S]: no transpose to cancel
    return fn, ((R.standard_normal((D, D)) * 0.1).astype(F32),
                R.standard_normal((B, S, D)).astype(F32), R.standard_normal((D,)).astype(F32))


@pytest.mark.parametrize("case", ["transposed at once", "bias, then transposed"])
def test_an_activation_on_the_rhs_becomes_x_times_w_transposed(case):
    fn, args = _w_at_x(case)
    f = hlofuse.jit(fn, target="cpu", autotune=False, tiered=False)
    assert_same(f(*args), jax.jit(fn)(*args), "reassociate")
    rep = f.report(*args)
    assert _stats(rep)["flattened"] == 1
    assert "stablehlo.transpose" not in f.lower(*args).as_text()   # cancelled, not computed
    g = hlofuse.jit(fn, target="gpu", autotune=False, options=ALL_KERNELS)
    (r,) = [r for r in g.report(*args).regions if r.kind == "matmul_epilogue"]
    assert r.reason is None and "stablehlo.add" in r.ops       # the bias is its epilogue


def test_an_activation_on_the_rhs_read_as_it_is_is_left_as_written():
    # its rows flattened, XLA would transpose the product's output: left to XLA as written
    fn, args = _w_at_x("read as it is")
    f = hlofuse.jit(fn, target="cpu", pipeline=PIPE)
    assert _stats(f.report(*args)) == _none(left_as_written=1)
    assert_same(f(*args), jax.jit(fn)(*args), "exact")


def test_off_on_tpu_unless_asked():
    """tpu: the flattened projections measured more memory in a BERT training step (bench
    --memory, v5e: 2237 against 2119 MiB), so tpu programs keep them as written."""
    out = outline(_block, _args(), "flatten-dot-dims", target="tpu")
    assert _stats(out.report) == dict(_none(), skipped="tpu (on_tpu=true flattens there)")
    assert _stats(outline(_block, _args(), "flatten-dot-dims", target="gpu").report)["flattened"]


RESHARD = '''
import json, os, sys
os.environ["XLA_FLAGS"] = "--xla_force_host_platform_device_count=4"
sys.path.insert(0, ROOT)
import numpy as np, jax, jax.numpy as jnp, hlofuse
from jax.sharding import AxisType, NamedSharding, PartitionSpec as P
from tests.sharded_programs import agreement, collectives
mesh = jax.make_mesh((2, 2), ("data", "model"), axis_types=(AxisType.Auto,) * 2)
R = np.random.default_rng(0)
x = jax.device_put(R.standard_normal((4, 16, 32)).astype(np.float32), NamedSharding(mesh, P("data")))
w = jax.device_put(R.standard_normal((32, 4, 8)).astype(np.float32),
                   NamedSharding(mesh, P(None, "model")))

def f(x, w, reshard):
    q = jnp.einsum("bsd,dhk->bshk", x, w)              # heads sharded on "model"
    if reshard:                                         # the user asks for head_dim instead
        q = jax.lax.with_sharding_constraint(q, NamedSharding(mesh, P("data", None, None, "model")))
    return jnp.tanh(q)

out = {}
for reshard in (False, True):
    g = lambda x, w: f(x, w, reshard)
    h = hlofuse.jit(g, tiered=False, autotune=False)
    a, b = jax.jit(g)(x, w), h(x, w)
    rep = h.report(x, w)
    (stats,) = [p.stats for p in rep.passes if p.name == "flatten-dot-dims"]
    out[str(reshard)] = {**agreement(a, b), "stats": stats,
                         "notes": [n for n in rep.notes if n.startswith("flatten-dot-dims")],
                         "jax": collectives(jax.jit(g).lower(x, w).compile().as_text()),
                         "hlofuse": collectives(h.lower(x, w).compile().as_text())}
print(json.dumps(out))
'''


def test_a_product_whose_result_a_constraint_reshards_keeps_its_dims():
    """A sharding constraint asking for another sharding of a product's result (NNX's
    ``out_sharding``, Explicit axes): XLA folds the reshard into the product as written, and
    behind a flattened product's reshape adds an all-to-all (a Flax NNX block on a 2x4 mesh
    had 3 where jax.jit has 2). Such a product is left, the report says why; the same product
    without the constraint is still flattened."""
    import os
    from tests.sharded_programs import run_json_child
    root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    out = run_json_child(RESHARD.replace("ROOT", repr(root)))
    for case, o in out.items():
        assert o["err"] <= 1e-5 and o["same_sharding"], (case, o)
        assert all(n <= o["jax"][k] for k, n in o["hlofuse"].items()), (case, o)
    assert out["False"]["stats"]["flattened"] == 1, out["False"]
    assert out["True"]["stats"]["flattened"] == 0, out["True"]
    assert out["True"]["stats"]["left_sharded"] == 1, out["True"]
    assert any("sharding constraint reshards" in n for n in out["True"]["notes"]), out["True"]
