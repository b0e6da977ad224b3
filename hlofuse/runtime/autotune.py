"""Measured choice of XLA compiler options for one compiled module on the actual device.

XLA:CPU can hand dots, elementwise chains, reductions and convolutions to its YNNPACK
"library fusions" (``xla_cpu_experimental_ynn_fusion_type``; valid values are comma-separated
``LIBRARY_FUSION_TYPE_{DOT,ELTWISE,REDUCE,INDIVIDUAL_DOT,INDIVIDUAL_CONVOLUTION}`` names, and
``""`` turns library fusion off). Whether that pays depends on the model. Measured with
``python -m bench.xla_options`` on 2 shared cores (jax 0.10.2, plain ``jax.jit``, time ratio
to the default): turning it off gives an MLP 3x4096 ~0.5x, BERT/LLaMA layers ~0.9x, but a
layernorm or softmax ~2x and a GPT-2 block ~1.1x *slower*. No static rule picks the right
setting, so hlofuse measures it:

1. For one compiled module (hlofuse's optimized module for one input signature), build the
   candidate :data:`VARIANTS` for the platform. Candidates whose optimized HLO is identical to
   one already kept are dropped without timing (same program, same speed).
2. Time the candidates *interleaved* (round robin, rotating the order every round) for a few
   rounds on the caller's own arguments, within a time budget.
3. Keep the fastest only when the median of its per-round ratios to the default beats the
   default by :data:`MARGIN` and it was faster in at least :data:`MIN_WIN_SHARE` of the rounds;
   otherwise keep XLA's defaults. Regions are decided the same way (each kernel against the
   region's own ops left to XLA, in the whole module), and several choices are confirmed
   together.
4. The program so decided is then held against XLA's own module (:data:`XLA_MODULE`: what
   plain ``jax.jit`` compiles for the function), in rounds of their own after the choices
   (interleaved with the others, a module with large temporaries disturbed their timings).
   hlofuse's program is kept only when it is at least :data:`KEEP_MARGIN` faster, in a
   second window of rounds too (:data:`CLEAR_MARGIN`); otherwise
   calls run XLA's own module, and the report says so with the measured ratio. A rewrite
   that does not pay on this device costs nothing (it measured ~1.02-1.03x on a few models,
   inside :data:`MARGIN`).
5. Cache the decision in memory and on disk (``~/.cache/hlofuse/autotune.json`` or
   ``$HLOFUSE_CACHE_DIR/autotune.json``, written atomically), keyed by the module hash, the
   device (kind, and for CPUs the model name and usable cores), the jax version and the variant
   table's version, so a later process skips the measurement. A measurement during which
   other processes used more than :data:`BUSY_SHARE` of the CPUs stays in memory only: on a
   shared machine the winner depends on how many cores are actually free (measured: ResNet
   stage with library fusion off 0.57x of the default on an idle 2-core machine, ~1.0x while
   other processes held half of it).

When and how much: a signature is tuned on its :data:`TUNE_AT_CALL`-th call (so one-shot calls
never pay); a decision is looked up on the first call and applied from the second. Calls under a
transformation (``jax.jit``, ``grad``, ``vmap``... of a hlofuse function) never tune and always
run the plain ``jax.jit`` path. Tuning logs one line to stderr (logger ``hlofuse``) saying what
is measured and one saying what was chosen; past a second it logs progress per variant. It is
bounded by ``HLOFUSE_AUTOTUNE_BUDGET_S`` (default :data:`DEFAULT_BUDGET_S` s per signature,
compiles included) and is skipped for calls under :data:`MIN_CALL_S`.

Control: ``hlofuse.jit(..., autotune=...)`` or ``HLOFUSE_AUTOTUNE``: ``on``/``1`` (measure
when no decision is cached), ``cached`` (apply decisions found on disk, never measure), ``off``/
``0`` (never). The default is ``on`` on every platform (:func:`mode`).

Safety: a decision never makes the steady state slower than ``autotune=False``: "default" runs
the very same ``jax.jit`` object, and a variant is kept only when it won most interleaved rounds
by :data:`MARGIN`. :data:`XLA_MODULE` runs ``jax.jit``'s own executable for the function (the
one a tiered first call ran), with the function's donation. Options reach XLA only by *variant
name* from :data:`VARIANTS`: a cache entry
naming an unknown variant, or carrying options outside the table (``xla_dump_to``...), is
ignored with one warning; a damaged cache file is treated as empty with one warning.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import logging
import os
import re
import statistics
import sys
import threading
import time
import warnings
from typing import Any, Callable, Sequence

import jax

from hlofuse.core import config
from hlofuse.core import files
from hlofuse.core import hostcpu
from hlofuse.core.pipeline import trace
from hlofuse.core.report import HlofuseWarning
from hlofuse.runtime.testing import compare

__all__ = ["VARIANTS", "KERNEL_VARIANTS", "applicable_variants", "applicable_kernel_variants",
           "settings_of", "Measurement", "measure", "decide", "Decision",
           "DecisionCache", "mode", "enabled_by_default", "device_key", "module_hash",
           "cache_key", "cache", "cached_options", "options_of", "tune", "ForeignLoad",
           "BUSY_SHARE", "TUNE_AT_CALL", "MARGIN", "Variant", "region_key", "region_variants",
           "decide_regions", "cached_xla_regions", "cached_kernel_regions", "record_of", "REGION_PREFIX",
           "XLA_MODULE", "KEEP_MARGIN", "decide_module"]


class _DefaultHandler(logging.StreamHandler):
    """hlofuse's messages on stderr while the application has not configured logging (once
    the root logger has a handler, records propagate there instead: no duplicates)."""

    def emit(self, record):
        if logging.getLogger().handlers:
            return
        self.stream = sys.stderr
        super().emit(record)


log = logging.getLogger("hlofuse")
if not any(isinstance(h, _DefaultHandler) for h in log.handlers):
    _h = _DefaultHandler()
    _h.setFormatter(logging.Formatter("hlofuse: %(message)s"))
    log.addHandler(_h)
    if log.level == logging.NOTSET:
        log.setLevel(logging.INFO)

_warned: set = set()


def _warn_once(msg: str) -> None:
    if msg not in _warned:
        _warned.add(msg)
        warnings.warn(msg, HlofuseWarning, stacklevel=3)

YNN = "xla_cpu_experimental_ynn_fusion_type"

#: Candidate compiler options per platform, name -> options. 'default' (no options) is always
#: first. Bump :data:`VARIANTS_VERSION` whenever this table changes (it is part of the cache key).
VARIANTS: dict[str, dict[str, dict]] = {
    "cpu": {
        "default": {},
        # no YNNPACK library fusion: dots/convs go to XLA's own emitters and Eigen
        "ynn-off": {YNN: ""},
        # YNNPACK only for single dots (no elementwise/reduce chains fused around them)
        "ynn-individual-dot": {YNN: "LIBRARY_FUSION_TYPE_INDIVIDUAL_DOT"},
        # YNNPACK only for convolutions
        "ynn-individual-conv": {YNN: "LIBRARY_FUSION_TYPE_INDIVIDUAL_CONVOLUTION"},
    },
}
#: Kernel variants per platform, name -> pass options (``(pass, option, value)`` triples): the
#: program optimized with another setting of hlofuse's own kernels, where two choices measured
#: close on some host and the better one depends on it. ``attn-budget-x2``: the cpu attention
#: loops with twice the step budget derived from the host's L2 (kernels/attention/blocks.py:
#: on a 2-core Zen 4, 1 MiB L2, the host's 1M-element blocks and 2M ran within 1% of each
#: other, 4M 9-17% slower; on the 2 MiB-L2 Xeon, 2M beat 1M by 11% and 4M ran within 2% of 2M).
#: Only tried when the module has a cpu attention kernel with loops (:data:`VARIANT_NEEDS`).
#: ``attn-key-blocks``: the cpu attention forward in key blocks where it runs whole rows
#: (kernels/attention/blocks.py: CPU_ROW_BUDGET; whole rows won by 20% on the 2-core Zen 4
#: with jax 0.12.1, and lost by 2.3x on jax 0.10.2, so the host and release decide).
KERNEL_VARIANTS: dict[str, dict[str, tuple]] = {
    "cpu": {
        "attn-budget-x2": (("kernelize", "cpu_attention_budget_scale", 2.0),),
        "attn-key-blocks": (("kernelize", "cpu_attention_rows", "blocks"),),
    },
}
VARIANTS_VERSION = 6  # bump when VARIANTS, KERNEL_VARIANTS or the decision rule changes

#: the variant "XLA's own module": the traced function compiled by plain ``jax.jit``, none of
#: hlofuse's rewrites. hlofuse's program (its best options and region choices) is kept only
#: when it beats this one by :data:`KEEP_MARGIN`; a program that is not measurably faster than
#: what ``jax.jit`` gives runs ``jax.jit``'s code instead (never slower than XLA, up to noise)
XLA_MODULE = "xla-module"
#: hlofuse's program must be at least this much faster than XLA's own module (median of the
#: per-round ratios) to be kept. Lower than :data:`MARGIN`: falling back to XLA's own module
#: risks nothing (it is what ``jax.jit`` runs), so a small measured loss is enough to take it
KEEP_MARGIN = 0.02
#: hlofuse's program kept against XLA's own module is measured again, in a second window of
#: rounds of its own, and kept only when that window keeps it too: of twice :data:`ROUNDS`
#: rounds when it measured less than this much faster, of :data:`ROUNDS` otherwise. One that
#: measured at most this much slower is measured again too, and kept only when the next two
#: windows keep it (a disturbed first window must not turn a faster program away). On a
#: shared machine one window lets a program of equal speed through by chance (zoo,
#: keras_cnn_train: kept at 0.96x in 14 rounds, then 1.08x in the bench's 15; a bench of two
#: identical executables had per-round ratios from 0.76 to 1.04 on the 2-core EPYC), and a
#: window can be disturbed for one program more than the other (zoo, linen_unet: hlofuse's
#: program measured 1.03x of XLA's module in one window of a long run, 0.65-0.67x in three
#: other runs, whichever models ran before it)
CLEAR_MARGIN = 0.10


#: a variant is only tried when the module contains one of these op names (no point compiling
#: a convolution-only library option for a module without convolutions)
VARIANT_NEEDS: dict[str, tuple[str, ...]] = {
    "ynn-individual-dot": ("stablehlo.dot_general", "stablehlo.dot "),
    "ynn-individual-conv": ("stablehlo.convolution",),
    # the kernel's info attribute (passes/kernel_table.py) names its blocks: "cpu loops ..."
    "attn-budget-x2": ("|cpu loops ",),
    "attn-key-blocks": ("|cpu row loops ",),
}


def applicable_variants(platform: str, module_text: str | None = None) -> dict[str, dict]:
    """The candidate variants for ``platform``, filtered by the ops the module contains."""
    return _applicable(VARIANTS.get(platform, {"default": {}}), module_text)


def applicable_kernel_variants(platform: str, module_text: str | None = None) -> dict[str, tuple]:
    """The :data:`KERNEL_VARIANTS` for ``platform`` that apply to the module."""
    return _applicable(KERNEL_VARIANTS.get(platform, {}), module_text)


def _applicable(table: dict, module_text: str | None) -> dict:
    if module_text is None:
        return dict(table)
    return {n: o for n, o in table.items()
            if n not in VARIANT_NEEDS or any(op in module_text for op in VARIANT_NEEDS[n])}

#: a variant whose compiled temporaries exceed this many times the reference program's (and
#: HEAVY_TEMP_MIN_BYTES) is timed in rounds of its own: in shared rounds the program timed after
#: it ran slower (attention S=4096: XLA's own code for the region holds 1 GiB; the reference
#: timed after it lost 8-14% and an option variant 1.25x slower was chosen at 0.86-0.92x)
HEAVY_TEMP_FACTOR = 4
HEAVY_TEMP_MIN_BYTES = 64 * 2**20
#: a variant must beat the default by this fraction (median per-round ratio <= 1 - MARGIN)
MARGIN = 0.05
#: ... and be faster than the default in at least this share of the rounds
MIN_WIN_SHARE = 0.7
#: tune on this call of a given compiled module (1 = the first call)
TUNE_AT_CALL = 2
#: rounds of interleaved timing (fewer when the budget does not allow)
ROUNDS = 7
MIN_ROUNDS = 3
#: calls shorter than this are not tuned (compiling variants would not pay off; tests and
#: small helpers stay cheap): only hlofuse's program is timed against XLA's own module
#: (within SHORT_MODULE_BUDGET_S). A decision measured so is cached on disk like any other;
#: 'default' for lack of a measurement is kept in memory only.
MIN_CALL_S = 2e-3
SHORT_MODULE_BUDGET_S = 1.0
#: a caller's single timing of the default (``default_s``) below this is confirmed by more
CONFIRM_BELOW_S = 0.05
DEFAULT_BUDGET_S = config.SETTINGS["HLOFUSE_AUTOTUNE_BUDGET_S"].default
#: work that took longer than this is logged at INFO (progress a user waiting would notice);
#: shorter work at DEBUG, so that small jitted helpers do not each print a line
LOG_AFTER_S = 1.0
#: the least share of the budget the comparison of hlofuse's program with XLA's own module
#: gets of its own, whatever the choices before it spent (:func:`tune`): a tuning then takes
#: up to twice the budget
MODULE_FLOOR_SHARE = 1.0
#: a measurement during which other processes used more than this share of all CPUs is
#: "busy": its decision is used in this process but not written to the disk cache
BUSY_SHARE = 0.25
ENV_ENABLE = "HLOFUSE_AUTOTUNE"
ENV_BUDGET = "HLOFUSE_AUTOTUNE_BUDGET_S"
ENV_CACHE_DIR = "HLOFUSE_CACHE_DIR"


# ------------------------------------------------------------------------------------------
# keys
# ------------------------------------------------------------------------------------------
MODES = ("off", "on", "cached")


def mode(autotune: Any = None, platform: str | None = None) -> str:
    """'off', 'on' or 'cached' from ``hlofuse.jit(autotune=...)``, else ``$HLOFUSE_AUTOTUNE``,
    else 'on' on every platform: hlofuse's code runs only where it was measured faster on this
    device kind (on gpu/tpu, until measured, only the kernels XLA cannot match run; see
    ``hlofuse.passes.kernelize.unmeasured_reasons``). ``platform`` is kept for callers
    that ask per platform; the default no longer depends on it."""
    del platform
    if autotune is None:
        autotune = config.get(ENV_ENABLE)
    if isinstance(autotune, bool):
        return "on" if autotune else "off"
    val = str(autotune).strip().lower()
    if val in ("1", "true", "yes", "on"):
        return "on"
    if val in ("0", "false", "no", "off"):
        return "off"
    if val == "cached":
        return "cached"
    raise ValueError(f"autotune={autotune!r}: expected one of on, off, cached "
                     f"(or True/False; env {ENV_ENABLE})")


def enabled_by_default(platform: str) -> bool:
    """Tuning is on by default on every platform; ``$HLOFUSE_AUTOTUNE`` overrides."""
    return mode(None, platform) != "off"


def usable_cores() -> int:
    try:
        return len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        return os.cpu_count() or 1


def device_key(device=None) -> str:
    """What the decision depends on besides the module: the device kind (and CPU model/cores)."""
    device = device or jax.devices()[0]
    kind = f"{device.platform}:{device.device_kind}"
    if device.platform == "cpu":
        kind += f":{hostcpu.model()}:{usable_cores()}cores"
    return kind


def module_hash(module_bytes: bytes | str) -> str:
    if isinstance(module_bytes, str):
        module_bytes = module_bytes.encode()
    return hashlib.sha256(bytes(module_bytes)).hexdigest()[:32]


def cache_key(mod_hash: str, device: str) -> str:
    return f"{mod_hash}|{device}|jax-{jax.__version__}|v{VARIANTS_VERSION}"


def region_key(region_hash: str, device: str) -> str:
    """Key of a region's kernel-vs-XLA decision: its hash (kind, target, function body), the
    device, the jax version and the decision rule's version."""
    return f"region:{region_hash}|{device}|jax-{jax.__version__}|v{VARIANTS_VERSION}"


