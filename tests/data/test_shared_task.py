"""The shared task: sixteen machine types seen and heard, the label a Latin square of the type's two factors."""

from __future__ import annotations

import csv
import hashlib
import json
from collections import Counter
from pathlib import Path

import numpy as np
import pytest
import soundfile as sf
from PIL import Image

from sss.data._shared import BANDS, shared_class
from sss.data.synthetic import (
    SHARED_CLASSES,
    SHARED_SHADOWS,
    SHARED_SOUNDS,
    SHARED_TYPES,
    IndustrialDataModule,
    make_industrial,
)

N, FIT = 480, 320  # rows generated; the first FIT give the centroids, the rest are classified


@pytest.fixture(scope="module")
def shared(tmp_path_factory) -> tuple[Path, list[dict[str, str]]]:
    root = make_industrial(tmp_path_factory.mktemp("s") / "ind", n_train=N, n_val=0, n_test=0, task="shared")
    return root, _rows(root, "train")


def _rows(root: Path, split: str) -> list[dict[str, str]]:
    with open(root / f"{split}.csv") as handle:
        return list(csv.DictReader(handle))


def _image_feature(path: Path) -> np.ndarray:
    # Log power of the windowed image in rings (spatial frequency: the pitch) x wedges (orientation: the angle).
    gray = np.asarray(Image.open(path).convert("L"), dtype=np.float64) / 255
    power = np.abs(np.fft.fftshift(np.fft.fft2((gray - gray.mean()) * np.outer(np.hanning(64), np.hanning(64))))) ** 2
    y, x = np.mgrid[-32:32, -32:32]
    radius, angle = np.hypot(x, y), np.mod(np.arctan2(y, x), np.pi)
    cells = []
    for ring in range(3, 14):
        for wedge in range(8):
            off = np.abs((angle - wedge * np.pi / 8 + np.pi / 2) % np.pi - np.pi / 2)
            cells.append(power[(radius >= ring) & (radius < ring + 1) & (off < np.pi / 16)].sum())
    feature = np.log(np.array(cells) + 1e-9)
    return feature - feature.mean()


