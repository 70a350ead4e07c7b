"""The redundant task (both modalities carry the label, each corrupted alone) and missing cells (any task)."""

from __future__ import annotations

import csv
import hashlib
import json
import math
from collections import Counter
from pathlib import Path

import numpy as np
import pytest
import soundfile as sf
from PIL import Image

from sss.data._redundant import CORRUPTION
from sss.data.synthetic import (
    REDUNDANT_CLASSES,
    REDUNDANT_SHADOWS,
    REDUNDANT_SOUNDS,
    IndustrialDataModule,
    _stamp,
    make_industrial,
)

N = 400
Q = CORRUPTION  # each modality's corruption rate


@pytest.fixture(scope="module")
def redundant(tmp_path_factory) -> tuple[Path, list[dict[str, str]]]:
    root = make_industrial(tmp_path_factory.mktemp("r") / "ind", n_train=N, n_val=0, n_test=0, task="redundant")
    return root, _rows(root, "train")


def _rows(root: Path, split: str) -> list[dict[str, str]]:
    with open(root / f"{split}.csv") as handle:
        return list(csv.DictReader(handle))


def _image_class(root: Path, row: dict[str, str]) -> int:
    # The dominant gradient orientation (structure tensor) is across the slats: the class's 45-degree step.
    image = np.asarray(Image.open(root / row["image"]).convert("L"), dtype=np.float64) / 255
    gy, gx = np.gradient(image)
    theta = 0.5 * math.atan2(2 * (gx * gy).sum(), (gx * gx).sum() - (gy * gy).sum())
    return round(theta / (math.pi / 4)) % 4


