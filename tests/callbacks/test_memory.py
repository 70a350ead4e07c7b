"""MemoryMonitor: the peak RSS follows a real allocation, and reaches state.logs."""

from __future__ import annotations

import torch

from sss import SSSTrainer
from sss.callbacks import MemoryMonitor
from sss.callbacks.memory import peak_rss_mb
from sss.testing import BoringModule, boring_loader


class Hog(BoringModule):
    """Touches a 200 MiB buffer in its third step, then frees it."""

    def training_step(self, batch, batch_idx):
        if batch_idx == 2:
            hog = torch.ones(50 * 2**20)  # 200 MiB of float32, written so the pages are resident
            del hog
        return super().training_step(batch, batch_idx)


def test_peak_rss_sees_a_freed_allocation():
    start = peak_rss_mb()
    monitor = MemoryMonitor(every_n_steps=1)
    trainer = SSSTrainer(
        callbacks=[monitor],
        max_steps=4,
        mixed_precision="no",
        log={"progress": False, "trackers": []},
        checkpoint={"every_epoch": False},
    )
    trainer.fit(Hog(), train_dataloaders=boring_loader())
    logs = trainer.state.logs
    assert logs["memory/peak_rss_mb"] >= start + 150  # the 200 MiB left its mark on the peak ...
    assert logs["memory/rss_mb"] < logs["memory/peak_rss_mb"] - 150  # ... though it was freed
    assert "memory/peak_cuda_mb" not in logs  # CPU run
    assert monitor.peak == {k: v for k, v in logs.items() if k.startswith("memory/")}
