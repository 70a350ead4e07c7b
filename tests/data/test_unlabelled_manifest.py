"""Unlabelled manifests for pretraining: ``ManifestDataModule(labels="optional")`` and the default that refuses them."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import soundfile as sf
from PIL import Image

from sss.config import SSSConfig
from sss.config.instantiate import check_config
from sss.data import DataError, ManifestDataModule


def _folder(root: Path, train: list[str], val: list[str] | None = None, classes: str | None = None) -> Path:
    """Pairs of one image and one clip each; ``train`` / ``val`` are manifest lines after the header line."""
    root.mkdir(parents=True, exist_ok=True)
    for i in range(4):
        Image.new("RGB", (32, 32), (60 * i, 90, 120)).save(root / f"{i}.png")
        sf.write(root / f"{i}.wav", 0.1 * np.sin(np.arange(8000) * (0.05 + 0.02 * i)), 16000, subtype="PCM_16")
    (root / "train.csv").write_text("\n".join(train) + "\n")
    if val is not None:
        (root / "val.csv").write_text("\n".join(val) + "\n")
    if classes is not None:
        (root / "classes.txt").write_text(classes)
    return root


UNLABELLED = ["image,audio", "0.png,0.wav", "1.png,1.wav", "2.png,2.wav", "3.png,3.wav"]
LABELLED_VAL = ["image,audio,label", "0.png,0.wav,hum", "1.png,1.wav,knock", "2.png,2.wav,hum"]


def _module(root: Path, **kwargs: object) -> ManifestDataModule:
    return ManifestDataModule(str(root), batch_size=4, image_size=32, clip_seconds=0.5, **kwargs)


def test_an_unlabelled_train_split_loads_without_labels_and_a_labelled_val_keeps_them(tmp_path, capsys):
    dm = _module(_folder(tmp_path, UNLABELLED, LABELLED_VAL), labels="optional")
    assert dm.classes == []  # known before setup: no class count for a head
    dm.setup("fit")
    train, val = next(iter(dm.train_dataloader())), next(iter(dm.val_dataloader()))
    assert set(train) == {"image", "audio", "index"} and train["image"].shape == (4, 3, 32, 32)
    assert set(val) == {"image", "audio", "label", "index"} and val["label"].tolist() == [0, 1, 0]
    assert dm.classes == [] and dm.datasets["val"].classes == ["hum", "knock"] and dm.task == "multiclass"
    assert "train unlabelled" in capsys.readouterr().out


def test_the_default_refuses_a_manifest_without_labels_naming_the_file_and_the_key(tmp_path):
    root = _folder(tmp_path, UNLABELLED)
    with pytest.raises(DataError, match=r"train\.csv: missing column label .* set data\.labels=optional"):
        _module(root).setup("fit")
    with pytest.raises(ValueError, match=r"data\.labels must be 'required' or 'optional', got 'some'"):
        _module(root, labels="some")


def test_empty_label_cells_make_the_split_unlabelled_when_optional_and_a_bad_row_when_required(tmp_path, capsys):
    partial = ["image,audio,label", "0.png,0.wav,hum", "1.png,1.wav,", "2.png,2.wav,", "3.png,3.wav,knock"]
    root = _folder(tmp_path, partial, [*LABELLED_VAL[:1], "3.png,3.wav,rattle"])
    dm = _module(root, labels="optional")
    assert dm.classes == []
    dm.setup("fit")
    assert "label" not in next(iter(dm.train_dataloader()))
    # The val split names its own classes: the stray labels of the unlabelled train split (hum, knock) do not.
    assert dm.datasets["val"].classes == ["rattle"] and next(iter(dm.val_dataloader()))["label"].tolist() == [0]
    assert "train unlabelled (2 row(s) without a label)" in capsys.readouterr().out
    with pytest.raises(DataError, match=r"train\.csv, line 3: has an empty label"):
        _module(root).setup("fit")


def test_optional_labels_keep_a_fully_labelled_split_and_classes_txt(tmp_path):
    labelled = [*LABELLED_VAL, "3.png,3.wav,knock"]
    dm = _module(_folder(tmp_path / "a", labelled, classes="knock\nhum\n"), labels="optional")
    dm.setup("fit")
    assert dm.classes == ["knock", "hum"] and next(iter(dm.train_dataloader()))["label"].shape == (4,)
    dm = _module(_folder(tmp_path / "b", UNLABELLED, LABELLED_VAL, classes="knock\nhum\n"), labels="optional")
    dm.setup("fit")
    assert dm.classes == [] and dm.datasets["val"].classes == ["knock", "hum"]
    assert next(iter(dm.val_dataloader()))["label"].tolist() == [1, 0, 1]


def test_sss_check_refuses_an_unknown_labels_value_by_the_annotation():
    config = SSSConfig()
    config.data = {"_target_": "sss.data.ManifestDataModule", "root": "x", "labels": "maybe"}
    assert any("labels" in problem and "maybe" in problem for problem in check_config(config))
    config.data["labels"] = "optional"
    assert not [problem for problem in check_config(config) if "labels" in problem]


def test_an_unlabelled_val_split_between_labelled_ones_keeps_the_train_classes(tmp_path):
    # Labelled train, val without labels, labelled test naming fewer classes, no classes.txt: the test split's
    # labels index into the train split's classes (those the head was sized for), not into its own.
    train = ["image,audio,label", "0.png,0.wav,a", "1.png,1.wav,b", "2.png,2.wav,c"]
    root = _folder(tmp_path, train, UNLABELLED)
    (root / "test.csv").write_text("image,audio,label\n0.png,0.wav,a\n3.png,3.wav,c\n")
    dm = _module(root, labels="optional")
    assert dm.classes == ["a", "b", "c"]
    dm.setup("fit")
    assert dm.classes == ["a", "b", "c"] and not dm.datasets["val"].has_label
    assert [dm.datasets["test"][i]["label"] for i in range(2)] == [0, 2]
