"""`trainer.resume: auto` / `sss fit --resume auto`: continue the run's own folder when it has a checkpoint, else
start fresh; after a kill -9 the continued run ends bitwise equal to an uninterrupted one (1 and 2 processes)."""

from __future__ import annotations

import contextlib
import json
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from sss.checkpoint import complete_checkpoints
from sss.cli import main
from sss.config import ConfigError
from sss.run.launch import launch_command
from sss.testing import subprocess_env

SCRIPTS = Path(__file__).parents[1] / "scripts"  # fit_pause.py: the Pause callback and a model with dropout
CONFIG = """\
name: auto
model: {_target_: fit_pause.DropoutBoring}
data: {_target_: sss.testing.BoringDataModule, n_train: 32, n_val: 8, batch_size: 4}
trainer:
  max_steps: 12
  gradient_accumulation_steps: 2
  log: {progress: false, trackers: [], plots: false}
  checkpoint: {every_n_steps: 2, keep_last: 2}
"""
ENV = subprocess_env(SCRIPTS, MKL_CBWR="AUTO,STRICT", OMP_NUM_THREADS="1")  # the checkout's sss, then scripts


@pytest.fixture(autouse=True)
def _scripts_importable(monkeypatch):
    monkeypatch.syspath_prepend(str(SCRIPTS))
    Path("run.yaml").write_text(CONFIG)


def _fit(*words: str) -> int:
    return main(["fit", "run.yaml", *words])


def test_auto_starts_fresh_then_continues_the_default_folder_itself(capsys):
    assert _fit("--resume", "auto", "trainer.max_steps=4") == 0
    out = capsys.readouterr().out
    assert "sss: --resume auto: no checkpoint in runs/auto/checkpoints yet; starting a fresh run" in out
    # the key does what the flag does; a requeued job continues runs/auto, never moves on to runs/auto_1
    assert _fit("trainer.resume=auto", "trainer.max_steps=8") == 0
    out = capsys.readouterr().out
    assert "sss: --resume auto: using runs/auto/checkpoints/step_0000004, the newest checkpoint that verifies" in out
    assert "(resuming runs/auto/checkpoints/step_0000004)" in out
    assert json.loads(Path("runs/auto/results.json").read_text())["global_step"] == 8
    assert not Path("runs/auto_1").exists()
    # without auto, a fresh run moves on as before; the flag wins over the key
    assert _fit("trainer.resume=auto", "--resume", "never", "trainer.max_steps=2") == 0
    assert Path("runs/auto_1/results.json").is_file()


def test_bare_resume_still_fails_without_a_checkpoint(capsys):
    assert _fit("--resume", "trainer.max_steps=2") == 1
    err = capsys.readouterr().err
    assert err.startswith("error: --resume: no complete checkpoint in runs/auto/checkpoints; train"), err
    assert not Path("runs/auto/checkpoints").exists() or not complete_checkpoints("runs/auto/checkpoints")


def test_auto_leaves_a_finished_run_to_the_finished_run_refusal(capsys):
    assert _fit("trainer.max_steps=4") == 0
    before = Path("runs/auto/results.json").read_text()
    capsys.readouterr()
    assert _fit("--resume", "auto", "trainer.max_steps=4") == 1
    err = capsys.readouterr().err
    assert re.match(r"error: --resume: runs/auto is a finished run: .*step_0000004 is at its end", err), err
    assert Path("runs/auto/results.json").read_text() == before


def test_auto_does_not_start_fresh_over_the_results_of_a_run_without_checkpoints(capsys):
    no_checkpoints = ["trainer.checkpoint.every_n_steps=null", "trainer.checkpoint.every_epoch=false"]
    assert _fit("trainer.output_dir=mine", "trainer.max_steps=2", *no_checkpoints) == 0
    before = Path("mine/results.json").read_text()
    capsys.readouterr()
    assert _fit("trainer.output_dir=mine", "trainer.max_steps=2", "trainer.resume=auto") == 1
    assert capsys.readouterr().err == (
        "error: --resume auto: mine holds a finished run (mine/results.json) but no checkpoint in mine/checkpoints "
        "to continue from. Nothing was trained and no file was changed; give this run another folder "
        "(trainer.output_dir), or move that one away\n"
    )
    assert Path("mine/results.json").read_text() == before


def test_auto_keeps_the_refusal_of_a_changed_math_field(capsys):
    assert _fit("trainer.max_steps=2") == 0
    capsys.readouterr()
    assert _fit("--resume", "auto", "trainer.max_steps=4", "trainer.optim.optimizer.lr=0.5") == ConfigError.exit_code
    assert "cannot resume runs/auto/checkpoints/step_0000002" in capsys.readouterr().err


# ---------------------------------------------------------------- kill -9, then auto (real processes)


