"""Manifest datasets: rows listing ``image`` / ``audio`` / ``mask`` / ``events`` files and labels, decoded to tensors.

Layout of a manifest folder (paths in the manifest are relative to it)::

    ROOT/classes.txt        optional: one class name per line; fixes label indices (else sorted labels of train)
    ROOT/event_classes.txt  optional: the same for event labels (else sorted labels of the event tables)
    ROOT/train.csv          or train.jsonl; columns image, audio (one or both), label or labels, [mask], [events]
    ROOT/val.csv, test.csv  optional

The public layouts (ESC-50, UrbanSound8K, DESED, ISTD, SBU) are read by `sss.data.layouts` into
the same rows, so everything below applies to them too.
"""

from __future__ import annotations

import csv
import os
import statistics
import tempfile
import uuid
from pathlib import Path
from typing import Any

import numpy as np
import soundfile as sf
import torch
from torch import Tensor
from torch.utils.data import DataLoader, Dataset, default_collate

from sss.data._decode import (
    IMAGENET_MEAN,
    IMAGENET_STD,
    Crop,
    DataError,
    describe,
    event_frames,
    load_audio,
    load_image,
    load_mask,
    normalise_u8,
    read_event_table,
    read_text,
    sample_crop,
    single_thread,
)
from sss.data.datamodule import DataModule
from sss.data.layouts import LAYOUTS, SPLITS, SplitRows, read_split

__all__ = [
    "IMAGENET_MEAN",
    "IMAGENET_STD",
    "CollatedBatch",
    "DataError",
    "ManifestDataModule",
    "ManifestDataset",
    "SkipLog",
    "collate",
    "load_audio",
    "load_image",
    "load_mask",
]

ON_ERROR = ("raise", "skip")
SKIP_HINT = "set data.on_error=skip to leave such rows out"


class SkipLog:
    """Where a dataset records the rows it leaves out (``on_error="skip"``): an append-only CSV file.

    Every process and DataLoader worker appends to the same file with single ``O_APPEND`` writes
    (atomic for short lines), so the main process sees what its workers skipped without any
    channel back from them. `rows` deduplicates: a bad file met again next epoch counts once.

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
        fd = os.open(self.path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
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


def _read_names(path: Path) -> list[str]:
    names = [line.strip() for line in read_text(path).splitlines() if line.strip()]
    duplicates = sorted({name for name in names if names.count(name) > 1})
    if duplicates:
        raise DataError(f"{path}: duplicate class name(s) {', '.join(duplicates)}; each name must appear once")
    return names


class _SeededDraws:
    """Run a block with the CPU RNG seeded by `seed`, then give the caller's RNG state back untouched."""

    def __init__(self, seed: int) -> None:
        self.seed = seed

    def __enter__(self) -> None:
        self._saved = torch.get_rng_state()
        torch.default_generator.manual_seed(self.seed)  # the CPU generator only: CUDA's is not ours

    def __exit__(self, *exc: object) -> None:
        torch.set_rng_state(self._saved)


