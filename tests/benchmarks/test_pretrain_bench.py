"""benchmarks/pretrain.py: the label subsets are stratified, seeded, nested and resolvable; a quick run pretrains,
sweeps scratch's LR and prints the fraction table with every run finished."""

from __future__ import annotations

import csv
import json
import re
from collections import Counter
from pathlib import Path

import pytest
import yaml

from sss.data import ManifestDataModule
from sss.data.synthetic import make_industrial


@pytest.fixture(scope="module")
def bench(benchmark_script):
    return benchmark_script("pretrain")


@pytest.fixture(scope="module")
def data(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return make_industrial(tmp_path_factory.mktemp("pairs") / "d", n_train=40, n_val=8, n_test=0, task="shared")


def _rows(folder: Path, split: str) -> list[dict[str, str]]:
    with (folder / f"{split}.csv").open(newline="") as f:
        return list(csv.DictReader(f))


def test_subset_counts_round_each_label_and_keep_one_at_least(bench):
    assert bench.subset_counts({"a": 10, "b": 30}, 0.25) == {"a": 3, "b": 8}  # 2.5 and 7.5 round up
    assert bench.subset_counts({"a": 10, "b": 3}, 0.1) == {"a": 1, "b": 1}
    assert bench.subset_counts({"a": 10}, 1.0) == {"a": 10}
    with pytest.raises(ValueError, match="fraction"):
        bench.subset_counts({"a": 10}, 0.0)


def test_label_subset_is_stratified_seeded_nested_and_resolvable(bench, data, tmp_path):
    full = _rows(data, "train")
    per_label = Counter(row["label"] for row in full)
    quarter = bench.label_subset(data, tmp_path / "quarter", 0.25, seed=0)
    half = bench.label_subset(data, tmp_path / "half", 0.5, seed=0)
    kept = _rows(quarter, "train")
    assert Counter(row["label"] for row in kept) == bench.subset_counts(per_label, 0.25)  # stratified
    images = [row["image"] for row in kept]
    assert images == [row["image"] for row in full if row["image"] in images]  # in file order
    assert {row["image"] for row in kept} <= {row["image"] for row in _rows(half, "train")}  # nested
    again = bench.label_subset(data, tmp_path / "again", 0.25, seed=0)
    other = bench.label_subset(data, tmp_path / "other", 0.25, seed=1)
    assert _rows(again, "train") == kept and _rows(other, "train") != kept  # seeded
    assert _rows(quarter, "val") == [{k: r[k] for k in ("image", "audio", "label")} for r in _rows(data, "val")]
    assert (quarter / "classes.txt").read_text() == (data / "classes.txt").read_text()
    module = ManifestDataModule(str(quarter), augment=False)  # every file resolves inside the subset folder
    module.setup("fit")
    assert len(module.datasets["train"]) == len(kept) and len(module.datasets["val"]) == len(_rows(data, "val"))
    assert module.datasets["train"][0]["image"].shape[-1] > 0
    assert (quarter / kept[0]["audio"]).stat().st_ino == (data / kept[0]["audio"]).stat().st_ino  # hard-linked


@pytest.mark.slow
def test_quick_run_pretrains_sweeps_and_prints_the_table(bench, tmp_path, capsys):
    result = bench.main(["--quick", "--seeds", "0", "--root", str(tmp_path)])
    printed = capsys.readouterr().out
    sizes = bench.QUICK
    pre = result["pretrain"]
    assert pre["global_step"] == sizes.pretrain_steps and "val/linear_probe/accuracy" in pre
    assert re.search(r"audio_to_image +R@1 [\d.]+ \(chance 0\.062\)", printed)  # 1 / 16 validation pairs
    assert re.search(r"image_to_audio +R@1 .* R@10 [\d.]+ \(chance 0\.625\)", printed)
    assert set(result["sweep"]) == {1e-3, 3e-3} and result["scratch_lr"] in result["sweep"]
    runs = [run for row in result["rows"] for arm in ("scratch", "pretrained") for run in row[arm]]
    assert len(runs) == 4 and all(run["global_step"] == sizes.steps for run in runs)  # every run finished
    assert "UNFINISHED" not in printed
    table = printed[printed.index("final val accuracy after") :].splitlines()
    assert re.fullmatch(r" +fraction +labelled rows +scratch +pretrained +gain \(points\)", table[1])
    for line, (fraction, rows) in zip(table[2:4], (("0.1", 4), ("1", 48)), strict=True):
        assert re.fullmatch(rf" +{fraction} +{rows} +[\d.]+ ± [\d.]+ +[\d.]+ ± [\d.]+ +[+-][\d.]+", line), line
    assert re.fullmatch(
        r"goal: pretrained \+10 points or more over scratch at 0\.1 of the labels: .*(met|NOT met)", table[4]
    )
    # The pretrained arm loaded the pretraining's encoders; scratch loaded nothing, with the same step budget.
    folders = sorted((tmp_path / "runs").iterdir())
    for folder in folders:
        config = yaml.safe_load((folder / "config.yaml").read_text())
        warm = "_pretrained_" in folder.name
        assert (config["model"].get("init_from") is not None) == warm, folder.name
        assert config["trainer"]["max_steps"] == sizes.steps and config["model"]["name"] == "hunter_tiny"
        assert ("(model.init_from) from" in (folder / "stdout.txt").read_text()) == warm
        assert json.loads((folder / "results.json").read_text())["global_step"] == sizes.steps
