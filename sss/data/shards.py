"""Tar shards: ``sss data pack SRC OUT`` writes a dataset folder as tar files, `TarShards` reads them back.

Layout of OUT (WebDataset-style: one uncompressed tar per shard, a sample's members side by side)::

    OUT/train-000000.tar    members in key order: train_0000000.flac (or .wav), .jpg (or .png), .json, .mask.png
    OUT/val-000000.tar      the same per split present in SRC (train, val, test)
    OUT/classes.txt         label index = line number; event_classes.txt too when the samples have strong labels
    OUT/shards.json         the index (below)
    OUT/skipped.csv         only when rows were left out under on_error="skip"

Keys are ``{split}_{NNNNNNN}`` (the sample's number in its split): sortable, and no text of the user's in a
member name. Audio and images keep their bytes when they are WAV / FLAC and JPEG / PNG, anything else is
re-encoded (FLAC, PNG); masks are PNG. The ``.json`` member holds ``label`` (or ``labels``), ``events`` as
``[onset, offset, NAME]`` when the split has strong labels, and ``source``: the manifest and line it came from.

``shards.json`` holds ``format``, ``version`` and, per split, its flags (``modalities``, ``multilabel``,
``has_label``, ``has_mask``) and shard list; per shard the ``file``, ``samples``, ``size`` and ``sha256`` of
the whole tar, and per sample its ``key``, ``duration`` (audio seconds, for clip-length inference) and
``members``: extension -> ``[offset, size, crc32]`` of the member's data inside the tar. A sample of two-modality
data that lacks its image or audio (an empty manifest cell) has no member for it and lists it in ``absent``
(``["image"]``, with its mask, or ``["audio"]``); it reads back without it (`sss.data.presence`).

Why the standard library's ``tarfile`` and not the ``webdataset`` package: an exact O(1) resume needs a seek
to the first sample's data offset, which only an index of member offsets gives; webdataset's pipeline reads
a tar sequentially from its start and resumes mid-shard by reading (and dropping) everything before. With the
index, reading never needs ``tarfile`` at all, and every member's bytes are checked against their crc32.
"""

from __future__ import annotations

import hashlib
import io
import json
import os
import re
import shutil
import tarfile
import tempfile
import uuid
import zlib
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import soundfile as sf
from PIL import Image

from sss._writing import writing_to
from sss.data._decode import DataError, _to_8bit, load_audio, load_image, load_mask, read_text
from sss.data._paths import not_regular
from sss.data._skiplog import SkipLog
from sss.data.layouts import SPLITS, read_split
from sss.data.manifest import ManifestDataset
from sss.data.records import Record, Shard, Source, record_error

__all__ = ["FORMAT", "VERSION", "PackReport", "TarShards", "open_shards", "pack"]

FORMAT, VERSION = "sss-shards", 1
"""What ``shards.json`` says it is; a reader refuses any other format or version."""

MADE_BY = "made by `sss data pack SRC OUT`"
AGAIN = "pack the source again (sss data pack SRC OUT)"
_SHARD_NAME = re.compile(r"^(train|val|test)-\d{6}\.tar$")
_PNG_MODES = {"1", "L", "LA", "I", "I;16", "P", "RGB", "RGBA"}
_AUDIO, _IMAGE = ("flac", "wav"), ("jpg", "png")
_BLOCK = tarfile.BLOCKSIZE


# --- writing ----------------------------------------------------------------------------------------------


@dataclass
class PackReport:
    """What `pack` wrote: samples and shards per split, and the rows it left out (``on_error="skip"``)."""

    out: Path
    samples: dict[str, int]
    shards: dict[str, int]
    skipped: list[dict[str, Any]] = field(default_factory=list)
    """The skipped rows as `SkipLog.rows` gives them (``manifest``, ``row``, ``file``, ``reason``)."""


