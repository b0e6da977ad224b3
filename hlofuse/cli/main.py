"""The ``hlofuse`` command line: optimize StableHLO files offline, run, compare and export them.

::

    hlofuse optimize IN -o OUT [--target cpu|gpu|tpu] [--pipeline NAMES] [--disable-pass NAME]
                     [--report FILE.json|.md|.html] [--dump-dir DIR] [--verify] [--format F]
                     [--target-version X.Y.Z] [--shapes TYPES] [--in-place] [--graph DIR]
    hlofuse run FILE [--inputs in.npz] [--outputs out.npz] [--seed N] [--shapes TYPES]
    hlofuse check ORIGINAL OPTIMIZED [--inputs in.npz] [--seed N] [--category kernel]
    hlofuse report FILE [--target T] [--report FILE.json|.md|.html]
    hlofuse export MODULE:FUNCTION --args 'f32[8,128],i32[8]' -o OUT [--target T]
    hlofuse tune MODULE:FUNCTION --args 'f32[8,128]' [--budget S] [--cache-dir DIR]

Inputs are StableHLO (``stablehlo``/``chlo`` ops in ``func.func @main``) in any of four formats
(text, MLIR bytecode, portable artifact, jax.export artifact; detected by content). MHLO modules
are refused (convert them with jaxlib's ``hlo-legalize-to-stablehlo`` pass); modules without any
StableHLO op (e.g. only ``func`` and ``arith``) are passed through unchanged, with a note saying
so; modules with Python host callbacks (``jax.pure_callback``, ``io_callback``,
``jax.debug.print``) are refused, since those cannot be serialized or run outside the process
that traced them.

Flags are absl flags (``absl.flags``), one flag set per subcommand; ``hlofuse CMD --help`` lists
them. Exit codes: 0 success, 1 ``check``/``--verify`` found a numerical mismatch, 2 any error
(one line on stderr naming the file, op or argument; ``--verbose`` adds the traceback).

Crash safety: MLIR and XLA can abort the process on corrupt input (a bad bytecode stream, an XLA
CHECK failure). ``run_main`` therefore runs the subcommand in a child process (``python -P -m
hlofuse.cli.main`` with ``HLOFUSE_CLI_CHILD=1``; ``-P`` so that modules in the current directory
are never imported, see :func:`hlofuse.core.child.python_command`) and turns a child killed by
a signal into the same one-line error and exit code 2, naming the stage (file and step) it died
in. Set ``HLOFUSE_CLI_INPROCESS=1`` to run in-process (debugging). The supervisor
(:mod:`hlofuse.cli.supervisor`, run by the console script :func:`hlofuse.cli.launch.run_main`)
imports no jax and no MLIR: only the worker and help import this module.

Stopping: SIGINT (Ctrl-C), SIGTERM and SIGHUP sent to ``hlofuse`` are forwarded to the worker,
which stops at the next Python step (an output being written is completed first, none is started
afterwards); a worker stuck in native code is killed after 5 seconds, and a worker whose
supervisor is killed outright dies with it (Linux parent-death signal). The exit code is 128 +
the signal number (130 for Ctrl-C, 143 for SIGTERM) with one line such as ``hlofuse optimize:
interrupted by SIGTERM; no output written``. Stage reports and the worker's stderr travel through
pipes, so an interruption leaves no temporary file or folder behind.
"""

from __future__ import annotations

if __name__ == "__main__":
    # ``python -m hlofuse.cli.main`` as the supervisor: supervise the worker without the heavy
    # imports below (the supervisor exits here). Help and the worker itself go on.
    import sys as _sys
    from hlofuse.cli import supervisor as _supervisor
    if not _supervisor.runs_here(_sys.argv):
        _supervisor.run(_sys.argv, None)

import dataclasses
import inspect
import json
import math
import os
import signal
import sys
import textwrap
import traceback
from typing import Callable

from absl import app
from absl import flags

from hlofuse import __version__
from hlofuse.runtime import aot
from hlofuse.core import chips
from hlofuse.core import config
from hlofuse.core import ir as hir
from hlofuse.runtime.api import STABLEHLO_DIALECTS, STRUCTURAL_DIALECTS, DumpError, module_dialects, \
    optimize_loaded
from hlofuse.core.ir import IRError
from hlofuse.core.target import Target
from hlofuse.core.pipeline import OptionError, PassFailure, all_passes, resolve_pipeline, split_options
from hlofuse.runtime.testing import compare
from hlofuse.runtime import argspec

from hlofuse.runtime import formats
from hlofuse.passes.fusion.outline import executable_module
# the supervisor (light: hlofuse.cli.supervisor) and what it shares with the worker: constants,
# messages; imported here too, so that hlofuse.cli.main._supervise, STOP_SIGNALS, ... resolve
from hlofuse.cli import supervisor
from hlofuse.cli.supervisor import (  # noqa: F401  (re-exported)
    CHILD_ENV, COMMAND_NAMES, EXIT_ERROR, EXIT_INTERRUPTED, EXIT_MISMATCH, EXIT_OK, INPROCESS_ENV,
    PARENT_ENV, PROG, STAGE_FD_ENV, STOP_GRACE_S, STOP_SIGNALS, _crash_detail, _error,
    _interrupted_message, _own_lines, _supervise, _wants_help, _Worker)

PAUSE_ENV = "HLOFUSE_CLI_TEST_PAUSE"     # tests: "STAGE-PREFIX=SECONDS[!]" pauses the worker


class UsageError(Exception):
    """Bad command line (missing argument, conflicting flags): exit code 2."""


# ---------------------------------------------------------------------------------------------
# Flag sets, one per subcommand
# ---------------------------------------------------------------------------------------------

def _common(fv: flags.FlagValues) -> None:
    flags.DEFINE_boolean("verbose", False, "Print tracebacks and full diagnostics on errors.",
                         flag_values=fv)


def _optimizer_flags(fv: flags.FlagValues) -> None:
    flags.DEFINE_enum("target", None, ["cpu", "gpu", "tpu"],
                      "Hardware to optimize for (default: the platform a jax.export artifact was "
                      "exported for, else jax's default backend).", flag_values=fv)
    flags.DEFINE_string("pipeline", None, "A pipeline name (default, cleanup, none) or "
                        "comma-separated pass names.", flag_values=fv)
    flags.DEFINE_multi_string("disable-pass", [], "Skip this pass (repeatable, or comma-separated).",
                              flag_values=fv)
    flags.DEFINE_string("dump-dir", None, "Write the module after every pass to DIR/NNN_<pass>.mlir.",
                        flag_values=fv)
    flags.DEFINE_string("shapes", None, "Refine a module with dynamic shapes to these argument types "
                        "of main, e.g. 'f32[8,128],i32[8]' (otherwise it is passed through "
                        "unchanged).", flag_values=fv)
    flags.DEFINE_string("report", None, "Also write the fusion report to FILE (.json, .md, .html "
                        "or .txt).", flag_values=fv)
    flags.DEFINE_string("options", None, "Pass options as JSON, as hlofuse.optimize(options=...) "
                        "takes them, e.g. '{\"kernelize\": {\"unmeasured\": \"kernel\"}}' "
                        "(gpu/tpu: build every kernel, not only those XLA cannot match) or "
                        "'{\"chip\": \"v5e\"}'.", flag_values=fv)
    flags.DEFINE_string("chip", None, "The chip the tiling and cost model are for (h100, a100, v4, "
                        "v5e, v6e, ...; the 'chip' option, as hlofuse.jit(options={'chip': ...})).",
                        flag_values=fv)


