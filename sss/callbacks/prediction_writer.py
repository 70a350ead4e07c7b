"""Streaming predictions: callbacks that write `SSSTrainer.predict` outputs as they come, so memory stays flat.

As Lightning's ``BasePredictionWriter``: `PredictionWriter` is the base (subclass
`PredictionWriter.write_on_batch_end`), `CSVPredictionWriter` writes one CSV. Use them with
``trainer.predict(..., return_predictions=False)`` so that the trainer keeps nothing either.
"""

from __future__ import annotations

import csv
import heapq
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import IO, TYPE_CHECKING, Any

import torch

from sss._writing import writing_to
from sss.callbacks.base import Callback

if TYPE_CHECKING:
    from sss.trainer.module import LitModule
    from sss.trainer.trainer import SSSTrainer

__all__ = ["CSVPredictionWriter", "PredictionWriter"]


class PredictionWriter(Callback):
    """Base of the prediction writers: `write_on_batch_end` gets each batch's rows of this process.

    The prediction it gets is ``trainer.state.rank_prediction``: this process's `predict_step`
    output, not gathered, less the rows a distributed sampler repeats to pad the last batch; so
    each process writes its own rows and no process holds the others'. `write_on_predict_end`
    runs after the last batch (every process).

    Example:
        >>> from sss import SSSTrainer
        >>> from sss.testing import BoringModule, boring_loader
        >>> class CountRows(PredictionWriter):
        ...     rows = 0
        ...     def write_on_batch_end(self, trainer, module, prediction, batch, batch_idx):
        ...         self.rows += len(prediction)
        >>> counter = CountRows()
        >>> quiet = {"mixed_precision": "no", "log": {"progress": False, "trackers": []}}
        >>> trainer = SSSTrainer(callbacks=[counter], **quiet)
        sss: mixed precision no
        >>> trainer.predict(BoringModule(), dataloaders=boring_loader(n=10, batch_size=4), return_predictions=False)
        >>> counter.rows
        10
    """

    def on_predict_batch_end(self, trainer: SSSTrainer, module: LitModule) -> None:
        """Hand this process's rows of the batch to `write_on_batch_end`."""
        state = trainer.state
        self.write_on_batch_end(trainer, module, state.rank_prediction, state.batch, state.batch_idx)

    def on_predict_end(self, trainer: SSSTrainer, module: LitModule) -> None:
        """Run `write_on_predict_end`."""
        self.write_on_predict_end(trainer, module)

    def write_on_batch_end(
        self, trainer: SSSTrainer, module: LitModule, prediction: Any, batch: Any, batch_idx: int
    ) -> None:
        """Write `prediction` (this process's rows of batch `batch_idx`); subclasses implement it."""
        raise NotImplementedError(f"{type(self).__name__} must implement write_on_batch_end")

    def write_on_predict_end(self, trainer: SSSTrainer, module: LitModule) -> None:
        """After the last batch, on every process (close files, merge them). Default: nothing."""


