"""Record datasets: samples that arrive as bytes (tar shards, Parquet / Arrow rows) instead of files in a folder.

A `Source` is one split of such a dataset: an ordered list of shards of known length (`Shard`), read
sequentially (`Source.read`) as `Record` objects, each holding the raw image / audio / mask bytes and
the label as class indices. `RecordDecoder` turns a record into the same item a manifest row gives
(``sss.data.manifest.ManifestDataset``): the same Pillow / soundfile decoders, resampling, crops,
normalisation and messages. `SourceDataset` reads any source map-style (validation, test, and
``data.layout=hf`` without streaming); `sss.data.stream.StreamDataset` reads it as a stream.

Sources: ``sss.data.shards.TarShards`` (``data.layout=shards``, written by ``sss data pack``) and
``sss.data.hf`` (``data.layout=hf``: a ``save_to_disk`` folder, Parquet in the Hub's layout, a cached id).
"""

from __future__ import annotations

import abc
import bisect
import itertools
import os
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any

import torch
from torch import Tensor
from torch.utils.data import Dataset

from sss.data._decode import (
    IMAGENET,
    Crop,
    DataError,
    ImageNorm,
    describe,
    event_frames,
    load_audio,
    load_image,
    load_mask,
    sample_crop,
    single_thread,
)
from sss.data._skiplog import SkipLog

__all__ = [
    "Record",
    "RecordDecoder",
    "Shard",
    "Source",
    "SourceDataset",
    "next_good",
    "record_error",
    "sample_where",
    "seeded",
    "skip_record",
]

SKIP_HINT = "set data.on_error=skip to leave such samples out"


@dataclass(frozen=True)
class Shard:
    """One unit of a source: a file (a tar shard, a Parquet file or one of its row groups) and its sample count."""

    path: str
    """The file, named in every message about its samples."""
    rows: int
    """How many samples it holds (from the pack's index or the file's own metadata: nothing is read to count)."""
    part: int = 0
    """Which part of ``path`` (a Parquet row group); 0 for a whole file."""


@dataclass(frozen=True)
class Record:
    """One raw sample: bytes as stored, labels as indices into the source's class lists.

    Example:
        >>> record = Record("OUT/train-000000.tar", 3, "clip_0003", audio=b"RIFF...", target=2)
        >>> record.where, record.target
        ('OUT/train-000000.tar, sample 3 (key clip_0003)', 2)
    """

    file: str
    """The file it was read from (a tar shard, a Parquet or Arrow file)."""
    row: int
    """Its position in that file (0-based sample number), named in messages and the skip log."""
    key: str
    """The sample's key (its name in a shard, its row id in a table)."""
    image: bytes | None = None
    audio: bytes | None = None
    mask: bytes | None = None
    target: int | tuple[int, ...] | None = None
    """A class index (``label``), a tuple of indices (``labels``, multi-label) or None (unlabelled)."""
    events: tuple[tuple[float, float, int], ...] = ()
    """Strong labels: (onset s, offset s, event class index)."""

    @property
    def where(self) -> str:
        """``FILE, sample N (key K)``: every message about this sample starts with it."""
        return sample_where(self.file, self.row, self.key)


def sample_where(file: str, row: int, key: str = "") -> str:
    """How messages name a sample of a record file.

    Example:
        >>> sample_where("OUT/train-000001.tar", 4, "k")
        'OUT/train-000001.tar, sample 4 (key k)'
    """
    return f"{file}, sample {row}" + (f" (key {key})" if key else "")


def record_error(file: str, row: int, key: str, reason: str, raise_hint: bool = True) -> DataError:
    """A `DataError` naming a sample, carrying the file, row and bare reason the skip log lists.

    Example:
        >>> str(record_error("OUT/train-000001.tar", 4, "k", "is truncated"))
        'OUT/train-000001.tar, sample 4 (key k): is truncated; set data.on_error=skip to leave such samples out'
    """
    err = DataError(f"{sample_where(file, row, key)}: {reason}" + (f"; {SKIP_HINT}" if raise_hint else ""))
    err.file, err.row, err.reason = file, row, reason
    return err


