"""Manifest datasets: a folder of CSV files listing ``image,audio,label`` rows, decoded to tensors.

Layout (paths in the CSV are relative to the folder, absolute paths also work)::

    ROOT/classes.txt   one class name per line; fixes label indices (else: sorted labels of train.csv)
    ROOT/train.csv     header image,audio,label (extra columns are ignored)
    ROOT/val.csv       optional
    ROOT/test.csv      optional
"""

from __future__ import annotations

import csv
import os
from pathlib import Path
from typing import Any

import numpy as np
import soundfile as sf
import torch
from PIL import Image
from torch import Tensor
from torch.utils.data import DataLoader, Dataset

from sss.data.datamodule import DataModule

__all__ = ["ManifestDataModule", "ManifestDataset", "load_audio", "load_image"]

REQUIRED_COLUMNS = ("image", "audio", "label")
IMAGENET_MEAN = (0.485, 0.456, 0.406)
IMAGENET_STD = (0.229, 0.224, 0.225)
# (x / 255 - mean) / std folded into one multiply-add per pixel.
_SCALE = torch.tensor([1 / (255 * s) for s in IMAGENET_STD]).view(3, 1, 1)
_SHIFT = torch.tensor([-m / s for m, s in zip(IMAGENET_MEAN, IMAGENET_STD, strict=True)]).view(3, 1, 1)


def load_image(path: str | os.PathLike[str], size: int) -> Tensor:
    """Read an image of any mode and size as a normalised float tensor ``[3, size, size]``.

    Converted to RGB, resized (bilinear) when needed, scaled to [0, 1] and normalised with the
    ImageNet mean and std.

    Example:
        >>> import tempfile
        >>> from PIL import Image
        >>> with tempfile.TemporaryDirectory() as tmp:
        ...     Image.new("L", (40, 30), color=255).save(f"{tmp}/white.png")
        ...     image = load_image(f"{tmp}/white.png", 64)
        >>> image.shape, round(image[0, 0, 0].item(), 3)
        (torch.Size([3, 64, 64]), 2.249)
    """
    with Image.open(path) as img:
        rgb = img.convert("RGB")
    if rgb.size != (size, size):
        rgb = rgb.resize((size, size), Image.Resampling.BILINEAR)
    pixels = torch.from_numpy(np.asarray(rgb, dtype=np.float32)).permute(2, 0, 1).contiguous()
    return pixels.mul_(_SCALE).add_(_SHIFT)


def load_audio(path: str | os.PathLike[str], sample_rate: int, num_samples: int, *, train: bool = False) -> Tensor:
    """Read a sound file as a mono float waveform ``[1, num_samples]`` at ``sample_rate``.

    Any channel count (averaged to mono) and any rate (resampled with
    `torchaudio.functional.resample`). Longer clips are cropped (centre crop, or a random crop
    when ``train``), shorter ones are zero-padded at the end. Decoding uses ``soundfile``
    (libsndfile: WAV, FLAC, OGG, MP3), never FFmpeg.

    Example:
        >>> import tempfile
        >>> import numpy as np
        >>> import soundfile as sf
        >>> with tempfile.TemporaryDirectory() as tmp:
        ...     sf.write(f"{tmp}/stereo.wav", np.zeros((22050, 2)), 44100)
        ...     load_audio(f"{tmp}/stereo.wav", 16000, 16000).shape
        torch.Size([1, 16000])
    """
    data, rate = sf.read(path, dtype="float32", always_2d=True)  # [frames, channels]
    wave = torch.from_numpy(data[:, 0] if data.shape[1] == 1 else data.mean(axis=1))[None]
    if rate != sample_rate:
        import torchaudio.functional  # imported here: only needed for mismatched rates, and slow to import

        wave = torchaudio.functional.resample(wave, rate, sample_rate)
    return _fit_length(wave, num_samples, train)


def _fit_length(wave: Tensor, num_samples: int, train: bool) -> Tensor:
    """Crop ``[C, S]`` to ``num_samples`` (centre, or random when ``train``) or zero-pad at the end."""
    length = wave.shape[-1]
    if length > num_samples:
        # The crop is cloned so a worker does not ship the whole clip's storage back to the main process.
        start = int(torch.randint(length - num_samples + 1, ())) if train else (length - num_samples) // 2
        return wave[..., start : start + num_samples].clone()
    if length < num_samples:
        return torch.nn.functional.pad(wave, (0, num_samples - length))
    return wave


