"""The benchmark harness end to end on the tiny workload (quick mode); no timing assertions."""

import json
import math
import struct
import zlib

import numpy as np
import pytest

from bench import __main__ as cli
from bench import png, runner, workloads


@pytest.fixture(scope="module")
def quick_run(tmp_path_factory):
    d = tmp_path_factory.mktemp("bench")
    mp = pytest.MonkeyPatch()
    mp.setenv("HLOFUSE_CACHE_DIR", str(d / "cache"))  # children inherit it; keep ~/.cache clean
    out = {k: str(d / f"out.{k}") for k in ("json", "md", "png")}
    try:
        rc = cli.main(["--quick", "--models", "tiny", "--rounds", "3", "--rss",
                       "--json", out["json"], "--markdown", out["md"], "--plot", out["png"]])
    finally:
        mp.undo()
    return rc, out


def test_json_structure(quick_run):
    rc, out = quick_run
    assert rc == 0
    data = json.load(open(out["json"]))
    meta = data["meta"]
    assert {"jax", "jaxlib", "python", "numpy", "hlofuse"} <= set(meta["versions"])
    assert meta["device"]["platform"] == "cpu" and meta["device"]["measured"] == "cpu"
    assert meta["config"]["rounds"] == 3
    (r,) = data["results"]
    assert r["name"] == "tiny" and "error" not in r
    lat = r["latency"]
    assert lat["rounds"] == 3 and len(lat["per_round"]) == 3
    for key in ("jax_median_s", "hlofuse_median_s", "median_ratio", "ratio_p25", "ratio_p75"):
        assert math.isfinite(lat[key]) and lat[key] > 0, key
    for rnd in lat["per_round"]:
        assert math.isfinite(rnd["ratio"]) and rnd["ratio"] > 0
        # the foreign-load value itself: tests/test_autotune.py (a live one is clipped at 0)
        assert isinstance(rnd["flagged"], bool) and isinstance(rnd["foreign_load"], float)
    assert r["first_call_jax_s"] > 0 and r["first_call_hlofuse_s"] > 0
    assert r["numerics"]["max_rel_diff"] < 1e-4
    # compiled-executable analyses of both, hlofuse report, modeled (labelled) figures
    for side in ("jax_compiled", "hlofuse_compiled"):
        assert r[side]["flops"] > 0 and r[side]["bytes_accessed"] > 0
        assert "temp_bytes" in r[side]["memory_analysis"]
        assert r[side]["hlo"]["fusions_total"] >= 1
    # tanh(x @ w + b): one matmul-epilogue kernel on cpu, nothing left to XLA
    rep = r["hlofuse_report"]
    assert rep["kernels"] == 1 and rep["regions_left_to_xla"] == 0, rep
    assert rep["kernel_names"][0].startswith("hlofuse_matmul_epilogue_"), rep
    assert r["modeled"]["gpu"]["label"] == "modeled"
    assert "modeled_bytes_fused" in r["modeled"]["gpu"], r["modeled"]["gpu"]
    # fresh-process peak RSS of one call, both sides
    for impl in ("jax", "hlofuse"):
        assert r["peak_rss"][impl].get("peak_rss", 0) > 0, r["peak_rss"][impl]
    assert r["autotune"] is None or r["autotune"]["variant"] in ("default", "ynn-off",
                                                                   "ynn-individual-dot")


def test_markdown_and_png(quick_run):
    _, out = quick_run
    md = open(out["md"]).read()
    assert "| tiny |" in md and "python -m bench --quick" in md and "modeled" in md
    blob = open(out["png"], "rb").read()
    assert blob[:8] == b"\x89PNG\r\n\x1a\n"
    w, h = struct.unpack(">II", blob[16:24])
    # decode IDAT and check every row is present (filter byte + 3 bytes per pixel)
    pos, idat = 8, b""
    while pos < len(blob):
        n = struct.unpack(">I", blob[pos:pos + 4])[0]
        tag = blob[pos + 4:pos + 8]
        if tag == b"IDAT":
            idat += blob[pos + 8:pos + 8 + n]
        assert zlib.crc32(blob[pos + 4:pos + 8 + n]) & 0xFFFFFFFF == \
            struct.unpack(">I", blob[pos + 8 + n:pos + 12 + n])[0]
        pos += 12 + n
    assert len(zlib.decompress(idat)) == h * (1 + 3 * w)