#: variant names of "this region without its kernel" start with this
REGION_PREFIX = "xla:"
#: at most this many distinct regions are measured per module (largest modeled traffic first)
MAX_REGION_VARIANTS = 8


@dataclasses.dataclass(frozen=True)
class Variant:
    """One candidate program: compiler options (from :data:`VARIANTS`), the regions (by
    hash) run as XLA's own code instead of their kernels, and pass options of a kernel
    variant (:data:`KERNEL_VARIANTS`). Falsy: the program as optimized."""
    options: tuple = ()                 # sorted (name, value) items
    xla: frozenset = frozenset()
    plain: bool = False                 # XLA's own module (plain jax.jit), no hlofuse rewrite
    settings: tuple = ()                # (pass, option, value) triples

    @classmethod
    def of(cls, spec) -> "Variant":
        if isinstance(spec, Variant):
            return spec
        return cls(tuple(sorted(dict(spec or {}).items())))

    @property
    def options_dict(self) -> dict:
        return dict(self.options)

    def __bool__(self) -> bool:
        return bool(self.options or self.xla or self.plain or self.settings)


def region_variants(regions: Sequence) -> dict[str, Variant]:
    """``xla:<hash>`` variants for the kernelized regions (report :class:`~hlofuse.core.report.Region`
    rows with ``extra['region_hash']``): one per distinct hash (identical regions, e.g. the same
    layernorm in every layer, are decided together), largest modeled traffic first, at most
    :data:`MAX_REGION_VARIANTS`."""
    by_hash: dict[str, int] = {}
    for r in regions:
        h = r.extra.get("region_hash") if r.kernel else None
        if h:
            by_hash[h] = by_hash.get(h, 0) + max(r.bytes_unfused, 1)
    ranked = sorted(by_hash, key=lambda h: -by_hash[h])[:MAX_REGION_VARIANTS]
    return {f"{REGION_PREFIX}{h[:12]}": Variant(xla=frozenset([h])) for h in ranked}


def cached_xla_regions(hashes, device: str | None = None) -> dict[str, dict]:
    """Of the region ``hashes``, those whose cached decision on this device is XLA (hash ->
    the decision: 'choice', 'ratio', 'reason')."""
    return _cached_regions(hashes, "xla", device)


def cached_kernel_regions(hashes, device: str | None = None) -> dict[str, dict]:
    """Of the region ``hashes``, those whose cached decision on this device is the kernel."""
    return _cached_regions(hashes, "kernel", device)


def _cached_regions(hashes, choice: str, device: str | None) -> dict[str, dict]:
    device = device or device_key()
    out = {}
    for h in hashes:
        d = cache().get_region(region_key(h, device))
        if d is not None and d.get("choice") == choice:
            out[h] = d
    return out