class CSVPredictionWriter(PredictionWriter):
    """Write the predictions to one CSV at `path`: an ``index`` column, then the `predict_step` output.

    Each process writes its own rows to ``<path>.rank<r>.part`` as they come; after the last batch
    the main process merges the parts by ``index`` (a heap merge: one row per part in memory),
    drops rows whose index repeats, writes `path` and removes the parts. ``index`` is the batch's
    `index_key` entry (the dataset index, which sss datasets return), else the row's position in
    the loader. The output columns: a tensor output of shape ``[B]`` is one column ``prediction``,
    ``[B, K]`` is ``prediction_0 .. prediction_{K-1}``; a dict output names the columns by its keys.

    An existing `path` (or a part file) is never overwritten: FileExistsError, on every process, before
    any row is written. The predict loader must be in dataset order (``shuffle=False``, as predict
    loaders are); the parts must be on a filesystem the main process can read (one machine, or shared).

    Args:
        path: The CSV to write.
        index_key: The batch entry that holds each row's dataset index.

    Example:
        >>> import tempfile
        >>> from sss import SSSTrainer
        >>> from sss.testing import BoringModule, boring_loader
        >>> out = Path(tempfile.mkdtemp()) / "predictions.csv"
        >>> quiet = {"mixed_precision": "no", "log": {"progress": False, "trackers": []}}
        >>> trainer = SSSTrainer(callbacks=[CSVPredictionWriter(out)], **quiet)
        sss: mixed precision no
        >>> trainer.predict(BoringModule(), dataloaders=boring_loader(n=10, batch_size=4), return_predictions=False)
        >>> lines = out.read_text().splitlines()
        >>> lines[0], len(lines)
        ('index,prediction_0,prediction_1', 11)
    """

    def __init__(self, path: str | Path, index_key: str = "index") -> None:
        self.path, self.index_key = Path(path), index_key
        self._file: IO[str] | None = None
        self._writer: Any = None
        self._last = -1  # the latest index this process wrote
        self._rows_per_batch = 0

    def part(self, rank: int) -> Path:
        """The file process `rank` writes its rows to."""
        return self.path.with_name(f"{self.path.name}.rank{rank}.part")

    def write_on_batch_end(
        self, trainer: SSSTrainer, module: LitModule, prediction: Any, batch: Any, batch_idx: int
    ) -> None:
        """Append this process's rows of the batch to its part file."""
        columns = _columns(prediction)
        rows = len(columns[0][1]) if columns else 0
        if self._file is None:
            self._open(trainer, ["index", *(name for names, _ in columns for name in names)])
            self._rows_per_batch = rows
        indices = self._indices(trainer, batch, batch_idx, rows)
        for i, index in enumerate(indices):
            if index < self._last:
                self._file.close()  # the rows so far stay in the part file
                self._file = self._writer = None
                raise ValueError(
                    f"CSVPredictionWriter({self.path}): row index {index} after {self._last}: the predict loader "
                    "must give the rows in dataset order (shuffle=False)"
                )
            self._last = index
            with writing_to(self.path.parent):  # a full disk names the output folder
                self._writer.writerow([index, *(value for _, values in columns for value in values[i])])

    def write_on_predict_end(self, trainer: SSSTrainer, module: LitModule) -> None:
        """Close the part files; the main process merges them into `path` and removes them."""
        if self._file is None:  # no batch: an output with the index column only
            self._open(trainer, ["index"])
        self._file.close()
        self._file = self._writer = None
        self._last = -1
        accelerator = trainer.accelerator
        accelerator.wait_for_everyone()  # every part is complete
        if accelerator.is_main_process:
            self._merge([self.part(r) for r in range(accelerator.num_processes)])
        accelerator.wait_for_everyone()  # `path` exists on every process's return

    def _open(self, trainer: SSSTrainer, header: list[str]) -> None:
        accelerator = trainer.accelerator
        # Every process checks every file before any is created, so all of them raise or none does.
        taken = [p for p in [self.path, *map(self.part, range(accelerator.num_processes))] if p.exists()]
        if taken:
            raise FileExistsError(
                f"{taken[0]} already exists; CSVPredictionWriter never overwrites a file: choose another path or "
                "remove it (a .part file is left by an interrupted predict)"
            )
        accelerator.wait_for_everyone()
        part = self.part(accelerator.process_index)
        with writing_to(self.path.parent):
            part.parent.mkdir(parents=True, exist_ok=True)
            self._file = part.open("x", newline="")
            self._writer = csv.writer(self._file)
            self._writer.writerow(header)

    def _indices(self, trainer: SSSTrainer, batch: Any, batch_idx: int, rows: int) -> list[int]:
        if isinstance(batch, Mapping) and self.index_key in batch:
            value = batch[self.index_key]
            return [int(i) for i in (value.tolist() if isinstance(value, torch.Tensor) else value)[:rows]]
        # No dataset index: the position in the loader. A prepared loader gives process r the batches
        # r, r + n, r + 2n ... of the underlying one (or slice r of each dispatched batch): the same position.
        accelerator = trainer.accelerator
        start = (batch_idx * accelerator.num_processes + accelerator.process_index) * self._rows_per_batch
        return list(range(start, start + rows))

    def _merge(self, parts: list[Path]) -> None:
        missing = [p for p in parts if not p.is_file()]
        if missing:
            raise FileNotFoundError(
                f"{missing[0]} is missing: every process's part must be on a filesystem the main process reads"
            )
        files = [p.open(newline="") for p in parts]
        try:
            readers = [csv.reader(f) for f in files]
            header = max((next(r, []) for r in readers), key=len)  # a process without rows wrote "index" only
            try:
                with writing_to(self.path.parent), self.path.open("x", newline="") as out:  # "x": never overwrite
                    writer = csv.writer(out)
                    writer.writerow(header)
                    for row in _unique(heapq.merge(*readers, key=lambda row: int(row[0]))):
                        writer.writerow(row)
            except FileExistsError:
                message = f"{self.path} appeared during predict; the rows stay in {parts[0]} and the other parts"
                raise FileExistsError(message) from None
            except BaseException:
                self.path.unlink(missing_ok=True)  # a partial output of ours; the parts stay
                raise
        finally:
            for f in files:
                f.close()
        for p in parts:  # only after a complete merge
            p.unlink()


def _unique(rows: Iterator[list[str]]) -> Iterator[list[str]]:
    # The merged rows come in index order, so a repeated index is the row just before it.
    last = None
    for row in rows:
        if row[0] != last:
            last = row[0]
            yield row


def _columns(prediction: Any) -> list[tuple[list[str], list[list[Any]]]]:
    # (column names, one list of values per row) for each output entry
    if isinstance(prediction, torch.Tensor):
        prediction = {"prediction": prediction}
    elif isinstance(prediction, (list, tuple)):
        prediction = {f"output{i}": value for i, value in enumerate(prediction)}
    if not isinstance(prediction, Mapping):
        raise TypeError(
            "CSVPredictionWriter writes a predict_step output that is a tensor, a dict or a tuple of them, "
            f"got {type(prediction).__name__}; subclass PredictionWriter for another one"
        )
    columns = []
    for name, value in prediction.items():
        if not isinstance(value, torch.Tensor):
            columns.append(([name], [[v] for v in value]))
        elif value.dim() <= 1:
            columns.append(([name], [[v] for v in value.detach().cpu().reshape(-1).tolist()]))
        else:
            rows = value.detach().cpu().reshape(len(value), -1).tolist()
            columns.append(([f"{name}_{j}" for j in range(len(rows[0]) if rows else 0)], rows))
    return columns
