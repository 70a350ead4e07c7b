"""The binding task of the synthetic generator: the label needs both modalities, each alone says nothing."""

from __future__ import annotations

import csv
import json
import math
from collections import Counter
from pathlib import Path

import numpy as np
import pytest
import soundfile as sf
from PIL import Image
from sklearn.linear_model import LogisticRegression

from sss.cli import main
from sss.data.synthetic import (
    BINDING_CLASSES,
    BINDING_SHADOWS,
    BINDING_SOUNDS,
    BINDING_VERSION,
    IndustrialDataModule,
    _stamp,
    make_industrial,
)

N = 600


@pytest.fixture(scope="module")
def binding(tmp_path_factory) -> tuple[Path, list[dict[str, str]]]:
    root = make_industrial(tmp_path_factory.mktemp("b") / "ind", n_train=N, n_val=0, n_test=0, task="binding")
    return root, list(csv.DictReader(open(root / "train.csv")))


def _mutual_information(xs: list[str], ys: list[str]) -> float:
    """In bits, from the empirical joint distribution."""
    n, joint, px, py = len(xs), Counter(zip(xs, ys, strict=True)), Counter(xs), Counter(ys)
    return sum(c / n * math.log2(c * n / (px[x] * py[y])) for (x, y), c in joint.items())


