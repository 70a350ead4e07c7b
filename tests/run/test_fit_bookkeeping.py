"""What `sss fit` records of a run is what ran: finished runs are not re-finished, segments time themselves."""

from __future__ import annotations

import json
import re
import subprocess
import time
from datetime import datetime, timezone
from pathlib import Path

import pytest

import sss
from sss.cli import main
from sss.model_folder import export_model
from sss.run import fit
from sss.testing import BoringDataset, BoringModule

CONFIG = """\
name: boring
model: {_target_: sss.testing.BoringModule}
data: {_target_: sss.testing.BoringDataModule, n_train: 16, n_val: 8, batch_size: 8}
trainer:
  output_dir: run
  max_epochs: 2
  log: {progress: false, trackers: []}
"""
RUN = Path("run")


def _fit(*args: str) -> int:
    Path("boring.yaml").write_text(CONFIG)
    return main(["fit", "boring.yaml", *args])


def _files(folder: Path) -> dict[str, tuple[bytes, int]]:
    # every file with its bytes and modification time; the folder lock comes and goes with each command
    return {
        str(p.relative_to(folder)): (p.read_bytes(), p.stat().st_mtime_ns)
        for p in sorted(folder.rglob("*"))
        if p.is_file() and p.name != ".sss.lock"
    }


def test_resuming_a_finished_run_is_refused_and_changes_no_file(capsys):
    assert _fit() == 0  # 2 epochs of 2 steps
    before = _files(RUN)
    results = json.loads((RUN / "results.json").read_text())
    assert {"val/accuracy_image_only", "val/accuracy_audio_only", "val/fusion_gain_accuracy"} <= set(results)
    capsys.readouterr()
    assert _fit("--resume") == 1
    assert capsys.readouterr().err == (
        "error: --resume: run is a finished run: run/checkpoints/step_0000004 is at its end (trainer.max_epochs=2 "
        "completed) and run/results.json holds its results. Nothing was trained and no file was changed. To train "
        "longer, raise the limit when resuming (it may grow): sss fit CONFIG trainer.max_epochs=4 --resume\n"
    )
    assert _files(RUN) == before

    # max_steps reached names max_steps (a given checkpoint path too)
    assert _fit("trainer.max_steps=4", "trainer.max_epochs=null", "--resume", "run/checkpoints/step_0000004") == 1
    err = capsys.readouterr().err
    assert re.search(r"\(trainer\.max_steps=4 reached at step 4\).*trainer\.max_steps=8 --resume", err), err
    assert _files(RUN) == before

    # raising the limit trains on; the first end's results stay beside the new ones
    capsys.readouterr()
    assert _fit("trainer.max_epochs=3", "--resume") == 0
    assert "sss: the results of the run's earlier end (step 4) are kept in run/results_step_0000004.json" in (
        capsys.readouterr().out
    )
    assert (RUN / "results_step_0000004.json").read_bytes() == before["results.json"][0]
    longer = json.loads((RUN / "results.json").read_text())
    assert (longer["global_step"], longer["segment_steps"], longer["epochs_completed"]) == (6, 2, 3)
    assert longer["resumed_from"] == "run/checkpoints/step_0000004"


def test_a_resume_at_the_end_without_results_finishes_the_run():
    # killed after its last checkpoint, before results.json: --resume trains nothing and writes the results
    assert _fit() == 0
    first = json.loads((RUN / "results.json").read_text())
    (RUN / "results.json").unlink()
    assert _fit("--resume") == 0
    results = json.loads((RUN / "results.json").read_text())
    for key in ("val/accuracy", "val/accuracy_image_only", "val/accuracy_audio_only", "val/fusion_gain_accuracy"):
        assert results[key] == pytest.approx(first[key])  # a fresh evaluation of the same weights
    assert (results["global_step"], results["segment_steps"], results["segment_samples"]) == (4, 0, 0)
    assert results["train_samples_per_second"] is None  # nothing trained: no rate, rather than a made-up one
    assert results["samples_total"] == first["samples_total"] == 32
    assert "val/accuracy_image_only" in (RUN / "model" / "README.md").read_text()


