"""The folder lock: one run at a time in a folder (``OUTPUT_DIR``, a checkpoints folder).

`lock_folder` takes an ``fcntl.flock`` on ``FOLDER/.sss.lock``, whose body names the holder (pid, host,
start, command). Below the run folder's policy (`sss.run.folder`); re-exported by `sss.checkpoint`, where
the checkpoint callback finds it.
"""

from __future__ import annotations

import contextlib
import datetime
import json
import os
import shlex
import socket
import sys
from pathlib import Path
from typing import Any

from sss.errors import SSSError

__all__ = ["LOCK", "FolderInUseError", "FolderLock", "folder_holder", "lock_folder"]

LOCK = ".sss.lock"
"""The lock file of a folder in use by a run (``OUTPUT_DIR``, a checkpoints folder); removed when the run ends."""

_GRACE_S = 1.0
"""How long `lock_folder` waits for a held lock: a run killed a moment ago may still be exiting (tearing
down its memory) and releases its flock only when it is gone."""
_HELD: dict[str, FolderLock] = {}  # this process's locks by real path, so that one run can take its folder twice


class FolderInUseError(FileExistsError, SSSError):
    """The folder is locked by another live run."""


class FolderLock:
    """An exclusive ``fcntl.flock`` on ``FOLDER/.sss.lock``, held until `release` (or the process ends).

    The kernel drops the flock when the holder dies, however it dies (``kill -9`` too); the file's
    JSON body ``{pid, host, started, command}`` names the holder in the refusal message. Made by
    `lock_folder`; a context manager.
    """

    def __init__(self, path: Path, fd: int) -> None:
        self.path, self._fd, self._pid, self._count = path, fd, os.getpid(), 1

    def release(self) -> None:
        """Let the folder go (once per `lock_folder` call); the file is removed with the last release."""
        if self._fd is None or self._pid != os.getpid():
            return
        self._count -= 1
        if self._count:
            return
        _HELD.pop(os.path.realpath(self.path), None)
        with contextlib.suppress(OSError):
            self.path.unlink()  # before unlocking: a run that opened the old file sees it is gone and retries
        os.close(self._fd)
        self._fd = None

    def __enter__(self) -> FolderLock:
        return self

    def __exit__(self, *exc: object) -> None:
        self.release()


def lock_folder(folder: str | Path, what: str = "run") -> FolderLock:
    """Take `folder` for this process, or raise `FolderInUseError` naming the live run that has it.

    A lock left by a run that ended without releasing it is taken over with a one-line notice:
    either the kernel already dropped its flock (the run was killed), or the flock survives in
    processes that inherited it but the run's own pid is gone on this host. Taking a folder this
    process already holds nests (one `release` per call).

    Example:
        >>> import tempfile
        >>> folder = tempfile.mkdtemp()
        >>> with lock_folder(folder) as lock:
        ...     folder_holder(folder)["pid"] == os.getpid()
        True
        >>> folder_holder(folder) is None
        True
    """
    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / LOCK
    held = _HELD.get(os.path.realpath(path))
    if held is not None and held._pid == os.getpid() and held._fd is not None:
        held._count += 1
        return held
    for _ in range(10):  # each retry follows a holder that released or was taken over meanwhile
        fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o644)
        try:
            _flock_within(fd, 0 if _gone(_read_holder(fd)) else _GRACE_S)
        except BlockingIOError:
            holder = _read_holder(fd)
            same = _same_file(fd, path)
            os.close(fd)
            if not same:
                continue
            if not _gone(holder):
                raise FolderInUseError(
                    f"{folder} is in use by another sss {what}: {_describe(holder)}. Two runs in one folder would "
                    f"overwrite each other's checkpoints and results. Wait for it to end, or give this run another "
                    f"folder (trainer.output_dir); if that process is not running any more, delete {path}."
                ) from None
            print(f"sss: {folder}: taking over the lock of {_describe(holder)}: that process is gone", flush=True)
            with contextlib.suppress(FileNotFoundError):
                path.unlink()  # a fresh file: the processes that inherited the old flock keep only the old one
            continue
        if not _same_file(fd, path):  # its holder removed it between our open and our flock
            os.close(fd)
            continue
        _write_holder(fd, folder)
        lock = _HELD[os.path.realpath(path)] = FolderLock(path, fd)
        return lock
    raise FolderInUseError(f"{folder}: could not take {path}: other runs keep taking and releasing it")


def _write_holder(fd: int, folder: Path) -> None:
    # This process's name into the lock file it holds now, after a notice when a run that ended left its own there.
    holder = _read_holder(fd)
    if holder:
        ended = "which ended without releasing it"
        print(f"sss: {folder}: taking over the lock of {_describe(holder)}, {ended}", flush=True)
    body = {
        "pid": os.getpid(),
        "host": socket.gethostname(),
        "started": datetime.datetime.now().astimezone().isoformat(timespec="seconds"),
        "command": shlex.join(sys.argv),
    }
    os.ftruncate(fd, 0)
    os.pwrite(fd, json.dumps(body).encode(), 0)


def _flock_within(fd: int, seconds: float) -> None:
    import fcntl
    import time

    deadline = time.monotonic() + seconds
    while True:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            return
        except BlockingIOError:
            if time.monotonic() >= deadline:
                raise
            time.sleep(0.02)


def folder_holder(folder: str | Path) -> dict[str, Any] | None:
    """The lock body ``{pid, host, started, command}`` of the live run holding `folder`, or None.

    Example:
        >>> folder_holder("/nonexistent") is None
        True
    """
    import fcntl

    path = Path(folder) / LOCK
    try:
        fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
    except OSError:
        return None
    try:
        held = _HELD.get(os.path.realpath(path))
        if held is not None and held._pid == os.getpid() and held._fd is not None:
            return _read_holder(fd) or {"pid": os.getpid()}
        try:
            fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)  # a probe: nobody holds it
        except BlockingIOError:
            holder = _read_holder(fd)
            return None if _gone(holder) else (holder or {})
        fcntl.flock(fd, fcntl.LOCK_UN)
        return None
    finally:
        os.close(fd)


def _read_holder(fd: int) -> dict[str, Any]:
    try:
        body = json.loads(os.pread(fd, 4096, 0).decode() or "{}")
    except (OSError, ValueError):
        return {}
    return body if isinstance(body, dict) else {}


def _same_file(fd: int, path: Path) -> bool:
    try:
        return os.stat(path).st_ino == os.fstat(fd).st_ino
    except FileNotFoundError:
        return False


def _gone(holder: dict[str, Any]) -> bool:
    # Only a pid on this host can be checked; elsewhere, a held flock means a live run.
    if holder.get("host") != socket.gethostname() or not isinstance(holder.get("pid"), int):
        return False
    try:
        os.kill(holder["pid"], 0)
    except ProcessLookupError:
        return True
    except PermissionError:  # alive, another user's
        return False
    return False


def _describe(holder: dict[str, Any]) -> str:
    if not holder:
        return "a process that has not written its name yet"
    text = f"pid {holder.get('pid', '?')} on {holder.get('host', '?')}, started {holder.get('started', '?')}"
    return text + (f" ({holder['command']})" if holder.get("command") else "")