@dataclass
class Source(abc.ABC):
    """One split of a record dataset: shards of known length, the class lists, and what the samples hold.

    Subclasses implement `read`. ``shards`` is fixed once built (a missing or unreadable shard was
    refused or, under ``on_error="skip"``, left out and logged by whoever built the source), so every
    process and worker computes the same plan from it.
    """

    where: str
    """The dataset (folder, id) named in messages."""
    shards: list[Shard]
    classes: list[str]
    modalities: tuple[str, ...]
    """``("image", "audio")``, ``("image",)`` or ``("audio",)``: which bytes every record has."""
    multilabel: bool = False
    has_label: bool = True
    has_mask: bool = False
    event_classes: list[str] = field(default_factory=list)
    partial: bool = True
    """With two modalities: whether a record may lack one (True when the source cannot tell without reading it).
    Only then do items carry ``image_present`` / ``audio_present``, as a manifest with an empty cell does."""

    @property
    def has_events(self) -> bool:
        """Whether the records carry strong labels (`event_classes` is not empty)."""
        return bool(self.event_classes)

    def __len__(self) -> int:
        return sum(shard.rows for shard in self.shards)

    @abc.abstractmethod
    def read(self, shard: int, start: int = 0, stop: int | None = None) -> Iterator[Record | DataError]:
        """Records ``start`` to ``stop`` (exclusive; None: the end) of ``self.shards[shard]``, in stored order.

        A sample that cannot be read is yielded as a `DataError` in its place (`record_error`: where it is, the file
        and the reason), so the reader applies ``on_error``; a shard that cannot be opened at all raises one.
        Reading from ``start`` must not read the samples before it (an index, a row group, a seek): resume is O(1).
        """

    def durations(self, limit: int = 64) -> list[float]:
        """Seconds of up to `limit` audio samples from the start, for clip-length inference (an index may know them)."""
        import io

        import soundfile as sf

        out: list[float] = []
        for shard in range(len(self.shards)):
            for record in self.read(shard):
                if len(out) >= limit:
                    return out
                if isinstance(record, Record) and record.audio:
                    try:
                        info = sf.info(io.BytesIO(record.audio))
                        out.append(info.frames / info.samplerate)
                    except (RuntimeError, ValueError, ZeroDivisionError):
                        continue  # reported when the sample is decoded
        return out

    def fingerprint(self) -> list[list[Any]]:
        """The shard list as plain values (name, part, rows): a checkpoint compares it on resume."""
        return [[os.path.basename(s.path), s.part, s.rows] for s in self.shards]


