"""Readers that turn a dataset folder into manifest rows: our own CSV/JSONL manifests and the public layouts.

Every reader returns the same thing, so checking, decoding, error messages and the skip policy
are shared: `SplitRows` (the file the rows came from, and per row its line number and a dict
with ``image`` / ``audio`` / ``mask`` paths relative to the root, ``label`` or ``labels``, and
``events``, the path of a DCASE strong-label table). Layouts (each dataset's own published folder layout):

=================  ==============================================================  ===========
layout             what it reads (ROOT = the folder given as ``root``)              modalities
=================  ==============================================================  ===========
``manifest``       ``ROOT/{train,val,test}.csv`` or ``.jsonl``                      from columns
``esc50``          ``ROOT/meta/esc50.csv`` + ``ROOT/audio/*.wav`` (ESC-50-master)     audio
``urbansound8k``   ``ROOT/metadata/UrbanSound8K.csv`` + ``ROOT/audio/fold*/``        audio
``desed``          ``ROOT/metadata/{split}.tsv`` (strong) + ``ROOT/audio/{split}/``  audio + events
``istd``           ``ROOT/{train,test}/{train,test}_{A,B}/*.png`` (ISTD_Dataset)     image + mask
``sbu``            ``ROOT/SBUTrain4KRecoveredSmall``, ``ROOT/SBU-Test`` (SBU-shadow)  image + mask
=================  ==============================================================  ===========
"""

from __future__ import annotations

import csv
import io
import json
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from sss.data._decode import DataError, read_event_table, read_text, repeated
from sss.data._paths import RootRule

__all__ = ["LAYOUTS", "SplitRows", "read_split"]

LAYOUTS = ("manifest", "esc50", "urbansound8k", "desed", "istd", "sbu")
"""Values accepted by ``ManifestDataModule(layout=...)``."""

SPLITS = ("train", "val", "test")


@dataclass
class SplitRows:
    """The rows of one split, before checking: where they came from and ``(line, fields)`` per row.

    Example:
        >>> SplitRows("train.csv", [(2, {"audio": "a.wav", "label": "dog"})]).rows[0][1]["label"]
        'dog'
    """

    source: str
    """The file the rows come from (manifest, metadata CSV, or folder), named in every message."""
    rows: list[tuple[int, dict[str, Any]]]
    """Line number in ``source`` (the header is line 1) and the row's fields."""
    classes: list[str] | None = None
    """The layout's own class order (e.g. ESC-50's target ids), or None to use ``classes.txt`` / sorted labels."""
    columns: list[str] = field(default_factory=list)
    """Columns of the source, for messages."""


def read_split(
    layout: str, root: Path, split: str, fold: int | None = None, *, allow_outside_root: bool = False
) -> SplitRows | None:
    """The rows of ``split`` in ``root`` read with ``layout``; None when the layout has no such split.

    The files read here (manifest, metadata CSV, event table) obey `sss.data._paths.RootRule`:
    regular files inside ``root`` after following symbolic links.

    Args:
        layout: One of `LAYOUTS`.
        root: Dataset folder.
        split: ``"train"``, ``"val"`` or ``"test"``.
        fold: ESC-50 / UrbanSound8K: the held-out fold (validation); the others train.
        allow_outside_root: Follow symbolic links that lead out of ``root`` (``data.allow_outside_root``).

    Returns:
        The rows, or None.

    Raises:
        DataError: The layout's files are missing, malformed, not regular files or linked from outside
            ``root`` (the message names the file).

    Example:
        >>> import tempfile
        >>> with tempfile.TemporaryDirectory() as tmp:
        ...     _ = (Path(tmp) / "train.csv").write_text("audio,label\\nx.wav,dog\\n")
        ...     read_split("manifest", Path(tmp), "train").rows
        [(2, {'audio': 'x.wav', 'label': 'dog'})]
    """
    if layout not in LAYOUTS:
        raise DataError(f"unknown data layout {layout!r}; choose one of {', '.join(LAYOUTS)}")
    if not root.is_dir():
        raise DataError(f"data root {root} is not a folder ({'missing' if not root.exists() else 'a file'})")
    reader = {
        "manifest": _manifest,
        "esc50": _esc50,
        "urbansound8k": _urbansound8k,
        "desed": _desed,
        "istd": _istd,
        "sbu": _sbu,
    }[layout]
    return reader(RootRule(root, allow_outside_root), split, fold)


