"""Example StableHLO files shipped with hlofuse, for trying the command line on a fresh
install::

    hlofuse optimize "$(python -c 'import hlofuse.examples as e; print(e.path())')" -o out.mlir

``mlp_block.mlir``: the pre-LN transformer MLP block of ``python -m hlofuse.cli.demo``
(LayerNorm, two matmuls with GELU and bias epilogues, a residual, a clip; 256 tokens x 256
features, float32), lowered by ``jax.jit(...).lower(...).as_text()``.
"""

from __future__ import annotations

import os

__all__ = ["path", "names"]

_HERE = os.path.dirname(os.path.abspath(__file__))


def names() -> list[str]:
    """The example files shipped."""
    return sorted(n for n in os.listdir(_HERE) if n.endswith(".mlir"))


def path(name: str = "mlp_block.mlir") -> str:
    """The absolute path of a shipped example file (``FileNotFoundError`` naming the ones
    there when ``name`` is not one of them)."""
    p = os.path.join(_HERE, name)
    if not os.path.isfile(p):
        raise FileNotFoundError(f"no example {name!r} in {_HERE}; shipped: {', '.join(names())}")
    return p
