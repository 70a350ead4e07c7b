"""Hugging Face datasets as a record `Source` (``data.layout=hf``): saved folders, Hub Parquet, cached ids.

`open_hf` reads one split of

- a ``Dataset.save_to_disk`` / ``DatasetDict.save_to_disk`` folder (Arrow files beside ``state.json``, and
  ``dataset_dict.json`` for a dict): one `Shard` per Arrow file, memory-mapped, never copied;
- a folder of Parquet files in the Hub's layout (``data/train-00000-of-00002.parquet``, also ``train-*.parquet``
  or ``train/*.parquet`` at the top): one `Shard` per row group, counted from the files' footers;
- a dataset id ``owner/name`` already in the local Hub cache (``HF_HUB_CACHE``): its snapshot, read as Parquet.
  Nothing is ever downloaded.

Columns are found by their ``datasets`` feature type (``Image``, ``Audio``, ``ClassLabel``, a list of
``ClassLabel`` for multi-label), else by name; ``data.columns`` names them explicitly. Audio and images are read
as the stored bytes and decoded by sss's soundfile / Pillow path (`RecordDecoder`): ``datasets`` 4+ decodes audio
with torchcodec and FFmpeg, which sss does not need. With both an image and an audio column, an empty cell (None)
is that modality absent from the sample (`sss.data.presence`). Strong labels (event tables) are not supported from
Hugging Face datasets: use a manifest folder or ``sss data pack`` for sound event detection.
"""

from __future__ import annotations

import io
import json
import os
import re
import tempfile
import uuid
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

import soundfile as sf

from sss.data._skiplog import SkipLog
from sss.data.errors import DataError
from sss.data.records import Record, Shard, Source, record_error

if TYPE_CHECKING:
    import pyarrow as pa

__all__ = ["SPLIT_NAMES", "HFSource", "locate", "open_hf"]

SPLIT_NAMES = {"train": ("train",), "val": ("validation", "val", "valid", "dev"), "test": ("test",)}
"""The Hugging Face split names each sss split is read from: the first one present."""
FIELDS = ("image", "audio", "mask", "label", "labels")
"""The keys of ``data.columns``."""
_BY_NAME = {
    "image": ("image", "img", "frame"),
    "audio": ("audio", "sound", "wav"),
    "mask": ("mask",),
    "label": ("label", "labels", "target"),
}
_PARQUET = ("data/{s}-*.parquet", "data/{s}.parquet", "data/{s}/*.parquet", "{s}-*.parquet", "{s}.parquet", "{s}/*")
_REPO_ID = re.compile(r"^[A-Za-z0-9][\w.-]*/[\w.-]+$")
_REDO = "download or export it again"
_EMPTY = "the cell is empty"
_EMBED = "export the dataset with its files embedded (datasets' embed_external_files, as push_to_hub does)"


