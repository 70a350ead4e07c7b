"""ManifestDataset / ManifestDataModule: decoding, resampling, crop/pad, errors, loaders."""

from __future__ import annotations

import pickle
from pathlib import Path

import numpy as np
import pytest
import soundfile as sf
import torch
from PIL import Image

from sss.data import DataModule, ManifestDataModule, ManifestDataset
from sss.data.manifest import IMAGENET_MEAN, IMAGENET_STD, load_audio


def write_folder(root: Path, rows: list[tuple[str, str, str]], classes: list[str] | None = ("a", "b")) -> Path:
    """A manifest folder: a white RGB image, a 1-s 16 kHz sine, ``train.csv`` with ``rows``, ``classes.txt``."""
    root.mkdir(parents=True, exist_ok=True)
    Image.new("RGB", (64, 64), "white").save(root / "white.png")
    sf.write(root / "tone.wav", 0.5 * np.sin(2 * np.pi * 440 * np.arange(16000) / 16000), 16000, subtype="PCM_16")
    if classes is not None:
        (root / "classes.txt").write_text("\n".join(classes) + "\n")
    lines = ["image,audio,label"] + [",".join(row) for row in rows]
    (root / "train.csv").write_text("\n".join(lines) + "\n")
    return root


def test_item_shapes_dtypes_and_normalisation(tmp_path: Path) -> None:
    root = write_folder(tmp_path, [("white.png", "tone.wav", "b"), ("white.png", "tone.wav", "a")])
    dataset = ManifestDataset(root, "train")
    item = dataset[0]
    assert set(item) == {"image", "audio", "label", "index"}
    assert item["image"].shape == (3, 64, 64) and item["image"].dtype == torch.float32
    assert item["audio"].shape == (1, 16000) and item["audio"].dtype == torch.float32
    assert item["label"].dtype == torch.long and item["label"].shape == () and item["label"].item() == 1
    assert item["index"] == 0 and len(dataset) == 2
    expected = [(1 - m) / s for m, s in zip(IMAGENET_MEAN, IMAGENET_STD, strict=True)]
    torch.testing.assert_close(item["image"][:, 5, 7], torch.tensor(expected))
    assert item["audio"].abs().max().item() == pytest.approx(0.5, abs=1e-3)


def test_any_image_mode_and_size_becomes_rgb_square(tmp_path: Path) -> None:
    Image.new("L", (100, 50), 128).save(tmp_path / "grey.png")
    Image.new("RGBA", (30, 30), (255, 0, 0, 10)).save(tmp_path / "rgba.png")
    root = write_folder(tmp_path, [("grey.png", "tone.wav", "a"), ("rgba.png", "tone.wav", "a")])
    dataset = ManifestDataset(root, "train", image_size=32)
    assert dataset[0]["image"].shape == dataset[1]["image"].shape == (3, 32, 32)
    red = dataset[1]["image"][:, 0, 0] * torch.tensor(IMAGENET_STD) + torch.tensor(IMAGENET_MEAN)
    torch.testing.assert_close(red, torch.tensor([1.0, 0.0, 0.0]), atol=1e-6, rtol=0)


def test_stereo_44k_is_downmixed_and_resampled(tmp_path: Path) -> None:
    t = np.arange(44100) / 44100
    left, right = np.sin(2 * np.pi * 440 * t), np.zeros_like(t)
    sf.write(tmp_path / "stereo.wav", np.stack([left, right], axis=1), 44100, subtype="PCM_16")
    wave = load_audio(tmp_path / "stereo.wav", 16000, 16000)
    assert wave.shape == (1, 16000)
    spectrum = torch.fft.rfft(wave[0]).abs()
    assert spectrum.argmax().item() == 440  # 1-s clip: bin k is k Hz
    assert wave.abs().max().item() == pytest.approx(0.5, abs=0.02)  # mono = mean of the channels


def test_crop_and_pad(tmp_path: Path) -> None:
    ramp = np.arange(32000, dtype=np.float32) / 32000  # value encodes position: crops are checkable
    sf.write(tmp_path / "long.wav", ramp, 16000, subtype="FLOAT")
    sf.write(tmp_path / "short.wav", np.full(4000, 0.25, dtype=np.float32), 16000, subtype="FLOAT")
    centre = load_audio(tmp_path / "long.wav", 16000, 16000)
    torch.testing.assert_close(centre[0], torch.from_numpy(ramp[8000:24000]))
    starts = set()
    for _ in range(20):
        crop = load_audio(tmp_path / "long.wav", 16000, 16000, train=True)[0]
        start = round(crop[0].item() * 32000)
        torch.testing.assert_close(crop, torch.from_numpy(ramp[start : start + 16000]))
        starts.add(start)
    assert len(starts) > 1  # random, not always the centre
    padded = load_audio(tmp_path / "short.wav", 16000, 16000)[0]
    assert padded.shape == (16000,) and torch.all(padded[:4000] == 0.25) and torch.all(padded[4000:] == 0)