def test_table_marks_slower_and_goals():
    fake = {"name": "bert_s128", "latency": {"jax_median_s": 0.1, "hlofuse_median_s": 0.09,
                                             "median_ratio": 0.9, "ratio_p25": 0.88,
                                             "ratio_p75": 0.92, "flagged_rounds": 0, "rounds": 20},
            "first_call_jax_s": 1.0, "first_call_hlofuse_s": 2.0, "hlofuse_report": {"kernels": 3},
            "numerics": {"max_rel_diff": 0.0}}
    rows = cli.rows_for_table([fake, dict(fake, name="mlp_3x4096", latency=dict(
        fake["latency"], median_ratio=1.1))], "cpu")
    assert rows[1][-1] == "goal met (<=1.0)" and rows[2][-1] == "SLOWER"


def test_load_probe_and_fusion_counts():
    with runner.LoadProbe() as p:
        sum(range(10000))
    assert p.wall > 0 and 0 <= p.foreign
    text = ('%f = f32[2] fusion(%a), kind=kLoop, calls=%c\n'
            '%g = f32[2] fusion(%a), kind=kCustom, calls=%d, backend_config={"fusion_config":'
            '{"kind":"__ynn_fusion"}}\nENTRY %main {\n %h = f32[2] dot(%a, %b)\n}')
    c = runner.fusion_counts(text)
    assert c["fusions"] == {"kLoop": 1, "kCustom": 1} and c["ynn_fusions"] == 1
    assert c["dots_outside_fusion"] == 1


def test_workloads_are_well_formed():
    assert set(workloads.DEFAULT) <= set(workloads.WORKLOADS)
    for name in ("bert_s128", "resnet_nchw", "llama_block", "attn_s2048"):
        w = workloads.get(name)
        assert w.description and w.group
    with pytest.raises(KeyError, match="unknown workload"):
        workloads.get("nope")


def test_png_writer_roundtrip(tmp_path):
    img = np.zeros((3, 4, 3), np.uint8)
    img[1, 2] = (255, 0, 0)
    png.write_png(str(tmp_path / "x.png"), img)
    blob = (tmp_path / "x.png").read_bytes()
    raw = zlib.decompress(blob[blob.index(b"IDAT") + 4:blob.index(b"IEND") - 8])
    rows = np.frombuffer(raw, np.uint8).reshape(3, 1 + 12)
    assert (rows[:, 0] == 0).all() and tuple(rows[1, 1 + 6:1 + 9]) == (255, 0, 0)


def test_xla_module_decision_is_known_to_run_jax_executable(tmp_path, monkeypatch):
    """A signature autotune decided to run XLA's own module: the bench checks (optimized HLO)
    that it is jax.jit's executable, and says so instead of reporting a loss."""
    import jax
    import jax.numpy as jnp
    import hlofuse
    from hlofuse.runtime import autotune as at

    monkeypatch.setenv(at.ENV_CACHE_DIR, str(tmp_path))
    at.cache().clear_memory()

    def f(x):
        return jnp.tanh(x * 2.0).sum(-1) + jnp.exp(x).max(-1)

    x = jnp.ones((64, 128), jnp.float32)
    try:
        hf = hlofuse.jit(f, autotune="cached")
        hf(x)
        entry = hf.lower(x)._entry
        at.cache().put(hf._decision_key(entry), at.Decision(at.XLA_MODULE, {}, {}))
        hf = hlofuse.jit(f, autotune="cached")
        hf(x)
        dec = hf.autotune_decision(x)
        assert dec.xla_module
        assert runner.runs_jax_executable(hf, jax.jit(f), (x,), dec)
        assert not runner.runs_jax_executable(hf, jax.jit(f), (x,), at.Decision("default", {}, {}))
        compiled, opts = runner.hlofuse_compiled(hf, (x,))
        assert opts == {} and (at._normalized_hlo(compiled)
                               == at._normalized_hlo(jax.jit(f).lower(x).compile()))
    finally:
        at.cache().clear_memory()
    r = {"name": "tiny", "latency": {"median_ratio": 1.03}, "same_optimized_hlo": True}
    assert cli._status(r, "cpu") == "same program (noise)"
    assert cli._status(dict(r, same_optimized_hlo=False), "cpu") == "SLOWER"