def _start(cwd: Path, nproc: int, *words: str) -> subprocess.Popen:
    cwd.mkdir(parents=True, exist_ok=True)
    (cwd / "run.yaml").write_text(CONFIG)
    fit = ["-m", "sss", "fit", "run.yaml", "--resume", "auto", *words]
    command = [sys.executable, *fit] if nproc == 1 else launch_command(nproc, fit)  # accelerate launch -m sss fit
    env = {**ENV, "HF_HOME": str(cwd / "hf")}  # no Accelerate config file of the developer's
    log = (cwd / "output.txt").open("ab")
    return subprocess.Popen(command, cwd=cwd, env=env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)


def _output(cwd: Path) -> str:
    return (cwd / "output.txt").read_text()


def _finish(cwd: Path, nproc: int, *words: str) -> str:
    proc = _start(cwd, nproc, *words)
    assert proc.wait(timeout=240) == 0, _output(cwd)[-3000:]
    return _output(cwd)


def _descendants(pid: int) -> list[int]:
    parents = {}
    for stat in Path("/proc").glob("[0-9]*/stat"):
        with contextlib.suppress(OSError):
            parents[int(stat.parent.name)] = int(stat.read_text().rsplit(")", 1)[1].split()[1])
    found, frontier = [], [pid]
    while frontier:
        frontier = [child for child, parent in parents.items() if parent in frontier]
        found += frontier
    return found


def _kill9_at_pause(cwd: Path, nproc: int, pause: str, *words: str) -> None:
    # The run pauses at "epoch:batch" (fit_pause.Pause writes runs/auto/paused), then every process is killed.
    proc = _start(cwd, nproc, *words, f'callbacks=[{{_target_: fit_pause.Pause, at: "{pause}"}}]')
    deadline = time.monotonic() + 180
    while not (cwd / "runs" / "auto" / "paused").exists():
        assert proc.poll() is None, _output(cwd)[-3000:]
        assert time.monotonic() < deadline, "the run did not reach the pause"
        time.sleep(0.02)
    _kill9(proc)


def _kill9(proc: subprocess.Popen) -> None:
    # torchrun starts each worker in a session of its own: the launcher's group alone would leave them running
    workers = _descendants(proc.pid)
    os.killpg(proc.pid, signal.SIGKILL)
    for pid in workers:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)
    proc.wait(timeout=30)
    deadline = time.monotonic() + 30
    while any(Path(f"/proc/{pid}").exists() and _state(pid) not in ("Z", "X") for pid in workers):
        assert time.monotonic() < deadline, "the killed workers did not end"
        time.sleep(0.01)


def _state(pid: int) -> str:
    with contextlib.suppress(OSError):
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    return "X"


def _weights(cwd: Path) -> dict[str, torch.Tensor]:
    return load_file(str(cwd / "runs" / "auto" / "model" / "model.safetensors"))


@pytest.mark.slow
@pytest.mark.parametrize(
    ("nproc", "pause"),
    [(1, "1:2"), (2, "2:0")],  # inside the window of step 6 (1 process: 4 steps an epoch) / step 5 (2 processes: 2)
)
def test_kill9_then_auto_resume_ends_bitwise_equal_to_an_uninterrupted_run(tmp_path, nproc, pause):
    straight, killed = tmp_path / "straight", tmp_path / "killed"
    assert "starting a fresh run" in _finish(straight, nproc)
    _kill9_at_pause(killed, nproc, pause)
    assert complete_checkpoints(killed / "runs" / "auto" / "checkpoints")[-1].name == "step_0000004"
    out = _finish(killed, nproc)  # what the requeued job runs: the same command, --resume auto
    assert "sss: --resume auto: using runs/auto/checkpoints/step_0000004, the newest checkpoint that verifies" in out
    assert not (killed / "runs" / "auto_1").exists()
    a, b = _weights(killed), _weights(straight)
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a), "weights differ from the straight run"
    results = json.loads((killed / "runs" / "auto" / "results.json").read_text())
    assert results["global_step"] == 12 and results["num_processes"] == nproc


@pytest.mark.slow
@pytest.mark.parametrize("unfreeze", [3, 4, 5], ids=["after", "at", "before"])  # vs the checkpoint of step 4
def test_kill9_then_auto_resume_across_an_unfreeze_is_bitwise_the_straight_run(tmp_path, unfreeze):
    # A backbone re-frozen (or never frozen) after a resume trains other weights (Lightning #21901).
    words = [
        "trainer.finetune.freeze=[audio_encoder]",
        f"trainer.finetune.unfreeze_at_step={unfreeze}",
        "trainer.optim.layer_decay=0.75",
    ]
    straight, killed = tmp_path / "straight", tmp_path / "killed"
    _finish(straight, 1, *words)
    _kill9_at_pause(killed, 1, "1:2", *words)
    assert complete_checkpoints(killed / "runs" / "auto" / "checkpoints")[-1].name == "step_0000004"
    assert "runs/auto/checkpoints/step_0000004" in _finish(killed, 1, *words)
    a, b = _weights(killed), _weights(straight)
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a), "weights differ from the straight run"
