"""Fusion graphs for Google's Model Explorer: the module before and after, with node overlays.

Model Explorer (PyPI ``ai-edge-model-explorer``; ``pip install hlofuse[explorer]``) opens
StableHLO text (``.mlir``) as a graph and colors its nodes by *node data*: JSON files of values
keyed by graph id and node id. :func:`write` (``Report.to_model_explorer``, ``hlofuse optimize
--graph DIR``) writes into a directory:

================================ ===============================================================
file                             what it holds
================================ ===============================================================
``before.mlir``                  the module as given (when known), with source locations
``after.mlir``                   the optimized module, with source locations
``after.kernel.json``            per op: the Pallas kernel that runs it, ``XLA (refused)`` for an
                                 op of a region left to XLA, or ``XLA``
``after.region.json``            per op of a fusion region: the region id (the report's ids)
``after.refused.json``           per op of a region left to XLA: why it was left
``after.bytes_saved.json``       per region call: the modeled HBM bytes the kernel saves
``after.time_ratio.json``        per region call that tuning measured: kernel time / XLA time
================================ ===============================================================

Open them with ``model-explorer DIR/after.mlir --node_data_paths=DIR/after.kernel.json,...``
(:func:`open_command` gives the line). Every overlay is built with Model Explorer's own
node-data classes (``model_explorer.node_data_builder``: ``ModelNodeData`` of ``GraphNodeData``
of ``NodeDataResult``, ``ThresholdItem``/``GradientItem`` for colors) and written as their
``save_to_file`` writes it (``to_json_string(indent=2)``), atomically. The categorical overlays
(kernel, refused) carry strings, which Model Explorer shows as labels and summarizes on group
nodes; the others are numbers.

**Node ids.** Model Explorer's MLIR adapter (``ai-edge-model-explorer-adapter``, source
``src/builtin-adapter/adapters/mlir/translate_helpers.cc`` of google-ai-edge/model-explorer)
makes one graph per ``func.func``, its id the function's symbol name. In each, a function
argument is node ``arg<i>``; the ops are numbered by one counter from 0 in the order of the
body's ops, an op with regions followed by the ops of its regions (region by region, block by
block) — one level deep: ops nested deeper get no node (except inside ``sdy`` ops, expanded
to any depth); a terminator is an ``Outputs`` node with its number. The inputs of an op's
regions are nodes ``pid<op's id>_arg<i>``. :func:`node_ids` numbers a module the same way;
``tests/test_model_explorer.py`` checks it against the adapter itself, on real modules.

**Which op is which.** In an optimized module a fusion region is a function called from the
program: a kernel (``hlofuse_k<id>_*``, its entry marked ``hlofuse.kernel = "kind|id|name|
blocks"``) or a region left to XLA (``hlofuse.region = id``, with ``hlofuse.xla = why``). A call
of one and every op inside it belong to that region; every other op is XLA's.

Layering: this module is in ``hlofuse/core`` and imports no other layer. It parses only text
that MLIR printed (a module hlofuse or JAX wrote), in a fresh context with unregistered
dialects allowed as Model Explorer's own parser does; it does not go through
:mod:`hlofuse.core.ir`, which imports :mod:`hlofuse.core.report` (the ``Report`` method that
calls this module would close an import cycle).
"""

from __future__ import annotations

import os
import re
from typing import Any, Callable

from jaxlib.mlir import ir

from hlofuse.core import compat
from hlofuse.core import files

__all__ = ["EXTRA", "OVERLAYS", "GRAPH_FILES", "require", "node_ids", "region_ops", "measured_ratio",
           "overlays", "contents", "paths", "write", "open_command"]

#: how to install what this module needs
EXTRA = "pip install hlofuse[explorer]"

#: the overlays :func:`write` writes, as ``after.<name>.json``, with what each value means
OVERLAYS = {
    "kernel": "the kernel that runs the op, 'XLA (refused)' or 'XLA'",
    "region": "fusion region id (the report's)",
    "refused": "why the op's region was left to XLA",
    "bytes_saved": "modeled HBM bytes saved by the region's kernel (on its call)",
    "time_ratio": "measured kernel time / XLA time (on the region's call; < 1: kernel faster)",
}
GRAPH_FILES = ("before.mlir", "after.mlir")

