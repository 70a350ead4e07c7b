"""`StreamDataset`: a record `Source` read as a stream, split across processes and workers, resumable in O(1).

How an epoch is read (everything a function of (seed, epoch), the same on every process):

1. **Shard shuffle**: the shards are permuted by a generator seeded with (seed, epoch) and laid end to end.
2. **Readers**: there are ``processes × workers`` readers (a process without workers is one reader). Reader
   ``r = rank × workers + worker`` reads positions ``[r·n, (r+1)·n)`` of that sequence, with
   ``n = samples // readers``: every sample is read by exactly one reader, every reader reads the same count
   (the fewer than ``readers`` samples left over are dropped this epoch; which ones changes with the shuffle),
   so every process takes the same number of steps and no collective waits on a rank that ran out (datasets
   #6623). A reader's range may span shards or share one with its neighbour: any shard count at least
   ``readers`` works (datasets #7917); fewer is one error with the numbers and the fix.
3. **Buffer shuffle**: a reader cuts its range into windows of ``shuffle_buffer`` samples and yields each window
   in an order drawn from (seed, epoch, reader, window). A window is the buffer: its samples are read, then
   served shuffled. Unlike a reservoir buffer, whose state is the samples it holds, a window's order is known
   without reading anything before it.
4. **Resume in O(1)**: after ``b`` batches of an epoch, worker ``w`` of a process has served
   ``ceil((b - w) / workers)`` batches (the DataLoader takes batches from its workers in turn), so its reader
   position is known; the reader seeks to that window (an index, a row group: nothing before it is read) and
   starts inside it. The resumed loader's worker ``i`` plays worker ``(i + b) % workers``, so the batches come
   in the same order as in the uninterrupted run. The trainer calls `StreamDataset.start_at` with the batch.

Accelerate must not split or dispatch this dataset again (its ``IterableDatasetShard`` would keep one batch
in ``processes`` of each reader's already-split stream, accelerate PR #4276): ``sss.trainer`` prepares it on
one process's terms (`splits_itself`).
"""

from __future__ import annotations

import bisect
import hashlib
import itertools
import json
import math
from collections.abc import Iterator
from typing import Any

import torch
from torch.utils.data import IterableDataset, get_worker_info

from sss.config.errors import ConfigError
from sss.data._decode import DataError, single_thread
from sss.data._skiplog import SkipLog
from sss.data.records import RecordDecoder, Source, seeded, skip_record

__all__ = ["StreamDataset", "splits_itself"]


def splits_itself(dataset: Any) -> bool:
    """Whether `dataset` already reads one process's share (a `StreamDataset`): Accelerate must not split it again.

    Example:
        >>> splits_itself([1, 2, 3])
        False
    """
    return bool(getattr(dataset, "splits_per_process", False))


def _generator(*parts: int) -> torch.Generator:
    mixed = 0
    for part in parts:
        mixed = (mixed * 0x9E3779B1 + part + 0x85EBCA77) % (2**63 - 1)
    return torch.Generator().manual_seed(mixed)