@dataclass
class HFSource(Source):
    """One split of a Hugging Face dataset: Parquet row groups or memory-mapped Arrow files.

    Build it with `open_hf`. ``columns`` maps ``image`` / ``audio`` / ``mask`` / ``label`` to the table's
    columns; ``label_names`` are the ``ClassLabel`` names the stored integers index (None: the column holds
    the names themselves). Events are not supported (``event_classes`` stays empty).

    The last Parquet row group read is kept (only the used columns), so reading in order reads each once;
    reading single rows in random order (a shuffled `SourceDataset`) reads a row group per sample: shuffled
    training over Parquet belongs to the stream reader. Arrow files are memory-mapped whole.
    """

    kind: str = "parquet"
    """``"parquet"`` (a shard is a row group) or ``"arrow"`` (a shard is a ``save_to_disk`` file)."""
    columns: dict[str, str] = field(default_factory=dict)
    label_names: list[str] | None = None
    streaming: bool = False
    """Whether the run reads this split as a stream (recorded here; both ways read through `read`)."""
    _cache: dict[Any, Any] = field(default_factory=dict, init=False, repr=False, compare=False)

    def __getstate__(self) -> dict[str, Any]:
        # DataLoader workers get the plan, not the tables: a pickled memory map would copy the whole file.
        return {**self.__dict__, "_cache": {}}

    def read(self, shard: int, start: int = 0, stop: int | None = None) -> Iterator[Record | DataError]:
        """Records ``start`` to ``stop`` of shard `shard`: only its row group (Parquet) or slice (Arrow) is read.

        Example:
            >>> import tempfile, pyarrow as pa, pyarrow.parquet as pq
            >>> with tempfile.TemporaryDirectory() as tmp:
            ...     table = pa.table({"audio": [b"RIFF1", None, b"RIFF3"], "label": ["a", "b", "a"]})
            ...     pq.write_table(table, f"{tmp}/train-0.parquet", row_group_size=2)
            ...     source = open_hf(tmp, "train")
            ...     got = list(source.read(0)) + list(source.read(1))
            >>> [s.rows for s in source.shards], source.classes
            ([2, 1], ['a', 'b'])
            >>> got[0].audio, got[0].target, got[2].row, str(got[1]).split("/")[-1]
            (b'RIFF1', 0, 2, 'train-0.parquet, sample 1: has no audio: the cell is empty; set data.on_error=skip ...')
        """
        s = self.shards[shard]
        stop = s.rows if stop is None else min(stop, s.rows)
        table, first = self._part(s)
        part = table.slice(start, max(stop - start, 0))
        cells = {name: part.column(column).to_pylist() for name, column in self.columns.items()}
        lookup = {name: i for i, name in enumerate(self.classes)}
        for i in range(part.num_rows):
            yield self._record(s.path, first + start + i, {name: values[i] for name, values in cells.items()}, lookup)

    def durations(self, limit: int = 64) -> list[float]:
        """Seconds of up to `limit` audio cells, in shard order (clip-length inference); unreadable ones are left out.

        Example:
            >>> import tempfile, pyarrow as pa, pyarrow.parquet as pq
            >>> with tempfile.TemporaryDirectory() as tmp:
            ...     pq.write_table(pa.table({"image": [b"PNG"]}), f"{tmp}/train.parquet")
            ...     open_hf(tmp, "train").durations()
            []
        """
        if "audio" not in self.columns:
            return []
        found: list[float] = []
        for shard in range(len(self.shards)):
            table, _ = self._part(self.shards[shard])
            for cell in table.column(self.columns["audio"]).slice(0, limit - len(found)).to_pylist():
                data, _problem = _cell_bytes(cell)
                try:
                    found.append(sf.info(io.BytesIO(data or b"")).duration)
                except (sf.LibsndfileError, RuntimeError, ValueError, TypeError):
                    continue  # the decoder names a bad cell when it is read; an estimate can do without it
            if len(found) >= limit:
                break
        return found

    def _part(self, shard: Shard) -> tuple[pa.Table, int]:
        """The shard's rows (the used columns only) and the file row of its first one; the last one read is kept."""
        key = (shard.path, shard.part)
        if key not in self._cache:
            if self.kind == "arrow":
                self._cache[key] = (_arrow_table(shard.path).select(list(self.columns.values())), 0)
            else:
                self._cache.clear()  # one row group at a time: sequential readers read each once
                self._cache[key] = _row_group(shard.path, shard.part, list(self.columns.values()))
        return self._cache[key]

    def _record(self, file: str, row: int, cells: dict[str, Any], lookup: dict[str, int]) -> Record | DataError:
        media = {kind: cells[kind] for kind in ("image", "audio", "mask") if kind in cells}
        key = next((os.path.basename(c["path"]) for c in media.values() if isinstance(c, dict) and c.get("path")), "")
        found: dict[str, bytes] = {}
        for kind, cell in media.items():
            data, problem = _cell_bytes(cell)
            if data is None and not (len(self.modalities) == 2 and problem == _EMPTY):
                return record_error(file, row, key, f"has no {kind}: {problem}")
            if data is not None:  # an empty cell of two-modality data: that modality absent (RecordDecoder)
                found[kind] = data
        target: int | tuple[int, ...] | None = None
        if "label" in cells:
            names = self._label_names(cells["label"])
            unknown = [name for name in names if name not in lookup]
            if unknown:
                shown = ", ".join(self.classes[:10]) + (", ..." if len(self.classes) > 10 else "")
                reason = f"unknown label {unknown[0]!r} (classes: {shown}); fix the row or give the class list"
                return record_error(file, row, key, reason)
            indices = tuple(lookup[name] for name in names)
            target = indices if self.multilabel else (indices[0] if indices else None)
        return Record(file, row, key, target=target, **found)

    def _label_names(self, cell: Any) -> list[str]:
        values = cell if isinstance(cell, list) else [] if cell is None else [cell]
        if self.label_names is None:
            return [str(v) for v in values if v is not None]
        # ClassLabel: -1 (and null) is "no label" in datasets; the decoder then says the sample has none
        return [self.label_names[v] for v in values if v is not None and 0 <= v < len(self.label_names)]


