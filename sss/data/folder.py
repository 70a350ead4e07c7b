"""`ManifestDataModule`: train/val/test loaders over a dataset folder (a manifest or a public layout).

The rows, decoding and the bad-input policy live in `sss.data.manifest` (`ManifestDataset`); this
module finds the splits, infers classes, task, modalities and clip length, attaches the feature
cache and builds the loaders.
"""

from __future__ import annotations

import os
import tempfile
import uuid
from pathlib import Path
from typing import Any, Literal

import soundfile as sf
import torch
from torch.utils.data import DataLoader

from sss.config.constraints import NonNegativeInt, PositiveFloat, PositiveInt
from sss.config.errors import ConfigError, workers_only
from sss.data._decode import IMAGENET, DataError, ImageNorm
from sss.data._paths import RootRule, not_regular
from sss.data.datamodule import DataModule
from sss.data.layouts import LAYOUTS, SPLITS, SplitRows, read_split
from sss.data.manifest import ON_ERROR, ManifestDataset, SkipLog, _default_classes, collate, unlabelled_rows
from sss.data.record_setup import (
    MIN_INFERRED_CLIP_SECONDS,
    RECORD_LAYOUTS,
    check_record_options,
    median_clip_seconds,
    record_classes,
    setup_records,
    stream_dataset,
)

