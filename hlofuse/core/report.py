"""What hlofuse did and why: regions found, kernels emitted, what was left to XLA, bytes saved.

A :class:`Report` is data with text, Markdown and JSON views; its HTML page is drawn by
:func:`hlofuse.core.report_html.render`.
"""

from __future__ import annotations

import dataclasses
import functools
import json
import os
import re
import sys
from typing import Any


class HlofuseWarning(UserWarning):
    """A region left to XLA unexpectedly, a rolled-back kernel, or a skipped optimization."""


@dataclasses.dataclass
class Region:
    """One candidate fusion region, whether it became a kernel or was left to XLA."""
    id: int
    kind: str                      # 'elementwise', 'reduction', 'matmul-epilogue', 'attention', ...
    ops: list[str]                 # StableHLO op names it covers, in program order
    locations: list[str] = dataclasses.field(default_factory=list)  # user source lines (file:line)
    inputs: list[str] = dataclasses.field(default_factory=list)     # types, e.g. 'f32[8,128]'
    outputs: list[str] = dataclasses.field(default_factory=list)
    kernel: str | None = None      # Pallas kernel name when kernelized
    reason: str | None = None      # why it was left to XLA (None when kernelized)
    bytes_unfused: int = 0         # modeled HBM bytes moved if every op runs on its own
    bytes_fused: int = 0           # modeled HBM bytes moved by the fused region
    flops: int = 0
    block: str | None = None       # tiling chosen for the target
    extra: dict = dataclasses.field(default_factory=dict)

    @property
    def bytes_saved(self) -> int:
        return max(0, self.bytes_unfused - self.bytes_fused) if self.kernel else 0

    @property
    def arithmetic_intensity(self) -> float:
        return self.flops / self.bytes_fused if self.bytes_fused else 0.0


@dataclasses.dataclass
class PassRecord:
    name: str
    seconds: float
    stats: dict
    disabled: bool = False