# What the passes put on a region's function (passes/fusion/outline.py, passes/kernelize.py).
# Spelled out here because core imports no pass; the tests check they match.
KERNEL_INFO_ATTR = "hlofuse.kernel"
REGION_ATTR = "hlofuse.region"
XLA_ATTR = "hlofuse.xla"
KERNEL_PREFIX = "hlofuse_k"
_KERNEL_FUNC = re.compile(rf"{KERNEL_PREFIX}(\d+)_")

KERNEL_COLOR = "#a5d6a7"     # green: a kernel runs it
REFUSED_COLOR = "#ffcc80"    # orange: a fusion region left to XLA
XLA = "XLA"
REFUSED = "XLA (refused)"


def require():
    """``model_explorer.node_data_builder``, or an ImportError that says how to get it."""
    try:
        from model_explorer import node_data_builder
    except ImportError as e:
        raise ImportError(f"Model Explorer graphs need the ai-edge-model-explorer package "
                          f"({e}); install it with: {EXTRA}") from e
    return node_data_builder


# ---------------------------------------------------------------------------------------------
# Model Explorer's node ids
# ---------------------------------------------------------------------------------------------

def _parse(text: str) -> ir.Module:
    ctx = compat.new_ir_context()
    ctx.allow_unregistered_dialects = True   # as Model Explorer's parser
    try:
        with ctx:
            return ir.Module.parse(text)
    except (ir.MLIRError, TypeError) as e:  # name the module, keep the first diagnostics
        # (TypeError: a str the binding cannot encode, e.g. lone surrogates)
        msg = " | ".join(line.strip() for line in str(e).strip().splitlines()[:4])
        raise ValueError(f"Model Explorer graph: cannot parse the module text: {msg}") from None


def _funcs(module: ir.Module) -> list:
    return [op.operation for op in module.body.operations if op.operation.name == "func.func"]


def _name(op) -> str:
    return ir.StringAttr(op.attributes["sym_name"]).value


def _nodes(module: ir.Module) -> dict[str, list[tuple[str, ir.Operation]]]:
    """Graph id -> ``[(node id, op)]`` (the ops live as long as ``module``)."""
    out: dict[str, list] = {}
    for fn in _funcs(module):
        name = _name(fn)
        if name == "NoOp" or not len(fn.regions[0].blocks):   # the adapter skips these
            continue
        nodes: list = []

        def add(op, expand: bool) -> None:
            nodes.append((str(len(nodes)), op))
            if not expand:
                return
            for region in op.regions:
                for block in region.blocks:
                    for child in block.operations:
                        child = child.operation
                        add(child, child.name.startswith("sdy."))

        for op in fn.regions[0].blocks[0].operations:
            add(op.operation, True)
        out[name] = nodes
    return out


def node_ids(module: ir.Module | str) -> dict[str, list[tuple[str, str]]]:
    """Graph id -> ``[(node id, op name)]``: every op that Model Explorer shows as a node, with
    the id its MLIR adapter gives it (see the module docstring); function arguments and region
    inputs (``arg<i>``, ``pid<n>_arg<i>``) are not ops and not listed. ``module``: an
    ``ir.Module`` or its text."""
    module = _parse(module) if isinstance(module, str) else module
    return {g: [(nid, op.name) for nid, op in nodes] for g, nodes in _nodes(module).items()}


# ---------------------------------------------------------------------------------------------
# Which region each node belongs to
# ---------------------------------------------------------------------------------------------

def _func_regions(module: ir.Module) -> dict[str, tuple[int, bool, str | None]]:
    """Function name -> (region id, is a kernel, why left to XLA) for hlofuse's functions."""
    out = {}
    for fn in _funcs(module):
        name, attrs = _name(fn), fn.attributes
        if KERNEL_INFO_ATTR in attrs:
            rid = int(ir.StringAttr(attrs[KERNEL_INFO_ATTR]).value.split("|")[1])
            out[name] = (rid, True, None)
        elif _KERNEL_FUNC.match(name):
            out[name] = (int(_KERNEL_FUNC.match(name).group(1)), True, None)
        elif REGION_ATTR in attrs:
            why = ir.StringAttr(attrs[XLA_ATTR]).value if XLA_ATTR in attrs else None
            out[name] = (ir.IntegerAttr(attrs[REGION_ATTR]).value, False, why)
    return out


