"""README.md is the front door: short, with exactly the two set-up commands that .ci/run and a
newcomer run, a tour whose blocks run (``tests/test_docs.py`` runs every block of README.md and
docs/, the README's included), and links into docs/ that resolve.

The offline workflow (export, report, optimize, check, run) lives in docs/guide/offline.md;
its commands are found and run there.
"""

from __future__ import annotations

import os
import re

from tests.doc_pages import ROOT, page_steps

README = os.path.join(ROOT, "README.md")
MAX_LINES = 200
DEMO = "python3 -m venv .venv && . .venv/bin/activate && pip install -e . && python -m hlofuse.cli.demo"
TESTS = ('python3 -m venv .venv && . .venv/bin/activate && pip install -e ".[test]" '
         '&& python -m pytest -q')


def readme() -> str:
    with open(README) as fh:
        return fh.read()


def test_readme_is_short():
    n = len(readme().splitlines())
    assert n <= MAX_LINES, f"README.md has {n} lines; keep it a front door (<= {MAX_LINES}), " \
                           f"move the rest into docs/"


def test_readme_has_exactly_the_two_setup_commands():
    """The demo and the test command, verbatim; nothing else installs."""
    steps, skipped = page_steps(readme(), "README.md", {"cpu"})
    setup = [what for what, why in skipped if why.startswith("set-up")]
    assert setup == [DEMO, TESTS], setup


def test_ci_runs_the_readme_test_command():
    with open(os.path.join(ROOT, ".ci", "run")) as fh:
        ci = fh.read()
    assert 'pip install -e ".[test]"' in ci and "python -m pytest -q" in ci


def test_readme_tour_runs_hlofuse_optimize_and_bench():
    steps, _ = page_steps(readme(), "README.md", {"cpu"})
    shell = [s.text for s in steps if s.kind == "shell"]
    assert any(c.startswith("hlofuse optimize ") for c in shell), shell
    assert any(c.startswith("python -m bench") for c in shell), shell
    assert any(s.kind == "python" and "@hlofuse.jit" in s.text and s.expected for s in steps)


def test_readme_links_resolve():
    links = re.findall(r"\]\(([^)#\s]+)(?:#[^)]*)?\)", readme())
    local = [link for link in links if not re.match(r"[a-z]+://", link)]
    assert any(link.startswith("docs/") for link in local)
    for link in local:
        assert os.path.exists(os.path.join(ROOT, link)), f"README links to missing {link}"


def test_offline_page_lists_the_offline_commands():
    """The offline workflow's commands are found (and so run by tests/test_docs.py)."""
    with open(os.path.join(ROOT, "docs", "guide", "offline.md")) as fh:
        text = fh.read()
    steps, _ = page_steps(text, "docs/guide/offline.md", {"cpu"})
    assert any(s.kind == "file" and s.name == "mymodel.py" for s in steps)
    run = [s.text for s in steps if s.kind == "shell"]
    assert any(c.startswith("hlofuse export ") for c in run)
    for sub in ("report", "optimize", "check", "run"):
        assert any(c.startswith(f"hlofuse {sub} ") for c in run), sub
