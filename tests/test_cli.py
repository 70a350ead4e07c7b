"""`sss fit` end to end on shortened runs: results.json, export, output folders, resume, two processes."""

from __future__ import annotations

import csv
import json
import os
import re
import subprocess
import sys
from pathlib import Path
from typing import Literal

import pytest

from sss.cli import main

ROOT = Path(__file__).parents[1]
Tone = Literal["warm", "cool"]
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
    assert main(["fit", EXAMPLE, *SHORT, "--resume"]) == 1
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("error: --resume: no complete checkpoint in "), err


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


# ------------------------------------------------------------------ the command line a newcomer types
BORING_YAML = """\
trainer: {max_steps: 3, log: {progress: false, trackers: []}}
model: {_target_: sss.testing.BoringModule}
data: {_target_: sss.testing.BoringDataModule}
"""


def _boring_run(name: str = "boring", *overrides: str) -> Path:
    """A 3-step BoringModule run in runs/<name> (about a second); the path of its checkpoint."""
    Path(f"{name}.yaml").write_text(BORING_YAML)
    assert main(["fit", f"{name}.yaml", *overrides]) == 0
    return Path(json.loads(Path(f"runs/{name}/results.json").read_text())["checkpoint_dir"])


def test_overrides_are_taken_as_flags_too_anywhere_on_the_line(capsys):
    argv = ["config", EXAMPLE, "--trainer.max_steps=5", "--trainer.seed", "3", "--data.batch_size=4", "name=x"]
    assert main(argv) == 0
    out = capsys.readouterr().out
    assert "max_steps: 5" in out and "seed: 3" in out and "batch_size: 4" in out and "name: x" in out
    # sss fit takes them the same way (the check fails before anything is built)
    assert main(["fit", EXAMPLE, "--trainer.max_steps=-1"]) == 2
    assert "trainer.max_steps must be >= 1" in capsys.readouterr().err
    assert main(["check", EXAMPLE, "--trainer.max_steps"]) == 2  # no value: the key=value advice
    assert "write overrides as key=value" in capsys.readouterr().err
    with pytest.raises(SystemExit) as exc:  # a flag that is no config key stays an error
        main(["check", EXAMPLE, "--trainer-max-steps=5"])
    assert exc.value.code == 2 and "unrecognized arguments: --trainer-max-steps=5" in capsys.readouterr().err


def test_a_config_path_after_resume_is_the_config(capsys):
    assert main(["fit", "--resume", EXAMPLE, *SHORT]) == 1
    assert "no complete checkpoint" in capsys.readouterr().err  # it got as far as looking for checkpoints


def greet(name: str, overrides: list[str], times: int = 1, loud: bool = False, tone: Tone = "warm") -> int:
    """Greet NAME.

    Args:
        times: how often
        tone: how it sounds
    """
    print(" ".join([f"hello {name}"] * times) + ("!" if loud else ""), tone, overrides)
    return 3


def test_a_subcommand_is_one_typed_function_and_one_row(monkeypatch, capsys):
    import sss.cli

    row = sss.cli.Command(greet, ("name",), "NAME key=value", "NAME: who; then overrides", "sss greet NAME [...]")
    monkeypatch.setitem(sss.cli.COMMANDS, "greet", row)
    assert main(["greet", "ada", "--times", "2", "a.b=1", "--loud", "--tone", "cool"]) == 3
    assert capsys.readouterr().out == "hello ada hello ada! cool ['a.b=1']\n"
    with pytest.raises(SystemExit):
        main(["greet", "--help"])
    out = capsys.readouterr().out
    assert out.startswith("usage: sss greet NAME [...]\n\nGreet NAME.\n") and "Args:" not in out
    assert re.search(r"--times TIMES +how often\n", out) and re.search(r"--tone \{warm,cool\} +how it sounds\n", out)
    with pytest.raises(SystemExit):
        main(["greet", "ada", "--tone", "loud"])  # not one of the Literal's choices
    assert "argument --tone: invalid choice: 'loud'" in capsys.readouterr().err


def test_version(capsys):
    with pytest.raises(SystemExit) as exc:
        main(["--version"])
    out = capsys.readouterr().out
    assert exc.value.code == 0 and out.startswith("sss 0.1.0 (torch ") and "accelerate " in out


MY_MODULE = """\
from sss.testing import BoringModule


class MyModel(BoringModule):
    \"\"\"My own model.

    Args:
        dim: Width of my features.
        num_classes: How many classes I tell apart.
    \"\"\"
"""


