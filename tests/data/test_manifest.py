"""ManifestDataset / ManifestDataModule: decoding, resampling, crop/pad, errors, loaders."""

from __future__ import annotations

import pickle
from pathlib import Path

import numpy as np
import pytest
import soundfile as sf
import torch
from PIL import Image
from torch.utils.data import DataLoader

from sss.data import DataError, DataModule, ManifestDataModule, ManifestDataset
from sss.data.manifest import IMAGENET_MEAN, IMAGENET_STD, load_audio


def write_folder(root: Path, rows: list[tuple[str, str, str]], classes: list[str] | None = ("a", "b")) -> Path:
    """A manifest folder: a white RGB image, a 1-s 16 kHz sine, ``train.csv`` with ``rows``, ``classes.txt``."""
    root.mkdir(parents=True, exist_ok=True)
    Image.new("RGB", (64, 64), "white").save(root / "white.png")
    sf.write(root / "tone.wav", 0.5 * np.sin(2 * np.pi * 440 * np.arange(16000) / 16000), 16000, subtype="PCM_16")
    if classes is not None:
        (root / "classes.txt").write_text("\n".join(classes) + "\n")
    # The id column keeps repeated rows distinct (an exact duplicate row is an error).
    lines = ["image,audio,label,id"] + [",".join(row) + f",{i}" for i, row in enumerate(rows)]
    (root / "train.csv").write_text("\n".join(lines) + "\n")
    return root


def test_item_shapes_dtypes_and_normalisation(tmp_path: Path) -> None:
    root = write_folder(tmp_path, [("white.png", "tone.wav", "b"), ("white.png", "tone.wav", "a")])
    dataset = ManifestDataset(root, "train")
    item = dataset[0]
    assert set(item) == {"image", "audio", "label", "index"}  # complete rows: no presence flags
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
    wave, _ = load_audio(tmp_path / "stereo.wav", 16000, 16000)
    assert wave.shape == (1, 16000)
    spectrum = torch.fft.rfft(wave[0]).abs()
    assert spectrum.argmax().item() == 440  # 1-s clip: bin k is k Hz
    assert wave.abs().max().item() == pytest.approx(0.5, abs=0.02)  # mono = mean of the channels


def test_crop_and_pad(tmp_path: Path) -> None:
    ramp = np.arange(32000, dtype=np.float32) / 32000  # value encodes position: crops are checkable
    sf.write(tmp_path / "long.wav", ramp, 16000, subtype="FLOAT")
    sf.write(tmp_path / "short.wav", np.full(4000, 0.25, dtype=np.float32), 16000, subtype="FLOAT")
    centre, start = load_audio(tmp_path / "long.wav", 16000, 16000)
    assert start == 8000
    torch.testing.assert_close(centre[0], torch.from_numpy(ramp[8000:24000]))
    starts = set()
    for _ in range(20):
        crop, start = load_audio(tmp_path / "long.wav", 16000, 16000, train=True)
        crop = crop[0]
        assert start == round(crop[0].item() * 32000)
        torch.testing.assert_close(crop, torch.from_numpy(ramp[start : start + 16000]))
        starts.add(start)
    assert len(starts) > 1  # random, not always the centre
    padded = load_audio(tmp_path / "short.wav", 16000, 16000)[0][0]
    assert padded.shape == (16000,) and torch.all(padded[:4000] == 0.25) and torch.all(padded[4000:] == 0)


def test_missing_file_names_manifest_line_and_path(tmp_path: Path) -> None:
    root = write_folder(tmp_path, [("white.png", "tone.wav", "a"), ("white.png", "gone.wav", "a")])
    with pytest.raises(DataError) as info:
        ManifestDataset(root, "train")  # checked when the manifest is read, before any training
    message = str(info.value)
    assert str(root / "train.csv") in message and "line 3" in message
    assert "audio file not found" in message and str(root / "gone.wav") in message


def test_corrupt_file_is_reported_with_its_line(tmp_path: Path) -> None:
    root = write_folder(tmp_path, [("tone.wav", "tone.wav", "a")])  # a WAV where the image should be
    with pytest.raises(DataError, match=r"train\.csv, line 2: image file .*tone\.wav is not an image"):
        ManifestDataset(root, "train")[0]


def test_unknown_label(tmp_path: Path) -> None:
    root = write_folder(tmp_path, [("white.png", "tone.wav", "a"), ("white.png", "tone.wav", "zebra")])
    with pytest.raises(DataError, match=r"train\.csv, line 3: unknown label 'zebra' \(classes: a, b\)"):
        ManifestDataset(root, "train")


