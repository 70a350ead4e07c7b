"""`SkipLog`: where datasets record the rows they leave out under ``on_error="skip"``."""

from __future__ import annotations

import csv
import os
import uuid
from pathlib import Path
from typing import Any

__all__ = ["SkipLog"]


class SkipLog:
    """Where a dataset records the rows it leaves out (``on_error="skip"``): an append-only CSV file.

    Every process and DataLoader worker appends to the same file with single ``O_APPEND`` writes
    (atomic for short lines), so the main process sees what its workers skipped without any
    channel back from them. `rows` deduplicates: a bad file met again next epoch counts once. The
    file starts with the header ``manifest,row,file,reason``, so the path an error message names
    opens as a table.

    Example:
        >>> import tempfile
        >>> with tempfile.TemporaryDirectory() as tmp:
        ...     log = SkipLog(f"{tmp}/skipped.log")
        ...     log.record("train.csv", 3, "a.wav", "contains NaN samples")
        ...     log.record("train.csv", 3, "a.wav", "contains NaN samples")
        ...     log.rows()
        [{'manifest': 'train.csv', 'row': 3, 'file': 'a.wav', 'reason': 'contains NaN samples'}]
    """

    FIELDS = ("manifest", "row", "file", "reason")

    def __init__(self, path: str | os.PathLike[str]) -> None:
        self.path = str(path)

    def record(self, manifest: str, row: int, file: str, reason: str) -> None:
        """Append one skipped row."""
        buffer = _csv_line([manifest, str(row), file, reason.replace("\n", " ")])
        try:
            fd = os.open(self.path, os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_EXCL, 0o644)
            buffer = _csv_line(list(self.FIELDS)) + buffer  # the writer that creates the file gives it its header
        except FileExistsError:
            fd = os.open(self.path, os.O_WRONLY | os.O_APPEND)
        try:
            os.write(fd, buffer.encode())
        finally:
            os.close(fd)

    def rows(self) -> list[dict[str, Any]]:
        """The skipped rows so far, each once, in the order first seen."""
        if not os.path.exists(self.path):
            return []
        seen: dict[tuple[str, str], dict[str, Any]] = {}
        with open(self.path, newline="", encoding="utf-8") as handle:
            for values in csv.reader(handle):
                if tuple(values) == self.FIELDS:
                    continue  # the header; when two processes start at once it can land after the other's first line
                if len(values) == 4 and (values[0], values[1]) not in seen:
                    seen[values[0], values[1]] = {"manifest": values[0], "row": int(values[1]), "file": values[2]}
                    seen[values[0], values[1]]["reason"] = values[3]
        return list(seen.values())

    def write_csv(self, path: str | os.PathLike[str]) -> Path:
        """Write the deduplicated rows to ``path`` (``manifest,row,file,reason``), atomically.

        Example:
            >>> import tempfile
            >>> with tempfile.TemporaryDirectory() as tmp:
            ...     log = SkipLog(f"{tmp}/log")
            ...     log.record("train.csv", 7, "x.png", "is only 1x1 pixels")
            ...     log.write_csv(f"{tmp}/run/skipped.csv").read_text()
            'manifest,row,file,reason\\ntrain.csv,7,x.png,is only 1x1 pixels\\n'
        """
        path = Path(path)
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_name(f".{path.name}.{uuid.uuid4().hex[:8]}")
        tmp.write_text(
            _csv_line(list(self.FIELDS)) + "".join(_csv_line([str(r[k]) for k in self.FIELDS]) for r in self.rows())
        )
        os.replace(tmp, path)
        return path


def _csv_line(values: list[str]) -> str:
    out: list[str] = []

    class _Sink:
        def write(self, text: str) -> None:
            out.append(text)

    csv.writer(_Sink(), lineterminator="\n").writerow(values)
    return "".join(out)
