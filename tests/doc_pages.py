"""What tests/test_docs.py and tests/test_readme.py share: the pages' code blocks, how each
runs, and the page driver (see tests/test_docs.py)."""
from __future__ import annotations

import dataclasses
import glob
import importlib.util
import json
import os
import re
import subprocess
import sys
import textwrap

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
README = os.path.join(ROOT, "README.md")
DOCS = os.path.join(ROOT, "docs")
GENERATED = {"docs/api.md": "generated from docstrings (python -m hlofuse.cli.apidoc)",
             "docs/settings.md": "generated from hlofuse/core/config.py"}
RUN_PREFIXES = ("hlofuse ", "python -m hlofuse", "python -m bench")
SETUP = re.compile(r"\bpython3? -m venv\b|\bpip install\b")
NEEDS_DEVICE = re.compile(r"#.*\bneeds an? (GPU|TPU)\b", re.I)
TAKES_MINUTES = re.compile(r"#.*\bminutes\b")
SHELL_BLOCKS = ("indented", "sh", "bash", "shell", "console")
ENV_ASSIGN = re.compile(r"([A-Z_][A-Z0-9_]*)=(\S*)\s+")
DIRECTIVE = re.compile(r"<!--\s*test:\s*(skip|file)\s+(.*?)\s*-->")
PAGE_TIMEOUT_S = 600


@dataclasses.dataclass
class Block:
    lang: str                      # python, bash, output, text, indented, ...
    lines: list[str]
    section: str                   # the heading it is under
    line: int                      # 1-based line of the block's first line in the page
    directive: tuple[str, str] | None = None   # ("skip", reason) or ("file", name)

    @property
    def text(self) -> str:
        return "\n".join(self.lines) + "\n"


def code_blocks(text: str) -> list[Block]:
    """Every fenced and indented (4-space, after a blank line) block, with its section and the
    ``<!-- test: ... -->`` directive on the line before it."""
    blocks, lines, i, section, in_list = [], text.splitlines(), 0, "", False
    while i < len(lines):
        line = lines[i]
        if line.startswith("#") and not line.startswith("#!"):
            section = line.lstrip("#").strip()
        prev = lines[i - 1] if i else ""
        m = DIRECTIVE.search(prev)
        directive = (m.group(1), m.group(2)) if m else None
        if line.startswith("```"):
            lang, body, start = line[3:].strip(), [], i + 1
            i += 1
            while i < len(lines) and not lines[i].startswith("```"):
                body.append(lines[i])
                i += 1
            blocks.append(Block(lang, body, section, start + 1, directive))
        elif (line.startswith("    ") and line.strip() and not prev.strip() and not in_list):
            body, start = [], i
            while i < len(lines) and (lines[i].startswith("    ") or not lines[i].strip()):
                body.append(lines[i][4:])
                i += 1
            blocks.append(Block("indented", [b for b in body if b.strip()], section, start + 1,
                                directive))
            continue
        # an indented line after a list item continues the item (Markdown), it is no code block
        if line.strip():
            in_list = bool(re.match(r"\s*([-*+]|\d+\.)\s", line)) or (in_list and line[:1] == " ")
        i += 1
    return blocks


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
        if extra not in optional:  # named in the page, unknown to pyproject.toml
            missing.append(extra)
            continue
        for req in optional[extra]:
            name = re.split(r"[\s<>=!~;\[]", req, maxsplit=1)[0]
            if ";" in req:   # an environment marker: only the requirements that apply here
                from packaging.markers import Marker  # noqa: PLC0415 (pip's, always present)
                if not Marker(req.split(";", 1)[1]).evaluate():
                    continue
            try:
                importlib.metadata.version(name)
            except importlib.metadata.PackageNotFoundError:
                missing.append(extra)
                break
    return missing


def device_platforms() -> set[str]:
    import jax
    return {d.platform for d in jax.devices()}


