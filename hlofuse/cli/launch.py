"""The ``hlofuse`` console script: :func:`run_main`.

It imports the supervisor (:mod:`hlofuse.cli.supervisor`, standard library only) and nothing
heavy: a command runs in a worker process, so this process needs neither jax nor MLIR, and
:mod:`hlofuse.cli.main` (1.5 s of imports) is imported only for help and ``--version``, or
when the command runs in this process (``HLOFUSE_CLI_INPROCESS=1``).
"""

from __future__ import annotations

from types import ModuleType

from hlofuse.cli import supervisor


def _main_module() -> ModuleType:
    from hlofuse.cli import main
    return main


def run_main(argv: list[str] | None = None) -> int:
    """Console-script entry point (``hlofuse``); returns through ``sys.exit``."""
    supervisor.run(argv, _main_module)