class ManifestDataset(Dataset[dict[str, Any]]):
    """The rows of one split as dicts of tensors, decoded on access.

    An item holds the keys its rows have: ``"image"`` float ``[3, S, S]`` (ImageNet-normalised),
    ``"audio"`` float ``[1, N]`` (mono at ``sample_rate``, ``N = round(sample_rate * clip_seconds)``;
    ``[1, M, T]`` log-mel when a feature cache is attached), ``"label"`` long ``[]`` or
    ``"labels"`` multi-hot float ``[K]``, ``"mask"`` float ``[1, S, S]`` in [0, 1], ``"events"``
    float ``[T, E]`` frame targets at ``event_frame_rate`` frames per second, and ``"index"``.

    The rows are checked at construction (columns, labels, paths inside the root, files present,
    duplicates); files are decoded when their row is loaded. A problem raises one `DataError`
    naming the source file, its line, the data file and the fix (``on_error="raise"``), or
    leaves the row out, records it in `skip_log` and serves the next good row in its place
    (``on_error="skip"``), so batch shapes and the number of batches never change.

    Args:
        root: The dataset folder.
        split: ``"train"``, ``"val"`` or ``"test"``.
        layout: How to read ``root`` (see `sss.data.layouts.LAYOUTS`).
        fold: Held-out fold for ESC-50 / UrbanSound8K.
        classes: Class names (index = position); None: the layout's, ``classes.txt``, else sorted labels.
        event_classes: Event names for ``"events"``; None: ``event_classes.txt``, else sorted table labels.
        image_size: Side of the square image and mask tensors.
        sample_rate: Rate to resample the audio to.
        clip_seconds: Length of the audio tensor.
        train: Random audio crops and (with ``augment``) random-resized-crop + flip of image and mask.
        augment: Image augmentation in training.
        event_frame_rate: Frames per second of ``"events"``.
        on_error: ``"raise"`` or ``"skip"``.
        allow_outside_root: Accept absolute paths and ``..`` that leave ``root``.
        skip_log: Where skipped rows are recorded (``on_error="skip"``); None: a temporary file.
        require_label: Refuse a manifest without ``label``/``labels`` (False for prediction inputs).
        seed: Seed of the augmentation: a sample's crops and flips are a function of (seed, epoch, index).

    Example:
        >>> import tempfile
        >>> from sss.data.synthetic import make_industrial
        >>> with tempfile.TemporaryDirectory() as tmp:
        ...     root = make_industrial(f"{tmp}/industrial", n_train=8, n_val=4, n_test=0)
        ...     item = ManifestDataset(root, "val")[0]
        >>> {key: tuple(value.shape) for key, value in item.items() if key != "index"}
        {'image': (3, 64, 64), 'audio': (1, 16000), 'mask': (1, 64, 64), 'events': (100, 3), 'label': ()}
    """

    def __init__(
        self,
        root: str | os.PathLike[str],
        split: str,
        *,
        layout: str = "manifest",
        fold: int | None = None,
        classes: list[str] | None = None,
        event_classes: list[str] | None = None,
        image_size: int = 64,
        sample_rate: int = 16000,
        clip_seconds: float = 1.0,
        train: bool = False,
        augment: bool = True,
        event_frame_rate: float = 100.0,
        on_error: str = "raise",
        allow_outside_root: bool = False,
        skip_log: str | os.PathLike[str] | None = None,
        require_label: bool = True,
        seed: int = 0,
    ) -> None:
        if on_error not in ON_ERROR:
            raise ValueError(f"on_error must be one of {', '.join(ON_ERROR)}, got {on_error!r}")
        self.root = Path(root)
        self.split, self.layout = split, layout
        found = read_split(layout, self.root, split, fold)
        if found is None:
            raise FileNotFoundError(f"manifest not found: {self.root / split}.csv (or .jsonl) for layout {layout!r}")
        self.source = found.source
        self.on_error, self.allow_outside_root, self.require_label = on_error, allow_outside_root, require_label
        self.seed = seed
        # Shared memory, so that persistent DataLoader workers see the epoch the trainer sets.
        self._epoch = torch.zeros((), dtype=torch.int64).share_memory_()
        self.skip_log = SkipLog(skip_log or Path(tempfile.gettempdir()) / f"sss-skipped-{uuid.uuid4().hex}.csv")
        self.classes = classes if classes is not None else _default_classes(self.root, found)
        self.image_size, self.sample_rate, self.clip_seconds = image_size, sample_rate, clip_seconds
        self.num_samples = round(sample_rate * clip_seconds)
        self.train, self.augment, self.event_frame_rate = train, augment, event_frame_rate
        self.num_frames = round(clip_seconds * event_frame_rate)
        self._check_header(found)
        self.event_classes = event_classes if event_classes is not None else self._default_event_classes(found)
        self._tables: dict[str, dict[str, list[Any]]] = {}
        self._bad: set[int] = set()
        self.cache: Any = None  # a FeatureCache once `attach_cache` ran
        self._build(found)

    # --- reading and checking the rows --------------------------------------------------------------------

    def _check_header(self, found: SplitRows) -> None:
        columns = set(found.columns) if found.columns else {k for _, row in found.rows for k in row}
        has = ", ".join(found.columns) or "nothing"
        if not columns & {"image", "audio"}:
            raise DataError(f"{self.source}: no image or audio column (the header has {has}); add image and/or audio")
        if self.layout == "manifest" and self.require_label and not columns & {"label", "labels"}:
            raise DataError(
                f"{self.source}: missing column label (or labels, ';'-separated, for multi-label); the header has {has}"
            )
        if {"label", "labels"} <= columns:
            raise DataError(f"{self.source}: has both label and labels columns; keep one")
        self.modalities = tuple(m for m in ("image", "audio") if m in columns)
        self.has_mask, self.has_events = "mask" in columns, "events" in columns
        self.multilabel = "labels" in columns
        self.has_label = bool(columns & {"label", "labels"})

    def _default_event_classes(self, found: SplitRows) -> list[str]:
        if not self.has_events:
            return []
        path = self.root / "event_classes.txt"
        if path.is_file():
            return _read_names(path)
        labels = set()
        for table in {row.get("events") for _, row in found.rows if row.get("events")}:
            full = self._resolve(str(table))
            if isinstance(full, str) and os.path.isfile(full):
                try:
                    labels |= {e.label for rows in read_event_table(full).values() for e in rows}
                except DataError:
                    continue  # reported, with the row that uses it, when the rows are checked
        return sorted(labels)

    def _build(self, found: SplitRows) -> None:
        # Plain lists of str/int/tuples: cheap to pickle into DataLoader workers.
        self.images: list[str] = []
        self.audio: list[str] = []
        self.masks: list[str] = []
        self.targets: list[Any] = []
        self.events: list[tuple[tuple[float, float, int], ...]] = []
        self.lines: list[int] = []
        index = {name: i for i, name in enumerate(self.classes)}
        seen: dict[tuple[Any, ...], int] = {}
        problems: list[tuple[int, str, str]] = []
        for line, row in found.rows:
            try:
                parsed = self._parse_row(row, index)
                key = tuple(sorted((k, str(v)) for k, v in row.items()))
                if key in seen:
                    raise DataError(f"duplicates line {seen[key]} (every column equal); remove one of them")
                seen[key] = line
            except DataError as err:
                problems.append((line, _first_file(row), str(err)))
                continue
            for name, value in zip(("images", "audio", "masks"), parsed[:3], strict=True):
                if value is not None:
                    getattr(self, name).append(value)
            self.targets.append(parsed[3])
            self.events.append(parsed[4])
            self.lines.append(line)
        if problems and self.on_error == "raise":
            line, _, reason = problems[0]
            more = f" ({len(problems) - 1} more problem row(s) in this file)" if len(problems) > 1 else ""
            raise DataError(f"{self.source}, line {line}: {reason}{more}; {SKIP_HINT}")
        for line, file, reason in problems:
            self.skip_log.record(self.source, line, file, reason)
        if not self.lines:
            raise DataError(
                f"{self.source}: no usable rows" + (" (all were skipped; see the skipped rows)" if problems else "")
            )

    def _parse_row(self, row: dict[str, Any], index: dict[str, int]) -> tuple[Any, ...]:
        if "__error__" in row:
            raise DataError(f"row {row['__error__']}")
        paths = []
        for column in ("image", "audio", "mask"):
            present = column in self.modalities or (column == "mask" and self.has_mask)
            paths.append(self._checked_file(row.get(column), column) if present else None)
        target: Any = None
        if self.has_label:
            target = self._parse_labels(row, index)
        events: tuple[tuple[float, float, int], ...] = ()
        if self.has_events and row.get("events"):
            events = self._row_events(str(row["events"]), paths[1])
        return (*paths, target, events)

    def _parse_labels(self, row: dict[str, Any], index: dict[str, int]) -> Any:
        if self.multilabel:
            raw = row.get("labels")
            names = raw if isinstance(raw, list) else [n.strip() for n in str(raw or "").split(";") if n.strip()]
        else:
            raw = row.get("label")
            if raw is None or str(raw).strip() == "":
                raise DataError("has an empty label; every row needs one")
            names = [str(raw).strip()]
        unknown = [name for name in names if name not in index]
        if unknown:
            shown = ", ".join(self.classes[:10]) + (", ..." if len(self.classes) > 10 else "")
            raise DataError(f"unknown label {unknown[0]!r} (classes: {shown}); add it to classes.txt or fix the row")
        return tuple(index[n] for n in names) if self.multilabel else index[names[0]]

    def _resolve(self, value: str) -> str | DataError:
        value = value.strip()
        full = os.path.normpath(os.path.join(self.root, value))
        inside = os.path.commonpath([os.path.abspath(full), os.path.abspath(self.root)]) == os.path.abspath(self.root)
        if not self.allow_outside_root and (os.path.isabs(value) or not inside):
            return DataError(
                f"path {value!r} leaves the dataset folder {self.root}; move the file inside it, "
                "or set data.allow_outside_root=true if that is intended"
            )
        return full

    def _checked_file(self, value: Any, column: str) -> str:
        if value is None or str(value).strip() == "":
            raise DataError(f"has an empty {column} path; every row needs one")
        full = self._resolve(str(value))
        if isinstance(full, DataError):
            raise full
        if not os.path.exists(full):
            raise DataError(f"{column} file not found: {full}")
        if not os.path.isfile(full):
            raise DataError(f"{column} path {full} is a directory, not a file")
        return full

    def _row_events(self, table: str, audio: str | None) -> tuple[tuple[float, float, int], ...]:
        path = self._checked_file(table, "events")
        if path not in self._tables:
            self._tables[path] = read_event_table(path)
        name = os.path.basename(audio or "")
        index = {name: i for i, name in enumerate(self.event_classes)}
        out = []
        for event in self._tables[path].get(name, []):
            if event.label not in index:
                raise DataError(f"event label {event.label!r} of {name} in {path} is not in the event classes")
            out.append((event.onset, event.offset, index[event.label]))
        return tuple(out)

    # --- loading ------------------------------------------------------------------------------------------

    def __len__(self) -> int:
        return len(self.lines)

    def set_epoch(self, epoch: int) -> None:
        """Select the augmentation of `epoch` (the trainer calls this at each epoch start).

        Random crops and flips are drawn from a generator seeded by (seed, epoch, index), not from
        the process's running RNG: which worker loads a sample, in what order, and whether the
        run was resumed mid-epoch change nothing (and the model's RNG is left untouched).
        """
        self._epoch.fill_(epoch)

    def _rng(self, key: int) -> Any:
        mixed = (self.seed * 0x9E3779B1 + int(self._epoch) * 0x85EBCA77 + key) % (2**63 - 1)
        return _SeededDraws(mixed)

    def __getitem__(self, index: int) -> dict[str, Any]:
        with single_thread(), self._rng(index):
            return self._get(index)

    def __getitems__(self, indices: list[int]) -> list[dict[str, Any]]:
        """A whole batch at once (DataLoader calls this when it exists).

        From the feature cache, one fancy-indexed read and one normalisation per batch replace
        a dozen small ops per item, whose fixed costs dominated (0.5 ms per item before).
        """
        with single_thread():
            if self.cache is None or self._bad.intersection(indices):
                items = []
                for index in indices:
                    with self._rng(index):
                        items.append(self._get(index))
                return items
            with self._rng(hash(tuple(indices)) % (2**31)):
                return self._cached_batch(indices)

    def _cached_batch(self, indices: list[int]) -> list[dict[str, Any]]:
        rows = np.asarray(indices)
        order = np.argsort(rows)  # memmap reads in file order, then back to the sampler's order
        back = np.argsort(order)
        batch: dict[str, Any] = {}
        flip = torch.rand(len(rows)) < 0.5 if self.train and self.augment else None
        for key, array, scale in (("image", "images", None), ("mask", "masks", 1 / 255)):
            if (key == "image" and "image" in self.modalities) or (key == "mask" and self.has_mask):
                pixels = torch.from_numpy(np.asarray(getattr(self.cache, array)[rows[order]])[back])
                value = normalise_u8(pixels) if scale is None else pixels.float().mul_(scale)
                if flip is not None and bool(flip.any()):
                    value[flip] = value[flip].flip(-1)
                batch[key] = value
        if "audio" in self.modalities:
            batch["audio"] = torch.from_numpy(np.asarray(self.cache.audio[rows[order]])[back])
        if self.has_events:
            batch["events"] = torch.stack(
                [
                    event_frames(
                        self.events[i],
                        len(self.event_classes),
                        self.num_frames,
                        self.event_frame_rate,
                        self.cache.starts[i] / self.sample_rate,
                    )
                    for i in indices
                ]
            )
        if self.has_label:
            if self.multilabel:
                batch["labels"] = torch.stack([self._target(i)["labels"] for i in indices])
            else:
                batch["label"] = torch.tensor([self.targets[i] for i in indices])
        batch["index"] = torch.tensor(indices)
        return CollatedBatch(batch, len(indices))

    def _target(self, index: int) -> dict[str, Tensor]:
        target = self.targets[index]
        if self.multilabel:
            hot = torch.zeros(len(self.classes))
            hot[list(target)] = 1.0
            return {"labels": hot}
        return {"label": torch.tensor(target)}

    def _get(self, index: int) -> dict[str, Any]:
        if self.on_error == "raise":
            return self._load(index)
        for attempt in range(len(self)):
            row = (index + attempt) % len(self)
            if row in self._bad:
                continue
            try:
                return self._load(row)
            except DataError as err:
                self._bad.add(row)
                self.skip_log.record(self.source, self.lines[row], *_split_reason(str(err)))
        raise DataError(f"{self.source}: every row failed to load; see the skipped rows in {self.skip_log.path}")

    def _load(self, index: int) -> dict[str, Any]:
        item: dict[str, Any] = {}
        cache = self.cache
        crop = None
        if self.train and self.augment and "image" in self.modalities:
            crop = Crop(flip=bool(torch.rand(()) < 0.5)) if cache is not None else sample_crop(1.0)
        start = 0
        if "image" in self.modalities:
            item["image"] = self._image(index, crop)
        if "audio" in self.modalities:
            item["audio"], start = self._audio(index)
        if self.has_mask:
            item["mask"] = self._mask(index, crop)
        if self.has_events:
            item["events"] = event_frames(
                self.events[index],
                len(self.event_classes),
                self.num_frames,
                self.event_frame_rate,
                start / self.sample_rate,
            )
        if self.has_label:
            item.update(self._target(index))
        item["index"] = index
        return item

    def _image(self, index: int, crop: Crop | None) -> Tensor:
        if self.cache is not None:
            pixels = normalise_u8(torch.from_numpy(np.array(self.cache.images[index])))
            return pixels.flip(-1) if crop is not None and crop.flip else pixels
        return self._guard(index, "image", self.images[index], lambda p: load_image(p, self.image_size, crop))

    def _mask(self, index: int, crop: Crop | None) -> Tensor:
        if self.cache is not None:
            mask = torch.from_numpy(np.array(self.cache.masks[index], dtype=np.float32) * (1 / 255))
            return mask.flip(-1) if crop is not None and crop.flip else mask
        return self._guard(index, "mask", self.masks[index], lambda p: load_mask(p, self.image_size, crop))

    def _audio(self, index: int) -> tuple[Tensor, int]:
        if self.cache is not None:
            return torch.from_numpy(np.array(self.cache.audio[index])), self.cache.starts[index]
        path = self.audio[index]
        return self._guard(
            index, "audio", path, lambda p: load_audio(p, self.sample_rate, self.num_samples, train=self.train)
        )

    def _guard(self, index: int, kind: str, path: str, load: Any) -> Any:
        """Run ``load(path)``; any failure becomes one `DataError` naming the row, the file and the problem."""
        try:
            return load(path)
        except DataError as err:
            reason = str(err)
        except FileNotFoundError:
            reason = "was not found (deleted after the manifest was read?)"
        except Exception as err:  # an unexpected decoder failure must still name the file, not be a bare traceback
            reason = f"failed to load: {type(err).__name__}: {describe(str(err))}"
        hint = "" if self.on_error == "skip" else f"; {SKIP_HINT}"
        raise DataError(f"{self.source}, line {self.lines[index]}: {kind} file {path} {reason}{hint}")

    def attach_cache(self, cache: Any) -> None:
        """Serve images, masks and audio features from a `FeatureCache` (see `sss.data.cache`)."""
        self.cache = cache
        self._bad = {row for row, _, _ in cache.bad}

    def decode_for_cache(self, index: int) -> tuple[Any, ...]:
        """Centre-cropped, un-augmented arrays of row ``index`` for the feature cache (raises `DataError`)."""
        image = mask = wave = None
        start = 0
        from sss.data._decode import load_image_u8

        if "image" in self.modalities:
            image = self._guard(index, "image", self.images[index], lambda p: load_image_u8(p, self.image_size))
        if self.has_mask:
            mask = self._guard(
                index, "mask", self.masks[index], lambda p: load_mask(p, self.image_size).mul(255).round()
            )
        if "audio" in self.modalities:
            wave, start = self._guard(
                index, "audio", self.audio[index], lambda p: load_audio(p, self.sample_rate, self.num_samples)
            )
        return image, mask, wave, start

    def __getstate__(self) -> dict[str, Any]:
        state = dict(self.__dict__)
        state["_tables"] = {}  # parsed at construction; workers do not need them
        return state


