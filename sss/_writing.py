"""`writing_to`: a failed write names the folder being written, so a full disk says which one it is.

``write()`` and ``flush()`` failing with ENOSPC raise an OSError without a file name (Python has
only the file descriptor), and the libraries that write in C, C++ or Rust (safetensors, the ONNX
saver) report a full disk in their own words. Inside ``writing_to(folder)`` such a failure becomes
an OSError whose ``filename`` is `folder`, chained to the original: the ``sss`` command's ``error:``
line then names that folder and its free space, not the working directory.

This module imports nothing from sss, so every layer of sss may use it.
"""

from __future__ import annotations

import contextlib
import errno
import os
import re
from collections.abc import Iterator
from pathlib import Path

__all__ = ["NO_SPACE", "writing_to"]

NO_SPACE = re.compile(r"No space left on device|StorageFull|Disk quota exceeded|QuotaExceeded", re.IGNORECASE)
"""How a full disk reads in the messages of libraries that do not raise an OSError (safetensors: ``StorageFull``)."""

_WHOLE_DISK = (errno.ENOSPC, errno.EDQUOT, errno.EROFS)
"""Failures of the folder's file system as a whole (no space, a quota, mounted read-only), not of one file."""
_UNNAMED = (errno.EIO, errno.EFBIG)
"""Write failures that name no file when write() or flush() raise them: the folder is named instead."""


@contextlib.contextmanager
def writing_to(folder: str | os.PathLike[str]) -> Iterator[Path]:
    """Run the block that writes into `folder`; a full or read-only disk in it names `folder`.

    A full disk (ENOSPC, EDQUOT, or a library's message saying so) or a read-only one (EROFS) always
    names `folder`: it is the folder's file system that failed, whichever file hit it. An I/O error or
    a file too large for the file system (EIO, EFBIG) that names no file gets `folder`. Anything else
    (a permission error naming its file, a refused connection) passes unchanged.

    Example:
        >>> import errno
        >>> try:
        ...     with writing_to("runs/x/logs"):
        ...         raise OSError(errno.ENOSPC, "No space left on device")
        ... except OSError as exc:
        ...     print(exc.filename, type(exc.__cause__).__name__)
        runs/x/logs OSError
    """
    folder = Path(folder)
    try:
        yield folder
    except OSError as exc:
        code = exc.errno
        # Others pass: sss's own FileExistsError("... choose another folder") has no errno, a permission names
        # its file, and a tracker's ConnectionRefusedError is no write at all.
        if code not in _WHOLE_DISK and not (code in _UNNAMED and exc.filename is None):
            raise
        raise OSError(code, exc.strerror or os.strerror(code), os.fspath(folder)) from exc
    except Exception as exc:
        if NO_SPACE.search(str(exc)):
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC), os.fspath(folder)) from exc
        raise
