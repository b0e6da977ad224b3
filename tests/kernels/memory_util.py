"""Peak host memory of ``hlofuse.optimize`` on a module, measured in a fresh process.

Splat constants are one element in the IR whatever their shape (``dense<1.0> :
tensor<16384x16384xf32>`` is a few bytes of text for 1 GiB of data); reading one must never
build the whole array (issue 11). :func:`optimize_rss_growth` runs ``hlofuse.optimize`` on a small
twin of the module first (imports, jax tracing and lowering caches warm up), then on the module
itself, and returns how much the peak resident set grew during that second call.

The peak is the kernel's ``VmHWM`` of the child (reset to the current RSS before the measured call
where ``/proc/self/clear_refs`` allows), falling back to ``resource.getrusage``'s ``ru_maxrss``.
Not ``ru_maxrss`` first: on Linux it survives fork+exec, so a child of a big pytest process
starts with its parent's peak and would hide any growth below it.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
MiB = 1 << 20

_SCRIPT = textwrap.dedent("""
    import json, resource, sys

    def peak_kib():
        try:
            with open("/proc/self/status") as f:
                return next(int(l.split()[1]) for l in f if l.startswith("VmHWM:"))
        except (OSError, StopIteration):
            return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss

    import hlofuse
    small, big, pipeline, disable, target = json.loads(sys.argv[1])
    kw = dict(target=target, disable=disable, **({"pipeline": pipeline} if pipeline else {}))
    hlofuse.optimize(small, **kw)                       # warm-up: imports, tracing, lowering
    try:
        with open("/proc/self/clear_refs", "w") as f:   # peak := current RSS
            f.write("5")
    except OSError:
        pass
    before = peak_kib()
    opt = hlofuse.optimize(big, **kw)
    after = peak_kib()
    print(json.dumps({"growth_kib": after - before, "kernels": [r.kind for r in opt.report.kernels],
                      "text": opt.text}))
""")


def optimize_rss_growth(template: str, big: str, small: str, *, pipeline=None, disable=(),
                        target: str = "cpu") -> tuple[int, dict]:
    """(peak RSS growth in bytes, result dict) of optimizing ``template`` with ``{shape}`` set to
    ``big``, after a warm-up with ``small``."""
    args = json.dumps([template.format(shape=small), template.format(shape=big), pipeline,
                       list(disable), target])
    env = dict(os.environ, JAX_PLATFORMS="cpu", HLOFUSE_AUTOTUNE="0",
               PYTHONPATH=REPO + os.pathsep + os.environ.get("PYTHONPATH", ""))
    env.pop("HLOFUSE_DISABLE_PASSES", None)
    p = subprocess.run([sys.executable, "-c", _SCRIPT, args], capture_output=True, text=True,
                       timeout=600, cwd=REPO, env=env)
    assert p.returncode == 0, p.stderr[-3000:]
    res = json.loads(p.stdout.strip().splitlines()[-1])
    return res["growth_kib"] * 1024, res
