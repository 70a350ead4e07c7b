"""Run by tests/callbacks/test_progress.py with its stdout on a pseudo-terminal (or a pipe): a short fit
with the stock progress bar, a redraw at every batch, health figures in the info line and validation."""

from __future__ import annotations

import warnings

from sss import SSSTrainer
from sss.callbacks import GradNormMonitor, ProgressBar
from sss.testing import BoringModule, boring_loader

warnings.simplefilter("ignore")
trainer = SSSTrainer(
    max_epochs=2,
    mixed_precision="no",
    callbacks=[GradNormMonitor(every_n_steps=1), ProgressBar(every_n_steps=4, refresh_seconds=0.0)],
    log={"progress": False, "trackers": []},
    checkpoint={"every_epoch": False},
)
trainer.fit(BoringModule(), train_dataloaders=boring_loader(), val_dataloaders=boring_loader(n=16, seed=1))