__all__ = ["MIN_INFERRED_CLIP_SECONDS", "ManifestDataModule", "loader_options", "median_clip_seconds"]


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
        layout: ``manifest`` (our CSV/JSONL), ``esc50``, ``urbansound8k``, ``desed``, ``istd`` or ``sbu``;
            ``shards`` (tar shards written by ``sss data pack``, read as a stream) or ``hf`` (a Hugging Face
            ``save_to_disk`` folder, Parquet files in the Hub's layout, or a dataset id in the local cache).
        fold: ESC-50 / UrbanSound8K held-out fold used as validation (default 5 / 10).
        batch_size: Samples per batch.
        num_workers: DataLoader worker processes (0 decodes in the main process).
        pin_memory: Page-locked batches, which copy to a GPU while it computes (the trainer copies with
            ``non_blocking=True``); ``"auto"``: on when the batches go to a CUDA device (`loader_options`).
        persistent_workers: Keep workers alive between epochs (forking them again costs seconds);
            None: on when ``num_workers > 0``. Only with workers: true with ``num_workers=0`` is an error.
        prefetch_factor: Batches each worker prepares ahead; None: torch's default (2). Only with
            workers: set with ``num_workers=0`` is an error.
        image_size: Side of the square image (and mask) tensors.
        sample_rate: Audio rate in Hz; must equal the model's front-end rate.
        clip_seconds: Audio clip length; None: the median duration of up to 64 training files (setup
            refuses to infer less than `MIN_INFERRED_CLIP_SECONDS`: set it then).
        augment: Random-resized-crop and horizontal flip of images (and masks) in training.
        event_frame_rate: Frames per second of ``"events"`` targets (the models resample in time).
        n_mels: Mel bins of cached features (``cache="features"``); must equal the model's ``n_mels``.
        cache: None (decode every epoch) or ``"features"``: log-mel and resized images computed
            once into memory-mapped files (``"audio"`` is then ``[B, 1, n_mels, T]``).
        cache_dir: Where feature caches live; None: ``$SSS_CACHE`` or ``~/.cache/sss``.
        on_error: ``"raise"`` (one error naming the row, the file and the fix) or ``"skip"``
            (the row is left out, counted in `skipped`, and written by `write_skipped`).
        allow_outside_root: Accept manifest paths that leave ``root`` (absolute, through ``..`` or a symbolic link),
            and ``classes.txt``, manifests, event tables and metadata that are symbolic links out of it.
        seed: Seed of the training shuffle.
        streaming: ``layout=hf``: read the training split as a stream (``shards`` always streams; see
            `sss.data.stream`), each process and worker its own part, resumable without reading what came before.
        shuffle_buffer: Samples per shuffle window of a stream.
        columns: ``layout=hf``: sss name -> column, e.g. ``{audio: wav, label: category}`` (default: by the
            columns' feature types and names).
        labels: ``"required"``: every manifest has a ``label`` (or ``labels``) column and every row a label.
            ``"optional"`` (pretraining on image-audio pairs): a split without a label column, or with empty
            ``label`` cells, is read as unlabelled (no ``"label"`` in its batches; setup says so); a split with
            labels keeps them (a labelled val split feeds a linear probe). With an unlabelled train split
            `classes` is empty, and the labelled splits' classes come from ``classes.txt``, else their own labels.

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
        layout: Literal["manifest", "esc50", "urbansound8k", "desed", "istd", "sbu", "shards", "hf"] = "manifest",
        fold: PositiveInt | None = None,
        batch_size: PositiveInt = 32,
        num_workers: NonNegativeInt = 0,
        pin_memory: bool | Literal["auto"] = "auto",
        persistent_workers: bool | None = None,
        prefetch_factor: PositiveInt | None = None,
        image_size: PositiveInt = 64,
        sample_rate: PositiveInt = 16000,
        clip_seconds: PositiveFloat | None = None,
        augment: bool = True,
        event_frame_rate: PositiveFloat = 100.0,
        n_mels: PositiveInt = 64,
        cache: Literal["features"] | None = None,
        cache_dir: str | None = None,
        on_error: Literal["raise", "skip"] = "raise",
        allow_outside_root: bool = False,
        seed: NonNegativeInt = 0,
        streaming: bool = False,
        shuffle_buffer: PositiveInt = 512,
        columns: dict[str, str] | None = None,
        labels: Literal["required", "optional"] = "required",
    ) -> None:
        super().__init__()
        if layout not in (*LAYOUTS, *RECORD_LAYOUTS):
            raise ValueError(f"data.layout must be one of {', '.join((*LAYOUTS, *RECORD_LAYOUTS))}, got {layout!r}")
        check_record_options(layout, streaming, columns, cache)
        if on_error not in ON_ERROR:
            raise ValueError(f"data.on_error must be one of {', '.join(ON_ERROR)}, got {on_error!r}")
        if labels not in ("required", "optional"):
            raise ValueError(f"data.labels must be 'required' or 'optional', got {labels!r}")
        if cache not in (None, "features"):
            raise ValueError(f"data.cache must be null or 'features', got {cache!r}")
        loader_options(num_workers, pin_memory, persistent_workers, prefetch_factor, device="cpu")  # checks them
        self.root = Path(root) if root is not None else None
        self.layout, self.fold = layout, fold
        self.batch_size, self.num_workers, self.seed = batch_size, num_workers, seed
        self.pin_memory, self.persistent_workers, self.prefetch_factor = pin_memory, persistent_workers, prefetch_factor
        self.image_size, self.sample_rate, self.clip_seconds = image_size, sample_rate, clip_seconds
        self.augment, self.event_frame_rate, self.n_mels = augment, event_frame_rate, n_mels
        self.cache, self.cache_dir = cache, cache_dir
        self.on_error, self.allow_outside_root, self.labels = on_error, allow_outside_root, labels
        self.streaming, self.shuffle_buffer, self.columns = streaming or layout == "shards", shuffle_buffer, columns
        self.image_norm = IMAGENET  # a pretrained image encoder's own: `use_model_preprocessing`
        self.datasets: dict[str, ManifestDataset] = {}
        self.event_classes: list[str] = []
        self.modalities: tuple[str, ...] = ()
        self.task = ""
        # One log for every split, process and worker (see SkipLog).
        self.skip_log = SkipLog(Path(tempfile.gettempdir()) / f"sss-skipped-{os.getpid()}-{uuid.uuid4().hex[:8]}.csv")
        self.classes = self._early_classes()

    def _early_classes(self) -> list[str]:
        """The classes before setup, read cheaply (one manifest, no file checks): the run sizes the model's head."""
        if self.layout in RECORD_LAYOUTS:
            return record_classes(self)  # the index or the table's metadata: cheap, as below
        if self.root is None or not self.root.is_dir():
            return []
        try:
            found = read_split(self.layout, self.root, "train", self.fold, allow_outside_root=self.allow_outside_root)
            if found is None or (self.labels == "optional" and unlabelled_rows(found)):
                return []  # data.labels=optional and an unlabelled train split: no class count for a head
            return _default_classes(self.root, found, self.allow_outside_root)
        except DataError:
            return []  # reported by setup, with the full context

    @staticmethod
    def config_problems(**arguments: object) -> list[str]:
        """What `sss check` refuses in these arguments together (the record layouts' options), before any data is read.

        Example:
            >>> ManifestDataModule.config_problems(layout="manifest", streaming=True, columns=None, cache=None)
            ['data.streaming=true reads data.layout=hf as a stream (data.layout=shards always streams); ...']
        """
        try:
            check_record_options(*(arguments.get(k) for k in ("layout", "streaming", "columns", "cache")))
        except ConfigError as err:
            return [str(err)]
        return []

    def setup(self, stage: str) -> None:
        """Read and check the splits present (``train`` is required for ``"fit"``), infer settings, print them."""
        if self.root is None:
            raise DataError(
                "data.root is not set: pass the dataset folder, e.g. sss fit examples/manifest.yaml data.root=PATH"
            )
        if self.datasets:
            return
        if self.layout in RECORD_LAYOUTS:
            return setup_records(self, stage)
        first = self._read("train")
        if first is None and stage == "fit":
            raise FileNotFoundError(f"manifest not found: {self.root / 'train.csv'} (needed for stage 'fit')")
        inferred = self.clip_seconds is None
        if self.clip_seconds is None:
            self.clip_seconds = _infer_clip_seconds(self.root, first, self.allow_outside_root) if first else 1.0
        classes = _default_classes(self.root, first, self.allow_outside_root) if first else (self.classes or None)
        event_classes, labelled_before = None, False
        for split in SPLITS:
            if self._read(split) is None:
                continue
            dataset = self._dataset(split, classes, event_classes)
            event_classes = dataset.event_classes
            if dataset.has_label or self.labels == "required":
                classes, labelled_before = dataset.classes, labelled_before or dataset.has_label
            elif not labelled_before and not (self.root / "classes.txt").exists():
                classes = None  # an unlabelled split's stray labels name nothing: the next labelled split's own do
            self.datasets[split] = dataset
        if not self.datasets:
            raise FileNotFoundError(f"no split found in {self.root} for layout {self.layout!r}")
        any_set = next(iter(self.datasets.values()))
        labelled = next((d for d in self.datasets.values() if d.has_label), any_set)
        self.event_classes, self.modalities = event_classes or [], any_set.modalities
        # An unlabelled train split gives no classes, so that no classifier head is sized from it.
        self.classes = list(classes or []) if any_set.has_label or any_set.split != "train" else []
        self.task = "multilabel" if labelled.multilabel else ("multiclass" if labelled.has_label else "segmentation")
        if not labelled.has_label and not any(d.has_mask for d in self.datasets.values()):
            self.task = "unlabelled"
        if self.cache == "features":
            from sss.data.cache import attach_feature_cache

            for dataset in self.datasets.values():
                attach_feature_cache(dataset, self.cache_dir, self.n_mels, self.num_workers)
        if int(os.environ.get("RANK", "0")) == 0:
            print(self.describe(inferred), flush=True)

    def _read(self, split: str) -> SplitRows | None:
        assert self.root is not None
        return read_split(self.layout, self.root, split, self.fold, allow_outside_root=self.allow_outside_root)

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
            labels_optional=self.labels == "optional",
            seed=self.seed,
            image_norm=self.image_norm,
        )

    def use_model_preprocessing(self, prep: dict[str, Any]) -> None:
        """Decode images as the model's weights expect: `prep` is ``module.preprocessing()`` (called after building).

        ``image_mean`` / ``image_std`` / ``image_interpolation`` replace the ImageNet defaults for every split
        (a feature cache already attached is re-keyed, and rebuilt once when its resize filter changes); an
        ``image_size`` in `prep` is a size the weights take and no other (a ViT's fixed position table), which
        ``data.image_size`` must equal. An empty `prep` (random init) changes nothing.

        Raises:
            ConfigError: ``data.image_size`` differs from the weights' fixed input size.

        Example:
            >>> dm = ManifestDataModule(image_size=64)
            >>> dm.use_model_preprocessing({"image_mean": [0.5] * 3, "image_std": [0.5] * 3})
            >>> dm.image_norm.mean
            (0.5, 0.5, 0.5)
            >>> dm.use_model_preprocessing({"image_size": 224, "image_weights": "timm:vit_tiny_patch16_224"})
            Traceback (most recent call last):
            ...
            sss.config.errors.ConfigError: data.image_size=64, but the image encoder's weights ...
        """
        fixed = prep.get("image_size")
        if fixed is not None and fixed != self.image_size and self.modalities != ("audio",):
            source = prep.get("image_weights") or "the image encoder's"
            square = f"set data.image_size={fixed}, or " if isinstance(fixed, int) else ""  # the data is square
            raise ConfigError(
                f"data.image_size={self.image_size}, but the image encoder's weights ({source}) take a fixed input "
                f"size of {fixed} (a position table for one patch grid): {square}set "
                f"model.image_kwargs.img_size={self.image_size} to have timm resample the table as it loads the weights"
            )
        try:
            norm = ImageNorm.of(prep)
        except ValueError as err:
            raise ConfigError(
                f"the image encoder's preprocessing (its weights' pretrained config): {err}; correct the "
                "pretrained_cfg block of the config.json beside the weights file"
            ) from None
        self.image_norm = norm
        for dataset in self.datasets.values():
            if dataset.image_norm == norm:
                continue
            dataset.image_norm = norm
            if dataset.cache is not None:
                from sss.data.cache import attach_feature_cache

                attach_feature_cache(dataset, self.cache_dir, self.n_mels, self.num_workers)

    def describe(self, inferred: bool = False) -> str:
        """One line: root, layout, classes, task, modalities, clip length, rows per split."""
        extras = (["mask"] if any(d.has_mask for d in self.datasets.values()) else []) + (
            [f"events ({len(self.event_classes)} at {self.event_frame_rate:g} frames/s)"] if self.event_classes else []
        )
        for modality, column in (("image", "images"), ("audio", "audio")):  # rows lacking one (two-modality data)
            lacking = sum(
                not path for d in self.datasets.values() if getattr(d, "both", False) for path in getattr(d, column)
            )
            extras += [f"{lacking} row(s) without {modality}"] if lacking else []
        for split, dataset in self.datasets.items():  # data.labels=optional: the splits read without labels
            if getattr(dataset, "labels_optional", False) and not dataset.has_label:  # the record layouts' have none
                count = f" ({dataset.unlabelled_rows} row(s) without a label)" if dataset.label_column else ""
                extras += [f"{split} unlabelled{count}"]
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
        """Shuffled batches of the training split (a stream splits itself between processes: `sss.data.stream`)."""
        if "train" not in self.datasets:
            raise RuntimeError(f"{type(self).__name__}.train_dataloader() needs setup('fit') first")
        if self.streaming:
            return self._loader(stream_dataset(self), shuffle=False)  # the stream shuffles itself
        return self._loader(self.datasets["train"], shuffle=True)

    def val_dataloader(self) -> DataLoader[Any] | None:
        """Batches of the validation split in file order, or None without one."""
        return self._loader(self.datasets["val"], shuffle=False) if "val" in self.datasets else None

    def test_dataloader(self) -> DataLoader[Any] | None:
        """Batches of the test split in file order, or None without one."""
        return self._loader(self.datasets["test"], shuffle=False) if "test" in self.datasets else None

    def _loader(self, dataset: Any, shuffle: bool) -> DataLoader[Any]:
        options = loader_options(self.num_workers, self.pin_memory, self.persistent_workers, self.prefetch_factor)
        return DataLoader(
            dataset,
            batch_size=self.batch_size,
            shuffle=shuffle,
            drop_last=False,
            collate_fn=collate,
            generator=torch.Generator().manual_seed(self.seed),
            **options,
        )