class CollatedBatch(list):  # type: ignore[type-arg]
    """A batch `ManifestDataset.__getitems__` already stacked; `collate` passes it through.

    Still a list of per-item dicts (views into the stacked tensors), so a DataLoader built with
    another collate function (``default_collate``, a user's) gets ordinary items.
    """

    def __init__(self, batch: dict[str, Any], length: int) -> None:
        super().__init__(
            {key: value[i] if isinstance(value, Tensor) else value for key, value in batch.items()}
            for i in range(length)
        )
        self.batch = batch


def collate(samples: list[Any]) -> Any:
    """`torch.utils.data.default_collate`, except for batches the dataset stacked itself (feature cache).

    Example:
        >>> import torch
        >>> collate([{"x": torch.zeros(2)}, {"x": torch.ones(2)}])["x"].shape
        torch.Size([2, 2])
    """
    if isinstance(samples, CollatedBatch):
        return samples.batch
    return default_collate(samples)


def _first_file(row: dict[str, Any]) -> str:
    for column in ("audio", "image", "mask", "events"):
        if row.get(column):
            return str(row[column])
    return ""


def _split_reason(message: str) -> tuple[str, str]:
    """(file, reason) out of "<source>, line N: <kind> file <path> <reason>" for the skip log."""
    rest = message.split(": ", 1)[-1]
    parts = rest.split(" ", 3)
    if len(parts) == 4 and parts[1] == "file":
        return parts[2], parts[3]
    return "", rest


