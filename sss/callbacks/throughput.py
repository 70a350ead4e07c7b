"""`Throughput`: samples/s, time per optimizer step, and the fraction of time spent waiting for data."""

from __future__ import annotations

import time
from typing import TYPE_CHECKING

from sss.callbacks.base import Callback

if TYPE_CHECKING:
    from sss.trainer.module import LitModule
    from sss.trainer.trainer import SSSTrainer

__all__ = ["Throughput"]


class Throughput(Callback):
    """Every N optimizer steps: ``train/samples_per_sec``, ``train/step_time_s`` and ``train/data_wait_fraction``.

    Data wait is the host time between one BATCH_END and the next BATCH_START (the loader producing
    the next batch), plus the time from EPOCH_START to the first batch (worker start-up); checkpoint
    saves are not counted. A fraction near 1 means the loader is the bottleneck: raise
    ``num_workers`` or cache decoded data. On CUDA the times are host times: the GPU queue can hide
    a slow loader, never invent one. `every_n_steps` defaults to ``trainer.log.every_n_steps``.

    Only this process's training counts: the sanity validation before the first epoch and the
    validations and saves between epochs are left out, and the first window after a resume counts
    from the checkpoint's step and samples, never from step 0. A run resumed mid-epoch starts its
    loader past the batches already trained; a map-style dataset skips them for free, an iterable
    one reads them, and that shows as data wait in the first window.

    Example:
        >>> from sss import SSSTrainer
        >>> from sss.testing import boring_loader, BoringModule
        >>> trainer = SSSTrainer(max_steps=4, callbacks=[Throughput(every_n_steps=2)], mixed_precision="no",
        ...                      log={"progress": False, "trackers": []}, checkpoint={"every_epoch": False})
        sss: mixed precision no
        >>> _ = trainer.fit(BoringModule(), train_dataloaders=boring_loader())
        >>> 0.0 <= trainer.state.logs["train/data_wait_fraction"] <= 1.0
        True
    """

    def __init__(self, every_n_steps: int | None = None) -> None:
        self.every_n_steps = every_n_steps
        self.samples_per_sec = 0.0
        self.step_time_s = 0.0
        self.data_wait_fraction = 0.0
        self._last_end: float | None = None
        self._wait = 0.0
        self._window_start = 0.0
        self._window_samples = 0
        self._window_steps = 0
        self._gap_start: float | None = None

    def on_fit_start(self, trainer: SSSTrainer, module: LitModule) -> None:
        if self.every_n_steps is None:
            self.every_n_steps = trainer.config.log.every_n_steps
        self._reset(trainer)  # after load_checkpoint: a resumed run's samples so far are not this window's
        self._gap_start = self._window_start  # until the first epoch starts: the sanity validation, not training

    def _reset(self, trainer: SSSTrainer) -> None:
        self._window_start = time.perf_counter()
        self._window_samples, self._window_steps, self._wait = trainer.state.samples, 0, 0.0

    def on_epoch_start(self, trainer: SSSTrainer, module: LitModule) -> None:
        now = time.perf_counter()
        if self._gap_start is not None:  # validation and saves between epochs are not training time
            self._window_start += now - self._gap_start
            self._gap_start = None
        self._last_end = now  # from here to the first batch: the loader (and its workers) starting

    def on_epoch_end(self, trainer: SSSTrainer, module: LitModule) -> None:
        # from the epoch's last batch on, the time went to validation and saving
        self._gap_start, self._last_end = self._last_end or time.perf_counter(), None

    def on_batch_start(self, trainer: SSSTrainer, module: LitModule) -> None:
        if self._last_end is not None:
            self._wait += time.perf_counter() - self._last_end
            self._last_end = None

    def on_batch_end(self, trainer: SSSTrainer, module: LitModule) -> None:
        self._last_end = time.perf_counter()

    def on_save_checkpoint(self, trainer: SSSTrainer, module: LitModule) -> None:
        if self._last_end is not None:  # a save between batches is not data wait
            self._last_end = time.perf_counter()

    def on_after_optimizer_step(self, trainer: SSSTrainer, module: LitModule) -> None:
        self._window_steps += 1
        if trainer.state.global_step % self.every_n_steps and self._window_steps < self.every_n_steps:
            return
        elapsed = max(time.perf_counter() - self._window_start, 1e-9)
        self.samples_per_sec = (trainer.state.samples - self._window_samples) / elapsed
        self.step_time_s = elapsed / self._window_steps
        self.data_wait_fraction = min(self._wait / elapsed, 1.0)
        logs = trainer.state.logs
        logs["train/samples_per_sec"] = self.samples_per_sec
        logs["train/step_time_s"] = self.step_time_s
        logs["train/data_wait_fraction"] = self.data_wait_fraction
        self._reset(trainer)
