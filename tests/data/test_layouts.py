"""Importers for the public layouts, each on a tiny fixture written in that layout."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import soundfile as sf
import torch
from PIL import Image

from sss.data import DataError, ManifestDataModule


def tone(path: Path, seconds: float, rate: int = 44100, channels: int = 1) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    t = np.arange(int(seconds * rate)) / rate
    wave = 0.3 * np.sin(2 * np.pi * 330 * t)
    sf.write(path, np.stack([wave] * channels, 1) if channels > 1 else wave, rate, subtype="PCM_16")


def setup(dm: ManifestDataModule, stage: str = "fit") -> dict[str, torch.Tensor]:
    dm.setup(stage)
    return next(iter(dm.train_dataloader()))


def test_esc50(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    root = tmp_path / "ESC-50-master"
    rows = ["filename,fold,target,category,esc10,src_file,take"]
    # target ids deliberately not in alphabetical order of the category names
    for fold in (1, 2, 5):
        for target, category in ((0, "dog"), (1, "rooster")):
            name = f"{fold}-1000{target}-A-{target}.wav"
            tone(root / "audio" / name, 5.0)
            rows.append(f"{name},{fold},{target},{category},True,1000{target},A")
    (root / "meta").mkdir()
    (root / "meta" / "esc50.csv").write_text("\n".join(rows) + "\n")
    dm = ManifestDataModule(str(root), layout="esc50", batch_size=8)
    batch = setup(dm)
    assert dm.classes == ["dog", "rooster"] and dm.modalities == ("audio",) and dm.task == "multiclass"
    assert dm.clip_seconds == 5.0 and "clip 5 s (inferred)" in capsys.readouterr().out
    assert set(batch) == {"audio", "label", "index"} and batch["audio"].shape == (4, 1, 80000)  # folds 1, 2 train
    assert len(dm.datasets["val"]) == 2 and dm.test_dataloader() is None  # fold 5 validates
    other = ManifestDataModule(str(root), layout="esc50", fold=1, batch_size=8)
    other.setup("fit")
    assert len(other.datasets["train"]) == 4 and all(
        "1-" in p.rsplit("/", 1)[1][:2] for p in other.datasets["val"].audio
    )


def test_urbansound8k(tmp_path: Path) -> None:
    root = tmp_path / "UrbanSound8K"
    rows = ["slice_file_name,fsID,start,end,salience,fold,classID,class"]
    for fold in (1, 10):
        for class_id, name in ((3, "dog_bark"), (1, "car_horn")):
            file = f"{fold}{class_id}-0-0-0.wav"
            tone(root / "audio" / f"fold{fold}" / file, 3.0 + fold / 10, rate=22050, channels=2)
            rows.append(f"{file},{fold}{class_id},0,4,1,{fold},{class_id},{name}")
    (root / "metadata").mkdir()
    (root / "metadata" / "UrbanSound8K.csv").write_text("\n".join(rows) + "\n")
    dm = ManifestDataModule(str(root), layout="urbansound8k", batch_size=4, clip_seconds=4.0)
    batch = setup(dm)
    assert dm.classes == ["car_horn", "dog_bark"]  # ordered by classID (1, 3)
    assert batch["audio"].shape == (2, 1, 64000) and batch["audio"][:, 0, -1000:].abs().max() == 0  # zero padded
    assert sorted(batch["label"].tolist()) == [0, 1] and len(dm.datasets["val"]) == 2


def test_desed_strong_labels_become_frame_targets(tmp_path: Path) -> None:
    root = tmp_path / "desed"
    for split in ("train", "validation"):
        for i in range(3):
            tone(root / "audio" / split / f"Y{split}{i}_0.000_10.000.wav", 10.0, rate=16000)
    table = ["filename\tonset\toffset\tevent_label", "Ytrain0_0.000_10.000.wav\t0.163\t0.665\tAlarm_bell_ringing"]
    table += ["Ytrain0_0.000_10.000.wav\t5.0\t6.0\tDog", "Ytrain1_0.000_10.000.wav\t2.0\t3.5\tDog"]
    (root / "metadata").mkdir(parents=True)
    (root / "metadata" / "train.tsv").write_text("\n".join(table) + "\n")  # Ytrain2 has no events: absent, as in DCASE
    (root / "metadata" / "validation.tsv").write_text("filename\tonset\toffset\tevent_label\n")
    dm = ManifestDataModule(str(root), layout="desed", batch_size=3, clip_seconds=10.0, event_frame_rate=50.0)
    dm.setup("fit")
    batch = next(iter(torch.utils.data.DataLoader(dm.datasets["train"], batch_size=3)))
    assert dm.task == "multilabel" and dm.classes == ["Alarm_bell_ringing", "Dog"] == dm.event_classes
    assert batch["labels"].tolist() == [[1.0, 1.0], [0.0, 1.0], [0.0, 0.0]]
    events = batch["events"]
    assert events.shape == (3, 500, 2) and dm.event_frame_rate == 50.0
    assert torch.nonzero(events[0, :, 0]).flatten().tolist() == list(range(8, 34))  # 0.163 s -> frame 8, 0.665 -> 33
    assert torch.nonzero(events[1, :, 1]).flatten().tolist() == list(range(100, 175))
    assert events[2].sum() == 0 and len(dm.datasets["val"]) == 3


def shadow_pair(image: Path, mask: Path, size: tuple[int, int], mode: str = "RGB") -> None:
    for path in (image, mask):
        path.parent.mkdir(parents=True, exist_ok=True)
    pixels = np.full((size[1], size[0], 3), 200, dtype=np.uint8)
    pixels[:, : size[0] // 2] = 40  # dark left half = the shadow
    Image.fromarray(pixels).convert(mode).save(image)
    Image.fromarray(((pixels[:, :, 0] < 100) * 255).astype(np.uint8)).save(mask)


@pytest.mark.parametrize("layout", ["istd", "sbu"])
def test_shadow_layouts_give_image_and_mask_without_audio(tmp_path: Path, layout: str) -> None:
    root = tmp_path / layout
    for part, count in (("train", 3), ("test", 2)):
        for i in range(count):
            if layout == "istd":
                name = f"{i}.png"
                shadow_pair(root / part / f"{part}_A" / name, root / part / f"{part}_B" / name, (64, 48))
            else:
                folder = root / ("SBUTrain4KRecoveredSmall" if part == "train" else "SBU-Test")
                shadow_pair(folder / "ShadowImages" / f"lssd{i}.jpg", folder / "ShadowMasks" / f"lssd{i}.png", (80, 60))
    dm = ManifestDataModule(str(root), layout=layout, batch_size=3, image_size=32, augment=False)
    batch = setup(dm)
    assert dm.modalities == ("image",) and dm.task == "segmentation" and dm.classes == []
    assert set(batch) == {"image", "mask", "index"}
    assert batch["image"].shape == (3, 3, 32, 32) and batch["mask"].shape == (3, 1, 32, 32)
    assert batch["mask"][:, 0, :, :14].min() == 1.0 and batch["mask"][:, 0, :, 18:].max() == 0.0
    assert len(dm.datasets["val"]) == 2 and len(dm.datasets["test"]) == 2  # the test set doubles as validation


def test_sbu_image_without_mask_is_reported(tmp_path: Path) -> None:
    folder = tmp_path / "SBU-shadow" / "SBUTrain4KRecoveredSmall"
    shadow_pair(folder / "ShadowImages" / "a.jpg", folder / "ShadowMasks" / "a.png", (40, 40))
    shadow_pair(folder / "ShadowImages" / "b.jpg", folder / "ShadowMasks" / "zzz.png", (40, 40))
    dm = ManifestDataModule(str(tmp_path / "SBU-shadow"), layout="sbu")
    with pytest.raises(DataError, match=r"ShadowImages, line 2: mask file not found: .*ShadowMasks/b\.png"):
        dm.setup("fit")


def test_layout_errors(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match=r"data\.layout must be one of manifest, esc50"):
        ManifestDataModule(str(tmp_path), layout="audioset")
    with pytest.raises(DataError, match=r"meta/esc50\.csv not found: is root the dataset's top folder\?"):
        ManifestDataModule(str(tmp_path), layout="esc50").setup("fit")
