"""``python -m hlofuse.cli.settings [OUT]``: write ``docs/settings.md`` (or OUT) from the
declarations in :mod:`hlofuse.core.config`, atomically."""

from __future__ import annotations

import os
import sys

from hlofuse.core import config
from hlofuse.runtime.formats import atomic_write


def write(out: str) -> str:
    return atomic_write(out, config.page())


if __name__ == "__main__":
    repo = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    print(write(sys.argv[1] if len(sys.argv) > 1 else os.path.join(repo, "docs", "settings.md")))