def _define_optimize(fv):
    _optimizer_flags(fv)
    flags.DEFINE_string("output", None, "Output file (required unless --in-place).", short_name="o",
                        flag_values=fv)
    flags.DEFINE_boolean("in-place", False, "Replace the input file (atomically).", flag_values=fv)
    flags.DEFINE_enum("format", None, ["text", "bytecode", "portable", "exported"],
                      "Output format (default: the input's). text = .mlir, bytecode = MLIR "
                      "bytecode, portable = StableHLO portable artifact (VHLO), exported = "
                      "jax.export artifact (needs a jax.export input).", flag_values=fv)
    flags.DEFINE_string("target-version", None, "StableHLO version of portable artifacts (also the "
                        "payload of jax.export artifacts); default: the one jax.export uses.",
                        flag_values=fv)
    flags.DEFINE_boolean("verify", False, "Run the original and the optimized module on the same "
                         "random inputs and compare before writing; nothing is written on a "
                         "mismatch (exit 1). Tolerance: --verify-category.", flag_values=fv)
    flags.DEFINE_enum("verify-category", None, ["exact", "kernel", "reassociate", "quantize", "grad"],
                      "Tolerance category of --verify (hlofuse.runtime.testing.TOLERANCES); default: "
                      "what the optimization did, the loosest of 'kernel' and the categories of "
                      "its kernels and numerics-changing passes (a reduction, contraction, "
                      "convolution or attention kernel sums in another order: 'reassociate').",
                      flag_values=fv)
    flags.DEFINE_integer("seed", 0, "Seed of the random inputs of --verify.", lower_bound=0,
                         flag_values=fv)
    flags.DEFINE_string("graph", None, "Also write the module before and after optimization, with "
                        "node-data overlays (kernel or XLA, region, why refused, bytes saved, "
                        "measured time ratio), into DIR for Google's Model Explorer; needs `pip "
                        "install hlofuse[explorer]`. See hlofuse.core.model_explorer.",
                        flag_values=fv)
    _common(fv)


def _define_run(fv):
    flags.DEFINE_string("inputs", None, "Inputs as .npz (arr_0, arr_1, ... or in file order); "
                        "default: random inputs from the signature.", flag_values=fv)
    flags.DEFINE_string("outputs", None, "Write the outputs to this .npz (arr_0, arr_1, ...).",
                        flag_values=fv)
    flags.DEFINE_integer("seed", 0, "Seed of the random inputs.", lower_bound=0, flag_values=fv)
    flags.DEFINE_string("shapes", None, "Argument types for a module with dynamic shapes, e.g. "
                        "'f32[8,128]' (default: the shapes of --inputs).", flag_values=fv)
    _common(fv)


def _define_check(fv):
    flags.DEFINE_string("inputs", None, "Inputs as .npz (default: random inputs from ORIGINAL's "
                        "signature).", flag_values=fv)
    flags.DEFINE_integer("seed", 0, "Seed of the random inputs.", lower_bound=0, flag_values=fv)
    flags.DEFINE_enum("category", "kernel", ["exact", "kernel", "reassociate", "quantize", "grad"],
                      "Tolerance category of hlofuse.runtime.testing.TOLERANCES.", flag_values=fv)
    flags.DEFINE_string("shapes", None, "Argument types for modules with dynamic shapes.",
                        flag_values=fv)
    flags.DEFINE_string("compile-for", None, "Instead: compile FILE for these chips (h100,a100,v5e,"
                        "v4,v6e) without a device; see hlofuse.runtime.aot.", flag_values=fv)
    _common(fv)


def _define_report(fv):
    _optimizer_flags(fv)
    _common(fv)


def _define_export(fv):
    flags.DEFINE_string("args", None, "Argument types, e.g. 'f32[8,128],i32[8]'; a named dimension "
                        "(f32[b,128]) exports a shape-polymorphic function.", flag_values=fv)
    flags.DEFINE_string("output", None, "Output file.", short_name="o", flag_values=fv)
    flags.DEFINE_enum("target", None, ["cpu", "gpu", "tpu"], "Platform to export for (default: "
                      "jax's default backend).", flag_values=fv)
    flags.DEFINE_enum("format", None, ["text", "bytecode", "portable", "exported"],
                      "Output format (default: from the extension: .mlir text, .mlirbc bytecode, "
                      ".vhlo portable, anything else a jax.export artifact).", flag_values=fv)
    flags.DEFINE_string("target-version", None, "StableHLO version of portable artifacts.",
                        flag_values=fv)
    _common(fv)


def _define_tune(fv):
    flags.DEFINE_string("args", None, "Argument types, e.g. 'f32[8,128],i32[8]' (static shapes).",
                        flag_values=fv)
    flags.DEFINE_float("budget", 60.0, "Seconds of measuring per function at most (compiles "
                       "included).", flag_values=fv)
    flags.register_validator("budget", lambda v: v is None or (math.isfinite(v) and v > 0),
                             message="must be a finite number of seconds above 0", flag_values=fv)
    flags.DEFINE_integer("seed", 0, "Seed of the random arguments.", lower_bound=0, flag_values=fv)
    flags.DEFINE_string("cache-dir", None, "Where to write the decisions (default: "
                        "$HLOFUSE_CACHE_DIR or ~/.cache/hlofuse); ship this directory.",
                        flag_values=fv)
    _common(fv)


# ---------------------------------------------------------------------------------------------
# Helpers used by the subcommands (run inside the supervised child)
# ---------------------------------------------------------------------------------------------

def _stage(text: str) -> None:
    """Record what the process is doing, so a crash can be reported as 'while <text>'."""
    _report_to_supervisor("stage", text)
    pause = config.get(PAUSE_ENV)
    if pause and text.startswith(pause.rpartition("=")[0]):
        _test_pause(text, pause.rpartition("=")[2])


# set in the worker from (and removed from) its environment, so that nothing it starts inherits
# them: an `hlofuse` run by a model imported by `hlofuse export` is supervised on its own
_WORKER = {"child": False, "stage_fd": None, "parent": None}


