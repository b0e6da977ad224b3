"""Every shell command in README.md's code blocks that starts with ``hlofuse``, ``python -m
hlofuse`` or ``python -m bench`` runs, as written, in a fresh directory, in README order, and
succeeds: the README cannot drift from the command line.

Not run (each is listed with its reason by :func:`readme_commands`): the set-up lines that
create a venv and pip install (this test runs inside one), commands whose comment says they need
a GPU or TPU when this process has none, commands of a section that says to
``pip install -e ".[EXTRA]"`` when that extra's packages are not installed, and commands of other
programs (the corpus runner in ``../shared``). A ``python -m bench`` command runs with ``--quick`` where the harness has it.
Files the commands need come from the README too: the ``python`` block introduced with
``mymodel.py`` is written to ``mymodel.py``.
"""

from __future__ import annotations

import os
import re
import shlex
import shutil
import subprocess
import sys
import time

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
README = os.path.join(ROOT, "README.md")
RUN_PREFIXES = ("hlofuse ", "python -m hlofuse", "python -m bench")
SETUP = re.compile(r"\bpython3? -m venv\b|\bpip install\b")
NEEDS_DEVICE = re.compile(r"#.*\bneeds an? (GPU|TPU)\b", re.I)
BUDGET_S = 60
SHELL_BLOCKS = ("indented", "sh", "bash", "shell", "console")


def code_blocks(text: str) -> list[tuple[str, list[str], str]]:
    """``(language, lines, section heading)`` of every fenced and indented (4-space) block."""
    blocks, lines, i, section = [], text.splitlines(), 0, ""
    while i < len(lines):
        line = lines[i]
        if line.startswith("#") and not line.startswith("#!"):
            section = line.lstrip("#").strip()
        if line.startswith("```"):
            lang, body = line[3:].strip(), []
            i += 1
            while i < len(lines) and not lines[i].startswith("```"):
                body.append(lines[i])
                i += 1
            blocks.append((lang, body, section))
        elif line.startswith("    ") and line.strip() and (i == 0 or not lines[i - 1].strip()):
            body = []
            while i < len(lines) and (lines[i].startswith("    ") or not lines[i].strip()):
                body.append(lines[i][4:])
                i += 1
            blocks.append(("indented", [b for b in body if b.strip()], section))
            continue
        i += 1
    return blocks


def model_source(text: str) -> str | None:
    """The ``python`` block right after the paragraph that introduces ``mymodel.py``."""
    m = re.search(r"`mymodel\.py`[^\n]*:\s*\n\s*```python\n(.*?)```", text, re.S)
    return m.group(1) if m else None


def device_platforms() -> set[str]:
    import jax
    return {d.platform for d in jax.devices()}


def section_extras(text: str) -> dict[str, set[str]]:
    """Section heading -> the extras its prose says to install (``pip install -e ".[aot]"``)."""
    out: dict[str, set[str]] = {}
    for part in re.split(r"^(?=#+ )", text, flags=re.M):
        heading = part.splitlines()[0].lstrip("#").strip() if part.startswith("#") else ""
        for group in re.findall(r'pip install -e "?\.\[([\w,-]+)\]"?', part):
            out.setdefault(heading, set()).update(group.split(","))
    return out


def missing_extras(extras) -> list[str]:
    """The extras (``[project.optional-dependencies]`` of pyproject.toml) not installed here."""
    import importlib.metadata
    import tomllib
    with open(os.path.join(ROOT, "pyproject.toml"), "rb") as fh:
        optional = tomllib.load(fh)["project"].get("optional-dependencies", {})
    missing = []
    for extra in sorted(extras):
        if extra not in optional:  # named in the README, unknown to pyproject.toml
            missing.append(extra)
            continue
        for req in optional[extra]:
            name = re.split(r"[\s<>=!~;\[]", req, maxsplit=1)[0]
            try:
                importlib.metadata.version(name)
            except importlib.metadata.PackageNotFoundError:
                missing.append(extra)
                break
    return missing


