"""Feature cache (``data.cache: features``): log-mel features and resized images computed once, then memory-mapped.

Decoding, resampling and resizing cost far more than reading a few kilobytes from a memory map,
and they give the same answer every epoch (augmentation aside). So the cache stores, per split:

- ``images.npy``: uint8 ``[N, 3, S, S]``, resized (with the dataset's `ImageNorm` filter), not normalised
  (4x smaller than float; the mean and std are applied when reading);
- ``masks.npy``: uint8 ``[N, 1, S, S]`` when the split has masks;
- ``audio.npy``: float32 ``[N, 1, n_mels, T]`` log-mel in dB, computed exactly like
  `sss.models.LogMelFrontend` before its normalisation (power STFT, Hann window, centred
  frames, mel filterbank, ``10 log10(max(x, 1e-10))``), so the model's front-end takes these
  4-D features and skips its own STFT;
- ``meta.json``: shapes, the key's inputs, crop starts, the rows that failed to decode, and the rows that lack
  a modality (two-modality data: their image, mask or audio is stored as zeros; `sss.data.presence`).

The folder name is a hash of the file list (paths, sizes, modification times), of the
front-end settings and of a non-default image normalisation (a pretrained encoder's): touching
a file or changing a setting builds a new cache. A cache is built
in a temporary folder and renamed into place when complete, under an exclusive file lock, so
several processes starting at once build it once and never read a half-written one.

Trade-off, documented: cached audio is the centre crop (no random crop in training) and cached
images are the whole image resized (training augmentation is a horizontal flip only).
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import uuid
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch.utils.data import DataLoader, Dataset

from sss.data._decode import IMAGENET, DataError, file_lock, single_thread

__all__ = ["CACHE_VERSION", "FeatureCache", "LogMel", "attach_feature_cache", "cache_key"]

CACHE_VERSION = 3
"""Bump when what the cache stores changes, so old caches are rebuilt (2: large images box-reduced
before resizing, thin images accepted, the skipped rows' files named exactly; 3: rows without their
image or audio cached as zeros, listed in ``meta.json``'s ``absent``)."""


class LogMel:
    """Waveform ``[1, S]`` to log-mel ``[1, n_mels, T]`` in dB, as `LogMelFrontend` computes before normalising.

    Settings follow ``HunterModule``: 25 ms window (``n_fft = sample_rate // 40``), 10 ms hop,
    50 Hz to ``min(8000, sample_rate / 2)``.

    Example:
        >>> import torch
        >>> LogMel(16000, 64)(torch.zeros(1, 16000)).shape
        torch.Size([1, 64, 101])
    """

    def __init__(self, sample_rate: int, n_mels: int) -> None:
        import torchaudio

        self.settings = {
            "sample_rate": sample_rate,
            "n_fft": sample_rate // 40,
            "hop_length": sample_rate // 100,
            "n_mels": n_mels,
            "f_min": 50.0,
            "f_max": min(8000.0, sample_rate / 2),
        }
        n_fft = self.settings["n_fft"]
        self.stft = torchaudio.transforms.Spectrogram(n_fft=n_fft, hop_length=sample_rate // 100, power=None)
        self.mel = torchaudio.transforms.MelScale(
            n_mels, sample_rate, 50.0, self.settings["f_max"], n_stft=n_fft // 2 + 1
        )
        self.to_db = torchaudio.transforms.AmplitudeToDB(stype="power", top_db=None)

    def __call__(self, wave: torch.Tensor) -> torch.Tensor:
        with torch.no_grad():
            spec = self.stft(wave.float())
            return self.to_db(self.mel(spec.real.square() + spec.imag.square()))


class FeatureCache:
    """The arrays of one built cache folder, memory-mapped on first access (also inside DataLoader workers).

    Example:
        >>> import tempfile
        >>> from sss.data import ManifestDataset, make_industrial
        >>> with tempfile.TemporaryDirectory() as tmp:
        ...     ds = ManifestDataset(make_industrial(f"{tmp}/ind", n_train=4, n_val=0, n_test=0), "train")
        ...     cache = attach_feature_cache(ds, f"{tmp}/cache", n_mels=64, num_workers=0)
        ...     shapes = cache.images.shape, cache.audio.shape, ds[0]["audio"].shape
        >>> shapes
        ((4, 3, 64, 64), (4, 1, 64, 101), torch.Size([1, 64, 101]))
    """

    def __init__(self, folder: Path) -> None:
        self.folder = folder
        meta = json.loads((folder / "meta.json").read_text())
        self.starts: list[int] = meta["starts"]
        self.bad: list[list[Any]] = meta["bad"]
        """``[row index, file, reason]`` of the rows that failed to decode when the cache was built."""
        self.absent: dict[str, list[int]] = meta.get("absent", {})
        """Modality -> the rows without it (stored as zeros; the dataset's rows say the same)."""
        self._arrays: dict[str, np.ndarray] = {}

    def _array(self, name: str) -> np.ndarray:
        if name not in self._arrays:
            self._arrays[name] = np.load(self.folder / f"{name}.npy", mmap_mode="r")
        return self._arrays[name]

    @property
    def images(self) -> np.ndarray:
        """uint8 ``[N, 3, S, S]``."""
        return self._array("images")

    @property
    def masks(self) -> np.ndarray:
        """uint8 ``[N, 1, S, S]``."""
        return self._array("masks")

    @property
    def audio(self) -> np.ndarray:
        """float32 ``[N, 1, n_mels, T]``."""
        return self._array("audio")

    def __getstate__(self) -> dict[str, Any]:
        # Workers map the files themselves; a pickled memmap would be copied in full.
        return {**self.__dict__, "_arrays": {}}


def cache_key(dataset: Any, n_mels: int) -> str:
    """Hash of the split's files (path, size, mtime), the front-end settings and the image normalisation.

    Example:
        >>> import tempfile
        >>> from sss.data import ManifestDataset, make_industrial
        >>> with tempfile.TemporaryDirectory() as tmp:
        ...     ds = ManifestDataset(make_industrial(f"{tmp}/ind", n_train=4, n_val=0, n_test=0), "train")
        ...     cache_key(ds, 64) == cache_key(ds, 64) != cache_key(ds, 32)
        True
    """
    files: list[Any] = []
    for column in (dataset.images, dataset.audio, dataset.masks):
        for path in column:
            if not path:  # the row lacks this file: kept in place, so that which rows lack it is keyed too
                files.append(("", 0, 0))
                continue
            stat = os.stat(path)
            files.append((path, stat.st_size, stat.st_mtime_ns))
    settings = {
        "version": CACHE_VERSION,
        "image_size": dataset.image_size,
        "sample_rate": dataset.sample_rate,
        "num_samples": dataset.num_samples,
        "modalities": list(dataset.modalities),
        "mask": dataset.has_mask,
        **_settings(dataset.sample_rate, n_mels),
    }
    norm = getattr(dataset, "image_norm", IMAGENET)
    if norm != IMAGENET:  # only then, so that the caches built before image_norm existed keep their key
        # The resize filter changes the stored pixels; mean/std are applied when reading, but are keyed
        # too, so a cache is never shared across the input preparation of different weights.
        settings["image_norm"] = [list(norm.mean), list(norm.std), norm.interpolation]
    digest = hashlib.sha256(json.dumps([settings, files]).encode())
    return digest.hexdigest()[:16]


def _settings(sample_rate: int, n_mels: int) -> dict[str, Any]:
    return {
        "n_fft": sample_rate // 40,
        "hop": sample_rate // 100,
        "n_mels": n_mels,
        "f_max": min(8000.0, sample_rate / 2),
    }


def attach_feature_cache(
    dataset: Any, cache_dir: str | os.PathLike[str] | None, n_mels: int, num_workers: int
) -> FeatureCache:
    """Build (once) or reuse the feature cache of ``dataset`` and make the dataset read from it.

    Rows that fail to decode while building follow the dataset's ``on_error``: raise, or be
    recorded as skipped and never served.

    Args:
        dataset: A `ManifestDataset`.
        cache_dir: Parent folder of caches; None: ``$SSS_CACHE`` or ``~/.cache/sss``.
        n_mels: Mel bins (the model's ``n_mels``).
        num_workers: Processes that decode while building.

    Returns:
        The attached cache.

    Example:
        >>> import tempfile
        >>> from sss.data import ManifestDataset, make_industrial
        >>> with tempfile.TemporaryDirectory() as tmp:
        ...     ds = ManifestDataset(make_industrial(f"{tmp}/ind", n_train=4, n_val=0, n_test=0), "train")
        ...     first = attach_feature_cache(ds, f"{tmp}/cache", n_mels=32, num_workers=0).folder
        ...     again = attach_feature_cache(ds, f"{tmp}/cache", n_mels=32, num_workers=0).folder  # reused
        ...     first == again, ds[0]["audio"].shape
        (True, torch.Size([1, 32, 101]))
    """
    base = Path(cache_dir) if cache_dir else _default_base()
    base.mkdir(parents=True, exist_ok=True)
    folder = base / f"features-{Path(dataset.source).stem}-{cache_key(dataset, n_mels)}"
    if not (folder / "meta.json").is_file():
        with file_lock(base / f".{folder.name}.lock"):
            if not (folder / "meta.json").is_file():  # another process may have built it while we waited
                _build(dataset, folder, n_mels, num_workers)
    cache = FeatureCache(folder)
    for row, file, reason in cache.bad:  # recorded again: this run's skip log starts empty
        dataset.skip_log.record(dataset.source, dataset.lines[row], file, reason)
    dataset.attach_cache(cache)
    return cache


def _default_base() -> Path:
    return Path(os.environ["SSS_CACHE"]) if os.environ.get("SSS_CACHE") else Path.home() / ".cache" / "sss"


class _Decode(Dataset[tuple[int, Any]]):
    def __init__(self, dataset: Any, n_mels: int) -> None:
        self.dataset, self.n_mels = dataset, n_mels
        self.logmel: LogMel | None = None

    def __len__(self) -> int:
        return len(self.dataset)

    def __getitem__(self, index: int) -> tuple[int, Any]:
        try:
            image, mask, wave, start = self.dataset.decode_for_cache(index)
        except DataError as err:
            if self.dataset.on_error == "raise":
                raise
            return index, err  # pickled with its file and reason, which the skip log lists
        mel = None
        if wave is not None:
            self.logmel = self.logmel or LogMel(self.dataset.sample_rate, self.n_mels)
            mel = self.logmel(wave).numpy()
        return index, (image, None if mask is None else mask.numpy().astype(np.uint8), mel, start)


def _as_list(items: list[Any]) -> list[Any]:
    return items


def _build(dataset: Any, folder: Path, n_mels: int, num_workers: int) -> None:
    from numpy.lib.format import open_memmap

    tmp = folder.parent / f".{folder.name}.tmp-{os.getpid()}-{uuid.uuid4().hex[:8]}"
    tmp.mkdir()
    try:
        n, size = len(dataset), dataset.image_size
        arrays: dict[str, np.ndarray] = {}
        if "image" in dataset.modalities:
            arrays["images"] = open_memmap(tmp / "images.npy", "w+", np.uint8, (n, 3, size, size))
        if dataset.has_mask:
            arrays["masks"] = open_memmap(tmp / "masks.npy", "w+", np.uint8, (n, 1, size, size))
        if "audio" in dataset.modalities:
            frames = dataset.num_samples // (dataset.sample_rate // 100) + 1
            arrays["audio"] = open_memmap(tmp / "audio.npy", "w+", np.float32, (n, 1, n_mels, frames))
        starts, bad = [0] * n, []
        loader = DataLoader(_Decode(dataset, n_mels), batch_size=16, num_workers=num_workers, collate_fn=_as_list)
        with single_thread():  # numpy writes and tiny torch ops: one thread is fastest (see single_thread)
            for batch in loader:
                for index, result in batch:
                    if isinstance(result, DataError):
                        bad.append([index, result.file, result.reason or str(result)])
                        continue
                    image, mask, mel, starts[index] = result
                    for name, value in (("images", image), ("masks", mask), ("audio", mel)):
                        if value is not None:  # None: the row lacks it; the new file's zeros stay
                            arrays[name][index] = value
        for array in arrays.values():
            array.flush()
        del arrays
        meta = {"version": CACHE_VERSION, "rows": n, "n_mels": n_mels, "starts": starts, "bad": sorted(bad)}
        meta["absent"] = {
            name: [i for i, path in enumerate(paths) if not path]
            for name, paths in (("image", dataset.images), ("audio", dataset.audio))
            if name in dataset.modalities
        }
        (tmp / "meta.json").write_text(json.dumps(meta))  # written last: its presence means complete
        os.rename(tmp, folder)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
