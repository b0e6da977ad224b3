"""Golden IR tests: one directory per registered pass under ``tests/golden/``.

Each case is ``tests/golden/<pass>/<case>.mlir`` (the input) and ``<case>.expected.mlir`` (the
module after running only that pass through ``PassManager([<pass>])``). Both sides are compared
as canonical text: parsed and printed again without debug locations, with the payloads of kernel
custom calls (Triton / Mosaic ``backend_config`` blobs) replaced by a placeholder, because they
are serialized compiler IR whose bytes are not what a pass test is about (the kernel tests check
them). Every case is also a differential test: input and output modules run on the same seeded
random inputs and must agree within the tolerance category the case names.

``HLOFUSE_UPDATE_GOLDEN=1 pytest tests/test_golden.py`` rewrites the expected files; read the
diff before committing it. tests/golden/README.md has the directive syntax.
"""

from __future__ import annotations

import json
import os
import pathlib
import re

import jax
import pytest

import hlofuse.passes  # noqa: F401  (registers the passes: this file alone ran with none)
from hlofuse.core import ir as hir
from hlofuse.core.pipeline import PassContext, PassManager, all_passes
from hlofuse.core.report import Report
from hlofuse.runtime.testing import assert_same, random_inputs
from hlofuse.runtime.execute import run_module

GOLDEN = pathlib.Path(__file__).parent / "golden"
UPDATE = os.environ.get("HLOFUSE_UPDATE_GOLDEN") == "1"
EXPECTED_SUFFIX = ".expected.mlir"
DIRECTIVE = "// golden:"


def _cases() -> list[pathlib.Path]:
    return sorted(p for p in GOLDEN.glob("*/*.mlir") if not p.name.endswith(EXPECTED_SUFFIX))


def _expected_path(case: pathlib.Path) -> pathlib.Path:
    return case.with_name(case.name[: -len(".mlir")] + EXPECTED_SUFFIX)


def _directives(text: str) -> dict:
    """``// golden: key=value`` lines at the top of an input file (see the README)."""
    out = {"target": "cpu", "before": [], "options": {}, "donated": (), "numbers": "exact",
           "unchanged": False, "reason": None}
    for line in text.splitlines():
        if not line.startswith(DIRECTIVE):
            continue
        item = line[len(DIRECTIVE):].strip()
        key, _, value = item.partition("=")
        key, value = key.strip(), value.strip()
        if key == "target":
            out["target"] = value
        elif key == "before":
            out["before"] = [p.strip() for p in value.split(",") if p.strip()]
        elif key == "options":
            out["options"] = json.loads(value)
        elif key == "donated":
            out["donated"] = tuple(int(i) for i in value.split(","))
        elif key == "numbers":
            out["numbers"] = value
        elif key == "unchanged":
            out["unchanged"] = True
        elif key == "reason":
            out["reason"] = value
        else:
            raise ValueError(f"unknown golden directive {key!r} in {line!r}")
    return out


# Kernel payloads: Mosaic's ``backend_config = "..."`` and Triton's ``ir = "..."`` (inside
# ``mhlo.backend_config``) are serialized compiler modules; they embed the absolute paths of the
# kernel sources (so they differ per checkout) and change with every jax release.
_BLOB = re.compile(r'\b(backend_config|ir|hlofuse\.xla_original) = "(?:[^"\\]|\\.)*"')


def canonical(text: str) -> str:
    """Parse and print without locations; kernel payloads replaced by a placeholder."""
    out = hir.to_text(hir.parse(text, hir.new_context(), source="golden"))
    return _BLOB.sub(r'\1 = "<kernel payload>"', out)


def _avals(text: str) -> list:
    mod = hir.parse(text, hir.new_context(), source="golden")
    avals = []
    for t in hir.function_type(hir.main_func(mod)).inputs:
        info = hir.tensor_type_info(t)
        avals.append(jax.ShapeDtypeStruct(info.shape, hir.np_dtype(info.dtype)))
    return avals


def run_pass(text: str, name: str, d: dict) -> tuple[str, str, Report]:
    """(text the pass saw, text after it, report): ``before`` passes first, same context."""
    module = hir.parse(text, hir.new_context(), source="golden")
    ctx = PassContext(target=d["target"], report=Report(target=d["target"]),
                      options=dict(d["options"]), donated_args=d["donated"])
    if d["before"]:
        PassManager(d["before"]).run(module, ctx)
    seen = hir.to_text(module)
    PassManager([name]).run(module, ctx)
    return seen, hir.to_text(module), ctx.report


def _report_text(report: Report) -> str:
    """Everything a reason can be found in: notes, regions' reasons, pass statistics."""
    parts = list(report.notes)
    parts += [f"region {r.id} ({r.kind}): {r.reason}" for r in report.regions if r.reason]
    parts += [f"{p.name}: {p.stats}" for p in report.passes]
    return "\n".join(parts)


@pytest.mark.parametrize("case", _cases(), ids=lambda p: f"{p.parent.name}/{p.stem}")
def test_golden(case: pathlib.Path):
    name = case.parent.name
    text = case.read_text()
    d = _directives(text)
    seen, after, report = run_pass(text, name, d)
    got = canonical(after)
    expected_path = _expected_path(case)
    if UPDATE:
        expected_path.write_text(got)
    assert expected_path.exists(), (f"{expected_path} is missing: run HLOFUSE_UPDATE_GOLDEN=1 "
                                    f"pytest tests/test_golden.py and review the file")
    expected = canonical(expected_path.read_text())
    assert got == expected, (f"{name} on {case.name} differs from {expected_path.name} "
                             f"(HLOFUSE_UPDATE_GOLDEN=1 rewrites it):\n{got}")
    if d["unchanged"]:  # a no-match case: the pass leaves its input as it found it...
        assert got == canonical(seen), f"{name} changed the no-match case {case.name}"
    if d["reason"] is not None:  # ...and says why
        assert d["reason"] in _report_text(report), _report_text(report)
    # the numbers: the module the pass saw and the one it produced agree on random inputs
    if d["numbers"].startswith("skip"):
        assert "(" in d["numbers"], f"{case.name}: 'numbers=skip(<why>)' needs a reason"
        return
    xs = random_inputs(_avals(seen), seed=0)
    assert_same(run_module(after, xs), run_module(seen, xs), d["numbers"])


def _builtin_passes() -> set[str]:
    """Registered passes, less those that tests register for themselves (test_pipeline.py)."""
    return {n for n, cls in all_passes().items() if cls.__module__.startswith("hlofuse.")}


def test_every_pass_has_a_golden_case():
    have = {p.parent.name for p in _cases()}
    missing = sorted(_builtin_passes() - have)
    assert not missing, (f"passes without a golden case: {missing}; add "
                         f"tests/golden/<pass>/<case>.mlir (tests/golden/README.md)")


def test_golden_dirs_name_passes_and_expected_files_have_inputs():
    stale = sorted(d.name for d in GOLDEN.iterdir() if d.is_dir() and d.name not in _builtin_passes())
    assert not stale, f"golden directories for no registered pass: {stale}"
    inputs = set(_cases())
    orphans = sorted(str(p) for p in GOLDEN.glob(f"*/*{EXPECTED_SUFFIX}")
                     if p.with_name(p.name[: -len(EXPECTED_SUFFIX)] + ".mlir") not in inputs)
    assert not orphans, f"expected files without an input: {orphans}"
