"""Replacing a file so that nothing is lost: the one atomic write every writer of hlofuse uses
(the command line's outputs through :func:`hlofuse.runtime.formats.atomic_write`, the caches,
Model Explorer's folders).

A temporary file beside the target (a short name: the target's own may be near the file
system's 255-byte limit), written and fsynced, given the replaced file's mode or the umask's
default (``tempfile.mkstemp`` makes 0600, which other users of a shared cache cannot read),
then renamed over the target. An interruption leaves either the old file or the new one, and
never the temporary.
"""

from __future__ import annotations

import contextlib
import errno
import os
import tempfile
import threading
import time

__all__ = ["current_umask", "replace_atomically", "TempFileError", "exclusive"]

#: how long :func:`exclusive` waits for another process's lock before going on without it
LOCK_WAIT_S = 5.0

_UMASK_LOCK = threading.Lock()


class TempFileError(OSError):
    """The temporary file could not be created in the target's directory."""


def current_umask() -> int:
    """The process's umask, read without changing it (``/proc/self/status`` on Linux): setting
    it to read it back would, for an instant, give files other threads create mode 0666."""
    try:
        with open("/proc/self/status") as fh:
            for line in fh:
                if line.startswith("Umask:"):
                    return int(line.split()[1], 8)
    except (OSError, ValueError, IndexError):
        pass
    with _UMASK_LOCK:                   # elsewhere: the only portable way, kept short
        mask = os.umask(0o022)
        os.umask(mask)
    return mask


def replace_atomically(target: str, data: bytes) -> None:
    """Write ``data`` to ``target`` (a resolved path in an existing directory) atomically.
    Raises :class:`TempFileError` when no temporary file can be made there, else the
    ``OSError`` of the write or the rename (the temporary is removed)."""
    directory = os.path.dirname(target) or "."
    try:
        fd, tmp = tempfile.mkstemp(dir=directory, prefix=f".{os.path.basename(target)[:200]}.",
                                   suffix=".tmp")
    except OSError as e:
        raise TempFileError(e.errno, e.strerror, e.filename) from None
    try:
        with os.fdopen(fd, "wb") as fh:
            fh.write(data)
            fh.flush()
            os.fsync(fh.fileno())
        if os.path.exists(target):
            mode = os.stat(target).st_mode & 0o7777
        else:
            mode = 0o666 & ~current_umask()
        os.chmod(tmp, mode)
        os.replace(tmp, target)
    except BaseException:  # noqa: BLE001 - re-raised: never leave the temporary behind
        try:
            os.unlink(tmp)
        except OSError:
            pass
        raise


@contextlib.contextmanager
def exclusive(target: str, wait_s: float = LOCK_WAIT_S):
    """Hold an inter-process lock for a read-modify-replace of ``target`` (``flock`` on
    ``<target>.lock`` beside it), so two processes merging into one file (the decision cache
    of a shared cache folder) do not drop each other's entries: with the lock, the later
    writer reads the earlier one's file. Best effort and never an error: where no lock can
    be taken (no ``fcntl``, a read-only folder, a holder past ``wait_s``) it goes on without."""
    try:
        import fcntl
    except ImportError:
        yield False
        return
    fd = None
    for flags in (os.O_RDWR | os.O_CREAT, os.O_RDONLY):   # another user's lock file: read-only
        try:
            fd = os.open(target + ".lock", flags, 0o666 & ~current_umask())
            break
        except OSError:
            continue
    if fd is None:
        yield False
        return
    held = False
    try:
        deadline = time.monotonic() + wait_s
        while True:
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                held = True
                break
            except OSError as e:
                # held elsewhere: wait; a file system without flock (ENOLCK, EOPNOTSUPP on
                # some network mounts): go on at once, never a 5 s wait per write
                if e.errno not in (errno.EWOULDBLOCK, errno.EAGAIN, errno.EACCES) or \
                        time.monotonic() >= deadline:
                    break
                time.sleep(0.01)
        yield held
    finally:
        if held:
            try:
                fcntl.flock(fd, fcntl.LOCK_UN)
            except OSError:
                pass
        os.close(fd)
