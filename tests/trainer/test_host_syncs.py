"""Host syncs of the training steps: none on a step that logs nothing, one per logging step.

Counted with `sss.testing.count_host_syncs` on the CPU, which counts what would make the host wait
for a GPU. Only the training steps count (`SSSTrainer._train_step`), checkpoint saves excepted;
the sanity check, validation and the epoch's end are outside them.
"""

from __future__ import annotations

import warnings
from collections import Counter

import torch
from torch.utils.data import DataLoader

from sss import Callback, SSSTrainer
from sss.callbacks import (
    EarlyStopping,
    GradNormMonitor,
    LearningRateMonitor,
    MemoryMonitor,
    OverflowDetector,
    Throughput,
)
from sss.callbacks.stock import add_stock_callbacks
from sss.models import create_model
from sss.testing import BoringModule, RandomClips, boring_loader, count_host_syncs


class StepLabel(Callback):
    """Stamps each sync with the optimizer step it belongs to."""

    def __init__(self, syncs) -> None:
        self.syncs = syncs

    def on_batch_start(self, trainer, module) -> None:
        self.syncs.label = trainer.state.global_step + 1


def _step_syncs(syncs):
    return syncs.inside("_train_step", outside=("save_checkpoint",))


def test_twenty_steps_of_hunter_tiny_with_every_stock_and_health_callback_sync_twice(tmp_path):
    # hunter_tiny: the default model (hunter_small) in its smallest size; the stock set plus the health callbacks.
    torch.manual_seed(0)
    with count_host_syncs() as syncs, warnings.catch_warnings():
        warnings.simplefilter("ignore")
        health = [
            GradNormMonitor(every_n_steps=10),
            OverflowDetector(on_nan="raise", deferred=True),
            Throughput(),
            MemoryMonitor(),
            LearningRateMonitor(),
            EarlyStopping(patience=100),
        ]
        trainer = SSSTrainer(
            max_steps=20,
            mixed_precision="no",
            max_grad_norm=1.0,
            output_dir=str(tmp_path / "run"),
            callbacks=[StepLabel(syncs), *health],
            log={"every_n_steps": 10},
            checkpoint={"every_n_steps": 10, "every_epoch": True},
            limit_val_batches=1,
        )
        add_stock_callbacks(trainer)
        trainer.fit(
            create_model("hunter_tiny", num_classes=4),
            train_dataloaders=DataLoader(RandomClips(40), batch_size=2),
            val_dataloaders=DataLoader(RandomClips(2), batch_size=2),
        )
    assert trainer.state.global_step == 20 and {"ProgressBar", "Plots", "MetricsLogger", "ModelCheckpoint"} <= {
        type(c).__name__ for c in trainer.callbacks
    }
    in_steps = _step_syncs(syncs)
    assert len(in_steps) <= 2, syncs.report(in_steps)
    # the one read of each logging step (loss, grad norms, ...: progress bar, plots and logger share it)
    assert Counter(r.label for r in in_steps) == {10: 1, 20: 1}, syncs.report(in_steps)
    assert len(syncs) > len(in_steps)  # the probe saw the validation and the saves, which do not count


def test_the_exact_nan_policy_reads_one_flag_per_optimizer_step():
    # on_nan=skip must decide before each update: the documented price, one sync per step
    with count_host_syncs() as syncs:
        trainer = SSSTrainer(
            max_steps=20,
            mixed_precision="no",
            callbacks=[StepLabel(syncs), OverflowDetector(on_nan="skip")],
            log={"every_n_steps": 10, "progress": False, "trackers": []},
            checkpoint={"every_epoch": False},
        )
        trainer.fit(BoringModule(), train_dataloaders=boring_loader(n=160, batch_size=8))
    in_steps = _step_syncs(syncs)
    assert Counter(r.label for r in in_steps) == dict.fromkeys(range(1, 21), 1), syncs.report(in_steps)
    assert {r.where.split(" in ")[1] for r in in_steps} == {"on_after_backward"}
