"""Run by tests/trainer/test_distributed_eval.py in 1 and 2 processes: evaluate a fixed model on 21 samples
(batch 4, so the last batch is short and a distributed sampler pads it) and save the metrics from the main
process to OUT."""

from __future__ import annotations

import sys

import torch

from sss import SSSTrainer, create_model
from sss.evaluation import evaluate


class Samples(torch.utils.data.Dataset):
    """Images, 0.5 s of audio, class labels, event frame targets and shadow masks, all seeded."""

    def __init__(self, n: int = 21) -> None:
        g = torch.Generator().manual_seed(1)
        self.image = torch.rand(n, 3, 32, 32, generator=g)
        self.audio = torch.randn(n, 1, 8000, generator=g) * 0.1
        self.label = torch.randint(0, 3, (n,), generator=g)
        self.events = (torch.rand(n, 50, 2, generator=g) > 0.7).float()
        self.mask = (torch.rand(n, 1, 32, 32, generator=g) > 0.5).float()

    def __len__(self) -> int:
        return len(self.label)

    def __getitem__(self, i: int) -> dict:
        return {k: getattr(self, k)[i] for k in ("image", "audio", "label", "events", "mask")} | {"index": i}


def run(out_path: str) -> None:
    torch.manual_seed(0)
    module = create_model("hunter_tiny", num_classes=3, num_event_classes=2, mask_head=True)
    trainer = SSSTrainer(cpu=True, mixed_precision="no", log={"progress": False, "trackers": []})
    loader = torch.utils.data.DataLoader(Samples(), batch_size=4)
    result = evaluate(trainer, module, dataloaders=loader, split="val")
    if trainer.accelerator.is_main_process:
        torch.save({"result": result, "processes": trainer.accelerator.num_processes}, out_path)


if __name__ == "__main__":
    run(sys.argv[1])
