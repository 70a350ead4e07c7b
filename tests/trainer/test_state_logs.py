"""The trainer clears ``state.logs`` after a logging step's callbacks ran, so their order does not matter."""

from __future__ import annotations

from pathlib import Path

import torch

from sss import Callback, SSSTrainer
from sss.callbacks import MetricsLogger
from sss.callbacks.metrics_logger import read_metrics
from sss.testing import BoringModule, boring_loader

EVERY = 2  # trainer.log.every_n_steps: steps 2, 4 and 6 are logging steps


class Publishes(Callback):
    """Publishes a value at every step, and one at step 1 only (before a logging step) that must go once read."""

    def on_after_optimizer_step(self, trainer, module):
        step = trainer.state.global_step
        trainer.state.logs["train/every"] = torch.tensor(float(step))  # a device value, as callbacks publish
        if step == 1:
            trainer.state.logs["train/step_one"] = 1.0


class Reads(Callback):
    """Reads ``state.logs`` at each logging step, as Plots does."""

    def __init__(self) -> None:
        self.seen: dict[int, dict[str, float]] = {}

    def on_after_optimizer_step(self, trainer, module):
        state = trainer.state
        if not state.step_was_skipped and state.global_step % EVERY == 0:
            self.seen[state.global_step] = {k: float(v) for k, v in state.logs.items()}


class LogsMean(BoringModule):
    def training_step(self, batch, batch_idx):
        self.log("image_mean", batch["image"].mean())
        return super().training_step(batch, batch_idx)


def _run(folder: Path, order: str) -> tuple[Reads, SSSTrainer]:
    reader, logger = Reads(), MetricsLogger(every_n_steps=EVERY, trackers=["csv"])
    callbacks = {"logger first": [logger, reader], "reader first": [reader, logger], "no logger": [reader]}[order]
    torch.manual_seed(0)
    trainer = SSSTrainer(
        max_steps=6,
        callbacks=[Publishes(), *callbacks],
        output_dir=str(folder),
        mixed_precision="no",
        log={"every_n_steps": EVERY, "progress": False},
        checkpoint={"every_epoch": False},
    )
    trainer.fit(LogsMean(), train_dataloaders=boring_loader(n=64))
    return reader, trainer


def test_a_reader_sees_the_same_values_before_or_after_the_metrics_logger(tmp_path):
    first, _ = _run(tmp_path / "a", "logger first")
    after, _ = _run(tmp_path / "b", "reader first")
    assert first.seen == after.seen
    assert sorted(first.seen) == [2, 4, 6]
    assert set(first.seen[2]) == {"train/every", "train/step_one", "train/image_mean"}
    assert set(first.seen[4]) == {"train/every", "train/image_mean"}  # step 1's value went after step 2's log
    assert first.seen[4]["train/every"] == 4.0
    rows = [read_metrics(folder / "logs" / "metrics.csv") for folder in (tmp_path / "a", tmp_path / "b")]
    assert rows[0] == rows[1] and [row["step"] for row in rows[0]] == [2.0, 4.0, 6.0]


def test_the_trainer_clears_them_without_a_metrics_logger(tmp_path):
    reader, trainer = _run(tmp_path, "no logger")
    assert set(reader.seen[4]) == {"train/every", "train/image_mean"}
    assert trainer.state.logs == {}  # step 6, the last, was a logging step
