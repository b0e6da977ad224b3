"""Fusion graphs for Google's Model Explorer (``hlofuse.core.model_explorer``, issue 48 item 3).

A real model (a transformer block: kernels and a region left to XLA) optimized, written with
``Optimized.to_model_explorer`` / ``Report.to_model_explorer`` / ``hlofuse optimize --graph``,
and checked with Model Explorer itself: every overlay loads back through its own node-data
classes, and every node id in an overlay is a node of the graph its MLIR adapter builds from
the written ``.mlir`` (run in this process). One test opens the graph in Model Explorer's web
app in headless Chromium; it skips where no Chromium is installed.

Needs the ``explorer`` extra (``pip install hlofuse[explorer]``); without it these tests skip,
saying so, except the one that checks the message hlofuse gives a user without it.
"""

from __future__ import annotations

import dataclasses
import json
import os
import shutil
import socket
import subprocess
import sys
import textwrap
import time
import urllib.request

import numpy as np
import pytest

import jax

import hlofuse
from hlofuse.core import ir as hir
from hlofuse.core import model_explorer as mex
from hlofuse.passes.fusion.outline import executable_module
from hlofuse.core.report import Region, Report
from hlofuse.runtime import formats
from tests.programs import PROGRAMS

EXTRA = "ai-edge-model-explorer is not installed: pip install hlofuse[explorer] (or .[explorer])"
PROGRAM = {p.name: p for p in PROGRAMS}


@pytest.fixture(scope="module")
def ndb():
    pytest.importorskip("model_explorer", reason=EXTRA)
    return mex.require()


def lowered_text(name: str) -> str:
    p = PROGRAM[name]
    args = p.args(np.random.default_rng(0))
    return jax.jit(p.fn, static_argnums=p.static_argnums).lower(*args).as_text(debug_info=True)


@pytest.fixture(scope="module")
def block(ndb, tmp_path_factory):
    """A transformer block optimized for cpu: kernels, and a region left to XLA."""
    before = lowered_text("transformer_block")
    opt = hlofuse.optimize(before, target="cpu", source="transformer_block")
    r = opt.report
    assert r.kernels and r.left_to_xla, str(r)   # the test needs both
    d = tmp_path_factory.mktemp("graph")
    written = opt.to_model_explorer(str(d), before=before)
    return opt, before, written


def me_graphs(path: str) -> dict[str, dict[str, dict]]:
    """Graph id -> node id -> node, as Model Explorer's own MLIR adapter builds them."""
    from model_explorer.builtin_mlir_adapter import BuiltinMlirAdapter
    graphs = BuiltinMlirAdapter().convert(path, {})
    out = {}
    for coll in graphs["graphCollections"]:
        for g in coll.graphs:
            out[g["id"]] = {n["id"]: n for n in g["nodes"]}
    return out


def is_op_node(nid: str) -> bool:
    """Not a function argument (``arg<i>``) nor a region input (``pid<n>_arg<i>``)."""
    return not (nid.startswith("arg") or "_arg" in nid)


def load_back(ndb, path: str):
    """The JSON file read back into Model Explorer's classes (a key they do not have fails)."""
    raw = json.load(open(path))

    def graph(d):
        d = dict(d)
        d["results"] = {k: ndb.NodeDataResult(**v) for k, v in d["results"].items()}
        d["thresholds"] = [ndb.ThresholdItem(**t) for t in d.get("thresholds", [])]
        d["gradient"] = [ndb.GradientItem(**g) for g in d.get("gradient", [])]
        return ndb.GraphNodeData(**d)

    return ndb.ModelNodeData(graphsData={g: graph(v) for g, v in raw.items()})


# ---------------------------------------------------------------------------------------------
# The files and the overlays
# ---------------------------------------------------------------------------------------------

def test_the_files_written(block):
    opt, before, written = block
    assert set(written) == {"before", "after", *mex.OVERLAYS}
    assert open(written["before"]).read() == before
    assert open(written["after"]).read() == opt.text_with_locations()
    d = os.path.dirname(written["after"])
    assert sorted(os.listdir(d)) == sorted(os.path.basename(p) for p in written.values())
    cmd = mex.open_command(written)
    assert cmd.startswith(f"model-explorer {written['after']} --node_data_paths=")
    assert cmd.count(".json") == len(mex.OVERLAYS)