# ------------------------------------------------------------------------------------------
# decisions and their cache
# ------------------------------------------------------------------------------------------
@dataclasses.dataclass
class Decision:
    """The chosen variant for one (module, device, jax version)."""
    variant: str                    # name in VARIANTS[platform]
    options: dict                   # compiler options to pass (empty: XLA defaults)
    ratios: dict                    # variant -> median per-round time ratio to default
    default_s: float = 0.0          # median seconds per call with the default options
    rounds: int = 0
    tune_s: float = 0.0             # seconds spent compiling + timing
    reason: str = ""
    foreign_load: float = 0.0       # CPU share other processes took while it was measured
    created: float = 0.0
    # measured kernel-vs-XLA decisions of the module's regions: region hash -> {'choice':
    # 'kernel'|'xla', 'ratio': kernel time / XLA time (0: not timed), 'reason', 'predicted'}
    regions: dict = dataclasses.field(default_factory=dict)

    @property
    def xla_module(self) -> bool:
        """Whether calls run XLA's own module (plain ``jax.jit``) instead of hlofuse's."""
        return self.variant == XLA_MODULE

    @property
    def xla_regions(self) -> frozenset:
        """Hashes of the regions whose kernel lost to XLA's own code (run without kernel)."""
        return frozenset(h for h, r in self.regions.items()
                         if isinstance(r, dict) and r.get("choice") == "xla")

    def note(self, cached: bool = False) -> str:
        src = "cached decision" if cached else f"measured in {self.tune_s:.1f}s"
        others = ", ".join(f"{k} {v:.2f}x" for k, v in sorted(self.ratios.items())
                           if k != "default" and not k.startswith(REGION_PREFIX))
        opts = ", ".join(f"{k}={v!r}" for k, v in self.options.items()) or "XLA defaults"
        regs = ""
        if self.regions:
            xla = [r for r in self.regions.values() if r.get("choice") == "xla"]
            parts = [f"{len(xla)} kept XLA" + (" (" + ", ".join(
                f"kernel {r['ratio']:.2f}x slower" for r in xla[:4]) + ")" if xla else "")]
            parts.append(f"{len(self.regions) - len(xla)} kept kernel")
            regs = f"; regions measured kernel vs XLA: {', '.join(parts)}"
        return (f"autotune: {self.variant} ({opts}); {self.reason}; time vs default: "
                f"[{others or 'no other variant'}]{regs} ({src})")

    def to_json(self) -> dict:
        return dataclasses.asdict(self)

    @classmethod
    def from_json(cls, d: dict) -> "Decision":
        """Validated: raises ValueError on anything but the types :meth:`to_json` writes."""
        if not isinstance(d, dict) or not isinstance(d.get("variant"), str):
            raise ValueError(f"not a decision: {str(d)[:80]!r}")
        types = {"variant": str, "options": dict, "ratios": dict, "default_s": (int, float),
                 "rounds": int, "tune_s": (int, float), "reason": str,
                 "foreign_load": (int, float), "created": (int, float), "regions": dict}
        kw = {}
        for k, v in d.items():
            if k in types:
                if not isinstance(v, types[k]) or isinstance(v, bool):
                    raise ValueError(f"decision field {k!r} has type {type(v).__name__}")
                kw[k] = v
        kw.setdefault("options", {})
        kw.setdefault("ratios", {})
        if not all(isinstance(k, str) and isinstance(v, (int, float)) and not isinstance(v, bool)
                   for k, v in kw["ratios"].items()):
            # a hand-edited ratio that is no number made every note of the decision raise
            raise ValueError("decision field 'ratios' holds a value that is not a number")
        for h, r in kw.get("regions", {}).items():
            if not (isinstance(h, str) and re.fullmatch(r"[0-9a-f]{8,64}", h) and isinstance(r, dict)
                    and r.get("choice") in ("kernel", "xla")
                    and isinstance(r.get("ratio", 0.0), (int, float))):
                raise ValueError(f"decision has a damaged region entry {str(h)[:40]!r}")
        return cls(**kw)


def default_cache_path() -> str:
    return os.path.join(config.get(ENV_CACHE_DIR), "autotune.json")


def _valid_region_decision(d) -> bool:
    return (isinstance(d, dict) and d.get("choice") in ("kernel", "xla")
            and isinstance(d.get("ratio", 0.0), (int, float))
            and isinstance(d.get("reason", ""), str))


def _valid_record(r) -> bool:
    """A measurement record (:func:`record_of`): numbers and a few strings, nothing else."""
    if not isinstance(r, dict) or not isinstance(r.get("kind"), str):
        return False
    if not isinstance(r.get("ratio"), (int, float)) or not r["ratio"] > 0:
        return False
    return all(isinstance(v, (int, float, str)) and not isinstance(v, bool) for v in r.values())


#: newest measurement records kept on disk (the learned cost model fits on them)
MAX_RECORDS = 2000


class DecisionCache:
    """Everything measured, in memory, mirrored to one JSON file written atomically (temp file
    + rename): module decisions (compiler options and the module's region choices), region
    decisions (kernel or XLA, by region hash) and measurement records (region features ->
    measured kernel/XLA time ratio, for the learned cost model).

    Concurrent writers in several processes keep each other's entries: every write re-reads
    the file and merges before renaming, under a lock on ``autotune.json.lock``
    (:func:`hlofuse.core.files.exclusive`; where none can be taken in 5 s, the last rename
    may drop another process's newest entry, and the file is still never corrupted).
    An unreadable file is treated as empty (one warning), a damaged entry is skipped.
    """

    def __init__(self, path: str | None = None):
        self._path = path
        self._mem: dict[str, Decision] = {}
        self._persist: set[str] = set()   # keys of _mem that belong on disk
        self._regions: dict[str, dict] = {}
        self._persist_regions: set[str] = set()
        self._records: list[dict] = []     # the file's records and this process's new ones
        self._new_records: list[dict] = []  # this process's, to be merged into the file
        self._loaded = False
        self._lock = threading.RLock()
        self.hits = 0
        self.misses = 0

    @property
    def path(self) -> str:
        return self._path or default_cache_path()

    def _read_all(self) -> tuple[dict, dict, list]:
        """(decisions, region decisions, records) of the file; a missing file is empty, a
        damaged one (bad JSON, deep nesting, wrong types) is empty with one warning, a damaged
        entry is skipped (one warning)."""
        try:
            with open(self.path) as fh:
                text = fh.read()
        except FileNotFoundError:
            return {}, {}, []
        except (OSError, UnicodeDecodeError) as e:
            _warn_once(f"hlofuse: cannot read the autotune cache {self.path} "
                       f"({type(e).__name__}: {str(e)[:100]}); its decisions are not used"
                       + ("" if isinstance(e, UnicodeDecodeError) else
                          " and it is not rewritten"))
            return {}, {}, []
        try:
            raw = json.loads(text)
            entries = raw.get("decisions", {}) if isinstance(raw, dict) else None
            if not isinstance(entries, dict):
                raise ValueError("no 'decisions' object")
            regions = raw.get("regions", {})
            records = raw.get("records", [])
            if not isinstance(regions, dict) or not isinstance(records, list):
                raise ValueError("'regions' or 'records' of the wrong type")
        except (ValueError, RecursionError, MemoryError, TypeError) as e:
            _warn_once(f"hlofuse: ignoring the damaged autotune cache {self.path} "
                       f"({type(e).__name__}: {str(e)[:100]}); it will be rewritten")
            return {}, {}, []
        out, bad = {}, 0
        for k, v in entries.items():
            try:
                out[str(k)] = Decision.from_json(v)
            except (ValueError, TypeError):
                bad += 1
        regs = {}
        for k, v in regions.items():
            if _valid_region_decision(v):
                regs[str(k)] = v
            else:
                bad += 1
        recs = [r for r in records if _valid_record(r)]
        bad += len(records) - len(recs)
        if bad:
            _warn_once(f"hlofuse: ignoring {bad} damaged entr{'y' if bad == 1 else 'ies'} of "
                       f"the autotune cache {self.path}")
        return out, regs, recs

    def _read_file(self) -> dict[str, Decision]:
        return self._read_all()[0]

    def _load(self) -> None:
        if self._loaded:
            return
        decs, regs, recs = self._read_all()
        self._persist |= set(decs) - set(self._mem)
        decs.update(self._mem)
        self._mem = decs
        self._persist_regions |= set(regs) - set(self._regions)
        regs.update(self._regions)
        self._regions = regs
        self._records = recs + self._new_records
        self._loaded = True

    def get(self, key: str) -> Decision | None:
        with self._lock:
            self._load()
            d = self._mem.get(key)
            if d is None:
                self.misses += 1
            else:
                self.hits += 1
            return d

    def put(self, key: str, decision: Decision, persist: bool = True) -> None:
        with self._lock:
            self._load()
            self._mem[key] = decision
            if persist:
                self._persist.add(key)
                self._write()
            else:
                self._persist.discard(key)

    # -- region decisions and measurement records --------------------------------------------
    def get_region(self, key: str) -> dict | None:
        with self._lock:
            self._load()
            return self._regions.get(key)

    def put_regions(self, entries: dict[str, dict], records: Sequence[dict] = (),
                    persist: bool = True) -> None:
        """Region decisions (key -> {'choice', 'ratio', 'reason', ...}) and the measurement
        records behind them, in one write."""
        with self._lock:
            self._load()
            for k, v in entries.items():
                if not _valid_region_decision(v):
                    raise ValueError(f"not a region decision: {v!r}")
                self._regions[k] = dict(v)
                (self._persist_regions.add if persist else self._persist_regions.discard)(k)
            recs = [dict(r) for r in records if _valid_record(r)]
            self._records.extend(recs)
            if persist:
                self._new_records.extend(recs)
                self._write()

    def records(self) -> list[dict]:
        """Every measurement record known (the file's and this process's)."""
        with self._lock:
            self._load()
            return list(self._records)

    def _write(self) -> None:
        path = self.path
        if os.path.exists(path) and not (os.path.isfile(path) and os.access(path, os.R_OK)):
            return  # another user's (or a damaged) file we cannot read: never replace it
        try:
            os.makedirs(os.path.dirname(path), exist_ok=True)
            with files.exclusive(path):   # another process's merge in between would be lost
                self._merge_and_replace(path)
        except OSError:
            pass  # a read-only home must not break compilation; the decision stays in memory

    def _merge_and_replace(self, path: str) -> None:
        decs, regs, recs = self._read_all()
        decs.update({k: v for k, v in self._mem.items() if k in self._persist})
        regs.update({k: v for k, v in self._regions.items() if k in self._persist_regions})
        seen = {json.dumps(r, sort_keys=True) for r in recs}
        recs += [r for r in self._new_records if json.dumps(r, sort_keys=True) not in seen]
        payload = {"version": 2, "decisions": {k: v.to_json() for k, v in decs.items()},
                   "regions": regs, "records": recs[-MAX_RECORDS:]}
        # atomically, with the mode of the file it replaces or the umask's (a shared
        # cache: another user's process must be able to read the decisions back)
        files.replace_atomically(path, json.dumps(payload, indent=1, sort_keys=True).encode())

    def clear_memory(self) -> None:
        with self._lock:
            self._mem.clear()
            self._persist.clear()
            self._regions.clear()
            self._persist_regions.clear()
            self._records.clear()
            self._new_records.clear()
            self._loaded = False


