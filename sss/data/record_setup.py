"""`ManifestDataModule` on record layouts: ``data.layout=shards`` (``sss data pack``) and ``data.layout=hf``.

The splits are `sss.data.records.Source` objects read map-style by `SourceDataset` (validation, test, and
``hf`` without streaming: Accelerate splits them as it splits a manifest) or, for training with
``data.streaming=true`` (always for ``shards``), as a `StreamDataset` that splits itself between processes
and workers. Everything else (classes, task, modalities, clip length, messages) is as for manifests.
"""

from __future__ import annotations

import os
import statistics
from typing import Any

from sss.config.errors import ConfigError
from sss.data._decode import DataError
from sss.data.layouts import SPLITS
from sss.data.records import RecordDecoder, Source, SourceDataset
from sss.data.stream import StreamDataset

__all__ = [
    "MIN_INFERRED_CLIP_SECONDS",
    "RECORD_LAYOUTS",
    "check_record_options",
    "median_clip_seconds",
    "record_classes",
    "setup_records",
    "stream_dataset",
]

MIN_INFERRED_CLIP_SECONDS = 0.025
"""The shortest clip length `setup` infers: one analysis window of the log-mel front-end (25 ms).
Typical clips shorter than that hold no usable sound, so the inference would only produce a
0-sample tensor (clips under 5 ms rounded to 0 s) that fails later, inside the model."""

RECORD_LAYOUTS = ("shards", "hf")
"""Layouts whose samples are records (bytes in shards or tables), not files named by a manifest."""


def check_record_options(layout: str, streaming: bool, columns: dict[str, str] | None, cache: str | None) -> None:
    """Refuse options that do not apply to `layout`, naming the key.

    Example:
        >>> check_record_options("manifest", True, None, None)
        Traceback (most recent call last):
        ...
        sss.config.errors.ConfigError: data.streaming=true reads data.layout=hf as a stream ...
    """
    if streaming and layout != "hf":
        raise ConfigError(
            f"data.streaming=true reads data.layout=hf as a stream (data.layout=shards always streams); "
            f"data.layout={layout} is read map-style: remove data.streaming"
        )
    if columns and layout != "hf":
        raise ConfigError(f"data.columns maps the columns of data.layout=hf tables; data.layout={layout} has none")
    if cache is not None and layout in RECORD_LAYOUTS:
        raise ConfigError(
            f"data.cache={cache} stores a manifest's decoded files; data.layout={layout} is read from its "
            "records each epoch: remove data.cache"
        )


def _open(dm: Any, split: str, classes: list[str] | None) -> Source | None:
    skip = dm.skip_log
    if dm.layout == "shards":
        from sss.data.shards import open_shards

        return open_shards(dm.root, split, on_error=dm.on_error, skip_log=skip)
    try:
        import pyarrow  # noqa: F401 - what reads Parquet and Arrow: an optional extra
    except ImportError:
        raise ConfigError(
            "data.layout=hf reads Parquet and Arrow files with pyarrow, which is not installed: "
            "pip install 'shadow-sound-hunter[datasets]'"
        ) from None
    from sss.data.hf import open_hf

    options = {"columns": dm.columns, "streaming": dm.streaming, "on_error": dm.on_error, "skip_log": skip}
    return open_hf(str(dm.root), split, classes=classes, **options)


def record_classes(dm: Any) -> list[str]:
    """The class names of the training split, read from its index or metadata (nothing decoded); [] if unknown."""
    if dm.root is None:
        return []
    try:
        source = _open(dm, "train", None)
    except (DataError, ConfigError, OSError):
        return []  # reported by setup, with the full context
    return list(source.classes) if source is not None else []


def setup_records(dm: Any, stage: str) -> None:
    """`ManifestDataModule.setup` for a record layout: open the splits, infer the clip length, print the summary."""
    sources: dict[str, Source] = {}
    classes: list[str] | None = None
    for split in SPLITS:
        source = _open(dm, split, classes)
        if source is not None:
            sources[split] = source
            classes = classes if classes is not None else list(source.classes)
    if "train" not in sources and stage == "fit":
        raise FileNotFoundError(f"no training split in {dm.root} for data.layout={dm.layout} (needed for stage 'fit')")
    if not sources:
        raise FileNotFoundError(f"no split found in {dm.root} for data.layout={dm.layout}")
    first = next(iter(sources.values()))
    inferred = dm.clip_seconds is None
    if inferred:
        durations = first.durations() if "audio" in first.modalities else []
        dm.clip_seconds = median_clip_seconds(durations, first.where)
    for split, source in sources.items():
        dm.datasets[split] = SourceDataset(
            source, _decoder(dm, source, split == "train"), on_error=dm.on_error, skip_log=dm.skip_log, seed=dm.seed
        )
    dm.classes, dm.event_classes, dm.modalities = list(first.classes), list(first.event_classes), first.modalities
    dm.task = "multilabel" if first.multilabel else ("multiclass" if first.has_label else "segmentation")
    if int(os.environ.get("RANK", "0")) == 0:
        print(dm.describe(inferred), flush=True)


def _decoder(dm: Any, source: Source, train: bool) -> RecordDecoder:
    return RecordDecoder.of(
        source,
        image_size=dm.image_size,
        sample_rate=dm.sample_rate,
        clip_seconds=dm.clip_seconds,
        train=train,
        augment=dm.augment,
        event_frame_rate=dm.event_frame_rate,
        image_norm=dm.image_norm,
    )


def _process() -> tuple[int, int]:
    """(rank, process count) of this run: the Accelerate state once the trainer built it, else the launcher's."""
    from accelerate.state import PartialState, is_initialized

    if is_initialized():
        state = PartialState()
        return state.process_index, state.num_processes
    return int(os.environ.get("RANK", "0")), int(os.environ.get("WORLD_SIZE", "1"))


def stream_dataset(dm: Any) -> StreamDataset:
    """The training split of `dm` as this process's `StreamDataset` (its part of every epoch)."""
    train: SourceDataset = dm.datasets["train"]
    rank, world = _process()
    return StreamDataset(
        train.source,
        train.decoder,
        batch_size=dm.batch_size,
        num_workers=dm.num_workers,
        rank=rank,
        world=world,
        shuffle=True,
        shuffle_buffer=dm.shuffle_buffer,
        seed=dm.seed,
        on_error=dm.on_error,
        skip_log=dm.skip_log,
    )


def median_clip_seconds(durations: list[float], source: str) -> float:
    """The median of the positive `durations`, rounded to 10 ms (1.0 when none); `source` names them in the error.

    Example:
        >>> median_clip_seconds([0.5, 1.004, 2.0, 0.0], "train.csv")
        1.0
    """
    positive = [d for d in durations if d > 0]
    if not positive:
        return 1.0
    median = statistics.median(positive)
    if median < MIN_INFERRED_CLIP_SECONDS:
        raise DataError(
            f"{source}: cannot infer the clip length: the median duration of {len(positive)} audio file(s) "
            f"is {median * 1000:.1f} ms, shorter than one {MIN_INFERRED_CLIP_SECONDS * 1000:g} ms analysis window; "
            "set data.clip_seconds to the length every clip should be padded or cropped to (e.g. "
            "data.clip_seconds=1.0), or check the files (a wrong sample rate in their headers?)"
        )
    return round(median, 2)
