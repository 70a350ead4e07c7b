"""A stop that stops: a signal during a validation or the final evaluation ends the run at the next safe
point (after the current evaluation batch) with the checkpoint it promised, the documented exit code and
the resume command; SIGHUP (a closed terminal, a dropped ssh session) is a stop like SIGTERM."""

from __future__ import annotations

import json
import os
import pty
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch

from sss import Callback, SSSTrainer
from sss.callbacks.checkpoint import Preempted
from sss.callbacks.stock import add_stock_callbacks
from sss.checkpoint import complete_checkpoints
from sss.cli import main
from sss.testing import BoringModule, boring_loader, subprocess_env

SCRIPTS = Path(__file__).parents[1] / "scripts"  # fit_signal.py (a signal at a chosen pass), fit_pause.py
CONFIG = """\
name: stop
model: {_target_: fit_pause.DropoutBoring}
data: {_target_: sss.testing.BoringDataModule, n_train: 32, n_val: 16, batch_size: 4}
trainer:
  max_epochs: 2
  output_dir: run
  log: {progress: false, trackers: [], plots: false}
  checkpoint: {every_epoch: true, keep_last: 3}
"""
RESUME_LINE = "Resume with: sss fit CONFIG --resume (the same config and overrides)"


@pytest.fixture(autouse=True)
def _scripts_importable(monkeypatch):
    monkeypatch.syspath_prepend(str(SCRIPTS))
    Path("run.yaml").write_text(CONFIG)


def _signal_at(validation: int, name: str = "SIGTERM") -> str:
    return f"callbacks=[{{_target_: fit_signal.SignalAt, name: {name}, validation: {validation}}}]"


# ---------------------------------------------------------------- sss fit: the last validation, the final evaluation
def test_sigterm_in_the_last_validation_saves_and_exits_143_without_the_final_evaluation(capsys):
    # 8 steps an epoch; validations: 1 after epoch 0, 2 after epoch 1 (the last), then the final evaluation's
    assert main(["fit", "run.yaml", _signal_at(2)]) == 128 + signal.SIGTERM
    out, err = capsys.readouterr()
    assert "sss: SIGTERM: finishing this evaluation batch, then saving a checkpoint" in out
    assert err.strip().splitlines()[-1] == (
        "sss: stopped by SIGTERM after step 16, during validation; checkpoint saved to run/checkpoints/step_0000016. "
        + RESUME_LINE
    )
    assert [p.name for p in complete_checkpoints("run/checkpoints")] == ["step_0000008", "step_0000016"]
    saved = json.loads(Path("run/checkpoints/step_0000016/trainer_state.json").read_text())
    assert saved["resume_epoch"] == 2 and saved["resume_batch"] == 0  # the epoch is complete
    assert not Path("run/results.json").exists() and not Path("run/model").exists()  # no final evaluation, no export
    assert "fused and per modality" not in out
    # the resume trains nothing more and runs the final evaluation the stop cut short
    assert main(["fit", "run.yaml", "--resume"]) == 0
    results = json.loads(Path("run/results.json").read_text())
    assert results["resumed_from"] == "run/checkpoints/step_0000016" and results["segment_steps"] == 0
    assert "val/accuracy_image_only" in results and Path("run/model/model.safetensors").is_file()


def test_sigterm_in_the_final_evaluation_saves_and_exits_143_without_results(capsys):
    assert main(["fit", "run.yaml", _signal_at(3)]) == 128 + signal.SIGTERM  # 3: the image-only ablation pass
    out, err = capsys.readouterr()
    assert err.strip().splitlines()[-1] == (
        "sss: stopped by SIGTERM after step 16, during the final evaluation; checkpoint saved to "
        "run/checkpoints/step_0000016. " + RESUME_LINE
    )
    assert not Path("run/results.json").exists() and not Path("run/model").exists()
    assert "fused and per modality" not in out and "sss fit stop: results" not in out


# ---------------------------------------------------------------- the trainer: left after the current batch
class _Counting(BoringModule):
    def __init__(self) -> None:
        super().__init__()
        self.validation_batches = 0

    def validation_step(self, batch, batch_idx):
        self.validation_batches += 1
        return super().validation_step(batch, batch_idx)


class _SignalInPass(Callback):
    """Sends SIGTERM at the start of the `nth` validation pass; records the passes that ended."""

    def __init__(self, nth: int) -> None:
        self.nth, self.started, self.ended, self.batches_before = nth, 0, 0, 0

    def on_validation_start(self, trainer, module):
        self.started += 1
        if self.started == self.nth:
            self.batches_before = getattr(module, "validation_batches", 0)
            os.kill(os.getpid(), signal.SIGTERM)

    def on_validation_end(self, trainer, module):
        self.ended += 1


