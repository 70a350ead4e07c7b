"""The binding task of the synthetic generator: the label needs both modalities, each alone says nothing."""

from __future__ import annotations

import csv
import math
from collections import Counter
from pathlib import Path

import numpy as np
import pytest
import soundfile as sf
from PIL import Image
from sklearn.linear_model import LogisticRegression

from sss.cli import main
from sss.data.synthetic import BINDING_CLASSES, IndustrialDataModule, make_industrial

N = 600


@pytest.fixture(scope="module")
def binding(tmp_path_factory) -> tuple[Path, list[dict[str, str]]]:
    root = make_industrial(
        tmp_path_factory.mktemp("b") / "ind", n_train=N, n_val=0, n_test=0, image_size=32, task="binding"
    )
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
    for attribute in ("shadow", "sound"):
        values = [r[attribute] for r in rows]
        assert _mutual_information(values, labels) < 1e-9  # exactly balanced: zero, not merely small
        for value in set(values):
            rate = np.mean([label == "match" for v, label in zip(values, labels, strict=True) if v == value])
            assert rate == 0.5, (attribute, value)
    pairs = [r["shadow"] + r["sound"] for r in rows]
    assert _mutual_information(pairs, labels) == pytest.approx(1.0)  # together they decide it


def _image_features(root: Path, row: dict[str, str]) -> list[float]:
    mask = np.asarray(Image.open(root / row["mask"]), dtype=np.float64) / 255
    image = np.asarray(Image.open(root / row["image"]).convert("L"), dtype=np.float64) / 255
    partial = (mask > 0) & (mask < 1)  # a motion-blurred shadow covers pixels for part of the exposure only
    return [partial.mean(), mask.mean(), image.mean(), image.std()]


def _audio_features(root: Path, row: dict[str, str]) -> list[float]:
    wave, _ = sf.read(root / row["audio"])
    energy = np.square(wave[: len(wave) // 256 * 256].reshape(-1, 256)).mean(axis=1)
    return [math.log(energy.max() / np.median(energy)), math.log(np.abs(wave).max() / wave.std())]


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
    assert _accuracy(image, np.array([r["shadow"] == "moving" for r in rows])) > 0.85
    assert _accuracy(audio, np.array([r["sound"] == "transient" for r in rows])) > 0.85
    # ... yet alone they stay at chance on the label, while the pair's interactions carry it.
    assert abs(_accuracy(image, match) - 0.5) < 0.08
    assert abs(_accuracy(audio, match) - 0.5) < 0.08
    z_image, z_audio = ((x - x.mean(axis=0)) / x.std(axis=0) for x in (image, audio))
    products = (z_image[:, :, None] * z_audio[:, None, :]).reshape(len(rows), -1)  # every image x audio feature
    pair = np.hstack([image, audio, products])
    assert _accuracy(pair, match) > 0.85


def test_the_task_is_in_the_stamp_and_the_cache_key(tmp_path):
    default = make_industrial(tmp_path / "ind", n_train=4, n_val=0, n_test=0)
    with pytest.raises(FileExistsError, match="other arguments"):  # a default dataset is never reused for binding
        make_industrial(default, n_train=4, n_val=0, n_test=0, task="binding")
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
    header = (tmp_path / "b" / "train.csv").read_text().splitlines()[0]
    assert header == "image,audio,label,mask,events,shadow,sound"