def test_overlays_load_back_through_model_explorer_classes(ndb, block):
    _, _, written = block
    for name in mex.OVERLAYS:
        data = load_back(ndb, written[name])
        # exactly what Model Explorer's own save_to_file writes for these objects
        assert data.to_json_string(indent=2) == open(written[name]).read(), name
        for g in data.graphsData.values():
            for res in g.results.values():
                want = (int, float) if name in ("region", "bytes_saved", "time_ratio") else str
                assert isinstance(res.value, want), (name, res)


def test_overlay_values_say_what_was_done(ndb, block):
    opt, _, written = block
    r = opt.report
    kernel = load_back(ndb, written["kernel"]).graphsData
    values = {v.value for g in kernel.values() for v in g.results.values()}
    assert {k.kernel for k in r.kernels} <= values
    assert {mex.XLA, mex.REFUSED} <= values
    main = kernel["main"].results
    # one call node per region in main (kernel or left to XLA), with its region id
    region = load_back(ndb, written["region"]).graphsData["main"].results
    assert sorted(v.value for v in region.values()) == sorted(
        x.id for x in r.regions if "merged_into" not in x.extra)
    for nid, res in region.items():
        x = r.region(res.value)
        assert main[nid].value == (x.kernel if x.kernel else mex.REFUSED)
    # why a region was refused, on its call and on every op inside its function
    refused = load_back(ndb, written["refused"]).graphsData
    reasons = {v.value for g in refused.values() for v in g.results.values()}
    assert reasons == {x.reason for x in r.left_to_xla}
    xla_func = r.left_to_xla[0].extra["func"]
    assert refused[xla_func].results and len(refused[xla_func].results) == len(kernel[xla_func].results)
    # bytes saved on the calls: the report's numbers
    saved = load_back(ndb, written["bytes_saved"]).graphsData["main"].results
    assert {nid: v.value for nid, v in saved.items()} == {
        nid: r.region(res.value).bytes_saved for nid, res in region.items()}
    assert sum(v.value for v in saved.values()) == r.bytes_saved > 0
    # nothing measured here (hlofuse.optimize does not tune): no time ratio
    assert not any(g.results for g in load_back(ndb, written["time_ratio"]).graphsData.values())


def test_measured_time_ratio(ndb, block):
    """Where tuning measured a region (``extra['measured']``, as hlofuse.jit's report_decision
    and the cached decisions write it), its call carries kernel time / XLA time."""
    opt, _, _ = block
    r = opt.report
    k, x = r.kernels[0], r.left_to_xla[0]
    rep = dataclasses.replace(r, regions=[dataclasses.replace(g, extra=dict(g.extra)) for g in r.regions])
    rep.region(k.id).extra["measured"] = "kept kernel: 0.62x of XLA's time, measured"
    rep.region(x.id).extra["measured"] = "kept XLA: kernel 1.35x slower, measured (cached decision)"
    ratio = mex.overlays(rep, opt.text_with_locations())["time_ratio"].graphsData["main"].results
    region = mex.overlays(rep, opt.text_with_locations())["region"].graphsData["main"].results
    assert {region[nid].value: v.value for nid, v in ratio.items()} == {k.id: 0.62, x.id: 1.35}
    assert mex.measured_ratio(Region(0, "x", [], extra={"measured": "kept kernel: XLA compiles it "
                              "to the same program as the region's own ops (measured: identical "
                              "HLO)"})) == 1.0
    assert mex.measured_ratio(Region(0, "x", [])) is None


# ---------------------------------------------------------------------------------------------
# Node ids: the ones Model Explorer's adapter gives the nodes of the written .mlir
# ---------------------------------------------------------------------------------------------

def test_overlay_node_ids_are_the_nodes_model_explorer_shows(ndb, block):
    opt, _, written = block
    graphs = me_graphs(written["after"])
    ops = {g: {nid for nid in nodes if is_op_node(nid)} for g, nodes in graphs.items()}
    assert set(graphs) == {"main"} | {k.extra["func"] for k in opt.report.left_to_xla} | {
        g for g in graphs if g.startswith("hlofuse_k")}
    for name in mex.OVERLAYS:
        data = load_back(ndb, written[name]).graphsData
        assert set(data) == set(graphs), name
        for g, d in data.items():
            assert set(d.results) <= ops[g], (name, g, set(d.results) - ops[g])
    # every op node has a kernel/XLA value, and the calls are the func.call nodes
    kernel = load_back(ndb, written["kernel"]).graphsData
    assert all(set(kernel[g].results) == ops[g] for g in graphs)
    region = load_back(ndb, written["region"]).graphsData["main"].results
    for nid in region:
        node = graphs["main"][nid]
        assert node["label"] == "func.call"
        callee = {a["key"]: a["value"] for a in node["attrs"]}["callee"].lstrip("@")
        assert node["subgraphIds"] == [callee]


