"""`sss.run.folder` owns the run folder: one numbering for fit, check and Ray; one verification per resume;
refusals raised as `RunFolderError` (the CLI prints the line `sss fit` always printed, exit 1)."""

from __future__ import annotations

import collections
import json
import subprocess
import sys
from pathlib import Path

import pytest

import sss.checkpoint
from sss.checkpoint import MARKER
from sss.cli import main
from sss.config import load_config
from sss.errors import RunFolderError
from sss.run.fit import run_fit
from sss.run.folder import claim_output_dir, planned_output_dir, ray_output_dir
from sss.testing import subprocess_env

CONFIG = """\
name: boring
model: {_target_: sss.testing.BoringModule}
data: {_target_: sss.testing.BoringDataModule, n_train: 16, n_val: 8, batch_size: 8}
trainer:
  max_epochs: 1
  log: {progress: false, trackers: [], plots: false}
"""
ONE_PROCESS = type("OneProcess", (), {"is_main_process": True, "num_processes": 1})()


def _fit(*args: str) -> int:
    Path("boring.yaml").write_text(CONFIG)
    return main(["fit", "boring.yaml", *args])


def test_fit_check_and_ray_number_a_taken_default_folder_alike():
    for taken in ("runs/boring", "runs/boring_1"):
        Path(taken).mkdir(parents=True)
        Path(taken, "results.json").write_text("{}")
    cfg = load_config(None, ["name=boring"])
    assert planned_output_dir(cfg) == ("runs/boring_2", "runs/boring")
    assert ray_output_dir(cfg, None) == Path("runs/boring_2")
    folder, lock = claim_output_dir(cfg, None, ONE_PROCESS)
    with lock:
        assert folder == "runs/boring_2" and Path(folder, ".sss.lock").is_file()


def test_a_resume_checks_each_file_of_its_checkpoint_once(monkeypatch):
    assert _fit("trainer.output_dir=run") == 0  # 2 steps: a checkpoint at the epoch's end
    ckpt = Path("run/checkpoints/step_0000002")
    listed = json.loads((ckpt / MARKER).read_text())["files"]
    checked: collections.Counter[str] = collections.Counter()
    crc32 = sss.checkpoint._crc32

    def counting(path: Path) -> str:
        if ckpt.resolve() in Path(path).resolve().parents:
            checked[Path(path).relative_to(ckpt).as_posix()] += 1
        return crc32(path)

    monkeypatch.setattr(sss.checkpoint, "_crc32", counting)
    assert _fit("trainer.output_dir=run", "trainer.max_epochs=2", "--resume") == 0
    assert checked == dict.fromkeys(listed, 1)  # the run folder's choice and the trainer's load: one check


def test_run_fit_raises_the_refusal_and_sss_fit_prints_its_line(capsys):
    Path("boring.yaml").write_text(CONFIG)
    cfg = load_config("boring.yaml", ["trainer.output_dir=run"])
    with pytest.raises(RunFolderError) as refused:  # from Python: an exception, not the end of the process
        run_fit(cfg, resume="latest")
    line = "error: --resume: no complete checkpoint in run/checkpoints; train without --resume first\n"
    assert f"error: {refused.value}\n" == line
    assert _fit("trainer.output_dir=run", "--resume") == 1
    assert capsys.readouterr().err == line
    command = [sys.executable, "-m", "sss", "fit", "boring.yaml", "trainer.output_dir=run", "--resume"]
    done = subprocess.run(command, capture_output=True, text=True, env=subprocess_env(), timeout=300)
    assert (done.returncode, done.stderr) == (1, line)  # the console's line and exit code, as before


def test_a_ray_worker_tells_ray_not_to_retry_a_run_folder_refusal(monkeypatch):
    import sss.run.fit
    from sss.run.ray_train import WorkerRefusal, _worker

    def refuse(*args: object, **kwargs: object) -> None:
        raise RunFolderError("--resume: run is a finished run: ...")

    monkeypatch.setattr(sss.run.fit, "run_fit", refuse)
    monkeypatch.delenv("RANK", raising=False)
    with pytest.raises(WorkerRefusal) as refusal:
        _worker({"cfg": load_config(None, []), "cwd": str(Path.cwd()), "every_n_steps": 1})
    assert (str(refusal.value), refusal.value.exit_code) == ("--resume: run is a finished run: ...", 1)
