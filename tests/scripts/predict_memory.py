"""Resident-memory growth of `predict` over 20,000 rows, streamed by a CSVPredictionWriter and kept (the control).

Run in a fresh process by tests/callbacks/test_prediction_writer.py: in a long test process, memory that
earlier tests freed is reused and hides the growth. Prints JSON {"streamed": bytes, "kept": bytes, "rows": n}.
"""

from __future__ import annotations

import csv
import json
import sys
from pathlib import Path

import psutil

from sss import Callback, SSSTrainer
from sss.callbacks import CSVPredictionWriter
from sss.testing import BoringModule, boring_loader

QUIET = {"cpu": True, "mixed_precision": "no", "log": {"progress": False, "trackers": []}}


class PeakRSS(Callback):
    """The largest resident memory of this process seen after any predict batch."""

    def __init__(self) -> None:
        self.process, self.peak = psutil.Process(), 0

    def on_predict_batch_end(self, trainer, module):
        self.peak = max(self.peak, self.process.memory_info().rss)


class Wide(BoringModule):
    """64 values per row (20,000 rows: 5 MB of outputs), so that keeping them shows in the resident memory."""

    def predict_step(self, batch, batch_idx):
        return self(batch).repeat(1, 32)


def growth(trainer: SSSTrainer, peak: PeakRSS, rows: int, keep: bool) -> int:
    loader = boring_loader(n=rows, batch_size=100)  # its 5 MB of inputs are there before the measurement
    before = peak.process.memory_info().rss
    kept = trainer.predict(Wide(), dataloaders=loader, return_predictions=keep)
    assert (kept is None) is not keep
    return peak.peak - before


if __name__ == "__main__":
    out = Path(sys.argv[1])
    peak = PeakRSS()
    writer = CSVPredictionWriter(out / "warmup.csv")
    trainer = SSSTrainer(callbacks=[writer, peak], **QUIET)
    growth(trainer, peak, 2_000, keep=False)  # first-use allocations (csv, the prepared model) happen here
    writer.path, peak.peak = out / "predictions.csv", 0
    streamed = growth(trainer, peak, 20_000, keep=False)
    trainer.callbacks.remove(writer)
    peak.peak = 0
    kept = growth(trainer, peak, 20_000, keep=True)  # the control: the same outputs, kept
    with (out / "predictions.csv").open(newline="") as f:
        rows = sum(1 for _ in csv.reader(f))
    print(json.dumps({"streamed": streamed, "kept": kept, "rows": rows}))