@dataclasses.dataclass
class Step:
    kind: str                      # "python", "shell" or "file"
    text: str                      # code, command line, or file content
    where: str                     # page:line
    expected: str | None = None    # the output block that follows, if any
    name: str = ""                 # file name (kind "file")
    group: int = -1                # the block a command came from (its output is checked whole)


def page_steps(text: str, page: str, platforms: set[str]) -> tuple[list[Step], list[tuple[str, str]]]:
    """``(steps to run, [(what, why skipped)])`` of one page, in page order."""
    steps, skipped = [], []
    extras = section_extras(text)
    blocks = code_blocks(text)
    for n, b in enumerate(blocks):
        where = f"{page}:{b.line}"
        follows = blocks[n + 1] if n + 1 < len(blocks) else None
        expected = follows.text if follows is not None and follows.lang == "output" else None
        if b.directive and b.directive[0] == "file":
            steps.append(Step("file", b.text, where, name=b.directive[1]))
            continue
        runnable = b.lang == "python" or b.lang in SHELL_BLOCKS
        if not runnable:
            continue
        if b.directive and b.directive[0] == "skip":
            skipped.append((where, b.directive[1]))
            continue
        absent = missing_extras(extras.get(b.section, ()))
        why_absent = (f"needs the [{','.join(absent)}] extra, not installed "
                      f"(pip install -e \".[{absent[0]}]\")") if absent else None
        if b.lang == "python":
            m = NEEDS_DEVICE.search(b.text)
            if m and m.group(1).lower() not in platforms:
                skipped.append((where, f"needs a {m.group(1).upper()}"))
            elif why_absent:
                skipped.append((where, why_absent))
            else:
                steps.append(Step("python", b.text, where, expected))
            continue
        ran = []
        for line in b.lines:
            cmd = line.strip().removeprefix("$ ")
            if not cmd or cmd.startswith("#"):
                continue
            bare = cmd
            while (m := ENV_ASSIGN.match(bare)):
                bare = bare[m.end():]
            if SETUP.search(cmd):
                skipped.append((cmd, "set-up (creates a venv / pip installs)"))
            elif not bare.startswith(RUN_PREFIXES):
                skipped.append((cmd, "not an hlofuse or bench command"))
            elif (m := NEEDS_DEVICE.search(cmd)) and m.group(1).lower() not in platforms:
                skipped.append((cmd, f"needs a {m.group(1).upper()}"))
            elif TAKES_MINUTES.search(cmd):
                skipped.append((cmd, "takes minutes (its comment says so)"))
            elif why_absent:
                skipped.append((cmd, why_absent))
            else:
                ran.append(Step("shell", cmd, where, group=n))
        if ran:
            ran[-1].expected = expected   # what the block's commands print, together
        steps.extend(ran)
    return steps, skipped


def output_matches(expected: str, actual: str) -> bool:
    """``actual`` printed what ``expected`` shows: ``...`` alone on a line matches any lines,
    ``...`` within a line any text; trailing spaces and blank lines at the ends are ignored."""
    norm = lambda s: [ln.rstrip() for ln in s.strip("\n").splitlines()]
    pattern = ""
    for line in norm(expected):
        if line.strip() == "...":
            pattern += r"(?:.*\n)*?"
        else:
            pattern += re.escape(line).replace(re.escape("..."), ".*?") + r"\n"
    return re.fullmatch(pattern, "".join(ln + "\n" for ln in norm(actual))) is not None