def test_missing_column(tmp_path: Path) -> None:
    root = write_folder(tmp_path, [])
    (root / "train.csv").write_text("image,audio,lab\nwhite.png,tone.wav,a\n")
    with pytest.raises(DataError, match=r"train\.csv: missing column label .* the header has image, audio, lab"):
        ManifestDataset(root, "train")


def test_missing_manifest(tmp_path: Path) -> None:
    root = write_folder(tmp_path, [])
    with pytest.raises(FileNotFoundError, match=r"manifest not found: .*val\.csv \(or \.jsonl\)"):
        ManifestDataset(root, "val")


def test_classes_default_to_sorted_train_labels(tmp_path: Path) -> None:
    rows = [("white.png", "tone.wav", "cat"), ("white.png", "tone.wav", "ant"), ("white.png", "tone.wav", "cat")]
    dataset = ManifestDataset(write_folder(tmp_path, rows, classes=None), "train")
    assert dataset.classes == ["ant", "cat"] and dataset.targets == [1, 0, 1]


def test_datamodule_loaders(tmp_path: Path) -> None:
    rows = [("white.png", "tone.wav", "ab"[i % 2]) for i in range(10)]
    root = write_folder(tmp_path, rows)
    (root / "val.csv").write_text((root / "train.csv").read_text())
    dm = ManifestDataModule(str(root), batch_size=4, image_size=32, clip_seconds=0.5, seed=3)
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
    again = ManifestDataModule(str(root), batch_size=4, image_size=32, clip_seconds=0.5, seed=3)
    again.setup("fit")
    assert torch.cat([b["index"] for b in again.train_dataloader()]).tolist() == order  # seeded shuffle
    assert torch.cat([b["index"] for b in dm.val_dataloader()]).tolist() == list(range(10))
    assert dm.test_dataloader() is None
    assert torch.cat([b["index"] for b in dm.predict_dataloader()]).tolist() == list(range(10))  # val, no test


def test_datamodule_works_with_worker_processes(tmp_path: Path) -> None:
    root = write_folder(tmp_path, [("white.png", "tone.wav", "a")] * 4)
    dm = ManifestDataModule(str(root), batch_size=2, num_workers=2)
    dm.setup("fit")
    loader = dm.train_dataloader()
    pickle.dumps(loader.dataset)
    assert sum(len(b["label"]) for b in loader) == 4


def test_datamodule_errors(tmp_path: Path) -> None:
    dm = ManifestDataModule(str(tmp_path))
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
    with pytest.raises(DataError, match=r"train\.csv, line 4: unknown label 'c'"):
        ManifestDataset(root, "train")


def test_jsonl_multilabel_gives_multi_hot_labels(tmp_path: Path) -> None:
    root = write_folder(tmp_path, [], classes=None)
    (root / "train.csv").unlink()
    lines = ['{"audio": "tone.wav", "labels": ["dog", "cat"]}', "", '{"audio": "tone.wav", "labels": "bird;dog"}']
    (root / "train.jsonl").write_text("\n".join(lines) + "\n")
    dm = ManifestDataModule(str(root), batch_size=2)
    dm.setup("fit")
    batch = next(iter(dm.val_dataloader() or DataLoader(dm.datasets["train"], batch_size=2)))
    assert dm.classes == ["bird", "cat", "dog"] and dm.task == "multilabel" and dm.modalities == ("audio",)
    assert "image" not in batch and "label" not in batch
    assert batch["labels"].tolist() == [[0.0, 1.0, 1.0], [1.0, 0.0, 1.0]] and batch["labels"].dtype == torch.float32
    assert dm.clip_seconds == 1.0  # inferred from the files


def test_both_manifest_kinds_is_an_error(tmp_path: Path) -> None:
    root = write_folder(tmp_path, [("white.png", "tone.wav", "a")])
    (root / "train.jsonl").write_text('{"image": "white.png", "audio": "tone.wav", "label": "a"}\n')
    with pytest.raises(DataError, match=r"both train\.csv and train\.jsonl exist"):
        ManifestDataset(root, "train")