def test_missing_file_names_manifest_line_and_path(tmp_path: Path) -> None:
    root = write_folder(tmp_path, [("white.png", "tone.wav", "a"), ("white.png", "gone.wav", "a")])
    dataset = ManifestDataset(root, "train")
    with pytest.raises(FileNotFoundError) as info:
        dataset[1]
    message = str(info.value)
    assert str(root / "train.csv") in message and "line 3" in message
    assert "audio file not found" in message and str(root / "gone.wav") in message


def test_corrupt_file_is_reported_with_its_line(tmp_path: Path) -> None:
    root = write_folder(tmp_path, [("tone.wav", "tone.wav", "a")])  # a WAV where the image should be
    with pytest.raises(RuntimeError, match=r"train\.csv, line 2: cannot decode image file .*tone\.wav"):
        ManifestDataset(root, "train")[0]


def test_unknown_label(tmp_path: Path) -> None:
    root = write_folder(tmp_path, [("white.png", "tone.wav", "a"), ("white.png", "tone.wav", "zebra")])
    with pytest.raises(ValueError, match=r"train\.csv, line 3: unknown label 'zebra' \(classes: a, b\)"):
        ManifestDataset(root, "train")


def test_missing_column(tmp_path: Path) -> None:
    root = write_folder(tmp_path, [])
    (root / "train.csv").write_text("image,sound,label\nwhite.png,tone.wav,a\n")
    with pytest.raises(ValueError, match=r"train\.csv: missing column\(s\) audio; the header has image, sound, label"):
        ManifestDataset(root, "train")


def test_missing_manifest(tmp_path: Path) -> None:
    root = write_folder(tmp_path, [])
    with pytest.raises(FileNotFoundError, match=r"manifest not found: .*val\.csv"):
        ManifestDataset(root, "val")


def test_classes_default_to_sorted_train_labels(tmp_path: Path) -> None:
    rows = [("white.png", "tone.wav", "cat"), ("white.png", "tone.wav", "ant"), ("white.png", "tone.wav", "cat")]
    dataset = ManifestDataset(write_folder(tmp_path, rows, classes=None), "train")
    assert dataset.classes == ["ant", "cat"] and dataset.labels == [1, 0, 1]


def test_datamodule_loaders(tmp_path: Path) -> None:
    rows = [("white.png", "tone.wav", "ab"[i % 2]) for i in range(10)]
    root = write_folder(tmp_path, rows)
    (root / "val.csv").write_text((root / "train.csv").read_text())
    dm = ManifestDataModule(root, batch_size=4, image_size=32, clip_seconds=0.5, seed=3)
    assert dm.num_classes == 2  # classes.txt is read at construction
    dm.setup("fit")
    assert dm.classes == ["a", "b"] and dm.num_classes == 2
    batches = list(dm.train_dataloader())
    assert [len(b["label"]) for b in batches] == [4, 4, 2]  # drop_last=False
    batch = batches[0]
    assert batch["image"].shape == (4, 3, 32, 32) and batch["audio"].shape == (4, 1, 8000)
    assert batch["label"].dtype == torch.long and batch["index"].dtype == torch.long
    order = torch.cat([b["index"] for b in batches]).tolist()
    assert sorted(order) == list(range(10)) and order != list(range(10))
    again = ManifestDataModule(root, batch_size=4, image_size=32, clip_seconds=0.5, seed=3)
    again.setup("fit")
    assert torch.cat([b["index"] for b in again.train_dataloader()]).tolist() == order  # seeded shuffle
    assert torch.cat([b["index"] for b in dm.val_dataloader()]).tolist() == list(range(10))
    assert dm.test_dataloader() is None and dm.predict_dataloader() is None


def test_datamodule_works_with_worker_processes(tmp_path: Path) -> None:
    root = write_folder(tmp_path, [("white.png", "tone.wav", "a")] * 4)
    dm = ManifestDataModule(root, batch_size=2, num_workers=2)
    dm.setup("fit")
    loader = dm.train_dataloader()
    pickle.dumps(loader.dataset)
    assert sum(len(b["label"]) for b in loader) == 4


def test_datamodule_errors(tmp_path: Path) -> None:
    dm = ManifestDataModule(tmp_path)
    with pytest.raises(RuntimeError, match=r"needs setup\('fit'\) first"):
        dm.train_dataloader()
    with pytest.raises(FileNotFoundError, match=r"train\.csv"):
        dm.setup("fit")


def test_base_datamodule_defaults() -> None:
    dm = DataModule()
    dm.setup("fit")
    assert dm.classes == [] and dm.num_classes == 0
    assert dm.val_dataloader() is None and dm.test_dataloader() is None and dm.predict_dataloader() is None
    with pytest.raises(NotImplementedError, match="DataModule must implement train_dataloader"):
        dm.train_dataloader()


def test_error_line_counts_blank_lines_and_a_bom(tmp_path: Path) -> None:
    root = write_folder(tmp_path, [])
    (root / "train.csv").write_text("\ufeffimage,audio,label\n\nwhite.png,tone.wav,a\nwhite.png,tone.wav,c\n")
    with pytest.raises(ValueError, match=r"train\.csv, line 4: unknown label 'c'"):
        ManifestDataset(root, "train")
