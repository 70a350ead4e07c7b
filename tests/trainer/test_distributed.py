"""Two CPU processes (gloo) with per-process batch b train the same model as one process with batch 2b."""

from __future__ import annotations

import copy

import pytest
import torch
from accelerate import debug_launcher
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


def _run(batch_size: int, out_path: str | None = None) -> dict:
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


@pytest.mark.slow
def test_two_processes_equal_one_process_with_double_batch(tmp_path):
    out = str(tmp_path / "ddp.pt")
    debug_launcher(_run, args=(4, out), num_processes=2)
    ddp = torch.load(out)
    single = _run(8)
    assert ddp["processes"] == 2 and single["processes"] == 1
    assert ddp["step"] == single["step"] == ddp["total_steps"] == 12
    assert ddp["samples"] == single["samples"] == 96
    torch.testing.assert_close(ddp["params"], single["params"], rtol=1e-5, atol=1e-6)
    # the schedule stepped once per optimizer step, not once per process (Accelerate #2926)
    assert ddp["lr"] == pytest.approx(single["lr"], rel=1e-12)
    # gather_for_metrics dropped the sampler's padding: 21 samples, not 24
    assert ddp["metrics"]["val/count"] == single["metrics"]["val/count"] == 21
    assert ddp["metrics"]["val/accuracy"] == pytest.approx(single["metrics"]["val/accuracy"])
