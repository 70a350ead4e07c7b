"""`sss validate` / `sss test`: a checkpoint or model folder evaluated, fused and per modality, into a JSON file."""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys
from pathlib import Path

import pytest

from sss.cli import main
from sss.evaluation import flat_results
from sss.run.folder import json_safe

ROOT = Path(__file__).parents[2]
EXAMPLE = str(ROOT / "examples" / "industrial.yaml")
SHORT = [
    "model.name=hunter_tiny",
    "model.num_event_classes=3",
    "model.mask_head=true",
    "data.n_train=32",
    "data.n_val=16",
    "data.n_test=12",
    "data.batch_size=8",
    "trainer.log.progress=false",
]


@pytest.mark.slow
def test_validate_and_test_a_checkpoint_and_a_model_folder(capsys):
    assert main(["fit", EXAMPLE, *SHORT, "trainer.max_steps=4"]) == 0
    fitted = json.loads(Path("runs/industrial/results.json").read_text())
    ckpt = fitted["checkpoint_dir"]
    capsys.readouterr()

    assert main(["validate", EXAMPLE, *SHORT, "--ckpt", ckpt]) == 0
    out = capsys.readouterr().out
    assert "fusion gain" in out and "image only" in out and "event_f1" in out and "ber" in out
    written = json.loads(Path("runs/industrial/eval/val_step_0000004.json").read_text())
    assert written["split"] == "val" and written["samples"] == 16 and written["checkpoint"] == ckpt
    assert sum(map(sum, written["confusion_matrix"])) == 16
    # the checkpoint holds the final weights: the same numbers as the end of fit
    for key in ("accuracy", "macro_f1", "loss", "event_f1", "segment_er", "ber"):
        assert written["metrics"][key] == pytest.approx(fitted[f"val/{key}"], abs=1e-6) or (
            written["metrics"][key] is None and math.isnan(fitted[f"val/{key}"])
        )
    assert fitted["val/accuracy_image_only"] == pytest.approx(written["ablation"]["image_only"]["accuracy"])

    # the exported model folder evaluates on the test split; the default file is never overwritten
    assert main(["test", EXAMPLE, *SHORT, "--ckpt", fitted["model_dir"], "--no-ablation"]) == 0
    assert main(["test", EXAMPLE, *SHORT, "--ckpt", fitted["model_dir"], "--no-ablation"]) == 0
    first, second = (
        json.loads(Path(f"runs/industrial/eval/{n}.json").read_text()) for n in ("test_model", "test_model_1")
    )
    assert first["samples"] == 12 and first["ablation"] == {} and first["metrics"] == second["metrics"]

    # two processes give the one-process numbers (16 samples in batches of 3: a padded last batch)
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    cmd = [sys.executable, "-m", "sss", "validate", EXAMPLE, *SHORT, "data.batch_size=3", "--ckpt", ckpt]
    for n, out in ((1, "one.json"), (2, "two.json")):
        done = subprocess.run(
            [*cmd, "--num-processes", str(n), "--output", out], capture_output=True, text=True, env=env
        )
        assert done.returncode == 0, done.stderr[-3000:]
    one, two = (json.loads(Path(name).read_text()) for name in ("one.json", "two.json"))
    assert one["samples"] == two["samples"] == 16 and one["confusion_matrix"] == two["confusion_matrix"]
    for key, value in one["metrics"].items():
        assert (value is None and two["metrics"][key] is None) or value == pytest.approx(two["metrics"][key], abs=1e-6)

    # an explicit --output that exists is refused; a folder without weights is named
    capsys.readouterr()
    assert main(["test", EXAMPLE, *SHORT, "--ckpt", ckpt, "--output", "runs/industrial/eval/test_model.json"]) == 1
    assert "already exists" in capsys.readouterr().err
    assert main(["validate", EXAMPLE, *SHORT, "--ckpt", "runs"]) == 1
    assert "holds no model.safetensors" in capsys.readouterr().err


def test_fusion_gain_is_an_improvement_also_for_lower_is_better_metrics():
    result = {
        "split": "test",
        "metrics": {"ber": 10.0, "accuracy": 0.7},
        "ablation": {"image_only": {"ber": 12.0, "accuracy": 0.8}, "audio_only": {"ber": 30.0, "accuracy": 0.4}},
    }
    flat = flat_results(result)
    assert flat["test/fusion_gain_ber"] == pytest.approx(2.0)  # 12 -> 10: better by 2 points
    assert flat["test/fusion_gain_accuracy"] == pytest.approx(-0.1)  # fusion lost to the image alone
    assert flat["test/ber_audio_only"] == 30.0


