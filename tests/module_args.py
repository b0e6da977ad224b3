"""Arguments for a StableHLO module's ``@main``, read from its signature (a helper shared by
pass tests, not a test module)."""

from __future__ import annotations

import numpy as np

from hlofuse.core import ir as hir
from hlofuse.runtime.testing import edge_values


def edge_args(text: str) -> list[np.ndarray]:
    ctx = hir.new_context()
    mod = hir.parse(text, ctx)  # keep the module alive while its ops are used
    main = hir.main_func(mod)
    out = []
    for k, a in enumerate(main.regions[0].blocks[0].arguments):
        info = hir.tensor_type_info(a.type)
        dt = hir.np_dtype(info.dtype)
        if dt.kind == "c":
            vals = np.array([complex(np.inf, 1.0), complex(2.0, np.inf)], dt)
        else:
            vals = np.roll(edge_values(dt), k)  # different edge value pairings per argument
        out.append(np.resize(vals, info.shape).astype(dt))
    return out