def _audio_feature(path: Path) -> np.ndarray:
    # The mean log spectrum of the loudest quarter of the frames (the band), plus the peak's spread (a sweep),
    # the spectral flatness (a hiss) and how densely the loud frames follow each other (pulses).
    wave, _ = sf.read(path)
    frames = wave[: len(wave) // 256 * 256].reshape(-1, 256) * np.hanning(256)
    power = np.abs(np.fft.rfft(frames, axis=1)) ** 2 + 1e-12
    energy = power.sum(axis=1)
    loud = np.nonzero(energy > np.quantile(energy, 0.75))[0]
    spectrum = np.log(power[loud].mean(axis=0))[2:100]
    flatness = np.log(np.exp(np.log(power[loud]).mean(axis=1)).mean() / power[loud].mean())
    shape = [np.std(np.log(power[loud].argmax(axis=1) + 1)), flatness, len(loud) / (loud[-1] - loud[0] + 1)]
    return np.concatenate([spectrum - spectrum.mean(), 10 * np.array(shape)])


def _nearest_centroid(features: list[np.ndarray], types: np.ndarray) -> np.ndarray:
    """Each held-out row's type: the nearest of the 16 type centroids of the first FIT rows (standardised)."""
    x = np.array(features)
    z = (x - x[:FIT].mean(axis=0)) / (x[:FIT].std(axis=0) + 1e-9)
    centroids = np.array([z[:FIT][types[:FIT] == k].mean(axis=0) for k in range(16)])
    return ((z[FIT:, None, :] - centroids[None]) ** 2).sum(axis=-1).argmin(axis=1)


def test_columns_classes_and_balanced_types(shared):
    root, rows = shared
    assert list(rows[0]) == ["image", "audio", "label", "mask", "events", "shadow", "sound", "machine"]
    assert (root / "classes.txt").read_text().split() == list(SHARED_CLASSES)
    assert (root / "event_classes.txt").read_text().split() == list(SHARED_SOUNDS)
    assert Counter(r["machine"] for r in rows) == {name: N // 16 for name in SHARED_TYPES}
    assert Counter(r["label"] for r in rows) == {name: N // 4 for name in SHARED_CLASSES}
    for row in rows:  # the cells describe the row's machine type; the label is its Latin-square class
        k = SHARED_TYPES.index(row["machine"])
        assert row["label"] == SHARED_CLASSES[(k // 4 + k % 4) % 4] == SHARED_CLASSES[shared_class(k)]
        assert row["shadow"] == SHARED_SHADOWS[k] and row["sound"] == f"{SHARED_SOUNDS[k // 4]}_{round(BANDS[k % 4])}hz"
    # Neither factor alone tells the class: each form and each size is in every class equally often.
    for factor in (lambda k: k // 4, lambda k: k % 4):
        pairs = Counter((factor(SHARED_TYPES.index(r["machine"])), r["label"]) for r in rows)
        assert set(pairs.values()) == {N // 16}
    with open(root / "events.tsv") as handle:
        events = {e["filename"]: e["event_label"] for e in csv.DictReader(handle, delimiter="\t")}
    assert all(events[Path(r["audio"]).name] == SHARED_SOUNDS[SHARED_TYPES.index(r["machine"]) // 4] for r in rows)


def test_the_machine_type_is_recoverable_from_each_modality_and_both_agree(shared):
    root, rows = shared
    types = np.array([SHARED_TYPES.index(r["machine"]) for r in rows])
    from_image = _nearest_centroid([_image_feature(root / r["image"]) for r in rows], types)
    from_audio = _nearest_centroid([_audio_feature(root / r["audio"]) for r in rows], types)
    held_out = types[FIT:]
    # Chance is 1/16; measured 0.86 (image: faint, noisy grilles) and 0.79 (audio: a tone and pulses share a spectrum).
    assert (from_image == held_out).mean() > 0.75 and (from_audio == held_out).mean() > 0.65
    assert (from_image == from_audio).mean() > 0.55  # the two modalities name the same latent type (measured 0.71)
    classes = np.array([SHARED_CLASSES.index(r["label"]) for r in rows])[FIT:]
    assert (np.array([shared_class(k) for k in from_image]) == classes).mean() > 0.75  # the label follows the type


def test_the_shared_task_is_deterministic_stamped_and_takes_missing(tmp_path):
    one = make_industrial(tmp_path / "a", n_train=16, n_val=4, n_test=0, task="shared")
    two = make_industrial(tmp_path / "b", n_train=16, n_val=4, n_test=0, task="shared")
    other = make_industrial(tmp_path / "c", n_train=16, n_val=4, n_test=0, task="shared", seed=1)

    def digest(root: Path) -> dict[str, str]:
        return {str(p.relative_to(root)): hashlib.sha256(p.read_bytes()).hexdigest() for p in root.rglob("*.*")}

    assert digest(one) == digest(two) and len(digest(one)) == 3 * 20 + 5 + 1  # files, 2 csv, tsv, 2 txt, stamp
    assert digest(one)["images/train_00000.png"] != digest(other)["images/train_00000.png"]
    stamp = json.loads((one / "sss-dataset.json").read_text())
    assert stamp["task"] == "shared" and stamp["task_version"] >= 1
    with pytest.raises(FileExistsError, match="other arguments"):
        make_industrial(one, n_train=16, n_val=4, n_test=0, task="redundant")
    gaps = make_industrial(tmp_path / "gaps", n_train=16, n_val=4, n_test=0, task="shared", missing={"audio": 0.25})
    rows, full = _rows(gaps, "train"), _rows(one, "train")
    assert sum(not r["audio"] for r in rows) == 4 and all(
        r["machine"] == f["machine"] for r, f in zip(rows, full, strict=True)
    )
    assert all(bool(r["sound"]) == bool(r["audio"]) == bool(r["events"]) for r in rows)
    module = IndustrialDataModule(n_train=4, n_val=0, n_test=0, task="shared")
    assert module.classes == list(SHARED_CLASSES) and Path(module.root).name.startswith("industrial-shared-")


def test_cli_makes_the_shared_task(tmp_path):
    from sss.cli import main

    assert main(["data", "make", "industrial", str(tmp_path / "s"), "--n", "32", "--task", "shared"]) == 0
    assert Counter(r["machine"] for r in _rows(tmp_path / "s", "train")) == {name: 2 for name in SHARED_TYPES}
