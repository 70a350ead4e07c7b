"""The dataset folder's two rules for every file the data module reads: it stays inside ``root``, and it is a
regular file.

The first rule covers the manifest's rows (absolute paths, ``..``, symbolic links) and the files sss finds
on its own: ``classes.txt``, ``event_classes.txt``, the manifest itself, event tables and the public
layouts' metadata. A dataset folder is often someone else's (a download, a shared drive), and a
``classes.txt`` linked to ``/etc/passwd`` or a token file would otherwise become class names in an error
message, the model card and a Hub push. ``data.allow_outside_root=true`` lifts it, for rows and files alike.

The second rule is checked with ``os.stat`` before anything is opened: opening a named pipe (FIFO) for
reading blocks until a writer appears, which may be never, and a device such as ``/dev/zero`` or
``/dev/urandom`` never ends.
"""

from __future__ import annotations

import os
import stat
from pathlib import Path
from typing import Any

from sss.data._decode import DataError

__all__ = ["LINK_FIX", "RootRule", "inside", "not_regular"]

LINK_FIX = "move the file inside it, or set data.allow_outside_root=true if that is intended"

_KINDS = (
    (stat.S_ISFIFO, "a named pipe (FIFO)"),
    (stat.S_ISSOCK, "a socket"),
    (stat.S_ISCHR, "a character device"),
    (stat.S_ISBLK, "a block device"),
)


def inside(path: str, folder: str) -> bool:
    """Whether ``path`` is ``folder`` or below it (both absolute and normalised).

    Example:
        >>> inside("/data/ds/a.png", "/data/ds"), inside("/data/dsx/a.png", "/data/ds")
        (True, False)
    """
    return os.path.commonpath([path, folder]) == folder


def not_regular(path: str | os.PathLike[str]) -> str | None:
    """What keeps ``path`` from being read as a data file, found with ``os.stat`` alone (nothing is opened).

    Returns:
        None for a regular file (or a link to one); ``"not found"``; ``"is a directory, not a file"``;
        ``"cannot be read (...)"``; or ``"is a named pipe (FIFO), not a regular file; ..."`` (also a socket,
        a device).

    Example:
        >>> import os, tempfile
        >>> folder = tempfile.mkdtemp()
        >>> os.mkfifo(f"{folder}/pipe")
        >>> not_regular(f"{folder}/pipe")
        'is a named pipe (FIFO), not a regular file; give a regular file (sss never opens pipes or devices)'
        >>> not_regular(folder), not_regular(f"{folder}/gone.wav")
        ('is a directory, not a file', 'not found')
    """
    try:
        mode = os.stat(path).st_mode
    except (FileNotFoundError, NotADirectoryError):
        return "not found"
    except OSError as err:  # a link loop, a forbidden folder: nothing to read either way
        return f"cannot be read ({err.strerror or err})"
    if stat.S_ISREG(mode):
        return None
    if stat.S_ISDIR(mode):
        return "is a directory, not a file"
    kind = next((name for test, name in _KINDS if test(mode)), "a special file")
    return f"is {kind}, not a regular file; give a regular file (sss never opens pipes or devices)"


class RootRule:
    """Where the data files of one dataset folder may come from: inside ``root`` after following links.

    `resolve` applies it to a manifest cell, `check` to a file sss finds by name in the folder.
    Both refuse a path that leaves ``root`` (absolute, through ``..``, or through a symbolic link,
    compared on the resolved path) unless ``allow_outside_root``; a root that is itself reached
    through a link is still inside.

    Example:
        >>> import os, tempfile
        >>> root, elsewhere = tempfile.mkdtemp(), tempfile.mkdtemp()
        >>> _ = open(f"{elsewhere}/secret.txt", "w").write("token")
        >>> os.symlink(f"{elsewhere}/secret.txt", f"{root}/classes.txt")
        >>> RootRule(root).check(f"{root}/classes.txt")  # doctest: +ELLIPSIS
        Traceback (most recent call last):
        ...
        sss.data.errors.DataError: .../classes.txt is a symbolic link to .../secret.txt, outside the dataset ...
        >>> RootRule(root, allow_outside_root=True).check(f"{root}/classes.txt").endswith("classes.txt")
        True
    """

    def __init__(self, root: str | os.PathLike[str], allow_outside_root: bool = False) -> None:
        self.root = Path(root)
        self.allow_outside_root = allow_outside_root
        self._real_root = os.path.realpath(self.root)
        self._real_dirs: dict[str, str] = {}  # resolved folders: most rows share a few, so resolve each once

    def leaves(self, full: str) -> str | None:
        """Where ``full`` (under ``root``) really points when a symbolic link takes it out of ``root``, else None."""
        if self.allow_outside_root:
            return None
        real = self._realpath(full)
        return None if inside(real, self._real_root) else real

    def resolve(self, value: str) -> str | DataError:
        """A manifest cell as a path under ``root``, or the `DataError` (returned, not raised) of one that leaves it."""
        value = value.strip()
        full = os.path.normpath(os.path.join(self.root, value))
        if self.allow_outside_root:
            return full
        if os.path.isabs(value) or not inside(os.path.abspath(full), os.path.abspath(self.root)):
            err = DataError(f"path {value!r} leaves the dataset folder {self.root}; {LINK_FIX}")
        else:
            real = self.leaves(full)
            if real is None:
                return full
            # A symbolic link can lead out as surely as "..".
            err = DataError(
                f"path {value!r} leaves the dataset folder {self.root} through a symbolic link to {real}; {LINK_FIX}"
            )
        err.file = full
        return err

    def check(self, path: str | os.PathLike[str]) -> str:
        """``path``, a file sss reads from the folder on its own (class list, manifest, table), if both rules hold.

        Raises:
            DataError: It leads out of ``root`` through a symbolic link (naming the file, the target and
                ``data.allow_outside_root``; never its contents), or it is not a regular file.
        """
        full = os.path.normpath(os.path.abspath(path))
        real = self.leaves(full)
        if real is not None:
            raise DataError(f"{path} is a symbolic link to {real}, outside the dataset folder {self.root}; {LINK_FIX}")
        problem = not_regular(full)
        if problem is not None:
            raise DataError(f"{path}: {problem}")
        return str(path)

    def _realpath(self, full: str) -> str:
        """``os.path.realpath(full)``, with the folder part cached (a full resolve per row doubled the check's time)."""
        folder, name = os.path.split(full)
        if folder not in self._real_dirs:
            self._real_dirs[folder] = os.path.realpath(folder)
        real = os.path.join(self._real_dirs[folder], name)
        return os.path.realpath(real) if os.path.islink(real) else real

    def __getstate__(self) -> dict[str, Any]:
        return {**self.__dict__, "_real_dirs": {}}  # DataLoader workers do not need the construction-time cache
