"""The stock callbacks a run gets from its config (progress, plots, metric logging, checkpoints).

`SSSTrainer` knows only the callback contract and runs the callbacks it is given; ``sss fit``
(and a Python user who wants the same) adds the stock set with `add_stock_callbacks`.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from typing import TYPE_CHECKING

from sss.callbacks.base import Callback
from sss.callbacks.checkpoint import ModelCheckpoint
from sss.callbacks.metrics_logger import MetricsLogger
from sss.callbacks.model_summary import ModelSummary
from sss.callbacks.plots import Plots
from sss.callbacks.progress import ProgressBar
from sss.callbacks.skipped import SkippedRows
from sss.config import TrainerConfig

if TYPE_CHECKING:
    from sss.trainer.trainer import SSSTrainer

__all__ = ["add_stock_callbacks", "with_stock_callbacks"]


def with_stock_callbacks(callbacks: Sequence[Callback], cfg: TrainerConfig) -> list[Callback]:
    """`callbacks` plus the stock ones `cfg` asks for and `callbacks` lacks; checkpoints last.

    The stock set: `ModelSummary` and `ProgressBar` (``log.summary``, ``log.progress``), `Plots`
    (``log.plots``; not under ``fast_dev_run``), `MetricsLogger` with the trackers of ``log.trackers``,
    `SkippedRows`, and `ModelCheckpoint` (``checkpoint.*``). An instance of the same class among
    `callbacks` replaces the stock one.

    Example:
        >>> from sss.config import LogConfig, TrainerConfig
        >>> [type(c).__name__ for c in with_stock_callbacks([], TrainerConfig())]
        ['ModelSummary', 'ProgressBar', 'Plots', 'MetricsLogger', 'SkippedRows', 'ModelCheckpoint']
        >>> [type(c).__name__ for c in with_stock_callbacks([], TrainerConfig(log=LogConfig(plots=False)))]
        ['ModelSummary', 'ProgressBar', 'MetricsLogger', 'SkippedRows', 'ModelCheckpoint']
    """

    def missing(kind: type) -> bool:
        return not any(isinstance(c, kind) for c in callbacks)

    stock: list[Callback] = []
    if cfg.log.summary and cfg.log.progress and missing(ModelSummary):  # part of the console display
        stock.append(ModelSummary())
    if cfg.log.progress and missing(ProgressBar):
        stock.append(ProgressBar(every_n_steps=cfg.log.every_n_steps))
    if cfg.log.plots and not cfg.fast_dev_run and missing(Plots):
        stock.append(Plots(every_n_steps=cfg.log.every_n_steps))
    if cfg.log.trackers and missing(MetricsLogger):
        stock.append(MetricsLogger(every_n_steps=cfg.log.every_n_steps, trackers=list(cfg.log.trackers)))
    if missing(SkippedRows):
        stock.append(SkippedRows())
    ckpt = cfg.checkpoint
    if (ckpt.every_n_steps or ckpt.every_epoch) and missing(ModelCheckpoint):
        stock.append(ModelCheckpoint(**dataclasses.asdict(ckpt)))
    return [*callbacks, *stock]  # checkpoints last: they save what the other callbacks just updated


def add_stock_callbacks(trainer: SSSTrainer) -> SSSTrainer:
    """Add to `trainer` the stock callbacks its (resolved) config asks for, after its own; returns it.

    What ``sss fit`` runs, from Python: progress, plots, metric logging, checkpoints.

    Example:
        >>> from sss import SSSTrainer
        >>> trainer = add_stock_callbacks(SSSTrainer(max_epochs=2, mixed_precision="no"))
        sss: mixed precision no
        >>> [type(c).__name__ for c in trainer.callbacks]
        ['ModelSummary', 'ProgressBar', 'Plots', 'MetricsLogger', 'SkippedRows', 'ModelCheckpoint']
    """
    # The trainer's own config, not the one it was given: fast_dev_run has turned checkpoints off there.
    trainer.callbacks = with_stock_callbacks(trainer.callbacks, trainer.config)
    return trainer
