"""LearningRateMonitor: every parameter group's LR (and momentum) reaches the trackers."""

from __future__ import annotations

import csv

import pytest
import torch

from sss import SSSTrainer
from sss.callbacks import LearningRateMonitor
from sss.callbacks.stock import add_stock_callbacks
from sss.testing import BoringModule, boring_loader


class TwoGroups(BoringModule):
    def configure_optimizers(self):
        optimizer = torch.optim.SGD(
            [
                {"params": self.image_encoder.parameters(), "lr": 0.1, "name": "image"},
                {"params": [*self.audio_encoder.parameters(), *self.fusion_head.parameters()], "lr": 0.01},
            ],
            momentum=0.9,
        )
        return optimizer, torch.optim.lr_scheduler.StepLR(optimizer, step_size=1, gamma=0.5)


def test_all_groups_reach_the_csv_tracker(tmp_path):
    trainer = add_stock_callbacks(
        SSSTrainer(
            callbacks=[LearningRateMonitor(log_momentum=True)],
            max_steps=4,
            mixed_precision="no",
            output_dir=str(tmp_path),
            log={"progress": False, "trackers": ["csv"], "every_n_steps": 2},
            checkpoint={"every_epoch": False},
        )
    )
    trainer.fit(TwoGroups(), train_dataloaders=boring_loader())
    rows = list(csv.DictReader((tmp_path / "logs" / "metrics.csv").open()))
    assert [int(r["step"]) for r in rows] == [2, 4]
    # the LR after step N of StepLR(gamma=0.5): 0.1 * 0.5**N and 0.01 * 0.5**N, per group
    for row in rows:
        n = int(row["step"])
        assert float(row["train/lr/image"]) == pytest.approx(0.1 * 0.5**n)
        assert float(row["train/lr/group_1"]) == pytest.approx(0.01 * 0.5**n)
        assert float(row["train/momentum/group_1"]) == 0.9