def test_undefined_metrics_become_json_null():
    assert json_safe({"a": [float("nan"), 1.0], "b": float("inf")}) == {"a": [None, 1.0], "b": None}


def test_an_undefined_single_modality_value_does_not_decide_the_fusion_gain():
    for image, audio in ((float("nan"), 0.6), (0.6, float("nan"))):
        result = {
            "split": "val",
            "metrics": {"event_f1": 0.7},
            "ablation": {"image_only": {"event_f1": image}, "audio_only": {"event_f1": audio}},
        }
        assert flat_results(result)["val/fusion_gain_event_f1"] == pytest.approx(0.1)


def test_after_evaluate_the_trainer_state_describes_the_fused_pass():
    from sss import SSSTrainer
    from sss.evaluation import evaluate
    from sss.testing import BoringModule, boring_loader

    trainer = SSSTrainer(mixed_precision="no", log={"progress": False, "trackers": []})
    result = evaluate(trainer, BoringModule(), dataloaders=boring_loader(n=12))
    assert set(result["ablation"]) == {"image_only", "audio_only"}
    assert trainer.state.eval_metrics == {f"val/{k}": v for k, v in result["metrics"].items()}


def test_the_ablation_zeroes_the_batch_keys_the_module_names():
    from torch.utils.data import DataLoader, default_collate

    from sss import SSSTrainer
    from sss.evaluation import evaluate
    from sss.testing import BoringDataset, BoringModule

    zeroed: list[tuple[bool, bool]] = []

    class Renamed(BoringModule):
        modality_keys = {"image": "frames", "audio": "wave"}  # noqa: RUF012

        def forward(self, batch):
            zeroed.append((bool(batch["frames"].abs().sum() == 0), bool(batch["wave"].abs().sum() == 0)))
            return super().forward(batch)

    def renamed(rows):
        batch = default_collate(rows)
        return {"frames": batch.pop("image"), "wave": batch.pop("audio"), **batch}

    trainer = SSSTrainer(mixed_precision="no", log={"progress": False, "trackers": []})
    loader = DataLoader(BoringDataset(12), batch_size=12, collate_fn=renamed)
    result = evaluate(trainer, Renamed(), dataloaders=loader)
    assert zeroed[:2] == [(False, True), (True, False)]  # image only, audio only: the other one absent throughout
    # then the robustness passes (rate 0, and a part of the samples absent) and the fused pass
    assert zeroed[2:] == [(False, False)] * 6
    assert set(result["ablation"]) == {"image_only", "audio_only"}
    assert result["ablation"]["image_only"] != result["metrics"] != result["ablation"]["audio_only"]


def test_a_stored_config_is_found_or_its_absence_named(tmp_path):
    from sss.config import ConfigError
    from sss.run.evaluate import load_stored_config

    ckpt = tmp_path / "step_0000001"
    ckpt.mkdir()
    (ckpt / "trainer_state.json").write_text("{}")  # an older checkpoint without the run's config
    with pytest.raises(ConfigError, match=r"holds no run config: .*sss test CONFIG --ckpt"):
        load_stored_config(ckpt, command="test")
    with pytest.raises(FileNotFoundError, match=r"neither an sss checkpoint .* nor a model folder"):
        load_stored_config(tmp_path)


def test_only_sss_own_parts_are_built_from_a_stored_config_without_trust():
    from sss.config import load_config
    from sss.run.evaluate import untrusted_parts

    safe = [
        "model._target_=sss.models.create_model",
        "model.name=hunter_tiny",
        "data._target_=sss.data.ManifestDataModule",
        "trainer.optim.optimizer._target_=torch.optim.SGD",
        "callbacks=[{_target_: sss.callbacks.LearningRateMonitor}]",
    ]
    assert untrusted_parts(load_config(None, safe)) == []
    unsafe = [
        "model._target_=sss.data.make_industrial",  # sss's own, but no model: building it would call it
        "data._target_=sss.testing.BoringDataModule",
        "trainer.optim.optimizer._target_=my_optim.Fast",  # only imported by the check, but that runs its module
    ]
    assert untrusted_parts(load_config(None, unsafe)) == [
        ("model._target_", "sss.data.make_industrial"),
        ("trainer.optim.optimizer._target_", "my_optim.Fast"),
    ]