_CACHE = DecisionCache()


def cache() -> DecisionCache:
    """The process-wide decision cache."""
    return _CACHE


def options_of(decision: Decision | None, platform: str | None = None) -> dict:
    """The compiler options a decision stands for, taken from :data:`VARIANTS` by variant
    name (never from the decision's own ``options``, which a damaged or hand-edited cache
    could fill with anything, e.g. ``xla_dump_to``). Unknown variants: {} and one warning."""
    if decision is None or decision.xla_module:
        return {}
    platform = platform or jax.default_backend()
    table = VARIANTS.get(platform, {"default": {}})
    if decision.variant in KERNEL_VARIANTS.get(platform, {}):
        return {}     # hlofuse's own settings, not XLA's: settings_of
    if decision.variant not in table:
        _warn_once(f"hlofuse: ignoring the autotune decision {decision.variant!r}: not a "
                   f"variant of this hlofuse version ({', '.join(table)})")
        return {}
    opts = dict(table[decision.variant])
    if decision.options and decision.options != opts:
        _warn_once(f"hlofuse: ignoring compiler options {sorted(decision.options)} recorded in "
                   f"the autotune cache for {decision.variant!r}; using the variant table's")
    return opts


def settings_of(decision: Decision | None, platform: str | None = None) -> tuple:
    """The pass options (``(pass, option, value)`` triples) of a decision for a kernel
    variant, from :data:`KERNEL_VARIANTS` by name; () for any other decision."""
    if decision is None or decision.xla_module:
        return ()
    return tuple(KERNEL_VARIANTS.get(platform or jax.default_backend(), {}).get(
        decision.variant, ()))


def cached_options(module_text: str, platform: str | None = None) -> dict:
    """Compiler options of a decision already made for this module on this device, else {}."""
    platform = platform or jax.devices()[0].platform
    if platform not in VARIANTS or mode(None, platform) == "off":
        return {}
    return options_of(cache().get(cache_key(module_hash(module_text), device_key())), platform)


# ------------------------------------------------------------------------------------------
# foreign load
# ------------------------------------------------------------------------------------------
def _proc_stat_busy() -> tuple[float, int] | None:
    """(busy seconds of all CPUs since boot, number of CPUs) from /proc/stat, or None."""
    try:
        with open("/proc/stat") as fh:
            lines = fh.read().splitlines()
    except OSError:
        return None
    total = lines[0].split()
    if total[0] != "cpu":
        return None
    vals = [int(v) for v in total[1:]]
    idle = vals[3] + (vals[4] if len(vals) > 4 else 0)  # idle + iowait
    busy = sum(vals[:8]) - idle                          # user..steal, without guest (in user)
    ncpu = sum(1 for ln in lines if re.match(r"cpu\d+ ", ln))
    hz = os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 100
    return busy / hz, max(ncpu, 1)


class ForeignLoad:
    """Measures the share of the machine's CPU time other processes took while a block ran.

    ``foreign`` = (busy CPU seconds of all CPUs from /proc/stat - this process's CPU seconds)
    / (wall seconds x CPUs); falls back to the 1-minute load average where /proc is missing.
    """

    def __enter__(self):
        self.t0 = time.perf_counter()
        self.cpu0 = time.process_time()
        self.stat0 = _proc_stat_busy()
        return self

    def __exit__(self, *exc):
        self.wall = time.perf_counter() - self.t0
        self.self_cpu = time.process_time() - self.cpu0
        stat1 = _proc_stat_busy()
        if self.stat0 is None or stat1 is None or self.wall <= 0:
            load = os.getloadavg()[0] if hasattr(os, "getloadavg") else 0.0
            ncpu = os.cpu_count() or 1
            self.foreign = max(0.0, min(1.0, load / ncpu))  # coarse fallback
        else:
            busy = stat1[0] - self.stat0[0]
            # a share of all CPUs (at most 1): over a block shorter than a clock tick,
            # /proc/stat's whole ticks alone could make it several
            self.foreign = min(1.0, max(0.0, (busy - self.self_cpu) / (self.wall * stat1[1])))
        self.loadavg = os.getloadavg()[0] if hasattr(os, "getloadavg") else None
        return False


# ------------------------------------------------------------------------------------------
# measurement
# ------------------------------------------------------------------------------------------
_HLO_NAME = re.compile(r"^HloModule \S+", re.M)


def _normalized_hlo(compiled) -> str:
    try:
        text = compiled.as_text()
    # some backends cannot print; treat as distinct
    except (RuntimeError, NotImplementedError, AttributeError, TypeError):
        return repr(id(compiled))
    text = _HLO_NAME.sub("HloModule m", text)
    text = re.sub(r", metadata=\{[^}]*\}", "", text)
    text = re.sub(r"\n(FileNames|FunctionNames|FileLocations|StackFrames)\n(?:.+\n)*", "\n", text)
    return text


#: :func:`quiesce`: this process counts as idle once its threads used less than QUIET_SHARE of
#: one core over a QUIET_WINDOW_S window (other threads' CPU time is accounted in 4 ms ticks
#: here, so a window spans at least one tick); the wait is at most QUIET_WAIT_SHARE of the
#: timed block before it (and QUIET_MAX_WAIT_S), so a process kept busy by other threads slows
#: a measurement by at most that share. Calls shorter than QUIET_MIN_CALL_S are not followed by
#: a wait (a program that short frees little).
QUIET_WINDOW_S = 0.005
QUIET_SHARE = 0.2
QUIET_WAIT_SHARE = 0.5
QUIET_MAX_WAIT_S = 1.0
QUIET_MIN_CALL_S = 0.02


def quiesce(call_s: float, block_s: float | None = None) -> float:
    """Wait (untimed) until the work a timed block of calls left running in this process is
    done; returns the seconds waited. ``call_s``: one call's time; ``block_s``: the block's
    (default ``call_s``), which bounds the wait.

    A runtime frees a program's temporaries on a thread of its own after the outputs are
    ready: after each jax.jit call of the bench's attention S=4096 (1 GiB of logits) one
    thread spent 70-80 ms of system time unmapping them. Timed back to back, that ran during
    the next call measured, on one of the 2 cores: hlofuse's program took 230 ms alone or
    after a 0.2 s pause, 290-300 ms right after a jax.jit call. Waiting here charges that
    tail to neither side (its cost stays out of the program that caused it too, which only
    makes a program with large temporaries look a little faster than its steady state).
    Every timed measurement (:func:`time_calls`, ``bench.runner.timed_calls``) ends with it."""
    if call_s < QUIET_MIN_CALL_S:
        return 0.0
    block_s = call_s if block_s is None else block_s
    t_start = time.perf_counter()
    t_end = t_start + min(QUIET_MAX_WAIT_S, QUIET_WAIT_SHARE * block_s)
    while True:
        c0, t0 = time.process_time(), time.perf_counter()
        time.sleep(QUIET_WINDOW_S)
        wall = time.perf_counter() - t0
        if time.process_time() - c0 <= QUIET_SHARE * wall or time.perf_counter() >= t_end:
            return time.perf_counter() - t_start


def time_calls(fn: Callable, args: Sequence, reps: int, kwargs: dict | None = None,
               cpu: list | None = None) -> float:
    """Seconds per call of ``reps`` back-to-back calls (synchronized once at the end; each
    one where the program spans several CPU devices, see :func:`_sync_each_call`), then
    :func:`quiesce` (untimed). When ``cpu`` is a list, this process's CPU seconds per call
    (all threads) are appended to it."""
    kwargs = kwargs or {}
    c0 = time.process_time()
    t0 = time.perf_counter()
    out = None
    each = False
    for i in range(reps):
        out = fn(*args, **kwargs)
        if i == 0:
            each = _sync_each_call(args, out)
        if each:
            jax.block_until_ready(out)
    jax.block_until_ready(out)
    dt = time.perf_counter() - t0
    if cpu is not None:
        cpu.append((time.process_time() - c0) / reps)
    quiesce(dt / reps, dt)
    return dt / reps


def _sync_each_call(args, out) -> bool:
    """Whether timed calls must wait for each other: a program over several CPU devices
    (its collectives rendezvous across the devices' threads). jaxlib 0.10.2's XLA:CPU deadlocks
    on tens of such calls in flight at once (plain jax.jit too: 50 calls of a 2x2-mesh program
    hang in an all-reduce and abort the process after a minute), so tuning a sharded program
    hung a user's call where jax.jit's would not have made those calls."""
    for leaf in jax.tree_util.tree_leaves((args, out)):
        sharding = getattr(leaf, "sharding", None)
        devices = getattr(sharding, "device_set", None) or ()
        if len(devices) > 1 and any(d.platform == "cpu" for d in devices):
            return True
    return False