def _become_worker() -> None:
    _WORKER["child"] = os.environ.pop(CHILD_ENV, None) == "1"
    fd, parent = os.environ.pop(STAGE_FD_ENV, None), os.environ.pop(PARENT_ENV, None)
    _WORKER["stage_fd"] = int(fd) if fd and fd.isdigit() else None
    _WORKER["parent"] = int(parent) if parent and parent.isdigit() else None


def _report_to_supervisor(kind: str, text: str) -> None:
    if _WORKER["stage_fd"] is None:
        return
    try:
        # file names need not be UTF-8 (POSIX allows any bytes): never fail on one
        os.write(_WORKER["stage_fd"],
                 f"{kind}\t{' '.join(text.split())}\n".encode("utf-8", "surrogateescape"))
    except OSError:
        pass


def _test_pause(stage: str, spec: str) -> None:
    """Testing hook (``HLOFUSE_CLI_TEST_PAUSE=writing=60``): stall at a stage so a test can
    signal a busy worker; a trailing ``!`` blocks the stop signals meanwhile, like native code
    that does not return to Python."""
    import time
    native = spec.endswith("!")
    print(f"{PROG}: test hook: pausing {spec.rstrip('!')}s at '{stage}'", flush=True)
    if native:
        signal.pthread_sigmask(signal.SIG_BLOCK, STOP_SIGNALS)
    time.sleep(float(spec.rstrip("!")))
    if native:
        signal.pthread_sigmask(signal.SIG_UNBLOCK, STOP_SIGNALS)


# ---------------------------------------------------------------------------------------------
# Interruption (worker side): a stop signal raises Interrupted at the next Python bytecode,
# except while an output is being committed, which always completes first
# ---------------------------------------------------------------------------------------------

class Interrupted(KeyboardInterrupt):
    """SIGINT, SIGTERM or SIGHUP arrived; ``signum`` says which."""

    def __init__(self, signum: int):
        super().__init__(signal.Signals(signum).name)
        self.signum = signum


_WRITTEN: list[str] = []                       # outputs this process has written
_COMMIT = {"depth": 0, "pending": None}        # inside _commit; a signal that arrived there


def _on_stop_signal(signum, frame) -> None:
    for s in STOP_SIGNALS:  # one interruption is enough: let the cleanup run undisturbed
        signal.signal(s, signal.SIG_IGN)
    if _COMMIT["depth"]:
        _COMMIT["pending"] = signum
        return
    raise Interrupted(signum)


def _install_stop_handlers() -> None:
    for s in STOP_SIGNALS:
        signal.signal(s, _on_stop_signal)


def _commit(path: str, write: Callable[[], object]) -> None:
    """Write one output (``write()``, an atomic write of ``path``) without being interrupted
    half-way; a stop signal that arrives meanwhile takes effect right after, with ``path``
    recorded as written."""
    _stage(f"writing {path}")
    _COMMIT["depth"] += 1
    try:
        write()
        _WRITTEN.append(path)
        _report_to_supervisor("wrote", path)
    finally:
        _COMMIT["depth"] -= 1
        pending, _COMMIT["pending"] = _COMMIT["pending"], None
        if not _COMMIT["depth"] and pending is not None:
            raise Interrupted(pending)


def _die_with_parent() -> None:
    """Worker: get SIGKILL when the supervisor dies (Linux ``PR_SET_PDEATHSIG``), the backstop
    for a supervisor killed before it could stop us; exit at once if it is already gone."""
    if sys.platform.startswith("linux"):
        try:
            import ctypes
            libc = ctypes.CDLL(None, use_errno=True)
            libc.prctl(1, int(signal.SIGKILL), 0, 0, 0)  # 1 = PR_SET_PDEATHSIG
        except (OSError, AttributeError):
            pass
    if _WORKER["parent"] is not None and os.getppid() != _WORKER["parent"]:
        os._exit(128 + int(signal.SIGKILL))


def _note(cmd: str, msg: str) -> None:
    print(f"{PROG} {cmd}: note: {msg}", file=sys.stderr)


def _shapes(fv):
    return argspec.parse_arg_specs(fv["shapes"].value, flag="--shapes") if fv["shapes"].value else None


def _disabled(fv) -> list[str]:
    return [p.strip() for v in fv["disable-pass"].value for p in v.split(",") if p.strip()]


def _check_pipeline_flags(fv) -> None:
    try:
        resolve_pipeline(fv["pipeline"].value)
    except (KeyError, OptionError) as e:
        raise UsageError(f"--pipeline: {e.args[0]}") from None
    known = all_passes()
    for name in _disabled(fv):
        if name not in known:
            raise UsageError(f"--disable-pass: unknown pass {name!r}; known passes: "
                             f"{', '.join(sorted(known))}")


def _load(path: str):
    _stage(f"reading {path}")
    # the supervisor reports a parser abort, so skip the (slower) subprocess probe
    return formats.load(path, probe=not _WORKER["child"])


def _pass_options(fv) -> dict | None:
    """--options: a JSON object of pass options, checked against the passes' declarations."""
    text = fv["options"].value
    chip = fv["chip"].value
    if not text and not chip:
        return None
    options = {}
    if text:
        try:
            options = json.loads(text)
        except ValueError as e:
            raise UsageError(f"--options: not JSON ({e}): {text!r}") from None
        if not isinstance(options, dict):
            raise UsageError(f"--options: expected a JSON object, got {text!r}")
    if chip:
        options = dict(options, chip=chip)
    try:
        split_options(options)
        if chip:
            chips.get(chip)
    except (OptionError, ValueError) as e:
        raise UsageError(f"--options: {e}" if text else f"--chip: {e}") from None
    return options


def _optimize(cmd: str, fv, loaded, refine: bool = True):
    """``refine``: refine ``loaded`` to ``--shapes`` first (False: the caller did)."""
    _check_pipeline_flags(fv)
    options = _pass_options(fv)
    _stage(f"optimizing {loaded.source}")
    try:
        return optimize_loaded(loaded, target=fv["target"].value,
                                      pipeline=fv["pipeline"].value, disable=_disabled(fv),
                                      dump_dir=fv["dump-dir"].value,
                                      shapes=_shapes(fv) if refine else None, options=options)
    except DumpError as e:  # the dump directory's problem, not the input's
        raise UsageError(f"--dump-dir: {e.path}: {e.why}") from None


def _inputs(fv, loaded, specs):
    if fv["inputs"].value:
        arrays = formats.load_inputs(fv["inputs"].value)
        # a dynamic module run on given arrays: refine it to their shapes
        if loaded.exported is None and any(not s.is_static for s in specs) and \
                len(arrays) == len(specs) and not fv["shapes"].value:
            argspec.refine_shapes(loaded, [argspec.ArgSpec(a.shape, s.dtype) for a, s in zip(arrays, specs)])
        return arrays
    return argspec.random_inputs_for(argspec.input_specs(loaded), fv["seed"].value, loaded)


