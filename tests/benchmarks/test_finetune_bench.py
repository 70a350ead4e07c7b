"""benchmarks/finetune.py: the warm start loads every encoder tensor or refuses; the target set is relabelled; a
quick run compares fine-tuning (with the controls on) against scratch and times an AST load."""

from __future__ import annotations

import csv
import importlib.util
import re
import sys
from pathlib import Path

import pytest
import torch
import yaml

from sss.data import ManifestDataModule
from sss.data.synthetic import make_industrial
from sss.models import create_model

SCRIPT = Path(__file__).resolve().parents[2] / "benchmarks" / "finetune.py"


@pytest.fixture(scope="module")
def bench():
    spec = importlib.util.spec_from_file_location("sss_benchmark_finetune", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # its dataclasses look their module up there
    spec.loader.exec_module(module)
    return module


def _model(seed: int, num_classes: int, **kwargs):
    torch.manual_seed(seed)
    return create_model("hunter_tiny", num_classes=num_classes, **kwargs)


def test_warm_start_loads_every_encoder_tensor_and_leaves_fusion_and_head_fresh(bench):
    source = _model(0, 4).state_dict()
    target = _model(1, 3)
    fresh = {name: value.clone() for name, value in target.state_dict().items()}
    report = bench.load_encoders(target, source)
    after = target.state_dict()
    encoders = [name for name in after if name.startswith(("image_encoder.", "audio_encoder."))]
    assert report["image_encoder"] + report["audio_encoder"] == len(encoders)
    assert all(after[name].equal(source[name]) for name in encoders)
    rest = [name for name in after if name not in encoders]
    assert rest and all(after[name].equal(fresh[name]) for name in rest)  # fusion and head as built
    assert report["left_out"] == len([n for n in source if n.startswith("fusion_head.")])


def test_warm_start_refuses_a_source_missing_or_reshaping_an_encoder_tensor(bench):
    source = _model(0, 4).state_dict()
    name = next(n for n in source if n.startswith("audio_encoder.") and n.endswith("weight"))
    partial = {k: v for k, v in source.items() if k != name}
    with pytest.raises(ValueError, match=rf"audio_encoder: .*missing \['{re.escape(name)}'\]"):
        bench.load_encoders(_model(1, 3), partial)
    wider = _model(0, 4, audio_width=8).state_dict()
    with pytest.raises(ValueError, match=r"audio_encoder: .*other shapes \['audio_encoder\."):
        bench.load_encoders(_model(1, 3), wider)


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
    assert "warm start from" in (tmp_path / "finetune_0" / "stdout.txt").read_text()
    assert "warm start from" not in (tmp_path / "scratch_0" / "stdout.txt").read_text()
    scratch = yaml.safe_load((tmp_path / "scratch_0" / "config.yaml").read_text())["trainer"]
    assert scratch["finetune"]["freeze"] == [] and scratch["optim"]["layer_decay"] is None
    changed = re.search(r"finetune: (\d+) of (\d+) encoder tensors differ", printed)
    assert changed and int(changed[1]) > 0  # released at unfreeze_at_step, then trained
    assert "mean val accuracy by step" in printed and "load time of a saved AST" in printed
    times = result["load_time"]
    assert times["hunter"] > 0 and times["from_pretrained"] > 0 and times["parameters"] > 0
