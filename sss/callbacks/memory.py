"""`MemoryMonitor`: peak host memory (RSS) and peak CUDA memory."""

from __future__ import annotations

import sys
from typing import TYPE_CHECKING

import torch

from sss.callbacks.base import Callback

if TYPE_CHECKING:
    from sss.trainer.module import LitModule
    from sss.trainer.trainer import SSSTrainer

__all__ = ["MemoryMonitor", "peak_rss_mb"]


def peak_rss_mb() -> float:
    """Peak resident set size of this process so far, in MiB (``getrusage``; Windows: psutil's peak working set).

    Example:
        >>> peak_rss_mb() > 0
        True
    """
    try:
        import resource
    except ImportError:  # Windows
        import psutil

        return psutil.Process().memory_info().peak_wset / 2**20
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return peak / 2**20 if sys.platform == "darwin" else peak / 2**10  # bytes on macOS, KiB on Linux


class MemoryMonitor(Callback):
    """Every N optimizer steps: ``memory/peak_rss_mb``, ``memory/rss_mb`` and, on CUDA, ``memory/peak_cuda_mb``.

    With several processes the figures are the maximum over processes (a gather every N steps), so
    the one that runs out first shows. Peak CUDA memory is ``torch.cuda.max_memory_allocated`` (what
    tensors used, the figure to compare with the card's size); ``memory/peak_cuda_reserved_mb`` adds the
    caching allocator's reserve. `every_n_steps` defaults to ``trainer.log.every_n_steps``.

    Example:
        >>> from sss import SSSTrainer
        >>> from sss.testing import boring_loader, BoringModule
        >>> monitor = MemoryMonitor(every_n_steps=1)
        >>> trainer = SSSTrainer(max_steps=2, callbacks=[monitor], mixed_precision="no",
        ...                      log={"progress": False, "trackers": []}, checkpoint={"every_epoch": False})
        sss: mixed precision no
        >>> _ = trainer.fit(BoringModule(), train_dataloaders=boring_loader())
        >>> trainer.state.logs["memory/peak_rss_mb"] >= trainer.state.logs["memory/rss_mb"] > 0
        True
    """

    def __init__(self, every_n_steps: int | None = None) -> None:
        self.every_n_steps = every_n_steps
        self.peak: dict[str, float] = {}
        """The latest figures, by log name."""

    def on_fit_start(self, trainer: SSSTrainer, module: LitModule) -> None:
        if self.every_n_steps is None:
            self.every_n_steps = trainer.config.log.every_n_steps

    def on_after_optimizer_step(self, trainer: SSSTrainer, module: LitModule) -> None:
        if trainer.state.global_step % self.every_n_steps:
            return
        import psutil

        rss = psutil.Process().memory_info().rss / 2**20
        # the kernel updates ru_maxrss lazily, so it can trail the current RSS by a few pages
        figures = {"memory/peak_rss_mb": max(peak_rss_mb(), rss), "memory/rss_mb": rss}
        device = trainer.accelerator.device
        if device.type == "cuda":
            figures["memory/peak_cuda_mb"] = torch.cuda.max_memory_allocated(device) / 2**20
            figures["memory/peak_cuda_reserved_mb"] = torch.cuda.max_memory_reserved(device) / 2**20
        if trainer.accelerator.num_processes > 1:
            values = torch.tensor(list(figures.values()), device=device, dtype=torch.float64).reshape(1, -1)
            maxima = trainer.accelerator.gather(values).amax(dim=0).tolist()
            figures = dict(zip(figures, maxima, strict=True))
        self.peak = figures
        trainer.state.logs.update(figures)
