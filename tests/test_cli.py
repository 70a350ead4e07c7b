"""`sss fit` end to end on shortened runs: results.json, export, output folders, resume, two processes."""

from __future__ import annotations

import csv
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from sss.cli import main

ROOT = Path(__file__).parents[1]
EXAMPLE = str(ROOT / "examples" / "industrial.yaml")
SHORT = [
    "model.name=hunter_tiny",
    "data.n_train=48",
    "data.n_val=16",
    "data.n_test=8",
    "data.batch_size=8",
    "trainer.log.progress=false",
]
KEYS = {
    "val/accuracy",
    "val/accuracy_image_only",
    "val/accuracy_audio_only",
    "val/macro_f1",
    "wall_seconds",
    "train_samples_per_second",
    "checkpoint_dir",
    "model_dir",
}


@pytest.mark.slow
def test_fit_writes_results_export_and_moves_on_to_a_fresh_folder(capsys):
    assert main(["fit", EXAMPLE, *SHORT, "trainer.max_steps=4"]) == 0
    out = capsys.readouterr().out
    assert "fused and per modality" in out and "fusion gain" in out and "accuracy" in out
    results = json.loads(Path("runs/industrial/results.json").read_text())
    assert set(results) >= KEYS
    assert not any(k.startswith(("val_image_only/", "val_audio_only/")) for k in results)  # headline rows only
    assert "val_image_only" not in out
    assert Path(results["checkpoint_dir"], "trainer_state.json").is_file()
    model_dir = Path(results["model_dir"])
    assert {p.name for p in model_dir.iterdir()} == {
        "model.safetensors",
        "config.yaml",
        "preprocessing.json",
        "README.md",
    }
    assert Path("runs/industrial/config.yaml").read_text().count("hunter_tiny") == 1
    assert Path("runs/industrial/logs/metrics.csv").is_file()
    prep = json.loads((model_dir / "preprocessing.json").read_text())
    assert prep["classes"] == ["idle", "fault", "passerby", "collision"] and prep["sample_rate"] == 16000

    # sss predict on a fresh manifest (labels dropped): one row per sample, probabilities sum to 1
    assert main(["data", "make", "industrial", "new", "--n", "10"]) == 0
    rows = Path("new/val.csv").read_text().splitlines()
    Path("new/unlabelled.csv").write_text("\n".join(",".join(r.split(",")[:2]) for r in rows) + "\n")
    assert main(["predict", str(model_dir), "--input", "new/unlabelled.csv", "--output", "preds.csv"]) == 0
    with Path("preds.csv").open() as f:
        preds = list(csv.DictReader(f))
    assert len(preds) == len(rows) - 1 and preds[0]["row"] == "2" and preds[0]["image"].startswith("images/")
    for row in preds:
        probs = [float(row[f"prob_{c}"]) for c in prep["classes"]]
        assert abs(sum(probs) - 1) < 1e-4 and row["prediction"] == prep["classes"][probs.index(max(probs))]
    assert main(["predict", str(model_dir), "--input", "new/unlabelled.csv", "--output", "preds.csv"]) == 1
    assert "already exists" in capsys.readouterr().err

    # the same command again never writes into the first run's folder
    assert main(["fit", EXAMPLE, *SHORT, "trainer.max_steps=4"]) == 0
    assert Path("runs/industrial_1/results.json").is_file()

    # --resume continues the newest run: step numbering goes on from its checkpoint
    assert main(["fit", EXAMPLE, *SHORT, "trainer.max_steps=8", "--resume"]) == 0
    resumed = json.loads(Path("runs/industrial_1/results.json").read_text())
    assert resumed["global_step"] == 8
    assert resumed["checkpoint_dir"].endswith("step_0000008")
    assert json.loads(Path("runs/industrial/results.json").read_text())["global_step"] == 4  # untouched
    # the resumed run grew max_steps: its first config stays, the resume's is recorded beside it
    assert "max_steps: 4" in Path("runs/industrial_1/config.yaml").read_text()
    assert "max_steps: 8" in Path("runs/industrial_1/config_resumed_step_0000004.yaml").read_text()


