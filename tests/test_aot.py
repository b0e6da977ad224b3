"""hlofuse.chips, chip-aware tiling and hlofuse.aot (deviceless compile checks).

The compile tests need the GPU/TPU compilers (``pip install -e ".[aot]"``) in this interpreter,
or an interpreter that has them named by ``HLOFUSE_AOT_PYTHON``; without them they skip with
the reason. CI runs them in ``.venv-aot`` (``.ci/run``). The planted kernels have blocks the
tiling would never choose (built without validation): each must be caught with the
compiler's own message and fall back to XLA for that chip, in the report.
"""

from __future__ import annotations

import dataclasses
import os
import subprocess
import sys

import numpy as np
import pytest

import jax
import jax.numpy as jnp

from hlofuse.target import Target
from hlofuse import aot, chips
from hlofuse.kernels import tiling
from hlofuse.passes.fusion import cost


def _compilers_for(chip: str) -> str | None:
    if os.environ.get(aot.PYTHON_ENV):
        return None
    return aot.missing_packages(chip)


def needs(chip: str):
    why = _compilers_for(chip)
    return pytest.mark.skipif(why is not None, reason=f"no {chip} compiler: {why}")


def unchecked(cls, **kw):
    """A blocks object built without its validation: blocks tiling would never choose."""
    obj = object.__new__(cls)
    kw["target"] = Target.of(kw["target"], kw.get("chip") or None)  # as __post_init__ would
    for f in dataclasses.fields(cls):
        object.__setattr__(obj, f.name, kw.get(f.name, f.default))
    return obj


def exported(fn, *avals, platform):
    return jax.export.export(jax.jit(fn), platforms=[platform])(*avals)


F32 = jnp.float32


# ---------------------------------------------------------------------------------------------
# Chip descriptions, tiling and the cost model (no compiler needed)
# ---------------------------------------------------------------------------------------------

def test_gpu_descriptions_ship_in_the_package_and_parse():
    for name, smem, cc in (("h100", 232448, (9, 0)), ("a100", 166912, (8, 0))):
        c = chips.get(name)
        assert c.target == "gpu" and c.smem_per_block == smem and c.compute_capability == cc
        assert "gpu_device_info" in c.target_config
    # f32 rate derived from the description: SMs x FP32 units x 2 x clock
    assert chips.get("h100").flops_per_s == pytest.approx(132 * 128 * 2 * 1.98e9)


def test_tpu_descriptions_per_generation():
    assert chips.get("v5e").scoped_vmem_bytes == 16 << 20
    assert chips.get("v4").scoped_vmem_bytes == 16 << 20
    assert chips.get("v6e").scoped_vmem_bytes == 32 << 20
    assert chips.get("v6e").mxu == 256 and chips.get("v5e").mxu == 128
    assert not chips.get("v4").int8_matmul and chips.get("v5e").int8_matmul
    with pytest.raises(ValueError, match="unknown chip"):
        chips.get("v7x")


def test_tiling_and_cost_model_read_the_same_chip():
    # 3 stages of 64x128x64 bf16 tiles... pick a shape whose staging depends on shared memory
    big = dict(batch=1, m=4096, n=4096, k=4096, target="gpu", itemsize=4)
    assert tiling.matmul_blocks(**big, chip="h100").smem_bytes <= chips.get("h100").smem_per_block
    assert tiling.matmul_blocks(**big, chip="a100").smem_bytes <= chips.get("a100").smem_per_block
    with chips.use("a100"):
        assert tiling.smem_budget() == 166912
        assert cost.model_for("gpu").on_chip_bytes == 166912
        assert cost.model_for("gpu").hbm_bytes_per_s == chips.get("a100").hbm_bytes_per_s
    assert cost.model_for("gpu").on_chip_bytes == 232448           # default chip: h100
    with chips.use("v6e"):
        assert tiling.max_row_elems("tpu") == 2 * tiling.max_row_elems("tpu", "v5e")
        assert cost.model_for("tpu").on_chip_bytes == 32 << 20
    # a tile over the chip's shared memory is refused by validation
    with pytest.raises(ValueError, match="shared memory"):
        tiling.MatmulBlocks("gpu", 1, 512, 512, 512, 256, 256, 128, num_stages=4, chip="a100")
    with pytest.raises(ValueError, match="1048576"):
        tiling.Blocks2D("gpu", 4096, 4096, 4096, 4096)


