"""A memory budget for one program: ``hlofuse.jit(step, memory_limit=...)`` (issue 45).

The plans a call can run are hlofuse's program (as built: kernels, measured decisions) and XLA's
own module for the function (what ``jax.jit`` runs). Each is compiled for the device the call runs
on and XLA's ``memory_analysis()`` of the executable gives its peak: arguments + outputs +
temporaries - aliased (donated), the bytes the device allocates. Among the plans whose peak fits
the limit, the one with the fewest flops (``cost_analysis()``; hlofuse's first on a tie) runs, and
the report says which and what it costs. When none fits, :class:`MemoryLimitError` says by how
much and lists the largest buffers live at the peak of hlofuse's module with the user's source
lines (hlofuse's liveness estimate of the optimized StableHLO, :func:`memory_plan`).

``memory_limit``: bytes (int), a string with a unit (``"12GiB"``, ``"800MB"``), or ``"device"``:
the device's capacity (``memory_stats()['bytes_limit']`` where the runtime reports it, else the
chip table's HBM capacity, :attr:`hlofuse.core.chips.Chip.hbm_capacity_bytes`; on cpu the host's
physical memory).
"""

from __future__ import annotations

import dataclasses
import logging
import math
import os
import re

from hlofuse.core import ir as hir
from hlofuse.passes.buffer_aliasing import memory_plan
from hlofuse.core.report import fmt_bytes
from hlofuse.core.target import Target

log = logging.getLogger("hlofuse.runtime.memory")

__all__ = ["MemoryLimitError", "Figures", "figures", "resolve_limit", "choose"]

_UNITS = {"": 1, "b": 1, "kb": 10**3, "mb": 10**6, "gb": 10**9, "tb": 10**12,
          "kib": 1 << 10, "mib": 1 << 20, "gib": 1 << 30, "tib": 1 << 40}


class MemoryLimitError(ValueError):
    """No plan of the program fits ``memory_limit``: the message says by how much and what is
    live at the peak."""


@dataclasses.dataclass(frozen=True)
class Figures:
    """XLA's figures for one compiled plan (bytes; flops and bytes accessed from
    ``cost_analysis()``, 0 when the compiler reports none)."""
    argument: int
    output: int
    temp: int
    alias: int
    flops: float = 0.0
    bytes_accessed: float = 0.0

    @property
    def peak(self) -> int:
        return self.argument + self.output + self.temp - self.alias

    def to_dict(self) -> dict:
        return dict(dataclasses.asdict(self), peak=self.peak)


def figures(compiled) -> Figures:
    """The :class:`Figures` of a compiled executable (jax's ``Compiled``)."""
    ma = compiled.memory_analysis()
    ca = {}
    try:
        ca = compiled.cost_analysis()
        if isinstance(ca, (list, tuple)):
            ca = ca[0] if ca else {}
    except (RuntimeError, NotImplementedError, AttributeError, TypeError):
        pass   # a backend without cost analysis: flops unknown
    ca = ca or {}
    return Figures(*(int(getattr(ma, f"{k}_size_in_bytes", 0) or 0)
                     for k in ("argument", "output", "temp", "alias")),
                   float(ca.get("flops", 0.0) or 0.0), float(ca.get("bytes accessed", 0.0) or 0.0))


def resolve_limit(limit, target: Target, device=None) -> int:
    """``memory_limit`` in bytes for a program running on ``target`` (``device``: the jax device
    it runs on, when known)."""
    if isinstance(limit, bool) or limit is None:
        raise ValueError(f"memory_limit={limit!r}: give bytes, a size such as '12GiB', or "
                         f"'device'")
    if isinstance(limit, (int, float)):
        if not math.isfinite(limit):
            raise ValueError(f"memory_limit={limit!r}: must be a finite number of bytes")
        if limit <= 0:
            raise ValueError(f"memory_limit={limit!r}: must be positive")
        return int(limit)
    text = str(limit).strip().lower()
    if text == "device":
        return _device_capacity(target, device)
    m = re.fullmatch(r"([0-9]*\.?[0-9]+)\s*([a-z]*)", text)
    if m is None or m.group(2) not in _UNITS:
        raise ValueError(f"memory_limit={limit!r}: give bytes, a size such as '12GiB' or "
                         f"'800MB', or 'device'")
    return int(float(m.group(1)) * _UNITS[m.group(2)])


def _device_capacity(target: Target, device) -> int:
    if device is not None and not target.is_cpu:
        try:
            stats = device.memory_stats() or {}
            if stats.get("bytes_limit"):
                return int(stats["bytes_limit"])
        # a runtime without memory stats: the chip table
        except (RuntimeError, NotImplementedError, AttributeError, TypeError):
            pass
    if target.is_cpu:
        return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    if not target.chip.hbm_capacity_bytes:
        raise ValueError(f"memory_limit='device': the capacity of {target.chip_name} is not in "
                         f"the chip table; give bytes")
    return target.chip.hbm_capacity_bytes


def choose(plans: dict[str, Figures], limit: int, *, name: str, module=None) -> tuple[str, str]:
    """``(plan, note)``: the plan (a key of ``plans``, in preference order on a flops tie) with
    the fewest flops among those whose peak fits ``limit``, and the report's sentence. Raises
    :class:`MemoryLimitError` when none fits (``module``: hlofuse's optimized module, whose
    largest buffers live at the peak the message lists)."""
    fits = [p for p, f in plans.items() if f.peak <= limit]
    each = ", ".join(f"{p} {fmt_bytes(f.peak)}" for p, f in plans.items())
    if not fits:
        best = min(plans, key=lambda p: plans[p].peak)
        lines = [f"hlofuse.jit({name}): no plan fits memory_limit={fmt_bytes(limit)}: peak per "
                 f"plan "
                 f"(arguments + outputs + temporaries - donated) {each}; the smallest, {best}, "
                 f"is {fmt_bytes(plans[best].peak - limit)} over"]
        lines += _live_at_peak(module)
        lines.append("what lowers it: donate_argnums for parameters and optimizer state, a "
                     "smaller batch, jax.checkpoint around the layers, or sharding the step")
        raise MemoryLimitError("\n".join(lines))
    pick = min(fits, key=lambda p: (plans[p].flops, list(plans).index(p)))
    f = plans[pick]
    over = [p for p in plans if p not in fits]
    note = (f"memory_limit {fmt_bytes(limit)}: runs {pick} (peak {fmt_bytes(f.peak)}, "
            f"temporaries {fmt_bytes(f.temp)}" + (f", {f.flops:.3g} flops" if f.flops else "") + "); " +
            (f"over the limit: {', '.join(f'{p} {fmt_bytes(plans[p].peak)}' for p in over)}"
             if over else f"every plan fits ({each})"))
    return pick, note


def _live_at_peak(module, top: int = 6) -> list[str]:
    if module is None:
        return []
    try:
        plan = memory_plan(hir.main_func(module), {}, top=top)
    except Exception as e:  # noqa: BLE001 - hlofuse's own estimate only adds to a message; logged
        log.debug("no live-at-peak list: %s: %s", type(e).__name__, e)
        return []
    if not plan.live_at_peak:
        return []
    out = [f"largest buffers live at the peak of hlofuse's module (at {plan.peak_at}; "
           f"hlofuse's liveness estimate; arguments {fmt_bytes(plan.argument_bytes)} not listed):"]
    out += [f"  {fmt_bytes(b)} {ty} from {op.split('.', 1)[-1]} at {loc}"
            for b, ty, op, loc in plan.live_at_peak]
    return out
