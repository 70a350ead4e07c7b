"""Run by tests/trainer/test_accumulation_ddp.py: gradient accumulation with one process or several.

    python accumulation_parity.py BATCH ACCUM OUT

Trains `BoringModule` (seeded, so every run starts from the same weights) for 2 epochs on 56
shuffled samples with per-process batch BATCH and ACCUM micro-batches per optimizer step, with
AdamW, clipping and a cosine schedule. Each process saves its final parameters, the LR, the
counters and its gradients inside the accumulation windows and at their sync steps to ``OUT.<rank>``
(torch.save).
"""

from __future__ import annotations

import sys

import torch
from accelerate import PartialState
from torch.utils.data import DataLoader

from sss import Callback, SSSTrainer
from sss.testing import BoringDataset, BoringModule


def _grads(module: torch.nn.Module) -> torch.Tensor:
    return torch.cat([p.grad.detach().flatten() for p in module.parameters()])


class GradProbe(Callback):
    """This process's gradients inside a window (no_sync: its own) and at the window's sync (all-reduced)."""

    def __init__(self) -> None:
        self.inside: list[torch.Tensor] = []
        self.synced: list[torch.Tensor] = []

    def on_batch_end(self, trainer, module) -> None:
        if not trainer.accelerator.sync_gradients:  # a micro-batch before the window's last
            self.inside.append(_grads(module))

    def on_after_backward(self, trainer, module) -> None:
        self.synced.append(_grads(module))


batch, accum, out = int(sys.argv[1]), int(sys.argv[2]), sys.argv[3]
probe = GradProbe()
torch.manual_seed(0)
module = BoringModule()
trainer = SSSTrainer(
    callbacks=[probe],
    max_epochs=2,
    gradient_accumulation_steps=accum,
    cpu=True,
    mixed_precision="no",
    max_grad_norm=1.0,
    optim={
        "optimizer": {"_target_": "torch.optim.AdamW", "lr": 0.05, "weight_decay": 0.01},
        "scheduler": {"_target_": "sss.trainer.cosine_with_warmup", "warmup_steps": 2},
    },
    log={"progress": False, "trackers": []},
    checkpoint={"every_epoch": False},
)
trainer.fit(module, train_dataloaders=DataLoader(BoringDataset(56), batch_size=batch, shuffle=True))
result = {
    "params": torch.cat([p.detach().flatten() for p in module.parameters()]),
    "lr": trainer.optimizer.param_groups[0]["lr"],
    "step": trainer.state.global_step,
    "samples": trainer.state.samples,
    "processes": trainer.accelerator.num_processes,
    "inside": probe.inside,
    "synced": probe.synced,
}
torch.save(result, f"{out}.{trainer.accelerator.process_index}")
state = PartialState()
state.wait_for_everyone()
state.destroy_process_group()