def test_pass_option_chip_reaches_tiling():
    import hlofuse

    def f(x, w):
        return jnp.tanh(x @ w) * 2.0

    exp = exported(f, jax.ShapeDtypeStruct((1024, 1024), F32), jax.ShapeDtypeStruct((1024, 1024), F32),
                   platform="tpu")
    with_v4 = hlofuse.optimize(exp.mlir_module(), target="tpu", options={"chip": "v4"})
    blocks = [r.block for r in with_v4.report.kernels]
    assert blocks, with_v4.report
    kinfo = aot.kernels_of(with_v4.module, with_v4.report)
    assert kinfo and kinfo[0][0].kind == "matmul_epilogue" and kinfo[0][0].blocks == blocks[0]


def test_missing_packages_is_one_line_naming_the_install(monkeypatch):
    import importlib.util
    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec",
                        lambda n, *a: None if n in ("libtpu", "jax_cuda12_plugin", "jax_plugins") else real(n, *a))
    for chip in ("v5e", "h100"):
        msg = aot.missing_packages(chip)
        assert msg and "\n" not in msg and 'pip install -e ".[aot]"' in msg


def test_cli_compile_for_without_compilers_says_how_to_install(tmp_path):
    if aot.missing_packages("v5e") is None or os.environ.get(aot.PYTHON_ENV):
        pytest.skip("the aot extras are installed here")
    exp = exported(lambda x: jnp.exp(x) + 1.0, jax.ShapeDtypeStruct((8, 128), F32), platform="tpu")
    path = tmp_path / "m.exported"
    path.write_bytes(exp.serialize())
    p = subprocess.run([sys.executable, "-m", "hlofuse.tools.cli", "check", "--compile-for", "v5e", str(path)],
                       capture_output=True, text=True, env=dict(os.environ, HLOFUSE_CLI_INPROCESS="1"))
    assert p.returncode == 2, p.stderr
    lines = [l for l in p.stderr.splitlines() if l.startswith("hlofuse")]
    assert len(lines) == 1 and 'pip install -e ".[aot]"' in lines[0], p.stderr


# ---------------------------------------------------------------------------------------------
# Compiling for real chips
# ---------------------------------------------------------------------------------------------

def _mlp(x, w, b):
    return jax.nn.gelu(x @ w + b) * 0.5, jax.nn.softmax(x, axis=-1)


MLP_ARGS = (jax.ShapeDtypeStruct((256, 512), F32), jax.ShapeDtypeStruct((512, 1024), F32),
            jax.ShapeDtypeStruct((1024,), F32))


@needs("h100")
@needs("v5e")
def test_compile_for_every_chip_reports_each_kernel():
    import hlofuse
    res = aot.compile_for(exported(_mlp, *MLP_ARGS, platform="cpu"), "h100,a100,v5e,v4")
    for name, r in res.items():
        assert r.ok, r.summary()
        assert {k.kind for k in r.kernels} == {"matmul_epilogue", "reduction"}, r.summary()
        assert all(k.ok and k.blocks and k.location != "unknown" for k in r.kernels), r.summary()
        assert r.seconds > 0
    # an already optimized program compiles as it is (h100 tiles, compiled for a100 too)
    low = hlofuse.jit(_mlp, target="gpu").lower(*MLP_ARGS)
    r = aot.compile_for(low, "a100", per_kernel=True)
    assert r.ok and len(r.kernels) == 2 and all(k.seconds is not None for k in r.kernels), r.summary()
    wrong = aot.compile_for(low, "v5e")
    assert not wrong.ok and "gpu kernels" in wrong.error


def _planted(monkeypatch, module_attr: str, make_blocks):
    """Make a family's block chooser return planted blocks (no validation)."""
    import importlib
    mod, attr = module_attr.rsplit(".", 1)
    monkeypatch.setattr(importlib.import_module(mod), attr, lambda *a, **k: make_blocks(*a, **k))


def _assert_caught(res, chip: str, needle: str, kind: str):
    assert res.left_to_xla, res.summary()
    k = res.left_to_xla[0]
    assert k.kind == kind and needle in k.error, res.summary()
    assert k.blocks and k.location != "unknown"
    region = res.optimized.report.region(k.region)
    assert region.kernel is None
    assert f"does not compile for {chip}" in region.reason and needle in region.reason
    assert res.ok, res.summary()            # the program, with that region on XLA, compiles
    assert not res.kernels or all(k.ok for k in res.kernels)


