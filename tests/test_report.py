"""The fusion report as users read it (issue 11, "What users see"): what it counts as left to
XLA, which source line it names for a region, and the units of the HTML view."""

from __future__ import annotations

import os
import textwrap

import numpy as np
import pytest

import jax

import hlofuse
from hlofuse.core import report as hreport
from hlofuse.core.report import Region, Report
from hlofuse.runtime import formats
from hlofuse.core import report_html as html
from tests.fusion_util import kernels, pipe
from hlofuse.runtime.testing import ALL_KERNELS

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
    assert "0 region(s) left to XLA, 3 merged into others" in html.render(rep)


def test_a_region_left_to_xla_is_still_counted():
    rep = Report()
    rep.new_region("elementwise", ["stablehlo.add"], kernel="k0")
    rep.new_region("reduction", ["stablehlo.reduce"], reason="too small")
    m = rep.new_region("matmul_epilogue", ["stablehlo.dot_general"], reason="merged into horizontal region 3")
    m.extra["merged_into"] = 3
    assert [r.id for r in rep.left_to_xla] == [1] and [r.id for r in rep.merged] == [2]


# ---------------------------------------------------------------------------------------------
# "where" names the user's line, not the library's
# ---------------------------------------------------------------------------------------------

KERAS = "/venv/lib/python3.11/site-packages/keras/src/ops/numpy.py"
FLAX_SRC = "/home/me/src/flax/flax/linen/linear.py"   # a source checkout, not site-packages


@pytest.mark.parametrize("loc,where", [
    # a Keras op called from the user's model: the user's line, not numpy.py:182
    (f'loc("jit(f)/tanh"(callsite("tanh"("{KERAS}":182:11 to :30) at callsite("call"'
     f'("/home/me/model.py":12:8 to :20) at "<module>"("/home/me/train.py":40:1)))))', "model.py:12"),
    # a Flax layer from a source checkout is library code too
    (f'loc(callsite("__call__"("{FLAX_SRC}":287:4) at "forward"("/home/me/model.py":30:2)))', "model.py:30"),
    # user code only: the innermost frame, as before
    ('loc("jit(f)/add"(callsite("f"("/home/me/a.py":5:11) at "<module>"("/home/me/a.py":9:1))))', "a.py:5"),
    # library frames only: the innermost one rather than nothing
    (f'loc(callsite("tanh"("{KERAS}":182:11) at "x"("{FLAX_SRC}":287:4)))', "numpy.py:182"),
    ('loc(unknown)', "unknown"),
], ids=["keras", "flax-checkout", "user-only", "library-only", "unknown"])
def test_source_location_prefers_the_users_frame(loc, where):
    assert hreport.source_location(loc) == where


def test_library_paths():
    is_library_path = hreport.is_library_path
    assert is_library_path(KERAS) and is_library_path(FLAX_SRC)
    assert is_library_path(hlofuse.__file__)
    assert is_library_path(os.path.join(os.path.dirname(jax.__file__), "numpy", "lax_numpy.py"))
    assert not is_library_path("/home/me/model.py") and not is_library_path(os.path.abspath(__file__))


def test_a_project_directory_named_like_a_library_is_the_users(tmp_path):
    # a clone of this repository (or a user's project) in a directory called hlofuse/ or flax/:
    # its files are the user's; the package directory inside a source checkout is the library's
    for name in ("hlofuse", "flax"):
        root = tmp_path / name
        (root / "tests").mkdir(parents=True)
        (root / name).mkdir()
        (root / name / "__init__.py").write_text("")
        user, lib = root / "tests" / "model.py", root / name / "linear.py"
        user.write_text("")
        lib.write_text("")
        assert not hreport.is_library_path(str(user)), user
        assert hreport.is_library_path(str(lib)), lib
    # paths from another machine go by the names alone
    assert hreport.is_library_path("/elsewhere/src/flax/flax/linen/linear.py")