def _read_rows(manifest: Path) -> tuple[list[dict[str, str]], list[int]]:
    """The rows of a CSV manifest and the line each starts on; checks the required columns."""
    if not manifest.is_file():
        raise FileNotFoundError(f"manifest not found: {manifest}")
    with open(manifest, newline="", encoding="utf-8-sig") as handle:  # -sig: tolerate a spreadsheet's BOM
        reader = csv.DictReader(handle)
        header = reader.fieldnames or []
        missing = [name for name in REQUIRED_COLUMNS if name not in header]
        if missing:
            raise ValueError(
                f"{manifest}: missing column(s) {', '.join(missing)}; the header has {', '.join(header) or 'nothing'} "
                f"and must have {', '.join(REQUIRED_COLUMNS)}"
            )
        rows, lines = [], []
        for row in reader:
            rows.append(row)
            lines.append(reader.line_num)  # the row's (last) line; blank lines are skipped but counted
    return rows, lines


def _read_classes(root: Path) -> list[str]:
    """Class names from ``classes.txt``, else the sorted labels of ``train.csv``."""
    path = root / "classes.txt"
    if not path.is_file():
        return sorted({row["label"] for row in _read_rows(root / "train.csv")[0]})
    classes = [line.strip() for line in path.read_text(encoding="utf-8-sig").splitlines() if line.strip()]
    duplicates = sorted({name for name in classes if classes.count(name) > 1})
    if duplicates:
        raise ValueError(f"{path}: duplicate class name(s) {', '.join(duplicates)}")
    return classes


class ManifestDataset(Dataset[dict[str, Any]]):
    """The rows of ``ROOT/{split}.csv`` as dicts of tensors, decoded on access.

    An item is ``{"image": float [3, S, S], "audio": float [1, N], "label": long [], "index": int}``
    with ``S = image_size`` and ``N = round(sample_rate * clip_seconds)`` (see `load_image` and
    `load_audio`). The manifest is read and checked (columns, labels) at construction; a missing
    or unreadable file is reported when its row is loaded, with the manifest line and the path.

    Args:
        root: The dataset folder.
        split: Manifest name without ``.csv`` (``"train"``, ``"val"``, ``"test"``).
        image_size: Side of the square image tensor.
        sample_rate: Rate to resample the audio to.
        clip_seconds: Length of the audio tensor.
        train: Random audio crops instead of centre crops.

    Example:
        >>> import tempfile
        >>> from sss.data.synthetic import make_industrial
        >>> with tempfile.TemporaryDirectory() as tmp:
        ...     root = make_industrial(f"{tmp}/industrial", n_train=8, n_val=4, n_test=0)
        ...     item = ManifestDataset(root, "val")[0]
        >>> item["image"].shape, item["audio"].shape, item["label"].dtype, item["index"]
        (torch.Size([3, 64, 64]), torch.Size([1, 16000]), torch.int64, 0)
    """

    def __init__(
        self,
        root: str | os.PathLike[str],
        split: str,
        *,
        image_size: int = 64,
        sample_rate: int = 16000,
        clip_seconds: float = 1.0,
        train: bool = False,
    ) -> None:
        self.root = Path(root)
        self.manifest = self.root / f"{split}.csv"
        self.classes = _read_classes(self.root)
        rows, self.lines = _read_rows(self.manifest)
        index = {name: i for i, name in enumerate(self.classes)}
        for row, line in zip(rows, self.lines, strict=True):
            if row["label"] not in index:
                shown = ", ".join(self.classes[:10]) + (", ..." if len(self.classes) > 10 else "")
                raise ValueError(f"{self.manifest}, line {line}: unknown label {row['label']!r} (classes: {shown})")
        # Plain lists of str/int: cheap to pickle into DataLoader workers.
        self.images = [str(self.root / row["image"]) for row in rows]
        self.audio = [str(self.root / row["audio"]) for row in rows]
        self.labels = [index[row["label"]] for row in rows]
        self.image_size, self.sample_rate, self.train = image_size, sample_rate, train
        self.num_samples = round(sample_rate * clip_seconds)

    def __len__(self) -> int:
        return len(self.labels)

    def __getitem__(self, index: int) -> dict[str, Any]:
        image = self._decode(index, "image", self.images[index])
        audio = self._decode(index, "audio", self.audio[index])
        return {"image": image, "audio": audio, "label": torch.tensor(self.labels[index]), "index": index}

    def _decode(self, index: int, kind: str, path: str) -> Tensor:
        """Decode one file of row ``index``; errors name the manifest line, the column and the path."""
        try:
            if kind == "image":
                return load_image(path, self.image_size)
            return load_audio(path, self.sample_rate, self.num_samples, train=self.train)
        except Exception as err:
            where = f"{self.manifest}, line {self.lines[index]}"
            if not os.path.isfile(path):
                raise FileNotFoundError(f"{where}: {kind} file not found: {path}") from None
            raise RuntimeError(f"{where}: cannot decode {kind} file {path}: {err}") from err