def _describe_file(loaded: formats.Loaded) -> str:
    """What a loaded file is, for messages: its format, and its dialects unless StableHLO."""
    name = formats.FORMAT_NAMES[loaded.fmt]
    found = module_dialects(loaded.module)
    if "mhlo" in found:
        return name.replace("StableHLO", "MHLO") if "StableHLO" in name else f"{name} (MHLO)"
    if STABLEHLO_DIALECTS & set(found) or not set(found) - STRUCTURAL_DIALECTS:
        return name
    what = f"{', '.join(found) or 'no'} ops, no StableHLO"
    return f"MLIR text ({what})" if loaded.fmt == "text" else f"{name} ({what})"


def _describe(arrays) -> list[str]:
    import numpy as np
    out = []
    for i, a in enumerate(arrays):
        a = np.asarray(a)
        desc = f"{a.dtype.name}[{','.join(map(str, a.shape))}]"
        if a.size and (a.dtype.kind in "fiub" or a.dtype.name == "bfloat16"):
            f = a.astype(np.float64)
            desc += f" min={np.min(f):.6g} max={np.max(f):.6g} mean={np.mean(f):.6g}"
        elif a.size:
            desc += f" first={a.reshape(-1)[0]!r}"
        out.append(f"  output {i}: {desc}")
    return out


# ---------------------------------------------------------------------------------------------
# Subcommands
# ---------------------------------------------------------------------------------------------

def cmd_optimize(fv, pos) -> int:
    (inp,) = pos
    out = fv["output"].value
    in_place = fv["in-place"].value
    if out is None:
        if not in_place:
            raise UsageError("missing -o OUT (or --in-place to replace the input)")
        out = inp
    elif in_place and not formats.same_file(out, inp):
        raise UsageError(f"--in-place and -o {out} conflict: --in-place replaces the input {inp}; "
                         f"pass one or the other")
    if fv["target-version"].value:
        formats.check_target_version(fv["target-version"].value)
    _check_outputs([("-o", out), ("--report", fv["report"].value)], inputs=[inp],
                   in_place=in_place, dump_dir=fv["dump-dir"].value)
    graph = fv["graph"].value
    if graph is not None:
        _check_graph_dir(graph, [inp, out, fv["report"].value])
    loaded = _load(inp)
    fmt = fv["format"].value or loaded.fmt
    if fmt == "exported" and loaded.exported is None:
        raise UsageError(f"--format exported needs a jax.export input, and {inp} is "
                         f"{formats.FORMAT_NAMES[loaded.fmt]}; use `hlofuse export` to make one")
    shapes = _shapes(fv)
    if shapes:
        # refined first, so that --verify runs the original at these shapes (refining inside
        # the optimizer changed the module in place: --verify got a half-refined original,
        # static arguments over dynamic ops, which XLA cannot compile)
        argspec.refine_shapes(loaded, shapes)
    original = loaded.module
    res = _optimize("optimize", fv, loaded, refine=False)
    _stage(f"serializing the optimized {inp}")
    tv = fv["target-version"].value
    if not res.changed and fmt == loaded.fmt and tv is None and res.module is original \
            and not shapes:
        data = loaded.data  # passed through: the very bytes we read
    else:
        # what XLA compiles: regions left to XLA inline again (the report and --graph keep
        # them as the calls fusion made)
        data = formats.serialize(executable_module(res.module), fmt, target_version=tv,
                                 exported=loaded.exported, target=res.target, source=out)
    if fv["verify"].value:
        status = _verify(fv, loaded, original, data, fmt, out, res.report)
        if status:
            return status
    graph_texts = _graph_texts(res, original) if graph else None   # fails before any write
    _commit(out, lambda: formats.atomic_write(out, data, inputs=[inp], in_place=in_place))
    if fv["report"].value:
        rep = fv["report"].value
        _commit(rep, lambda: formats.write_report(res.report, rep, inputs=[inp, out]))
    written = (_write_graph(graph, graph_texts, keep=[inp, out, fv["report"].value])
               if graph else None)
    r = res.report
    what = (f"{len(r.kernels)} kernel(s), {len(r.left_to_xla)} region(s) left to XLA, main ops "
            f"{r.ops_before} -> {r.ops_after}" if res.changed else "unchanged")
    kind = _describe_file(loaded) if fmt == loaded.fmt else formats.FORMAT_NAMES[fmt]
    print(f"{PROG}: {inp} -> {out} ({kind}, {len(data)} bytes, target "
          f"{res.target}): {what}")
    if written:
        from hlofuse.core.model_explorer import open_command
        print(f"{PROG}: --graph: {len(written)} files in {graph}; open them with: "
              f"{open_command(written)}")
    for n in r.notes:
        _note("optimize", n)
    return EXIT_OK


def _verify(fv, loaded, original, data, fmt, out, report) -> int:
    """--verify: run the original and the serialized result; nonzero when they differ (in
    ``--verify-category``, default :func:`hlofuse.runtime.verify.program_category` of ``report``)."""
    import dataclasses as dc
    from hlofuse.runtime.verify import program_category
    cat = fv["verify-category"].value or program_category(report)
    before = dc.replace(loaded, module=original)
    _stage(f"loading the optimized {loaded.source} for --verify")
    after = formats.load_bytes(data if isinstance(data, bytes) else data.encode(),
                              source=f"{out} (optimized)", probe=False)
    if fmt != "exported" and before.exported is not None:
        before = dc.replace(before, exported=None)  # compare module to module
    specs = argspec.input_specs(before)
    if any(not s.is_static for s in specs):
        _note("optimize", f"--verify skipped: {loaded.source} has dynamic shapes")
        return EXIT_OK
    inputs = argspec.random_inputs_for(specs, fv["seed"].value, loaded)
    _stage(f"running the original {loaded.source} with XLA for --verify")
    want = argspec.execute(before, inputs)
    _stage(f"running the optimized {loaded.source} with XLA for --verify")
    got = argspec.execute(after, inputs)
    problems = compare(got, want, cat)
    if problems:
        return _mismatch(f"{PROG} optimize: --verify: optimized {loaded.source} differs from the "
                         f"original in category {cat} (nothing written)", problems)
    print(f"{PROG}: --verify: {len(got)} output(s) match the original (category {cat}, seed "
          f"{fv['seed'].value})")
    return EXIT_OK


def _mismatch(headline: str, problems: list[str]) -> int:
    """Print ``headline: first problem`` and the others indented on stderr; the mismatch code."""
    print(f"{headline}: {problems[0]}", file=sys.stderr)
    for p in problems[1:]:
        print(f"  {p}", file=sys.stderr)
    return EXIT_MISMATCH