def open_hf(
    root: str | os.PathLike[str],
    split: str,
    *,
    columns: Mapping[str, str] | None = None,
    streaming: bool = False,
    on_error: str = "raise",
    skip_log: SkipLog | None = None,
    classes: list[str] | None = None,
) -> HFSource | None:
    """One split of a Hugging Face dataset as a `HFSource`; None when `root` has no such split.

    Args:
        root: A ``save_to_disk`` folder, a folder of Parquet files in the Hub's layout, or a dataset id
            ``owner/name`` in the local Hub cache.
        split: ``"train"``, ``"val"`` (validation / val / valid / dev) or ``"test"``.
        columns: ``data.columns``: sss name (``image``, ``audio``, ``mask``, ``label``, ``labels``) -> column.
        streaming: Recorded in `HFSource.streaming` for the reader that streams.
        on_error: A file that cannot be opened: ``"raise"`` a `DataError`, or ``"skip"``: leave it out, log it.
        skip_log: Where skipped files are logged; None: a temporary file.
        classes: Class names (index = position); None: the ``ClassLabel`` names, else the sorted names of train.

    Example:
        >>> import tempfile, pyarrow as pa, pyarrow.parquet as pq
        >>> with tempfile.TemporaryDirectory() as tmp:
        ...     os.makedirs(f"{tmp}/data")
        ...     table = pa.table({"wav": [b"RIFF"] * 3, "category": ["dog", "cat", "dog"]})
        ...     pq.write_table(table, f"{tmp}/data/validation-00000-of-00001.parquet", row_group_size=2)
        ...     source = open_hf(tmp, "val", columns={"audio": "wav", "label": "category"})
        ...     missing = open_hf(tmp, "test")
        >>> len(source), len(source.shards), source.classes, source.modalities, missing
        (3, 2, ['cat', 'dog'], ('audio',), None)
    """
    if on_error not in ("raise", "skip"):
        raise ValueError(f"on_error must be raise or skip, got {on_error!r}")
    if split not in SPLIT_NAMES:
        raise ValueError(f"split must be one of {', '.join(SPLIT_NAMES)}, got {split!r}")
    where, kind, files = locate(root)
    name = next((n for n in SPLIT_NAMES[split] if files.get(n)), None)
    if name is None:
        return None
    log = skip_log or SkipLog(Path(tempfile.gettempdir()) / f"sss-skipped-{uuid.uuid4().hex}.csv")
    shards, schema = _shards(files[name], kind, on_error, log, f"{where} split {name}")
    features = _features(schema)
    chosen = _choose_columns(features, schema.names, columns or {}, f"{where} split {name}")
    names = _class_label_names(features, chosen.get("label"))
    if classes is None and "label" in chosen:
        names_from = files.get("train") or files[name]  # string labels: sorted names of train, as manifests do
        classes = names or _label_values(names_from, kind, chosen["label"])
    modalities = tuple(m for m in ("image", "audio") if m in chosen)
    return HFSource(
        where, shards, list(classes or []), modalities,
        multilabel="label" in chosen and _is_list(schema.field(chosen["label"]).type),
        has_label="label" in chosen, has_mask="mask" in chosen,
        partial=len(modalities) == 2 and _has_nulls(shards, kind, [chosen[m] for m in modalities]),
        kind=kind, columns=chosen, label_names=names, streaming=streaming,
    )  # fmt: skip