# --- our manifests --------------------------------------------------------------------------------------------


def _manifest(rule: RootRule, split: str, fold: int | None) -> SplitRows | None:
    root = rule.root
    # exists(), not is_file(): a FIFO or a folder named train.csv is refused by the rule, not taken for "no split".
    found = [root / f"{split}{suffix}" for suffix in (".csv", ".jsonl") if (root / f"{split}{suffix}").exists()]
    if len(found) > 1:
        raise DataError(f"{root}: both {split}.csv and {split}.jsonl exist; keep one")
    if not found:
        return None
    path = Path(rule.check(found[0]))
    return _read_jsonl(path) if path.suffix == ".jsonl" else _read_csv(path)


def _read_csv(path: Path, delimiter: str = ",") -> SplitRows:
    text = read_text(path)
    reader = csv.reader(io.StringIO(text, newline=""), delimiter=delimiter)
    header = [name.strip() for name in next(reader, [])]
    if not header or header == [""]:
        raise DataError(f"{path}: empty manifest (no header, no rows); write a header such as image,audio,label")
    if (twice := repeated(header)) is not None:  # the last of two equal columns would win without a word
        raise DataError(f"{path}: column {twice!r} appears twice in the header ({','.join(header)}); keep one")
    rows = []
    line = reader.line_num
    for values in reader:
        first, line = line + 1, reader.line_num
        if not values or all(not v.strip() for v in values):
            continue  # blank lines are allowed (and still counted in line numbers)
        if len(values) != len(header):
            # Short rows would silently get None fields; name them instead.
            rows.append((first, {"__error__": f"has {len(values)} fields but the header has {len(header)}"}))
            continue
        rows.append((first, {name: value.strip() for name, value in zip(header, values, strict=True)}))
    return SplitRows(str(path), rows, columns=header)


def _read_jsonl(path: Path) -> SplitRows:
    rows, columns = [], []
    for number, line in enumerate(read_text(path).splitlines(), start=1):
        if not line.strip():
            continue
        try:
            value = json.loads(line, object_pairs_hook=_unique_keys)
        except json.JSONDecodeError as err:
            rows.append((number, {"__error__": f"is not valid JSON ({err.msg} at column {err.colno})"}))
            continue
        except _DuplicateKey as err:
            rows.append((number, {"__error__": f"has the key {err.key!r} twice; keep one"}))
            continue
        if not isinstance(value, dict):
            rows.append((number, {"__error__": f"is a JSON {type(value).__name__}, not an object"}))
            continue
        columns += [key for key in value if key not in columns]
        rows.append((number, value))
    if not rows:
        raise DataError(f"{path}: empty manifest (no rows); write one JSON object per line")
    return SplitRows(str(path), rows, columns=columns)


class _DuplicateKey(Exception):
    def __init__(self, key: str) -> None:
        super().__init__(key)
        self.key = key