def pack(
    src: str | os.PathLike[str],
    out: str | os.PathLike[str],
    *,
    shard_size: int,
    layout: str = "manifest",
    fold: int | None = None,
    on_error: str = "raise",
    allow_outside_root: bool = False,
) -> PackReport:
    """Write the splits of the dataset folder ``src`` as tar shards of ``shard_size`` samples into ``out``.

    The rows are read and checked as `ManifestDataset` reads them (class list, labels, paths inside the root),
    every sample is decoded with sss's loaders before it is written, and every shard is re-opened after it
    is closed and each member's bytes checked against the index. Everything is written into a sibling folder
    ``OUT.partial-<random>`` that is renamed to ``out`` at the end: ``out`` appears complete or not at all.

    Args:
        src: The dataset folder.
        out: A new (or empty) folder.
        shard_size: Samples per shard (the last shard of a split may hold fewer).
        layout: How to read ``src`` (`sss.data.layouts.LAYOUTS`).
        fold: ESC-50 / UrbanSound8K: the held-out fold.
        on_error: ``"raise"``: a bad row stops the pack, naming the manifest and line; ``"skip"``: it is left out
            and listed in ``OUT/skipped.csv`` and the report.
        allow_outside_root: Accept paths that leave ``src`` (``data.allow_outside_root``).

    Raises:
        DataError: A bad row (``on_error="raise"``), a split without usable rows, or a shard that reads back wrong.
        FileExistsError: ``out`` exists and is not empty.

    Example:
        >>> import tempfile
        >>> from sss.data.synthetic import make_industrial
        >>> tmp = tempfile.mkdtemp()
        >>> src = make_industrial(f"{tmp}/ind", n_train=3, n_val=1, n_test=0, image_size=32)
        >>> report = pack(src, f"{tmp}/shards", shard_size=2)  # doctest: +ELLIPSIS
        train: 3 samples in 2 shard(s) from .../train.csv
        val: 1 samples in 1 shard(s) from .../val.csv
        >>> sorted(p.name for p in report.out.iterdir())[:3], report.samples
        (['classes.txt', 'event_classes.txt', 'shards.json'], {'train': 3, 'val': 1})
    """
    if shard_size < 1 or on_error not in ("raise", "skip"):
        raise ValueError(f"shard_size must be at least 1 and on_error raise or skip, got {shard_size}, {on_error!r}")
    src, out = Path(src), Path(out)
    _refuse_existing(out)
    out.parent.mkdir(parents=True, exist_ok=True)  # the partial folder is its sibling: the rename stays on one disk
    partial = out.parent / f"{out.name}.partial-{uuid.uuid4().hex[:8]}"
    partial.mkdir()
    try:
        with writing_to(partial):
            report = _pack_into(src, partial, shard_size, on_error, (layout, fold, allow_outside_root))
        _refuse_existing(out)  # made meanwhile by someone else: theirs stays
        os.rename(partial, out)
    except BaseException:
        shutil.rmtree(partial, ignore_errors=True)
        raise
    report.out = out
    return report


def _refuse_existing(out: Path) -> None:
    if out.exists() and (not out.is_dir() or any(out.iterdir())):
        raise FileExistsError(f"{out} already exists and is not empty; choose a new folder or remove it")


def _pack_into(src: Path, folder: Path, shard_size: int, on_error: str, how: tuple[Any, ...]) -> PackReport:
    """Read, check and write every split of ``src`` into ``folder``; the index and class lists last."""
    layout, fold, outside = how
    log = SkipLog(folder / "skipped.csv")
    report = PackReport(folder, {}, {})
    index: dict[str, Any] = {"format": FORMAT, "version": VERSION, "layout": layout, "fold": fold, "splits": {}}
    classes: list[str] | None = None
    event_classes: list[str] | None = None
    for split in SPLITS:
        if read_split(layout, src, split, fold, allow_outside_root=outside) is None:
            continue
        before = len(log.rows())  # ESC-50's splits share one metadata file: count this split's rows alone
        rows = ManifestDataset(
            src, split, layout=layout, fold=fold, classes=classes, event_classes=event_classes,
            on_error=on_error, allow_outside_root=outside, skip_log=log.path,
        )  # fmt: skip
        classes, event_classes = rows.classes, rows.event_classes or None
        entry = _pack_split(rows, split, src, folder, shard_size, log)
        index["splits"][split] = entry
        report.samples[split], report.shards[split] = entry["samples"], len(entry["shards"])
        skipped = len(log.rows()) - before
        print(
            f"{split}: {entry['samples']} samples in {len(entry['shards'])} shard(s)"
            + (f", {skipped} row(s) skipped" if skipped else "")
            + f" from {rows.source}"
        )
    if not index["splits"]:
        raise DataError(f"{src}: no train, val or test split found for layout {layout!r}; nothing to pack")
    _write_text(folder / "classes.txt", "".join(f"{name}\n" for name in classes or []))
    if event_classes:
        _write_text(folder / "event_classes.txt", "".join(f"{name}\n" for name in event_classes))
    _write_text(folder / "shards.json", json.dumps(index, separators=(",", ":")) + "\n")
    report.skipped = log.rows()
    return report


