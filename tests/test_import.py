"""Importing hlofuse prints nothing (issue 11: two ``I... pjrt_client.cc`` lines on stderr).

Each check runs in a fresh interpreter: what is printed depends on import order, which only a
new process shows. ``TF_CPP_MIN_LOG_LEVEL`` is removed from the environment so the check sees
what a user with a default environment sees.
"""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def _run(code: str, **env_extra) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if k not in ("TF_CPP_MIN_LOG_LEVEL",)}
    env.update(JAX_PLATFORMS="cpu", PYTHONPATH=REPO + os.pathsep + env.get("PYTHONPATH", ""),
               **env_extra)
    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          timeout=300, cwd=REPO, env=env)


@pytest.mark.parametrize("code", [
    "import hlofuse",
    # the log lines appear when the first backend starts after jaxlib was loaded before jax
    "import hlofuse, jax; jax.devices()",
    "import hlofuse.tools.cli",
])
def test_import_prints_nothing(code):
    p = _run(code)
    assert p.returncode == 0, p.stderr[-2000:]
    assert p.stdout == "", f"`{code}` printed to stdout: {p.stdout[:500]!r}"
    assert p.stderr == "", f"`{code}` printed to stderr: {p.stderr[:500]!r}"


def test_import_keeps_user_log_level():
    """The fix must not silence the user's own choice: TF_CPP_MIN_LOG_LEVEL=0 still logs."""
    p = _run("import os, hlofuse, jax; jax.devices(); print(os.environ['TF_CPP_MIN_LOG_LEVEL'])",
             TF_CPP_MIN_LOG_LEVEL="0")
    assert p.returncode == 0, p.stderr[-2000:]
    assert p.stdout.strip() == "0"
    assert "pjrt_client.cc" in p.stderr