def _unique_keys(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    """``json.loads``'s object hook that refuses a repeated key (json keeps the last one without a word)."""
    out: dict[str, Any] = {}
    for key, value in pairs:
        if key in out:
            raise _DuplicateKey(key)
        out[key] = value
    return out


# --- audio classification layouts -----------------------------------------------------------------------------


def _read_metadata(rule: RootRule, path: Path, required: tuple[str, ...]) -> list[tuple[int, dict[str, str]]]:
    if not path.exists():
        raise DataError(f"{path} not found: is root the dataset's top folder?")
    table = _read_csv(Path(rule.check(path)))
    missing = [c for c in required if c not in table.columns]
    if missing:
        raise DataError(f"{path}: missing column(s) {', '.join(missing)}; is this the original metadata file?")
    return table.rows


def _fold_split(rows: list[tuple[int, dict[str, str]]], split: str, fold: int, path: Path) -> list[Any]:
    if split == "test":
        return []  # cross-validation: the held-out fold is the validation split; there is no separate test set
    keep = []
    for line, row in rows:
        try:
            in_fold = int(row["fold"]) == fold
        except ValueError:
            raise DataError(f"{path}, line {line}: fold must be an integer, got {row['fold']!r}") from None
        if in_fold == (split == "val"):
            keep.append((line, row))
    return keep


def _classes_by_id(rows: list[tuple[int, dict[str, str]]], id_column: str, name_column: str) -> list[str]:
    # Class order = the dataset's own class ids, so label indices match published results.
    by_id = {int(row[id_column]): row[name_column] for _, row in rows if row.get(id_column, "").isdigit()}
    return [by_id[k] for k in sorted(by_id)]


def _esc50(rule: RootRule, split: str, fold: int | None) -> SplitRows | None:
    fold = 5 if fold is None else fold
    path = rule.root / "meta" / "esc50.csv"
    rows = _read_metadata(rule, path, ("filename", "fold", "target", "category"))
    classes = _classes_by_id(rows, "target", "category")
    kept = [(line, {"audio": f"audio/{row['filename']}", "label": row["category"]}) for line, row in rows]
    chosen = {line for line, _ in _fold_split(rows, split, fold, path)}
    out = [(line, row) for line, row in kept if line in chosen]
    return SplitRows(str(path), out, classes) if out else None


def _urbansound8k(rule: RootRule, split: str, fold: int | None) -> SplitRows | None:
    fold = 10 if fold is None else fold
    path = rule.root / "metadata" / "UrbanSound8K.csv"
    rows = _read_metadata(rule, path, ("slice_file_name", "fold", "classID", "class"))
    classes = _classes_by_id(rows, "classID", "class")
    chosen = _fold_split(rows, split, fold, path)
    out = [
        (line, {"audio": f"audio/fold{row['fold']}/{row['slice_file_name']}", "label": row["class"]})
        for line, row in chosen
    ]
    return SplitRows(str(path), out, classes) if out else None


def _desed(rule: RootRule, split: str, fold: int | None) -> SplitRows | None:
    root = rule.root
    # The file list comes from the audio folder, not the table: DCASE leaves clips without events out of it.
    names = {"train": ("train",), "val": ("val", "validation"), "test": ("test", "eval")}[split]
    for name in names:
        table, audio = root / "metadata" / f"{name}.tsv", root / "audio" / name
        if table.exists() and audio.is_dir():
            break
    else:
        return None
    # Malformed lines are charged to their clip's row when the rows are checked, not to the whole split.
    events = read_event_table(rule.check(table)).events
    classes = sorted({e.label for rows in events.values() for e in rows})
    files = sorted(p.name for p in audio.iterdir() if p.suffix.lower() in (".wav", ".flac", ".ogg", ".mp3"))
    rel_table = os.path.relpath(table, root)
    rows = [
        (
            i,
            {
                "audio": f"audio/{name}/{file}",
                "labels": sorted({e.label for e in events.get(file, [])}),
                "events": rel_table,
            },
        )
        for i, file in enumerate(files, start=1)
    ]
    return SplitRows(str(audio), rows, classes) if rows else None


# --- shadow layouts (image + mask) ----------------------------------------------------------------------------


def _pairs(root: Path, images: Path, masks: Path, mask_suffix: str | None) -> SplitRows | None:
    if not images.is_dir():
        return None
    if not masks.is_dir():
        raise DataError(f"{images} has no mask folder {masks}; is the download complete?")
    files = sorted(p for p in images.iterdir() if p.suffix.lower() in (".png", ".jpg", ".jpeg", ".bmp"))
    rows = []
    for i, image in enumerate(files, start=1):
        mask = masks / (image.stem + mask_suffix if mask_suffix else image.name)
        rows.append((i, {"image": str(image.relative_to(root)), "mask": str(mask.relative_to(root))}))
    return SplitRows(str(images), rows, []) if rows else None


def _istd(rule: RootRule, split: str, fold: int | None) -> SplitRows | None:
    root = rule.root
    # ISTD has train and test only; the test set doubles as validation, as in the shadow-detection literature.
    part = "train" if split == "train" else "test"
    return _pairs(root, root / part / f"{part}_A", root / part / f"{part}_B", None)


def _sbu(rule: RootRule, split: str, fold: int | None) -> SplitRows | None:
    root = rule.root
    part = root / ("SBUTrain4KRecoveredSmall" if split == "train" else "SBU-Test")
    return _pairs(root, part / "ShadowImages", part / "ShadowMasks", ".png")
