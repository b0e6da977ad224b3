"""The pass manager: registry, pipelines as data, verification, dumps, disabling, failures."""

from __future__ import annotations

import os
import pathlib
import re
import time

import pytest

import jax
import jax.numpy as jnp
from jax import export as jexport

import hlofuse
from hlofuse.core import ir as hir
from hlofuse.core.pipeline import (PIPELINES, Pass, PassContext, PassFailure, PassManager, all_passes,
                              register_pass, resolve_pipeline)

REPO = pathlib.Path(__file__).resolve().parents[1]
UPSTREAM = ("canonicalize", "cse", "symbol_dce")  # tested together in tests/passes/test_upstream_passes.py


def _module_text():
    f = lambda x, b: jax.nn.relu(x * 2.0 + b) * jnp.tanh(x)
    return jexport.export(jax.jit(f), platforms=["cpu"])(
        jax.ShapeDtypeStruct((8, 16), jnp.float32), jax.ShapeDtypeStruct((16,), jnp.float32)).mlir_module()


def test_every_registered_pass_is_named_documented_and_tested():
    passes = all_passes()
    assert {"inline-calls", "canonicalize", "cse", "symbol-dce", "fuse-elementwise", "kernelize"} <= set(passes)
    test_files = {p.name for p in (REPO / "tests").rglob("test_*.py")}
    for name, cls in passes.items():
        if cls.__module__.startswith("tests."):
            continue  # passes registered by tests themselves
        assert cls.name == name and re.fullmatch(r"[a-z][a-z0-9-]*", name)
        assert cls.__module__.startswith("hlofuse.passes."), cls.__module__
        module_doc = __import__(cls.__module__, fromlist=["x"]).__doc__ or ""
        assert f"``{name}``" in module_doc, f"{name}: module docstring must describe the pass"
        stem = cls.__module__.rsplit(".", 1)[-1]
        snake = name.replace("-", "_")   # (passes/attention/fuse.py: test_fuse_attention.py)
        assert {f"test_{stem}.py", f"test_{snake}.py"} & test_files or stem in UPSTREAM, \
            f"pass {name} has no tests/…/test_{snake}.py"


def test_pipelines_are_data_with_reasons():
    for name, steps in PIPELINES.items():
        for pass_name, why in steps:
            assert pass_name in all_passes(), (name, pass_name)
            assert why.strip(), (name, pass_name)


def test_resolve_pipeline_forms():
    assert resolve_pipeline("cleanup") == [n for n, _ in PIPELINES["cleanup"]]
    assert resolve_pipeline("cse, canonicalize") == ["cse", "canonicalize"]
    assert resolve_pipeline(["cse"]) == ["cse"]
    with pytest.raises(KeyError, match="unknown pass 'nope'.*known passes"):
        resolve_pipeline("cse,nope")


def test_dump_dir_writes_every_pass(tmp_path):
    opt = hlofuse.optimize(_module_text(), dump_dir=str(tmp_path))
    names = sorted(os.listdir(tmp_path))
    assert names[0] == "000_input.mlir"
    # one file per step, numbered in pipeline order (a pass that runs twice dumps twice)
    assert names == ["000_input.mlir"] + [f"{i:03d}_{n}.mlir"
                                          for i, (n, _) in enumerate(PIPELINES["default"], 1)]
    last = (tmp_path / names[-1]).read_text()
    assert hir.to_text(hir.parse(last)) == opt.text  # the last dump is the result


def test_timings_and_stats_are_recorded():
    t0 = time.perf_counter()
    rep = hlofuse.optimize(_module_text()).report
    elapsed = time.perf_counter() - t0
    seconds = rep.pass_seconds
    assert set(seconds) == {n for n, _ in PIPELINES["default"]}
    # every pass was timed, and the timings fit inside the call; pass_seconds sums the runs of
    # a pass that runs twice (constant-fold, cse, ...)
    assert all(p.seconds > 0 for p in rep.passes), rep.passes
    assert sum(p.seconds for p in rep.passes) <= elapsed
    assert sum(seconds.values()) == pytest.approx(sum(p.seconds for p in rep.passes))
    stats = {p.name: p.stats for p in rep.passes}
    assert stats["fuse-elementwise"]["regions"] == 1 and stats["kernelize"]["kernels"] == 1


def test_disable_by_name_and_by_env(monkeypatch):
    rep = hlofuse.optimize(_module_text(), disable=["kernelize"]).report
    assert [p.name for p in rep.passes if p.disabled] == ["kernelize"]
    assert not rep.kernels and rep.regions  # regions formed, none kernelized
    monkeypatch.setenv("HLOFUSE_DISABLE_PASSES", "fuse-elementwise,kernelize")
    rep = hlofuse.optimize(_module_text()).report
    assert {p.name for p in rep.passes if p.disabled} == {"fuse-elementwise", "kernelize"}
    assert not rep.regions
    with pytest.raises(KeyError, match="cannot disable unknown"):
        PassManager("default", disable=["no-such-pass"])
    # the message names where the name came from
    monkeypatch.setenv("HLOFUSE_DISABLE_PASSES", "nope")
    with pytest.raises(KeyError, match="from HLOFUSE_DISABLE_PASSES"):
        hlofuse.jit(lambda x: x)


@register_pass
class _BreakModule(Pass):
    """``test-break-module``: erases main's return (test only) so verification must fail."""
    name = "test-break-module"

    def run(self, module, ctx):
        main = hir.main_func(module)
        ret = hir.block_ops(main.regions[0].blocks[0])[-1]
        ret.erase()


@register_pass
class _Raise(Pass):
    """``test-raise``: raises (test only)."""
    name = "test-raise"

    def run(self, module, ctx):
        raise RuntimeError("boom in 'stablehlo.tanh' op")


def test_failure_names_pass_op_location_and_dumps(tmp_path):
    with pytest.raises(PassFailure) as e:
        hlofuse.optimize(_module_text(), pipeline=["inline-calls", "test-raise"], dump_dir=str(tmp_path))
    msg = str(e.value)
    assert "pass 'test-raise' failed" in msg and "after passes [inline-calls]" in msg
    assert "stablehlo.tanh" in msg and "test_pipeline.py" in msg  # op and user source line
    assert e.value.dump_path and os.path.exists(e.value.dump_path)
    with pytest.raises(PassFailure, match="test-break-module.*does not verify"):
        hlofuse.optimize(_module_text(), pipeline=["test-break-module"])


def test_optimize_does_not_mutate_an_input_module():
    ctx = hir.new_context()
    m = hir.parse(_module_text(), ctx)
    before = hir.to_text(m)
    opt = hlofuse.optimize(m)
    assert hir.to_text(m) == before
    assert opt.text != before and opt.report.kernels


def test_the_built_in_passes_are_registered_in_one_list_in_pipeline_order():
    """passes/__init__.py's PASSES is the one place built-in passes register (issue 47): no
    pass module registers itself, and the list follows the default pipeline."""
    import os
    import re
    from hlofuse.passes import PASSES
    from hlofuse.core.pipeline import all_passes
    builtin = {n: c for n, c in all_passes().items() if c.__module__.startswith("hlofuse.passes.")}
    assert set(builtin.values()) == set(PASSES)
    first = list(dict.fromkeys(n for n, _ in PIPELINES["default"]))
    assert [p.name for p in PASSES] == first
    here = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "passes")
    selfreg = [f for f in os.listdir(here) if f.endswith(".py") and f != "__init__.py"
               and re.search(r"^@register_pass", open(os.path.join(here, f)).read(), re.M)]
    assert selfreg == []
