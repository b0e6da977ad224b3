"""The ``hlofuse`` command's supervisor: it runs each command in a worker process.

The worker is ``python -P -m hlofuse.cli.main`` (see :mod:`hlofuse.cli.main` for the crash
safety and the stop signals); the supervisor only starts it, forwards stop signals and turns a
crash into one line. This module imports the standard library and light hlofuse modules only
(no jax, no MLIR: ``python -X importtime -c "import hlofuse.cli.launch"`` names neither), so
the supervisor starts in tens of milliseconds instead of paying the worker's 1.5 s of imports a
second time. :func:`run` is the command itself: help (``hlofuse --help``, ``hlofuse CMD
--help``, ``--version``) and the worker import :mod:`hlofuse.cli.main` (through ``here``)
when they run. Its entry points: :func:`hlofuse.cli.launch.run_main` (the console script) and
:func:`hlofuse.cli.main.run_main` (``python -m hlofuse.cli.main``). :mod:`hlofuse.cli.main`
imports its constants and messages from here; this module never imports it.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from types import ModuleType
from typing import Callable, NoReturn

from hlofuse.core import config
from hlofuse.core.child import python_command

PROG = "hlofuse"
CHILD_ENV = "HLOFUSE_CLI_CHILD"
INPROCESS_ENV = "HLOFUSE_CLI_INPROCESS"
STAGE_FD_ENV = "HLOFUSE_CLI_STAGE_FD"    # the worker reports its stage through this pipe
PARENT_ENV = "HLOFUSE_CLI_PARENT"        # the supervisor's pid, for the worker's death signal

EXIT_OK, EXIT_MISMATCH, EXIT_ERROR, EXIT_INTERRUPTED = 0, 1, 2, 130
# signals that stop a command: forwarded to the worker, exit code 128 + signal number
STOP_SIGNALS = tuple(getattr(signal, n) for n in ("SIGINT", "SIGTERM", "SIGHUP") if hasattr(signal, n))
STOP_GRACE_S = 5.0  # how long the worker gets to stop cleanly before it is killed

# the subcommands, named here without importing hlofuse.cli.main (whose COMMANDS must list
# exactly these, in this order: it checks so when imported)
COMMAND_NAMES = ("optimize", "run", "check", "report", "export", "tune")


# ---------------------------------------------------------------------------------------------
# Messages shared with the worker (hlofuse.cli.main imports them from here)
# ---------------------------------------------------------------------------------------------

def _wants_help(args: list[str]) -> bool:
    for a in args:
        if a == "--":
            return False
        if a in ("-h", "--help", "-help", "--helpfull", "--helpshort"):
            return True
    return False


def _error(cmd: str | None, msg: str) -> None:
    prefix = f"{PROG} {cmd}" if cmd else PROG
    print(f"{prefix}: error: {msg}", file=sys.stderr)


def _interrupted_message(signum: int, written) -> str:
    name = signal.Signals(signum).name
    if not written:
        return f"interrupted by {name}; no output written"
    return f"interrupted by {name}; already written: {', '.join(written)}"


# ---------------------------------------------------------------------------------------------
# Supervisor: run the command in a child process and report crashes as errors
# ---------------------------------------------------------------------------------------------

def _high_fd(fd: int, low: int = 100) -> int:
    """``fd`` moved to a number of at least ``low`` (close-on-exec, as ``os.pipe`` makes it);
    ``fd`` itself where the system refuses."""
    import fcntl
    try:
        high = fcntl.fcntl(fd, getattr(fcntl, "F_DUPFD_CLOEXEC", fcntl.F_DUPFD), low)
    except OSError:
        return fd
    os.close(fd)
    return high


def _named_fds(argv: list[str]) -> list[int]:
    """Open file descriptors the command line names (``/dev/fd/63``, ``/proc/self/fd/3``: a
    shell's process substitution ``<(...)``): the worker inherits them, as the command would."""
    import re
    fds = []
    for a in argv:
        for m in re.finditer(r"(?:^|=)/(?:dev/fd|proc/self/fd)/(\d+)$", a):
            fd = int(m.group(1))
            try:
                os.fstat(fd)
            except OSError:
                continue
            if fd > 2:
                fds.append(fd)
    return fds


class _Worker:
    """The worker process and the supervisor's side of its pipes and of stop signals.

    Stop signals (SIGINT, SIGTERM, SIGHUP) that reach the supervisor are forwarded to the worker
    once; if it has not exited ``STOP_GRACE_S`` later (stuck in native code), or on a second
    signal, it is killed. Stage reports and stderr come through pipes, so no temporary file or
    folder exists that an interruption could leave behind.
    """

    def __init__(self, argv: list[str], env: dict):
        import threading
        self.signum: int | None = None
        self.stages: list[tuple[str, str]] = []
        self.stderr = b""
        self._saved = {s: signal.signal(s, self._on_signal) for s in STOP_SIGNALS}
        named = _named_fds(argv)   # before the pipe: never the supervisor's own descriptors
        stage_r, stage_w = os.pipe()
        stage_w = _high_fd(stage_w)   # the worker's low numbers stay free: a /dev/fd/4 the
        # shell never opened is "no such file" there, not the stage pipe (a hang)
        try:
            self.proc = subprocess.Popen(argv, stderr=subprocess.PIPE,
                                         pass_fds=(stage_w, *named),
                                         env=dict(env, **{STAGE_FD_ENV: str(stage_w),
                                                          PARENT_ENV: str(os.getpid())}))
        except BaseException:  # noqa: BLE001 - re-raised: closes the pipe, restores the handlers
            os.close(stage_r)
            self._restore()
            raise
        finally:
            os.close(stage_w)
        self._readers = [threading.Thread(target=self._read_stages, args=(stage_r,), daemon=True),
                         threading.Thread(target=self._read_stderr, daemon=True)]
        for t in self._readers:
            t.start()
        if self.signum is not None:  # arrived while starting it
            self._send(self.signum)

    def _on_signal(self, signum, frame) -> None:
        import threading
        if self.signum is not None:  # a second stop signal: do not wait any longer
            self._send(signal.SIGKILL)
            return
        self.signum = signum
        if getattr(self, "proc", None) is not None:
            self._send(signum)
        timer = threading.Timer(STOP_GRACE_S, self._send, args=(signal.SIGKILL,))
        timer.daemon = True
        timer.start()

    def _send(self, signum) -> None:
        proc = getattr(self, "proc", None)
        if proc is not None and proc.returncode is None:
            try:
                proc.send_signal(signum)
            except OSError:
                pass

    def _read_stages(self, fd: int) -> None:
        with os.fdopen(fd, "rb") as fh:
            for line in fh:
                kind, _, text = line.decode("utf-8", "replace").rstrip("\n").partition("\t")
                self.stages.append((kind, text))

    def _read_stderr(self) -> None:
        self.stderr = self.proc.stderr.read()

    def wait(self) -> int:
        """Wait for the worker (killing it if the supervisor itself fails) and its pipes."""
        try:
            rc = self.proc.wait()
        finally:
            if self.proc.poll() is None:
                self.proc.kill()
                self.proc.wait()
            for t in self._readers:
                t.join(timeout=10)
            self.proc.stderr.close()
            self._restore()
        return rc

    def _restore(self) -> None:
        for s, h in self._saved.items():
            signal.signal(s, h)

    @property
    def stage(self) -> str:
        return next((t for k, t in reversed(self.stages) if k == "stage"), "")

    @property
    def written(self) -> list[str]:
        return [t for k, t in self.stages if k == "wrote"]


def _supervise(argv: list[str]) -> int:
    cmd = argv[1] if len(argv) > 1 and argv[1] in COMMAND_NAMES else None
    verbose = "--verbose" in argv[1:]
    # python -P -m hlofuse.cli.main: -P keeps the current directory off the worker's sys.path,
    # so a file named absl.py or ml_dtypes.py in the user's working directory is never executed
    python, env = python_command()
    env[CHILD_ENV] = "1"
    env.setdefault("TF_CPP_MIN_LOG_LEVEL", "1")
    worker = _Worker(python + ["-m", "hlofuse.cli.main"] + argv[1:], env)
    rc = worker.wait()
    child_err = worker.stderr.decode("utf-8", "replace")
    prefix = f"{PROG} {cmd}" if cmd else PROG
    handled = rc in [128 + int(s) for s in STOP_SIGNALS]  # the worker reported its interruption
    if rc == 0 and worker.signum is None and worker.stages and \
            not any(k == "done" for k, _ in worker.stages):
        # a command started and the process ended without finishing it, exit status 0: the
        # user's code (a model module imported by export or tune) called os._exit(0)
        sys.stderr.write(_own_lines(child_err))
        _error(cmd, f"the process exited (status 0) while {worker.stage or 'starting'}, before "
                    "the command finished: nothing was written (does the imported code call "
                    "os._exit?)")
        return EXIT_ERROR
    if rc >= 0 and (worker.signum is None or handled):
        sys.stderr.write(child_err if rc == 0 or verbose else _own_lines(child_err))
        sys.stderr.flush()
        return rc
    if verbose:
        sys.stderr.write(child_err)
    signum = worker.signum or (-rc if -rc in [int(s) for s in STOP_SIGNALS] else None)
    if signum is not None:  # stopped: killed after the grace period, or finished regardless
        if rc >= 0:  # it finished before the signal took effect
            sys.stderr.write(child_err if rc == 0 else _own_lines(child_err))
        print(f"{prefix}: {_interrupted_message(signum, worker.written)}", file=sys.stderr)
        return 128 + int(signum)
    sig = -rc
    try:
        signame = signal.Signals(sig).name
    except ValueError:
        signame = f"signal {sig}"
    stage = worker.stage
    detail = _crash_detail(child_err)
    if stage.startswith("reading "):
        what = (f"{stage[8:]}: corrupt input: the MLIR parser aborted the process while reading "
                f"it ({signame})")
    elif sig == signal.SIGKILL:
        what = f"killed ({signame}, out of memory?) while {stage or 'starting'}"
    else:
        what = f"the process crashed ({signame}) while {stage or 'starting'}"
    _error(cmd, what + (f": {detail}" if detail else "")
           + ("" if verbose else " (--verbose for the native diagnostics)"))
    return EXIT_ERROR


def _own_lines(err: str) -> str:
    """On failure keep only hlofuse's own messages (and their indented continuation lines), not
    native diagnostics MLIR/XLA print directly to stderr; everything when there are none."""
    kept, keep = [], False
    for line in err.splitlines():
        keep = line.startswith(PROG) or (keep and line.startswith("  "))
        if keep:
            kept.append(line)
    return "\n".join(kept) + "\n" if kept else err


def _crash_detail(err: str) -> str:
    lines = [l.strip() for l in err.splitlines() if l.strip()]
    for key in ("Check failed", "LLVM ERROR", "what():", "error:"):
        for l in lines:
            if key in l:
                return l[:300]
    return ""


def _help_only(argv: list[str]) -> bool:
    return len(argv) < 2 or argv[1] in ("-h", "--help", "-help", "help", "--version") or \
        _wants_help(argv[2:])


def runs_here(argv: list[str]) -> bool:
    """Whether :func:`run` runs the command in this process (help, the worker itself,
    ``HLOFUSE_CLI_INPROCESS=1``), which needs :mod:`hlofuse.cli.main`, rather than supervising
    a worker."""
    return _help_only(argv) or bool(config.get(CHILD_ENV) or config.get(INPROCESS_ENV))


def reader_left() -> int:
    """``hlofuse ... | head``: the reader closed the pipe (a BrokenPipeError), which is not an
    error of ours. Stdout goes to /dev/null, so the interpreter's final flush cannot fail
    again; returns :data:`EXIT_OK`."""
    os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
    return EXIT_OK


def run(argv: list[str] | None, here: Callable[[], ModuleType] | None) -> NoReturn:
    """The ``hlofuse`` command (``argv``: program name first, default ``sys.argv``); exits
    through ``sys.exit``. ``here()`` returns :mod:`hlofuse.cli.main`, called only when this
    process runs the command itself (:func:`runs_here`)."""
    argv = list(sys.argv if argv is None else argv)
    cli = None
    try:
        if _help_only(argv):
            cli = here()
            code = cli._dispatch(argv)  # help needs no MLIR/XLA work: no child process
        elif config.get(CHILD_ENV) or config.get(INPROCESS_ENV):
            cli = here()
            cli._become_worker()
            if cli._WORKER["child"]:
                cli._die_with_parent()
            cli._install_stop_handlers()
            code = cli._dispatch(argv)
        else:
            code = _supervise(argv)
        sys.stdout.flush()
    except KeyboardInterrupt as e:  # outside a command (starting, parsing flags)
        signum = getattr(e, "signum", signal.SIGINT)
        written = cli._WRITTEN if cli is not None else []
        print(f"{PROG}: {_interrupted_message(signum, written)}", file=sys.stderr)
        code = 128 + int(signum)
    except BrokenPipeError:
        code = reader_left()
    sys.exit(code)