@dataclasses.dataclass
class Measurement:
    """What :func:`measure` found."""
    ratios: dict                 # variant -> median of per-round time ratios to 'default'
    eligible: list               # variants faster than the default in >= MIN_WIN_SHARE of rounds
    default_s: float = 0.0       # seconds per call with XLA's defaults
    rounds: int = 0
    duplicates: list = dataclasses.field(default_factory=list)  # same optimized HLO as another
    skipped: str = ""            # why no timing happened (empty when it did)
    foreign_load: float = 0.0    # CPU share other processes took during the timed rounds
    unmeasured: list = dataclasses.field(default_factory=list)  # left out for the budget
    differs: dict = dataclasses.field(default_factory=dict)  # variant -> how its results differ
    round_ratios: dict = dataclasses.field(default_factory=dict)  # variant -> per-round ratios


def reps_for(call_s: float) -> int:
    """Calls per timed measurement of :func:`measure`: about 50 ms of them, 1 to 50."""
    return max(1, min(50, int(0.05 / max(call_s, 1e-6))))


def _jit_factory(call: Callable, jit_kwargs: dict | None) -> Callable[[dict], Callable]:
    jit_kwargs = dict(jit_kwargs or {})
    base = jax.jit(call, **jit_kwargs)
    return lambda options: base if not options else jax.jit(
        call, **dict(jit_kwargs, compiler_options=Variant.of(options).options_dict))


def measure(make: Callable, args: Sequence, variants: dict[str, dict], *,
            kwargs: dict | None = None, budget_s: float = DEFAULT_BUDGET_S,
            rounds: int = ROUNDS, jit_kwargs: dict | None = None,
            default_s: float | None = None,
            progress: Callable[[str], None] | None = None,
            announce: Callable[[], None] | None = None,
            min_call_s: float | None = None) -> Measurement:
    """Compile every variant and time them interleaved on ``args`` / ``kwargs``.

    ``make(options) -> jitted function`` builds a variant (``make({})`` the default, which must
    not donate). A plain function is accepted too: then ``jax.jit(make, compiler_options=...)``.
    The whole measurement (compiles included) stays within about ``budget_s``: the default is
    timed first (or ``default_s`` is used: the caller just timed a warm call) and nothing else
    is compiled when ``MIN_ROUNDS`` rounds of every variant could not fit; rounds stop when the
    budget is spent. ``announce()`` is called once timing is sure to happen, ``progress(message)``
    per compiled variant and per round.
    """
    if not isinstance(make, _Factory):
        make = _Factory(_jit_factory(make, jit_kwargs))
    kwargs = kwargs or {}
    say = progress or (lambda msg: None)
    t_start = time.perf_counter()
    base = make({})
    t_def = _default_time(base, args, kwargs, default_s)
    reps = reps_for(t_def)
    min_call_s = MIN_CALL_S if min_call_s is None else min_call_s
    if t_def < min_call_s:
        return Measurement({"default": 1.0}, [], t_def, 0, [],
                           f"one call takes {t_def * 1e3:.2f} ms (< {min_call_s * 1e3:.0f} ms): "
                           "too short for library choices to matter")
    fit = int(budget_s / (t_def * reps * (MIN_ROUNDS + 1)))
    unmeasured: list[str] = []
    if fit < 2:
        return Measurement({"default": 1.0}, [], t_def, 0, [],
                           f"one call takes {t_def:.2f}s: {MIN_ROUNDS} rounds of "
                           f"{len(variants)} variants do not fit the {budget_s:.0f}s budget")
    if len(variants) > fit:  # the first ones (options, then the largest regions) fit
        unmeasured = list(variants)[fit:]
        variants = dict(list(variants.items())[:fit])
        say(f"budget: {len(unmeasured)} variants not measured")
    if announce is not None:
        announce()
    def rounds_s(n_fns: int) -> float:   # MIN_ROUNDS rounds of n_fns programs, warm-ups too
        return t_def * (reps * MIN_ROUNDS + 1) * n_fns

    fns, temps, dup = _compile_variants(make, base, variants, args, kwargs, t_start, budget_s,
                                        rounds_s, unmeasured, say)
    if len(fns) < 2:
        return Measurement({"default": 1.0}, [], t_def, 0, dup,
                           "every variant compiles to the same program", unmeasured=unmeasured)
    spent = time.perf_counter() - t_start
    while len(fns) > 2 and spent + rounds_s(len(fns)) > budget_s:
        # a slow compile left too little for every compiled program's rounds: the last
        # compiled (lowest priority) ones are left out, not the whole measurement
        dropped = list(fns)[-1]
        del fns[dropped]
        unmeasured.append(dropped)
        say(f"budget: {dropped} compiled but not timed")
    if spent + rounds_s(len(fns)) > budget_s:
        # a compile is not interruptible, but the rounds are: never run them past the budget
        # (a training step's variant took 21s to compile, then 3 rounds ran anyway: 31s)
        return Measurement({"default": 1.0}, [], t_def, 0, dup,
                           f"compiling the variants took {spent:.1f}s: {MIN_ROUNDS} rounds "
                           f"no longer fit the {budget_s:.0f}s budget", unmeasured=unmeasured)
    # an XLA option may change numerics (a library dot sums in another order): its results on
    # these arguments must agree with the default program's within the tolerance table's
    # 'reassociate' category, or it is no candidate (a zoo CNN's logits moved by 80 of 3e5 under
    # one library-dot option). Region variants run the program's own ops instead of a kernel
    # that hlofuse already verified, so they are not held to it. The call doubles as warm-up.
    differs = _drop_differing(fns, variants, base, args, kwargs, default_s, say)
    if len(fns) < 2:
        return Measurement({"default": 1.0}, [], t_def, 0, dup,
                           "no variant computes the default's results within tolerance",
                           unmeasured=unmeasured, differs=differs)
    # only what is still a candidate: a variant dropped above (budget, differing results) keeps
    # its temporaries in ``temps`` but has no program to time any more
    heavy = [n for n in _heavy(temps) if n in fns]
    names = [n for n in fns if n not in heavy]
    probe = ForeignLoad().__enter__()
    try:
        n_rounds, times, pairs = _rounds(fns, names, heavy, base, args, kwargs, reps, rounds,
                                         t_def, t_start, budget_s, unmeasured, say)
    finally:
        probe.__exit__(None, None, None)
    ratios = {n: statistics.median(a / d for a, d in p) for n, p in pairs.items()}
    wins = {n: sum(a < d for a, d in p) for n, p in pairs.items()}
    # a variant must also win most rounds to count (guards against a few lucky rounds)
    eligible = [n for n, p in pairs.items() if n != "default" and wins[n] >= MIN_WIN_SHARE * len(p)]
    return Measurement(ratios, eligible, statistics.median(times["default"]), n_rounds, dup,
                       foreign_load=round(probe.foreign, 3), unmeasured=unmeasured,
                       differs=differs,
                       round_ratios={n: [a / d for a, d in p] for n, p in pairs.items()})


def _default_time(base, args, kwargs, default_s: float | None) -> float:
    """One warm call of the default program, in seconds (``default_s``: the caller's)."""
    if default_s is None:
        time_calls(base, args, 1, kwargs)          # compile (or hit the cache) + warm up
        return time_calls(base, args, 1, kwargs)
    t_def = default_s
    # one warm call is a noisy sample: a fresh executable's first runs pay for allocations
    # and thread start-up (a zoo BERT: 2.5 ms on its 2nd call, then 0.2 ms), so a short
    # program was tuned for 5s. Up to 5 more calls (< 0.25 s) confirm a short one.
    for _ in range(5 if t_def < CONFIRM_BELOW_S else 0):
        t_def = min(t_def, time_calls(base, args, 1, kwargs))
        if t_def < MIN_CALL_S:
            break
    return t_def


def _compile_variants(make, base, variants: dict, args, kwargs, t_start: float,
                      budget_s: float, rounds_s: Callable[[int], float], unmeasured: list,
                      say) -> tuple[dict, dict, list]:
    """:func:`measure`'s compiles, in priority order, within the budget: ``(fns, temps,
    dup)``: each compiled variant's callable and its temporaries' bytes, and the variants that
    compiled to a program already compiled. A variant not compiled for the budget goes to
    ``unmeasured``; one that does not compile is no candidate (the default must compile)."""
    fns: dict[str, Callable] = {}
    temps: dict[str, int | None] = {}
    seen: dict[str, str] = {}
    dup: list[str] = []
    for name, opts in variants.items():
        spent = time.perf_counter() - t_start
        # compiles stop at half the budget, or when one more program's rounds would not fit
        # (variants come in priority order: what is compiled first is measured)
        if name != "default" and (spent > budget_s / 2
                                  or spent + rounds_s(len(fns) + 1) > budget_s):
            say(f"budget: {name} not compiled")
            unmeasured.append(name)
            continue
        try:
            with trace("tune compile", variant=name):
                fn = base if not opts else make(dict(opts) if isinstance(opts, dict) else opts)
                compiled = fn.lower(*args, **kwargs).compile()
        except Exception as e:  # noqa: BLE001 - an option this XLA does not know: not a candidate
            if name == "default":
                raise
            say(f"{name} did not compile ({type(e).__name__}): not a candidate")
            continue
        h = _normalized_hlo(compiled)
        if h in seen:
            dup.append(name)
            continue
        seen[h] = name
        fns[name] = fn
        temps[name] = _temp_bytes(compiled)
        say(f"compiled {name} ({time.perf_counter() - t_start:.1f}s)")
    return fns, temps, dup


