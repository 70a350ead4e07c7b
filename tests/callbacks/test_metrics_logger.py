"""What callbacks publish on ``state.logs`` reaches the trackers, at the logger's cadence."""

from __future__ import annotations

import csv

from sss import Callback, SSSTrainer
from sss.callbacks.stock import add_stock_callbacks
from sss.testing import BoringModule, boring_loader


class Publisher(Callback):
    def on_after_backward(self, trainer, module):
        trainer.state.logs["train/custom"] = float(trainer.state.global_step + 1)


def test_published_scalars_reach_the_csv_tracker(tmp_path):
    trainer = add_stock_callbacks(
        SSSTrainer(
            max_steps=4,
            callbacks=[Publisher()],
            mixed_precision="no",
            output_dir=str(tmp_path),
            log={"progress": False, "trackers": ["csv"], "every_n_steps": 2},
            checkpoint={"every_epoch": False},
        )
    )
    trainer.fit(BoringModule(), train_dataloaders=boring_loader())
    rows = list(csv.DictReader((tmp_path / "logs" / "metrics.csv").open()))
    assert [(r["step"], r["train/custom"]) for r in rows] == [("2", "2.0"), ("4", "4.0")]
    assert trainer.state.logs == {}