def _has_nulls(shards: list[Shard], kind: str, columns: list[str]) -> bool:
    # Whether a cell of `columns` may be empty, from metadata only: Parquet's per-row-group null counts (a column
    # chunk without them counts as "may"), an Arrow file's validity bitmaps. A struct cell (Image, Audio) is empty
    # when it or its bytes are null; a path-only cell is refused when read.
    import pyarrow as pa
    import pyarrow.compute as pc
    import pyarrow.parquet as pq

    for file in sorted({shard.path for shard in shards}):
        if kind == "arrow":
            table = _arrow_table(file)
            for name in columns:
                column = table.column(name)
                inner = pc.struct_field(column, "bytes") if pa.types.is_struct(column.type) else column
                if column.null_count or inner.null_count:
                    return True
            continue
        meta = pq.ParquetFile(file).metadata
        for group in range(meta.num_row_groups):
            for leaf in range(meta.num_columns):
                chunk = meta.row_group(group).column(leaf)
                if chunk.path_in_schema.split(".")[0] not in columns or chunk.path_in_schema.endswith(".path"):
                    continue
                stats = chunk.statistics
                if stats is None or not stats.has_null_count or stats.null_count:
                    return True
    return False


# --- where the files are ------------------------------------------------------------------------------------


def locate(root: str | os.PathLike[str]) -> tuple[str, str, dict[str, list[str]]]:
    """(where, kind, HF split name -> files) of a saved folder, a Parquet folder or a cached dataset id.

    Reads no data and never downloads; `sss predict` uses it to tell a Hugging Face dataset from other inputs.

    Raises:
        DataError: `root` holds no dataset (the message lists what was looked for), or an id is not cached.

    Example:
        >>> import tempfile, pyarrow as pa, pyarrow.parquet as pq
        >>> with tempfile.TemporaryDirectory() as tmp:
        ...     os.makedirs(f"{tmp}/data")
        ...     pq.write_table(pa.table({"wav": [b"RIFF"]}), f"{tmp}/data/train-00000-of-00001.parquet")
        ...     where, kind, files = locate(tmp)
        ...     kind, {split: [os.path.basename(f) for f in names] for split, names in files.items() if names}
        ('parquet', {'train': ['train-00000-of-00001.parquet']})
    """
    path, text = Path(root), str(root)
    if path.is_dir():
        kind, files = _saved(path) or ("parquet", _parquet_files(path))
        if not any(files.values()):
            raise DataError(
                f"{text}: no Hugging Face dataset here: looked for dataset_dict.json, state.json and Parquet files "
                f"({', '.join(p.format(s='train') for p in _PARQUET)}, the same for validation and test)"
            )
        return text, kind, files
    if not _REPO_ID.match(text) or path.exists():
        raise DataError(
            f"{text}: not a Hugging Face dataset: expected a save_to_disk folder (state.json or dataset_dict.json), "
            "a folder of Parquet files (data/train-*.parquet, ...) or a dataset id owner/name in the local Hub cache"
        )
    snapshot = _cached_snapshot(text)
    files = _parquet_files(snapshot)
    if not any(files.values()):
        raise DataError(f"{text}: its cached snapshot {snapshot} holds no Parquet files (data/train-*.parquet, ...)")
    return text, "parquet", files


def _saved(path: Path) -> tuple[str, dict[str, list[str]]] | None:
    if (path / "dataset_dict.json").is_file():
        splits = _json(path / "dataset_dict.json").get("splits", [])
        return "arrow", {name: _state_files(path / name) for name in splits if (path / name / "state.json").is_file()}
    if (path / "state.json").is_file():  # one Dataset: the split it was saved as, else train
        known = [n for names in SPLIT_NAMES.values() for n in names]
        name = str(_json(path / "state.json").get("_split") or "train")
        return "arrow", {name if name in known else "train": _state_files(path)}
    return None


