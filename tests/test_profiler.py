"""hlofuse in ``jax.profiler`` traces (issue 48, item 4): a trace a user records around calls
of an ``hlofuse.jit`` function holds hlofuse's own work as named events, with arguments that
say which function, pass, kernel (and the user's source line it came from) or tuning round."""

from __future__ import annotations

import glob

import numpy as np
import pytest

import jax
import jax.numpy as jnp

import hlofuse
from hlofuse.runtime import autotune as at


def _f(x, w):
    h = jnp.tanh(x @ w) * 2.0 + 1.0
    return jax.nn.softmax(h, -1).sum(0) + jnp.mean(h * h)


def _events(log_dir) -> list[tuple[str, dict]]:
    (path,) = glob.glob(f"{log_dir}/**/*.xplane.pb", recursive=True)
    out = []
    for plane in jax.profiler.ProfileData.from_file(path).planes:
        for line in plane.lines:
            for ev in line.events:
                if ev.name.startswith("hlofuse/"):
                    out.append((ev.name, {k: v for k, v in ev.stats}))
    return out


@pytest.fixture
def tuning(tmp_path, monkeypatch):
    monkeypatch.setenv("HLOFUSE_CACHE_DIR", str(tmp_path / "cache"))
    monkeypatch.setenv("HLOFUSE_XLA_CACHE", "0")
    monkeypatch.setenv(at.ENV_ENABLE, "on")
    monkeypatch.setenv(at.ENV_BUDGET, "3")
    at.cache().clear_memory()
    yield
    at.cache().clear_memory()


@pytest.mark.filterwarnings("ignore:builtin type event_stats:DeprecationWarning")
def test_a_recorded_trace_shows_hlofuse_work_by_name(tmp_path, tuning):
    rng = np.random.default_rng(0)
    x = rng.standard_normal((768, 512)).astype(np.float32)
    w = (rng.standard_normal((512, 512)) * 0.05).astype(np.float32)
    g = hlofuse.jit(_f, tiered=True)
    with jax.profiler.trace(str(tmp_path / "trace")):
        for i in range(4):
            g(x, w).block_until_ready()
            if i == 0:
                g.block_until_optimized(60)
    events = _events(tmp_path / "trace")
    names = {n for n, _ in events}
    assert {"hlofuse/tiered build", "hlofuse/build", "hlofuse/pipeline", "hlofuse/tune",
            "hlofuse/tune compile", "hlofuse/tune round"} <= names, sorted(names)
    passes = {n[len("hlofuse/pass "):] for n in names if n.startswith("hlofuse/pass ")}
    report = g.report(x, w)
    assert {p.name for p in report.passes if not p.disabled} <= passes, passes
    args = {n: a for n, a in events}
    assert args["hlofuse/build"]["function"] == "_f"
    assert args["hlofuse/build"]["inputs"] == "float32[768, 512] float32[512, 512]"
    assert args["hlofuse/pass cse"]["source"] == "_f"
    # each kernel built: its region kind, region id and the user's source line
    kernels = [(n, a) for n, a in events if n.startswith("hlofuse/kernel ")]
    built = {n for n, _ in kernels}
    # (tuning may leave a built kernel's region to XLA afterwards: it was still built)
    assert {f"hlofuse/kernel {r.kind}" for r in report.kernels} <= built
    assert built <= {f"hlofuse/kernel {r.kind}" for r in report.regions}, built
    assert all("test_profiler.py:" in a["at"] for _, a in kernels), kernels
    rounds = [a["round"] for n, a in events if n == "hlofuse/tune round"]
    # numbered from 1 in each measurement (the choices, then XLA's own module)
    assert rounds and set(rounds) == set(range(1, max(rounds) + 1)), rounds