def _names_a_stream(path: str) -> bool:
    """Whether ``path`` goes through /dev or /proc (``/dev/stdout``, ``/dev/fd/1``,
    ``/proc/self/fd/3``): a stream's name, even where it resolves to a regular file."""
    def through(p: str) -> bool:
        parts = os.path.abspath(p).split(os.sep)
        return len(parts) > 2 and (parts[1] == "proc" or (parts[1] == "dev" and parts[2] != "shm"))
    seen = set()
    while True:   # every link on the way: a symlink to /dev/stdout is a stream's name too
        if through(path):
            return True
        if not os.path.islink(path) or path in seen:
            return False
        seen.add(path)
        path = os.path.join(os.path.dirname(os.path.abspath(path)), os.readlink(path))


def _check_outputs(outputs, *, inputs=(), in_place: bool = False, dump_dir: str | None = None) -> None:
    """Validate every output path before any work, so that no output is written when another
    is bound to fail: each ``(flag, path)`` must be a file in a writable directory, not an input
    (``-o`` may be with ``in_place``), and not another output; a ``--report`` needs a known
    extension; ``dump_dir`` must be (or be creatable as) a writable directory. Raises
    :class:`UsageError` naming the flag and the path."""
    seen: list[tuple[str, str]] = []
    for flag, path in outputs:
        if path is None:
            continue
        if flag == "--report" and os.path.splitext(path)[1].lower() not in formats.REPORT_FORMATS:
            raise UsageError(f"--report: {path}: unknown report format; use .json, .md, .html or "
                             f".txt")
        if os.path.isdir(path):
            raise UsageError(f"{flag}: {path}: is a directory")
        if (os.path.exists(path) and not os.path.isfile(path)) or _names_a_stream(path):
            # written atomically (a new file renamed over the path): a FIFO, a device node or
            # /dev/stdout would be replaced by a regular file, not written into (/dev/stdout
            # redirected to a file resolves to that file: `>> log` lost the log's contents)
            raise UsageError(f"{flag}: {path}: not a regular file (outputs are written to a new "
                             f"file renamed into place); give a file path")
        directory = os.path.dirname(os.path.realpath(path))
        _check_writable_dir(flag, path, directory)
        for inp in inputs:
            if formats.same_file(path, inp) and not (in_place and flag == "-o"):
                hint = "; pass --in-place to replace it, or -o another file" if flag == "-o" else ""
                raise UsageError(f"{flag}: {path}: refusing to overwrite the input file{hint}")
        for other_flag, other in seen:
            if formats.same_file(path, other):
                raise UsageError(f"{flag}: {path}: is the same file as {other_flag} {other}")
        seen.append((flag, path))
    if dump_dir is not None:
        _check_dump_dir(dump_dir, [p for _, p in seen] + list(inputs))


def _check_writable_dir(flag: str, path: str, directory: str) -> None:
    if not os.path.isdir(directory):
        raise UsageError(f"{flag}: {path}: directory {directory} does not exist")
    if not os.access(directory, os.W_OK | os.X_OK):
        raise UsageError(f"{flag}: {path}: directory {directory} is not writable")


def _check_dump_dir(dump_dir: str, files) -> None:
    """--dump-dir: an existing directory, or one whose nearest existing ancestor is a writable
    directory; none of the command's inputs and outputs may be a dump file name in it."""
    import re
    if os.path.exists(dump_dir) and not os.path.isdir(dump_dir):
        raise UsageError(f"--dump-dir: {dump_dir}: exists and is not a directory")
    existing = os.path.abspath(dump_dir)
    while not os.path.exists(existing):
        existing = os.path.dirname(existing)
    if not os.path.isdir(existing):
        raise UsageError(f"--dump-dir: {dump_dir}: {existing} is not a directory")
    if not os.access(existing, os.W_OK | os.X_OK):
        raise UsageError(f"--dump-dir: {dump_dir}: directory {existing} is not writable")
    real = os.path.realpath(dump_dir)
    for f in files:
        if os.path.dirname(os.path.realpath(f)) == real and \
                re.fullmatch(r"\d{3}_.+\.mlir|failed_before_.+\.mlirbc", os.path.basename(f)):
            raise UsageError(f"--dump-dir: {dump_dir}: would overwrite {f} with a dump file")


def _check_graph_dir(graph: str, files) -> None:
    """--graph DIR: Model Explorer is installed; DIR is a directory or can be made; none of the
    command's inputs and outputs is one of the files written there. Before any work."""
    from hlofuse.core import model_explorer as mex
    try:
        mex.require()
    except ImportError as e:
        raise UsageError(f"--graph: {e}") from None
    if os.path.exists(graph) and not os.path.isdir(graph):
        raise UsageError(f"--graph: {graph}: exists and is not a directory")
    existing = os.path.abspath(graph)
    while not os.path.exists(existing):
        existing = os.path.dirname(existing)
    if not os.path.isdir(existing) or not os.access(existing, os.W_OK | os.X_OK):
        raise UsageError(f"--graph: {graph}: directory {existing} is not writable")
    ours = mex.paths(graph).values()
    for f in (f for f in files if f):
        for p in ours:
            if formats.same_file(f, p):
                raise UsageError(f"--graph: {graph}: would overwrite {f} with {os.path.basename(p)}")


def _graph_texts(res, original) -> dict[str, str]:
    """--graph: the files' contents (:func:`hlofuse.core.model_explorer.contents`): the module
    before (``original``) and after, and the overlays."""
    from hlofuse.core import model_explorer as mex
    _stage(f"building the Model Explorer graph of {res.report.source}")
    return mex.contents(res.report, after=hir.to_text(res.module, debug_info=True),
                        before=hir.to_text(original, debug_info=True))


def _write_graph(graph: str, texts: dict[str, str], *, keep) -> dict[str, str]:
    """--graph DIR: write ``texts`` there, each file atomically, never over an input or another
    output (``keep``). Returns name -> path of the files written."""
    from hlofuse.core import model_explorer as mex
    try:
        os.makedirs(graph, exist_ok=True)
    except OSError as e:
        raise UsageError(f"--graph: {graph}: cannot create the directory: {e.strerror or e}") from None
    where = mex.paths(graph)
    written = {}
    for name, text in texts.items():
        path = where[name]
        _commit(path, lambda: formats.atomic_write(path, text, inputs=[k for k in keep if k]))
        written[name] = path
    return written


def cmd_run(fv, pos) -> int:
    (path,) = pos
    _check_outputs([("--outputs", fv["outputs"].value)],
                   inputs=[path] + ([fv["inputs"].value] if fv["inputs"].value else []))
    loaded = _load(path)
    shapes = _shapes(fv)
    if shapes:
        _stage(f"refining the shapes of {path}")
        argspec.refine_shapes(loaded, shapes)
    inputs = _inputs(fv, loaded, argspec.input_specs(loaded))
    _stage(f"running {path} with XLA")
    outs = argspec.execute(loaded, inputs)
    print(f"{PROG}: ran {path} ({_describe_file(loaded)}) on {len(inputs)} "
          f"{'given' if fv['inputs'].value else 'random (seed %d)' % fv['seed'].value} input(s):")
    print("\n".join(_describe(outs)))
    if fv["outputs"].value:
        dst, given = fv["outputs"].value, [path] + ([fv["inputs"].value] if fv["inputs"].value else [])
        _commit(dst, lambda: formats.save_outputs(dst, outs, inputs=given))
    return EXIT_OK


