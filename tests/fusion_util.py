"""Helpers shared by the fusion-engine tests (fuse-reduction, fuse-matmul-epilogue,
fuse-horizontal and their kernel families): run a pipeline prefix on a jax function and get at
the outlined region functions, build kernels for every target, and compare."""

from __future__ import annotations

import dataclasses
import functools

import numpy as np

import jax
from jaxlib.mlir import ir

import hlofuse
from hlofuse.core import ir as hir
from hlofuse.kernels.common import func_avals
from hlofuse.passes.fusion.outline import KIND_ATTR, XLA_ATTR
from hlofuse.runtime.testing import random_inputs
from hlofuse.runtime.testing import ALL_KERNELS

PREFIX = "inline-calls,canonicalize,cse"
FUSION = "conv1x1-to-dot,fuse-matmul-epilogue,fuse-reduction,fuse-horizontal"
FULL_PIPE = f"{PREFIX},{FUSION},fuse-elementwise,kernelize,symbol-dce,canonicalize"


def pipe(*passes: str, kernelize: bool = True) -> str:
    tail = ",kernelize,symbol-dce,canonicalize" if kernelize else ""
    return ",".join((PREFIX,) + passes) + tail


@dataclasses.dataclass
class Outlined:
    """An optimized module (kept alive) and its region functions by kind."""
    optimized: object
    report: object

    @property
    def module(self):
        return self.optimized.module

    def funcs(self, kind: str | None = None, *, live_only: bool = True) -> list:
        called = {ir.FlatSymbolRefAttr(op.attributes["callee"]).value
                  for op in hir.all_ops(self.module) if op.name == "func.call"}
        out = []
        for f in hir.funcs(self.module):
            if KIND_ATTR not in f.attributes:
                continue
            if live_only and hir.func_name(f) not in called:
                continue
            if kind is None or ir.StringAttr(f.attributes[KIND_ATTR]).value == kind:
                out.append(f)
        return out

    def left_to_xla(self, f) -> str | None:
        return ir.StringAttr(f.attributes[XLA_ATTR]).value if XLA_ATTR in f.attributes else None


def outline(fn, args, passes: str, target: str = "cpu", options: dict | None = None) -> Outlined:
    """Export ``fn`` for ``target`` and run ``PREFIX + passes`` (no kernelize)."""
    exp = jax.export.export(jax.jit(fn), platforms=[{"gpu": "cuda"}.get(target, target)])(*args)
    opt = hlofuse.optimize(exp.mlir_module(), target=target, pipeline=f"{PREFIX},{passes}",
                           options={**ALL_KERNELS, **(options or {})})
    return Outlined(opt, opt.report)


def func_inputs(fn_op, seed: int = 0) -> list[np.ndarray]:
    return random_inputs(func_avals(fn_op), seed)


def kernels(report, kind: str | None = None) -> list:
    return [r for r in report.regions if r.kernel and (kind is None or r.kind == kind)]


def lowered_text(fn, args, target: str, pipeline: str = FULL_PIPE):
    lo = hlofuse.jit(fn, target=target, pipeline=pipeline, options=ALL_KERNELS).lower(*args)
    return lo.as_text(), lo.report


def check_kernel_everywhere(fn_op, family, *, category: str, gpu_blocks=None, tpu_blocks=None,
                            seed: int = 0, lower: bool = True) -> dict:
    """Build ``family`` for ``fn_op`` and check it against its plain-jnp reference:

    * cpu (the kernel kernelize splices: whole-array interpret blocks),
    * gpu tiles in Pallas interpret mode, tpu tiles in TPU interpret mode (``InterpretParams``),
    * gpu/tpu lowering from this machine (Triton / Mosaic custom calls).
    Returns the blocks used per target.
    """
    from jax.experimental.pallas import tpu as pltpu
    from hlofuse.kernels.lowering import lower_to_text
    from hlofuse.runtime.testing import assert_same
    spec = family.spec_from_func(fn_op)
    ins = func_inputs(fn_op, seed)
    want = jax.jit(family.reference(spec))(*ins)
    used = {}
    for target, interp, blocks in (("cpu", None, None), ("gpu", True, gpu_blocks),
                                   ("tpu", pltpu.InterpretParams(), tpu_blocks)):
        k = family.build(spec, target, interpret=interp, blocks=blocks)
        assert_same(jax.jit(k)(*ins), want, category)
        used[target] = k.blocks
    if lower:
        for target, marker in (("gpu", "__gpu$xla.gpu.triton"), ("tpu", "tpu_custom_call")):
            k = family.build(spec, target)
            assert marker in lower_to_text(k, func_avals(fn_op), target)
    return used