@dataclasses.dataclass
class Report:
    target: str = "cpu"
    regions: list[Region] = dataclasses.field(default_factory=list)
    passes: list[PassRecord] = dataclasses.field(default_factory=list)
    ops_before: int = 0            # top-level ops of @main before / after optimization
    ops_after: int = 0
    notes: list[str] = dataclasses.field(default_factory=list)  # warnings for the user
    source: str = "<module>"
    # buffer-aliasing: which outputs alias which (donated) arguments, and the memory plan
    # ({'output': j, 'argument': i, 'bytes': n, 'type': 'f32[...]', 'name': "argument i ..."}
    # rows, 'source': 'compiled executable' when read back from XLA's; peak live bytes). The
    # text views show them as notes (:meth:`alias_notes`)
    aliases: list[dict] = dataclasses.field(default_factory=list)
    memory: dict = dataclasses.field(default_factory=dict)
    # kernelize: one row per matmul and convolution (GEMM view): shape, the target's native
    # tile, the padding waste in percent, the region and its kernel's blocks (see tiling_lines)
    tiling: list[dict] = dataclasses.field(default_factory=list)
    # the chip the tiling and the cost model were for (the 'chip' option, or the target's default)
    chip: str = ""

    # -- recording -------------------------------------------------------------------------
    def record_pass(self, name: str, seconds: float, stats: dict, disabled: bool = False) -> None:
        self.passes.append(PassRecord(name, seconds, dict(stats), disabled))

    def new_region(self, kind: str, ops: list[str], **kw) -> Region:
        r = Region(id=len(self.regions), kind=kind, ops=ops, **kw)
        self.regions.append(r)
        return r

    def region(self, rid: int) -> Region:
        return self.regions[rid]

    def note(self, msg: str) -> None:
        if msg not in self.notes:
            self.notes.append(msg)

    # -- views -----------------------------------------------------------------------------
    @property
    def kernels(self) -> list[Region]:
        return [r for r in self.regions if r.kernel]

    @property
    def merged(self) -> list[Region]:
        """Regions merged into another one (a horizontal kernel): neither kernels of their own
        nor left to XLA; their ops are counted with the region that absorbed them."""
        return [r for r in self.regions if "merged_into" in r.extra]

    @property
    def left_to_xla(self) -> list[Region]:
        return [r for r in self.regions if not r.kernel and "merged_into" not in r.extra]

    @property
    def bytes_saved(self) -> int:
        return sum(r.bytes_saved for r in self.regions)

    @property
    def bytes_unfused(self) -> int:
        return sum(r.bytes_unfused for r in self.regions)

    @property
    def bytes_fused(self) -> int:
        return sum(r.bytes_fused if r.kernel else r.bytes_unfused for r in self.regions)

    @property
    def pass_seconds(self) -> dict[str, float]:
        """Seconds per pass name, summed over its runs (a pipeline may run a pass twice)."""
        out: dict[str, float] = {}
        for p in self.passes:
            if not p.disabled:
                out[p.name] = out.get(p.name, 0.0) + p.seconds
        return out

    def to_dict(self) -> dict:
        return {
            "target": self.target, "chip": self.chip, "source": self.source,
            "ops_before": self.ops_before, "ops_after": self.ops_after,
            "kernels": len(self.kernels), "regions_left_to_xla": len(self.left_to_xla),
            "regions_merged": len(self.merged),
            "modeled_bytes_unfused": self.bytes_unfused, "modeled_bytes_fused": self.bytes_fused,
            "modeled_bytes_saved": self.bytes_saved,
            "regions": [dict(dataclasses.asdict(r), bytes_saved=r.bytes_saved,
                             arithmetic_intensity=round(r.arithmetic_intensity, 4)) for r in self.regions],
            "passes": [dataclasses.asdict(p) for p in self.passes],
            "notes": list(self.notes),
            "aliases": list(self.aliases), "memory": dict(self.memory),
            "tiling": list(self.tiling),
        }

    def to_json(self, **kw) -> str:
        return json.dumps(self.to_dict(), indent=kw.pop("indent", 2), default=str, **kw)

    def to_model_explorer(self, directory: str, *, after, before=None) -> dict[str, str]:
        """Write this optimization as graphs for Google's Model Explorer into ``directory``:
        ``after.mlir`` (and ``before.mlir``) with node-data overlays per op (kernel or XLA,
        region id, why a region was refused, bytes saved, measured time ratio). Needs
        ``pip install hlofuse[explorer]``.

        A report does not hold modules: give the optimized module ``after`` (text or
        ``ir.Module``; the one this report describes) and optionally the input ``before``.
        ``hlofuse.optimize(...).to_model_explorer(directory, before=...)`` passes ``after``
        for you. Returns name -> path of the files written; see
        :mod:`hlofuse.core.model_explorer`."""
        from hlofuse.core import model_explorer
        return model_explorer.write(directory, self, after=after, before=before)

    def alias_notes(self) -> list[str]:
        """One sentence per aliased output (from :attr:`aliases`), as the text views show it."""
        out = []
        for r in self.aliases:
            arg = r.get("name") or f"argument {r['argument']}"
            src = "; read back from the compiled executable" \
                if r.get("source") == "compiled executable" else ""
            out.append(f"buffer-aliasing: output {r['output']} aliases {arg} "
                       f"({r['bytes']} bytes{src})")
        return out

    def to_markdown(self) -> str:
        lines = [f"# hlofuse report ({self.source}, target {self.target})", "",
                 f"- kernels: {len(self.kernels)}; regions left to XLA: {len(self.left_to_xla)}"
                 + (f"; merged into other regions: {len(self.merged)}" if self.merged else ""),
                 f"- top-level ops in main: {self.ops_before} -> {self.ops_after}",
                 f"- modeled HBM bytes: {fmt_bytes(self.bytes_unfused)} -> {fmt_bytes(self.bytes_fused)}"
                 f" (saved {fmt_bytes(self.bytes_saved)})", "",
                 "| id | kind | ops | kernel / reason | bytes before → after | where |",
                 "|---|---|---|---|---|---|"]
        for r in self.regions:
            lines.append(f"| {r.id} | {r.kind} | {_ops_summary(r.ops)} | "
                         f"{outcome(r)} | "
                         f"{fmt_bytes(r.bytes_unfused)} → {fmt_bytes(r.bytes_fused if r.kernel else r.bytes_unfused)} | "
                         f"{', '.join(r.locations[:3])} |")
        notes = self.alias_notes() + self.notes
        if notes:
            lines += ["", "## Notes", *[f"- {n}" for n in notes]]
        if self.tiling:
            lines += ["", "## Tiling", "", *[f"- {t}" for t in tiling_lines(self.tiling)]]
        lines += ["", "## Passes", "", "| pass | ms | stats |", "|---|---|---|"]
        for p in self.passes:
            lines.append(f"| {p.name} | {'disabled' if p.disabled else f'{p.seconds * 1e3:.1f}'} | "
                         f"{', '.join(f'{k}={v}' for k, v in p.stats.items())} |")
        return "\n".join(lines) + "\n"

    def __str__(self) -> str:
        head = (f"hlofuse report — target {self.target}: {len(self.kernels)} kernel(s), "
                f"{len(self.left_to_xla)} region(s) left to XLA"
                + (f", {len(self.merged)} merged into others" if self.merged else "") +
                f"; main ops {self.ops_before} -> "
                f"{self.ops_after}; modeled bytes {fmt_bytes(self.bytes_unfused)} -> "
                f"{fmt_bytes(self.bytes_fused)}")
        rows = [("id", "kind", "ops", "kernel / reason", "bytes", "where")]
        for r in self.regions:
            rows.append((str(r.id), r.kind, _ops_summary(r.ops, 38), outcome(r),
                         f"{fmt_bytes(r.bytes_unfused)}->{fmt_bytes(r.bytes_fused if r.kernel else r.bytes_unfused)}",
                         ", ".join(r.locations[:2])))
        # the kernel / reason column gets more room: a kernel's name (kind, file and line)
        # must not push its 'unmeasured: ...' reason out of the table
        caps = (60, 60, 60, 110, 60, 60)
        widths = [min(caps[i], max(len(row[i]) for row in rows)) for i in range(len(rows[0]))]
        out = [head]
        if len(rows) > 1:
            for row in rows:
                out.append("  " + "  ".join(c[:w].ljust(w) for c, w in zip(row, widths)).rstrip())
        for n in self.alias_notes() + self.notes:
            out.append(f"  note: {n}")
        for t in tiling_lines(self.tiling):
            out.append(f"  tiling: {t}")
        timed = [p for p in self.passes if not p.disabled]
        if timed:
            out.append("  passes: " + ", ".join(f"{p.name} {p.seconds * 1e3:.0f}ms" for p in timed))
        dis = [p.name for p in self.passes if p.disabled]
        if dis:
            out.append("  disabled: " + ", ".join(dis))
        return "\n".join(out)


