"""``python -m bench.legs OLD.json NEW.json``: two runs of the bench (or of the zoo) side by side.

For following JAX: run ``python -m bench --quick --json`` (or ``--zoo --json``) in one virtual
environment per JAX release (each ratio is hlofuse.jit against jax.jit *of that release*, timed
interleaved in one process), then print both here. A row is flagged when the newer release's
ratio is more than ``--worse`` (default 3%) above the older one's, or when a model is correct in
one run only (``--strict``: exit 1 then).
"""

from __future__ import annotations

import argparse
import json
import math
import sys


def _load(path: str) -> tuple[dict, dict]:
    with open(path) as fh:
        data = json.load(fh)
    return data.get("meta", {}), {r["name"]: r for r in data["results"]}


def _ratio(r: dict | None) -> float | None:
    if r is None or "error" in r:
        return None
    lat = r.get("latency") or {}
    return lat.get("median_ratio")


def _correct(r: dict | None) -> bool | None:
    if r is None or "error" in r:
        return None
    if "correct" in r:
        return bool(r["correct"])
    return (r.get("numerics") or {}).get("ok", True)


def _label(meta: dict, path: str) -> str:
    v = meta.get("versions") or {}
    jax = v.get("jax") or meta.get("jax") or "?"
    py = v.get("python") or meta.get("python") or ""
    return f"jax {jax}" + (f" py{py.split()[0]}" if py else "") if jax != "?" else path


def compare(old_path: str, new_path: str, worse: float = 0.03) -> tuple[str, int]:
    """The side-by-side table and the number of flagged rows."""
    (m_old, old), (m_new, new) = _load(old_path), _load(new_path)
    rows = [("model", _label(m_old, old_path), _label(m_new, new_path), "new/old", "correct", "flag")]
    flagged = 0
    logs = []
    for name in list(old) + [n for n in new if n not in old]:
        a, b = _ratio(old.get(name)), _ratio(new.get(name))
        ca, cb = _correct(old.get(name)), _correct(new.get(name))
        rel = b / a if a and b else None
        flag = ""
        if rel is not None and rel > 1 + worse:
            flag = f">{worse:.0%} worse"
        if ca is not cb:
            flag = (flag + " " if flag else "") + "correct in one run only"
        flagged += bool(flag)
        if rel is not None:
            logs.append(math.log(rel))
        rows.append((name, "-" if a is None else f"{a:.3f}", "-" if b is None else f"{b:.3f}",
                     "-" if rel is None else f"{rel:.3f}",
                     f"{'-' if ca is None else ('yes' if ca else 'NO')}/"
                     f"{'-' if cb is None else ('yes' if cb else 'NO')}", flag))
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    lines = ["  ".join(c.ljust(w) for c, w in zip(r, widths)).rstrip() for r in rows]
    if logs:
        lines.append(f"geometric mean of new/old: {math.exp(sum(logs) / len(logs)):.3f} "
                     f"over {len(logs)} rows; {flagged} flagged")
    return "\n".join(lines), flagged


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("old")
    ap.add_argument("new")
    ap.add_argument("--worse", type=float, default=0.03,
                    help="flag a row whose ratio is this much worse on NEW (default 0.03)")
    ap.add_argument("--strict", action="store_true", help="exit 1 when a row is flagged")
    args = ap.parse_args(argv)
    text, flagged = compare(args.old, args.new, args.worse)
    print(text)
    return 1 if flagged and args.strict else 0


if __name__ == "__main__":
    sys.exit(main())
