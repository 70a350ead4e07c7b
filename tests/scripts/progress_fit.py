"""Run by tests/callbacks/test_progress.py with its stdout on a pseudo-terminal (or a pipe): a short fit
with the stock progress bar, a redraw at every batch, health figures in the info line, validation, and
sss's own advice: a starving audio branch (frozen on purpose) warns, while the learning rate, far too
large for the clip value but still in its warm-up, does not."""

from __future__ import annotations

import warnings

from sss import SSSTrainer
from sss.callbacks import GradNormMonitor, ProgressBar
from sss.testing import BoringModule, boring_loader
from sss.warnings import SSSWarning

warnings.simplefilter("ignore")
warnings.simplefilter("always", SSSWarning)
module = BoringModule()
module.audio_encoder.requires_grad_(False)
trainer = SSSTrainer(
    max_epochs=2,
    mixed_precision="no",
    max_grad_norm=1e-3,  # every step clipped: "the learning rate may be too large", were it not the warm-up
    optim={
        "optimizer": {"_target_": "torch.optim.SGD", "lr": 10.0},
        "scheduler": {"_target_": "sss.trainer.cosine_with_warmup", "warmup_steps": 100},
    },
    callbacks=[GradNormMonitor(every_n_steps=1, patience=2), ProgressBar(every_n_steps=4, refresh_seconds=0.0)],
    log={"progress": False, "trackers": []},
    checkpoint={"every_epoch": False},
)
trainer.fit(module, train_dataloaders=boring_loader(), val_dataloaders=boring_loader(n=16, seed=1))
