"""Run by tests/callbacks/test_prediction_writer.py in 2 processes: write the predictions of a fixed model for
21 samples (batch 4 per process, so a distributed sampler pads the last batch) with `CSVPredictionWriter`,
once by dataset index (OUT_DIR/by_index.csv) and once by loader position (OUT_DIR/by_position.csv)."""

from __future__ import annotations

import sys
from pathlib import Path

import torch

from sss import SSSTrainer
from sss.callbacks import CSVPredictionWriter
from sss.testing import BoringModule, boring_loader


def run(out_dir: str) -> None:
    torch.manual_seed(0)
    module = BoringModule()
    writers = [
        CSVPredictionWriter(Path(out_dir) / "by_index.csv"),
        CSVPredictionWriter(Path(out_dir) / "by_position.csv", index_key="no_such_key"),
    ]
    trainer = SSSTrainer(callbacks=writers, cpu=True, mixed_precision="no", log={"progress": False, "trackers": []})
    assert trainer.predict(module, dataloaders=boring_loader(n=21, batch_size=4), return_predictions=False) is None


if __name__ == "__main__":
    run(sys.argv[1])