_EVAL_CHILD = """
import sys, numpy as np
from jaxlib.mlir import ir
from jaxlib.mlir.dialects import stablehlo
from hlofuse.core import ir as hir
ctx = hir.new_context()
z = np.load(sys.argv[1]); ins = [z[f"arr_{i}"] for i in range(len(z.files))]
for i, path in enumerate(sys.argv[3:]):
    m = hir.parse(open(path).read(), ctx)
    with ctx:
        outs = stablehlo.eval_module(m, [ir.DenseElementsAttr.get(a) for a in ins])
        np.savez(f"{sys.argv[2]}/out{i}.npz", *[np.array(o) for o in outs])
"""


def eval_modules(texts, inputs, *, timeout: float = 300) -> list[list[np.ndarray]]:
    """:func:`hlofuse.core.ir.eval_module` (the StableHLO reference interpreter, in a child
    process: it aborts on unsupported ops) for each module of ``texts`` on the same ``inputs``,
    all in one child: its start (~1 s of imports) is most of a small module's time. One list
    of results per module."""
    import os
    import subprocess
    import tempfile
    with tempfile.TemporaryDirectory() as d:
        paths = []
        for i, text in enumerate(texts):
            paths.append(os.path.join(d, f"m{i}.mlir"))
            with open(paths[-1], "w") as fh:
                fh.write(text)
        np.savez(os.path.join(d, "in.npz"), *inputs)
        argv, env = hir.python_command()
        p = subprocess.run(argv + ["-c", _EVAL_CHILD, os.path.join(d, "in.npz"), d, *paths],
                           capture_output=True, text=True, timeout=timeout, env=env)
        if p.returncode != 0:
            raise hir.IRError("reference interpreter failed: "
                              + (p.stderr.strip().splitlines() or ["(no output)"])[-1])
        outs = []
        for i in range(len(paths)):
            with np.load(os.path.join(d, f"out{i}.npz")) as z:
                outs.append([z[f"arr_{j}"] for j in range(len(z.files))])
        return outs


@functools.lru_cache(maxsize=128)
def _region_executable(text):
    """(tests compare several kernels, targets and inputs against the same region)"""
    from jax.extend import backend
    be = backend.get_backend()
    return be.compile_and_load(text, jax.devices()[:1],
                               backend.get_compile_options(num_replicas=1, num_partitions=1))


def run_region(text, ins):
    """The outlined region compiled by XLA on its own: the ground truth."""
    exe = _region_executable(text)
    return tuple(np.asarray(o) for o in exe.execute([jax.numpy.asarray(a) for a in ins]))


def dot_forms(seed: int, n: int):
    """``n`` random dot_general forms (batch, free and contracting dims in random orders):
    ``(lhs shape, rhs shape, dimension numbers, form name)``."""
    rng = np.random.default_rng(seed)
    for _ in range(n):
        nb, nm, nk, nn = (int(rng.choice(c)) for c in ([0, 0, 1, 2], [0, 1, 1, 2], [1, 1, 2], [0, 1, 1, 2]))
        size = {r: [int(rng.choice([1, 2, 3, 8, 16, 33])) for _ in range(c)]
                for r, c in zip("bmkn", (nb, nm, nk, nn))}
        lhs = [("b", i) for i in range(nb)] + [("m", i) for i in range(nm)] + [("k", i) for i in range(nk)]
        rhs = [("b", i) for i in range(nb)] + [("k", i) for i in range(nk)] + [("n", i) for i in range(nn)]
        if rng.random() < 0.4:          # anywhere
            rng.shuffle(lhs), rng.shuffle(rhs)
        else:                           # batch dims leading, the rest in any order
            lhs[nb:] = rng.permutation(np.array(lhs[nb:], dtype=object)).tolist()
            rhs[nb:] = rng.permutation(np.array(rhs[nb:], dtype=object)).tolist()
        lhs, rhs = [tuple(d) for d in lhs], [tuple(d) for d in rhs]
        dims = tuple(tuple(tuple(side.index((r, i)) for i in range(c)) for side in (lhs, rhs))
                     for r, c in (("k", nk), ("b", nb)))
        yield ([size[r][i] for r, i in lhs], [size[r][i] for r, i in rhs], dims,
               "".join(r for r, _ in lhs) + "x" + "".join(r for r, _ in rhs))