class ManifestDataModule(DataModule):
    """Train / val / test loaders over a manifest folder (see `ManifestDataset`).

    ``val.csv`` and ``test.csv`` are optional: their loaders are None when the file is absent.
    The train loader shuffles with a generator seeded by ``seed`` (so the order is reproducible)
    and keeps the last partial batch. Batches are dicts of stacked tensors: ``image`` [B, 3, S, S],
    ``audio`` [B, 1, N], ``label`` [B], ``index`` [B].

    Args:
        root: The dataset folder.
        batch_size: Samples per batch.
        num_workers: DataLoader worker processes (0 decodes in the main process).
        image_size: Side of the square image tensor.
        sample_rate: Rate to resample the audio to.
        clip_seconds: Length of the audio tensor.
        seed: Seed of the training shuffle (and of the workers' random crops).

    Example:
        >>> import tempfile
        >>> from sss.data.synthetic import make_industrial
        >>> with tempfile.TemporaryDirectory() as tmp:
        ...     dm = ManifestDataModule(make_industrial(f"{tmp}/ind", n_train=8, n_val=4, n_test=0), batch_size=4)
        ...     dm.setup("fit")
        ...     batch = next(iter(dm.train_dataloader()))
        >>> dm.classes, dm.test_dataloader()
        (['idle', 'fault', 'passerby', 'collision'], None)
        >>> {key: tuple(value.shape) for key, value in batch.items()}
        {'image': (4, 3, 64, 64), 'audio': (4, 1, 16000), 'label': (4,), 'index': (4,)}
    """

    datasets: dict[str, ManifestDataset]
    """The splits `setup` found, by name (``"train"``, ``"val"``, ``"test"``)."""

    def __init__(
        self,
        root: str | os.PathLike[str],
        *,
        batch_size: int = 32,
        num_workers: int = 0,
        image_size: int = 64,
        sample_rate: int = 16000,
        clip_seconds: float = 1.0,
        seed: int = 0,
    ) -> None:
        super().__init__()
        self.root = Path(root)
        self.batch_size, self.num_workers, self.seed = batch_size, num_workers, seed
        self.image_size, self.sample_rate, self.clip_seconds = image_size, sample_rate, clip_seconds
        self.datasets: dict[str, ManifestDataset] = {}
        if (self.root / "classes.txt").is_file():  # cheap, and lets a config read num_classes before setup
            self.classes = _read_classes(self.root)

    def setup(self, stage: str) -> None:
        """Read the manifests present (``train.csv`` is required for ``"fit"``) and the class list."""
        if stage == "fit" and not (self.root / "train.csv").is_file():
            raise FileNotFoundError(f"manifest not found: {self.root / 'train.csv'} (needed for stage 'fit')")
        for split in ("train", "val", "test"):
            if split not in self.datasets and (self.root / f"{split}.csv").is_file():
                self.datasets[split] = ManifestDataset(
                    self.root,
                    split,
                    image_size=self.image_size,
                    sample_rate=self.sample_rate,
                    clip_seconds=self.clip_seconds,
                    train=split == "train",
                )
                self.classes = self.datasets[split].classes

    def train_dataloader(self) -> DataLoader[Any]:
        """Shuffled batches of ``train.csv``."""
        if "train" not in self.datasets:
            raise RuntimeError(f"{type(self).__name__}.train_dataloader() needs setup('fit') first")
        return self._loader(self.datasets["train"], shuffle=True)

    def val_dataloader(self) -> DataLoader[Any] | None:
        """Batches of ``val.csv`` in file order, or None without one."""
        return self._loader(self.datasets["val"], shuffle=False) if "val" in self.datasets else None

    def test_dataloader(self) -> DataLoader[Any] | None:
        """Batches of ``test.csv`` in file order, or None without one."""
        return self._loader(self.datasets["test"], shuffle=False) if "test" in self.datasets else None

    def _loader(self, dataset: ManifestDataset, shuffle: bool) -> DataLoader[Any]:
        return DataLoader(
            dataset,
            batch_size=self.batch_size,
            shuffle=shuffle,
            drop_last=False,
            num_workers=self.num_workers,
            persistent_workers=self.num_workers > 0,  # forking workers again every epoch costs seconds
            generator=torch.Generator().manual_seed(self.seed),
        )
