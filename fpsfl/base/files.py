"""Durable writes: every file a run makes goes through :func:`atomic_write` or :func:`append_line`.

``atomic_write`` writes a temporary file beside the target (``.NAME.tmpPID``), syncs it to disk, renames it
over the target (atomic on POSIX) and syncs the directory, so after a crash or a power loss the target is
the old file or the new one, never half of one, and a rename that returned is on disk. A writer killed
before its rename leaves its temporary file behind; :func:`clean_stale` removes such files, and the owner
of a folder calls it once it holds the folder's lock (:func:`lock_file`), when no writer can be alive.

``append_line`` appends one line and syncs it: a crash inside it leaves a torn last line, which
:mod:`fpsfl.base.rundir` recognises and drops.

Test hook (the crash-point sweep, ``tests/test_crash_points.py``): every write reports events, ``tmp``
(the temporary file is complete, not yet renamed), ``replace`` (renamed), ``torn`` (half a line appended)
and ``append`` (the whole line). With ``FPSFL_TEST_IO_LOG=FILE`` each event is logged to FILE as a JSON
line; with ``FPSFL_TEST_CRASH=KIND:N`` the process SIGKILLs itself at its N-th event of KIND (``any`` counts
every event; ``metrics`` is ``append``). ``FPSFL_TEST_CRASH=full-KIND:N`` raises the OSError of a full disk
(ENOSPC) there instead: at ``tmp`` the temporary file is then removed as after a failed write, at ``torn``
half the line stays (issue 42: a full disk is one line and leaves a run that ``--resume`` continues).
"""

from __future__ import annotations

import errno
import hashlib
import io
import json
import os
import platform
import re
import signal
from collections import Counter
from collections.abc import Callable
from pathlib import Path
from typing import Any

try:
    import fcntl
except ImportError:  # not POSIX: nothing is locked
    fcntl = None

CRASH_ENV = "FPSFL_TEST_CRASH"  # tests only, see the module docstring
LOG_ENV = "FPSFL_TEST_IO_LOG"  # tests only
_STALE = re.compile(r"^\..+\.tmp\d+$")  # what temp_path names
_events: Counter = Counter()


class LockedError(ValueError):
    """The lock is held by a live process; the message is one line."""


def temp_path(path: Path) -> Path:
    """The temporary name of ``path`` while this process writes it: ``.NAME.tmpPID`` beside it."""
    return path.with_name(f".{path.name}.tmp{os.getpid()}")


def probe_write(folder: Path) -> None:
    """Write and remove an empty file in ``folder``; OSError where that fails. Named as :func:`temp_path`
    names, so a kill in between leaves what :func:`clean_stale` removes."""
    probe = temp_path(Path(folder) / "probe")
    probe.write_bytes(b"")
    probe.unlink()


def atomic_write(path: str | Path, write: Callable[[Path], None]) -> None:
    """``write(tmp)`` to a temporary file beside ``path``, sync it, rename it over ``path``, sync the folder:
    a crash leaves the old file or the new one, never half of one."""
    path = Path(path)
    tmp = temp_path(path)
    try:
        write(tmp)
        _sync(tmp)
        io_event("tmp", path)
        os.replace(tmp, path)
    finally:
        tmp.unlink(missing_ok=True)
    _sync(path.parent)
    io_event("replace", path)


def atomic_save(obj: Any, path: str | Path) -> None:
    """``torch.save`` to ``path`` atomically. Saved through a file object: torch names the archive inside
    the zip after a file name, and the temporary name holds the PID, so the same object would give other
    bytes in every process. Serialised in memory first: torch's zip writer turns a failed write (a full
    disk) into "unexpected pos" RuntimeErrors, while a plain write raises the OSError it is (issue 42)."""
    import torch

    def save(tmp: Path) -> None:
        buf = io.BytesIO()
        torch.save(obj, buf)
        with tmp.open("wb") as f:
            f.write(buf.getbuffer())
    atomic_write(path, save)


def append_line(path: Path, line: str) -> None:
    """Append ``line`` (which ends with a newline) and sync it to disk."""
    with path.open("a") as f:
        io_event("torn", path, lambda: (f.write(line[: len(line) // 2]), f.flush()))
        f.write(line)
        f.flush()
        os.fsync(f.fileno())
    io_event("append", path)


def _sync(path: Path) -> None:
    """fsync a file or a folder (a folder's entries: the rename); file systems that cannot are skipped."""
    try:
        fd = os.open(path, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError as exc:
        if exc.errno not in (errno.EINVAL, errno.ENOTSUP, errno.EBADF):
            raise
    finally:
        os.close(fd)


def clean_stale(folder: Path, names: re.Pattern | None = None, recursive: bool = True) -> list[Path]:
    """Remove the temporary files killed writers left in ``folder`` (those :func:`temp_path` names, and of
    them those whose target name matches ``names``, if given); returns them. Call it only while holding
    the folder's lock: a live writer's temporary file would go too."""
    if not folder.is_dir():
        return []
    found = folder.rglob(".*") if recursive else folder.glob(".*")
    removed = []
    for path in found:
        target = path.name[1:].rsplit(".tmp", 1)[0]
        if _STALE.match(path.name) and path.is_file() and (names is None or names.fullmatch(target)):
            path.unlink(missing_ok=True)
            removed.append(path)
    return removed


def lock_file(path: Path, in_use: str) -> int:
    """Take an exclusive ``flock`` on the file ``path`` (created) for this process's life; returns its
    descriptor (closing it releases the lock; the kernel releases it when the process dies, so a stale lock
    never blocks). A lock held by another process is a :class:`LockedError`: ``in_use`` formatted with the
    holder. OSError when the file cannot be made. A lock file that its holder removed (:func:`unlock_file`)
    while this process waited is not the lock any more: it is taken again from the new file."""
    while True:
        fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
        if fcntl is not None:
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except OSError:
                holder = os.read(fd, 64).decode(errors="replace").strip() or "another process"
                os.close(fd)
                raise LockedError(in_use.format(holder=holder)) from None
        try:
            current = os.stat(path).st_ino
        except FileNotFoundError:
            current = None
        if current == os.fstat(fd).st_ino:
            break
        os.close(fd)
    os.ftruncate(fd, 0)
    os.pwrite(fd, f"{os.getpid()} on {platform.node()}\n".encode(), 0)
    return fd


def unlock_file(path: Path, fd: int) -> None:
    """Remove the lock file ``path`` and release the lock (in that order: see :func:`lock_file`)."""
    path.unlink(missing_ok=True)
    os.close(fd)


def file_sha256(path: str | Path, chunk: int = 1 << 20) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        while block := f.read(chunk):
            h.update(block)
    return h.hexdigest()


def io_event(kind: str, path: Path, before_kill: Callable[[], Any] | None = None) -> None:
    """The test hook (module docstring): log the event, or die at the chosen one."""
    crash, log = os.environ.get(CRASH_ENV), os.environ.get(LOG_ENV)
    if not crash and not log:
        return
    _events[kind] += 1
    _events["any"] += 1
    if log:
        with open(log, "a") as f:
            f.write(json.dumps([kind, str(path)]) + "\n")
    want, _, n = (crash or "").partition(":")
    full = want.startswith("full-")
    want = want.removeprefix("full-")
    want = "append" if want == "metrics" else want
    if n.isdigit() and want in (kind, "any") and _events[want] == int(n):
        if before_kill is not None:
            before_kill()
        if full:
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC), str(path))
        os.kill(os.getpid(), signal.SIGKILL)