def _write_text(path: Path, text: str) -> None:
    path.write_text(text, encoding="utf-8")


def _pack_split(rows: ManifestDataset, split: str, src: Path, folder: Path, size: int, log: SkipLog) -> dict[str, Any]:
    """Decode and write the rows of one split, shard by shard; its entry of ``shards.json``."""
    shards: list[dict[str, Any]] = []
    writer: _ShardWriter | None = None
    count = 0
    for i in range(len(rows)):
        try:
            members, duration = _sample(rows, i, src)
        except DataError as err:
            if rows.on_error == "raise":
                raise
            log.record(rows.source, rows.lines[i], err.file, err.reason or str(err))
            continue
        if writer is None:
            writer = _ShardWriter(folder / f"{split}-{len(shards):06d}.tar")
        absent = [m for m, paths in (("image", rows.images), ("audio", rows.audio)) if paths and not paths[i]]
        writer.add(f"{split}_{count:07d}", members, duration, absent)
        count += 1
        if writer.count == size:
            shards.append(writer.close())
            writer = None
    if writer is not None:
        shards.append(writer.close())
    if not count:
        raise DataError(f"{rows.source}: no usable rows: every row failed to decode (the first: {log.rows()[0]})")
    flags = {"modalities": list(rows.modalities), "multilabel": rows.multilabel, "has_label": rows.has_label}
    return {"samples": count, **flags, "has_mask": rows.has_mask, "shards": shards}


def _sample(rows: ManifestDataset, i: int, src: Path) -> tuple[dict[str, bytes], float | None]:
    """Row ``i``'s members (extension -> bytes), each file decoded by sss's loaders first, and its audio seconds."""
    members: dict[str, bytes] = {}
    duration = None
    # An absent modality ("" in the rows: two-modality data) writes no member; the index lists it (absent).
    if "audio" in rows.modalities and rows.audio[i]:
        ext, data, duration = _checked(rows, i, "audio", rows.audio[i], _audio_member)
        members[ext] = data
    if "image" in rows.modalities and rows.images[i]:
        ext, data = _checked(rows, i, "image", rows.images[i], lambda b: _image_member(b, mask=False))
        members[ext] = data
    if rows.has_mask and rows.masks[i]:
        members["mask.png"] = _checked(rows, i, "mask", rows.masks[i], lambda b: _image_member(b, mask=True))[1]
    meta: dict[str, Any] = {}
    if rows.has_label:
        target = rows.targets[i]
        meta["labels" if rows.multilabel else "label"] = (
            [rows.classes[k] for k in target] if rows.multilabel else rows.classes[target]
        )
    if rows.has_events:
        meta["events"] = [[onset, offset, rows.event_classes[k]] for onset, offset, k in rows.events[i]]
    source = Path(rows.source)
    shown = source.relative_to(src) if source.is_relative_to(src) else source
    meta["source"] = {"manifest": str(shown), "line": rows.lines[i]}
    members["json"] = json.dumps(meta, sort_keys=True).encode()
    return members, duration


def _checked(rows: ManifestDataset, i: int, kind: str, path: str, convert: Any) -> Any:
    """``convert(bytes of path)``; any failure is one `DataError` naming the manifest, line, file and reason."""
    try:
        problem = not_regular(path)  # replaced by a pipe since the rows were checked: never opened
        if problem is not None:
            raise DataError(problem)
        with open(path, "rb") as handle:
            return convert(handle.read())
    except DataError as err:
        reason = str(err)
    except Exception as err:  # an unexpected decoder failure must still name the row, not be a bare traceback
        reason = f"failed to load: {type(err).__name__}: {err}"
    hint = "" if rows.on_error == "skip" else "; set --on-error skip to leave such rows out"
    err = DataError(f"{rows.source}, line {rows.lines[i]}: {kind} file {path} {reason}{hint}")
    err.file, err.reason = path, reason
    raise err