def _drop_differing(fns: dict, variants: dict, base, args, kwargs, default_s, say) -> dict:
    """Drop from ``fns`` every option or kernel variant whose results on these arguments
    differ from the default's beyond the tolerance table's 'reassociate' category; warm up the
    others. Returns why each dropped one differs."""
    reference = None
    differs: dict[str, str] = {}
    for n, f in list(fns.items()):
        v = Variant.of(variants[n]) if n != "default" else Variant()
        if v.options or v.settings:
            if reference is None:
                reference = jax.device_get(base(*args, **kwargs))
            problems = compare(jax.device_get(f(*args, **kwargs)), reference, "reassociate")
            if problems:
                differs[n] = problems[0]
                del fns[n]
                say(f"{n}: results differ from the default beyond 'reassociate', not a candidate")
        elif n != "default" or default_s is not None:
            time_calls(f, args, 1, kwargs)         # warm up
    return differs


def _rounds(fns, names, heavy, base, args, kwargs, reps, rounds, t_def, t_start, budget_s,
            unmeasured, say) -> tuple[int, dict, dict]:
    """The timing of :func:`measure`: ``names`` interleaved in rounds (at least
    ``MIN_ROUNDS``, then while the budget lasts), then each ``heavy`` one in rounds of its own
    with the reference. Returns (rounds run, times per name, (variant, default) time pairs per
    name); a heavy one without ``MIN_ROUNDS`` of its own goes to ``unmeasured``."""
    times: dict[str, list[float]] = {n: [] for n in names}
    n_rounds = 0
    for r in range(rounds):
        spent = time.perf_counter() - t_start
        per_round = t_def * reps * len(names)
        if r >= MIN_ROUNDS and spent + per_round > budget_s:
            break
        order = names[r % len(names):] + names[:r % len(names)]
        with trace("tune round", round=r + 1, variants=len(order), reps=reps):
            for n in order:
                times[n].append(time_calls(fns[n], args, reps, kwargs))
        n_rounds += 1
        say(f"round {n_rounds} ({time.perf_counter() - t_start:.1f}s)")
    pairs = {n: list(zip(times[n], times["default"])) for n in names}
    for n in heavy:   # each in rounds of its own with the reference, after the others
        got = _heavy_rounds(fns[n], base, args, kwargs, reps, rounds, t_start, budget_s)
        if len(got) < MIN_ROUNDS:
            unmeasured.append(n)
            say(f"budget: {n} (large temporaries, timed on its own) not timed")
            continue
        pairs[n] = got
        say(f"{n}: {len(got)} rounds of its own (large temporaries)")
    return n_rounds, times, pairs


def _temp_bytes(compiled) -> int | None:
    try:
        return int(compiled.memory_analysis().temp_size_in_bytes)
    # a backend without memory analysis
    except (RuntimeError, NotImplementedError, AttributeError, TypeError):
        return None


def _heavy(temps: dict) -> list:
    """Variants whose temporaries dwarf the reference's (see :data:`HEAVY_TEMP_FACTOR`)."""
    ref = temps.get("default") or 0
    return [n for n, t in temps.items() if n != "default" and t is not None
            and t > max(HEAVY_TEMP_FACTOR * ref, HEAVY_TEMP_MIN_BYTES)]


def _heavy_rounds(fn, base, args, kwargs, reps, rounds, t_start, budget_s) -> list:
    """(variant, reference) time pairs of a heavy variant: per round the variant, then the
    reference once untimed (whatever follows a program with large temporaries runs slower:
    freed memory, cold caches), then the reference timed. Stops when the next round would
    overrun the budget."""
    pairs: list = []
    est = None
    for _ in range(rounds):
        spent = time.perf_counter() - t_start
        if est is not None and spent + est > budget_s:
            break
        t0 = time.perf_counter()
        a = time_calls(fn, args, reps, kwargs)
        time_calls(base, args, 1, kwargs)
        d = time_calls(base, args, reps, kwargs)
        pairs.append((a, d))
        est = time.perf_counter() - t0
    return pairs


class _Factory:
    """Marks a ``make(options) -> jitted`` callable for :func:`measure`."""

    def __init__(self, make):
        self.make = make

    def __call__(self, options):
        return self.make(options)


def factory(make: Callable[[dict], Callable]) -> _Factory:
    """Wrap ``make(options) -> jitted function`` for :func:`measure` / :func:`tune`."""
    return make if isinstance(make, _Factory) else _Factory(make)


def decide(m: Measurement, margin: float = MARGIN) -> tuple[str, str]:
    """The variant to keep: the fastest eligible one when it beats the default by ``margin``."""
    if m.skipped:
        return "default", f"not tuned: {m.skipped}"
    cands = [n for n in m.ratios if n not in ("default", XLA_MODULE) and n in m.eligible
             and not n.startswith(REGION_PREFIX)]
    if cands:
        best = min(cands, key=lambda n: m.ratios[n])
        if m.ratios[best] <= 1.0 - margin:
            return best, f"{m.ratios[best]:.2f}x of the default, beats it by more than {margin:.0%}"
    return "default", f"no variant beats the default by {margin:.0%} in most rounds"


def decide_regions(m: Measurement, names: dict[str, str], margin: float = MARGIN) -> dict:
    """Kernel or XLA for each measured region: ``names`` maps a region variant's name to the
    region hash. The variant is the whole module with that region's kernel replaced by the
    region's own ops (left to XLA), timed interleaved with the module as optimized, so
    ``m.ratios[name]`` = XLA time / kernel time. XLA is kept when it beat the kernel by
    ``margin`` in most rounds (the same rule as for compiler options); a variant that compiles
    to the same program keeps the kernel without timing. Unmeasured regions are absent."""
    out = {}
    for name, h in names.items():
        if name in m.duplicates:
            out[h] = {"choice": "kernel", "ratio": 1.0,
                      "reason": "kept kernel: XLA compiles it to the same program as the "
                                "region's own ops (measured: identical HLO)"}
        elif name in m.ratios and m.rounds:
            r = m.ratios[name]
            k_over_x = 1.0 / r if r > 0 else float("inf")
            if name in m.eligible and r <= 1.0 - margin:
                out[h] = {"choice": "xla", "ratio": round(k_over_x, 4),
                          "reason": f"kept XLA: kernel {k_over_x:.2f}x slower, measured"}
            else:
                out[h] = {"choice": "kernel", "ratio": round(k_over_x, 4),
                          "reason": f"kept kernel: {k_over_x:.2f}x of XLA's time, measured"}
    return out




def budget() -> float:
    return config.get(ENV_BUDGET)


def tune(make: Callable[[dict], Callable], args: Sequence, kwargs: dict | None,
         variants: dict[str, Any], *, name: str = "fun", key: str | None = None,
         default_s: float | None = None, budget_s: float | None = None,
         regions: dict[str, dict] | None = None, min_call_s: float | None = None) -> Decision:
    """Measure ``variants`` of one program on the caller's arguments, log what is measured
    and what was chosen, cache the decision (on disk unless the call was too short or the
    machine busy) and return it. ``make(spec)`` builds a non-donating jitted variant from an
    options dict or a :class:`Variant`.

    ``regions`` describes the region variants (``xla:<hash>`` names in ``variants``): name ->
    {'hash', 'features' (a :func:`record_of` row without the ratio), 'predicted' (the cost
    model's kernel/XLA ratio or None)}. Each measured region's decision is cached by region
    hash, with a measurement record for the learned cost model."""
    with trace("tune", function=name, variants=len(variants)):
        return _tune(make, args, kwargs, variants, name=name, key=key, default_s=default_s,
                     budget_s=budget_s, regions=regions, min_call_s=min_call_s)