class Refusals:
    """Candidates a pass looked at and did not rewrite, counted by reason.

    The one way a pass says why it did not fire: :meth:`stats` gives one pass statistic per
    reason (``refused[<reason>]``: count) for tests and tools, :meth:`flush` one report note per
    reason for users (``"<pass>: 2 attention candidates not attention: <reason>"``, with up to
    three source lines). Add only candidates (a block that could hold attention, two sibling
    dots, a group with a refused member), never every op of a program: a note is aggregated,
    not a log. ``fusion.commit.LeftToXla`` is the same record for ops left to XLA.
    """

    def __init__(self, pass_name: str, outcome: str = "left to XLA"):
        self.pass_name = pass_name
        self.outcome = outcome
        self.by_reason: dict = {}          # (what, reason) -> [location, ...]

    def add(self, what: str, reason: str, where: str = "unknown") -> None:
        """One ``what`` (e.g. ``"attention candidate"``) refused for ``reason``, found at
        ``where`` (a ``file:line``, or ``"unknown"``)."""
        self.by_reason.setdefault((what, reason), []).append(where)

    def __len__(self) -> int:
        return sum(len(v) for v in self.by_reason.values())

    def stats(self) -> dict:
        """``{"refused[<reason>]": count}``, one entry per reason (empty when none)."""
        out: dict = {}
        for (_, reason), locs in self.by_reason.items():
            key = f"refused[{reason}]"
            out[key] = out.get(key, 0) + len(locs)
        return out

    def flush(self, ctx) -> int:
        """One note per (what, reason) on ``ctx.report``; returns how many were refused."""
        for (what, reason), locs in self.by_reason.items():
            shown = sorted({l for l in locs if l != "unknown"})[:3]
            where = f" at {', '.join(shown)}" if shown else ""
            ctx.report.note(f"{self.pass_name}: {len(locs)} {what} {self.outcome}{where}: {reason}")
        return len(self)


def tiling_lines(rows: list[dict]) -> list[str]:
    """One line per matmul/convolution row of :attr:`Report.tiling`: its GEMM shape, the
    native tile, the padding waste and the blocks of the kernel that computes it (or XLA)."""
    out = []
    for t in rows:
        shape = (f"{t['batch']}x" if t.get("batch", 1) > 1 else "") + f"M{t['m']} N{t['n']} K{t['k']} {t['dtype']}"
        tile = "x".join(map(str, t["tile"])) if t.get("tile") else None
        native = f"native tile {tile}: {t['waste_pct']:g}% padding" if tile else "no native tile"
        where = f" at {t['where']}" if t.get("where") not in (None, "unknown") else ""
        if t.get("blocks"):
            by = f"kernel blocks {t['blocks']}"
        else:
            by = "XLA" + (f" (region {t['region']})" if t.get("region") is not None else "")
        out.append(f"{t['op']}{where}: {shape}; {native}; {by}")
    return out