def test_resume_without_a_checkpoint_says_so(capsys):
    with pytest.raises(SystemExit, match="no complete checkpoint"):
        main(["fit", EXAMPLE, *SHORT, "--resume"])


def test_explicit_output_dir_with_checkpoints_is_refused(tmp_path, capsys):
    ckpt = tmp_path / "mine" / "checkpoints" / "step_0000003"
    ckpt.mkdir(parents=True)
    (ckpt / "trainer_state.json").write_text("{}")
    assert main(["fit", EXAMPLE, *SHORT, "trainer.max_steps=2", f"trainer.output_dir={tmp_path / 'mine'}"]) == 1
    assert "already holds checkpoints" in capsys.readouterr().err
    assert (ckpt / "trainer_state.json").read_text() == "{}"  # untouched


@pytest.mark.slow
def test_fit_with_two_processes(tmp_path):
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    cmd = [sys.executable, "-m", "sss", "fit", EXAMPLE, *SHORT, "trainer.max_steps=3", "--num-processes", "2"]
    done = subprocess.run(cmd, cwd=tmp_path, capture_output=True, text=True, timeout=600, env=env)
    assert done.returncode == 0, done.stderr[-4000:]
    results = json.loads((tmp_path / "runs" / "industrial" / "results.json").read_text())
    assert results["global_step"] == 3 and set(results) >= KEYS


def test_unknown_command_and_bad_config_exit_codes(tmp_path, capsys):
    with pytest.raises(SystemExit) as exc:
        main(["frobnicate"])
    assert exc.value.code == 2
    assert main(["fit", EXAMPLE, "trainer.max_steps=-1"]) == 2
    assert "trainer.max_steps must be >= 1" in capsys.readouterr().err


def test_data_make_sizes_and_settings(tmp_path):
    out = tmp_path / "d"
    assert main(["data", "make", "industrial", str(out), "--n", "6", "--n-val", "2", "--n-test", "0"]) == 0
    assert len((out / "train.csv").read_text().splitlines()) == 7 and not (out / "test.csv").exists()
    assert main(["data", "make", "industrial", str(tmp_path / "s"), "--n", "2", "--image-size", "32"]) == 0
    from PIL import Image

    assert Image.open(next((tmp_path / "s" / "images").iterdir())).size == (32, 32)


@pytest.mark.slow
def test_manifest_example_trains_on_audio_only_data_and_predicts(tmp_path, capsys):
    import numpy as np
    import soundfile as sf

    root = tmp_path / "ESC-50-master"
    (root / "audio").mkdir(parents=True)
    rows = ["filename,fold,target,category,esc10,src_file,take"]
    t = np.arange(8000) / 16000
    for fold in (1, 2, 3, 4, 5):
        for target, (category, hz) in enumerate((("dog", 300), ("rooster", 1200), ("rain", 2500))):
            name = f"{fold}-1000{target}-A-{target}.wav"
            sf.write(root / "audio" / name, 0.3 * np.sin(2 * np.pi * hz * t), 16000)
            rows.append(f"{name},{fold},{target},{category},True,1000{target},A")
    (root / "meta").mkdir()
    (root / "meta" / "esc50.csv").write_text("\n".join(rows) + "\n")
    example = str(ROOT / "examples" / "manifest.yaml")
    overrides = [f"data.root={root}", "data.layout=esc50", "data.num_workers=0", "data.batch_size=4"]
    overrides += ["model.name=hunter_tiny", "trainer.max_steps=3", "trainer.log.progress=false"]
    assert main(["fit", example, *overrides]) == 0
    out = capsys.readouterr().out
    assert "model.num_classes=3" in out and "model.modalities=['audio']" in out and "model.fusion=late" in out
    model_dir = Path("runs/manifest/model")
    assert "audio" in Path(model_dir, "config.yaml").read_text()
    (root / "new.csv").write_text("audio\naudio/1-10000-A-0.wav\naudio/2-10002-A-2.wav\n")
    assert main(["predict", str(model_dir), "--input", str(root / "new.csv"), "--output", "p.csv"]) == 0
    lines = Path("p.csv").read_text().splitlines()
    assert lines[0] == "row,image,audio,prediction,prob_dog,prob_rooster,prob_rain" and len(lines) == 3