def _audio_member(data: bytes) -> tuple[str, bytes, float]:
    """WAV / FLAC bytes as they are, anything else soundfile reads as FLAC; decoded in full first."""
    try:
        info = sf.info(io.BytesIO(data))
    except Exception:
        load_audio(data, 16000, 1)  # raises the loader's own DataError for what soundfile cannot open
        raise
    load_audio(data, info.samplerate, max(info.frames, 1))  # truncated, empty, NaN: refused as training would
    duration = info.frames / info.samplerate
    if info.format in ("WAV", "WAVEX"):
        return "wav", data, duration
    if info.format == "FLAC":
        return "flac", data, duration
    wave, rate = sf.read(io.BytesIO(data), dtype="float32", always_2d=True)
    buffer = io.BytesIO()
    sf.write(buffer, wave, rate, format="FLAC", subtype="PCM_24")
    return "flac", buffer.getvalue(), duration


def _image_member(data: bytes, mask: bool) -> tuple[str, bytes]:
    """JPEG / PNG bytes as they are (masks: PNG only), anything else Pillow reads as PNG; decoded in full first."""
    (load_mask if mask else load_image)(data, 8)  # corrupt, truncated, a 1x1 placeholder: refused as training would
    with Image.open(io.BytesIO(data)) as img:
        if img.format == "PNG" or (img.format == "JPEG" and not mask):
            return ("jpg" if img.format == "JPEG" else "png"), data
        img.load()
        bands = img.getbands()
        if img.mode not in _PNG_MODES:  # CMYK, float, 16-bit big-endian, ...: as the loaders convert them
            img = _to_8bit(img, "L" if len(bands) == 1 else "RGBA" if "A" in bands else "RGB")
        buffer = io.BytesIO()
        img.save(buffer, "PNG")
    return "png", buffer.getvalue()


