"""benchmarks/recipes.py: its built sets are read by the real layouts, and its dry run trains and reports a curve."""

from __future__ import annotations

import csv
from pathlib import Path

import pytest

from sss.data import ManifestDataModule


@pytest.fixture(scope="module")
def recipes(benchmark_script):
    return benchmark_script("recipes")


def _setup(recipes, kind: str, root: Path) -> ManifestDataModule:
    folder = recipes.build(kind, root, recipes.DRY)
    options = dict(item.split("=", 1) for item in recipes.overrides_for(kind, folder))
    fold = int(options["data.fold"]) if "data.fold" in options else None
    data = ManifestDataModule(options["data.root"], layout=options.get("data.layout", "manifest"), fold=fold)
    data.setup("fit")
    return data


def test_esc50_set_is_read_by_the_esc50_layout(recipes, tmp_path):
    data = _setup(recipes, "esc50", tmp_path)
    sizes = recipes.DRY
    assert data.classes == [recipes.class_name(k) for k in range(sizes.esc50_classes)]  # target order
    val_per_class = sizes.esc50_clips // 5  # 5 folds, fold 1 held out
    assert len(data.datasets["val"]) == sizes.esc50_classes * val_per_class
    assert len(data.datasets["train"]) == sizes.esc50_classes * (sizes.esc50_clips - val_per_class)
    assert data.modalities == ("audio",) and data.clip_seconds == sizes.esc50_seconds
    with (tmp_path / "esc50" / "meta" / "esc50.csv").open(newline="") as f:
        rows = list(csv.DictReader(f))
    assert list(rows[0]) == ["filename", "fold", "target", "category", "esc10", "src_file", "take"]
    for row in rows:  # ESC-50's file names: {fold}-{src_file}-{take}-{target}.wav
        assert row["filename"] == f"{row['fold']}-{row['src_file']}-{row['take']}-{row['target']}.wav"
        assert (tmp_path / "esc50" / "audio" / row["filename"]).is_file()


def test_urbansound8k_set_is_read_by_its_layout(recipes, tmp_path):
    data = _setup(recipes, "urbansound8k", tmp_path)
    assert len(data.classes) == 10
    assert len(data.datasets["val"]) == 10 * recipes.DRY.us8k_clips  # fold 1 of 10
    assert len(data.datasets["train"]) == 9 * 10 * recipes.DRY.us8k_clips
    folds = sorted(p.name for p in (tmp_path / "urbansound8k" / "audio").iterdir())
    assert folds == sorted(f"fold{k}" for k in range(1, 11))


@pytest.mark.parametrize(("kind", "modalities"), [("manifest", ("image", "audio")), ("images", ("image",))])
def test_manifest_sets_are_read_by_the_manifest_layout(recipes, tmp_path, kind, modalities):
    data = _setup(recipes, kind, tmp_path)
    sizes = recipes.DRY
    assert len(data.classes) == sizes.manifest_classes and data.modalities == modalities
    assert len(data.datasets["train"]) == sizes.manifest_classes * sizes.manifest_train
    assert len(data.datasets["val"]) == sizes.manifest_classes * sizes.manifest_val


def test_dry_run_fits_and_reports_the_curve(recipes, tmp_path, capsys):
    report = recipes.main(["--dry-run", "--sets", "esc50", "--root", str(tmp_path)])
    entry = report["esc50"]
    assert len(entry["curve"]) == 1 and 0.0 <= entry["final"] <= 1.0  # 1 epoch: one validation
    assert entry["curve"][-1] == pytest.approx(entry["final"])
    assert entry["ceiling"]["classes"] == recipes.DRY.esc50_classes
    printed = capsys.readouterr().out
    assert "esc50: linear ceiling" in printed and "esc50: val accuracy per epoch" in printed
