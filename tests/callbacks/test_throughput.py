"""Throughput: samples/s and step time are right, and a slow loader shows as data wait."""

from __future__ import annotations

import time

import pytest
import torch

from sss import SSSTrainer
from sss.callbacks import Throughput
from sss.callbacks.stock import add_stock_callbacks
from sss.testing import BoringDataset, BoringModule


class SlowData(BoringDataset):
    def __init__(self, delay):
        super().__init__(n=64)
        self.delay = delay

    def __getitem__(self, i):
        time.sleep(self.delay)
        return super().__getitem__(i)


class SlowStep(BoringModule):
    def training_step(self, batch, batch_idx):
        time.sleep(0.02)
        return super().training_step(batch, batch_idx)


def _fit(delay, every=4):
    meter = Throughput(every_n_steps=every)
    loader = torch.utils.data.DataLoader(SlowData(delay), batch_size=2)
    trainer = add_stock_callbacks(
        SSSTrainer(
            callbacks=[meter],
            max_steps=8,
            mixed_precision="no",
            log={"progress": False, "trackers": []},
            checkpoint={"every_epoch": False},
        )
    )
    trainer.fit(SlowStep(), train_dataloaders=loader)
    return trainer, meter


def test_slow_loader_shows_as_data_wait_and_a_fast_one_does_not():
    # 2 samples x 50 ms of loading against ~20 ms of compute per step
    trainer, slow = _fit(delay=0.05)
    wait_per_step = slow.data_wait_fraction * slow.step_time_s
    assert 0.099 <= wait_per_step < 0.1 + 0.5 * slow.step_time_s  # sleep never undershoots
    assert slow.data_wait_fraction > 0.5
    assert slow.samples_per_sec == pytest.approx(2 / slow.step_time_s, rel=0.05)
    assert trainer.state.logs["train/data_wait_fraction"] == slow.data_wait_fraction
    assert trainer.state.logs["train/step_time_s"] == slow.step_time_s

    _, fast = _fit(delay=0.0)
    assert fast.data_wait_fraction * fast.step_time_s < 0.03
    assert fast.data_wait_fraction < slow.data_wait_fraction / 2


def test_health_figures_reach_the_progress_bar_and_the_trackers(capsys, tmp_path):
    from sss.callbacks import GradNormMonitor
    from sss.testing import boring_loader

    trainer = add_stock_callbacks(
        SSSTrainer(
            callbacks=[GradNormMonitor(every_n_steps=2), Throughput(every_n_steps=2)],
            max_steps=4,
            mixed_precision="no",
            output_dir=str(tmp_path),
            log={"progress": True, "trackers": ["csv"], "every_n_steps": 2},  # the stock bar and logger
            checkpoint={"every_epoch": False},
        )
    )
    trainer.fit(SlowStep(), train_dataloaders=boring_loader())
    lines = [line for line in capsys.readouterr().out.splitlines() if line.startswith("epoch 0 step")]
    assert len(lines) == 2  # steps 2 and 4, although the logger cleared state.logs at both
    for line in lines:
        assert "grad_share/image" in line and "grad_share/audio" in line and "data_wait_fraction" in line
    header = (tmp_path / "logs" / "metrics.csv").read_text().splitlines()[0].split(",")
    assert {"train/grad_norm/audio", "train/grad_share/image", "train/data_wait_fraction"} <= set(header)


class SlowValidation(SlowStep):
    def validation_step(self, batch, batch_idx):
        time.sleep(0.15)
        return super().validation_step(batch, batch_idx)


def test_the_sanity_validation_before_the_first_epoch_is_not_training_time():
    from sss.testing import boring_loader

    meter = Throughput(every_n_steps=4)
    trainer = SSSTrainer(
        callbacks=[meter],
        max_steps=4,
        mixed_precision="no",
        sanity_val_batches=2,  # 2 x 150 ms before the first step
        log={"progress": False, "trackers": []},
        checkpoint={"every_epoch": False},
    )
    trainer.fit(SlowValidation(), train_dataloaders=boring_loader(n=64), val_dataloaders=boring_loader(n=8, seed=1))
    assert 0.02 <= meter.step_time_s < 0.02 + 0.3 / 4 / 2  # one window of 4 steps of ~20 ms, no 75 ms share each
