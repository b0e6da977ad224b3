"""How hlofuse starts a child Python interpreter that runs hlofuse code (the CLI's worker, the
parser probe, the reference interpreter): :func:`python_command`.

Standard library only, no jax and no MLIR, so the ``hlofuse`` command's supervisor
(:mod:`hlofuse.cli.launch`) can use it and stay light; :mod:`hlofuse.core.ir` re-exports it.
"""

from __future__ import annotations

import os
import sys

__all__ = ["python_command"]

# the folder that holds the hlofuse package (hlofuse/core/child.py, three levels up)
_ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def python_command() -> tuple[list[str], dict]:
    """``(argv prefix, environment)`` for a child Python interpreter that runs hlofuse code.

    The child runs with ``-P`` (safe path, Python >= 3.11, which jax 0.10.2 requires): neither
    ``python -m`` nor ``python -c`` puts the current directory first on ``sys.path``, so an
    ``absl.py`` or ``ml_dtypes.py`` lying in the user's working directory is never executed.
    Unlike ``-I`` it keeps ``PYTHONPATH`` and the user site, so the child sees the parent's
    packages. Only when the parent itself found its modules in the current directory (a source
    checkout run in place with ``python -m``) is that directory passed on, explicitly.
    """
    env = dict(os.environ)
    first = sys.path[0] if sys.path else None
    if first is not None and os.path.realpath(first or os.curdir) == os.path.realpath(_ROOT):
        env["PYTHONPATH"] = os.pathsep.join(p for p in (_ROOT, env.get("PYTHONPATH")) if p)
    return [sys.executable, "-P"], env