def region_ops(module: ir.Module | str) -> dict[str, dict[str, tuple[int, bool, str | None, bool]]]:
    """Graph id -> node id -> (region id, is a kernel, why left to XLA, is the call) for every
    node of a fusion region: the program's call of a region function, and every op inside
    one. Nodes of no region (XLA's ops) are absent."""
    if isinstance(module, str):
        module = _parse(module)
    funcs = _func_regions(module)
    out: dict[str, dict] = {}
    for graph, nodes in _nodes(module).items():
        own = funcs.get(graph)
        rows = out.setdefault(graph, {})
        for nid, op in nodes:
            if own is not None:
                rows[nid] = (*own, False)
            elif op.name == "func.call":
                callee = funcs.get(ir.FlatSymbolRefAttr(op.attributes["callee"]).value)
                if callee is not None:
                    rows[nid] = (*callee, True)
    return out


# ---------------------------------------------------------------------------------------------
# The overlays
# ---------------------------------------------------------------------------------------------

_RATIO = (re.compile(r"kernel: ([0-9.]+)x of XLA's time"),     # runtime.autotune.decide_regions
          re.compile(r"kernel ([0-9.]+)x slower"))


def measured_ratio(region) -> float | None:
    """Kernel time / XLA time that tuning measured for ``region`` (its ``extra['measured']``,
    e.g. ``"kept kernel: 0.85x of XLA's time, measured"``), 1.0 where XLA compiles both to the
    same program, None where nothing was measured."""
    extra = getattr(region, "extra", {}) or {}
    if isinstance(extra.get("measured_ratio"), (int, float)):
        return float(extra["measured_ratio"])
    text = extra.get("measured")
    if not isinstance(text, str):
        return None
    for pat in _RATIO:
        m = pat.search(text)
        if m:
            try:
                return float(m.group(1).rstrip("."))
            except ValueError:
                return None
    return 1.0 if "identical HLO" in text else None


def overlays(report, after: ir.Module | str) -> dict[str, Any]:
    """Overlay name (:data:`OVERLAYS`) -> ``model_explorer.node_data_builder.ModelNodeData``
    for the optimized module ``after`` (an ``ir.Module`` or its text) and its ``report``
    (:class:`hlofuse.core.report.Report`). Every graph of the module has an entry in every
    overlay, empty where none of its nodes has a value."""
    ndb = require()
    if isinstance(after, str):
        after = _parse(after)
    regions = {r.id: r for r in getattr(report, "regions", [])}
    in_region = region_ops(after)
    data: dict[str, dict[str, dict]] = {k: {} for k in OVERLAYS}
    for graph, nodes in _nodes(after).items():
        res = {k: {} for k in OVERLAYS}
        rows = in_region.get(graph, {})
        for nid, _op in nodes:
            row = rows.get(nid)
            if row is None:
                res["kernel"][nid] = ndb.NodeDataResult(value=XLA)
                continue
            rid, is_kernel, why, is_call = row
            r = regions.get(rid)
            res["region"][nid] = ndb.NodeDataResult(value=rid)
            if is_kernel:
                name = (r.kernel if r is not None and r.kernel else None) or f"region {rid} kernel"
                res["kernel"][nid] = ndb.NodeDataResult(value=name, bgColor=KERNEL_COLOR)
            else:
                res["kernel"][nid] = ndb.NodeDataResult(value=REFUSED, bgColor=REFUSED_COLOR)
                reason = why or (r.reason if r is not None else None) or "left to XLA"
                res["refused"][nid] = ndb.NodeDataResult(value=reason, bgColor=REFUSED_COLOR)
            if is_call:
                saved = r.bytes_saved if (r is not None and is_kernel) else 0
                res["bytes_saved"][nid] = ndb.NodeDataResult(value=int(saved))
                ratio = measured_ratio(r) if r is not None else None
                if ratio is not None:
                    res["time_ratio"][nid] = ndb.NodeDataResult(value=round(ratio, 4))
        data["kernel"][graph] = ndb.GraphNodeData(
            name="hlofuse: kernel or XLA", results=res["kernel"],
            showExpandedSummaryOnGroupNode=True, showLabelCountColumnsInChildrenStatsTable=True)
        data["region"][graph] = ndb.GraphNodeData(name="hlofuse: region id", results=res["region"],
                                                  hideInAggregatedStatsTable=True)
        data["refused"][graph] = ndb.GraphNodeData(
            name="hlofuse: why left to XLA", results=res["refused"],
            showExpandedSummaryOnGroupNode=True, showLabelCountColumnsInChildrenStatsTable=True)
        data["bytes_saved"][graph] = ndb.GraphNodeData(
            name="hlofuse: modeled bytes saved", results=res["bytes_saved"],
            gradient=[ndb.GradientItem(stop=0, bgColor="#ffffff"),
                      ndb.GradientItem(stop=1, bgColor="#2e7d32")])
        data["time_ratio"][graph] = ndb.GraphNodeData(
            name="hlofuse: kernel time / XLA time (measured)", results=res["time_ratio"],
            thresholds=[ndb.ThresholdItem(value=0.95, bgColor="#66bb6a"),   # kernel faster
                        ndb.ThresholdItem(value=1.05, bgColor="#fff59d"),   # a draw
                        ndb.ThresholdItem(value=1e9, bgColor="#ef9a9a")])   # kernel slower
    return {k: ndb.ModelNodeData(graphsData=v) for k, v in data.items()}


