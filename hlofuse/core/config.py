"""hlofuse's settings from the environment, declared once.

Every ``HLOFUSE_*`` environment variable hlofuse reads is declared here with its type, default
and one line of doc, and read through :func:`get`, one parser with one error format::

    from hlofuse.core import config
    config.get("HLOFUSE_AUTOTUNE_BUDGET_S")      # 10.0 unless the environment says otherwise

A setting is read when it is used (not at import), so a process that changes ``os.environ``
sees the change. Settings that change what a compiled program is (``program=True``) are part of
both module-cache keys (:func:`program_key`); a test sets each one and asserts another key.
``docs/settings.md`` is generated from these declarations (:func:`markdown`; a test checks it
is current). Per-call settings (``hlofuse.jit(autotune=..., tiered=..., options=...)``) take
precedence over these where both exist.

This module sits at the bottom of the layers: it imports nothing of hlofuse.
"""

from __future__ import annotations

import dataclasses
import os
from typing import Any, Callable

__all__ = ["Setting", "SettingError", "SETTINGS", "get", "program_key", "markdown", "page"]

_TRUE = ("1", "true", "yes", "on")
_FALSE = ("0", "false", "no", "off")


class SettingError(ValueError):
    """An environment variable of hlofuse's with a value its type does not allow."""


@dataclasses.dataclass(frozen=True)
class Setting:
    name: str          # the environment variable
    type: str          # bool | int | float | path | list | choice
    default: Any
    doc: str           # one line
    program: bool = False       # changes the compiled program: part of the module-cache keys
    choices: tuple = ()         # type 'choice': the values allowed (lowercase)
    internal: bool = False      # hlofuse's own plumbing (the CLI's worker process), not for users
    minimum: float | None = None    # int and float: the smallest value allowed
    finite: bool = False            # float: infinity is refused too

    def parse(self, raw: str) -> Any:
        """The value of ``raw`` (the variable's text, not empty) as this setting's type."""
        text = raw.strip()
        low = text.lower()
        if self.type == "bool":
            if low in _TRUE:
                return True
            if low in _FALSE:
                return False
            return self._bad(raw, f"one of {', '.join(_TRUE + _FALSE)}")
        if self.type == "int":
            if low in self.choices:
                return low
            try:
                value = int(text)
            except ValueError:
                alt = f" or {', '.join(self.choices)}" if self.choices else ""
                return self._bad(raw, self._number() + alt)
            return self._at_least(raw, value)
        if self.type == "float":
            try:
                value = float(text)
            except ValueError:
                return self._bad(raw, self._number())
            if value != value or (self.finite and value in (float("inf"), float("-inf"))):
                # NaN compares false with every bound (max(nan, x) is nan); an infinite
                # budget overflowed int() in tuning, naming no setting
                return self._bad(raw, self._number())
            return self._at_least(raw, value)
        if self.type == "choice":
            if low in self.choices:
                return low
            return self._bad(raw, f"one of {', '.join(self.choices)}")
        if self.type == "list":
            return tuple(p.strip() for p in text.split(",") if p.strip())
        if self.type == "path":
            # '~/x' quoted in a .env file or a Docker ENV reaches us unexpanded: a folder
            # literally named '~' in the working directory is never what was meant
            return os.path.expanduser(text)
        return text

    def _bound(self) -> str:
        return "" if self.minimum is None else f" of at least {self.minimum:g}"

    def _number(self) -> str:
        """What a numeric setting takes: 'an integer', 'a (finite) number', with its bound."""
        kind = ("an integer" if self.type == "int" else
                "a finite number" if self.finite else "a number")
        return kind + self._bound()

    def _at_least(self, raw: str, value):
        if self.minimum is not None and value < self.minimum:
            return self._bad(raw, self._number())
        return value

    def _bad(self, raw: str, expected: str):
        raise SettingError(f"{self.name}={raw!r}: expected {expected} ({self.doc})")


def _cache_dir_default() -> str:
    return os.path.join(os.path.expanduser("~"), ".cache", "hlofuse")