def loader_options(
    num_workers: int,
    pin_memory: bool | str = "auto",
    persistent_workers: bool | None = None,
    prefetch_factor: int | None = None,
    device: str | None = None,
) -> dict[str, Any]:
    """The `DataLoader` keywords of the data keys ``num_workers``, ``pin_memory``, ``persistent_workers`` and more.

    The keys: ``num_workers``, ``pin_memory``, ``persistent_workers`` and ``prefetch_factor``.

    ``pin_memory="auto"`` pins when the batches go to a CUDA device: `device` (``"cuda"``,
    ``"cpu"``, ...) when given, else the device of the trainer's Accelerator when one exists
    (``trainer.cpu=true`` on a GPU machine: no pinning), else whether CUDA is available. Pinned
    batches let the trainer's ``non_blocking`` copy overlap the GPU's work; on the CPU pinning only
    costs a copy. ``persistent_workers`` None means on with workers; ``prefetch_factor`` None means
    torch's default. Both only apply to worker processes: setting them with ``num_workers=0`` is a
    `ConfigError` naming the key (torch would refuse ``prefetch_factor`` and ignore the other).

    Example:
        >>> loader_options(2, device="cuda")
        {'num_workers': 2, 'pin_memory': True, 'persistent_workers': True, 'prefetch_factor': None}
        >>> loader_options(0, device="cpu")
        {'num_workers': 0, 'pin_memory': False, 'persistent_workers': False, 'prefetch_factor': None}
        >>> loader_options(0, prefetch_factor=4)  # doctest: +ELLIPSIS
        Traceback (most recent call last):
        ...
        sss.config.errors.ConfigError: data.prefetch_factor=4 applies to worker processes only, ...
    """
    if pin_memory not in (True, False, "auto"):
        raise ConfigError(f"data.pin_memory must be true, false or 'auto', got {pin_memory!r}")
    for key, value in (("persistent_workers", persistent_workers), ("prefetch_factor", prefetch_factor)):
        if num_workers == 0 and value not in (None, False):
            raise ConfigError(workers_only(key, value))
    if pin_memory == "auto":
        pin_memory = (device or _batch_device()) == "cuda"
    return {
        "num_workers": num_workers,
        "pin_memory": pin_memory,
        "persistent_workers": num_workers > 0 if persistent_workers is None else persistent_workers,
        "prefetch_factor": prefetch_factor,
    }


