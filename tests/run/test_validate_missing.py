"""`sss validate` / `sss test --missing image=0.5`: the fused pass with a modality absent from a seeded fraction of
the samples, recorded in the JSON with the robustness report and its curve; a bad value is one line, exit code 2."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from sss.cli import main

CONFIG = """\
name: boring
model: {_target_: sss.testing.BoringModule}
data: {_target_: sss.testing.BoringDataModule, n_train: 16, n_val: 24, batch_size: 8}
trainer:
  output_dir: run
  max_epochs: 1
  log: {progress: false, trackers: []}
"""


@pytest.mark.parametrize(
    ("value", "said"),
    [
        ("image", "--missing 'image': write MODALITY=RATE, e.g. --missing image=0.5"),
        ("smell=0.5", "--missing smell=0.5: unknown modality 'smell'; choose image or audio"),
        ("audio=2", "--missing audio=2: the rate must be in [0, 1] (the fraction of samples)"),
        ("audio=half", "--missing audio=half: the rate must be a number in [0, 1]"),
    ],
)
def test_a_bad_missing_value_is_one_line_and_exit_code_2_before_anything_starts(value, said, capsys):
    # No config, no checkpoint and two processes asked for: the flag is checked before any of them is looked at.
    for command in ("validate", "test"):
        assert main([command, "--ckpt", "no/such/folder", "--num-processes", "2", "--missing", value]) == 2
        assert capsys.readouterr().err == f"error: {said}\n"


@pytest.fixture
def ckpt() -> str:
    Path("boring.yaml").write_text(CONFIG)
    assert main(["fit", "boring.yaml"]) == 0
    return json.loads(Path("run/results.json").read_text())["checkpoint_dir"]


def test_validate_with_missing_records_it_beside_the_report_and_its_curve(ckpt, capsys):
    assert main(["validate", "boring.yaml", "--ckpt", ckpt, "--missing", "image=0.5", "--output", "half.json"]) == 0
    out = capsys.readouterr().out
    assert "fusion gain" in out and "rate absent" in out  # the tables
    half = json.loads(Path("half.json").read_text())
    assert half["missing"] == {"image": 0.5} and half["samples"] == 24
    # The fused pass drew the samples the report's image row draws at 0.5: the same figures.
    assert half["metrics"]["loss"] == half["robustness"]["image"]["0.5"]["loss"]
    assert half["metrics"]["loss"] != half["robustness"]["image"]["0.0"]["loss"]  # something was absent
    assert Path("half_robustness.png").read_bytes().startswith(b"\x89PNG")

    # Repeatable, and without --missing nothing is absent; the default file names don't overwrite each other.
    argv = ["validate", "boring.yaml", "--ckpt", ckpt]
    assert main([*argv, "--missing", "image=0.5", "--missing", "audio=0.2", "--no-ablation"]) == 0
    assert main([*argv, "--no-ablation"]) == 0
    names = ("val_step_0000002", "val_step_0000002_1")
    both, plain = (json.loads(Path(f"run/eval/{name}.json").read_text()) for name in names)
    assert both["missing"] == {"image": 0.5, "audio": 0.2} and "robustness" not in both
    assert plain["missing"] == {} and plain["metrics"] != both["metrics"]
    assert not Path("run/eval/val_step_0000002_robustness.png").exists()  # --no-ablation: no report, no curve

    # An explicit --output whose curve exists is refused before anything runs.
    Path("taken_robustness.png").write_bytes(b"mine")
    capsys.readouterr()
    assert main(["validate", "boring.yaml", "--ckpt", ckpt, "--output", "taken.json"]) == 1
    assert "taken_robustness.png already exists" in capsys.readouterr().err
    assert Path("taken_robustness.png").read_bytes() == b"mine" and not Path("taken.json").exists()


@pytest.mark.slow
def test_missing_in_two_processes_gives_the_one_process_numbers(ckpt):
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    cmd = [sys.executable, "-m", "sss", "validate", "boring.yaml", "data.batch_size=5", "--ckpt", ckpt]
    for n in (1, 2):
        done = subprocess.run(
            [*cmd, "--num-processes", str(n), "--missing", "image=0.5", "--output", f"{n}.json"],
            capture_output=True,
            text=True,
            env=env,
            timeout=300,
        )
        assert done.returncode == 0, done.stderr[-3000:]
    one, two = (json.loads(Path(f"{n}.json").read_text()) for n in (1, 2))
    assert one["missing"] == two["missing"] == {"image": 0.5} and one["samples"] == two["samples"] == 24
    for key, value in one["metrics"].items():
        assert value == pytest.approx(two["metrics"][key], abs=1e-6), key
    for modality in ("image", "audio"):
        for rate, row in one["robustness"][modality].items():
            assert row == pytest.approx(two["robustness"][modality][rate], abs=1e-6), (modality, rate)
    assert Path("2_robustness.png").is_file()
