"""A fake clock for the tuning harness (shared by the decision tests): programs are timed by
what they contain, so no assertion depends on wall-clock time. The programs are real and run;
only ``autotune.time_calls`` (and the foreign-load probe) are replaced."""

from __future__ import annotations

from hlofuse.runtime import autotune as at


def is_xla_module(text: str) -> bool:
    """Whether a lowered program is XLA's own module (plain jax.jit, no hlofuse module)."""
    return "@call_exported_" not in text


def fake_clock(monkeypatch, kernel_s: float, xla_s: float, xla_module_s: float | None = None):
    """Time a program by its content: ``kernel_s`` while the region's kernel is in it, else
    ``xla_s``; XLA's own module (no hlofuse rewrite at all) ``xla_module_s`` (default: slower
    than both, so region decisions are what the test sees). Returns the list of
    (has_kernel) per timed measurement of hlofuse's programs."""
    seen = []
    if xla_module_s is None:
        xla_module_s = 2 * max(kernel_s, xla_s)

    def cost(text: str) -> float:
        if is_xla_module(text):
            return xla_module_s
        has_kernel = "hlofuse_k" in text
        seen.append(has_kernel)
        return kernel_s if has_kernel else xla_s

    clock_by_text(monkeypatch, cost)
    return seen


def clock_by_text(monkeypatch, cost) -> None:
    """Replace the harness's clock: a call of a program takes ``cost(its lowered text)``
    seconds (each program is lowered once), and no other process loads the machine."""
    texts = {}

    def time_once(fn, args, reps, kwargs=None):
        if id(fn) not in texts:   # fn is kept alive with its text: its id is never reused
            texts[id(fn)] = (fn, fn.lower(*args, **(kwargs or {})).as_text())
        return cost(texts[id(fn)][1])

    class Idle(at.ForeignLoad):  # the machine's real load must not decide what is persisted
        def __exit__(self, *exc):
            super().__exit__(*exc)
            self.foreign = 0.0
            return False

    monkeypatch.setattr(at, "time_calls", time_once)
    monkeypatch.setattr(at, "ForeignLoad", Idle)
