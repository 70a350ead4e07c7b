"""``self.log`` in `training_step` / `validation_step`: named, reduced and delivered by the trainer.

Run as a script (``accelerate launch ... test_module_log.py BATCH OUT``) it trains the parity model and
saves its logged values, for the two-process test at the end.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from torch.utils.data import DataLoader

from sss import Callback, SSSTrainer
from sss.callbacks import MetricsLogger, ProgressBar
from sss.callbacks.early_stopping import EarlyStopping
from sss.callbacks.metrics_logger import read_metrics
from sss.testing import BoringDataset, BoringModule, boring_loader

QUIET = {"cpu": True, "mixed_precision": "no", "checkpoint": {"every_epoch": False}}


def trainer(tmp_path: Path, callbacks=(), **settings) -> SSSTrainer:
    return SSSTrainer(output_dir=str(tmp_path / "run"), callbacks=list(callbacks), **QUIET, **settings)


class Logs(BoringModule):
    """Logs the mean row index of each batch: a value the data fixes, so the expected means are known."""

    def __init__(self, train: dict | None = None, val: dict | None = None) -> None:
        super().__init__()
        self.train_options, self.val_options = train, val

    def training_step(self, batch, batch_idx):
        if self.train_options is not None:
            self.log("index_mean", batch["index"].float().mean(), **self.train_options)
        return super().training_step(batch, batch_idx)

    def validation_step(self, batch, batch_idx):
        if self.val_options is not None:
            self.log("index_mean", batch["index"].float().mean(), **self.val_options)
        return super().validation_step(batch, batch_idx)


class StepLogs(Callback):
    """What ``state.logs`` holds for the trackers at each optimizer step."""

    def __init__(self) -> None:
        self.seen: dict[int, dict[str, float]] = {}

    def on_after_optimizer_step(self, trainer, module):
        self.seen[trainer.state.global_step] = dict(trainer.state.logs)
        trainer.state.logs.clear()  # as the metrics logger does


def test_step_values_are_window_means_at_the_logging_steps(tmp_path):
    logger = MetricsLogger(every_n_steps=2, trackers=["csv"])
    t = trainer(tmp_path, [logger], max_epochs=1, gradient_accumulation_steps=2, log={"every_n_steps": 2})
    t.fit(Logs(train={}), train_dataloaders=boring_loader(n=32, batch_size=4))
    rows = [r for r in read_metrics(tmp_path / "run" / "logs" / "metrics.csv") if "train/index_mean" in r]
    # step k covers rows 8(k-1) .. 8k-1 in two micro-batches; logged at steps 2 and 4
    assert [(r["step"], r["train/index_mean"]) for r in rows] == [(2.0, 11.5), (4.0, 27.5)]
    assert "train/loss" in rows[0]  # in the metrics logger's row of that step


def test_epoch_values_are_sample_weighted_means_over_the_epoch(tmp_path):
    logger = MetricsLogger(every_n_steps=100, trackers=["csv"])  # no logging step: the epoch values come anyway
    t = trainer(tmp_path, [logger], max_epochs=2)
    t.fit(Logs(train={"on_step": False, "on_epoch": True}), train_dataloaders=boring_loader(n=30, batch_size=8))
    # batches of 8, 8, 8, 6: the mean over the 30 samples is 14.5 (the mean of the batch means would be 15.25)
    assert t.state.metrics["train/index_mean"] == 14.5
    rows = [r for r in read_metrics(tmp_path / "run" / "logs" / "metrics.csv") if "train/index_mean" in r]
    assert [(r["step"], r["train/index_mean"]) for r in rows] == [(4.0, 14.5), (8.0, 14.5)]  # at each epoch's end


def test_per_step_and_per_epoch_get_step_and_epoch_names_and_the_bar_its_values(tmp_path):
    steps = StepLogs()
    t = trainer(tmp_path, [steps], max_epochs=1, log={"every_n_steps": 1})
    t.fit(Logs(train={"on_epoch": True, "prog_bar": True}), train_dataloaders=boring_loader(n=16, batch_size=8))
    assert steps.seen == {1: {"train/index_mean_step": 3.5}, 2: {"train/index_mean_step": 11.5}}
    assert t.state.metrics["train/index_mean_epoch"] == 7.5
    assert t.state.bar == {"train/index_mean_step": 11.5, "train/index_mean_epoch": 7.5}


def test_a_train_prefix_is_not_doubled(tmp_path):
    class Named(BoringModule):
        def training_step(self, batch, batch_idx):
            self.log("train/rows", float(len(batch["index"])), on_step=False, on_epoch=True)
            return super().training_step(batch, batch_idx)

    t = trainer(tmp_path, max_epochs=1)
    t.fit(Named(), train_dataloaders=boring_loader(n=16, batch_size=8))
    assert t.state.metrics == {"train/rows": 8.0}


def test_validation_values_are_metrics_of_the_pass_for_monitors_and_the_bar(tmp_path, capsys):
    stop = EarlyStopping(monitor="val/index_mean", mode="min", patience=1)  # the data fixes it: no improvement
    t = trainer(tmp_path, [stop, ProgressBar(every_n_steps=100)], max_epochs=5, log={"progress": True})
    metrics = t.fit(
        Logs(val={}), train_dataloaders=boring_loader(n=16), val_dataloaders=boring_loader(n=12, batch_size=5)
    )
    assert metrics["val/index_mean"] == 5.5 == t.state.eval_metrics["val/index_mean"]  # rows 0..11, batches 5, 5, 2
    assert t.state.epoch == 2 and stop.stopped_step is not None  # the monitor read it
    assert re.search(r"\[val\].*index_mean 5\.5000", capsys.readouterr().out)  # the bar's validation line
    again = t.validate(Logs(val={}), dataloaders=boring_loader(n=4), prefix="val_image_only")
    assert again["val_image_only/index_mean"] == 1.5


def test_a_val_prefix_is_not_doubled_and_test_passes_get_theirs(tmp_path):
    class Named(BoringModule):
        def validation_step(self, batch, batch_idx):
            self.log("val/rows", float(len(batch["index"])))
            return super().validation_step(batch, batch_idx)

    t = trainer(tmp_path)
    assert t.validate(Named(), dataloaders=boring_loader(n=8))["val/rows"] == 8.0
    assert t.test(Named(), dataloaders=boring_loader(n=8))["test/rows"] == 8.0


@pytest.mark.parametrize(
    ("options", "message"),
    [
        ({"on_step": True}, r"validation_step logged 'index_mean' with on_step=True"),
        ({"on_epoch": False}, r"are means over the whole evaluation pass"),
    ],
)
def test_per_step_validation_values_are_refused(tmp_path, options, message):
    with pytest.raises(ValueError, match=message):
        trainer(tmp_path).validate(Logs(val=options), dataloaders=boring_loader(n=8))


def test_a_logged_name_that_compute_metrics_returns_is_refused(tmp_path):
    class Clash(BoringModule):
        def validation_step(self, batch, batch_idx):
            self.log("accuracy", 1.0)
            return super().validation_step(batch, batch_idx)

    with pytest.raises(ValueError, match=r"validation_step logged val/accuracy, which compute_metrics also returns"):
        trainer(tmp_path).validate(Clash(), dataloaders=boring_loader(n=8))


def test_bad_values_are_named_where_they_are_logged():
    module = BoringModule()
    with pytest.raises(ValueError, match=r"self.log\('x', ...\) needs a scalar, got a tensor of shape \(2,\)"):
        module.log("x", torch.zeros(2))
    with pytest.raises(TypeError, match=r"self.log\('x', ...\) takes a number or a one-element tensor"):
        module.log("x", "high")
    with pytest.raises(ValueError, match=r"on_step=False, on_epoch=False\) would report nothing"):
        module.log("x", 1.0, on_step=False, on_epoch=False)


class Watched(torch.Tensor):
    """A tensor that counts its conversions to Python numbers (each one a device sync on a GPU)."""

    conversions = 0

    @classmethod
    def __torch_function__(cls, func, types, args=(), kwargs=None):
        if func in (torch.Tensor.item, torch.Tensor.tolist, torch.Tensor.__float__, torch.Tensor.__bool__):
            cls.conversions += 1
        return super().__torch_function__(func, types, args, kwargs or {})


def test_values_stay_tensors_until_they_are_published(tmp_path):
    class Watching(BoringModule):
        def training_step(self, batch, batch_idx):
            self.log("audio_mean", batch["audio"].mean().as_subclass(Watched), on_epoch=True)
            return super().training_step(batch, batch_idx)

    class Published(Callback):
        def __init__(self) -> None:
            self.seen: dict[int, type] = {}

        def on_after_optimizer_step(self, trainer, module):
            if "train/audio_mean_step" in trainer.state.logs:
                self.seen[trainer.state.global_step] = type(trainer.state.logs["train/audio_mean_step"])

    Watched.conversions, published = 0, Published()
    t = trainer(tmp_path, [published], max_epochs=1, log={"every_n_steps": 4})
    t.fit(Watching(), train_dataloaders=boring_loader(n=64, batch_size=8))
    assert t.state.global_step == 8
    # The step values of steps 4 and 8 reach state.logs as tensors, for the logging callbacks to read
    # with the loss in one transfer (none here; the trainer clears them after each logging step), and
    # the epoch means make one conversion; none per step.
    assert published.seen == {4: Watched, 8: Watched}
    assert Watched.conversions == 1
    assert "train/audio_mean_epoch" in t.state.metrics


class _OutOfMemoryInBackward(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x):
        return x.view_as(x)

    @staticmethod
    def backward(ctx, grad):
        raise torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 2.00 GiB (simulated)")


class LogsThenOutOfMemory(Logs):
    """Logs, then runs out of memory in its forward or its backward, once: at training_step call `fail_call`."""

    def __init__(self, where: str, fail_call: int) -> None:
        super().__init__(train={"on_epoch": True})
        self.where, self.fail_call, self.calls = where, fail_call, 0

    def training_step(self, batch, batch_idx):
        loss = super().training_step(batch, batch_idx)
        call, self.calls = self.calls, self.calls + 1
        if call == self.fail_call and self.where == "forward":
            raise torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 2.00 GiB (simulated)")
        return _OutOfMemoryInBackward.apply(loss) if call == self.fail_call else loss


@pytest.mark.parametrize("where", ["forward", "backward"])
@pytest.mark.parametrize("fail_call", [0, 1], ids=["window_start", "mid_window"])
def test_a_window_replayed_after_an_out_of_memory_error_counts_once(tmp_path, where, fail_call):
    steps = StepLogs()
    settings = {"auto_batch_size": True, "gradient_accumulation_steps": 2, "log": {"every_n_steps": 1}}
    t = trainer(tmp_path, [steps], max_epochs=1, **settings)
    with pytest.warns(UserWarning, match="now runs as 2 micro-batches"):
        t.fit(LogsThenOutOfMemory(where, fail_call), train_dataloaders=boring_loader(n=40, batch_size=8))
    # windows of rows 0..15, 16..31 and the short 32..39, each value counted once
    assert {s: v["train/index_mean_step"] for s, v in steps.seen.items()} == {1: 7.5, 2: 23.5, 3: 35.5}
    assert t.state.metrics["train/index_mean_epoch"] == 19.5


# ---------------------------------------------------------------------- two processes
def parity_run(batch_size: int, out: str) -> None:
    """Train with per-process batch `batch_size`; save what was logged (main process)."""

    class Parity(BoringModule):
        def training_step(self, batch, batch_idx):
            loss = super().training_step(batch, batch_idx)
            self.log("audio_mean", batch["audio"].mean(), on_step=False, on_epoch=True)
            self.log("loss_mean", loss, on_step=False, on_epoch=True)
            return loss

        def validation_step(self, batch, batch_idx):
            self.log("index_mean", batch["index"].float().mean())
            return super().validation_step(batch, batch_idx)

    torch.manual_seed(0)
    optim = {"optimizer": {"_target_": "torch.optim.SGD", "lr": 0.1}}
    t = SSSTrainer(max_epochs=2, optim=optim, sanity_val_batches=0, **QUIET)  # count the real passes' reduces only
    reduce, calls = t.accelerator.reduce, []
    t.accelerator.reduce = lambda *a, **k: calls.append(1) or reduce(*a, **k)
    t.fit(
        Parity(),
        train_dataloaders=DataLoader(BoringDataset(48), batch_size=batch_size, shuffle=True),
        val_dataloaders=DataLoader(BoringDataset(21, seed=1), batch_size=batch_size),  # a padded last batch
    )
    if t.accelerator.is_main_process:
        torch.save({"metrics": t.state.metrics, "reduces": len(calls), "processes": t.accelerator.num_processes}, out)


@pytest.mark.slow
def test_two_processes_log_the_epoch_means_of_one(tmp_path):
    from sss.run.launch import launch_command

    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    results = {}
    for processes, batch in ((2, 4), (1, 8)):
        out = tmp_path / f"{processes}.pt"
        cmd = launch_command(processes, [__file__, str(batch), str(out)])
        done = subprocess.run(cmd, capture_output=True, text=True, timeout=300, env=env)
        assert done.returncode == 0, done.stderr[-3000:]
        results[processes] = torch.load(out)
    two, one = results[2], results[1]
    assert two["processes"] == 2 and one["processes"] == 1
    # 2 epochs and 2 validations: one all-reduce each (none in the one-process run, where there is nothing to sum)
    assert two["reduces"] == 4 and one["reduces"] == 0
    # rows 0..20: the mean is 10; the sampler's padding (rows 0, 1, 2 again) would make it 8.875
    assert two["metrics"]["val/index_mean"] == pytest.approx(10.0, abs=1e-12) == one["metrics"]["val/index_mean"]
    # float32 batch means over 4 samples and over 8 round differently; the weighting makes them agree
    assert two["metrics"]["train/audio_mean"] == pytest.approx(one["metrics"]["train/audio_mean"], rel=1e-6)
    assert two["metrics"]["train/loss_mean"] == pytest.approx(one["metrics"]["train/loss_mean"], rel=1e-5)
    assert two["metrics"]["val/loss"] == pytest.approx(one["metrics"]["val/loss"], rel=1e-5)


if __name__ == "__main__":
    parity_run(int(sys.argv[1]), sys.argv[2])
