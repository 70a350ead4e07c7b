"""Manifest datasets: rows listing ``image`` / ``audio`` / ``mask`` / ``events`` files and labels, decoded to tensors.

Layout of a manifest folder (paths in the manifest are relative to it)::

    ROOT/classes.txt        optional: one class name per line; fixes label indices (else sorted labels of train)
    ROOT/event_classes.txt  optional: the same for event labels (else sorted labels of the event tables)
    ROOT/train.csv          or train.jsonl; columns image, audio (one or both), label or labels, [mask], [events]
    ROOT/val.csv, test.csv  optional

The public layouts (ESC-50, UrbanSound8K, DESED, ISTD, SBU) are read by `sss.data.layouts` into
the same rows, so everything below applies to them too.

With both an image and an audio column, a row may leave one of the two cells empty: that sample lacks the
modality (`sss.data.presence`), its input is a zero placeholder and ``image_present`` / ``audio_present``
say so. A row with neither is a bad row.
"""

from __future__ import annotations

import os
import tempfile
import uuid
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch import Tensor
from torch.utils.data import Dataset, default_collate

from sss.data._decode import (
    IMAGENET,
    IMAGENET_MEAN,
    IMAGENET_STD,
    Crop,
    DataError,
    EventTable,
    ImageNorm,
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
from sss.data._paths import RootRule, not_regular
from sss.data._skiplog import SkipLog
from sss.data.layouts import SplitRows, read_split
from sss.data.records import next_good, seeded

__all__ = [
    "IMAGENET",
    "IMAGENET_MEAN",
    "IMAGENET_STD",
    "CollatedBatch",
    "DataError",
    "ImageNorm",
    "ManifestDataset",
    "SkipLog",
    "collate",
    "load_audio",
    "load_image",
    "load_mask",
    "unlabelled_rows",
]

ON_ERROR = ("raise", "skip")
SKIP_HINT = "set data.on_error=skip to leave such rows out"


def _read_names(path: Path, rule: RootRule) -> list[str]:
    names = [line.strip() for line in read_text(rule.check(path)).splitlines() if line.strip()]
    duplicates = sorted({name for name in names if names.count(name) > 1})
    if duplicates:
        raise DataError(f"{path}: duplicate class name(s) {', '.join(duplicates)}; each name must appear once")
    return names


class ManifestDataset(Dataset[dict[str, Any]]):
    """The rows of one split as dicts of tensors, decoded on access.

    An item holds the keys its rows have: ``"image"`` float ``[3, S, S]`` (normalised by ``image_norm``),
    ``"audio"`` float ``[1, N]`` (mono at ``sample_rate``, ``N = round(sample_rate * clip_seconds)``;
    ``[1, M, T]`` log-mel when a feature cache is attached), ``"label"`` long ``[]`` or
    ``"labels"`` multi-hot float ``[K]``, ``"mask"`` float ``[1, S, S]`` in [0, 1], ``"events"``
    float ``[T, E]`` frame targets at ``event_frame_rate`` frames per second, and ``"index"``.

    With an ``image`` and an ``audio`` column, a row may leave one cell empty (none, ``""``, blanks, JSON
    ``null``): that modality is absent, its input (and a mask or events target tied to it) is zeros of the
    usual shape, and the items of such a split also give ``"image_present"`` and ``"audio_present"``
    (bool ``[]``; `partial`). A row with neither, a mask without its image or events without their audio
    is a bad row (``on_error``).

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
        allow_outside_root: Accept absolute paths, ``..`` and symbolic links that leave ``root``, in rows and
            in the files read from it (``classes.txt``, the manifest, event tables; see `sss.data._paths`).
        skip_log: Where skipped rows are recorded (``on_error="skip"``); None: a temporary file.
        require_label: Refuse a manifest without ``label``/``labels`` (False for prediction inputs).
        labels_optional: Read a manifest without a label column as unlabelled, and also one whose ``label``
            column leaves some cells empty (`unlabelled_rows` counts them; its items then have no ``"label"``);
            for pretraining on pairs (``data.labels=optional``). Implies ``require_label=False``.
        seed: Seed of the augmentation: a sample's crops and flips are a function of (seed, epoch, index).
        image_norm: Mean, std and resize filter of the images (`ImageNorm`); None: ImageNet's, bilinear. A
            pretrained image encoder's come from its ``preprocessing()`` (see ``use_model_preprocessing``).

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
        labels_optional: bool = False,
        seed: int = 0,
        image_norm: ImageNorm | None = None,
    ) -> None:
        if on_error not in ON_ERROR:
            raise ValueError(f"on_error must be one of {', '.join(ON_ERROR)}, got {on_error!r}")
        if not clip_seconds > 0:  # a 0-sample clip only fails later, inside the model, with no hint why
            raise ValueError(f"data.clip_seconds must be > 0 (seconds of audio per sample), got {clip_seconds!r}")
        self.root = Path(root)
        self._rule = RootRule(self.root, allow_outside_root)  # every file read below stays inside the root
        self.split, self.layout = split, layout
        found = read_split(layout, self.root, split, fold, allow_outside_root=allow_outside_root)
        if found is None:
            raise FileNotFoundError(f"manifest not found: {self.root / split}.csv (or .jsonl) for layout {layout!r}")
        self.source = found.source
        self.on_error, self.allow_outside_root = on_error, allow_outside_root
        self.require_label, self.labels_optional = require_label and not labels_optional, labels_optional
        self.seed, self.image_norm = seed, image_norm or IMAGENET
        # Shared memory, so that persistent DataLoader workers see the epoch the trainer sets.
        self._epoch = torch.zeros((), dtype=torch.int64).share_memory_()
        self.skip_log = SkipLog(skip_log or Path(tempfile.gettempdir()) / f"sss-skipped-{uuid.uuid4().hex}.csv")
        self.classes = classes if classes is not None else _default_classes(self.root, found, allow_outside_root)
        self.image_size, self.sample_rate, self.clip_seconds = image_size, sample_rate, clip_seconds
        self.num_samples = round(sample_rate * clip_seconds)
        self.train, self.augment, self.event_frame_rate = train, augment, event_frame_rate
        self.num_frames = round(clip_seconds * event_frame_rate)
        self._check_header(found)
        self.event_classes = event_classes if event_classes is not None else self._default_event_classes(found)
        self._tables: dict[str, EventTable | str] = {}
        self._bad: set[int] = set()
        self.cache: Any = None  # a FeatureCache once `attach_cache` ran
        self._build(found)
        # Items carry the presence flags only where a row lacks a modality: complete data gives the batches it always
        # gave, and a model reading the flags pays no device sync per step for it.
        self.partial = self.both and ("" in self.images or "" in self.audio)

    # --- reading and checking the rows --------------------------------------------------------------------

    def _check_header(self, found: SplitRows) -> None:
        columns = set(found.columns) if found.columns else {k for _, row in found.rows for k in row}
        has = ", ".join(found.columns) or "nothing"
        if not columns & {"image", "audio"}:
            raise DataError(f"{self.source}: no image or audio column (the header has {has}); add image and/or audio")
        if self.layout == "manifest" and self.require_label and not columns & {"label", "labels"}:
            raise DataError(
                f"{self.source}: missing column label (or labels, ';'-separated, for multi-label); the header has "
                f"{has}; for pretraining on unlabelled pairs set data.labels=optional"
            )
        if {"label", "labels"} <= columns:
            raise DataError(f"{self.source}: has both label and labels columns; keep one")
        self.modalities = tuple(m for m in ("image", "audio") if m in columns)
        self.both = len(self.modalities) == 2  # then a row may lack one of them, and items say which they have
        self.has_mask, self.has_events = "mask" in columns, "events" in columns
        self.multilabel = "labels" in columns
        self.has_label = bool(columns & {"label", "labels"})
        # Optional labels: a label column with empty cells (a few labelled rows among many) is an unlabelled split.
        self.unlabelled_rows = unlabelled_rows(found) if self.labels_optional else 0
        self.label_column = self.has_label  # even when its empty cells make the split unlabelled
        self.has_label = self.has_label and not self.unlabelled_rows

    def _default_event_classes(self, found: SplitRows) -> list[str]:
        if not self.has_events:
            return []
        path = self.root / "event_classes.txt"
        if path.exists():  # not is_file(): a FIFO or a folder of that name is refused, not silently passed over
            return _read_names(path, self._rule)
        labels = set()
        for table in {row.get("events") for _, row in found.rows if row.get("events")}:
            full = self._rule.resolve(str(table))
            if isinstance(full, str) and not_regular(full) is None:
                try:
                    labels |= {e.label for rows in read_event_table(full).events.values() for e in rows}
                except DataError:
                    continue  # reported, with the row that uses it, when the rows are checked
        return sorted(labels)

    def _build(self, found: SplitRows) -> None:
        # Plain lists of str/int/tuples: cheap to pickle into DataLoader workers. "" = the row lacks that file.
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
                # The file at fault; a problem with the row itself (label, duplicate) names its first file.
                problems.append((line, err.file or self._first_file(row), str(err)))
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
        if not self.lines and problems:
            line, _, reason = problems[0]
            raise DataError(
                f"{self.source}: no usable rows: all {len(problems)} were skipped (first: line {line}: {reason}); "
                f"the skipped rows are listed in {self.skip_log.path}"
            )
        if not self.lines:
            raise DataError(f"{self.source}: no usable rows")

    def _parse_row(self, row: dict[str, Any], index: dict[str, int]) -> tuple[Any, ...]:
        if "__error__" in row:
            raise DataError(f"row {row['__error__']}")
        given = {column: not _empty(row.get(column)) for column in ("image", "audio", "mask", "events")}
        if self.both:
            _check_absences(given)
        paths = []
        for column in ("image", "audio", "mask"):
            wanted = column in self.modalities or (column == "mask" and self.has_mask)
            # Two modalities: an empty image/audio cell is that modality absent, and so is the mask of no image.
            absent = self.both and not given["image" if column == "mask" else column]
            paths.append(("" if absent else self._checked_file(row.get(column), column)) if wanted else None)
        target: Any = None
        if self.has_label:
            target = self._parse_labels(row, index)
        events: tuple[tuple[float, float, int], ...] = ()
        if self.has_events and row.get("events") and paths[1] != "":  # "": no audio, so its events cell is empty
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

    def _checked_file(self, value: Any, column: str) -> str:
        if value is None or str(value).strip() == "":
            raise DataError(f"has an empty {column} path; every row needs one")
        full = self._rule.resolve(str(value))
        if isinstance(full, DataError):
            raise full
        problem = not_regular(full)  # a FIFO would block the first read forever: refused without being opened
        if problem == "not found":
            raise _file_error(f"{column} file not found: {full}", full)
        if problem is not None:
            raise _file_error(f"{column} path {full} {problem}", full)
        return full

    def _row_events(self, table: str, audio: str | None) -> tuple[tuple[float, float, int], ...]:
        path = self._checked_file(table, "events")
        if path not in self._tables:
            try:
                self._tables[path] = read_event_table(path)
            except DataError as err:  # the whole table is unreadable: kept, so it is parsed once, not once per row
                self._tables[path] = str(err)
        parsed = self._tables[path]
        if isinstance(parsed, str):
            raise _file_error(parsed, path)
        name = os.path.basename(audio or "")
        if name in parsed.bad:  # only this clip's rows: the other clips of a shared table keep their events
            raise _file_error(parsed.bad[name], path)
        index = {name: i for i, name in enumerate(self.event_classes)}
        out = []
        for event in parsed.events.get(name, []):
            if event.label not in index:
                raise _file_error(f"event label {event.label!r} of {name} in {path} is not in the event classes", path)
            out.append((event.onset, event.offset, index[event.label]))
        return tuple(out)

    def _first_file(self, row: dict[str, Any]) -> str:
        """The row's first file, which names it in the skip log when no single file is at fault."""
        for column in ("audio", "image", "mask", "events"):
            if row.get(column):
                return os.path.normpath(os.path.join(self.root, str(row[column]).strip()))
        return ""

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
        return seeded(self.seed, int(self._epoch), key)

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
                value = normalise_u8(pixels, self.image_norm) if scale is None else pixels.float().mul_(scale)
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
        if self.partial:
            batch.update(self._presence(indices))
            for key, flag in (("image", "image_present"), ("mask", "image_present"), ("audio", "audio_present")):
                if key in batch:  # the cache holds zeros there, but a normalised zero pixel is not 0
                    batch[key][~batch[flag]] = 0.0
        batch["index"] = torch.tensor(indices)
        return CollatedBatch(batch, len(indices))

    def _presence(self, indices: list[int]) -> dict[str, Tensor]:
        """``image_present`` / ``audio_present`` of rows `indices` (bool ``[len(indices)]``)."""
        return {
            "image_present": torch.tensor([bool(self.images[i]) for i in indices]),
            "audio_present": torch.tensor([bool(self.audio[i]) for i in indices]),
        }

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
        skipped = lambda row, err: self.skip_log.record(self.source, self.lines[row], err.file, err.reason or str(err))  # noqa: E731
        item = next_good(index, len(self), self._bad, self._load, skipped)
        if item is None:
            raise DataError(f"{self.source}: every row failed to load; see the skipped rows in {self.skip_log.path}")
        return item

    def _load(self, index: int) -> dict[str, Any]:
        item: dict[str, Any] = {}
        cache = self.cache
        crop = None
        if self.train and self.augment and "image" in self.modalities:
            # Drawn even for a row without its image: the audio crop drawn next is the one a full row gets.
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
        if self.partial:
            item.update({key: flags[0] for key, flags in self._presence([index]).items()})
        item["index"] = index
        return item

    def _image(self, index: int, crop: Crop | None) -> Tensor:
        if not self.images[index]:
            return torch.zeros(3, self.image_size, self.image_size)  # absent: the placeholder
        if self.cache is not None:
            pixels = normalise_u8(torch.from_numpy(np.array(self.cache.images[index])), self.image_norm)
            return pixels.flip(-1) if crop is not None and crop.flip else pixels
        norm = self.image_norm
        return self._guard(index, "image", self.images[index], lambda p: load_image(p, self.image_size, crop, norm))

    def _mask(self, index: int, crop: Crop | None) -> Tensor:
        if not self.masks[index]:
            return torch.zeros(1, self.image_size, self.image_size)  # the row has no image, so no mask
        if self.cache is not None:
            mask = torch.from_numpy(np.array(self.cache.masks[index], dtype=np.float32) * (1 / 255))
            return mask.flip(-1) if crop is not None and crop.flip else mask
        return self._guard(index, "mask", self.masks[index], lambda p: load_mask(p, self.image_size, crop))

    def _audio(self, index: int) -> tuple[Tensor, int]:
        if not self.audio[index]:  # absent: zeros of the usual shape (log-mel frames when cached)
            return torch.zeros(self.cache.audio.shape[1:] if self.cache is not None else (1, self.num_samples)), 0
        if self.cache is not None:
            return torch.from_numpy(np.array(self.cache.audio[index])), self.cache.starts[index]
        path = self.audio[index]
        return self._guard(
            index, "audio", path, lambda p: load_audio(p, self.sample_rate, self.num_samples, train=self.train)
        )

    def _guard(self, index: int, kind: str, path: str, load: Any) -> Any:
        """Run ``load(path)``; any failure becomes one `DataError` naming the row, the file and the problem."""
        try:
            # Checked again here: the file may have been replaced (by a pipe, say) since the rows were read.
            problem = not_regular(path)
            if problem is not None and problem != "not found":
                raise DataError(problem)
            return load(path)
        except DataError as err:
            reason = str(err)
        except FileNotFoundError:
            reason = "was not found (deleted after the manifest was read?)"
        except Exception as err:  # an unexpected decoder failure must still name the file, not be a bare traceback
            reason = f"failed to load: {type(err).__name__}: {describe(str(err))}"
        hint = "" if self.on_error == "skip" else f"; {SKIP_HINT}"
        raise _file_error(f"{self.source}, line {self.lines[index]}: {kind} file {path} {reason}{hint}", path, reason)

    def attach_cache(self, cache: Any) -> None:
        """Serve images, masks and audio features from a `FeatureCache` (see `sss.data.cache`)."""
        self.cache = cache
        self._bad = {row for row, _, _ in cache.bad}

    def decode_for_cache(self, index: int) -> tuple[Any, ...]:
        """Centre-cropped, un-augmented arrays of row ``index`` for the feature cache (raises `DataError`)."""
        image = mask = wave = None
        start = 0
        from sss.data._decode import load_image_u8

        if "image" in self.modalities and self.images[index]:  # an absent modality stays None: zeros in the cache
            size, norm = self.image_size, self.image_norm
            image = self._guard(index, "image", self.images[index], lambda p: load_image_u8(p, size, norm))
        if self.has_mask and self.masks[index]:
            mask = self._guard(
                index, "mask", self.masks[index], lambda p: load_mask(p, self.image_size).mul(255).round()
            )
        if "audio" in self.modalities and self.audio[index]:
            wave, start = self._guard(
                index, "audio", self.audio[index], lambda p: load_audio(p, self.sample_rate, self.num_samples)
            )
        return image, mask, wave, start

    def __getstate__(self) -> dict[str, Any]:
        state = dict(self.__dict__)
        state["_tables"] = {}  # built at construction; workers do not need it
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


def _file_error(message: str, file: str, reason: str = "") -> DataError:
    """A `DataError` that also carries the file at fault (and the bare reason), which the skip log lists."""
    err = DataError(message)
    err.file, err.reason = file, reason
    return err


def _empty(value: Any) -> bool:
    """Whether a cell holds nothing: missing, None (JSON null), or only blanks."""
    return value is None or str(value).strip() == ""


def _check_absences(given: dict[str, bool]) -> None:
    """Refuse a two-modality row that has neither modality, or a mask or events without the input they belong to."""
    if not given["image"] and not given["audio"]:
        raise DataError("has neither an image nor an audio file; a row needs at least one")
    if given["mask"] and not given["image"]:
        raise DataError(
            "has an empty image path but a mask file; a mask belongs to its image: give the image, or leave the "
            "mask cell empty too"
        )
    if given["events"] and not given["audio"]:
        raise DataError(
            "has an empty audio path but an events table; events belong to its audio: give the audio, or leave "
            "the events cell empty too"
        )


def unlabelled_rows(found: SplitRows) -> int:
    """How many rows of a split have no label: all of them without a label column, else the empty ``label`` cells.

    A ``labels`` (multi-label) cell may be empty: it names no class, which is a label.

    Example:
        >>> from sss.data.layouts import SplitRows
        >>> rows = [(2, {"audio": "a.wav", "label": "hum"}), (3, {"audio": "b.wav", "label": ""})]
        >>> unlabelled_rows(SplitRows("train.csv", rows, columns=["audio", "label"]))
        1
    """
    columns = set(found.columns) if found.columns else {k for _, row in found.rows for k in row}
    if "labels" in columns:
        return 0
    if "label" not in columns:
        return len(found.rows)
    return sum(_empty(row.get("label")) for _, row in found.rows)


def _default_classes(root: Path, found: SplitRows, allow_outside_root: bool = False) -> list[str]:
    if (root / "classes.txt").exists():  # not is_file(): a FIFO or a folder of that name is refused
        return _read_names(root / "classes.txt", RootRule(root, allow_outside_root))
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