# The process that runs one page's steps: python blocks exec'd in one namespace, commands as
# child processes; it prints one JSON line per step. It never imports jax itself, so a page's
# first block may still set XLA_FLAGS.
DRIVER = textwrap.dedent(r'''
    import contextlib, io, json, os, re, subprocess, sys, time, traceback
    steps = json.load(open(sys.argv[1]))
    ns = {"__name__": "__main__"}
    sys.path.insert(0, os.getcwd())
    for n, step in enumerate(steps):
        t0 = time.monotonic()
        out, error = io.StringIO(), None
        if step["kind"] == "file":
            with open(step["name"], "w") as fh:
                fh.write(step["text"])
        elif step["kind"] == "python":
            path = f"example_{n}.py"
            with open(path, "w") as fh:
                fh.write(step["text"])
            try:
                with contextlib.redirect_stdout(out):
                    exec(compile(step["text"], os.path.abspath(path), "exec"), ns)
            except BaseException:
                error = traceback.format_exc()
        else:
            # as a reader types it, in bash, with this interpreter's python and hlofuse first
            # on PATH; python -m bench gets --quick
            cmd = step["text"]
            if re.match(r"(\w+=\S*\s+)*python -m bench(\s|$)", cmd) and "--quick" not in cmd:
                head, sep, comment = cmd.partition(" #")
                cmd = head.rstrip() + " --quick" + (sep + comment if sep else "")
            env = dict(os.environ, PATH=os.path.dirname(sys.executable) + os.pathsep
                       + os.environ.get("PATH", ""))
            try:
                p = subprocess.run(["bash", "-c", cmd], capture_output=True, text=True, env=env,
                                   timeout=300)
            except subprocess.TimeoutExpired:
                error = "timed out after 300 s: mark it '# takes minutes' if it must be long"
            else:
                out.write(p.stdout)
                if p.returncode != 0:
                    error = f"exit {p.returncode}\n{p.stdout[-3000:]}\n{p.stderr[-3000:]}"
        print(json.dumps({"n": n, "stdout": out.getvalue(), "error": error,
                          "seconds": round(time.monotonic() - t0, 2)}), flush=True)
        if error:
            break
''')


def page_env(tmp_path) -> dict[str, str]:
    """The environment a reader has: hlofuse's defaults, a fresh cache, no test-suite settings."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("HLOFUSE_")}
    env["HLOFUSE_CACHE_DIR"] = str(tmp_path / "cache")
    env["JAX_PLATFORMS"] = os.environ.get("JAX_PLATFORMS", "cpu")
    env["PYTHONPATH"] = os.pathsep.join(p for p in (ROOT, os.environ.get("PYTHONPATH")) if p)
    return env


def run_page(page: str, tmp_path) -> None:
    with open(os.path.join(ROOT, page)) as fh:
        text = fh.read()
    steps, skipped = page_steps(text, page, device_platforms())
    print(f"\n{page}: {len(steps)} step(s); skipped:\n"
          + "\n".join(f"  {what}   [{why}]" for what, why in skipped))
    if not any(s.kind != "file" for s in steps):
        return
    work = tmp_path / "work"
    work.mkdir()
    plan = tmp_path / "steps.json"
    plan.write_text(json.dumps([dataclasses.asdict(s) for s in steps]))
    p = subprocess.run([sys.executable, "-c", DRIVER, str(plan)],
                       cwd=work, capture_output=True, text=True, env=page_env(tmp_path),
                       timeout=PAGE_TIMEOUT_S)
    results = [json.loads(line) for line in p.stdout.splitlines() if line.startswith('{"n"')]
    printed: dict[int, str] = {}
    for r in results:
        step = steps[r["n"]]
        print(f"  {step.where} {step.kind} {r['seconds']:.1f}s  {step.text.splitlines()[0][:60]}")
        assert r["error"] is None, f"{step.where}: the {step.kind} block failed:\n{step.text}\n" \
                                   f"{r['error']}"
        key = step.group if step.kind == "shell" else -2 - r["n"]
        printed[key] = printed.get(key, "") + r["stdout"]
        if step.expected is not None:
            assert output_matches(step.expected, printed[key]), (
                f"{step.where}: printed output differs from the page's output block\n"
                f"--- page shows:\n{step.expected}\n--- printed:\n{printed[key]}")
    assert len(results) == len(steps), f"{page}: the page's process stopped after " \
                                       f"{len(results)} of {len(steps)} steps:\n{p.stderr[-3000:]}"


def pages() -> list[str]:
    found = ["README.md"] + sorted(os.path.relpath(p, ROOT) for p in
                                   glob.glob(os.path.join(DOCS, "**", "*.md"), recursive=True))
    return [p for p in found if p not in GENERATED]


