"""`DataError`, the one error type of bad input files and manifest rows."""

from __future__ import annotations

from sss.errors import SSSError

__all__ = ["DataError"]


class DataError(ValueError, SSSError):
    """A problem with an input file or a manifest row; the message names the file, the row and the fix.

    One positional message argument only, so it survives the pickling that carries an exception
    out of a DataLoader worker with its message intact.

    When a DataLoader worker raised it, torch re-raises it in the main process with the worker's
    traceback prepended to the message; the constructor keeps the one clean line as the message
    and the traceback in `worker_traceback`, so a CLI can print the line alone.

    Example:
        >>> str(DataError("train.csv, line 3: audio file a.wav contains NaN samples"))
        'train.csv, line 3: audio file a.wav contains NaN samples'
        >>> wrapped = "Caught DataError in DataLoader worker process 0.\\nOriginal Traceback (most recent call last):"
        >>> err = DataError(wrapped + "\\n  ...\\nsss.data.errors.DataError: train.csv, line 3: bad\\n")
        >>> str(err), err.worker_traceback.startswith("Caught")
        ('train.csv, line 3: bad', True)
    """

    worker_traceback: str = ""
    """The worker's traceback when the error crossed a DataLoader worker boundary, else empty."""
    file: str = ""
    """The data file at fault, when the dataset knows it (what ``skipped.csv``'s ``file`` column lists), else empty."""
    reason: str = ""
    """The problem without its location (``skipped.csv``'s ``reason``), when the dataset set it, else empty."""

    def __init__(self, message: str) -> None:
        if message.startswith("Caught DataError") and "Original Traceback" in message:
            self.worker_traceback = message
            message = message.rstrip().splitlines()[-1].split("DataError: ", 1)[-1]
        super().__init__(message)
