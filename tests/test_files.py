"""``hlofuse.core.files``: the one atomic replace every writer uses (command-line outputs, the
caches, Model Explorer's folders)."""

from __future__ import annotations

import os
import stat

import pytest

from hlofuse.core import files


def test_new_files_follow_the_umask_and_replaced_ones_keep_their_mode(tmp_path):
    """``tempfile.mkstemp`` makes 0600: the autotune cache and Model Explorer's files were
    unreadable to the other users of a shared folder (adversarial round, review)."""
    old = os.umask(0o002)
    try:
        assert files.current_umask() == 0o002
        files.replace_atomically(str(tmp_path / "a.txt"), b"one")
        assert stat.S_IMODE(os.stat(tmp_path / "a.txt").st_mode) == 0o664
        os.chmod(tmp_path / "a.txt", 0o640)
        files.replace_atomically(str(tmp_path / "a.txt"), b"two")
        assert stat.S_IMODE(os.stat(tmp_path / "a.txt").st_mode) == 0o640
        assert (tmp_path / "a.txt").read_bytes() == b"two"
    finally:
        os.umask(old)


def test_a_failed_write_leaves_the_old_file_and_no_temporary(tmp_path, monkeypatch):
    (tmp_path / "a.txt").write_bytes(b"old")

    def full(fd):
        raise OSError(28, "No space left on device")
    monkeypatch.setattr(os, "fsync", full)
    with pytest.raises(OSError, match="No space"):
        files.replace_atomically(str(tmp_path / "a.txt"), b"new")
    assert (tmp_path / "a.txt").read_bytes() == b"old"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["a.txt"]
    with pytest.raises(files.TempFileError):
        files.replace_atomically(str(tmp_path / "missing" / "b.txt"), b"x")


def test_model_explorer_files_follow_the_umask(tmp_path):
    from hlofuse.core import model_explorer
    old = os.umask(0o022)
    try:
        model_explorer._atomic_write(str(tmp_path / "after.mlir"), "module {}")
    finally:
        os.umask(old)
    assert stat.S_IMODE(os.stat(tmp_path / "after.mlir").st_mode) == 0o644


def test_exclusive_serializes_and_never_blocks_for_long(tmp_path):
    """``files.exclusive``: a second holder waits for the first; past its wait it goes on
    without the lock (never an error, never a hang), and a folder where no lock file can be
    made gives no lock either."""
    import threading
    import time
    target = str(tmp_path / "autotune.json")
    with files.exclusive(target) as held:
        assert held
        with files.exclusive(target, wait_s=0.05) as second:
            assert not second          # held elsewhere: gave up after its wait
    order = []

    def late():
        with files.exclusive(target, wait_s=5) as got:
            order.append(("late", got))
    with files.exclusive(target):
        t = threading.Thread(target=late)
        t.start()
        time.sleep(0.1)
        order.append(("first", True))
    t.join()
    assert order == [("first", True), ("late", True)]
    with files.exclusive(str(tmp_path / "missing" / "x.json")) as held:
        assert not held


def test_exclusive_gives_up_at_once_where_the_file_system_has_no_locks(tmp_path, monkeypatch):
    """A network mount without flock answers ENOLCK: no lock, and no wait (a 5 s wait per
    write of the decision cache, inside the user's call, otherwise)."""
    import errno
    import fcntl
    import time

    def no_locks(fd, op):
        raise OSError(errno.ENOLCK, "No locks available")
    monkeypatch.setattr(fcntl, "flock", no_locks)
    t0 = time.monotonic()
    with files.exclusive(str(tmp_path / "autotune.json")) as held:
        assert not held
    assert time.monotonic() - t0 < 1.0
