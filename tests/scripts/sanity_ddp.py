"""Run by tests/trainer/test_fail_fast.py under `accelerate launch` with 2 processes.

Each process trains the same run with the sanity validation on (2 batches, and more batches than
the loader has) and off, then fits a module whose compute_metrics crashes, and saves to
OUT.rank<N>.pt whether its weights and metrics were equal and at which step the crash came.
"""

from __future__ import annotations

import random
import sys

import numpy as np
import torch
from torch import nn
from torch.utils.data import DataLoader

from sss import SSSTrainer
from sss.testing import BoringDataset, BoringModule

CONFIG = {"cpu": True, "mixed_precision": "no", "log": {"progress": False, "trackers": []}}


class Jitter(BoringDataset):
    def __getitem__(self, i):
        item = super().__getitem__(i)
        noise = 0.1 * torch.randn(()) + 0.1 * np.random.rand() + 0.1 * random.random()
        return {**item, "image": item["image"] + noise}


class Dropped(BoringModule):
    def __init__(self) -> None:
        super().__init__()
        self.drop = nn.Dropout(0.5)

    def forward(self, batch):
        return super().forward({**batch, "image": self.drop(batch["image"])})


class BrokenMetrics(BoringModule):
    def compute_metrics(self, outputs, classes=None):
        return {"f1": outputs["no such output"]}


def train(sanity: int) -> tuple[torch.Tensor, dict]:
    torch.manual_seed(0)
    module = Dropped()
    trainer = SSSTrainer(max_epochs=2, sanity_val_batches=sanity, **CONFIG)
    # 21 validation samples over 2 processes: the last batch is padded, and run sample by sample
    val = DataLoader(Jitter(21, seed=1), batch_size=4, shuffle=True)
    metrics = trainer.fit(
        module, train_dataloaders=DataLoader(Jitter(48), batch_size=4, shuffle=True), val_dataloaders=val
    )
    return torch.cat([p.detach().flatten() for p in module.parameters()]), metrics


def main(out: str) -> None:
    off = train(0)
    result = {}
    for sanity in (2, 9):
        on = train(sanity)
        result[sanity] = (torch.equal(on[0], off[0]), on[1] == off[1])
    trainer = SSSTrainer(max_epochs=1, **CONFIG)
    try:
        trainer.fit(
            BrokenMetrics(),
            train_dataloaders=DataLoader(BoringDataset(48), batch_size=4),
            val_dataloaders=DataLoader(BoringDataset(21, seed=1), batch_size=4),
        )
    except KeyError:
        result["crash_step"] = trainer.state.global_step
    result["rank"] = trainer.accelerator.process_index
    torch.save(result, f"{out}.rank{trainer.accelerator.process_index}.pt")


if __name__ == "__main__":
    main(sys.argv[1])
