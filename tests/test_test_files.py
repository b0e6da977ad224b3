"""Test files import no other test file: what they share lives in helper modules under tests/
(``programs.py``, ``fusion_util.py``, ``attention_programs.py``, ...) or in conftest fixtures,
so collecting or editing one test file never runs or breaks another's module-level code."""

from __future__ import annotations

import ast
import pathlib

TESTS = pathlib.Path(__file__).resolve().parent


def _imported_modules(path: pathlib.Path) -> list[str]:
    out = []
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            out += [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            out.append(node.module)
            out += [f"{node.module}.{a.name}" for a in node.names]
        elif isinstance(node, ast.ImportFrom) and node.level:
            out += [a.name for a in node.names] + ([node.module] if node.module else [])
    return out


def test_no_test_file_imports_another():
    bad = []
    for path in sorted(TESTS.rglob("*.py")):
        for mod in _imported_modules(path):
            parts = mod.split(".")
            ours = parts[0] == "tests" or parts[0].startswith("test_")  # not jax's test_util
            if ours and any(part.startswith("test_") for part in parts):
                bad.append(f"{path.relative_to(TESTS.parent)} imports {mod}")
    assert not bad, "test files import test files (move the shared code to a helper module):\n" \
        + "\n".join(bad)
