"""Run by tests/data/test_stream_ddp.py under `accelerate launch` with 2 processes.

Trains `hunter_tiny` for 2 epochs on each data folder given (``ROOT:LAYOUT``) with 2 DataLoader workers per
process, recording every training batch's sample indices, and saves them to OUT.rank<N>.pt.
"""

from __future__ import annotations

import os
import sys

import torch

from sss import SSSTrainer
from sss.data import ManifestDataModule
from sss.models import create_model


def seen_batches(root: str, layout: str) -> list[tuple[int, list[int]]]:
    streaming = layout == "hf"
    data = ManifestDataModule(root, layout=layout, streaming=streaming, batch_size=4, num_workers=2, image_size=32)
    module = create_model("hunter_tiny", num_classes=len(data.classes))
    trainer = SSSTrainer(max_epochs=2, cpu=True, sanity_val_batches=0, log={"progress": False, "trackers": []})
    seen: list[tuple[int, list[int]]] = []
    step = module.training_step

    def recording_step(batch, batch_idx):
        seen.append((trainer.state.epoch, batch["index"].tolist()))
        return step(batch, batch_idx)

    module.training_step = recording_step  # this instance only: what each process trains on, batch by batch
    trainer.fit(module, data)
    return seen


if __name__ == "__main__":
    out, folders = sys.argv[1], sys.argv[2:]
    rank = int(os.environ["RANK"])
    results = {folder: seen_batches(*folder.rsplit(":", 1)) for folder in folders}
    torch.save({"rank": rank, "seen": results}, f"{out}.rank{rank}.pt")