def test_report_where_column_shows_the_users_line(tmp_path, monkeypatch):
    """Two regions built by the same library function, called from two user lines: each region
    names its own caller line (it used to name the library line for both)."""
    lib = tmp_path / "site-packages" / "fakelib"
    lib.mkdir(parents=True)
    (lib / "__init__.py").write_text("")
    (lib / "linear.py").write_text(textwrap.dedent("""\
        import jax.numpy as jnp

        def dense(x, w):
            return jnp.tanh(x @ w) * 2.0
        """))
    monkeypatch.syspath_prepend(str(lib.parent))
    from fakelib.linear import dense

    def model(x, w):
        h = dense(x, w)           # USER LINE 1
        return dense(h, w) + 1.0  # USER LINE 2

    src = open(__file__).read().splitlines()
    line1 = next(i for i, s in enumerate(src, 1) if s.rstrip().endswith("# USER LINE 1"))
    x, w = np.ones((8, 16), F32), np.ones((16, 16), F32) * 0.1
    rep = hlofuse.jit(model, target="cpu").report(x, w)
    me = os.path.basename(__file__)
    assert len(rep.regions) == 2
    assert [r.locations[0] for r in rep.regions] == [f"{me}:{line1}", f"{me}:{line1 + 1}"], \
        [r.locations for r in rep.regions]
    assert "linear.py" not in str(rep)


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
    page = html.render(_sized_report())
    assert "<td>12.0MiB</td><td>8.0MiB</td>" in page and "<td>6.0KiB</td><td>6.0KiB</td>" in page
    assert "modeled bytes 12.0MiB &rarr; 8.0MiB (saved 4.0MiB)" in page
    assert "12582912" not in page and "6144" not in page
    # the text view says the same
    text = str(_sized_report())
    assert "12.0MiB->8.0MiB" in text and "6.0KiB->6.0KiB" in text


def test_written_html_report_uses_human_units(tmp_path):
    path = tmp_path / "r.html"
    formats.write_report(_sized_report(), str(path))
    page = path.read_text()
    assert "12.0MiB" in page and "12582912" not in page


def test_tiling_report_per_matmul_and_convolution():
    """Each matmul/convolution: GEMM shape, the target's native tile, padding waste, blocks."""
    import jax
    import jax.numpy as jnp
    import hlofuse
    from hlofuse.kernels.tiling import native_tile, padding_waste
    x = jnp.zeros((100, 320), jnp.bfloat16)
    w = jnp.zeros((320, 200), jnp.bfloat16)
    f = lambda x, w: jax.nn.gelu(x @ w)  # noqa: E731
    rep = hlofuse.jit(f, target="tpu", options={"chip": "v5e", **ALL_KERNELS}).report(x, w)
    (row,) = rep.tiling
    assert (row["m"], row["n"], row["k"], row["tile"]) == (100, 200, 320, [16, 128, 128])
    # padded to 112 x 256 x 384 on the 128x128 MXU with 16-row bf16 sublane tiles
    assert row["waste_pct"] == round(100 * (1 - 100 * 200 * 320 / (112 * 256 * 384)), 2)
    assert row["blocks"] and row["blocks"] == rep.kernels[0].block
    assert any(l.startswith("  tiling: dot_general") and "% padding" in l for l in str(rep).splitlines())
    assert "## Tiling" in rep.to_markdown() and rep.to_dict()["tiling"][0]["waste_pct"] == row["waste_pct"]
    assert native_tile("gpu", 1) == (64, 8, 32) and native_tile("cpu", 4) is None
    assert padding_waste(128, 128, 128, (8, 128, 128)) == 0.0
    cpu = hlofuse.jit(f).report(x, w)
    assert cpu.tiling[0]["tile"] is None and "no native tile" in str(cpu)
    # the HTML page has the same table: shape, native tile, waste and the kernel's blocks
    page = html.render(rep)
    assert "<h2>Tiling</h2>" in page
    assert (f"<td>M100 N200 K320</td><td>bf16</td><td>16x128x128</td><td>{row['waste_pct']:g}%</td>"
            f"<td>kernel blocks {row['blocks']}</td>") in page
    assert "<td>none</td><td>-</td>" in html.render(cpu)
    assert "<h2>Tiling</h2>" not in html.render(_sized_report())
