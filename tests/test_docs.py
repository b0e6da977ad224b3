"""Every code block of README.md and docs/ runs, and prints what the page says it prints.

Each page runs in one fresh process, in a fresh directory, with a fresh ``HLOFUSE_CACHE_DIR``
and hlofuse's own defaults (no ``HLOFUSE_*`` setting of the test suite leaks in), its blocks in
page order, as a reader would run them:

* a ``python`` block is executed; the page's python blocks share one namespace (a block may use
  what an earlier one defined), and each block is written to a file first, so source locations
  in reports point at it;
* in a ``bash``/``sh``/``console`` block (or an indented one), each line that starts with
  ``hlofuse``, ``python -m hlofuse`` or ``python -m bench`` (after ``VAR=value`` assignments)
  runs in bash, with this interpreter's ``python`` and ``hlofuse`` first on ``PATH``, and must
  exit 0; ``python -m bench`` gets ``--quick``;
* an ``output`` block right after a block that ran is that block's printed output (stdout):
  ``...`` alone on a line stands for any lines, ``...`` within a line for any text;
* ``<!-- test: file NAME -->`` on the line before a block writes the block to ``NAME`` instead of
  running it; ``<!-- test: skip REASON -->`` skips it (the reason is printed).

Not run, each listed with its reason: set-up lines (``python -m venv``, ``pip install``: the test
runs inside an install), other programs' commands, commands whose comment says they need a GPU
or TPU when this process has none or that they take minutes, and the blocks of a section whose
prose says ``pip install -e ".[EXTRA]"`` while that extra's packages are not installed.

Also here: the API reference page is what ``python -m hlofuse.cli.apidoc`` writes, and the docs
site builds with ``mkdocs build --strict`` (skipped when mkdocs is not installed: the ``docs``
extra; CI's ``newest: docs`` step installs it).
"""

from __future__ import annotations

import glob
import importlib.util
import os
import subprocess
import sys
import pytest

from tests.doc_pages import (ROOT, DOCS, code_blocks, page_steps, output_matches, run_page, pages)


@pytest.mark.parametrize("page", pages())
def test_page_examples_run(page, tmp_path):
    run_page(page, tmp_path)


# -- the harness itself ----------------------------------------------------------------------

def test_output_blocks_match_with_ellipses():
    assert output_matches("a\n...\nd\n", "a\nb\nc\nd\n")
    assert output_matches("a\n...\nb\n", "a\nb\n")
    assert output_matches("x = ... ms\n", "x = 1.5 ms\n")
    assert not output_matches("a\nb\n", "a\nc\n")
    assert not output_matches("a\n", "a\nb\n")


def test_directives_and_skips():
    text = ("## Plain\n\n<!-- test: file m.py -->\n```python\nX = 1\n```\n\n```python\n"
            "print(2)\n```\n\n```output\n2\n```\n\n<!-- test: skip too slow -->\n```python\n"
            "1/0\n```\n\n```bash\nhlofuse run a.mlir\nls -l\npython -m bench --models x"
            "   # a few minutes\n```\n\n## Chips\n\nInstall them with "
            "`pip install -e \".[no-such-extra-xyz]\"`, then:\n\n    hlofuse check --compile-for"
            " h100 a\n    hlofuse run b.mlir   # needs a GPU\n")
    steps, skipped = page_steps(text, "p.md", {"cpu"})
    assert [(s.kind, s.name or s.text.strip()) for s in steps] == [
        ("file", "m.py"), ("python", "print(2)"), ("shell", "hlofuse run a.mlir")]
    assert steps[1].expected == "2\n"
    assert [why.split(" (")[0].split(",")[0] for _, why in skipped] == [
        "too slow", "not an hlofuse or bench command", "takes minutes",
        "needs the [no-such-extra-xyz] extra", "needs a GPU"]


def test_an_indented_list_continuation_is_no_code_block():
    text = "- item\n\n    continued item text\n\nPara.\n\n    hlofuse run a.mlir\n"
    assert [b.lines for b in code_blocks(text)] == [["hlofuse run a.mlir"]]


# -- the API page and the site ----------------------------------------------------------------

def test_api_page_is_current():
    """docs/api.md is what ``python -m hlofuse.cli.apidoc`` writes from the docstrings of the
    public names; regenerate it with that command after changing one."""
    from hlofuse.cli import apidoc
    with open(os.path.join(DOCS, "api.md")) as fh:
        current = fh.read()
    assert current == apidoc.page(), ("docs/api.md is out of date: run "
                                      "`python -m hlofuse.cli.apidoc` and commit the result")


def test_every_page_is_in_the_site_nav():
    with open(os.path.join(ROOT, "mkdocs.yml")) as fh:
        nav = fh.read()
    for page in glob.glob(os.path.join(DOCS, "**", "*.md"), recursive=True):
        rel = os.path.relpath(page, DOCS)
        assert rel in nav, f"docs/{rel} is not in mkdocs.yml's nav"


def test_docs_site_builds_strict(tmp_path):
    """``mkdocs build --strict``: a broken link, a missing nav page or an unknown setting fails."""
    if importlib.util.find_spec("mkdocs") is None:
        pytest.skip("mkdocs is not installed (the docs extra: pip install -e \".[docs]\"; "
                    "CI's 'newest: docs' step builds the site)")
    p = subprocess.run([sys.executable, "-m", "mkdocs", "build", "--strict", "--site-dir",
                        str(tmp_path / "site")], cwd=ROOT, capture_output=True, text=True,
                       timeout=300)
    assert p.returncode == 0, f"mkdocs build --strict failed:\n{p.stdout}\n{p.stderr}"
