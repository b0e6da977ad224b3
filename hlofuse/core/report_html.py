"""The HTML page of a fusion report (``hlofuse optimize --report FILE.html``).

Same content and units as the report's text and Markdown views (:mod:`hlofuse.core.report`).
"""

from __future__ import annotations

import html as _html

from hlofuse.core.report import Report, fmt_bytes, outcome

__all__ = ["render"]


def _tiling_row(t: dict) -> str:
    """One row of the tiling table: the same facts as :func:`hlofuse.core.report.tiling_lines`."""
    esc = _html.escape
    shape = (f"{t['batch']}x" if t.get("batch", 1) > 1 else "") + f"M{t['m']} N{t['n']} K{t['k']}"
    tile = "x".join(map(str, t["tile"])) if t.get("tile") else None
    waste = f"{t['waste_pct']:g}%" if tile else "-"
    if t.get("blocks"):
        by = f"kernel blocks {t['blocks']}"
    else:
        by = "XLA" + (f" (region {t['region']})" if t.get("region") is not None else "")
    where = t.get("where") if t.get("where") not in (None, "unknown") else ""
    return (f"<tr><td>{esc(str(t['op']))}</td><td>{esc(shape)}</td><td>{esc(str(t['dtype']))}</td>"
            f"<td>{esc(tile or 'none')}</td><td>{waste}</td><td>{esc(by)}</td><td>{esc(where)}</td></tr>")


def render(report: Report) -> str:
    """A self-contained HTML page of the fusion plan (byte counts in the same units as the
    text and Markdown views)."""
    esc = _html.escape
    rows = "".join(
        f"<tr><td>{r.id}</td><td>{esc(r.kind)}</td><td>{esc(', '.join(o.split('.', 1)[-1] for o in r.ops))}</td>"
        f"<td>{esc(outcome(r))}</td>"
        f"<td>{fmt_bytes(r.bytes_unfused)}</td><td>{fmt_bytes(r.bytes_fused if r.kernel else r.bytes_unfused)}</td>"
        f"<td>{esc(', '.join(r.locations[:3]))}</td></tr>" for r in report.regions)
    passes = "".join(
        f"<tr><td>{esc(p.name)}</td><td>{'disabled' if p.disabled else format(p.seconds * 1e3, '.1f')}</td>"
        f"<td>{esc(', '.join(str(k) + '=' + str(v) for k, v in p.stats.items()))}</td></tr>"
        for p in report.passes)
    notes = "".join(f"<li>{esc(n)}</li>" for n in report.notes)
    tiling = "".join(_tiling_row(t) for t in report.tiling)
    merged = f", {len(report.merged)} merged into others" if report.merged else ""
    return (
        "<!DOCTYPE html>\n<html><head><meta charset='utf-8'><title>hlofuse report</title>"
        "<style>body{font-family:sans-serif}table{border-collapse:collapse}"
        "td,th{border:1px solid #ccc;padding:2px 6px;text-align:left}</style></head><body>\n"
        f"<h1>hlofuse report: {esc(str(report.source))} (target {esc(report.target)})</h1>\n"
        f"<p>{len(report.kernels)} kernel(s), {len(report.left_to_xla)} region(s) left to XLA{merged}; "
        f"top-level ops in main {report.ops_before} &rarr; {report.ops_after}; modeled bytes "
        f"{fmt_bytes(report.bytes_unfused)} &rarr; {fmt_bytes(report.bytes_fused)} "
        f"(saved {fmt_bytes(report.bytes_saved)})</p>\n"
        "<table><tr><th>id</th><th>kind</th><th>ops</th><th>kernel / reason</th>"
        f"<th>bytes unfused</th><th>bytes fused</th><th>where</th></tr>{rows}</table>\n"
        + (f"<h2>Tiling</h2><table><tr><th>op</th><th>GEMM shape</th><th>dtype</th><th>native tile</th>"
           f"<th>padding waste</th><th>computed by</th><th>where</th></tr>{tiling}</table>\n" if tiling else "")
        + (f"<h2>Notes</h2><ul>{notes}</ul>\n" if notes else "")
        + f"<h2>Passes</h2><table><tr><th>pass</th><th>ms</th><th>stats</th></tr>{passes}</table>\n"
        "</body></html>\n")