@pytest.mark.parametrize("name", ["transformer_block", "while_loop", "cond", "scan", "sort",
                                  "scatter", "argmax", "linalg_custom_call"])
def test_node_ids_match_the_adapter(ndb, tmp_path, name):
    """:func:`node_ids` numbers ops as the adapter does, nested regions (loop bodies, reduce and
    sort bodies, branches) included, before and after optimization."""
    before = lowered_text(name)
    opt = hlofuse.optimize(before, target="cpu")
    for label, text in (("before", before), ("after", opt.text_with_locations())):
        path = tmp_path / f"{label}.mlir"
        path.write_text(text)
        graphs = me_graphs(str(path))
        ours = mex.node_ids(text)
        assert set(ours) == set(graphs), label
        for g, nodes in ours.items():
            theirs = {nid: n["label"] for nid, n in graphs[g].items() if is_op_node(nid)}
            assert [nid for nid, _ in nodes] == sorted(theirs, key=int), (label, g)
            for nid, op in nodes:  # the adapter labels a terminator "Outputs"
                assert theirs[nid] in (op, "Outputs"), (label, g, nid, op, theirs[nid])


def test_attribute_names_match_the_passes():
    """The attributes the overlays read are the ones the passes write (core imports no pass)."""
    from hlofuse.passes import kernelize
    from hlofuse.passes.fusion import outline
    assert mex.KERNEL_INFO_ATTR == kernelize.KERNEL_INFO_ATTR
    assert (mex.REGION_ATTR, mex.XLA_ATTR, mex.KERNEL_PREFIX) == (
        outline.REGION_ATTR, outline.XLA_ATTR, outline.KERNEL_PREFIX)


def test_report_of_hlofuse_jit(ndb, tmp_path):
    """``lower(...).report`` of ``hlofuse.jit``, with the texts given as arguments."""
    p = PROGRAM["mlp"]
    args = p.args(np.random.default_rng(0))
    lowered = hlofuse.jit(p.fn).lower(*args)
    before = jax.jit(p.fn).lower(*args).as_text(debug_info=True)
    written = lowered.report.to_model_explorer(str(tmp_path), after=lowered.as_text(debug_info=True),
                                               before=before)
    graphs = me_graphs(written["after"])
    kernel = load_back(ndb, written["kernel"]).graphsData
    assert {k.kernel for k in lowered.report.kernels} <= {
        v.value for g in kernel.values() for v in g.results.values()}
    for g, d in kernel.items():
        assert set(d.results) == {nid for nid in graphs[g] if is_op_node(nid)}


# ---------------------------------------------------------------------------------------------
# Without the package; writing atomically; the command line
# ---------------------------------------------------------------------------------------------

def test_without_model_explorer_the_error_names_the_extra(monkeypatch, tmp_path, capsys):
    from hlofuse.cli import main as cli_main
    monkeypatch.setitem(sys.modules, "model_explorer", None)
    with pytest.raises(ImportError, match=r"pip install hlofuse\[explorer\]"):
        mex.require()
    with pytest.raises(ImportError, match=r"hlofuse\[explorer\]"):
        Report().to_model_explorer(str(tmp_path / "g"), after="module {}")
    src = tmp_path / "in.mlir"
    src.write_text("module {}")
    code = cli_main._dispatch(["hlofuse", "optimize", str(src), "-o", str(tmp_path / "out.mlir"),
                               "--graph", str(tmp_path / "g")])
    err = capsys.readouterr().err
    assert code == 2 and "--graph" in err and "pip install hlofuse[explorer]" in err, err
    assert sorted(os.listdir(tmp_path)) == ["in.mlir"]   # refused before any work


def test_a_failed_write_leaves_the_old_file_and_no_temporary(ndb, block, tmp_path, monkeypatch):
    opt, _, _ = block
    (tmp_path / "after.mlir").write_text("old")

    def fail(src, dst):
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(os, "replace", fail)
    with pytest.raises(OSError):
        opt.to_model_explorer(str(tmp_path))
    assert os.listdir(tmp_path) == ["after.mlir"]
    assert (tmp_path / "after.mlir").read_text() == "old"


