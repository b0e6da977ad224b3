"""The fusion report as users read it (issue 11, "What users see"): what it counts as left to
XLA, which source line it names for a region, and the units of the HTML view."""

from __future__ import annotations

import numpy as np
import pytest

import jax

import hlofuse
from hlofuse.report import Region, Report
from tests.fusion_util import kernels, pipe

R = np.random.default_rng(7)
F32 = np.float32


# ---------------------------------------------------------------------------------------------
# Regions merged into a horizontal kernel are not "left to XLA"
# ---------------------------------------------------------------------------------------------

def qkv(x, wq, wk, wv):
    return x @ wq, x @ wk, jax.nn.relu(x @ wv)


@pytest.fixture(scope="module")
def qkv_report():
    x = R.standard_normal((2, 10, 32)).astype(F32)
    ws = [(R.standard_normal((32, 48)) * 0.2).astype(F32) for _ in range(3)]
    f = hlofuse.jit(qkv, target="cpu", pipeline=pipe("fuse-matmul-epilogue", "fuse-horizontal"))
    return f.report(x, *ws)


def test_regions_merged_into_a_horizontal_kernel_are_not_left_to_xla(qkv_report):
    rep = qkv_report
    (h,) = kernels(rep, "horizontal")
    assert len(rep.merged) == 3 and all(r.extra["merged_into"] == h.id for r in rep.merged)
    assert rep.left_to_xla == []
    assert rep.to_dict()["regions_left_to_xla"] == 0 and rep.to_dict()["regions_merged"] == 3
    text = str(rep)
    assert "1 kernel(s), 0 region(s) left to XLA, 3 merged into others" in text
    assert "XLA: merged" not in text and "merged into horizontal region" in text
    md = rep.to_markdown()
    assert "regions left to XLA: 0; merged into other regions: 3" in md and "XLA: merged" not in md
    assert "0 region(s) left to XLA, 3 merged into others" in rep.to_html()


def test_a_region_left_to_xla_is_still_counted():
    rep = Report()
    rep.new_region("elementwise", ["stablehlo.add"], kernel="k0")
    rep.new_region("reduction", ["stablehlo.reduce"], reason="too small")
    m = rep.new_region("matmul_epilogue", ["stablehlo.dot_general"], reason="merged into horizontal region 3")
    m.extra["merged_into"] = 3
    assert [r.id for r in rep.left_to_xla] == [1] and [r.id for r in rep.merged] == [2]


# ---------------------------------------------------------------------------------------------
# HTML uses the same units as the text
# ---------------------------------------------------------------------------------------------

def _sized_report() -> Report:
    rep = Report(target="cpu", source="m.mlir")
    rep.regions.append(Region(0, "elementwise", ["stablehlo.add", "stablehlo.exponential"],
                              locations=["model.py:3"], kernel="hlofuse_elementwise_0",
                              bytes_unfused=3 * 4 << 20, bytes_fused=2 * 4 << 20))
    rep.regions.append(Region(1, "reduction", ["stablehlo.reduce"], reason="too small",
                              bytes_unfused=6144, bytes_fused=6144))
    return rep


def test_html_report_uses_human_units():
    page = _sized_report().to_html()
    assert "<td>12.0MiB</td><td>8.0MiB</td>" in page and "<td>6.0KiB</td><td>6.0KiB</td>" in page
    assert "modeled bytes 12.0MiB &rarr; 8.0MiB (saved 4.0MiB)" in page
    assert "12582912" not in page and "6144" not in page
    # the text view says the same
    text = str(_sized_report())
    assert "12.0MiB->8.0MiB" in text and "6.0KiB->6.0KiB" in text


@pytest.mark.xfail(strict=True, reason="hlofuse/fileio.py:report_html still renders raw byte "
                   "counts; make it `return report.to_html()` (fileio is outside this change) and "
                   "drop this marker")
def test_written_html_report_uses_human_units(tmp_path):
    from hlofuse import fileio
    path = tmp_path / "r.html"
    fileio.write_report(_sized_report(), str(path))
    page = path.read_text()
    assert "12.0MiB" in page and "12582912" not in page