# ---------------------------------------------------------------------------------------------
# Writing the directory
# ---------------------------------------------------------------------------------------------

def _atomic_write(path: str, text: str) -> None:
    """:func:`hlofuse.core.files.replace_atomically`: never a partial file, the umask's mode."""
    files.replace_atomically(os.path.abspath(path), text.encode())


def _text(module) -> str:
    if isinstance(module, ir.Module):
        return module.operation.get_asm(enable_debug_info=True)
    if isinstance(module, (bytes, bytearray)):
        raise TypeError("Model Explorer graph: give the module as text or an ir.Module "
                        "(hlofuse.Optimized.to_model_explorer takes bytecode and artifacts too)")
    return module


def paths(directory: str) -> dict[str, str]:
    """What :func:`write` writes in ``directory``: ``before``, ``after`` and each overlay's
    name -> its path."""
    out = {"before": os.path.join(directory, "before.mlir"),
           "after": os.path.join(directory, "after.mlir")}
    out.update({k: os.path.join(directory, f"after.{k}.json") for k in OVERLAYS})
    return out


def contents(report, *, after, before=None) -> dict[str, str]:
    """The files of :func:`write` as texts, nothing written: ``after`` (and ``before``, when
    given) as ``.mlir`` text with source locations, each overlay as Model Explorer's
    ``save_to_file`` writes it."""
    after_text = _text(after)
    out = {"after": after_text}
    if before is not None:
        out["before"] = _text(before)
    for name, data in overlays(report, after_text).items():
        out[name] = data.to_json_string(indent=2)
    return out


def write(directory: str, report, *, after, before=None,
          write_file: Callable[[str, str], Any] | None = None) -> dict[str, str]:
    """Write the Model Explorer graphs of an optimization into ``directory`` (made if missing):
    ``before.mlir`` (when ``before`` is given), ``after.mlir`` and the overlays (see the module
    docstring). ``after``/``before``: module text or an ``ir.Module``. Everything is built
    before the first file is written, and each file is written atomically
    (``write_file(path, text)``, default a temporary file renamed into place).
    Returns name -> path of the files written."""
    texts = contents(report, after=after, before=before)
    os.makedirs(directory, exist_ok=True)
    where = paths(directory)
    write_file = write_file or _atomic_write
    for name, text in texts.items():
        write_file(where[name], text)
    return {name: where[name] for name in texts}


def open_command(written: dict[str, str]) -> str:
    """The shell line that opens :func:`write`'s files in Model Explorer."""
    data = ",".join(written[k] for k in OVERLAYS if k in written)
    return f"model-explorer {written['after']} --node_data_paths={data}"