def readme_commands(text: str, platforms: set[str]) -> tuple[list[str], list[tuple[str, str]]]:
    """``(commands to run, [(command, why skipped)])`` in README order."""
    run, skipped = [], []
    extras = section_extras(text)
    for lang, body, section in code_blocks(text):
        if lang not in SHELL_BLOCKS:  # python examples, the diagram (a fenced block, no language)
            continue
        absent = missing_extras(extras.get(section, ()))
        for line in body:
            cmd = line.strip().removeprefix("$ ")
            if SETUP.search(cmd):
                skipped.append((cmd, "set-up (creates a venv / pip installs)"))
            elif not cmd.startswith(RUN_PREFIXES):
                skipped.append((cmd, "not an hlofuse or bench command"))
            elif (m := NEEDS_DEVICE.search(cmd)) and {"GPU": "gpu", "TPU": "tpu"}[m.group(1).upper()] \
                    not in platforms:
                skipped.append((cmd, f"needs a {m.group(1).upper()}"))
            elif absent:
                skipped.append((cmd, f"needs the [{','.join(absent)}] extra, not installed "
                                     f"(pip install -e \".[{absent[0]}]\")"))
            else:
                run.append(cmd)
    return run, skipped


def argv_of(cmd: str) -> list[str]:
    args = shlex.split(cmd, comments=True)
    if args[0] == "hlofuse":
        script = shutil.which("hlofuse") or os.path.join(os.path.dirname(sys.executable), "hlofuse")
        return [script, *args[1:]]
    assert args[:2] == ["python", "-m"], cmd
    if args[2] == "bench" and "--quick" not in args and _bench_has_quick():
        args.append("--quick")
    return [sys.executable, *args[1:]]


def _bench_has_quick() -> bool:
    with open(os.path.join(ROOT, "bench", "__main__.py")) as fh:
        return "--quick" in fh.read()


def test_readme_lists_the_offline_commands():
    """The extraction itself: it finds the offline workflow, and the set-up lines are skipped."""
    with open(README) as fh:
        text = fh.read()
    run, skipped = readme_commands(text, {"cpu"})
    assert model_source(text) is not None
    assert any(c.startswith("hlofuse export ") for c in run)
    for sub in ("report", "optimize", "check", "run"):
        assert any(c.startswith(f"hlofuse {sub} ") for c in run), sub
    assert sum(1 for _, why in skipped if why.startswith("set-up")) == 2, skipped
    assert all(not c.startswith(RUN_PREFIXES) or "needs" in why or "set-up" in why
               for c, why in skipped)


def test_commands_of_a_section_with_an_uninstalled_extra_are_skipped():
    text = ("## Plain\n\n    hlofuse run a.mlir\n\n## Chips\n\nInstall them with "
            "`pip install -e \".[no-such-extra-xyz]\"`, then:\n\n    hlofuse check --compile-for h100 a\n"
            "    hlofuse run b.mlir   # needs a GPU\n")
    run, skipped = readme_commands(text, {"cpu"})
    assert run == ["hlofuse run a.mlir"]
    assert [why.split(",")[0] for _, why in skipped] == ["needs the [no-such-extra-xyz] extra",
                                                         "needs a GPU"]


def test_every_readme_command_runs(tmp_path):
    with open(README) as fh:
        text = fh.read()
    source = model_source(text)
    if source is not None:
        (tmp_path / "mymodel.py").write_text(source)
    run, skipped = readme_commands(text, device_platforms())
    print("\nskipped:\n" + "\n".join(f"  {c}   [{why}]" for c, why in skipped))
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(
        p for p in (ROOT, os.environ.get("PYTHONPATH")) if p))  # python -m bench from tmp_path
    t0 = time.monotonic()
    for cmd in run:
        print(f"$ {cmd}")
        p = subprocess.run(argv_of(cmd), cwd=tmp_path, capture_output=True, text=True,
                           timeout=300, env=env)
        assert p.returncode == 0, f"README command failed (exit {p.returncode}): {cmd}\n" \
                                  f"{p.stdout[-2000:]}\n{p.stderr[-2000:]}"
    elapsed = time.monotonic() - t0
    assert elapsed < 2 * BUDGET_S, f"README commands took {elapsed:.0f}s; keep them quick"
    for out in re.findall(r"(?:-o|--report|--outputs) (\S+)", " ".join(run)):
        assert (tmp_path / out).exists(), f"README command did not write {out}"