def cli(*args, cwd):
    return subprocess.run([sys.executable, "-m", "hlofuse.cli.main", *map(str, args)], cwd=cwd,
                          capture_output=True, text=True, timeout=300)


def test_cli_graph_writes_the_files(ndb, tmp_path):
    src = tmp_path / "block.mlir"
    src.write_text(lowered_text("transformer_block"))
    data, mtime = src.read_bytes(), src.stat().st_mtime_ns
    proc = cli("optimize", src, "-o", tmp_path / "out.mlir", "--graph", tmp_path / "g", cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    g = tmp_path / "g"
    assert sorted(os.listdir(g)) == sorted(["before.mlir", "after.mlir"] +
                                           [f"after.{k}.json" for k in mex.OVERLAYS])
    assert f"open them with: model-explorer {g}/after.mlir --node_data_paths=" in proc.stdout
    # the graph shows the regions left to XLA as the functions fusion made; the output is
    # that module in the form XLA compiles, those regions inline again (outline.executable_module)
    after, out = (g / "after.mlir").read_text(), (tmp_path / "out.mlir").read_text()
    left = f'{mex.XLA_ATTR} = "'   # the attribute (kernels' stored originals quote it escaped)
    assert left in after and left not in out
    assert hir.to_text(executable_module(hir.parse(after)), debug_info=True) == out
    assert src.read_bytes() == data and src.stat().st_mtime_ns == mtime
    graphs = me_graphs(str(g / "after.mlir"))
    kernel = load_back(ndb, str(g / "after.kernel.json")).graphsData
    assert {v.value for v in kernel["main"].results.values()} >= {mex.REFUSED}
    assert all(set(d.results) == {n for n in graphs[k] if is_op_node(n)} for k, d in kernel.items())


def test_cli_graph_never_overwrites_the_input(ndb, tmp_path, capsys):
    from hlofuse.cli import main as cli_main
    src = tmp_path / "before.mlir"   # the name of a graph file, in the graph directory
    src.write_bytes(open(os.path.join(os.path.dirname(hlofuse.__file__), "examples",
                                      "mlp_block.mlir"), "rb").read())
    data = src.read_bytes()
    code = cli_main._dispatch(["hlofuse", "optimize", str(src), "-o", str(tmp_path / "out.mlir"),
                               "--graph", str(tmp_path)])
    err = capsys.readouterr().err
    assert code == 2 and "--graph" in err and "would overwrite" in err and str(src) in err, err
    assert src.read_bytes() == data
    assert sorted(os.listdir(tmp_path)) == ["before.mlir"]   # nothing written, -o included
    code = cli_main._dispatch(["hlofuse", "optimize", str(src), "-o", str(tmp_path / "out.mlir"),
                               "--graph", str(src)])
    assert code == 2 and "exists and is not a directory" in capsys.readouterr().err


def test_cli_graph_writes_atomically(ndb, tmp_path, monkeypatch, capsys):
    """Each graph file goes through formats.atomic_write with the input protected; a write that
    fails leaves the old file and no temporary."""
    from hlofuse.cli import main as cli_main
    src = tmp_path / "in.mlir"
    src.write_bytes(open(os.path.join(os.path.dirname(hlofuse.__file__), "examples",
                                      "mlp_block.mlir"), "rb").read())
    g = tmp_path / "g"
    g.mkdir()
    (g / "after.mlir").write_text("old")
    calls = []
    real = formats.atomic_write

    def spy(path, data, **kw):
        calls.append((os.path.basename(path), kw.get("inputs")))
        return real(path, data, **kw)

    monkeypatch.setattr(formats, "atomic_write", spy)
    real_replace = os.replace

    def replace(a, b):
        if os.path.basename(b) == "after.mlir" and os.path.dirname(b) == str(g):
            raise OSError(28, "No space left on device")
        return real_replace(a, b)

    monkeypatch.setattr(os, "replace", replace)
    code = cli_main._dispatch(["hlofuse", "optimize", str(src), "-o", str(tmp_path / "out.mlir"),
                               "--graph", str(g)])
    err = capsys.readouterr().err
    assert code == 2 and "after.mlir: cannot write: No space left on device" in err, err
    assert (g / "after.mlir").read_text() == "old"
    assert not [f for f in os.listdir(g) if f.endswith(".tmp")]
    assert ("after.mlir", [str(src), str(tmp_path / "out.mlir")]) in calls
    monkeypatch.setattr(os, "replace", real_replace)
    assert cli_main._dispatch(["hlofuse", "optimize", str(src), "-o", str(tmp_path / "out.mlir"),
                               "--graph", str(g)]) == 0
    written = {name for name, _ in calls}
    assert written >= {"before.mlir", "after.mlir"} | {f"after.{k}.json" for k in mex.OVERLAYS}
    assert all(inputs and str(src) in inputs for name, inputs in calls if name != "out.mlir")
    assert (g / "after.mlir").read_text() == (tmp_path / "out.mlir").read_text()


# ---------------------------------------------------------------------------------------------
# The web app in headless Chromium
# ---------------------------------------------------------------------------------------------

BROWSERS = ("chromium", "chromium-browser", "google-chrome")
#: CI (``.ci/run``) installs Debian's chromium and sets this to 1: there the browser test must run
REQUIRE_CHROMIUM = "HLOFUSE_REQUIRE_CHROMIUM"

SERVER = textwrap.dedent("""
    import sys
    import model_explorer
    from model_explorer import server
    server._check_new_version = lambda *a, **k: {"version": "", "runningVersion": "",
                                                 "releaseUrl": "", "desktopAppUrl": ""}  # offline
    cfg = model_explorer.config().add_model_from_path(sys.argv[2])
    for p in sys.argv[3:]:
        cfg.add_node_data_from_path(p)
    model_explorer.visualize_from_config(cfg, host="127.0.0.1", port=int(sys.argv[1]),
                                         no_open_in_browser=True)
""")


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _png_colors(path: str) -> set:
    """The RGB colors of an 8-bit RGB/RGBA PNG (what Chromium's screenshots are)."""
    import struct
    import zlib
    raw = open(path, "rb").read()
    pos, idat, width = 8, b"", 0
    while pos < len(raw):
        n, kind = struct.unpack(">I4s", raw[pos:pos + 8])
        chunk = raw[pos + 8:pos + 8 + n]
        if kind == b"IHDR":
            width, height, depth, ctype = struct.unpack(">IIBB", chunk[:10])
            assert depth == 8 and ctype in (2, 6), (depth, ctype)
            bpp = 3 if ctype == 2 else 4
        elif kind == b"IDAT":
            idat += chunk
        pos += 12 + n
    data, stride = zlib.decompress(idat), width * bpp
    prev, colors = bytearray(stride), set()
    for y in range(height):
        f, line = data[y * (stride + 1)], bytearray(data[y * (stride + 1) + 1:(y + 1) * (stride + 1)])
        for i in range(stride):
            a = line[i - bpp] if i >= bpp else 0
            b, c = prev[i], (prev[i - bpp] if i >= bpp else 0)
            if f == 1:
                line[i] = (line[i] + a) & 255
            elif f == 2:
                line[i] = (line[i] + b) & 255
            elif f == 3:
                line[i] = (line[i] + (a + b) // 2) & 255
            elif f == 4:
                p = a + b - c
                pa, pb, pc = abs(p - a), abs(p - b), abs(p - c)
                line[i] = (line[i] + (a if pa <= pb and pa <= pc else b if pb <= pc else c)) & 255
        colors.update(bytes(line[i:i + 3]) for i in range(0, stride, bpp))
        prev = line
    return colors


class Chromium:
    """Headless Chromium driven over its DevTools pipe (``--remote-debugging-pipe``: JSON
    messages separated by NUL on file descriptors 3 and 4), so no client library is needed."""

    def __init__(self, browser: str, url: str, profile: str):
        cmd_r, self._w = os.pipe()      # our commands -> its fd 3
        self._r, out_w = os.pipe()      # its fd 4 -> our replies
        # posix_spawn, not fork: this process runs JAX's threads
        self.pid = os.posix_spawn(browser, [
            browser, "--headless", "--no-sandbox", "--disable-gpu", "--use-gl=swiftshader",
            "--enable-unsafe-swiftshader", "--window-size=1600,1000", "--no-first-run",
            f"--user-data-dir={profile}", "--remote-debugging-pipe", url], dict(os.environ),
            file_actions=[(os.POSIX_SPAWN_DUP2, cmd_r, 3), (os.POSIX_SPAWN_DUP2, out_w, 4),
                          (os.POSIX_SPAWN_OPEN, 1, os.devnull, os.O_WRONLY, 0),
                          (os.POSIX_SPAWN_OPEN, 2, os.devnull, os.O_WRONLY, 0)])
        os.close(cmd_r)
        os.close(out_w)
        self._buf, self._n, self.session = b"", 0, None
        page = next(t for t in self.call("Target.getTargets")["targetInfos"] if t["type"] == "page")
        self.session = self.call("Target.attachToTarget", targetId=page["targetId"],
                                 flatten=True)["sessionId"]

    def call(self, method: str, timeout: float = 30, **params):
        import select
        self._n += 1
        msg = {"id": self._n, "method": method, "params": params}
        if self.session and not method.startswith(("Target.", "Browser.")):
            msg["sessionId"] = self.session
        os.write(self._w, json.dumps(msg).encode() + b"\0")
        end = time.monotonic() + timeout
        while True:
            while b"\0" in self._buf:
                raw, self._buf = self._buf.split(b"\0", 1)
                reply = json.loads(raw)
                if reply.get("id") == self._n:
                    assert "error" not in reply, reply["error"]
                    return reply["result"]
            left = end - time.monotonic()
            assert left > 0 and select.select([self._r], [], [], left)[0], f"{method} timed out"
            chunk = os.read(self._r, 1 << 20)
            assert chunk, "Chromium closed its DevTools pipe"
            self._buf += chunk

    def text(self) -> str:
        return self.call("Runtime.evaluate", expression="document.body.innerText",
                         returnByValue=True)["result"].get("value", "")

    def close(self) -> None:
        try:
            self.call("Browser.close", timeout=10)
        except AssertionError:
            pass
        for _ in range(100):
            if os.waitpid(self.pid, os.WNOHANG)[0]:
                break
            time.sleep(0.1)
        else:
            os.kill(self.pid, 9)
            os.waitpid(self.pid, 0)
        os.close(self._w)
        os.close(self._r)


def test_model_explorer_shows_the_graph_and_the_overlay_in_chromium(ndb, block, tmp_path):
    """Model Explorer's own server (loopback) and web app open after.mlir with the kernel
    overlay: the page lists the graph and the overlay, and paints kernel nodes its color."""
    import base64
    browser = next((shutil.which(b) for b in BROWSERS if shutil.which(b)), None)
    if browser is None:
        if os.environ.get(REQUIRE_CHROMIUM) == "1":   # CI installed it: its absence is a failure
            pytest.fail(f"{REQUIRE_CHROMIUM}=1 but no Chromium ({', '.join(BROWSERS)}) on PATH")
        pytest.skip(f"no Chromium ({', '.join(BROWSERS)} not on PATH): install the Debian package "
                    f"chromium to open Model Explorer's web app headless")
    opt, _, written = block
    port = _free_port()
    server = subprocess.Popen([sys.executable, "-c", SERVER, str(port), written["after"],
                               written["kernel"]], stdout=subprocess.PIPE,
                              stderr=subprocess.STDOUT, text=True)
    chrome = None
    try:
        url = None
        deadline = time.monotonic() + 60
        while url is None and time.monotonic() < deadline:
            line = server.stdout.readline()
            if not line and server.poll() is not None:
                pytest.fail("Model Explorer's server exited")
            if line.startswith(f"http://127.0.0.1:{port}/"):
                url = line.strip()
        assert url, "Model Explorer's server did not start"
        assert urllib.request.urlopen(f"http://127.0.0.1:{port}/check_health",
                                      timeout=10).read() == b"model_explorer_ok"
        chrome = Chromium(browser, url, str(tmp_path / "profile"))
        overlay = "hlofuse: kernel or XLA"    # the overlay's GraphNodeData.name
        deadline, text = time.monotonic() + 60, ""
        while time.monotonic() < deadline:
            text = chrome.text()
            if overlay in text and "Processing" not in text and "Converting" not in text:
                break
            time.sleep(0.25)
        graphs = set(mex.node_ids(opt.text_with_locations()))
        assert "after.mlir" in text and overlay in text, text[-3000:]
        assert any(g in text for g in graphs), text[-3000:]      # a graph of the module shown
        assert any(k.kernel in text for k in opt.report.kernels), text[-3000:]  # overlay values
        time.sleep(1)   # the canvas draws after the panels
        shot = tmp_path / "page.png"
        shot.write_bytes(base64.b64decode(chrome.call("Page.captureScreenshot")["data"]))
    finally:
        if chrome is not None:
            chrome.close()
        server.terminate()
        server.wait(timeout=30)
    colors = _png_colors(str(shot))
    assert bytes.fromhex(mex.KERNEL_COLOR[1:]) in colors, "no node painted the kernel color"
