"""``python -m hlofuse.cli.settings [OUT]``: write ``docs/settings.md`` (or OUT) from the
declarations in :mod:`hlofuse.core.config`, atomically."""

from __future__ import annotations

import os
import sys
import tempfile

from hlofuse.core import config


def write(out: str) -> str:
    fd, tmp = tempfile.mkstemp(dir=os.path.dirname(os.path.abspath(out)), prefix=".settings.",
                               suffix=".md")
    try:
        with os.fdopen(fd, "w") as fh:
            fh.write(config.page())
        os.replace(tmp, out)
    except BaseException:
        if os.path.exists(tmp):
            os.unlink(tmp)
        raise
    return out


if __name__ == "__main__":
    repo = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    print(write(sys.argv[1] if len(sys.argv) > 1 else os.path.join(repo, "docs", "settings.md")))
