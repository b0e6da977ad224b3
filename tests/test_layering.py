"""The import graph has layers with one direction and no cycles (issues 13 and 47).

The layers are the folders of ``hlofuse/`` (read from disk, never from a list here), lowest
first, an import going to the same layer or a lower one:

0. ``hlofuse/core``: IR helpers, op table, pass manager, report, target and chips, config, compat
1. ``kernels/`` (installed as ``hlofuse.kernels``): Pallas kernel families on pure region specs
2. ``passes/`` (``hlofuse.passes``): graph rewrites; they may ask kernels what they support
3. ``hlofuse/runtime``: optimize, program building and re-injection, verification, tuning,
   caches, execution, aot, testing helpers
4. ``hlofuse/frontend``: jit, filter_jit, nnx_jit
5. ``hlofuse`` itself (the package's ``__init__``: the public names)
6. ``hlofuse/cli``: the command line and the demo, which use the public names
7. ``bench``, above everything

A folder that imports nothing of hlofuse (data: ``examples``, ``core/gpu_targets``) sits in
no layer. The graph is read from the source with the ``package-dir`` mapping of
pyproject.toml resolved (``passes/`` is ``hlofuse.passes``, ``kernels/`` is ``hlofuse.kernels``).
Every import counts, module-level or inside a function: a function-level import is still a
dependency, it only moves the failure to run time.
"""

from __future__ import annotations

import ast
import os
import tomllib

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

#: the layer folders: each is hlofuse.<name> (kernels and passes through the package-dir
#: mapping); NAMES orders them with the root package and bench, lowest first
ORDER = ("core", "kernels", "passes", "runtime", "frontend", "cli")
NAMES = ORDER[:5] + ("hlofuse", "cli", "bench")


def _layer_folders() -> list[str]:
    """The folders of hlofuse/ on disk (plus the two mapped ones), each a layer or data."""
    here = sorted(d for d in os.listdir(os.path.join(REPO, "hlofuse"))
                  if os.path.isfile(os.path.join(REPO, "hlofuse", d, "__init__.py")))
    return here + ["kernels", "passes"]


LAYERS: dict[str, int] = {f"hlofuse.{d}": NAMES.index(d) for d in _layer_folders() if d in ORDER}
LAYERS["hlofuse"] = NAMES.index("hlofuse")
LAYERS["bench"] = NAMES.index("bench")
DATA = {f"hlofuse.{d}" for d in _layer_folders() if d not in ORDER}


def _modules() -> dict[str, str]:
    """Module name -> file, through pyproject's packages and package-dir mapping."""
    with open(os.path.join(REPO, "pyproject.toml"), "rb") as fh:
        tool = tomllib.load(fh)["tool"]["setuptools"]
    pkg_dir = tool.get("package-dir", {})
    mods: dict[str, str] = {}
    for pkg in list(tool["packages"]) + _bench_packages():
        parent, _, last = pkg.rpartition(".")
        d = pkg_dir.get(pkg) or os.path.join(pkg_dir.get(parent, parent.replace(".", "/")), last)
        d = os.path.join(REPO, d)
        for f in sorted(os.listdir(d)):
            if f.endswith(".py"):
                mods[pkg if f == "__init__.py" else f"{pkg}.{f[:-3]}"] = os.path.join(d, f)
    return mods


def _bench_packages() -> list[str]:
    out = []
    for root, _, files in os.walk(os.path.join(REPO, "bench")):
        if "__init__.py" in files:
            out.append(os.path.relpath(root, REPO).replace(os.sep, "."))
    return sorted(out)


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
    """The layer of the longest prefix of ``mod`` that is a layer folder."""
    m = mod
    while m not in LAYERS:
        assert "." in m and m not in DATA, \
            f"module {mod} is in no layer: put it in one of the folders {ORDER} of hlofuse/"
        m = m.rsplit(".", 1)[0]
    return LAYERS[m]