def _batch_device() -> str:
    # The trainer builds its Accelerator before it asks for loaders; its device is where batches go.
    from accelerate.state import PartialState, is_initialized

    if is_initialized():
        return PartialState().device.type
    return "cuda" if torch.cuda.is_available() else "cpu"


def _infer_clip_seconds(root: Path, found: SplitRows, allow_outside_root: bool = False) -> float:
    """The median duration of up to 64 evenly spaced training clips, rounded to 10 ms (1.0 without audio).

    Only files the rows may use are opened (inside ``root``, regular: a FIFO would block ``sf.info``);
    the others are reported when their row is checked.

    Raises:
        DataError: The median is below `MIN_INFERRED_CLIP_SECONDS`; the message says to set ``data.clip_seconds``.
    """
    paths = [row.get("audio") for _, row in found.rows if row.get("audio")]
    step = max(len(paths) // 64, 1)
    durations = []
    rule = RootRule(root, allow_outside_root)
    for value in paths[::step][:64]:
        full = rule.resolve(str(value))
        if isinstance(full, DataError) or not_regular(full) is not None:
            continue
        try:
            info = sf.info(full)
            durations.append(info.frames / info.samplerate)
        except (RuntimeError, OSError, ValueError, ZeroDivisionError):
            continue  # bad files are reported when their row is checked or loaded
    return median_clip_seconds(durations, found.source)