def _state_files(folder: Path) -> list[str]:
    return [str(folder / entry["filename"]) for entry in _json(folder / "state.json").get("_data_files", [])]


def _json(path: Path) -> dict[str, Any]:
    try:
        found = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError) as err:
        raise DataError(f"{path}: cannot be read as JSON ({err}); save the dataset again (save_to_disk)") from None
    if not isinstance(found, dict):
        raise DataError(f"{path}: expected a JSON object; save the dataset again (save_to_disk)")
    return found


def _parquet_files(folder: Path) -> dict[str, list[str]]:
    """HF split name -> its Parquet files, by the first of the Hub's naming patterns that matches any."""
    found: dict[str, list[str]] = {}
    for name in (n for names in SPLIT_NAMES.values() for n in names):
        for pattern in _PARQUET:
            files = sorted(str(p) for p in folder.glob(pattern.format(s=name)) if p.suffix == ".parquet")
            if files:
                found[name] = files
                break
    return found


def _cached_snapshot(repo_id: str) -> Path:
    """The local snapshot folder of a dataset in the Hub cache (``HF_HUB_CACHE``), never downloading."""
    from huggingface_hub import snapshot_download
    from huggingface_hub.errors import LocalEntryNotFoundError

    cache = os.environ.get("HF_HUB_CACHE") or None  # read now: huggingface_hub reads it once, at import
    try:
        return Path(snapshot_download(repo_id, repo_type="dataset", local_files_only=True, cache_dir=cache))
    except (LocalEntryNotFoundError, FileNotFoundError, ValueError) as err:
        shown = cache or "the default Hub cache"
        raise DataError(
            f"{repo_id}: not a folder, and not in the local Hugging Face cache ({shown}: {type(err).__name__}); "
            f"sss never downloads: run `hf download {repo_id} --repo-type dataset` first, or give the folder"
        ) from None


# --- shards and schema --------------------------------------------------------------------------------------


def _shards(files: list[str], kind: str, on_error: str, log: SkipLog, split: str) -> tuple[list[Shard], pa.Schema]:
    """The shards of `files` from their metadata alone; an unreadable file raises or is left out and logged."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    shards: list[Shard] = []
    schema: pa.Schema | None = None
    for file in files:
        try:
            if kind == "arrow":
                table = _arrow_table(file)
                shards.append(Shard(file, table.num_rows))
                schema = schema or table.schema
                continue
            meta = pq.read_metadata(file)
            shards += [Shard(file, meta.row_group(g).num_rows, g) for g in range(meta.num_row_groups)]
            schema = schema or meta.schema.to_arrow_schema()
        except (OSError, pa.ArrowException) as err:
            what = "Parquet footer" if kind == "parquet" else "Arrow data"
            reason = f"cannot read its {what} ({err}); the file is truncated or damaged: {_REDO}"
            if on_error == "raise":
                raise DataError(f"{file}: {reason}; or set data.on_error=skip to leave the file out") from None
            log.record(file, 0, file, reason)
    if schema is None:
        raise DataError(f"{split}: none of its {len(files)} file(s) could be read; see {log.path}")
    return [s for s in shards if s.rows], schema


def _arrow_table(file: str) -> pa.Table:
    """A ``save_to_disk`` Arrow file (IPC stream, else IPC file format), memory-mapped: nothing is copied."""
    import pyarrow as pa

    source = pa.memory_map(file)
    try:
        return pa.ipc.open_stream(source).read_all()
    except pa.ArrowInvalid:
        source.seek(0)
        return pa.ipc.open_file(source).read_all()


def _row_group(file: str, group: int, columns: list[str]) -> tuple[pa.Table, int]:
    """Row group `group` of a Parquet file (only `columns`) and the file row it starts at."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    try:
        with pq.ParquetFile(file) as handle:
            first = sum(handle.metadata.row_group(g).num_rows for g in range(group))
            return handle.read_row_group(group, columns=columns), first
    except (OSError, pa.ArrowException) as err:
        raise DataError(f"{file}, row group {group}: cannot be read ({err}); {_REDO}") from None