class RecordDecoder:
    """Decode a `Record` into a sample dict, exactly as `ManifestDataset` decodes a manifest row.

    Keys: ``"image"`` ``[3, S, S]``, ``"audio"`` ``[1, N]``, ``"mask"`` ``[1, S, S]``, ``"events"`` ``[T, E]``,
    ``"label"`` or ``"labels"``, ``"index"``. Random crops and flips (``train`` and ``augment``) are drawn from
    torch's CPU generator: the caller seeds it per (seed, epoch, index), as `ManifestDataset` does.

    With both modalities, a record without image or audio bytes (None, empty) lacks that modality: its input
    (and the mask of a missing image) is zeros, and ``"image_present"`` / ``"audio_present"`` (bool ``[]``) say
    which it has. A record with neither, a mask without its image or events without their audio is refused.

    Example:
        >>> import io
        >>> import numpy as np, soundfile as sf
        >>> buf = io.BytesIO()
        >>> sf.write(buf, np.zeros(8000, dtype=np.float32), 8000, format="WAV")
        >>> source_like = dict(classes=["a", "b"], modalities=("audio",))
        >>> decoder = RecordDecoder(**source_like, sample_rate=16000, clip_seconds=1.0)
        >>> item = decoder(Record("x.tar", 0, "k", audio=buf.getvalue(), target=1), index=0)
        >>> item["audio"].shape, item["label"].item()
        (torch.Size([1, 16000]), 1)
    """

    def __init__(
        self,
        *,
        classes: Sequence[str],
        modalities: tuple[str, ...],
        multilabel: bool = False,
        has_label: bool = True,
        has_mask: bool = False,
        event_classes: Sequence[str] = (),
        image_size: int = 64,
        sample_rate: int = 16000,
        clip_seconds: float = 1.0,
        train: bool = False,
        augment: bool = True,
        event_frame_rate: float = 100.0,
        image_norm: ImageNorm | None = None,
        partial: bool = True,
    ) -> None:
        self.num_classes, self.modalities, self.multilabel = len(classes), modalities, multilabel
        self.flags = partial and len(modalities) == 2  # items carry the presence flags (`Source.partial`)
        self.has_label, self.has_mask, self.num_events = has_label, has_mask, len(event_classes)
        self.image_size, self.sample_rate = image_size, sample_rate
        self.num_samples = round(sample_rate * clip_seconds)
        self.train, self.augment, self.event_frame_rate = train, augment, event_frame_rate
        self.num_frames = round(clip_seconds * event_frame_rate)
        self.image_norm = image_norm or IMAGENET

    @classmethod
    def of(cls, source: Source, **settings: Any) -> RecordDecoder:
        """A decoder for `source`'s records (its classes and modalities) with the data settings given."""
        return cls(
            classes=source.classes,
            modalities=source.modalities,
            multilabel=source.multilabel,
            has_label=source.has_label,
            has_mask=source.has_mask,
            event_classes=source.event_classes,
            partial=source.partial,
            **settings,
        )

    def __call__(self, record: Record, index: int) -> dict[str, Any]:
        """The sample dict of `record` (``"index"`` = `index`); a bad field raises a `DataError` naming the record."""
        item: dict[str, Any] = {}
        crop: Crop | None = None
        if self.train and self.augment and "image" in self.modalities:
            crop = sample_crop(1.0)  # drawn even without the image: the audio crop after it is a full record's
        present = self._presence(record)
        size, start = self.image_size, 0
        if "image" in self.modalities:
            load_img = lambda b: load_image(b, size, crop, self.image_norm)  # noqa: E731
            item["image"] = self._field(record, "image", load_img) if present["image"] else torch.zeros(3, size, size)
        if "audio" in self.modalities:
            load = lambda b: load_audio(b, self.sample_rate, self.num_samples, train=self.train)  # noqa: E731
            absent = (torch.zeros(1, self.num_samples), 0)
            item["audio"], start = self._field(record, "audio", load) if present["audio"] else absent
        if self.has_mask:
            load_m = lambda b: load_mask(b, size, crop)  # noqa: E731
            item["mask"] = self._field(record, "mask", load_m) if present["image"] else torch.zeros(1, size, size)
        if self.num_events:
            rate, frames = self.event_frame_rate, self.num_frames
            item["events"] = event_frames(record.events, self.num_events, frames, rate, start / self.sample_rate)
        if self.has_label:
            item.update(self._target(record))
        if self.flags:
            item.update({f"{m}_present": torch.tensor(present[m]) for m in self.modalities})
        item["index"] = index
        return item

    def _presence(self, record: Record) -> dict[str, bool]:
        """Which of its modalities `record` has; only two-modality data may lack one (then never both)."""
        if len(self.modalities) < 2:
            return {m: True for m in self.modalities}  # a record without its only modality is refused by _field
        found = {m: bool(getattr(record, m)) for m in self.modalities}
        reason = None
        if not any(found.values()):
            reason = "has neither an image nor an audio; a sample needs at least one"
        elif record.mask and not found["image"]:
            reason = "has a mask but no image; a mask belongs to its image: give the image or drop the mask"
        elif record.events and not found["audio"]:
            reason = "has events but no audio; events belong to their audio: give the audio or drop the events"
        if reason is not None:
            raise record_error(record.file, record.row, record.key, reason)
        return found

    def _field(self, record: Record, kind: str, load: Any) -> Any:
        data = getattr(record, kind)
        if not data:
            raise record_error(
                record.file, record.row, record.key, f"has no {kind} (every sample of this split needs one)"
            )
        try:
            return load(data)
        except DataError as err:
            reason = f"{kind} {err}"
        except Exception as err:  # an unexpected decoder failure must still name the sample, not be a bare traceback
            reason = f"{kind} failed to decode: {type(err).__name__}: {describe(str(err))}"
        raise record_error(record.file, record.row, record.key, reason)

    def _target(self, record: Record) -> dict[str, Tensor]:
        target = record.target
        if target is None:
            raise record_error(record.file, record.row, record.key, "has no label; every sample needs one")
        if self.multilabel:
            hot = torch.zeros(self.num_classes)
            hot[list(target if isinstance(target, tuple) else (target,))] = 1.0
            return {"labels": hot}
        return {"label": torch.tensor(int(target))}  # type: ignore[arg-type]


def next_good(
    index: int, count: int, bad: set[int], load: Callable[[int], Any], skipped: Callable[[int, DataError], None]
) -> Any:
    """``load(row)`` of the first row from `index` on (wrapping round) that loads, or None when none does.

    Under ``on_error="skip"`` a bad row gives way to the next good one, so batch shapes and counts never change:
    a row whose load raises `DataError` joins `bad` (never tried again) and is handed to `skipped`.

    Example:
        >>> bad = set()
        >>> def load(row):
        ...     if row == 1:
        ...         raise DataError("broken")
        ...     return row
        >>> next_good(1, 3, bad, load, lambda row, err: print("skipped", row, err)), bad
        skipped 1 broken
        (2, {1})
    """
    for attempt in range(count):
        row = (index + attempt) % count
        if row in bad:
            continue
        try:
            return load(row)
        except DataError as err:
            bad.add(row)
            skipped(row, err)
    return None