def cmd_check(fv, pos) -> int:
    if fv["compile-for"].value:  # hlofuse check --compile-for CHIPS FILE (hlofuse.runtime.aot)
        return aot.cli_compile_for(fv["compile-for"].value, pos)
    a_path, b_path = pos
    a, b = _load(a_path), _load(b_path)
    shapes = _shapes(fv)
    if shapes:
        for x in (a, b):
            if x.exported is None:
                argspec.refine_shapes(x, shapes)
    sa, sb = argspec.input_specs(a), argspec.input_specs(b)
    if not shapes and (_refine_like(a, sa, b, sb) or _refine_like(b, sb, a, sa)):
        sa, sb = argspec.input_specs(a), argspec.input_specs(b)
    if [str(s) for s in sa] != [str(s) for s in sb]:
        print(f"{PROG} check: MISMATCH: the inputs differ: {a_path} takes "
              f"({', '.join(map(str, sa))}), {b_path} takes ({', '.join(map(str, sb))})",
              file=sys.stderr)
        return EXIT_MISMATCH
    inputs = _inputs(fv, a, sa)
    if fv["inputs"].value and b.exported is None and any(not s.is_static for s in sb):
        argspec.refine_shapes(b, [argspec.ArgSpec(x.shape, s.dtype) for x, s in zip(inputs, sb)])
    _stage(f"running {a_path} with XLA")
    want = argspec.execute(a, inputs)
    _stage(f"running {b_path} with XLA")
    got = argspec.execute(b, inputs)
    cat = fv["category"].value
    problems = compare(got, want, cat)
    if problems:
        return _mismatch(f"{PROG} check: MISMATCH: {b_path} differs from {a_path} (category {cat})",
                         problems)
    print(f"{PROG}: OK: {len(got)} output(s) of {b_path} match {a_path} (category {cat}, "
          f"{'given inputs' if fv['inputs'].value else 'random inputs, seed %d' % fv['seed'].value})")
    return EXIT_OK


def _refine_like(dyn, dyn_specs, static, static_specs) -> bool:
    """``check ORIGINAL OPTIMIZED`` after ``optimize --shapes``: refine the dynamic side to the
    static side's argument types when they are a refinement of its own (same count, element
    types and static dimensions), as ``--shapes`` did; returns whether it did."""
    if dyn.exported is not None or all(s.is_static for s in dyn_specs) or \
            not all(s.is_static for s in static_specs) or len(dyn_specs) != len(static_specs):
        return False
    for d, s in zip(dyn_specs, static_specs):
        if d.dtype != s.dtype or len(d.shape) != len(s.shape) or any(
                isinstance(x, int) and x != y for x, y in zip(d.shape, s.shape)):
            return False
    _stage(f"refining the shapes of {dyn.source}")
    argspec.refine_shapes(dyn, static_specs)
    _note("check", f"refined {dyn.source} to the argument types of {static.source} "
          f"({', '.join(map(str, static_specs))}), as optimize --shapes does")
    return True


def cmd_report(fv, pos) -> int:
    (path,) = pos
    _check_outputs([("--report", fv["report"].value)], inputs=[path], dump_dir=fv["dump-dir"].value)
    loaded = _load(path)
    res = _optimize("report", fv, loaded)
    print(str(res.report))
    if fv["report"].value:
        rep = fv["report"].value
        _commit(rep, lambda: formats.write_report(res.report, rep, inputs=[path]))
    return EXIT_OK


def cmd_export(fv, pos) -> int:
    (spec,) = pos
    out = fv["output"].value
    if not out:
        raise UsageError("missing -o OUT")
    if fv["args"].value is None:
        raise UsageError("missing --args (argument types, e.g. 'f32[8,128],i32[8]'; '' for none)")
    specs = argspec.parse_arg_specs(fv["args"].value)
    module_file = spec.rpartition(":")[0]
    _check_outputs([("-o", out)], inputs=[module_file] if os.path.isfile(module_file) else [])
    fmt = fv["format"].value or formats.format_for_path(out)
    tv = fv["target-version"].value
    if tv:
        formats.check_target_version(tv)
    import jax
    wide = [str(s) for s in specs if str(s.np_dtype) in argspec.X64_DTYPES]
    if wide and not jax.config.jax_enable_x64:
        # jax would trace them as their 32-bit types and export those (a warning only)
        raise UsageError(f"--args {', '.join(wide)}: 64-bit types need JAX's 64-bit mode "
                         f"(set JAX_ENABLE_X64=1); without it jax traces them as 32-bit")
    fn = _import_function(spec)
    # the function's own source file (MODULE:FUNCTION names a module, not its path)
    source = getattr(inspect.getmodule(fn), "__file__", None) or ""
    if source and os.path.isfile(source) and formats.same_file(out, source):
        raise UsageError(f"-o: {out}: is the source file of {spec}; refusing to overwrite it")
    from jax import export as jexport
    platform = Target.of(fv["target"].value).platform
    _stage(f"exporting {spec} for {platform}")
    try:
        scope = jexport.SymbolicScope()
        args = []
        for s in specs:
            shape = s.shape if s.is_static else jexport.symbolic_shape(
                ",".join(str(d) for d in s.shape), scope=scope)
            args.append(jax.ShapeDtypeStruct(shape, s.np_dtype))
        jitted = fn if hasattr(fn, "lower") else jax.jit(fn)
        exp = jexport.export(jitted, platforms=[platform])(*args)
    except Exception as e:  # noqa: BLE001 - the user's function runs here: one line naming what it raised
        raise formats.FileError(f"{spec}: jax.export failed for ({', '.join(map(str, specs))}): "
                               f"{formats.first_line(e)}") from None
    _stage(f"serializing {out}")
    if fmt == "exported" and not tv:
        data = bytes(exp.serialize())
    else:
        loaded = formats.load_bytes(bytes(exp.serialize()), source=spec, probe=False)
        data = formats.serialize(loaded.module, fmt, target_version=tv, exported=exp, source=out)
    _commit(out, lambda: formats.atomic_write(out, data))
    print(f"{PROG}: exported {spec}({', '.join(map(str, specs))}) for {platform} -> {out} "
          f"({formats.FORMAT_NAMES[fmt]}, {len(data)} bytes)")
    return EXIT_OK


