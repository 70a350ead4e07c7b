"""Run by tests/trainer/test_distributed.py under `accelerate launch --cpu --num_processes 2`, and in-process.

Trains `CountingModule` on `BoringDataset` with per-process batch BATCH and saves, from the main
process, the final parameters, LR, counters and metrics to OUT.
"""

from __future__ import annotations

import copy
import sys

import torch
from torch.utils.data import DataLoader

from sss import SSSTrainer
from sss.testing import BoringDataset, BoringModule

CONFIG = {
    "max_epochs": 2,
    "cpu": True,
    "mixed_precision": "no",
    "max_grad_norm": 1.0,
    "optim": {
        "optimizer": {"_target_": "torch.optim.AdamW", "lr": 0.05, "weight_decay": 0.01},
        "scheduler": {"_target_": "sss.trainer.cosine_with_warmup", "warmup_steps": 2},
    },
    "log": {"progress": False, "trackers": []},
    "checkpoint": {"every_epoch": False},
}


class CountingModule(BoringModule):
    """Reports how many validation samples reached the metrics (padding duplicates must not)."""

    def compute_metrics(self, outputs):
        return {**super().compute_metrics(outputs), "count": float(len(outputs["loss"]))}


def run(batch_size: int, out_path: str | None = None) -> dict:
    torch.manual_seed(0)
    module = CountingModule()
    trainer = SSSTrainer(**copy.deepcopy(CONFIG))
    metrics = trainer.fit(
        module,
        train_dataloaders=DataLoader(BoringDataset(48), batch_size=batch_size, shuffle=True),
        val_dataloaders=DataLoader(BoringDataset(21, seed=1), batch_size=batch_size),
    )
    result = {
        "params": torch.cat([p.detach().flatten() for p in module.parameters()]),
        "lr": trainer.optimizer.param_groups[0]["lr"],
        "step": trainer.state.global_step,
        "total_steps": trainer.total_steps,
        "samples": trainer.state.samples,
        "metrics": metrics,
        "processes": trainer.accelerator.num_processes,
    }
    if out_path is not None and trainer.accelerator.is_main_process:
        torch.save(result, out_path)
    return result


if __name__ == "__main__":
    run(int(sys.argv[1]), sys.argv[2])