@needs("h100")
def test_planted_triton_block_of_4096x4096(monkeypatch):
    _planted(monkeypatch, "hlofuse.kernels.elementwise.elementwise_blocks",
             lambda rows, cols, **k: unchecked(tiling.Blocks2D, target="gpu", rows=rows, cols=cols,
                                               br=4096, bc=4096, num_warps=8, chip="h100"))
    exp = exported(lambda x, y: jnp.tanh(x) * y + 1.0, jax.ShapeDtypeStruct((4096, 4096), F32),
                   jax.ShapeDtypeStruct((4096, 4096), F32), platform="cuda")
    res = aot.optimize_for(exp.mlir_module(), "h100")
    _assert_caught(res, "h100", "Maximum allowed number of elements is 1048576", "elementwise")


@needs("a100")
def test_planted_triton_matmul_over_shared_memory(monkeypatch):
    def blocks(batch, m, n, k, *, target, itemsize=4, members=1, extra_bytes=0, chip=None):
        return unchecked(tiling.MatmulBlocks, target="gpu", batch=batch, m=m, n=n, k=k, bm=256,
                         bn=256, bk=128, members=members, itemsize=itemsize, num_warps=8,
                         num_stages=4, chip="a100")
    _planted(monkeypatch, "hlofuse.kernels.matmul_epilogue.matmul_blocks", blocks)
    exp = exported(lambda x, w, b: jax.nn.relu(x @ w + b), jax.ShapeDtypeStruct((1024, 1024), F32),
                   jax.ShapeDtypeStruct((1024, 1024), F32), jax.ShapeDtypeStruct((1024,), F32),
                   platform="cuda")
    res = aot.optimize_for(exp.mlir_module(), "a100")
    _assert_caught(res, "a100", "hared memory", "matmul_epilogue")


@needs("v5e")
def test_planted_mosaic_block_over_the_vmem_limit(monkeypatch):
    _planted(monkeypatch, "hlofuse.kernels.elementwise.elementwise_blocks",
             lambda rows, cols, **k: unchecked(tiling.Blocks2D, target="tpu", rows=rows, cols=cols,
                                               br=4096, bc=cols, sublane=8, chip="v5e"))
    exp = exported(lambda x, y: jnp.tanh(x) * y + 1.0, jax.ShapeDtypeStruct((8192, 2048), F32),
                   jax.ShapeDtypeStruct((8192, 2048), F32), platform="tpu")
    res = aot.optimize_for(exp.mlir_module(), "v5e")
    _assert_caught(res, "v5e", "vmem", "elementwise")


@needs("v5e")
def test_planted_mosaic_int32_matmul(monkeypatch):
    import hlofuse.passes.fuse_matmul_epilogue as fme
    from hlofuse.kernels import support as P
    monkeypatch.setitem(P.KERNEL_DTYPES, "tpu", P.KERNEL_DTYPES["tpu"] | {"i32"})
    monkeypatch.setattr(fme, "dot_anchor",
                        lambda op, target: None if op.name == "stablehlo.dot_general" else "not a dot")
    i32 = jnp.int32
    exp = exported(lambda x, w: jnp.maximum(jnp.dot(x, w, preferred_element_type=i32), 0),
                   jax.ShapeDtypeStruct((256, 256), i32), jax.ShapeDtypeStruct((256, 256), i32),
                   platform="tpu")
    res = aot.optimize_for(exp.mlir_module(), "v5e")
    _assert_caught(res, "v5e", "Mosaic failed to compile TPU kernel", "matmul_epilogue")


# ---------------------------------------------------------------------------------------------
# Sharded programs (issue 16): per-shard kernels compile for an 8-GPU topology and a TPU v5e
# 2x2 slice, and never add a collective of any kind to what jax.jit's program has
# ---------------------------------------------------------------------------------------------