def cmd_tune(fv, pos) -> int:
    (spec,) = pos
    if fv["args"].value is None:
        raise UsageError("missing --args (argument types, e.g. 'f32[8,128],i32[8]')")
    specs = argspec.parse_arg_specs(fv["args"].value)
    if not all(s.is_static for s in specs):
        raise UsageError("--args: tune needs static shapes (decisions are per shape)")
    if fv["cache-dir"].value:
        try:
            os.makedirs(fv["cache-dir"].value, exist_ok=True)
        except OSError as e:
            raise UsageError(f"--cache-dir: {fv['cache-dir'].value}: cannot create the "
                             f"directory: {e.strerror or e}") from None
        os.environ["HLOFUSE_CACHE_DIR"] = os.path.abspath(fv["cache-dir"].value)
    fn = _import_function(spec)
    import jax
    import hlofuse
    from hlofuse.runtime.testing import random_inputs
    from hlofuse.runtime import autotune as at
    args = random_inputs([jax.ShapeDtypeStruct(s.shape, s.np_dtype) for s in specs],
                         seed=fv["seed"].value)
    from hlofuse.frontend.jit import HlofuseFunction
    target = fn.__wrapped__ if isinstance(fn, HlofuseFunction) else fn
    f = hlofuse.jit(target, autotune="on")
    _stage(f"measuring {spec} on {at.device_key()}")
    d = f.tune(*args, budget_s=fv["budget"].value)
    where = at.cache().path
    if d is None:
        print(f"{PROG}: {spec}: nothing to tune (no kernel and no compiler-option variant)")
        return EXIT_OK
    print(f"{PROG}: {spec}({', '.join(map(str, specs))}) on {at.device_key()}:")
    print(f"  options: {d.variant} ({d.reason})")
    rep = f.report(*args)
    for r in rep.regions:
        c = d.regions.get(r.extra.get("region_hash"))
        if c is not None:
            print(f"  region {r.id} ({r.kind}, {', '.join(r.locations[:2]) or 'unknown'}): "
                  f"{c['reason']}")
    unmeasured = [r for r in rep.regions if r.extra.get("region_hash")
                  and r.extra["region_hash"] not in d.regions]
    if unmeasured:
        print(f"  {len(unmeasured)} region(s) not measured (short call or budget): kernels kept")
    if d.foreign_load > at.BUSY_SHARE:
        print(f"  measured in {d.tune_s:.1f}s while other processes used the machine: the "
              f"decisions were not written to {where}; run it again on a quiet machine")
        return EXIT_OK
    print(f"  decisions in {where} (measured in {d.tune_s:.1f}s);"
          f" ship it and run with HLOFUSE_CACHE_DIR={os.path.dirname(where)} HLOFUSE_AUTOTUNE=cached")
    return EXIT_OK


def _import_function(spec: str) -> Callable:
    import importlib
    import importlib.util
    modname, sep, attr = spec.rpartition(":")
    if not sep or not modname or not attr:
        raise UsageError(f"{spec!r}: expected MODULE:FUNCTION (e.g. mypkg.model:forward or "
                         f"path/to/model.py:forward)")
    _stage(f"importing {modname}")
    try:
        if modname.endswith(".py") or os.sep in modname:
            if not os.path.isfile(modname):
                raise formats.FileError(f"{modname}: no such file")
            sp = importlib.util.spec_from_file_location("_hlofuse_export_module", modname)
            mod = importlib.util.module_from_spec(sp)
            sp.loader.exec_module(mod)
        else:
            if os.getcwd() not in sys.path:
                sys.path.insert(0, os.getcwd())
            mod = importlib.import_module(modname)
    except formats.FileError:
        raise
    except SystemExit as e:  # a script without a __main__ guard: one line, exit 2, nothing written
        raise formats.FileError(f"{modname}: importing it called sys.exit({e.code!r}) (guard the "
                               "script's own code with `if __name__ == \"__main__\":`)") from None
    except Exception as e:  # noqa: BLE001 - the user's module runs here: one line naming what it raised
        raise formats.FileError(f"{modname}: cannot import: {type(e).__name__}: "
                               f"{formats.first_line(e)}") from None
    obj = mod
    for part in attr.split("."):
        if not hasattr(obj, part):
            raise formats.FileError(f"{spec}: module {modname} has no attribute {attr!r}")
        obj = getattr(obj, part)
    if not callable(obj):
        raise formats.FileError(f"{spec}: {attr} is not callable")
    return obj


@dataclasses.dataclass(frozen=True)
class Command:
    usage: str
    summary: str
    description: str
    define: Callable
    main: Callable
    n_positional: int


COMMANDS: dict[str, Command] = {
    "optimize": Command(
        "optimize IN -o OUT [flags]",
        "optimize a StableHLO file (text, bytecode, portable artifact, jax.export artifact)",
        "Optimize IN for a target and write OUT (same format as IN unless --format). Formats are\n"
        "detected by content. Portable artifacts are written at --target-version; a jax.export\n"
        "artifact keeps its calling convention and loads back with jax.export.deserialize.\n"
        "Modules whose main has dynamic shapes are refined with --shapes or written unchanged;\n"
        "so are modules without StableHLO ops (e.g. func + arith). MHLO is refused.\n"
        "OUT is written atomically; IN is never overwritten unless --in-place.",
        _define_optimize, cmd_optimize, 1),
    "run": Command(
        "run FILE [--inputs in.npz] [--outputs out.npz] [--seed N]",
        "execute a StableHLO file through XLA",
        "Compile FILE with XLA on jax's default backend and run it, on --inputs or on seeded\n"
        "random inputs built from its signature; print a summary and optionally save outputs.",
        _define_run, cmd_run, 1),
    "check": Command(
        "check ORIGINAL OPTIMIZED [--inputs in.npz] [--seed N] [--category kernel]",
        "run two files on the same inputs and compare (exit 1 on mismatch)",
        "Run ORIGINAL and OPTIMIZED on the same inputs and compare every output with\n"
        "hlofuse.runtime.testing.compare under the tolerance --category. Exit 1 when they differ.",
        _define_check, cmd_check, 2),
    "report": Command(
        "report FILE [--target T] [--report FILE.json|.md|.html]",
        "print the fusion plan and modeled savings without writing the module",
        "Optimize FILE in memory and print what would be fused, into which kernels, what is left\n"
        "to XLA and why, and the modeled memory traffic. Nothing but --report is written.",
        _define_report, cmd_report, 1),
    "export": Command(
        "export MODULE:FUNCTION --args 'f32[8,128],i32[8]' -o OUT [--target T]",
        "export a JAX function to a file with jax.export",
        "Import FUNCTION from MODULE (a module name importable from the current directory, or\n"
        "path/to/file.py), export it with jax.export for the given argument types and platform\n"
        "and write OUT (format from --format or OUT's extension).",
        _define_export, cmd_export, 1),
    "tune": Command(
        "tune MODULE:FUNCTION --args 'f32[8,128],f32[128]' [--budget S] [--cache-dir DIR]",
        "measure, on this device, each kernel against XLA's own code and XLA's options",
        "Import FUNCTION from MODULE, call it through hlofuse.jit on seeded random arguments of\n"
        "the given types and measure, interleaved: every kernelized region against XLA's own code\n"
        "for it (in the whole program) and XLA compiler-option variants. The faster is kept and\n"
        "the decisions are written to the decision cache (--cache-dir), keyed by region hash,\n"
        "device and versions. Ship that directory: hlofuse.jit(..., autotune='cached') with\n"
        "HLOFUSE_CACHE_DIR pointing at it applies the decisions without measuring.",
        _define_tune, cmd_tune, 1),
}

