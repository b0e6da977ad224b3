"""Hook for the StableHLO peer corpus (``../shared/corpus/run_corpus.py``).

The corpus harness compiles every test case twice, untransformed and after ``--transform``
(a ``str -> str`` function), and reports regressions::

    python ../shared/corpus/run_corpus.py --lift-inputs --jobs 2 \\
        --transform hlofuse.cli.corpus:corpus_transform

:func:`corpus_transform` is exactly what ``hlofuse optimize --target cpu`` does to a text file
(same load checks, same pass-through rules), so the corpus exercises the command line's code path.
"""

from __future__ import annotations

from hlofuse.runtime.api import optimize_loaded
from hlofuse.runtime import formats


def corpus_transform(text: str) -> str:
    """Optimize one corpus module for the CPU target and return it as StableHLO text.

    Modules hlofuse deliberately leaves alone (dynamic shapes with no ``--shapes``) come back
    unchanged; any other failure raises, so the harness records it as a transform error.
    """
    loaded = formats.load_bytes(text.encode(), source="<corpus case>")
    result = optimize_loaded(loaded, target="cpu")
    return formats.serialize(result.module, "text")