class _ShardWriter:
    """One tar being written: members added in key order, their data offsets and crc32s noted for the index."""

    def __init__(self, path: Path) -> None:
        self.path, self.count, self.samples = path, 0, []
        self.tar = tarfile.open(path, "w", format=tarfile.PAX_FORMAT)  # noqa: SIM115 - closed in close()

    def add(self, key: str, members: dict[str, bytes], duration: float | None, absent: list[str]) -> None:
        entry: dict[str, Any] = {"key": key, "duration": duration, "members": {}}
        if absent:  # only then: a full sample's entry is what it always was
            entry["absent"] = absent
        for ext in sorted(members):
            data = members[ext]
            info = tarfile.TarInfo(f"{key}.{ext}")
            info.size, info.mode, info.mtime = len(data), 0o644, 0  # mtime 0: the same source packs to the same bytes
            self.tar.addfile(info, io.BytesIO(data))
            # The data ends the (block-padded) entry just written; whatever headers came before it.
            offset = self.tar.offset - -(-len(data) // _BLOCK) * _BLOCK
            entry["members"][ext] = [offset, len(data), zlib.crc32(data)]
        self.samples.append(entry)
        self.count += 1

    def close(self) -> dict[str, Any]:
        """Close the tar, read it back against the index; its entry of ``shards.json``."""
        self.tar.close()
        _verify(self.path, self.samples)
        digest = hashlib.sha256()
        with open(self.path, "rb") as handle:
            for block in iter(lambda: handle.read(1 << 20), b""):
                digest.update(block)
        size = self.path.stat().st_size
        return {"file": self.path.name, "samples": self.count, "size": size, "sha256": digest.hexdigest()} | {
            "index": self.samples
        }


def _verify(path: Path, samples: list[dict[str, Any]]) -> None:
    """Re-open a written shard with ``tarfile``: every member where the index says, with the bytes it says."""
    expected = {f"{s['key']}.{ext}": spot for s in samples for ext, spot in s["members"].items()}
    with tarfile.open(path, "r:") as tar:
        found = tar.getmembers()
        for member in found:
            spot = expected.get(member.name)
            handle = tar.extractfile(member) if spot is not None else None
            data = handle.read() if handle is not None else b""
            if spot is None or [member.offset_data, member.size, zlib.crc32(data)] != spot:
                raise DataError(
                    f"{path}: member {member.name} does not read back as written; check the disk, then pack"
                )
    if len(found) != len(expected):
        raise DataError(f"{path}: {len(found)} members read back, {len(expected)} written; check the disk, then pack")


# --- reading ----------------------------------------------------------------------------------------------


@dataclass
class TarShards(Source):
    """One split of a folder written by `pack`, read from its tar shards by seeking to offsets from ``shards.json``.

    Build it with `open_shards`. `read` yields a `Record` per sample (labels as indices of ``classes.txt``, events
    of ``event_classes.txt``), or, for a member whose bytes are cut short or fail their crc32, a `DataError`
    (`record_error`) in its place.

    Example:
        >>> import tempfile
        >>> from sss.data.synthetic import make_industrial
        >>> tmp = tempfile.mkdtemp()
        >>> src = make_industrial(f"{tmp}/ind", n_train=3, n_val=1, n_test=0, image_size=32)
        >>> _ = pack(src, f"{tmp}/shards", shard_size=2)  # doctest: +ELLIPSIS
        train: ...
        >>> source = open_shards(f"{tmp}/shards", "train")
        >>> len(source), [s.rows for s in source.shards], source.modalities
        (3, [2, 1], ('image', 'audio'))
        >>> record = next(source.read(1))
        >>> record.key, record.row, record.image[:4], source.durations()
        ('train_0000002', 0, b'\\x89PNG', [1.0, 1.0, 1.0])
    """

    samples: list[list[dict[str, Any]]] = field(default_factory=list)
    """Per shard of `shards`, its samples' index entries (``key``, ``duration``, ``members``)."""

    def __post_init__(self) -> None:
        self._labels = {name: i for i, name in enumerate(self.classes)}
        self._events = {name: i for i, name in enumerate(self.event_classes)}

    def read(self, shard: int, start: int = 0, stop: int | None = None) -> Iterator[Record | DataError]:
        """Samples ``start`` to ``stop`` of shard ``shard``: a seek to the first one's data, nothing before it."""
        path = self.shards[shard].path
        try:
            handle = open(path, "rb")  # noqa: SIM115 - closed by the with below, after the last yield
        except OSError as err:
            raise DataError(f"{path}: cannot be opened ({err.strerror or err}); {AGAIN}") from None
        with handle:
            for row, entry in enumerate(self.samples[shard][start:stop], start=start):
                yield self._record(handle, path, row, entry)

    def _record(self, handle: Any, path: str, row: int, entry: dict[str, Any]) -> Record | DataError:
        key, data = entry["key"], {}
        for ext, (offset, size, crc) in entry["members"].items():
            handle.seek(offset)
            data[ext] = handle.read(size)
            if len(data[ext]) < size:
                cut = f"member {key}.{ext} is truncated ({len(data[ext])} of {size} bytes: the shard was cut short)"
                return record_error(path, row, key, f"{cut}; {AGAIN}")
            if zlib.crc32(data[ext]) != crc:
                bad = f"member {key}.{ext} is corrupt (its bytes do not match their crc32 in shards.json)"
                return record_error(path, row, key, f"{bad}; {AGAIN}")
        try:
            meta = json.loads(data["json"])
            names = meta["labels"] if self.multilabel else [meta["label"]] if self.has_label else []
            labels = tuple(self._labels[name] for name in names)
            events = tuple((float(on), float(off), self._events[name]) for on, off, name in meta.get("events", ()))
        except (KeyError, TypeError, ValueError) as err:
            reason = f"member {key}.json does not match classes.txt / event_classes.txt ({type(err).__name__}: {err})"
            return record_error(path, row, key, f"{reason}; {AGAIN}")
        target = labels if self.multilabel else labels[0] if labels else None
        pick = lambda exts: next((data[e] for e in exts if e in data), None)  # noqa: E731
        return Record(path, row, key, pick(_IMAGE), pick(_AUDIO), data.get("mask.png"), target, events)

    def durations(self) -> list[float]:
        """Audio seconds of every sample, in shard order, from the index (empty without audio)."""
        return [e["duration"] for shard in self.samples for e in shard if e.get("duration") is not None]


def open_shards(
    root: str | os.PathLike[str], split: str, *, on_error: str = "raise", skip_log: SkipLog | None = None
) -> TarShards | None:
    """The ``split`` of a folder written by `pack`, or None when ``shards.json`` lists no shard for it.

    Every shard file listed must be there with the size the index gives; otherwise ``on_error="raise"`` raises
    a `DataError` naming the file, the split and the fix, and ``"skip"`` leaves it out and records it in
    ``skip_log``. Nothing else is read here: a shard's bytes are checked as `TarShards.read` reads them.

    Raises:
        DataError: ``shards.json`` missing, unreadable or of another format or version; a missing shard
            (``on_error="raise"``); every shard of the split missing.
    """
    if on_error not in ("raise", "skip"):
        raise ValueError(f"on_error must be raise or skip, got {on_error!r}")
    root = Path(root)
    entry = _read_index(root)["splits"].get(split)
    if not entry or not entry.get("shards"):
        return None
    log = skip_log or SkipLog(Path(tempfile.gettempdir()) / f"sss-skipped-{uuid.uuid4().hex}.csv")
    shards, samples = [], []
    for item in entry["shards"]:
        path = root / str(item.get("file"))
        problem = _shard_problem(path, item)
        if problem is None:
            shards.append(Shard(str(path), int(item["samples"])))
            samples.append(item["index"])
            continue
        if on_error == "raise":
            raise DataError(
                f"{path}: {problem} (split {split} of {root / 'shards.json'} lists it); copy the folder again or "
                f"{AGAIN}, or set data.on_error=skip to leave the shard out"
            )
        log.record(str(path), 0, str(path), problem)
    if not shards:
        raise DataError(f"{root}: every shard of split {split} is missing or damaged (listed in {log.path}); {AGAIN}")
    has_events = (root / "event_classes.txt").exists()
    return TarShards(
        where=str(root),
        shards=shards,
        classes=_names(root / "classes.txt"),
        modalities=tuple(entry["modalities"]),
        multilabel=bool(entry["multilabel"]),
        has_label=bool(entry["has_label"]),
        has_mask=bool(entry["has_mask"]),
        event_classes=_names(root / "event_classes.txt") if has_events else [],
        samples=samples,
        partial=any("absent" in e for index in samples for e in index),
    )


def _read_index(root: Path) -> dict[str, Any]:
    """``ROOT/shards.json``, checked to be this format and version."""
    path = root / "shards.json"
    if not root.is_dir():
        raise DataError(f"{root} is not a folder; data.layout=shards reads a folder {MADE_BY}")
    if not path.exists():
        raise DataError(f"{path} not found; data.layout=shards reads a folder {MADE_BY}")
    problem = not_regular(path)
    if problem is not None:
        raise DataError(f"{path} {problem}")
    try:
        index = json.loads(read_text(path))
    except json.JSONDecodeError as err:
        raise DataError(f"{path}: not valid JSON ({err.msg}, line {err.lineno}); it is {MADE_BY}: {AGAIN}") from None
    found = (index.get("format"), index.get("version")) if isinstance(index, dict) else (None, None)
    if found != (FORMAT, VERSION):
        raise DataError(
            f"{path}: format {found[0]!r} version {found[1]!r}, but this sss reads {FORMAT!r} version {VERSION}, "
            f"a folder {MADE_BY}; {AGAIN}"
        )
    splits = index.get("splits")
    fields = ("modalities", "multilabel", "has_label", "has_mask", "shards")
    if not isinstance(splits, dict) or not all(isinstance(e, dict) and set(fields) <= set(e) for e in splits.values()):
        raise DataError(f"{path}: a split's entry lacks one of {', '.join(fields)} (the file was edited); {AGAIN}")
    for entry in splits.values():  # a shard without its fields would fail later as a bare KeyError
        if not all(isinstance(s, dict) and {"file", "samples", "size", "index"} <= set(s) for s in entry["shards"]):
            raise DataError(f"{path}: a shard's entry lacks one of file, samples, size, index (edited?); {AGAIN}")
    return index


def _shard_problem(path: Path, item: dict[str, Any]) -> str | None:
    """What is wrong with a listed shard file, found without reading it; None when it is there at its size."""
    if not _SHARD_NAME.match(path.name) or path.name != item.get("file"):
        return f"is not a shard name of this folder ({item.get('file')!r}): shards.json was edited"
    problem = not_regular(path)
    if problem is not None:
        return "is missing" if problem == "not found" else problem
    size = path.stat().st_size
    if size != item.get("size"):
        return f"has {size} bytes, but shards.json says {item.get('size')} (cut short or replaced)"
    return None


def _names(path: Path) -> list[str]:
    if not path.exists():
        raise DataError(f"{path} not found; it is part of a folder {MADE_BY}: copy it too, or {AGAIN}")
    return [line.strip() for line in read_text(path).splitlines() if line.strip()]