def test_the_label_is_independent_of_each_modality_in_the_metadata(binding):
    root, rows = binding
    labels = [r["label"] for r in rows]
    assert (root / "classes.txt").read_text().split() == list(BINDING_CLASSES)
    assert Counter(labels) == {"match": N // 2, "mismatch": N // 2}
    for attribute, names in (("shadow", BINDING_SHADOWS), ("sound", BINDING_SOUNDS)):
        values = [r[attribute] for r in rows]
        assert Counter(values) == {name: N // len(names) for name in names}
        assert _mutual_information(values, labels) < 1e-9  # exactly balanced: zero, not merely small
        for value in set(values):
            rate = np.mean([label == "match" for v, label in zip(values, labels, strict=True) if v == value])
            assert rate == 0.5, (attribute, value)
    pairs = [r["shadow"] + r["sound"] for r in rows]
    assert _mutual_information(pairs, labels) == pytest.approx(1.0)  # together they decide it


def _image_features(root: Path, row: dict[str, str]) -> list[float]:
    # The structure tensor of the image: its two orientation terms tell the slat angle (0 or 90 degrees) apart.
    image = np.asarray(Image.open(root / row["image"]).convert("L"), dtype=np.float64) / 255
    gy, gx = np.gradient(image)
    xx, yy, xy = (gx * gx).sum(), (gy * gy).sum(), (gx * gy).sum()
    return [(xx - yy) / (xx + yy), 2 * xy / (xx + yy), image.mean(), image.std()]


def _audio_features(root: Path, row: dict[str, str]) -> list[float]:
    # Spectral flatness of the loudest frames (a tone: near 0, a hiss: high) and how loud they are.
    wave, _ = sf.read(root / row["audio"])
    power = np.abs(np.fft.rfft(wave[: len(wave) // 256 * 256].reshape(-1, 256), axis=1)) ** 2 + 1e-12
    loudest = power[np.argsort(power.sum(axis=1))[-8:]]
    flatness = np.exp(np.log(loudest).mean(axis=1)) / loudest.mean(axis=1)
    return [math.log(flatness.mean()), math.log(loudest.sum() / np.median(power.sum(axis=1)))]


def _accuracy(features: np.ndarray, labels: np.ndarray) -> float:
    # Standardised, fit on one half, scored on the other.
    features = (features - features.mean(axis=0)) / features.std(axis=0)
    half = len(labels) // 2
    model = LogisticRegression(max_iter=1000).fit(features[:half], labels[:half])
    return float(model.score(features[half:], labels[half:]))


def test_an_image_only_or_audio_only_classifier_stays_at_chance(binding):
    root, rows = binding
    image = np.array([_image_features(root, r) for r in rows])
    audio = np.array([_audio_features(root, r) for r in rows])
    match = np.array([r["label"] == "match" for r in rows])
    # The features do see the modality's own factor (so they could leak the label if it were there) ...
    assert _accuracy(image, np.array([r["shadow"] == BINDING_SHADOWS[1] for r in rows])) > 0.85
    assert _accuracy(audio, np.array([r["sound"] == BINDING_SOUNDS[1] for r in rows])) > 0.85
    # ... yet alone they stay at chance on the label, while the pair's interactions carry it.
    assert abs(_accuracy(image, match) - 0.5) < 0.08
    assert abs(_accuracy(audio, match) - 0.5) < 0.08
    z_image, z_audio = ((x - x.mean(axis=0)) / x.std(axis=0) for x in (image, audio))
    products = (z_image[:, :, None] * z_audio[:, None, :]).reshape(len(rows), -1)  # every image x audio feature
    pair = np.hstack([image, audio, products])
    assert _accuracy(pair, match) > 0.85


def test_the_task_and_its_rendering_are_in_the_stamp_and_the_cache_key(tmp_path):
    default = make_industrial(tmp_path / "ind", n_train=4, n_val=0, n_test=0)
    with pytest.raises(FileExistsError, match="other arguments"):  # a default dataset is never reused for binding
        make_industrial(default, n_train=4, n_val=0, n_test=0, task="binding")
    # A binding dataset of an earlier rendering (its stamp had no task_version) is refused, not reused.
    bound_root = make_industrial(tmp_path / "bound", n_train=4, n_val=0, n_test=0, task="binding")
    stamp = json.loads((bound_root / "sss-dataset.json").read_text())
    assert stamp["task"] == "binding" and stamp["task_version"] == BINDING_VERSION >= 2
    del stamp["task_version"]
    (bound_root / "sss-dataset.json").write_text(json.dumps(stamp))
    with pytest.raises(FileExistsError, match="other arguments"):
        make_industrial(bound_root, n_train=4, n_val=0, n_test=0, task="binding")
    assert "task_version" not in _stamp({"n_train": 4, "task": "default"})  # the default's stamp is as it was
    plain = IndustrialDataModule(n_train=4, n_val=0, n_test=0)
    bound = IndustrialDataModule(n_train=4, n_val=0, n_test=0, task="binding")
    assert Path(plain.root).parent == Path(bound.root).parent and plain.root != bound.root
    assert Path(bound.root).name.startswith("industrial-binding-") and Path(plain.root).name.startswith("industrial-")
    assert bound.classes == ["mismatch", "match"] and plain.classes == ["idle", "fault", "passerby", "collision"]
    with pytest.raises(ValueError, match="task must be one of default, binding"):
        make_industrial(tmp_path / "other", n_train=4, task="xor")


def test_cli_makes_the_binding_task(tmp_path, capsys):
    assert main(["data", "make", "industrial", str(tmp_path / "b"), "--n", "8", "--task", "binding"]) == 0
    assert (tmp_path / "b" / "classes.txt").read_text().split() == ["mismatch", "match"]
    assert (tmp_path / "b" / "event_classes.txt").read_text().split() == list(BINDING_SOUNDS)
    header = (tmp_path / "b" / "train.csv").read_text().splitlines()[0]
    assert header == "image,audio,label,mask,events,shadow,sound"


def test_every_clip_has_its_signal_and_every_image_its_shadow(binding):
    root, rows = binding
    with open(root / "events.tsv") as handle:
        events = list(csv.DictReader(handle, delimiter="\t"))
    assert len(events) == N  # one signal per clip, labelled with the clip's sound
    by_clip = {e["filename"]: e for e in events}
    for row in rows[:60]:
        event = by_clip[Path(row["audio"]).name]
        assert event["event_label"] == row["sound"] and 0.1 <= float(event["onset"]) < float(event["offset"]) <= 1.0
        mask = np.asarray(Image.open(root / row["mask"]))
        assert 0.1 < (mask > 127).mean() < 0.3, row["mask"]  # the grille's slats cover about half of its disc