def test_a_target_in_the_working_directory_imports(tmp_path, capsys, monkeypatch):
    name = f"mymodule_{tmp_path.name}"  # a fresh module name: sys.modules keeps what a test imported
    monkeypatch.setattr(sys, "path", [p for p in sys.path if p not in ("", ".", str(tmp_path))])
    Path(f"{name}.py").write_text(MY_MODULE)
    Path("my.yaml").write_text(BORING_YAML.replace("sss.testing.BoringModule", f"{name}.MyModel"))
    assert main(["check", "my.yaml"]) == 0, capsys.readouterr().err
    assert str(tmp_path) not in sys.path  # taken off again after the command
    assert main(["check", "my.yaml", "model._target_=nosuchmodule_here.MyModel"]) == 2
    err = capsys.readouterr().err
    assert "no module named 'nosuchmodule_here'" in err and f"the working directory {tmp_path}" in err
    # the console script, whose own sys.path does not hold the working directory
    sss = Path(sys.executable).with_name("sss")
    done = subprocess.run([str(sss), "check", "my.yaml"], cwd=tmp_path, capture_output=True, text=True)
    assert done.returncode == 0, done.stderr


def test_fit_help_with_a_config_shows_the_arguments_of_its_model_and_data(tmp_path, capsys, monkeypatch):
    with pytest.raises(SystemExit):
        main(["fit", EXAMPLE, "--help"])
    out = capsys.readouterr().out
    assert "model.num_classes: int = 4   [set: 4]" in out and "Number of clip classes (logits)." in out
    assert "-> HunterModule" in out and "data.batch_size: PositiveInt = 32   [set: 32]" in out
    assert "data.n_train" in out and "trainer.max_grad_norm" in out  # the schema's fields stay
    name = f"helpmodule_{tmp_path.name}"
    Path(f"{name}.py").write_text(MY_MODULE.replace("BoringModule):", "BoringModule):  # noqa"))
    Path("my.yaml").write_text(BORING_YAML.replace("sss.testing.BoringModule", f"{name}.MyModel"))
    with pytest.raises(SystemExit):
        main(["fit", "my.yaml", "--help"])
    out = capsys.readouterr().out
    assert f"model: {name}.MyModel" in out and "model.dim: int = 8" in out and "Width of my features." in out


def test_validate_test_export_read_the_config_stored_with_the_checkpoint(capsys):
    ckpt = _boring_run()
    capsys.readouterr()
    assert main(["validate", "--ckpt", str(ckpt), "--no-ablation"]) == 0  # no CONFIG: the checkpoint's own
    assert json.loads(Path("runs/boring/eval/val_step_0000003.json").read_text())["samples"] == 16
    assert main(["validate", "--ckpt", str(ckpt), "data.n_val=8", "--no-ablation"]) == 0  # overrides over it
    assert json.loads(Path("runs/boring/eval/val_step_0000003_1.json").read_text())["samples"] == 8
    assert main(["validate", "boring.yaml", "--ckpt", str(ckpt), "--data.n_val", "4", "--no-ablation"]) == 0
    assert json.loads(Path("runs/boring/eval/val_step_0000003_2.json").read_text())["samples"] == 4
    assert main(["validate", "--ckpt", "runs/boring/model", "--no-ablation"]) == 0  # a model folder's config.yaml
    assert main(["export", "out", "--ckpt", str(ckpt)]) == 0  # OUT alone: the checkpoint's config
    assert Path("out/model.safetensors").is_file() and "BoringModule" in Path("out/config.yaml").read_text()
    assert main(["export", "boring.yaml", "out2", "--ckpt", str(ckpt)]) == 0  # CONFIG OUT, as before
    capsys.readouterr()
    assert main(["export", "boring.yaml", "--ckpt", str(ckpt)]) == 2  # OUT forgotten: not written over the YAML
    assert "looks like a config file" in capsys.readouterr().err and Path("boring.yaml").is_file()
    assert main(["validate", "--ckpt", str(ckpt), "trainer.lr=1"]) == 2
    assert "Did you mean trainer.optim.optimizer.lr?" in capsys.readouterr().err