def _sound(root: Path, row: dict[str, str]) -> str:
    # A few rules on the frames well above the hum: spectral flatness, the peak bin's spread, gaps.
    wave, _ = sf.read(root / row["audio"])
    frames = wave[: len(wave) // 256 * 256].reshape(-1, 256) * np.hanning(256)
    power = np.abs(np.fft.rfft(frames, axis=1)) ** 2 + 1e-12
    energy = power.sum(axis=1)
    loud = np.nonzero(energy > 4 * np.median(energy))[0]
    flatness = math.log(float(np.mean(np.exp(np.log(power[loud]).mean(axis=1)) / power[loud].mean(axis=1))))
    density = len(loud) / (loud[-1] - loud[0] + 1)  # a pulsed tone leaves quiet frames between its pulses
    if flatness > -1.5:
        return "hiss"
    if flatness > -4:
        return "noise"  # the crackle: broadband clicks
    if float(np.std(power[loud].argmax(axis=1))) > 10:
        return "sweep"
    return "pulses" if density < 0.8 else "tone"


def test_balanced_classes_and_each_modality_corrupted_alone_at_its_rate(redundant):
    root, rows = redundant
    assert (root / "classes.txt").read_text().split() == list(REDUNDANT_CLASSES)
    assert (root / "event_classes.txt").read_text().split() == list(REDUNDANT_SOUNDS)
    assert Counter(r["label"] for r in rows) == {name: N // 4 for name in REDUNDANT_CLASSES}
    noisy_image = np.array([r["shadow"] == "noise" for r in rows])
    noisy_audio = np.array([r["sound"] == "noise" for r in rows])
    assert (noisy_image.sum(), noisy_audio.sum()) == (round(Q["image"] * N), round(Q["audio"] * N))
    both = (noisy_image & noisy_audio).mean()
    assert abs(both - Q["image"] * Q["audio"]) < 0.02  # independent draws: about q_image * q_audio
    for row in rows:  # where not corrupted, the shadow and the sound are the class's own
        k = REDUNDANT_CLASSES.index(row["label"])
        assert row["shadow"] in ("noise", REDUNDANT_SHADOWS[k]) and row["sound"] in ("noise", REDUNDANT_SOUNDS[k])


def test_the_factor_recovered_from_each_file_is_the_label_in_about_1_minus_its_q_of_the_rows(redundant):
    root, rows = redundant
    labels = np.array([REDUNDANT_CLASSES.index(r["label"]) for r in rows])
    image = np.array([_image_class(root, r) for r in rows])
    sound = np.array([_sound(root, r) for r in rows])
    clean_image = np.array([r["shadow"] != "noise" for r in rows])
    clean_audio = np.array([r["sound"] != "noise" for r in rows])
    # The oracle reads the class off every clean file, and the corruption off every corrupted clip ...
    assert (image == labels)[clean_image].mean() > 0.97
    assert (sound == np.array(REDUNDANT_SOUNDS)[labels])[clean_audio].mean() > 0.97
    assert (sound == "noise")[~clean_audio].mean() > 0.97
    # ... and a corrupted file says nothing of the class: the label overall in about 1 - q(K-1)/K of the rows.
    assert abs((image == labels)[~clean_image].mean() - 0.25) < 0.25  # 20 noisy images: chance, roughly
    assert 1 - Q["image"] - 0.01 < (image == labels).mean() < 1 - Q["image"] * 3 / 4 + 0.02
    recovered = (sound == np.array(REDUNDANT_SOUNDS)[labels]).mean()
    assert 1 - Q["audio"] - 0.02 < recovered <= 1 - Q["audio"] + 0.01  # a crackle is never read as a class


def test_the_redundant_task_is_deterministic_and_stamped(tmp_path):
    one = make_industrial(tmp_path / "a", n_train=12, n_val=4, n_test=0, task="redundant")
    two = make_industrial(tmp_path / "b", n_train=12, n_val=4, n_test=0, task="redundant")
    other = make_industrial(tmp_path / "c", n_train=12, n_val=4, n_test=0, task="redundant", seed=1)

    def digest(root: Path) -> dict[str, str]:
        return {str(p.relative_to(root)): hashlib.sha256(p.read_bytes()).hexdigest() for p in root.rglob("*.*")}

    assert digest(one) == digest(two) and len(digest(one)) == 3 * 16 + 5 + 1  # files, 2 csv, tsv, 2 txt, stamp
    assert digest(one)["images/train_00000.png"] != digest(other)["images/train_00000.png"]
    stamp = json.loads((one / "sss-dataset.json").read_text())
    assert stamp["task"] == "redundant" and stamp["task_version"] >= 1 and "missing" not in stamp
    with pytest.raises(FileExistsError, match="other arguments"):
        make_industrial(one, n_train=12, n_val=4, n_test=0, task="binding")
    module = IndustrialDataModule(n_train=4, n_val=0, n_test=0, task="redundant")
    assert module.classes == list(REDUNDANT_CLASSES) and Path(module.root).name.startswith("industrial-redundant-")


@pytest.mark.parametrize("task", ["default", "binding", "redundant"])
def test_missing_cells_at_exact_rates_never_both_and_the_other_files_unchanged(tmp_path, task):
    sizes = {"n_train": 40, "n_val": 20, "n_test": 10}
    full = make_industrial(tmp_path / "full", task=task, **sizes)
    root = make_industrial(tmp_path / "gaps", task=task, missing={"audio": 0.2, "image": 0.3}, **sizes)
    with open(root / "events.tsv") as handle:
        events = {e["filename"] for e in csv.DictReader(handle, delimiter="\t")}
    for split, count in (("train", 40), ("val", 20), ("test", 10)):
        rows, whole = _rows(root, split), _rows(full, split)
        no_image = [r for r in rows if not r["image"]]
        no_audio = [r for r in rows if not r["audio"]]
        assert (len(no_image), len(no_audio)) == (round(0.3 * count), round(0.2 * count)), split
        assert not any(not r["image"] and not r["audio"] for r in rows)
        for row, same in zip(rows, whole, strict=True):
            assert row["label"] == same["label"]  # the labels (and samples) do not move
            assert bool(row["image"]) == bool(row["mask"]) and bool(row["audio"]) == bool(row["events"])
            if task != "default":
                assert row.get("shadow") in ("", same["shadow"]) and bool(row["shadow"]) == bool(row["image"])
                assert bool(row["sound"]) == bool(row["audio"])
            for column, folder in (("image", "images"), ("mask", "masks"), ("audio", "audio")):
                name = f"{split}_{whole.index(same):05d}" + (".wav" if column == "audio" else ".png")
                if row[column]:
                    assert (root / row[column]).read_bytes() == (full / same[column]).read_bytes()
                else:
                    assert not (root / folder / name).exists(), name  # an absent modality has no file
            if not row["audio"]:
                assert Path(same["audio"]).name not in events
    stamp = json.loads((root / "sss-dataset.json").read_text())
    assert stamp["missing"] == {"image": 0.3, "audio": 0.2}
    assert stamp == _stamp(
        {
            **json.loads((full / "sss-dataset.json").read_text())["args"],
            "task": task,
            "missing": {"image": 0.3, "audio": 0.2},
        }
    )
    with pytest.raises(FileExistsError, match="other arguments"):  # no reuse of the full dataset's folder
        make_industrial(full, task=task, missing={"image": 0.3}, **sizes)


def test_missing_rates_are_checked(tmp_path):
    with pytest.raises(ValueError, match="add up to more than 1"):
        make_industrial(tmp_path / "x", n_train=4, missing={"image": 0.6, "audio": 0.5})
    with pytest.raises(ValueError, match="unknown modality 'mask'"):
        make_industrial(tmp_path / "x", n_train=4, missing={"mask": 0.5})
    with pytest.raises(ValueError, match=r"rate must be in \[0, 1\]"):
        make_industrial(tmp_path / "x", n_train=4, missing={"image": 1.5})
    plain = make_industrial(tmp_path / "zero", n_train=4, n_val=0, n_test=0, missing={"image": 0.0})
    assert "missing" not in json.loads((plain / "sss-dataset.json").read_text())  # rate 0: the plain dataset
    assert not (tmp_path / "x").exists()


def test_cli_makes_the_redundant_task_with_missing_cells(tmp_path, capsys):
    from sss.cli import main

    out = tmp_path / "r"
    flags = ["--n", "20", "--task", "redundant", "--missing", "image=0.3", "--missing", "audio=0.2"]
    assert main(["data", "make", "industrial", str(out), *flags]) == 0
    rows = _rows(out, "train")
    assert sum(not r["image"] for r in rows) == 6 and sum(not r["audio"] for r in rows) == 4
    assert json.loads((out / "sss-dataset.json").read_text())["missing"] == {"image": 0.3, "audio": 0.2}
    bad = ["--n", "20", "--missing", "image=0.7", "--missing", "audio=0.5"]
    assert main(["data", "make", "industrial", str(tmp_path / "bad"), *bad]) == 2
    assert "add up to more than 1" in capsys.readouterr().err and not (tmp_path / "bad").exists()
