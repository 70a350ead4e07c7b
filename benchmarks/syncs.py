"""Host syncs per optimizer step of each stock and opt-in callback, counted with `sss.testing.count_host_syncs`.

One short fit of hunter_tiny (the default model family's smallest size) on random clips per row,
with only that callback on, logging every 10 steps; the table splits the syncs of the training
steps that log nothing, of the logging steps, and those of the validation passes and checkpoint
saves (outside the training steps). On a CPU the probe counts what would wait for a GPU
(see `count_host_syncs`), so the figures hold for CUDA runs as upper bounds.

    python benchmarks/syncs.py               # 30 steps per row
    python benchmarks/syncs.py --steps 60
"""

from __future__ import annotations

import argparse
import os
import tempfile
import time
import warnings
from collections.abc import Callable

os.environ.setdefault("MKL_CBWR", "AUTO,STRICT")

import torch
from torch.utils.data import DataLoader

from sss import Callback, SSSTrainer
from sss.callbacks import (
    EarlyStopping,
    GradNormMonitor,
    LearningRateMonitor,
    MemoryMonitor,
    MetricsLogger,
    ModelCheckpoint,
    OverflowDetector,
    Plots,
    ProgressBar,
    Throughput,
)
from sss.callbacks.stock import add_stock_callbacks
from sss.models import create_model
from sss.testing import HostSyncs, RandomClips, count_host_syncs

EVERY = 10


class StepLabel(Callback):
    def __init__(self, syncs: HostSyncs) -> None:
        self.syncs = syncs

    def on_batch_start(self, trainer: SSSTrainer, module: object) -> None:
        self.syncs.label = trainer.state.global_step + 1


ROWS: dict[str, Callable[[], list[Callback]]] = {
    "none (the loop alone)": list,
    "ProgressBar": lambda: [ProgressBar(every_n_steps=EVERY)],
    "MetricsLogger (csv)": lambda: [MetricsLogger(every_n_steps=EVERY, trackers=["csv"])],
    "ModelCheckpoint (every 10 steps)": lambda: [ModelCheckpoint(every_n_steps=EVERY, every_epoch=False)],
    "GradNormMonitor": lambda: [GradNormMonitor(every_n_steps=EVERY)],
    "GradNormMonitor + MetricsLogger": lambda: [
        GradNormMonitor(every_n_steps=EVERY),
        MetricsLogger(every_n_steps=EVERY, trackers=["csv"]),
    ],
    "OverflowDetector (on_nan=skip)": lambda: [OverflowDetector(on_nan="skip")],
    "OverflowDetector (raise, deferred)": lambda: [OverflowDetector(on_nan="raise", deferred=True)],
    "Throughput": lambda: [Throughput()],
    "MemoryMonitor": lambda: [MemoryMonitor()],
    "LearningRateMonitor": lambda: [LearningRateMonitor()],
    "Plots": lambda: [Plots(every_n_steps=EVERY)],
    "EarlyStopping": lambda: [EarlyStopping(patience=100)],
    "GradNormMonitor (ogm_ge=true)": lambda: [GradNormMonitor(every_n_steps=EVERY, ogm_ge=True)],
}


def run(callbacks: list[Callback], steps: int, stock: bool = False) -> tuple[HostSyncs, float]:
    torch.manual_seed(0)
    out = tempfile.mkdtemp()
    with count_host_syncs() as syncs, warnings.catch_warnings():
        warnings.simplefilter("ignore")
        trainer = SSSTrainer(
            max_steps=steps,
            mixed_precision="no",
            max_grad_norm=1.0,
            output_dir=out,
            callbacks=[StepLabel(syncs), *callbacks],
            log={"every_n_steps": EVERY, "progress": stock, "trackers": ["csv"] if stock else [], "plots": stock},
            checkpoint={"every_n_steps": EVERY if stock else None, "every_epoch": stock},
            limit_val_batches=1,
        )
        if stock:
            add_stock_callbacks(trainer)
        start = time.perf_counter()
        trainer.fit(
            create_model("hunter_tiny", num_classes=4),
            train_dataloaders=DataLoader(RandomClips(steps * 2), batch_size=2),
            val_dataloaders=DataLoader(RandomClips(2), batch_size=2),
        )
    return syncs, time.perf_counter() - start


def row(name: str, syncs: HostSyncs, steps: int) -> str:
    in_steps = syncs.inside("_train_step", outside=("save_checkpoint",))
    logging = [r for r in in_steps if r.label % EVERY == 0]
    quiet = len(in_steps) - len(logging)
    n_logging = steps // EVERY
    saves = len(syncs.inside("save_checkpoint"))
    val = len(syncs.inside("_evaluate"))
    culprits = sorted({r.where for r in in_steps})
    return (
        f"| {name} | {quiet / (steps - n_logging):.2f} | {len(logging) / n_logging:.2f} | {val} | {saves} | "
        f"{'; '.join(culprits) or '-'} |"
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--steps", type=int, default=30)
    args = parser.parse_args()
    print(f"hunter_tiny, batch 2, {args.steps} steps, log every {EVERY}; torch {torch.__version__}, CPU probe")
    print("| callbacks on | syncs per quiet step | per logging step | validation (total) | saves (total) | where |")
    print("|---|---|---|---|---|---|")
    for name, make in ROWS.items():
        syncs, _ = run(make(), args.steps)
        print(row(name, syncs, args.steps), flush=True)
    health = [GradNormMonitor(every_n_steps=EVERY), OverflowDetector(on_nan="raise", deferred=True), Throughput()]
    syncs, _ = run([*health, MemoryMonitor(), LearningRateMonitor(), EarlyStopping(patience=100)], args.steps, True)
    print(row("all stock + health (deferred NaN check)", syncs, args.steps), flush=True)


if __name__ == "__main__":
    main()