def test_legs_flags_a_worse_ratio_and_a_model_correct_in_one_run_only(tmp_path, capsys):
    """bench.legs: two releases' runs side by side (issue 44); a ratio more than 3% worse on
    the newer one and a model correct in one run only are flagged, --strict exits 1 then."""
    import json
    from bench import legs

    def run(path, jax_version, rows):
        results = [{"name": n, "latency": {"median_ratio": r}, "correct": c} for n, r, c in rows]
        path.write_text(json.dumps({"meta": {"versions": {"jax": jax_version, "python": "3.13.0"}},
                                    "results": results}))
        return str(path)
    old = run(tmp_path / "old.json", "0.10.2", [("a", 0.50, True), ("b", 1.00, True), ("c", 0.8, True)])
    new = run(tmp_path / "new.json", "0.12.0.1", [("a", 0.60, True), ("b", 1.01, True), ("c", 0.8, False)])
    text, flagged = legs.compare(old, new)
    lines = {line.split()[0]: line for line in text.splitlines()[1:-1]}
    assert "worse" in lines["a"] and "1.200" in lines["a"]
    assert "worse" not in lines["b"] and "one run only" not in lines["b"]
    assert "correct in one run only" in lines["c"] and "yes/NO" in lines["c"]
    assert flagged == 2 and "jax 0.10.2" in text and "jax 0.12.0.1" in text
    assert legs.main([old, new]) == 0 and legs.main([old, new, "--strict"]) == 1
    capsys.readouterr()


@pytest.mark.parametrize("peak,capacity,base", [
    (lambda b: 100 + 10 * b, 1000, 4),                       # linear: 90
    (lambda b: 100 + 10 * (-(-b // 8) * 8), 1000, 4),        # padded to multiples of 8: 88
    (lambda b: 1000 + 10 * b + b * b // 20, 5000, 8),        # growing faster than linear: 204
    (lambda b: 100 + 10 * b, 1000, 200),                     # the base batch does not fit: 0
    (lambda b: 100 + 10 * b, 1000, 50),                      # twice the base does not fit: 90
])
def test_largest_batch_search_finds_the_boundary(peak, capacity, base):
    """``bench --memory --largest-batch``'s search (each peak is a compile there): the largest
    batch whose peak fits, found in a handful of evaluations."""
    from bench.memory import largest_batch
    calls = []
    best, tried, exact = largest_batch(lambda b: calls.append(b) or peak(b), base, capacity)
    assert exact
    want = max([b for b in range(1, 1000) if peak(b) <= capacity], default=0)
    want = want if peak(base) <= capacity else 0
    assert best == want, (best, tried)
    assert len(calls) == len(set(calls)) <= 12 and [b for b, _ in tried] == sorted(set(calls))
    if best:
        assert peak(best) <= capacity < peak(best + 1) and (best + 1) in calls


def test_gemm_ceiling_counts_the_products_hlofuse_computes():
    """The floor under a CPU goal counts every dot and convolution of jax.jit's program, the
    3x3 stride-1 convolutions at Winograd F(2x2, 3x3)'s multiplies (2.25x fewer)."""
    import jax
    import jax.numpy as jnp
    from bench import workloads
    from bench.gemm_ceiling import contraction_flops

    def text(name):
        wl = workloads.get(name)
        args = jax.tree.map(jnp.asarray, wl.make_args(np.random.default_rng(0)))
        return jax.jit(wl.fn).lower(*args).as_text()
    total, fewest = contraction_flops(text("attn_s2048"))
    assert total == fewest == 2 * (2 * 1 * 8 * 2048 * 2048 * 64)     # Q.K^T and P.V
    total, fewest = contraction_flops(text("resnet_nhwc"))
    three = 3 * 2 * 56 * 56 * 64 * 64 * 9                              # one 3x3 conv per block
    ones = 2 * 56 * 56 * (64 * 64 + 64 * 256 + 64 * 256 + 2 * (256 * 64 + 64 * 256))
    assert total == three + ones
    assert fewest == pytest.approx(ones + three / 2.25)


def test_winograd_accuracy_backs_the_choice_of_f2x2():
    """``bench.winograd_accuracy``: the F(4x4, 3x3) reference it measures is a correct
    convolution (close to float64), F(2x2, 3x3) (hlofuse's kernel) stays well inside the
    ``reassociate`` tolerance, and F(4x4, 3x3) on Lavin and Gray's points does not: the reason
    the CPU pipeline stops at the smaller tile (docs/performance.md)."""
    from bench.winograd_accuracy import measure
    rows = {r["algorithm"]: r for r in measure(shapes=((16, 128, 128),))}
    assert rows["direct (jax.jit)"]["tolerance_used"] == 0.0
    assert rows["F(2x2,3x3)"]["tolerance_used"] < 0.4
    assert all(r["error"] < 1e-4 for r in rows.values())             # every one a convolution
    assert rows["F(4x4,3x3)"]["tolerance_used"] > 1.0
    assert rows["F(4x4,3x3)"]["error"] > 3 * rows["direct (jax.jit)"]["error"]