SHARDED_CHILD = r'''
import json, os, sys
sys.path.insert(0, ROOT)
import numpy as np, jax, jax.numpy as jnp, hlofuse
from jax.experimental import topologies
from jax.sharding import NamedSharding
from hlofuse import chips
from tests.sharded_programs import cases, collectives
chip = chips.get(CHIP)
if chip.target == "gpu":
    topo = topologies.get_topology_desc(platform="cuda", topology="1x1x8",
                                        target_config=chip.target_config)
else:
    topo = topologies.get_topology_desc("v5e:2x2", platform="tpu", chips_per_host_bounds=(2, 2, 1))
devs = np.array(topo.devices)
n = len(devs)
fit = lambda shape: {8: shape, 4: {(8, 1): (4, 1), (1, 8): (1, 4), (2, 4): (2, 2)}[shape]}[n]
make_mesh = lambda shape: jax.sharding.Mesh(devs.reshape(fit(shape)), ("data", "model"),
                                            axis_types=(jax.sharding.AxisType.Auto,) * 2)
keep = ("data_parallel", "fsdp", "tp_mlp", "tp_block", "mesh_2d", "shard_map_mlp",
        "fsdp_train", "tp_block_train", "mesh_2d_train")
out = {"devices": n}
for name, fn, shapes, specs, mshape in cases(make_mesh, scale=2):
    if name not in keep:
        continue
    mesh = make_mesh(mshape)
    shard = tuple(NamedSharding(mesh, s) for s in specs)
    args = [jax.ShapeDtypeStruct(s, jnp.float32, sharding=sh) for s, sh in zip(shapes, shard)]
    with jax.set_mesh(mesh):
        j = collectives(jax.jit(fn, in_shardings=shard).trace(*args).lower().compile().as_text())
        lo = hlofuse.jit(fn, target=chip.target, in_shardings=shard,
                         options={"chip": chip.name}).lower(*args)
        h = collectives(lo.jax_lowered.compile().as_text())
    out[name] = {"jax": j, "hlofuse": h, "kernels": len(lo.report.kernels),
                 "per_shard": sorted(r.kind for r in lo.report.regions if "per_shard" in r.extra)}
print(json.dumps(out))
'''


def _sharded_compile(chip: str) -> dict:
    import json
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    code = SHARDED_CHILD.replace("ROOT", repr(root)).replace("CHIP", repr(chip))
    env = dict(os.environ, **aot._WORKER_ENV)
    r = subprocess.run([aot._python(), "-c", code], capture_output=True, text=True, env=env,
                       timeout=900)
    assert r.returncode == 0, r.stderr[-4000:]
    return json.loads(r.stdout.strip().splitlines()[-1])


@pytest.mark.parametrize("chip,devices", [pytest.param("h100", 8, marks=needs("h100")),
                                          pytest.param("v5e", 4, marks=needs("v5e"))])
def test_sharded_programs_compile_per_shard_with_no_extra_collectives(chip, devices):
    out = _sharded_compile(chip)
    assert out.pop("devices") == devices
    assert len(out) == 9
    for name, o in out.items():
        for kind, n in o["hlofuse"].items():
            assert n <= o["jax"][kind], (chip, name, kind, o)
        assert o["kernels"] >= 1, (chip, name, o)
    for name in ("tp_block", "mesh_2d"):   # attention and both layernorms run per shard
        kinds = out[name]["per_shard"]
        assert kinds.count("attention") == 1 and kinds.count("reduction") == 2, (chip, name, kinds)


def test_compilers_that_do_not_match_the_installed_jax_are_named(monkeypatch):
    """Issue 44: the aot extra's compilers must match the jax installed (jax's own tpu/cuda12
    extras pin them). A libtpu or CUDA plugin of another jax release is refused by name, with
    the version this jax needs, read from jax's metadata: no table here follows releases."""
    import importlib.metadata as md
    import importlib.util
    reqs = ['libtpu==0.0.50.*; extra == "tpu"',
            'jax-cuda12-plugin[with-cuda]<=0.12.0.1,>=0.12.0.1; extra == "cuda12"']
    installed = {"jax": "0.12.0.1", "libtpu": "0.0.42.1", "jax-cuda12-plugin": "0.12.0.1"}
    monkeypatch.setattr(md, "requires", lambda name: reqs if name == "jax" else [])
    monkeypatch.setattr(md, "version", lambda name: installed[name])
    monkeypatch.setattr(importlib.util, "find_spec", lambda name: object())
    monkeypatch.setattr(aot, "_ptxas", lambda: "/usr/bin/ptxas")
    why = aot.missing_packages("v5e")
    assert why is not None and "libtpu 0.0.42.1 is installed" in why and "libtpu==0.0.50.*" in why
    assert aot.missing_packages("h100") is None          # the plugin matches
    installed["jax-cuda12-plugin"] = "0.10.2"
    assert "jax-cuda12-plugin 0.10.2 is installed" in aot.missing_packages("h100")
    assert aot._satisfies("0.0.50.1", "==0.0.50.*") and not aot._satisfies("0.0.5", "==0.0.50.*")
