"""The import graph has layers with one direction and no cycles (issue 13).

The graph is read from the source with the ``package-dir`` mapping of pyproject.toml resolved
(``passes/`` is ``hlofuse.passes``, ``kernels/`` is ``hlofuse.kernels``), which is what hides
the real structure from most tools. Every import counts, module-level or inside a function:
a function-level import is still a dependency, it only moves the failure to run time.

Layers, lowest first (an import may go to the same layer or a lower one):

0. core: the IR helpers, op table, target and chips, host CPU features, report, pass manager
1. kernels: Pallas kernel families; they consume pure region specs and never import passes
2. passes: graph rewrites; they may ask kernels what they support and build them (kernelize)
3. front: optimize/jit/runtime/verify/aot and the tools the front end itself uses
4. top: the root package ``hlofuse`` and the user-facing tools (CLI, demo, corpus runner)
"""

from __future__ import annotations

import ast
import os
import tomllib

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

LAYERS: dict[str, int] = {
    "hlofuse.compat": 0, "hlofuse.config": 0,
    "hlofuse.report": 0, "hlofuse.chips": 0, "hlofuse.target": 0, "hlofuse.ir": 0,
    "hlofuse.hostcpu": 0,
    "hlofuse.ops": 0, "hlofuse.pipeline": 0,
    "hlofuse.kernels": 1,
    "hlofuse.passes": 2,
    "hlofuse.api": 3, "hlofuse.execute": 3, "hlofuse.verify": 3, "hlofuse.testing": 3,
    "hlofuse.runtime": 3, "hlofuse.jit": 3, "hlofuse.aot": 3, "hlofuse.tools": 3,
    "hlofuse.host_callbacks": 3, "hlofuse.memory": 3,
    "hlofuse.tools.formats": 3, "hlofuse.tools.argspec": 3, "hlofuse.tools.html": 3,
    "hlofuse.tools.autotune": 3, "hlofuse.tools.module_cache": 3,
    "hlofuse": 4, "hlofuse.tools.cli": 4, "hlofuse.tools.demo": 4, "hlofuse.tools.settings": 4, "hlofuse.tools.corpus": 4,
}
NAMES = ("core", "kernels", "passes", "front", "top")


def _modules() -> dict[str, str]:
    """Module name -> file, through pyproject's packages and package-dir mapping."""
    with open(os.path.join(REPO, "pyproject.toml"), "rb") as fh:
        tool = tomllib.load(fh)["tool"]["setuptools"]
    pkg_dir = tool.get("package-dir", {})
    mods: dict[str, str] = {}
    for pkg in tool["packages"]:
        parent, _, last = pkg.rpartition(".")
        d = pkg_dir.get(pkg) or os.path.join(pkg_dir.get(parent, parent.replace(".", "/")), last)
        d = os.path.join(REPO, d)
        for f in sorted(os.listdir(d)):
            if f.endswith(".py"):
                mods[pkg if f == "__init__.py" else f"{pkg}.{f[:-3]}"] = os.path.join(d, f)
    return mods


def _imports(mod: str, path: str, mods: dict[str, str]) -> set[str]:
    """The hlofuse modules ``mod`` imports (``from pkg import name`` counts name if it is a
    module, else pkg)."""
    out: set[str] = set()
    is_pkg = path.endswith("__init__.py")
    for node in ast.walk(ast.parse(open(path).read(), path)):
        if isinstance(node, ast.Import):
            names = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                parts = mod.split(".")
                parts = parts[: len(parts) - node.level + (1 if is_pkg else 0)]
                base = ".".join(parts + ([base] if base else []))
            names = [f"{base}.{a.name}" if f"{base}.{a.name}" in mods else base for a in node.names]
        else:
            continue
        for n in names:
            while n not in mods and "." in n:
                n = n.rsplit(".", 1)[0]
            if n in mods and n != mod:
                out.add(n)
    return out


def _graph() -> dict[str, set[str]]:
    mods = _modules()
    return {m: _imports(m, p, mods) for m, p in mods.items()}


def layer_of(mod: str) -> int:
    """The layer of the longest prefix of ``mod`` named in LAYERS."""
    m = mod
    while m not in LAYERS:
        assert "." in m, f"module {mod} has no layer: add it to LAYERS in {__file__}"
        m = m.rsplit(".", 1)[0]
    return LAYERS[m]


def _cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on: set[str] = set()
    out: list[list[str]] = []

    def visit(v: str) -> None:  # Tarjan's strongly connected components
        index[v] = low[v] = len(index)
        stack.append(v)
        on.add(v)
        for w in graph[v]:
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on.discard(w)
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                out.append(sorted(comp))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return out


def test_the_mapping_is_resolved():
    graph = _graph()
    assert "hlofuse.passes.fuse_elementwise" in graph and "hlofuse.kernels.reduction" in graph
    assert "hlofuse.kernels.tiling" in graph["hlofuse.kernels.reduction"]


def test_every_module_has_a_layer():
    for m in _graph():
        layer_of(m)


def test_no_import_cycles():
    cycles = _cycles(_graph())
    assert not cycles, "import cycles:\n" + "\n".join(" <-> ".join(c) for c in cycles)


def test_imports_go_down_only():
    upward = sorted(f"{m} ({NAMES[layer_of(m)]}) imports {t} ({NAMES[layer_of(t)]})"
                    for m, ts in _graph().items() for t in ts if layer_of(t) > layer_of(m))
    assert not upward, "upward imports:\n" + "\n".join(upward)


def test_kernels_never_import_passes():
    bad = sorted(f"{m} -> {t}" for m, ts in _graph().items() if m.startswith("hlofuse.kernels")
                 for t in ts if t.startswith("hlofuse.passes"))
    assert not bad, bad


def test_the_checker_sees_a_cycle_and_an_upward_import():
    # the test must be able to fail: a planted cycle and upward edge are found
    g = {"a": {"b"}, "b": {"a"}, "c": set()}
    assert _cycles(g) == [["a", "b"]]
    assert layer_of("hlofuse.kernels.x") < layer_of("hlofuse.passes.y")


def _private_jax() -> tuple[str, ...]:
    from hlofuse.compat import PRIVATE_MODULES   # compat alone names them
    return PRIVATE_MODULES


def test_only_compat_touches_jax_internals():
    """Issue 44: every use of JAX's internals goes through hlofuse/compat.py, the one module
    that knows what differs per JAX release. Any other file in the repository (library,
    bench, tests, CI scripts) that names one is a finding."""
    bad = []
    for top in ("hlofuse", "passes", "kernels", "bench", "tests", ".ci"):
        for root, _, files in os.walk(os.path.join(REPO, top)):
            for f in files:
                path = os.path.join(root, f)
                rel = os.path.relpath(path, REPO)
                if not f.endswith((".py", ".sh")) and f != "run" or rel == "hlofuse/compat.py":
                    continue
                text = open(path, encoding="utf-8", errors="replace").read()
                bad += [f"{rel}: {name}" for name in _private_jax() if name in text]
    assert not bad, "JAX internals outside hlofuse/compat.py:\n" + "\n".join(bad)


def test_compat_is_the_lowest_module():
    """compat imports nothing of hlofuse: every layer may use it."""
    assert _graph()["hlofuse.compat"] == set()
