"""What the bench's command line and the zoo runner share: the versions a run records, a
progress bar on stderr, the plain-text table (so neither imports the other) and this process's
resident memory (the RSS figures of the bench, the attention and the memory harnesses)."""

from __future__ import annotations

import os
import platform
import subprocess
import sys
import time


def proc_status() -> dict:
    """This process's resident set now (``VmRSS``) and its peak (``VmHWM``), in bytes, from
    Linux's ``/proc/self/status``; empty where there is none."""
    out = {}
    try:
        with open("/proc/self/status") as fh:
            for line in fh:
                key = line.split(":")[0]
                if key in ("VmRSS", "VmHWM"):
                    out[key] = int(line.split()[1]) * 1024
    except OSError:
        pass
    return out


def reset_peak_rss() -> bool:
    """Reset this process's peak resident set (``VmHWM``) to its current one (Linux's
    ``/proc/self/clear_refs``, value 5), so the next peak is a call's own; False where the
    kernel does not allow it."""
    try:
        with open("/proc/self/clear_refs", "w") as fh:
            fh.write("5")
        return True
    except OSError:
        return False


def _versions() -> dict:
    import jax
    import jaxlib
    import numpy
    import hlofuse
    v = {"python": platform.python_version(), "jax": jax.__version__, "jaxlib": jaxlib.__version__,
         "numpy": numpy.__version__, "hlofuse": getattr(hlofuse, "__version__", "?")}
    try:
        root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
        v["git_commit"] = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=root,
                                         capture_output=True, text=True, timeout=5).stdout.strip()
        dirty = subprocess.run(["git", "status", "--porcelain", "--untracked-files=no"], cwd=root,
                               capture_output=True, text=True, timeout=5).stdout.strip()
        v["git_dirty"] = bool(dirty)
    except (OSError, subprocess.SubprocessError):  # no git here, or it hangs: no commit recorded
        pass
    return v


class Progress:
    """A plain-text progress bar on stderr (one line per step when not a terminal)."""

    def __init__(self, total: int):
        self.total, self.i, self.name, self.t0 = total, 0, "", time.perf_counter()
        self.tty = sys.stderr.isatty()

    def start(self, i: int, name: str):
        self.i, self.name = i, name
        self.show("start")

    def show(self, msg: str):
        done = self.i / max(self.total, 1)
        bar = "#" * int(20 * done) + "." * (20 - int(20 * done))
        line = (f"[{bar}] {self.i + 1}/{self.total} {self.name:<12} {msg:<34} "
                f"{time.perf_counter() - self.t0:6.0f}s")
        if self.tty:
            sys.stderr.write("\r" + line)
        elif not msg.startswith("round ") or msg.split()[1].split("/")[0] == msg.split("/")[-1]:
            sys.stderr.write(line + "\n")  # not a terminal: one line per step, last round only
        sys.stderr.flush()

    def done(self):
        if self.tty:
            sys.stderr.write("\n")
        sys.stderr.flush()


def format_table(rows: list[tuple]) -> str:
    widths = [max(len(str(row[i])) for row in rows) for i in range(len(rows[0]))]
    out = []
    for k, row in enumerate(rows):
        out.append("  ".join(str(c).rjust(w) if 0 < i < len(row) - 1 else str(c).ljust(w)
                             for i, (c, w) in enumerate(zip(row, widths))).rstrip())
        if k == 0:
            out.append("  ".join("-" * w for w in widths))
    return "\n".join(out)