def test_a_resumed_segment_reports_its_own_throughput(monkeypatch):
    delay = 0.02  # every training and validation sample takes at least this long to load
    load = BoringDataset.__getitem__

    def slow(self, i):
        time.sleep(delay)
        return load(self, i)

    monkeypatch.setattr(BoringDataset, "__getitem__", slow)
    args = ["data.n_train=32", "data.n_val=4", "data.batch_size=4", "trainer.max_epochs=null"]
    args += [
        "trainer.checkpoint.every_n_steps=4",
        "trainer.checkpoint.every_epoch=false",
        "trainer.sanity_val_batches=0",
    ]
    assert _fit(*args, "trainer.max_steps=4") == 0  # stops mid-epoch (8 steps an epoch), checkpoint at step 4
    first = json.loads((RUN / "results.json").read_text())
    start = time.perf_counter()
    assert _fit(*args, "trainer.max_steps=8", "--resume") == 0
    elapsed = time.perf_counter() - start
    resumed = json.loads((RUN / "results.json").read_text())
    assert (resumed["segment_samples"], resumed["samples_total"], resumed["segment_steps"]) == (16, 32, 4)
    # max_steps ended both segments inside epoch 0 (the second at its last batch, before the epoch's end)
    assert (first["epochs_completed"], first["batches_into_epoch"]) == (0, 4)
    assert (resumed["epochs_completed"], resumed["batches_into_epoch"]) == (0, 8)
    seconds, rate = resumed["segment_seconds"], resumed["train_samples_per_second"]
    assert 16 * delay <= seconds <= elapsed
    assert rate == pytest.approx(16 / seconds, rel=0.02)  # this segment's 16 samples, not the 32 since step 0
    assert rate <= 1 / delay  # a sample never loads faster than its sleep
    assert rate == pytest.approx(first["train_samples_per_second"], rel=0.5)  # the same work at the same pace
    # the training time of both segments: the first one's up to its checkpoint, then this one's
    assert seconds < resumed["train_seconds_total"] <= first["segment_seconds"] + seconds + 0.01
    assert resumed["wall_seconds"] >= seconds


def test_results_and_model_card_record_what_ran():
    before = datetime.now(timezone.utc).replace(microsecond=0)
    assert _fit() == 0
    results = json.loads((RUN / "results.json").read_text())
    assert results["mixed_precision"] == "no"  # what the Accelerator used on the CPU, not the config's "auto"
    assert (results["global_step"], results["epochs_completed"], results["skipped_steps"]) == (4, 2, 0)
    assert (results["num_processes"], results["resumed_from"], results["sss_version"]) == (1, None, sss.__version__)
    finished = datetime.strptime(results["finished_at"], "%Y-%m-%dT%H:%M:%SZ").replace(tzinfo=timezone.utc)
    assert before <= finished <= datetime.now(timezone.utc)
    head = subprocess.run(
        ["git", "-C", str(Path(sss.__file__).parent), "rev-parse", "HEAD"], capture_output=True, text=True
    )
    if head.returncode == 0:  # this checkout is a git repository: the commit of the code that ran
        assert re.fullmatch(r"[0-9a-f]{40}(-dirty)?", results["git_commit"])
        assert results["git_commit"].split("-")[0] == head.stdout.strip()
    card = (RUN / "model" / "README.md").read_text()
    training = next(line for line in card.splitlines() if line.startswith("- training:"))
    assert training.startswith(
        "- training: 4 optimizer steps, 2 epoch(s) completed, 0 skipped steps, 32 samples on 1 process(es) "
        "(limits: 2 epochs max); precision no (fp32) (configured auto), accumulation 1,"
    )
    assert "None" not in training
    provenance = f"- sss {sss.__version__}" + (f", commit `{results['git_commit']}`" if "git_commit" in results else "")
    assert f"{provenance}, finished {results['finished_at']}" in card
    rows = [line.split(" | ")[0].removeprefix("| ") for line in card.splitlines() if line.startswith("| val/")]
    assert "val/fusion_gain_accuracy" in rows
    assert "segment_seconds" not in card and "train_samples_per_second" not in card  # timings are not metrics


def test_an_export_without_a_run_record_says_what_was_configured(tmp_path):
    from sss.config import SSSConfig

    cfg = SSSConfig(name="demo", model={"_target_": "sss.testing.BoringModule"})
    card = (export_model(BoringModule(), cfg, {"val/accuracy": 0.5}, tmp_path / "m") / "README.md").read_text()
    assert "- training: up to 10 epochs (as configured; the steps run are not recorded here); precision auto" in card
    assert re.search(rf"- sss {re.escape(sss.__version__)}, exported \d{{4}}-\d\d-\d\dT\d\d:\d\d:\d\dZ", card)
    assert "None" not in card.split("- training:")[1].split("\n")[0]


def test_the_code_commit_is_silently_absent_without_git(monkeypatch):
    def no_git(*args, **kwargs):
        raise FileNotFoundError("git")

    monkeypatch.setattr(fit.subprocess, "run", no_git)
    assert fit._code_commit() is None


def test_a_finished_run_with_a_lowered_limit_is_told_a_limit_beyond_its_checkpoint(tmp_path):
    # The suggestion must train longer than the checkpoint got, not twice a limit lowered below it.
    from sss.checkpoint import VerifiedCheckpoint
    from sss.config import load_config
    from sss.errors import RunFolderError
    from sss.run.folder import _refuse_finished_run

    ckpt = VerifiedCheckpoint(tmp_path / "checkpoints" / "step_0000008", {"global_step": 8, "resume_epoch": 1})
    (tmp_path / "results.json").write_text("{}")
    cfg = load_config(None, ["trainer.max_steps=4", "trainer.max_epochs=null"])
    with pytest.raises(RunFolderError, match=r"trainer\.max_steps=16 --resume"):
        _refuse_finished_run(tmp_path, ckpt, cfg)