# the supervisor names the subcommands without importing this module
assert tuple(COMMANDS) == COMMAND_NAMES, "update hlofuse.cli.supervisor.COMMAND_NAMES"


# ---------------------------------------------------------------------------------------------
# Help, parsing, error reporting
# ---------------------------------------------------------------------------------------------

def _top_help() -> str:
    width = max(len(n) for n in COMMANDS)
    lines = [f"usage: {PROG} COMMAND [flags] ...", "",
             "Optimize StableHLO files offline (fusion into Pallas kernels), run and compare them.",
             "", "commands:"]
    lines += [f"  {n.ljust(width)}  {c.summary}" for n, c in COMMANDS.items()]
    lines += ["", f"'{PROG} COMMAND --help' lists a command's flags. Exit codes: 0 ok, 1 numerical "
              f"mismatch (check, --verify), 2 error."]
    return "\n".join(lines)


def _command_help(name: str, fv: flags.FlagValues) -> str:
    c = COMMANDS[name]
    lines = [f"usage: {PROG} {c.usage}", "", c.description, "", "flags:"]
    for flag in sorted({id(f): f for f in fv._flags().values()}.values(), key=lambda f: f.name):
        names = (f"-{flag.short_name}, " if flag.short_name else "") + (
            f"--[no]{flag.name}" if flag.boolean else f"--{flag.name}")
        default = "" if flag.default in (None, [], False) else f" (default: {flag.default_as_str})"
        text = flag.help.split(";\n")[0] + default  # drop absl's "repeat this option" suffix
        lines.append(f"  {names}")
        lines += textwrap.wrap(text, 96, initial_indent="      ", subsequent_indent="      ")
    return "\n".join(lines)


def _one_line(e: BaseException) -> str:
    lines = [l.strip() for l in str(e).strip().splitlines() if l.strip()]
    if not lines:
        return type(e).__name__
    return lines[0] if len(lines) == 1 else lines[0] + (" (" + lines[1] + ")" if len(lines[1]) < 200 else "")


def _dispatch(argv: list[str]) -> int:
    """Parse ``argv`` (program name first) with absl and run the subcommand; returns the exit code."""
    args = argv[1:]
    if not args:
        print(_top_help(), file=sys.stderr)
        return EXIT_ERROR
    if args[0] in ("-h", "--help", "-help", "help"):
        if args[0] == "help" and len(args) > 1 and args[1] in COMMANDS:
            args = [args[1], "--help"]
        else:
            print(_top_help())
            return EXIT_OK
    if args[0] == "--version":
        print(f"{PROG} {__version__}")
        return EXIT_OK
    name = args[0]
    if name not in COMMANDS:
        _error(None, f"unknown command {name!r}; expected one of {', '.join(COMMANDS)} "
               f"(see '{PROG} --help')")
        return EXIT_ERROR
    cmd = COMMANDS[name]
    fv = flags.FlagValues()
    cmd.define(fv)
    if _wants_help(args[1:]):
        print(_command_help(name, fv))
        return EXIT_OK
    verbose = "--verbose" in args
    parsed = {}

    def parse(argv_):
        try:
            rest = fv([f"{PROG} {name}"] + args[1:])
        except flags.Error as e:
            _error(name, f"{_one_line(e)} (see '{PROG} {name} --help')")
            sys.exit(EXIT_ERROR)
        if not flags.FLAGS.is_parsed():
            # absl.app requires its global flags parsed (we use none of them); keep absl logging
            # at WARNING (absl.app would raise it to INFO) unless --verbose
            flags.FLAGS([argv_[0], f"--verbosity={0 if verbose else -1}"])
        parsed["pos"] = rest[1:]
        return argv_

    def main(_):
        pos = parsed["pos"]
        if len(pos) != cmd.n_positional and not (name == "check" and fv["compile-for"].value):
            what = "argument" if cmd.n_positional == 1 else "arguments"
            _error(name, f"expected {cmd.n_positional} positional {what}, got {len(pos)}"
                   f"{': ' + ' '.join(pos) if pos else ''} (usage: {PROG} {cmd.usage})")
            return EXIT_ERROR
        return _run_command(name, cmd, fv, pos, verbose)

    try:
        app.run(main, argv=[argv[0]], flags_parser=parse)
    except SystemExit as e:
        return e.code if isinstance(e.code, int) else (0 if e.code is None else EXIT_ERROR)
    return EXIT_OK


def _run_command(name: str, cmd: Command, fv, pos, verbose: bool) -> int:
    _WRITTEN.clear()
    try:
        rc = _run_command_body(name, cmd, fv, pos, verbose)
    finally:
        _report_to_supervisor("done", name)
    return rc


def _run_command_body(name: str, cmd: Command, fv, pos, verbose: bool) -> int:
    try:
        return cmd.main(fv, pos) or EXIT_OK
    except KeyboardInterrupt as e:
        signum = getattr(e, "signum", signal.SIGINT)
        print(f"{PROG} {name}: {_interrupted_message(signum, _WRITTEN)}", file=sys.stderr)
        return 128 + int(signum)
    except BrokenPipeError:  # `hlofuse report ... | head`
        return supervisor.reader_left()
    except SystemExit as e:  # the user's function (export and tune trace it) ended the process
        where = pos[0] if pos else name
        _error(name, f"{where}: the function called sys.exit({e.code!r}); nothing was written")
        return EXIT_ERROR
    except (UsageError, IRError, PassFailure) as e:
        if verbose:
            traceback.print_exc()
        _error(name, _one_line(e) if not isinstance(e, PassFailure) else
               f"{pos[0]}: {_one_line(e)}")
        return EXIT_ERROR
    except Exception as e:  # noqa: BLE001 - CLI top level: an hlofuse bug or a library error is one line
        if verbose:
            traceback.print_exc()
        where = pos[0] if pos else name
        _error(name, f"{where}: {type(e).__name__}: {_one_line(e)}"
               + ("" if verbose else " (--verbose for the traceback)"))
        return EXIT_ERROR


def run_main(argv: list[str] | None = None) -> int:
    """Entry point of ``python -m hlofuse.cli.main`` (the worker's command line too): the
    ``hlofuse`` command, as the console script (:func:`hlofuse.cli.launch.run_main`) runs it;
    returns through ``sys.exit``."""
    supervisor.run(argv, lambda: sys.modules[__name__])


if __name__ == "__main__":
    run_main()
