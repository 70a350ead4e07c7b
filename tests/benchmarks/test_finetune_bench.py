"""benchmarks/finetune.py: the target set is relabelled; a quick run compares fine-tuning (model.init_from, with the
controls on) against scratch and times an AST load. model.init_from itself: tests/run/test_pretrain.py."""

from __future__ import annotations

import csv
import re

import pytest
import yaml

from sss.data import ManifestDataModule
from sss.data.synthetic import make_industrial


@pytest.fixture(scope="module")
def bench(benchmark_script):
    return benchmark_script("finetune")


@pytest.mark.parametrize("task", ["count", "exactly_one"])
def test_target_set_is_the_relabelled_source_task(bench, tmp_path, task):
    raw = make_industrial(tmp_path / "raw", n_train=8, n_val=4, n_test=0, seed=1)
    folder = bench.relabel(raw, tmp_path / "target", task)
    data = ManifestDataModule(str(folder), augment=False)
    data.setup("fit")
    assert data.classes == list(dict.fromkeys(bench.TARGETS[task].values()))
    for split, count in (("train", 8), ("val", 4)):
        with (raw / f"{split}.csv").open(newline="") as f:
            before = list(csv.DictReader(f))
        with (folder / f"{split}.csv").open(newline="") as f:
            after = list(csv.DictReader(f))
        assert len(after) == count == len(data.datasets[split])
        assert [row["label"] for row in after] == [bench.TARGETS[task][row["label"]] for row in before]
        assert [row["audio"] for row in after] == [row["audio"] for row in before]


@pytest.mark.slow
def test_quick_run_compares_finetune_with_the_controls_against_scratch(bench, tmp_path, capsys):
    result = bench.main(["--quick", "--seeds", "0", "--root", str(tmp_path), "--repeats", "1"])
    printed = capsys.readouterr().out
    sizes = bench.QUICK
    steps = list(range(sizes.val_every, sizes.target_steps + 1, sizes.val_every))
    for variant in ("finetune", "scratch"):
        (run,) = result["runs"][variant]
        assert sorted(run["curve"]) == steps and 0.0 <= run["final"] <= 1.0
        assert run["curve"][sizes.target_steps] == pytest.approx(run["final"])
    # The fine-tune run loaded the source encoders and trained under the controls; scratch did neither.
    finetune = yaml.safe_load((tmp_path / "finetune_0" / "config.yaml").read_text())["trainer"]
    assert finetune["finetune"]["freeze"] == ["audio_encoder", "image_encoder"]
    assert finetune["finetune"]["unfreeze_at_step"] == sizes.unfreeze_at and finetune["optim"]["layer_decay"] == 0.75
    loaded = "(model.init_from) from "
    printed_ft = (tmp_path / "finetune_0" / "stdout.txt").read_text()
    assert printed_ft.count(loaded) == 2 and printed_ft.count("0 missing, 0 unexpected") == 2  # both encoders
    assert loaded not in (tmp_path / "scratch_0" / "stdout.txt").read_text()
    config = yaml.safe_load((tmp_path / "finetune_0" / "config.yaml").read_text())
    assert config["model"]["init_from"] == str(tmp_path / "source_run")
    assert result["load_report"]["image_encoder"] > 0 and result["load_report"]["audio_encoder"] > 0
    scratch = yaml.safe_load((tmp_path / "scratch_0" / "config.yaml").read_text())["trainer"]
    assert scratch["finetune"]["freeze"] == [] and scratch["optim"]["layer_decay"] is None
    changed = re.search(r"finetune: (\d+) of (\d+) encoder tensors differ", printed)
    assert changed and int(changed[1]) > 0  # released at unfreeze_at_step, then trained
    assert "mean val accuracy by step" in printed and "load time of a saved AST" in printed
    times = result["load_time"]
    assert times["hunter"] > 0 and times["from_pretrained"] > 0 and times["parameters"] > 0