def skip_record(log: SkipLog, err: DataError, where: str, index: int) -> None:
    """Log a skipped sample: its file and row when the error names them, else the dataset and sample index."""
    file = getattr(err, "file", "") or where
    log.record(file, getattr(err, "row", index), file, getattr(err, "reason", "") or str(err))


class _SeededDraws:
    """Run a block with the CPU RNG seeded by `seed`, then give the caller's RNG state back untouched."""

    def __init__(self, seed: int) -> None:
        self.seed = seed

    def __enter__(self) -> None:
        self._saved = torch.get_rng_state()
        torch.default_generator.manual_seed(self.seed)

    def __exit__(self, *exc: object) -> None:
        torch.set_rng_state(self._saved)


def seeded(seed: int, epoch: int, index: int) -> _SeededDraws:
    """Draws of sample `index` in `epoch`: the same whichever worker or process decodes it, resumed or not."""
    return _SeededDraws((seed * 0x9E3779B1 + epoch * 0x85EBCA77 + index) % (2**63 - 1))


class SourceDataset(Dataset[dict[str, Any]]):
    """A `Source` read map-style: item ``i`` is the ``i``-th record in shard order, decoded by `decoder`.

    Under ``on_error="skip"`` a bad sample is logged once in `skip_log` and the next good one serves in its
    place (the batch shapes and counts never change), as in `ManifestDataset`.

    Args:
        source: The split.
        decoder: How records become samples.
        on_error: ``"raise"`` or ``"skip"``.
        skip_log: Where skipped samples are recorded.
        seed: Seed of the augmentation draws.
    """

    def __init__(
        self, source: Source, decoder: RecordDecoder, *, on_error: str = "raise", skip_log: SkipLog, seed: int = 0
    ) -> None:
        self.source, self.decoder, self.on_error, self.skip_log, self.seed = source, decoder, on_error, skip_log, seed
        self.starts = list(itertools.accumulate((s.rows for s in source.shards), initial=0))
        self._epoch = torch.zeros((), dtype=torch.int64).share_memory_()  # seen by persistent workers
        self._bad: set[int] = set()

    def __len__(self) -> int:
        return self.starts[-1]

    # What the data module and the summary line read of a split, as of a ManifestDataset.
    classes = property(lambda self: self.source.classes)
    event_classes = property(lambda self: self.source.event_classes)
    modalities = property(lambda self: self.source.modalities)
    multilabel = property(lambda self: self.source.multilabel)
    has_label = property(lambda self: self.source.has_label)
    has_mask = property(lambda self: self.source.has_mask)
    cache = None  # no feature cache: records are decoded as they are read

    @property
    def image_norm(self) -> ImageNorm:
        """Mean, std and resize filter of the images (a pretrained encoder's own: ``use_model_preprocessing``)."""
        return self.decoder.image_norm

    @image_norm.setter
    def image_norm(self, norm: ImageNorm) -> None:
        self.decoder.image_norm = norm

    def set_epoch(self, epoch: int) -> None:
        """Select the augmentation of `epoch` (crops and flips are a function of (seed, epoch, index))."""
        self._epoch.fill_(epoch)

    def locate(self, index: int) -> tuple[int, int]:
        """(shard, row within it) of sample `index`."""
        shard = bisect.bisect_right(self.starts, index) - 1
        return shard, index - self.starts[shard]

    def record(self, index: int) -> Record | DataError:
        """The raw record `index` (or the error that stands for it)."""
        shard, row = self.locate(index)
        return next(iter(self.source.read(shard, row, row + 1)))

    def __getitem__(self, index: int) -> dict[str, Any]:
        with single_thread():
            if self.on_error == "raise":
                return self._load(index)
            skipped = lambda row, err: skip_record(self.skip_log, err, self.source.where, row)  # noqa: E731
            item = next_good(index, len(self), self._bad, self._load, skipped)
        if item is None:
            raise DataError(
                f"{self.source.where}: every sample failed to load; see the skipped ones in {self.skip_log.path}"
            )
        return item

    def _load(self, index: int) -> dict[str, Any]:
        record = self.record(index)
        if isinstance(record, DataError):
            raise record
        with seeded(self.seed, int(self._epoch), index):
            return self.decoder(record, index)