class StreamDataset(IterableDataset[dict[str, Any]]):
    """A `Source` read as a stream by ``processes × workers`` readers, each sample once per epoch (module docstring).

    Args:
        source: The split (`sss.data.shards.TarShards`, `sss.data.hf.HFSource`).
        decoder: How records become samples.
        batch_size: The loader's batch size (to size the epoch in batches and place a resume).
        num_workers: The loader's worker count (0: the process itself reads).
        rank: This process's index; world: the process count.
        shuffle: Shard and buffer shuffle (training); False reads in stored order (each reader its range).
        shuffle_buffer: Samples per shuffle window.
        seed: Seed of the shuffles and of the augmentation.
        on_error: ``"raise"`` or ``"skip"`` (a bad sample is logged and the next good one of its window serves).
        skip_log: Where skipped samples are recorded.

    Example:
        >>> from sss.data.records import Record, Shard, Source
        >>> class Numbers(Source):
        ...     def read(self, shard, start=0, stop=None):
        ...         for row in range(start, self.shards[shard].rows if stop is None else stop):
        ...             yield Record(self.shards[shard].path, row, f"{shard}-{row}", target=0)
        >>> source = Numbers("nums", [Shard("a", 5), Shard("b", 5)], ["x"], ())
        >>> decoder = lambda record, index: {"key": record.key}
        >>> def keys(rank):
        ...     stream = StreamDataset(source, decoder, batch_size=2, rank=rank, world=2, shuffle_buffer=5)
        ...     return [item["key"] for item in stream]
        >>> sorted(keys(0) + keys(1)) == sorted(f"{s}-{r}" for s in (0, 1) for r in range(5))
        True
    """

    splits_per_process = True

    def __init__(
        self,
        source: Source,
        decoder: RecordDecoder | Any,
        *,
        batch_size: int,
        num_workers: int = 0,
        rank: int = 0,
        world: int = 1,
        shuffle: bool = True,
        shuffle_buffer: int = 512,
        seed: int = 0,
        on_error: str = "raise",
        skip_log: SkipLog | None = None,
    ) -> None:
        self.source, self.decoder, self.batch_size = source, decoder, batch_size
        self.workers, self.rank, self.world = max(num_workers, 1), rank, world
        self.shuffle, self.buffer, self.seed = shuffle, shuffle_buffer, seed
        self.on_error, self.skip_log = on_error, skip_log
        self.readers = world * self.workers
        self.rows = [shard.rows for shard in source.shards]
        self.per_reader = sum(self.rows) // self.readers
        self._check_feeds(num_workers)
        self.starts = list(itertools.accumulate(self.rows, initial=0))  # a sample's index: its stored position
        # Shared memory, so persistent DataLoader workers see what the trainer sets between epochs.
        self._epoch = torch.zeros((), dtype=torch.int64).share_memory_()
        self._start = torch.zeros((), dtype=torch.int64).share_memory_()

    def _check_feeds(self, num_workers: int) -> None:
        shards, total = len(self.rows), sum(self.rows)
        if shards >= self.readers and self.per_reader > 0:
            return
        fix = f"repack with `sss data pack SRC OUT --shard-size {max(total // self.readers, 1)}`"
        if num_workers > 1:
            fix += f", or lower data.num_workers (to {max(shards // self.world, 0)} or fewer)"
        raise DataError(
            f"{self.source.where}: {shards} shard(s) of {total} sample(s) cannot feed {self.world} process(es) × "
            f"{self.workers} worker(s) = {self.readers} readers (each needs a shard of its own and at least one "
            f"sample): {fix}"
        )

    # --- the epoch's plan ------------------------------------------------------------------------------

    def __len__(self) -> int:
        # Each worker ends with its own short batch: counted whole, so len(loader) is the batches it yields.
        return self.workers * math.ceil(self.per_reader / self.batch_size) * self.batch_size

    def set_epoch(self, epoch: int) -> None:
        """Select the order of `epoch` (the trainer calls this at each epoch start)."""
        self._epoch.fill_(epoch)

    def start_at(self, batch: int) -> None:
        """Start the next iteration after `batch` batches of this epoch have been taken (0: from its start)."""
        self._start.fill_(batch)

    def order(self, epoch: int) -> list[int]:
        """The shards in the order `epoch` reads them."""
        if not self.shuffle:
            return list(range(len(self.rows)))
        return torch.randperm(len(self.rows), generator=_generator(self.seed, epoch)).tolist()

    def reader_position(self, batch: int, worker: int) -> int:
        """Samples reader ``(rank, worker)`` has served after `batch` batches of this process's epoch."""
        served = max(batch - worker + self.workers - 1, 0) // self.workers
        return min(served * self.batch_size, self.per_reader)

    def position(self, epoch: int, batch: int) -> dict[str, Any]:
        """Where every reader of every process stands after `batch` batches of `epoch` (recorded in checkpoints).

        ``plan`` is what must not change for a resume to be exact (a hash of the shard list and the settings);
        ``readers`` holds, per reader, ``[shard, sample in shard, window, place in window]``.
        """
        order, readers = self.order(epoch), []
        offsets = list(itertools.accumulate((self.rows[k] for k in order), initial=0))
        for reader in range(self.readers):
            served = self.reader_position(batch, reader % self.workers)
            at = reader * self.per_reader + served
            k = min(bisect.bisect_right(offsets, at) - 1, len(order) - 1)  # the shard holding position `at`
            readers.append([order[k], at - offsets[k], served // self.buffer, served % self.buffer])
        return {"plan": self.plan(), "epoch": epoch, "batch": batch, "readers": readers}

    def plan(self) -> str:
        """A hash of what fixes the order: shards, seed, readers, batch size, buffer, shuffle."""
        what = [self.source.fingerprint(), self.seed, self.world, self.workers, self.batch_size, self.buffer]
        return hashlib.sha256(json.dumps([*what, self.shuffle]).encode()).hexdigest()[:16]

    def check_resume(self, saved: dict[str, Any] | None, epoch: int, batch: int, processes: int) -> None:
        """Refuse a checkpoint whose stream plan is not this one (another shard list, seed, worker or process count).

        Raises:
            ConfigError: What changed, and how to resume exactly.
        """
        if saved is None:
            return
        if saved.get("processes", processes) != self.world:
            raise ConfigError(
                f"trainer.resume_resize cannot continue a stream (data.layout=shards or data.streaming=true) on "
                f"{self.world} process(es): each reader's range depends on the process count. Resume with "
                f"--num-processes {saved.get('processes')}."
            )
        if saved["plan"] != self.plan() or saved["readers"] != self.position(epoch, batch)["readers"]:
            raise ConfigError(
                f"cannot resume the data stream of {self.source.where} exactly: its shards, data.seed, "
                "data.num_workers, data.batch_size or data.shuffle_buffer differ from the checkpoint's. Set them "
                "back, or start a new run (another trainer.output_dir)."
            )

    # --- reading ------------------------------------------------------------------------------------------

    def __iter__(self) -> Iterator[dict[str, Any]]:
        info = get_worker_info()
        if info is not None and info.num_workers != self.workers:
            raise DataError(
                f"{self.source.where}: this stream was planned for {self.workers} worker(s) and the loader has "
                f"{info.num_workers}; build the DataLoader with num_workers={self.workers}"
            )
        epoch, start = int(self._epoch), int(self._start)
        worker = ((info.id if info is not None else 0) + start) % self.workers  # the turn order of the straight run
        reader = self.rank * self.workers + worker
        served = self.reader_position(start, worker)
        order = self.order(epoch)
        first = served // self.buffer * self.buffer
        for window in range(first, self.per_reader, self.buffer):
            size = min(self.buffer, self.per_reader - window)
            records = self._read(order, reader * self.per_reader + window, size)
            places = list(range(size))
            if self.shuffle:
                places = torch.randperm(size, generator=_generator(self.seed, epoch, reader, window)).tolist()
            for i in range(served - window if window == first else 0, size):
                yield self._decoded(records, places, i, epoch)

    def _read(self, order: list[int], at: int, size: int) -> list[tuple[int, Any]]:
        """``size`` records from stream position `at` of this epoch's shard order, with their sample indices."""
        out: list[tuple[int, Any]] = []
        offset = 0
        for k in order:
            rows = self.rows[k]
            if offset + rows > at and len(out) < size:
                begin = max(at - offset, 0)
                stop = min(rows, begin + size - len(out))
                for row, record in zip(range(begin, stop), self.source.read(k, begin, stop), strict=True):
                    out.append((self.starts[k] + row, record))
            offset += rows
            if len(out) >= size:
                break
        return out

    def _decoded(self, records: list[tuple[int, Any]], places: list[int], i: int, epoch: int) -> dict[str, Any]:
        """The window's `i`-th sample in shuffled order; under ``on_error="skip"`` a bad one gives way to the next."""
        for attempt in range(len(places)):
            index, record = records[places[(i + attempt) % len(places)]]
            try:
                if isinstance(record, DataError):
                    raise record
                with single_thread(), seeded(self.seed, epoch, index):
                    return self.decoder(record, index)
            except DataError as err:
                if self.on_error == "raise":
                    raise
                if self.skip_log is not None:
                    skip_record(self.skip_log, err, self.source.where, index)
        raise DataError(f"{self.source.where}: every sample of a {len(places)}-sample window failed to load")