def _tune(make, args, kwargs, variants, *, name, key, default_s, budget_s, regions,
          min_call_s) -> Decision:
    budget_s = budget() if budget_s is None else budget_s
    regions = regions or {}
    t0 = time.perf_counter()
    others = [n for n in variants if n not in ("default", XLA_MODULE)
              and not n.startswith(REGION_PREFIX)]
    n_reg = sum(1 for n in variants if n.startswith(REGION_PREFIX))

    def announce():
        log.info("autotuning %s: timing XLA defaults against %s%s%s (budget %.0fs; "
                 "HLOFUSE_AUTOTUNE=off or cached to skip)", name, ", ".join(others) or "no option",
                 f" and {n_reg} region(s) kernel vs XLA" if n_reg else "",
                 ", and against XLA's own module" if XLA_MODULE in variants else "", budget_s)

    def progress(msg):
        if time.perf_counter() - t0 > LOG_AFTER_S:
            log.info("autotuning %s: %s", name, msg)

    # budget: the choices get 60-75% of it (the rest is for confirming a combination of
    # them); XLA's own module is timed in a measurement of its own, after the choices, with
    # what is left: interleaved with the others it disturbed them (attention S=4096: its 1 GiB
    # of temporaries made the program timed next slower; an option 1.25x slower measured 0.86x)
    module_v = variants.get(XLA_MODULE)
    variants = {n: v for n, v in variants.items() if n != XLA_MODULE}
    several = len(variants) > 2 and any(n.startswith(REGION_PREFIX) for n in variants)
    share = (0.6 if several else 0.7) if module_v is not None else (0.75 if several else 1.0)
    m = measure(factory(make), args, variants, kwargs=kwargs,
                budget_s=budget_s * share,
                default_s=default_s, progress=progress, announce=announce,
                min_call_s=min_call_s)
    floor = MIN_CALL_S if min_call_s is None else min_call_s
    if m.rounds and m.default_s < floor:
        # the call measured long once (a preempted first timing) but short over the rounds:
        # too short to tune after all; nothing measured here is kept
        m = Measurement({"default": 1.0}, [], m.default_s, 0, [],
                        f"one call takes {m.default_s * 1e3:.2f} ms (< {floor * 1e3:.0f} ms): "
                        "too short for library choices to matter")
    best, reason = decide(m)
    reason, busy = _explained(m, reason)
    chosen = decide_regions(m, {n: r["hash"] for n, r in regions.items()})
    left = budget_s - (time.perf_counter() - t0)
    best, reason = _confirm_combination(
        make, args, kwargs, variants, regions, m, best, reason, chosen,
        left / 2 if module_v is not None else left, min_call_s, progress)
    module_budget = None
    if module_v is not None and m.default_s >= floor:
        # the comparison with XLA's own module is what keeps a program slower than jax.jit
        # from being kept: it gets MODULE_FLOOR_SHARE of the budget of its own at least, even
        # when the choices' compiles spent it (a zoo ResNet training step on a contended host:
        # one option's compile took 7.6 of the 10 s, the module went untimed and hlofuse's
        # program, kept unmeasured, ran 1.22x jax.jit's time)
        module_budget = max(budget_s - (time.perf_counter() - t0), budget_s * MODULE_FLOOR_SHARE)
        module_min_call_s = min_call_s
    elif module_v is not None and not m.rounds and 0 < m.default_s < floor:
        # too short for library choices, not for hlofuse's program against XLA's own module:
        # two programs, 0.1-0.4 s of rounds (a 0.3 ms GPT-2 decode step: hlofuse's program
        # measured 1.00-1.03x of XLA's module, whose HLO has two loop fusions fewer)
        module_budget = min(budget_s - (time.perf_counter() - t0), SHORT_MODULE_BUDGET_S)
        module_min_call_s = 0.0
    module_timed = module_untimed = module_busy = False
    if module_budget is not None:
        best, reason, module_timed, module_busy = _decide_module_measured(
            make, args, kwargs, module_v, _decided_variant(variants, regions, best, chosen),
            m.default_s, best, reason, module_budget, module_min_call_s, progress)
        module_untimed = not module_timed
        if module_untimed:
            reason += "; not cached on disk: a later process measures again"
    _with_predictions(chosen, regions)
    best_v = Variant.of(variants[best]) if best in variants else Variant()
    d = Decision(best, best_v.options_dict,
                 {k: round(v, 4) for k, v in m.ratios.items()},
                 default_s=m.default_s, rounds=m.rounds, tune_s=time.perf_counter() - t0,
                 reason=reason, created=time.time(), foreign_load=m.foreign_load,
                 regions=chosen)
    # not on disk: a module too small to tune, or a measurement other processes disturbed
    # (library choices flip with the cores actually free; a later process measures again)
    small = bool(m.skipped) and m.default_s < floor and not module_timed
    if key is not None:
        cache().put(key, d, persist=not (small or busy or module_busy or module_untimed))
    if chosen:   # the regions' ratios come from the choices' measurement: its own load
        _store_regions(chosen, regions, m, busy)
    kept_xla = sorted(d.xla_regions)
    log.log(logging.INFO if m.rounds else logging.DEBUG, "autotuning %s: chose %s%s in %.1fs (%s)",
            name, best, f", XLA for {len(kept_xla)} region(s)" if kept_xla else "", d.tune_s,
            reason)
    return d


def _with_predictions(chosen: dict, regions: dict) -> None:
    """Each measured region's decision with the learned cost model's prediction beside it."""
    for r in regions.values():
        if r["hash"] in chosen and r.get("predicted") is not None:
            chosen[r["hash"]]["predicted"] = round(float(r["predicted"]), 4)
            chosen[r["hash"]]["reason"] += f" (cost model predicted {float(r['predicted']):.2f}x)"


def _explained(m: Measurement, reason: str) -> tuple[str, bool]:
    """The decision's reason with what the measurement left out (duplicates, differing
    results, a busy machine), and whether the machine was busy (then nothing is persisted)."""
    if m.duplicates:
        dups = [n for n in m.duplicates if not n.startswith(REGION_PREFIX)]
        if dups:
            reason += f"; same HLO as another variant: {', '.join(dups)}"
    if m.differs:
        reason += ("; not candidates, their results differ from the default's beyond "
                   "'reassociate': " + ", ".join(sorted(m.differs)))
    busy = m.foreign_load > BUSY_SHARE
    if busy:
        reason += (f"; machine busy while measuring (other processes used "
                   f"{m.foreign_load:.0%} of the CPUs): not cached on disk")
    return reason, busy


def _store_regions(chosen: dict, regions: dict, m: Measurement, busy: bool) -> None:
    """Cache the region decisions, and their features and ratios for the learned cost model.
    A disturbed measurement decides this program's regions (in memory) but never teaches the
    cost model, which would carry it to every later program of the process."""
    dev = device_key()
    recs = []
    for n, r in (regions.items() if not busy else ()):
        c = chosen.get(r["hash"])
        if c is not None and n not in m.duplicates and c["ratio"] > 0:
            recs.append(dict(r.get("features", {}), ratio=c["ratio"], device=dev,
                             rule=record_rule(), created=round(time.time())))
    cache().put_regions({region_key(h, dev): dict(c, created=time.time())
                         for h, c in chosen.items()}, recs, persist=not busy)


def _confirm_combination(make, args, kwargs, variants, regions, m, best, reason, chosen,
                         budget_left, min_call_s, progress):
    """Choices are measured one at a time against the program as optimized; when several are
    made (compiler options and regions kept as XLA's code, or several regions) they are timed
    together against it too. The combination is kept only when it beats the program as
    optimized by :data:`MARGIN` in most rounds; otherwise only the single choice that measured
    best is kept, and the others revert (regions to their kernels, with the reason). Mutates
    ``chosen``; returns ``(best option variant, reason)``."""
    xla_names = [n for n, r in regions.items() if chosen.get(r["hash"], {}).get("choice") == "xla"]
    parts = ([best] if best != "default" else []) + xla_names
    if len(parts) < 2:
        return best, reason
    combo = _decided_variant(variants, regions, best, chosen)
    trial = {"default": Variant(), "combined": combo}
    if best != "default" and xla_names:
        # the regions were measured under XLA's default options: under the chosen ones the
        # kernel may win after all (a Winograd convolution: 1.07x of XLA's with library
        # fusions on, 0.82x with them off), so the options alone are timed too
        trial[best] = Variant.of(variants[best])
    mc = measure(factory(make), args, trial, kwargs=kwargs,
                 budget_s=max(budget_left, 0.0), progress=progress, min_call_s=min_call_s)
    r = mc.ratios.get("combined")
    if mc.rounds and r is not None and "combined" in mc.eligible and r <= 1.0 - MARGIN:
        rr = mc.round_ratios or {}
        if best in trial and rr.get(best) and rr.get("combined"):
            alone = statistics.median(c / b for c, b in zip(rr["combined"], rr[best]))
            if alone >= 1.0:
                for n in xla_names:
                    h = regions[n]["hash"]
                    chosen[h] = dict(chosen[h], choice="kernel", reason=chosen[h]["reason"].replace(
                        "kept XLA", "kept kernel: XLA won under XLA's default options") +
                        f", but with {best} the kernel's program measured {1 / alone:.2f}x of XLA's")
                return best, reason + (f"; with the region(s) as XLA's code {alone:.2f}x of "
                                       f"{best} alone: kernels kept")
        return best, reason + f"; choices confirmed together: {r:.2f}x of the program as optimized"
    why = (f"{r:.2f}x of the program as optimized" if mc.rounds and r is not None
           else f"not timed ({mc.skipped or 'same program'})")
    keep = min(parts, key=lambda n: m.ratios.get(n, 1.0))
    for n in xla_names:
        if n != keep:
            h = regions[n]["hash"]
            chosen[h] = dict(chosen[h], choice="kernel",
                             reason=chosen[h]["reason"].replace("kept XLA", "kept kernel: XLA won "
                                                                "alone") +
                             f", but the choices together measured {why}")
    if best != keep:
        return "default", (f"{best} won alone ({m.ratios.get(best, 1.0):.2f}x) but the choices "
                           f"together measured {why}: kept only {keep}")
    return best, reason + f"; the choices together measured {why}: kept only {best}"


def decide_module(m: Measurement, best: str, reason: str, program_ratio: float,
                  margin: float = KEEP_MARGIN, program: str = "default") -> tuple[str, str]:
    """hlofuse's program or XLA's own module. ``program_ratio``: the time of hlofuse's program
    as decided (``best`` options, regions kept as XLA's code; the variant ``program`` of
    ``m``) over the program as optimized; ``m.ratios[XLA_MODULE]``: XLA's own module's time
    over it, measured in the same rounds. hlofuse's program is kept only when it is at least
    ``margin`` faster than XLA's own module and faster in :data:`MIN_WIN_SHARE` of the rounds
    (the rule options must pass: a median on a noisy machine flips between runs). Without a
    timing of XLA's module in ``m``, hlofuse's program stays."""
    if XLA_MODULE not in m.ratios or not m.rounds:
        return best, reason
    rel = _module_rel(m, program_ratio) or 1.0   # hlofuse's program / XLA's own module
    won = _rounds_won(m, program)
    if rel <= 1.0 - margin and (won is None or won[0] >= MIN_WIN_SHARE * won[1]):
        return best, reason + f"; hlofuse's program {rel:.2f}x of XLA's own module's time"
    wins = f", faster in {won[0]} of {won[1]} rounds" if won is not None else ""
    return XLA_MODULE, (f"hlofuse's program measured {rel:.2f}x of XLA's own module's time"
                        f"{wins} (it must be {margin:.0%} faster, in {MIN_WIN_SHARE:.0%} of the "
                        f"rounds, to be kept): calls run XLA's own module, as jax.jit; "
                        f"hlofuse's choices were: {best} ({reason})")


def _rounds_won(m: Measurement, program: str) -> tuple[int, int] | None:
    """(rounds in which ``program`` was faster than XLA's own module, rounds compared), from
    the per-round ratios to the default; None when ``m`` has none (a synthetic measurement)."""
    xr = m.round_ratios.get(XLA_MODULE)
    pr = [1.0] * len(xr or ()) if program == "default" else m.round_ratios.get(program)
    if not xr or not pr:
        return None
    pairs = list(zip(pr, xr))
    return sum(p < x for p, x in pairs), len(pairs)