def _default_classes(root: Path, found: SplitRows) -> list[str]:
    if (root / "classes.txt").is_file():
        return _read_names(root / "classes.txt")
    if found.classes is not None:
        return list(found.classes)
    labels: set[str] = set()
    for _, row in found.rows:
        if isinstance(row.get("labels"), list):
            labels |= {str(n) for n in row["labels"]}
        elif row.get("labels"):
            labels |= {n.strip() for n in str(row["labels"]).split(";") if n.strip()}
        elif row.get("label"):
            labels.add(str(row["label"]).strip())
    return sorted(labels)


class ManifestDataModule(DataModule):
    """Train / val / test loaders over a manifest folder or a public dataset layout (see `ManifestDataset`).

    Classes, the task (``"multiclass"``: ``"label"``; ``"multilabel"``: ``"labels"``;
    ``"segmentation"``: masks only), the modalities and, when ``clip_seconds`` is None, the
    clip length are inferred from the files and printed by `setup`. Loaders are plain
    `torch.utils.data.DataLoader` objects, so Accelerate's ``prepare`` (seedable sampler,
    ``set_epoch``, ``skip_first_batches``) handles resumption; the train loader shuffles
    with a generator seeded by ``seed``.

    Args:
        root: The dataset folder (required; ``sss fit examples/manifest.yaml data.root=PATH``).
        layout: ``manifest`` (our CSV/JSONL), ``esc50``, ``urbansound8k``, ``desed``, ``istd`` or ``sbu``.
        fold: ESC-50 / UrbanSound8K held-out fold used as validation (default 5 / 10).
        batch_size: Samples per batch.
        num_workers: DataLoader worker processes (0 decodes in the main process).
        pin_memory: Page-locked batches for faster copies to a GPU.
        persistent_workers: Keep workers alive between epochs (forking them again costs seconds).
        prefetch_factor: Batches each worker prepares ahead.
        image_size: Side of the square image (and mask) tensors.
        sample_rate: Audio rate in Hz; must equal the model's front-end rate.
        clip_seconds: Audio clip length; None: the median duration of up to 64 training files.
        augment: Random-resized-crop and horizontal flip of images (and masks) in training.
        event_frame_rate: Frames per second of ``"events"`` targets (the models resample in time).
        n_mels: Mel bins of cached features (``cache="features"``); must equal the model's ``n_mels``.
        cache: None (decode every epoch) or ``"features"``: log-mel and resized images computed
            once into memory-mapped files (``"audio"`` is then ``[B, 1, n_mels, T]``).
        cache_dir: Where feature caches live; None: ``$SSS_CACHE`` or ``~/.cache/sss``.
        on_error: ``"raise"`` (one error naming the row, the file and the fix) or ``"skip"``
            (the row is left out, counted in `skipped`, and written by `write_skipped`).
        allow_outside_root: Accept manifest paths that leave ``root`` (absolute or through ``..``).
        seed: Seed of the training shuffle.

    Example:
        >>> import tempfile
        >>> from sss.data.synthetic import make_industrial
        >>> with tempfile.TemporaryDirectory() as tmp:
        ...     dm = ManifestDataModule(make_industrial(f"{tmp}/ind", n_train=8, n_val=4, n_test=0), batch_size=4)
        ...     dm.setup("fit")  # doctest: +ELLIPSIS
        ...     batch = next(iter(dm.train_dataloader()))
        sss: data .../ind (manifest): 4 classes (multiclass), image+audio, mask, events (3 at 100 frames/s), ...
        >>> dm.classes, dm.modalities, dm.task, dm.event_frame_rate
        (['idle', 'fault', 'passerby', 'collision'], ('image', 'audio'), 'multiclass', 100.0)
        >>> {key: tuple(value.shape) for key, value in batch.items()}  # doctest: +NORMALIZE_WHITESPACE
        {'image': (4, 3, 64, 64), 'audio': (4, 1, 16000), 'mask': (4, 1, 64, 64),
         'events': (4, 100, 3), 'label': (4,), 'index': (4,)}
    """

    datasets: dict[str, ManifestDataset]
    """The splits `setup` found, by name (``"train"``, ``"val"``, ``"test"``)."""

    def __init__(
        self,
        root: str | None = None,
        *,
        layout: str = "manifest",
        fold: int | None = None,
        batch_size: int = 32,
        num_workers: int = 0,
        pin_memory: bool = False,
        persistent_workers: bool = True,
        prefetch_factor: int = 2,
        image_size: int = 64,
        sample_rate: int = 16000,
        clip_seconds: float | None = None,
        augment: bool = True,
        event_frame_rate: float = 100.0,
        n_mels: int = 64,
        cache: str | None = None,
        cache_dir: str | None = None,
        on_error: str = "raise",
        allow_outside_root: bool = False,
        seed: int = 0,
    ) -> None:
        super().__init__()
        if layout not in LAYOUTS:
            raise ValueError(f"data.layout must be one of {', '.join(LAYOUTS)}, got {layout!r}")
        if on_error not in ON_ERROR:
            raise ValueError(f"data.on_error must be one of {', '.join(ON_ERROR)}, got {on_error!r}")
        if cache not in (None, "features"):
            raise ValueError(f"data.cache must be null or 'features', got {cache!r}")
        self.root = Path(root) if root is not None else None
        self.layout, self.fold = layout, fold
        self.batch_size, self.num_workers, self.seed = batch_size, num_workers, seed
        self.pin_memory, self.persistent_workers, self.prefetch_factor = pin_memory, persistent_workers, prefetch_factor
        self.image_size, self.sample_rate, self.clip_seconds = image_size, sample_rate, clip_seconds
        self.augment, self.event_frame_rate, self.n_mels = augment, event_frame_rate, n_mels
        self.cache, self.cache_dir = cache, cache_dir
        self.on_error, self.allow_outside_root = on_error, allow_outside_root
        self.datasets: dict[str, ManifestDataset] = {}
        self.event_classes: list[str] = []
        self.modalities: tuple[str, ...] = ()
        self.task = ""
        # One log for every split, process and worker (see SkipLog).
        self.skip_log = SkipLog(Path(tempfile.gettempdir()) / f"sss-skipped-{os.getpid()}-{uuid.uuid4().hex[:8]}.csv")
        if self.root is not None and self.root.is_dir():
            # Cheap (one manifest read, no file checks): lets the run size the model's head before setup.
            try:
                found = read_split(layout, self.root, "train", fold)
                self.classes = _default_classes(self.root, found) if found is not None else []
            except DataError:
                pass  # reported by setup, with the full context

    def setup(self, stage: str) -> None:
        """Read and check the splits present (``train`` is required for ``"fit"``), infer settings, print them."""
        if self.root is None:
            raise DataError(
                "data.root is not set: pass the dataset folder, e.g. sss fit examples/manifest.yaml data.root=PATH"
            )
        if self.datasets:
            return
        first = read_split(self.layout, self.root, "train", self.fold)
        if first is None and stage == "fit":
            raise FileNotFoundError(f"manifest not found: {self.root / 'train.csv'} (needed for stage 'fit')")
        inferred = self.clip_seconds is None
        if self.clip_seconds is None:
            self.clip_seconds = _infer_clip_seconds(self.root, first) if first is not None else 1.0
        classes = _default_classes(self.root, first) if first is not None else (self.classes or None)
        event_classes = None
        for split in SPLITS:
            if read_split(self.layout, self.root, split, self.fold) is None:
                continue
            dataset = self._dataset(split, classes, event_classes)
            classes, event_classes = dataset.classes, dataset.event_classes
            self.datasets[split] = dataset
        if not self.datasets:
            raise FileNotFoundError(f"no split found in {self.root} for layout {self.layout!r}")
        any_set = next(iter(self.datasets.values()))
        self.classes, self.event_classes, self.modalities = list(classes or []), event_classes or [], any_set.modalities
        self.task = "multilabel" if any_set.multilabel else ("multiclass" if any_set.has_label else "segmentation")
        if self.cache == "features":
            from sss.data.cache import attach_feature_cache

            for dataset in self.datasets.values():
                attach_feature_cache(dataset, self.cache_dir, self.n_mels, self.num_workers)
        if int(os.environ.get("RANK", "0")) == 0:
            print(self.describe(inferred), flush=True)

    def _dataset(self, split: str, classes: list[str] | None, event_classes: list[str] | None) -> ManifestDataset:
        assert self.root is not None and self.clip_seconds is not None
        return ManifestDataset(
            self.root,
            split,
            layout=self.layout,
            fold=self.fold,
            classes=classes,
            event_classes=event_classes,
            image_size=self.image_size,
            sample_rate=self.sample_rate,
            clip_seconds=self.clip_seconds,
            train=split == "train",
            augment=self.augment,
            event_frame_rate=self.event_frame_rate,
            on_error=self.on_error,
            allow_outside_root=self.allow_outside_root,
            skip_log=self.skip_log.path,
            seed=self.seed,
        )

    def describe(self, inferred: bool = False) -> str:
        """One line: root, layout, classes, task, modalities, clip length, rows per split."""
        extras = (["mask"] if any(d.has_mask for d in self.datasets.values()) else []) + (
            [f"events ({len(self.event_classes)} at {self.event_frame_rate:g} frames/s)"] if self.event_classes else []
        )
        audio = (
            f", clip {self.clip_seconds:g} s{' (inferred)' if inferred else ''} at {self.sample_rate} Hz"
            if "audio" in self.modalities
            else ""
        )
        rows = " / ".join(f"{s} {len(self.datasets[s]) if s in self.datasets else '-'}" for s in SPLITS)
        shown = ", ".join(self.classes[:8]) + (", ..." if len(self.classes) > 8 else "")
        return (
            f"sss: data {self.root} ({self.layout}): {len(self.classes)} classes ({self.task}), "
            f"{'+'.join(self.modalities)}{''.join(', ' + e for e in extras)}{audio}, rows {rows}; classes: {shown}"
        )

    @property
    def skipped(self) -> list[dict[str, Any]]:
        """Rows left out so far (``on_error="skip"``): ``manifest``, ``row``, ``file``, ``reason``; each once."""
        return self.skip_log.rows()

    def write_skipped(self, path: str | os.PathLike[str]) -> Path:
        """Write `skipped` to ``path`` (the trainer's ``OUTPUT_DIR/skipped.csv``) and return it."""
        return self.skip_log.write_csv(path)

    def skipped_summary(self) -> str:
        """A line for the end of an epoch: how many rows were skipped and why ("" when none).

        Example:
            >>> import tempfile
            >>> import numpy as np, soundfile as sf
            >>> with tempfile.TemporaryDirectory() as tmp:
            ...     sf.write(f"{tmp}/ok.wav", np.zeros(1600), 16000)
            ...     _ = open(f"{tmp}/bad.wav", "wb").write(b"RIFF junk")
            ...     _ = open(f"{tmp}/train.csv", "w").write("audio,label\\nok.wav,hum\\nbad.wav,hum\\n")
            ...     dm = ManifestDataModule(tmp, on_error="skip", batch_size=2)
            ...     dm.setup("fit")  # doctest: +ELLIPSIS
            ...     _ = next(iter(dm.train_dataloader()))
            ...     [(row["row"], row["file"].endswith("bad.wav")) for row in dm.skipped]
            sss: data ...
            [(3, True)]
            >>> dm.skipped_summary()  # doctest: +ELLIPSIS
            'sss: 1 data row(s) skipped so far (first: .../train.csv, line 3: cannot be decoded as audio ...'
        """
        rows = self.skipped
        if not rows:
            return ""
        first = rows[0]
        return (
            f"sss: {len(rows)} data row(s) skipped so far "
            f"(first: {first['manifest']}, line {first['row']}: {first['reason']})"
        )

    def train_dataloader(self) -> DataLoader[Any]:
        """Shuffled batches of the training split."""
        if "train" not in self.datasets:
            raise RuntimeError(f"{type(self).__name__}.train_dataloader() needs setup('fit') first")
        return self._loader(self.datasets["train"], shuffle=True)

    def val_dataloader(self) -> DataLoader[Any] | None:
        """Batches of the validation split in file order, or None without one."""
        return self._loader(self.datasets["val"], shuffle=False) if "val" in self.datasets else None

    def test_dataloader(self) -> DataLoader[Any] | None:
        """Batches of the test split in file order, or None without one."""
        return self._loader(self.datasets["test"], shuffle=False) if "test" in self.datasets else None

    def _loader(self, dataset: ManifestDataset, shuffle: bool) -> DataLoader[Any]:
        workers = self.num_workers
        return DataLoader(
            dataset,
            batch_size=self.batch_size,
            shuffle=shuffle,
            drop_last=False,
            num_workers=workers,
            pin_memory=self.pin_memory,
            persistent_workers=self.persistent_workers and workers > 0,
            prefetch_factor=self.prefetch_factor if workers > 0 else None,
            collate_fn=collate,
            generator=torch.Generator().manual_seed(self.seed),
        )


def _infer_clip_seconds(root: Path, found: SplitRows) -> float:
    """The median duration of up to 64 evenly spaced training clips, rounded to 10 ms (1.0 without audio)."""
    paths = [row.get("audio") for _, row in found.rows if row.get("audio")]
    step = max(len(paths) // 64, 1)
    durations = []
    for value in paths[::step][:64]:
        try:
            info = sf.info(os.path.join(root, str(value)))
            durations.append(info.frames / info.samplerate)
        except (RuntimeError, OSError, ValueError, ZeroDivisionError):
            continue  # bad files are reported when their row is checked or loaded
    positive = [d for d in durations if d > 0]
    return round(statistics.median(positive), 2) if positive else 1.0