def _trainer(out: Path, callbacks, **overrides) -> SSSTrainer:
    settings = dict(mixed_precision="no", output_dir=str(out), log={"progress": False, "trackers": []})
    return add_stock_callbacks(SSSTrainer(callbacks=callbacks, **{**settings, **overrides}))


def test_a_validation_is_left_after_its_current_batch_and_nothing_of_it_is_kept(tmp_path):
    module, spy = _Counting(), _SignalInPass(nth=2)
    trainer = _trainer(tmp_path, [spy], max_epochs=3)
    data = {"train_dataloaders": boring_loader(n=32), "val_dataloaders": boring_loader(n=64, seed=1)}  # 8 batches
    with pytest.raises(Preempted, match=r"stopped by SIGTERM after step 8, during validation; checkpoint saved"):
        trainer.fit(module, **data)
    assert module.validation_batches - spy.batches_before == 1  # one batch of 8, then the safe point
    assert spy.ended == 1  # the cut pass reported nothing (no VALIDATION_END, no metrics, no ranking)
    assert trainer.state.global_step == 8 and trainer.state.stage == "fit"
    assert Path(trainer.state.last_checkpoint).name == "step_0000008"


class _Dropout(BoringModule):
    def __init__(self) -> None:
        super().__init__()
        self.image_encoder = torch.nn.Sequential(torch.nn.Flatten(), torch.nn.Linear(48, 8), torch.nn.Dropout(0.3))


def test_a_stop_in_a_step_validation_resumes_bitwise(tmp_path):
    # trainer.val_every_n_steps validates mid-epoch and restores the RNG after: the stop saves at that
    # step's BATCH_END with the RNG of the uninterrupted run, so the resume continues it exactly.
    settings = dict(max_steps=12, val_every_n_steps=3, checkpoint={"every_epoch": False, "every_n_steps": 100})

    def data():
        return {"train_dataloaders": boring_loader(n=64, shuffle=True), "val_dataloaders": boring_loader(n=16, seed=1)}

    torch.manual_seed(0)
    straight = _Dropout()
    _trainer(tmp_path / "straight", [], **settings).fit(straight, **data())
    torch.manual_seed(0)
    with pytest.raises(Preempted, match=r"after step 6, during validation; checkpoint saved to .*step_0000006"):
        _trainer(tmp_path / "stopped", [_SignalInPass(nth=2)], **settings).fit(_Dropout(), **data())
    torch.manual_seed(0)
    resumed = _Dropout()
    ckpt = tmp_path / "stopped" / "checkpoints" / "step_0000006"
    _trainer(tmp_path / "stopped", [], **settings).fit(resumed, **data(), ckpt_path=ckpt)
    assert all(torch.equal(a, b) for a, b in zip(resumed.parameters(), straight.parameters(), strict=True))


# ---------------------------------------------------------------- SIGHUP: the terminal is gone
def test_sighup_with_the_terminal_gone_saves_and_exits_129(tmp_path):
    # stdout is a terminal that is closed before the SIGHUP arrives (as when an ssh session drops):
    # writing to it fails; the run still saves, and says so on stderr (a file here), with SIGTERM's rule 128 + N.
    master, slave = pty.openpty()
    pause = 'callbacks=[{_target_: fit_pause.Pause, at: "0:5"}]'
    env = subprocess_env(SCRIPTS, MKL_CBWR="AUTO,STRICT", OMP_NUM_THREADS="1")
    with open("stderr.txt", "wb") as err:
        run = subprocess.Popen(
            [sys.executable, "-m", "sss", "fit", "run.yaml", pause], stdout=slave, stderr=err, env=env
        )
    os.close(slave)
    deadline = time.monotonic() + 120
    while not Path("run/paused").exists():
        assert run.poll() is None, Path("stderr.txt").read_text()[-3000:]
        assert time.monotonic() < deadline, "the run never reached the pause"
        _drain(master)
        time.sleep(0.05)
    os.close(master)  # the terminal goes away: writes to it fail from now on
    run.send_signal(signal.SIGHUP)
    assert run.wait(timeout=120) == 128 + signal.SIGHUP, Path("stderr.txt").read_text()[-3000:]
    assert Path("stderr.txt").read_text().strip().splitlines()[-1] == (
        "sss: stopped by SIGHUP after step 6; checkpoint saved to run/checkpoints/step_0000006. " + RESUME_LINE
    )
    assert [p.name for p in complete_checkpoints("run/checkpoints")] == ["step_0000006"]
    assert main(["fit", "run.yaml", "--resume"]) == 0  # and it continues from there
    assert json.loads(Path("run/results.json").read_text())["resumed_from"] == "run/checkpoints/step_0000006"


def _drain(fd: int) -> None:
    # Read what the run wrote to its terminal so far, so that its writes never block on a full pty buffer.
    import select

    while select.select([fd], [], [], 0)[0]:
        try:
            if not os.read(fd, 65536):
                return
        except OSError:
            return