def _decided_variant(variants, regions, best, chosen) -> Variant:
    """The program the choices make: ``best``'s compiler options, and the regions ``chosen``
    to run as XLA's code."""
    best_v = Variant.of(variants[best]) if best in variants and best != "default" else Variant()
    return Variant(best_v.options, frozenset(r["hash"] for r in regions.values()
                                             if chosen.get(r["hash"], {}).get("choice") == "xla"),
                   settings=best_v.settings)


def _decide_module_measured(make, args, kwargs, module_v, decided, default_s, best, reason,
                            budget_left, min_call_s, progress):
    """:func:`decide_module` on a measurement of its own: hlofuse's program as decided
    (``decided``: ``best``'s options, the regions chosen as XLA's code; falsy: the program as
    optimized), XLA's own module ``module_v`` and the program as optimized (the harness's
    reference; ``default_s``: its seconds per call, 0 when unknown), in up to twice
    :data:`ROUNDS` rounds of their own within ``budget_left``. Without room for them,
    hlofuse's program is kept. It is kept only when two windows keep it
    (:data:`CLEAR_MARGIN`): one that keeps it is followed by another; a close loss in the
    first window (within :data:`CLEAR_MARGIN`) by a second, and a third when the second keeps
    it; the first window that rejects it after the first decides. When a window cannot be
    timed, a clear win of the first is kept, not cached on disk (``timed`` False); anything
    else runs XLA's own module.
    Returns ``(best, reason, timed, busy)``: ``timed`` when the two were measured (or compile
    to the same program), ``busy`` when other processes used more than :data:`BUSY_SHARE` of
    the CPUs in a window (the decision is then not cached on disk)."""
    cands = {"default": Variant(), XLA_MODULE: module_v}
    if decided:
        cands["decided"] = decided
    mc = measure(factory(make), args, cands, kwargs=kwargs, budget_s=max(budget_left, 0.0),
                 rounds=2 * ROUNDS, default_s=default_s or None, progress=progress,
                 min_call_s=min_call_s)
    if XLA_MODULE in mc.duplicates:
        return best, reason + "; XLA's own module compiles to the same program", True, False
    if not mc.rounds or XLA_MODULE not in mc.ratios:
        return best, reason + (f"; not timed against XLA's own module "
                               f"({mc.skipped or 'budget'})"), False, False
    prog = "decided" if decided else "default"

    def judged(w: Measurement):   # (window, (best, reason), hlofuse's program / XLA's module)
        pr = w.ratios.get("decided", 1.0) if decided else 1.0
        return w, decide_module(w, best, reason, pr, program=prog), _module_rel(w, pr)

    wins = [judged(mc)]
    while True:
        _, r, rel = wins[-1]
        kept = [x for x in wins if x[1][0] != XLA_MODULE]
        if rel is None or len(kept) == 2 or (r[0] == XLA_MODULE and (
                len(wins) > 1 or rel > 1.0 + CLEAR_MARGIN)):
            break   # two windows kept it; or the last rejected it (the first: clearly)
        # another window (see CLEAR_MARGIN), with the first one's budget (XLA's module for
        # attention at S=4096 is timed in rounds of its own, ~1 s each)
        clear = r[0] != XLA_MODULE and rel <= 1.0 - CLEAR_MARGIN
        nxt = measure(factory(make), args, cands, kwargs=kwargs, budget_s=max(budget_left, 0.0),
                      rounds=ROUNDS if clear else 2 * ROUNDS, default_s=mc.default_s or None,
                      progress=progress, min_call_s=min_call_s)
        if not nxt.rounds or XLA_MODULE not in nxt.ratios:
            ms = [x[0] for x in wins]
            why = f"a window after it could not be timed ({nxt.skipped or 'budget'})"
            if clear and len(wins) == 1:   # a clear win in one window: kept in this process
                return r[0], f"{r[1]} ({_windows(wins)}); {why}", False, _busy(*ms)
            note = (f"hlofuse's program against XLA's own module: {_windows(wins)}; {why}: "
                    f"calls run XLA's own module, as jax.jit; hlofuse's choices were: {best} "
                    f"({reason})")
            return (*_busy_note((XLA_MODULE, note), *ms), True, _busy(*ms))
        wins.append(judged(nxt))
    ms = [x[0] for x in wins]
    final = wins[-1][1] if wins[-1][1][0] == XLA_MODULE else kept[0][1]
    return (*_busy_note((final[0], f"{final[1]} ({_windows(wins)})"), *ms), True, _busy(*ms))


#: steady-state re-checks (:func:`recheck`): rounds of the screening window; the share of a
#: signature's time its re-checks may take (the interval between two grows to keep them under
#: it); the longest interval. The first comes ``HLOFUSE_RECHECK_S`` after the decision, and the
#: interval doubles each time a re-check keeps what runs.
RECHECK_ROUNDS = 5
RECHECK_SHARE = 0.02
RECHECK_MAX_S = 1800.0


def recheck_cost_s(call_s: float) -> float:
    """About what one screening of :func:`recheck` takes for a program of ``call_s`` seconds
    per call: two programs, :data:`RECHECK_ROUNDS` rounds of :func:`reps_for` calls each (as
    :func:`measure` times them: about 50 ms, fewer for a program under 1 ms), their warm-ups
    and the reference's first timing."""
    return 2 * RECHECK_ROUNDS * reps_for(call_s) * call_s + 4 * call_s


def recheck(make: Callable, args: Sequence, kwargs: dict | None, running_xla: bool, *,
            name: str = "fun", budget_s: float | None = None) -> tuple[bool, str]:
    """A steady-state re-check of a decided signature: is what its calls run still the faster
    of hlofuse's program and XLA's own module? ``make({})`` is hlofuse's program as decided,
    ``make(Variant(plain=True))`` XLA's own module (both non-donating); ``running_xla``: the
    calls run XLA's own module now.

    A screening window of :data:`RECHECK_ROUNDS` interleaved rounds runs first. Only when it
    contradicts what runs (hlofuse's program slower than XLA's module at the median, or, while
    XLA's module runs, hlofuse's program faster by :data:`CLEAR_MARGIN`) is the tuning rule
    applied again, in windows of their own (:func:`_decide_module_measured`: kept only when
    two windows keep it), and its verdict runs. Returns ``(run XLA's module, why)``. Decisions
    of re-checks are the process's only: the disk keeps tuning's."""
    budget_s = budget() if budget_s is None else budget_s
    cands = {"default": Variant(), XLA_MODULE: Variant(plain=True)}
    with trace("recheck", function=name):
        m = measure(factory(make), args, cands, kwargs=kwargs, budget_s=budget_s,
                    rounds=RECHECK_ROUNDS, min_call_s=0.0)
        if XLA_MODULE in m.duplicates:
            return running_xla, "hlofuse's program compiles to XLA's own module"
        if not m.rounds or XLA_MODULE not in m.ratios:
            return running_xla, f"not timed ({m.skipped or 'budget'}): what runs is kept"
        rel = _module_rel(m, 1.0)
        screen = f"hlofuse's program {rel:.2f}x of XLA's own module's time in {m.rounds} rounds"
        suspect = rel <= 1.0 - CLEAR_MARGIN if running_xla else rel > 1.0
        if not suspect:
            return running_xla, f"{screen}: what runs is kept"
        best, why, _, _ = _decide_module_measured(
            make, args, kwargs, Variant(plain=True), Variant(), m.default_s, "default",
            f"the re-check's screening: {screen}", budget_s, 0.0, lambda msg: None)
    run_xla = best == XLA_MODULE
    log.log(logging.INFO if run_xla != running_xla else logging.DEBUG,
            "autotuning %s: steady-state re-check: %s (%s)", name,
            "calls run XLA's own module" if run_xla else "calls run hlofuse's program", why)
    return run_xla, why


def _windows(wins: list) -> str:
    """The windows' ratios: "0.96x in 14 rounds of their own, then 0.95x in 7"."""
    return ", then ".join(f"{rel:.2f}x in {w.rounds}" + (" rounds of their own" if i == 0 else "")
                          for i, (w, _, rel) in enumerate(wins) if rel is not None)


def _busy(*ms: Measurement) -> bool:
    return max(m.foreign_load for m in ms) > BUSY_SHARE


def _busy_note(r: tuple, *ms: Measurement) -> tuple:
    """``(best, reason)``, the reason saying so when a window was busy (:func:`_busy`)."""
    if not _busy(*ms):
        return r
    return r[0], r[1] + (f"; machine busy while timing against XLA's own module (other "
                         f"processes used {max(m.foreign_load for m in ms):.0%} of the CPUs): "
                         "not cached on disk")


def _module_rel(m: Measurement, program_ratio: float) -> float | None:
    """hlofuse's program's time over XLA's own module's in ``m`` (None: the module untimed)."""
    xla = m.ratios.get(XLA_MODULE)
    return program_ratio / xla if xla else None


def record_rule() -> str:
    """What a measurement record is valid for besides the device: jax and the decision rule
    (kernels change with them; the learned model fits only records of the versions in use)."""
    return f"jax-{jax.__version__}|v{VARIANTS_VERSION}"


def record_of(region, target_kind: str) -> dict:
    """The features of a report region a measurement record keeps (no ratio yet)."""
    ex = region.extra
    return {"kind": region.kind, "target": target_kind,
            "bytes_unfused": int(region.bytes_unfused), "bytes_fused": int(region.bytes_fused),
            "flops": int(region.flops), "intermediate_bytes": int(ex.get("intermediate_bytes", 0)),
            "modeled_us_fused": float(ex.get("modeled_us_fused", 0.0)),
            "modeled_us_unfused": float(ex.get("modeled_us_unfused", 0.0)),
            "dtype": str(ex.get("dtype", "f32"))}