def test_mask_is_cropped_and_flipped_with_its_image(tmp_path: Path) -> None:
    # Left half white in both image and mask: after any crop and flip the two must still agree.
    pixels = np.zeros((48, 64, 3), dtype=np.uint8)
    pixels[:, :32] = 255
    Image.fromarray(pixels).save(tmp_path / "half.png")
    Image.fromarray(pixels[:, :, 0]).resize((128, 96)).save(tmp_path / "half_mask.png")  # another size on purpose
    root = write_folder(tmp_path, [])
    (root / "train.csv").write_text("image,audio,label,mask\n" + "half.png,tone.wav,a,half_mask.png\n")
    dataset = ManifestDataset(root, "train", image_size=32, train=True, augment=True)
    flips = set()
    for epoch in range(12):  # the draws are a function of (seed, epoch, index): vary the epoch
        dataset.set_epoch(epoch)
        item = dataset[0]
        grey = item["image"] * torch.tensor(IMAGENET_STD).view(3, 1, 1) + torch.tensor(IMAGENET_MEAN).view(3, 1, 1)
        torch.testing.assert_close(grey.mean(0), item["mask"][0], atol=0.1, rtol=0)  # resampling at the edge only
        flips.add(item["mask"][0, :, 0].mean().item() < 0.5)
    assert flips == {True, False}  # flipped sometimes, not always
    plain = ManifestDataset(root, "train", image_size=32)[0]["mask"][0]
    assert plain[:, :15].min() == 1.0 and plain[:, 17:].max() == 0.0  # eval: whole image, no flip


def test_event_targets_move_with_the_audio_crop(tmp_path: Path) -> None:
    ramp = np.arange(32000, dtype=np.float32) / 32000
    sf.write(tmp_path / "long.wav", ramp, 16000, subtype="FLOAT")
    (tmp_path / "ev.tsv").write_text("filename\tonset\toffset\tevent_label\nlong.wav\t1.0\t1.2\tknock\n")
    root = write_folder(tmp_path, [])
    (root / "train.csv").write_text("audio,label,events\nlong.wav,a,ev.tsv\n")
    centre = ManifestDataset(root, "train")[0]
    assert centre["events"].shape == (100, 1)
    assert torch.nonzero(centre["events"][:, 0]).flatten().tolist() == list(range(50, 70))  # crop starts at 0.5 s
    dataset = ManifestDataset(root, "train", train=True)
    for _ in range(10):
        item = dataset[0]
        start = round(item["audio"][0, 0].item() * 2, 2)  # seconds, from the ramp value
        frames = torch.nonzero(item["events"][:, 0]).flatten()
        if len(frames):
            assert abs(frames[0].item() / 100 - max(1.0 - start, 0)) <= 0.011


def test_paths_outside_the_root_are_refused_unless_allowed(tmp_path: Path) -> None:
    root = write_folder(tmp_path / "ds", [])
    write_folder(tmp_path / "elsewhere", [])
    (root / "train.csv").write_text(f"image,audio,label\n../elsewhere/white.png,{tmp_path}/elsewhere/tone.wav,a\n")
    with pytest.raises(
        DataError, match=r"line 2: path '../elsewhere/white.png' leaves the dataset folder.*allow_outside_root"
    ):
        ManifestDataset(root, "train")
    assert ManifestDataset(root, "train", allow_outside_root=True)[0]["image"].shape == (3, 64, 64)


def test_worker_errors_keep_the_message(tmp_path: Path) -> None:
    root = write_folder(tmp_path, [("white.png", "tone.wav", "a"), ("white.png", "bad.wav", "a")])
    (root / "bad.wav").write_bytes(b"RIFF\x00\x00garbage")
    dm = ManifestDataModule(str(root), batch_size=1, num_workers=1, persistent_workers=False)
    dm.setup("fit")
    with pytest.raises(
        DataError, match=r"train\.csv, line 3: audio file .*bad\.wav cannot be decoded as audio"
    ) as info:
        list(dm.val_dataloader() or DataLoader(dm.datasets["train"], batch_size=1, num_workers=1))
    # One clean line, as raised in the worker; the worker's traceback is kept aside.
    assert str(info.value).startswith(str(root / "train.csv")) and "\n" not in str(info.value)
    assert "DataLoader worker" in info.value.worker_traceback


def test_loader_settings_are_passed_through(tmp_path: Path) -> None:
    root = write_folder(tmp_path, [("white.png", "tone.wav", "a")] * 3)
    dm = ManifestDataModule(str(root), batch_size=2, num_workers=1, pin_memory=True, prefetch_factor=3)
    dm.setup("fit")
    loader = dm.train_dataloader()
    assert type(loader) is DataLoader and loader.pin_memory and loader.persistent_workers
    assert loader.prefetch_factor == 3 and loader.num_workers == 1
