"""What hlofuse did and why: regions found, kernels emitted, what was left to XLA, bytes saved."""

from __future__ import annotations

import dataclasses
import json
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
    # region id -> text of its outlined function before kernelize replaced it (kept for
    # hlofuse.verify's check and rollback; in-memory only, not part of to_dict/JSON)
    xla_funcs: dict[int, str] = dataclasses.field(default_factory=dict, repr=False)
    # buffer-aliasing: which outputs alias which (donated) arguments, and the memory plan
    # ({'output': j, 'argument': i, 'bytes': n, 'type': 'f32[...]'} rows; peak live bytes)
    aliases: list[dict] = dataclasses.field(default_factory=list)
    memory: dict = dataclasses.field(default_factory=dict)

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
    def left_to_xla(self) -> list[Region]:
        return [r for r in self.regions if not r.kernel]

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
        return {p.name: p.seconds for p in self.passes if not p.disabled}

    def to_dict(self) -> dict:
        return {
            "target": self.target, "source": self.source,
            "ops_before": self.ops_before, "ops_after": self.ops_after,
            "kernels": len(self.kernels), "regions_left_to_xla": len(self.left_to_xla),
            "modeled_bytes_unfused": self.bytes_unfused, "modeled_bytes_fused": self.bytes_fused,
            "modeled_bytes_saved": self.bytes_saved,
            "regions": [dict(dataclasses.asdict(r), bytes_saved=r.bytes_saved,
                             arithmetic_intensity=round(r.arithmetic_intensity, 4)) for r in self.regions],
            "passes": [dataclasses.asdict(p) for p in self.passes],
            "notes": list(self.notes),
            "aliases": list(self.aliases), "memory": dict(self.memory),
        }

    def to_json(self, **kw) -> str:
        return json.dumps(self.to_dict(), indent=kw.pop("indent", 2), default=str, **kw)

    def to_markdown(self) -> str:
        lines = [f"# hlofuse report ({self.source}, target {self.target})", "",
                 f"- kernels: {len(self.kernels)}; regions left to XLA: {len(self.left_to_xla)}",
                 f"- top-level ops in main: {self.ops_before} -> {self.ops_after}",
                 f"- modeled HBM bytes: {_fmt_bytes(self.bytes_unfused)} -> {_fmt_bytes(self.bytes_fused)}"
                 f" (saved {_fmt_bytes(self.bytes_saved)})", "",
                 "| id | kind | ops | kernel / reason | bytes before → after | where |",
                 "|---|---|---|---|---|---|"]
        for r in self.regions:
            lines.append(f"| {r.id} | {r.kind} | {_ops_summary(r.ops)} | "
                         f"{r.kernel or 'XLA: ' + (r.reason or '')} | "
                         f"{_fmt_bytes(r.bytes_unfused)} → {_fmt_bytes(r.bytes_fused if r.kernel else r.bytes_unfused)} | "
                         f"{', '.join(r.locations[:3])} |")
        if self.notes:
            lines += ["", "## Notes", *[f"- {n}" for n in self.notes]]
        lines += ["", "## Passes", "", "| pass | ms | stats |", "|---|---|---|"]
        for p in self.passes:
            lines.append(f"| {p.name} | {'disabled' if p.disabled else f'{p.seconds * 1e3:.1f}'} | "
                         f"{', '.join(f'{k}={v}' for k, v in p.stats.items())} |")
        return "\n".join(lines) + "\n"

    def __str__(self) -> str:
        head = (f"hlofuse report — target {self.target}: {len(self.kernels)} kernel(s), "
                f"{len(self.left_to_xla)} region(s) left to XLA; main ops {self.ops_before} -> "
                f"{self.ops_after}; modeled bytes {_fmt_bytes(self.bytes_unfused)} -> "
                f"{_fmt_bytes(self.bytes_fused)}")
        rows = [("id", "kind", "ops", "kernel / reason", "bytes", "where")]
        for r in self.regions:
            rows.append((str(r.id), r.kind, _ops_summary(r.ops, 38),
                         r.kernel or f"XLA: {r.reason}",
                         f"{_fmt_bytes(r.bytes_unfused)}->{_fmt_bytes(r.bytes_fused if r.kernel else r.bytes_unfused)}",
                         ", ".join(r.locations[:2])))
        widths = [min(60, max(len(row[i]) for row in rows)) for i in range(len(rows[0]))]
        out = [head]
        if len(rows) > 1:
            for row in rows:
                out.append("  " + "  ".join(c[:w].ljust(w) for c, w in zip(row, widths)).rstrip())
        for n in self.notes:
            out.append(f"  note: {n}")
        timed = [p for p in self.passes if not p.disabled]
        if timed:
            out.append("  passes: " + ", ".join(f"{p.name} {p.seconds * 1e3:.0f}ms" for p in timed))
        dis = [p.name for p in self.passes if p.disabled]
        if dis:
            out.append("  disabled: " + ", ".join(dis))
        return "\n".join(out)


def _ops_summary(ops: list[str], limit: int = 80) -> str:
    short = [o.split(".", 1)[-1] for o in ops]
    s = ",".join(short)
    return s if len(s) <= limit else s[: limit - 3] + "..."


def _fmt_bytes(n: int) -> str:
    for unit in ("B", "KiB", "MiB", "GiB"):
        if abs(n) < 1024 or unit == "GiB":
            return f"{n:.0f}{unit}" if unit == "B" else f"{n:.1f}{unit}"
        n /= 1024
    return str(n)