def outcome(r: Region) -> str:
    """What became of a region, in one phrase: its kernel, a merge, or XLA and why."""
    if r.kernel:
        # gpu/tpu before any measurement: a kernel only where XLA cannot match it, and why
        u = r.extra.get("unmeasured") if "measured" not in r.extra else None
        return f"{r.kernel} (unmeasured: {u})" if u else r.kernel
    if "merged_into" in r.extra:
        return r.reason or f"merged into region {r.extra['merged_into']}"
    return f"XLA: {r.reason or ''}"


# ---------------------------------------------------------------------------------------------
# Source locations: the user's line, not the library's
# ---------------------------------------------------------------------------------------------

# Frames in these packages are library code. JAX drops its own frames from locations, but not
# those of the model libraries above it, so the innermost frame of every op of a Keras or
# Transformers model is the same library line (numpy.py:182, linear.py:287).
LIBRARY_PACKAGES = frozenset({
    "jax", "jaxlib", "flax", "keras", "tf_keras", "transformers", "haiku", "equinox", "penzai",
    "optax", "chex", "numpy", "ml_dtypes", "hlofuse", "torch", "tensorflow",
})
_FRAME = re.compile(r'"([^"]+\.py)":(\d+)')


@functools.lru_cache(maxsize=4096)
def is_library_path(path: str) -> bool:
    """Is ``path`` (a source file named in an MLIR location) library code rather than the
    user's: installed packages (site-packages, dist-packages), the standard library, hlofuse's
    own files, and the model libraries in :data:`LIBRARY_PACKAGES` wherever installed?"""
    norm = os.path.normpath(path)
    parts = norm.replace("\\", "/").split("/")
    if "site-packages" in parts or "dist-packages" in parts:
        return True
    if any(p in LIBRARY_PACKAGES and _is_package_dir("/".join(parts[:i + 1]))
           for i, p in enumerate(parts[:-1])):
        return True
    for root in _library_roots():
        if norm.startswith(root + os.sep):
            return True
    return False


def _is_package_dir(d: str) -> bool:
    """A directory named like a library package is that package (a source checkout of flax:
    ``~/src/flax/flax/linen``) when it holds an ``__init__.py``; a directory that merely has
    the name (a user's project cloned as ``~/src/hlofuse/``, the checkout's root) is not. A
    path that is not on this machine (a module from elsewhere) goes by the name alone."""
    if not os.path.isdir(d):
        return True
    return os.path.isfile(os.path.join(d, "__init__.py"))


@functools.lru_cache(maxsize=1)
def _library_roots() -> tuple:
    import sysconfig
    roots = set()
    for key in ("stdlib", "platstdlib"):
        p = sysconfig.get_paths().get(key)
        if p:
            roots.add(os.path.normpath(p))
    for name in ("hlofuse", "hlofuse.passes", "hlofuse.kernels"):  # editable installs too
        mod = sys.modules.get(name)
        if mod is not None and getattr(mod, "__file__", None):
            roots.add(os.path.dirname(os.path.abspath(mod.__file__)))
    return tuple(sorted(roots))


def source_location(loc: str) -> str:
    """Short ``file:line`` for an MLIR location (its text): the innermost frame in the user's
    code (see :func:`is_library_path`), else the innermost frame; ``'unknown'`` without one.

    JAX's locations are call-site stacks, innermost first::

        loc("jit(f)/tanh"(callsite("dense"("/venv/site-packages/flax/linear.py":287:11)
            at callsite("model"("/home/me/model.py":12:8) at ...))))   ->  model.py:12
    """
    frames = _FRAME.findall(loc)
    if frames:
        path, line = next(((p, n) for p, n in frames if not is_library_path(p)), frames[0])
        return f"{os.path.basename(path)}:{line}"
    m = re.search(r'loc\("([^"]+)"', loc)
    return m.group(1) if m else "unknown"


def _ops_summary(ops: list[str], limit: int = 80) -> str:
    short = [o.split(".", 1)[-1] for o in ops]
    s = ",".join(short)
    return s if len(s) <= limit else s[: limit - 3] + "..."


def fmt_bytes(n: int) -> str:
    """Bytes in human units (``512B``, ``1.5KiB``), as every view of a report shows them."""
    for unit in ("B", "KiB", "MiB", "GiB"):
        if abs(n) < 1024 or unit == "GiB":
            return f"{n:.0f}{unit}" if unit == "B" else f"{n:.1f}{unit}"
        n /= 1024
    return str(n)
