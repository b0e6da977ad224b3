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
    "import hlofuse.cli.main",
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


_COLD_KERNEL = """
import sys, numpy as np, jax, jax.numpy as jnp, hlofuse
from hlofuse.runtime.testing import tolerance
x = jnp.sin(jnp.arange(64 * 256, dtype=jnp.float32).reshape(64, 256))
f = hlofuse.jit(lambda x: jax.nn.softmax(x, axis=-1))
y = f(x)
assert len(f.report(x).kernels) >= 1, "no kernel was built: the check would be empty"
rtol, atol = tolerance(np.float32, "reassociate")
np.testing.assert_allclose(np.asarray(y), np.asarray(jax.nn.softmax(x, axis=-1)), rtol=rtol, atol=atol)
# (the small ``...interpret.params`` modules come with pallas itself and stay)
from hlofuse.core.compat import GPU_TPU_INTERPRET_MODULES
print(sorted(m for m in sys.modules if m.startswith(GPU_TPU_INTERPRET_MODULES)))
"""


def test_cpu_kernel_imports_no_gpu_or_tpu_interpret_modules():
    """Issue 14 item 4: a cpu kernel's first call no longer imports Pallas's Mosaic GPU / TPU
    interpret modules (jax's interpret lowering imports them for an isinstance test only;
    0.25-1.9 s of a cold first call). kernels.lowering registers a cpu rule that skips them."""
    p = _run(_COLD_KERNEL, HLOFUSE_MODULE_CACHE="0", HLOFUSE_XLA_CACHE="0")
    assert p.returncode == 0, p.stderr[-2000:]
    assert p.stdout.strip().splitlines()[-1] == "[]", p.stdout[-2000:]


_SAME_TEXT = """
import jax, jax.numpy as jnp
from jax.experimental import pallas as pl
from hlofuse.kernels import lowering
def k(x_ref, b_ref, o_ref):
    o_ref[...] = jnp.exp(x_ref[...]) * 2.0 + jnp.where(b_ref[...], 1.0, 0.0)
def f(x, b):
    return pl.pallas_call(k, out_shape=jax.ShapeDtypeStruct((16, 128), jnp.float32),
                          grid=(2,), in_specs=[pl.BlockSpec((8, 128), lambda i: (i, 0))] * 2,
                          out_specs=pl.BlockSpec((8, 128), lambda i: (i, 0)), interpret=True)(x, b)
avals = (jax.ShapeDtypeStruct((16, 128), jnp.float32), jax.ShapeDtypeStruct((16, 128), jnp.bool_))
lower = lambda: jax.jit(f).trace(*avals).lower(lowering_platforms=("cpu",)).as_text(debug_info=True)
texts = []
for ours in (False, True):   # one call site: jax 0.12 records it in the locations
    if ours:
        lowering._register_cpu_interpret_rule()
    texts.append(lower())               # first jax's own pallas_call rule, then hlofuse's
theirs, ours = texts
assert "while" in ours, "the grid loop is missing: not an interpret lowering"
print(ours == theirs)
"""


def test_cpu_interpret_rule_lowers_identically():
    """The cpu rule emits exactly the StableHLO (with locations) of jax's own rule."""
    p = _run(_SAME_TEXT)
    assert p.returncode == 0, p.stderr[-2000:]
    assert p.stdout.strip() == "True", p.stdout[-2000:]


def test_modules_that_moved_into_the_layer_folders_import_by_their_old_paths():
    """hlofuse/ became layer folders (issue 47): code written against the old module paths
    keeps working. Public modules (hlofuse.testing, .aot, .memory, .config, hlofuse.tools.*
    entry points) import silently as the moved module itself; internal ones warn with the
    new path; ``python -m hlofuse.tools.demo`` still runs; ``hlofuse.jit`` stays the
    function whatever was imported."""
    code = (
        "import warnings, hlofuse\n"
        "warnings.simplefilter('error')\n"
        "import hlofuse.testing, hlofuse.aot, hlofuse.memory, hlofuse.config\n"
        "from hlofuse.testing import ALL_KERNELS\n"
        "import hlofuse.runtime.testing as t\n"
        "assert hlofuse.testing is t, hlofuse.testing\n"
        "import hlofuse.tools.cli, hlofuse.tools.demo\n"
        "warnings.simplefilter('always')\n"
        "with warnings.catch_warnings(record=True) as w:\n"
        "    from hlofuse.pipeline import PassManager\n"
        "    import hlofuse.tools.autotune as at\n"
        "assert [str(x.message) for x in w] == ['hlofuse.pipeline moved to hlofuse.core.pipeline',"
        " 'hlofuse.tools.autotune moved to hlofuse.runtime.autotune'], [str(x.message) for x in w]\n"
        "assert at.__name__ == 'hlofuse.runtime.autotune'\n"
        "assert callable(hlofuse.jit) and type(hlofuse.jit).__name__ == 'function'\n"
        "print('ok')\n")
    p = _run(code)
    assert p.returncode == 0 and p.stdout.strip() == "ok", p.stderr[-3000:]
    # python -m OLD.PATH runs the moved module as __main__ (the CLI's worker does this too)
    p = subprocess.run([sys.executable, "-m", "hlofuse.tools.cli", "--version"],
                       capture_output=True, text=True, timeout=300, cwd=REPO,
                       env=dict(os.environ, JAX_PLATFORMS="cpu"))
    assert p.returncode == 0 and p.stdout.startswith("hlofuse "), (p.stdout, p.stderr[-2000:])


def test_import_hlofuse_is_light_and_any_entry_point_knows_the_passes():
    """``import hlofuse`` loads no jax (the ``hlofuse`` command's supervisor pays nothing for
    it; the public names load on first use), and every way into the optimizer, the public
    names or a runtime module imported directly, finds the built-in passes registered."""
    p = _run("import sys, hlofuse; print(sorted(m for m in sys.modules "
             "if m == 'jax' or m.startswith('jaxlib')))")
    assert p.returncode == 0 and p.stdout.strip() == "[]", p.stdout + p.stderr
    for code in ("import hlofuse; hlofuse.PassManager",
                 "from hlofuse.runtime.api import optimize",
                 "import hlofuse.runtime.program",
                 "import hlofuse.cli.main"):
        p = _run(code + "; from hlofuse.core.pipeline import all_passes; "
                 "print(sorted(all_passes()))")
        assert p.returncode == 0, p.stderr
        assert "kernelize" in p.stdout and "fuse-attention" in p.stdout, (code, p.stdout)