def _in_a_layer(mod: str) -> bool:
    return not any(mod == d or mod.startswith(d + ".") for d in DATA)


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
        if _in_a_layer(m):
            layer_of(m)


def test_the_layers_are_the_folders():
    """hlofuse/ holds its package __init__ and folders only; a folder that is not a layer is
    data and imports nothing of hlofuse."""
    files = sorted(f for f in os.listdir(os.path.join(REPO, "hlofuse")) if f.endswith(".py"))
    assert files == ["__init__.py"], files
    assert set(ORDER) <= set(_layer_folders())
    graph = _graph()
    for m, ts in graph.items():
        if not _in_a_layer(m):
            assert not ts, f"{m} is data (no layer folder) but imports {sorted(ts)}"


def test_no_import_cycles():
    cycles = _cycles(_graph())
    assert not cycles, "import cycles:\n" + "\n".join(" <-> ".join(c) for c in cycles)


def test_imports_go_down_only():
    upward = sorted(f"{m} ({NAMES[layer_of(m)]}) imports {t} ({NAMES[layer_of(t)]})"
                    for m, ts in _graph().items() if _in_a_layer(m)
                    for t in ts if _in_a_layer(t) and layer_of(t) > layer_of(m))
    assert not upward, "upward imports:\n" + "\n".join(upward)


def test_kernels_never_import_passes():
    bad = sorted(f"{m} -> {t}" for m, ts in _graph().items() if m.startswith("hlofuse.kernels")
                 for t in ts if t.startswith("hlofuse.passes"))
    assert not bad, bad


def test_the_checker_sees_a_cycle_and_an_upward_import():
    # the test must be able to fail: a planted cycle and upward edge are found
    g = {"a": {"b"}, "b": {"a"}, "c": set()}
    assert _cycles(g) == [["a", "b"]]
    assert layer_of("hlofuse.kernels.x") < layer_of("hlofuse.passes.y") < layer_of("hlofuse.cli.z")


def _private_jax() -> tuple[str, ...]:
    from hlofuse.core.compat import PRIVATE_MODULES   # compat alone names them
    return PRIVATE_MODULES


def test_only_compat_touches_jax_internals():
    """Issue 44: every use of JAX's internals goes through hlofuse/core/compat.py, the one module
    that knows what differs per JAX release. Any other file in the repository (library,
    bench, tests, CI scripts) that names one is a finding."""
    bad = []
    for top in ("hlofuse", "passes", "kernels", "bench", "tests", ".ci"):
        for root, _, files in os.walk(os.path.join(REPO, top)):
            for f in files:
                path = os.path.join(root, f)
                rel = os.path.relpath(path, REPO)
                if not f.endswith((".py", ".sh")) and f != "run" or rel == "hlofuse/core/compat.py":
                    continue
                text = open(path, encoding="utf-8", errors="replace").read()
                bad += [f"{rel}: {name}" for name in _private_jax() if name in text]
    assert not bad, "JAX internals outside hlofuse/core/compat.py:\n" + "\n".join(bad)


def test_compat_is_the_lowest_module():
    """compat imports nothing of hlofuse: every layer may use it."""
    assert _graph()["hlofuse.core.compat"] == set()


#: pass modules that import another pass module: none (the attention passes share
#: passes/attention/match.py and train.py)
PASS_TO_PASS_LEFT: set = set()


def test_a_pass_imports_helpers_never_another_pass():
    """Issue 47 item 5: what passes share lives in helper modules (graph_util, op_forms,
    generated, sharding, fusion/), so a pass can move or go without breaking another."""
    from hlofuse.passes import PASSES
    passes = {p.__module__ for p in PASSES}
    found = {(m, t) for m, ts in _graph().items() if m in passes for t in ts if t in passes}
    assert found == PASS_TO_PASS_LEFT, sorted(found - PASS_TO_PASS_LEFT)