def test_a_stored_config_naming_code_outside_sss_is_refused_before_importing_it(tmp_path, capsys):
    ckpt = _boring_run()
    name = f"evilmodule_{tmp_path.name}"
    Path(f"{name}.py").write_text("raise SystemExit('imported!')\n")
    marker = ckpt / "trainer_state.json"
    meta = json.loads(marker.read_text())
    meta["config"]["data"]["_target_"] = f"{name}.Data"
    marker.write_text(json.dumps(meta))
    capsys.readouterr()
    assert main(["validate", "--ckpt", str(ckpt)]) == 2
    err = capsys.readouterr().err
    assert f"data._target_: {name}.Data" in err and "--trust-code" in err and "sss validate CONFIG --ckpt" in err
    assert name not in sys.modules
    folder = Path("runs/boring/model")
    (folder / "config.yaml").write_text((folder / "config.yaml").read_text().replace("sss.testing.BoringModule", name))
    assert main(["export", "out", "--ckpt", str(ckpt)]) == 2 and main(["test", "--ckpt", str(folder)]) == 2
    assert name not in sys.modules
    # a config you give is yours: the checkpoint's own config is not read
    assert main(["validate", "boring.yaml", "--ckpt", str(ckpt), "--no-ablation"]) == 0


def _outside_folder_manifest() -> None:
    import numpy as np
    import soundfile as sf
    from PIL import Image

    Path("files").mkdir()
    Image.fromarray(np.zeros((16, 16, 3), dtype=np.uint8)).save("files/a.png")
    sf.write("files/a.wav", np.zeros(16), 16)
    Path("files/broken.wav").write_bytes(b"not a wav")
    Path("in").mkdir()
    Path("in/m.csv").write_text("image,audio\n../files/a.png,../files/a.wav\n../files/a.png,../files/broken.wav\n")


def test_predict_takes_the_overrides_its_errors_advise(capsys):
    from sss.config import SSSConfig
    from sss.model_folder import export_model
    from sss.testing import BoringModule

    cfg = SSSConfig(name="b", model={"_target_": "sss.testing.BoringModule"})
    export_model(BoringModule(), cfg, {}, "m")
    Path("m/preprocessing.json").write_text(
        json.dumps({"classes": ["a", "b"], "image_size": 4, "sample_rate": 16, "clip_seconds": 1.0})
    )
    _outside_folder_manifest()
    assert main(["predict", "m", "--input", "in/m.csv", "--output", "p.csv"]) == 1
    assert "set data.allow_outside_root=true" in capsys.readouterr().err
    outside = ["--input", "in/m.csv", "data.allow_outside_root=true"]
    assert main(["predict", "m", *outside, "--output", "p.csv"]) == 1  # now the broken file: on_error advised
    assert "set data.on_error=skip" in capsys.readouterr().err
    assert main(["predict", "m", *outside, "--output", "p.csv", "--data.on_error", "skip"]) == 0
    lines = Path("p.csv").read_text().splitlines()
    assert lines[0] == "row,image,audio,prediction,prob_a,prob_b" and len(lines) == 2 and lines[1].startswith("2,")
    assert "1 row(s) of in/m.csv could not be read" in capsys.readouterr().out
    assert "broken.wav" in Path("p.skipped.csv").read_text()
    assert main(["predict", "m", "--input", "in/m.csv", "--output", "q.csv", "trainer.max_steps=5"]) == 2
    assert "override 'trainer.max_steps=5': sss predict reads only the --input manifest" in capsys.readouterr().err
    assert main(["predict", "m", "--input", "in/m.csv", "--output", "q.csv", "--model.dim=16"]) == 1
    assert "does not fit the model" in capsys.readouterr().err  # model.* rebuilds, and the weights must fit it
    assert main(["predict", "m", "--input", "in/m.csv", "--output", "q.csv", "model._target_=os.system"]) == 2
    assert "model._target_: os.system" in capsys.readouterr().err  # the allowlist applies to the result


def test_an_explicit_output_dir_equal_to_the_default_is_never_moved_on(capsys):
    _boring_run()
    assert main(["config", "boring.yaml"]) == 0  # the default moves on: sss config says where to
    out = capsys.readouterr().out
    assert "output_dir: runs/boring_1" in out and "runs/boring holds a run" in out
    assert main(["config", "boring.yaml", "trainer.output_dir=runs/boring"]) == 0
    assert "output_dir: runs/boring\n" in capsys.readouterr().out
    assert main(["fit", "boring.yaml", "trainer.output_dir=runs/boring"]) == 1  # given: refused, not moved
    assert "runs/boring already holds a finished run" in capsys.readouterr().err
    assert not Path("runs/boring_1").exists()
    assert main(["fit", "boring.yaml"]) == 0 and Path("runs/boring_1/results.json").is_file()  # the default moves on