_DECLARED = [
    # -- what runs ----------------------------------------------------------------------------
    Setting("HLOFUSE_AUTOTUNE", "choice", "on",
            "tuning: on (measure hlofuse's code against XLA's on this device, default), off, or "
            "cached (use earlier decisions only); hlofuse.jit(autotune=...) wins",
            choices=_TRUE + _FALSE + ("cached",)),
    Setting("HLOFUSE_AUTOTUNE_BUDGET_S", "float", 10.0,
            "seconds one signature's tuning may spend (compiles and timing)", minimum=0,
            finite=True),
    Setting("HLOFUSE_RECHECK_S", "float", 30.0,
            "with tuning on, seconds of calls before a decided signature is re-checked against "
            "XLA's own module (the interval then doubles while re-checks keep it); 0: never",
            minimum=0),
    Setting("HLOFUSE_TIERED", "bool", True,
            "tiered first calls: the first call runs XLA's code while hlofuse builds its own in "
            "the background; hlofuse.jit(tiered=...) wins"),
    Setting("HLOFUSE_DISABLE_PASSES", "list", (),
            "pass names to skip, comma-separated, in every pipeline (as disable=)", program=True),
    # -- caches -------------------------------------------------------------------------------
    Setting("HLOFUSE_CACHE_DIR", "path", None,
            "where tuning decisions, optimized modules and XLA's compiles are kept"),
    Setting("HLOFUSE_MODULE_CACHE", "bool", True,
            "keep optimized modules on disk, so a second process skips the passes"),
    Setting("HLOFUSE_XLA_CACHE", "bool", True,
            "point jax's persistent compilation cache at <cache dir>/xla unless the application "
            "set one"),
    # -- kernels and rewrites -----------------------------------------------------------------
    Setting("HLOFUSE_CPU_ATTENTION_PARTS", "int", 1,
            "independent loops per cpu attention kernel (an integer, or 'cores'); 1 measured "
            "neutral", program=True, choices=("cores",), minimum=1),
    Setting("HLOFUSE_CPU_ELEMENTWISE_KERNELS", "bool", False,
            "build elementwise kernels on cpu too (XLA:CPU fuses them as well; the test suite "
            "sets it to exercise kernels)", program=True),
    Setting("HLOFUSE_GRAD_REMAT", "bool", True,
            "recompute attention in the backward pass of jax.grad through hlofuse.jit instead "
            "of saving its probabilities (not for functions with effects)", program=True),
    # -- tools --------------------------------------------------------------------------------
    Setting("HLOFUSE_AOT_PYTHON", "path", None,
            "the interpreter with the aot extra's compilers, when it is not this one"),
    # -- the CLI's worker process (set by hlofuse itself) -------------------------------------
    Setting("HLOFUSE_CLI_INPROCESS", "bool", False,
            "run CLI subcommands in this process instead of a child (debugging)"),
    Setting("HLOFUSE_CLI_CHILD", "bool", False, "this process is the CLI's worker",
            internal=True),
    Setting("HLOFUSE_CLI_STAGE_FD", "int", None,
            "the pipe the CLI's worker reports its stage on", internal=True),
    Setting("HLOFUSE_CLI_PARENT", "int", None, "the CLI's parent process id", internal=True),
    Setting("HLOFUSE_CLI_TEST_PAUSE", "path", None,
            "a stage at which the CLI's worker pauses (tests of the crash guard)", internal=True),
]

SETTINGS: dict[str, Setting] = {s.name: s for s in _DECLARED}

_DEFAULTS: dict[str, Callable[[], Any]] = {"HLOFUSE_CACHE_DIR": _cache_dir_default}


def get(name: str) -> Any:
    """The value of setting ``name`` from the environment, or its default (an empty variable
    counts as unset). :class:`SettingError` names the variable, the value and what it takes."""
    s = SETTINGS[name]
    raw = os.environ.get(name, "")
    if not raw.strip():
        make = _DEFAULTS.get(name)
        return make() if make is not None else s.default
    return s.parse(raw)


def program_key() -> dict:
    """The settings that change a compiled program, as they are now (module-cache keys)."""
    return {s.name: get(s.name) for s in _DECLARED if s.program}


def markdown() -> str:
    """The settings table of ``docs/settings.md``."""
    rows = ["| variable | type | default | what it does |", "|---|---|---|---|"]
    for s in _DECLARED:
        if s.internal:
            continue
        default = "~/.cache/hlofuse" if s.name == "HLOFUSE_CACHE_DIR" else s.default
        kind = s.type + (f" ({', '.join(s.choices)})" if s.type == "int" and s.choices else "")
        kind += f" >= {s.minimum:g}" if s.minimum is not None else ""
        kind += ", finite" if s.finite else ""
        doc = s.doc + (" *Part of the module-cache keys.*" if s.program else "")
        rows.append(f"| `{s.name}` | {kind} | `{default!r}` | {doc} |")
    return "\n".join(rows) + "\n"


def page() -> str:
    """``docs/settings.md``: the table with what surrounds it."""
    return ("# Settings\n\n"
            "<!-- generated by `python -m hlofuse.cli.settings` from hlofuse/core/config.py; "
            "tests/test_config.py checks it is current -->\n\n"
            "hlofuse reads these environment variables, each when it is used. An empty variable "
            "counts as unset; a value its type does not allow is an error naming the variable. "
            "Arguments of `hlofuse.jit` (`autotune=`, `tiered=`, `disable=`, `options=`) take "
            "precedence over the variables where both exist. The settings marked as part of the "
            "module-cache keys change the program hlofuse builds, so a module cached under one "
            "value is never used under another.\n\n" + markdown())