def _features(schema: pa.Schema) -> dict[str, Any]:
    """The ``datasets`` features the schema's metadata declares (empty when it declares none or is unreadable)."""
    try:
        import datasets
    except ImportError:  # without the extra, columns are still found by name
        return {}
    try:
        return dict(datasets.Features.from_arrow_schema(schema))
    except (ValueError, TypeError, KeyError):
        return {}


def _choose_columns(
    features: dict[str, Any], names: list[str], override: Mapping[str, str], where: str
) -> dict[str, str]:
    """sss name (image, audio, mask, label) -> column: `override` first, then the feature types, then the names."""
    bad = [key for key in override if key not in FIELDS]
    if bad:
        raise DataError(f"data.columns.{bad[0]}: not a field sss reads; use {', '.join(FIELDS)}")
    for key, column in override.items():
        if column not in names:
            raise DataError(f"data.columns.{key}: {where} has no column {column!r}; its columns are {', '.join(names)}")
    chosen = {("label" if key == "labels" else key): column for key, column in override.items()}
    types = {name: type(feature).__name__ for name, feature in features.items()}
    inner = {name: type(getattr(f, "feature", None)).__name__ for name, f in features.items()}
    by_type = {
        "mask": [n for n in names if n == "mask"],
        "image": [n for n in names if types.get(n) == "Image" and n != "mask"],
        "audio": [n for n in names if types.get(n) == "Audio"],
        "label": [n for n in names if "ClassLabel" in (types.get(n), inner.get(n))],
    }
    for key, typed in by_type.items():
        named = [n for n in _BY_NAME[key] if n in names]
        pick = next((n for n in typed if n in named), None) or (typed or named or [None])[0]
        if key not in chosen and pick is not None and pick not in chosen.values():
            chosen[key] = pick
    if not {"image", "audio"} & chosen.keys():
        raise DataError(
            f"{where}: no image or audio column (it has {', '.join(names)}); "
            'name them in data.columns, e.g. {"audio": "wav", "label": "category"}'
        )
    return chosen


def _is_list(arrow_type: pa.DataType) -> bool:
    import pyarrow as pa

    return pa.types.is_list(arrow_type) or pa.types.is_large_list(arrow_type) or pa.types.is_fixed_size_list(arrow_type)


def _class_label_names(features: dict[str, Any], column: str | None) -> list[str] | None:
    """The ``ClassLabel`` names of the label column (also inside a list, for multi-label), else None."""
    feature = features.get(column or "")
    for candidate in (feature, getattr(feature, "feature", None)):
        if type(candidate).__name__ == "ClassLabel":
            return list(candidate.names)
    return None


def _label_values(files: list[str], kind: str, column: str) -> list[str]:
    """The sorted distinct label names of a string (or integer) label column, read from that column alone."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    seen: set[str] = set()
    for file in files:
        try:
            table = _arrow_table(file) if kind == "arrow" else pq.read_table(file, columns=[column])
        except (OSError, pa.ArrowException):
            continue  # an unreadable file was refused or logged when the shards were listed
        for value in table.column(column).to_pylist():
            seen.update(str(v) for v in (value if isinstance(value, list) else [value]) if v is not None)
    return sorted(seen)


def _cell_bytes(cell: Any) -> tuple[bytes | None, str]:
    """The bytes of an image / audio / mask cell (a {bytes, path} struct or plain binary), or why there are none."""
    if isinstance(cell, dict):
        if cell.get("bytes"):
            return bytes(cell["bytes"]), ""
        if cell.get("path"):
            return None, f"the cell holds only a path ({cell['path']}), not the bytes; {_EMBED}"
    elif isinstance(cell, (bytes, bytearray)) and cell:
        return bytes(cell), ""
    elif isinstance(cell, str) and cell:
        return None, f"the cell holds only a path ({cell}), not the bytes; {_EMBED}"
    return None, _EMPTY
