"""DebugShapes: shapes once per stage, anomaly detection during fit only."""

from __future__ import annotations

import pytest
import torch

from sss import SSSTrainer
from sss.callbacks import DebugShapes
from sss.testing import BoringModule, boring_loader

QUIET = {"log": {"progress": False, "trackers": []}, "checkpoint": {"every_epoch": False}, "mixed_precision": "no"}


def test_shapes_are_printed_once_per_stage_and_anomaly_mode_is_restored(capsys):
    seen = []

    class Probe(BoringModule):
        def training_step(self, batch, batch_idx):
            seen.append(torch.is_anomaly_enabled())
            return super().training_step(batch, batch_idx)

    trainer = SSSTrainer(max_epochs=2, callbacks=[DebugShapes()], **QUIET)
    trainer.fit(Probe(), train_dataloaders=boring_loader(n=16, batch_size=4), val_dataloaders=boring_loader(n=8))
    out = capsys.readouterr().out
    assert all(seen) and not torch.is_anomaly_enabled()
    assert out.count("sss debug [fit] batch: audio float32 [4, 1, 16]") == 1
    assert out.count("sss debug [val] batch:") == 1 and out.count("sss debug [val] outputs ->") == 1  # 2 passes
    for part in ("image_encoder -> float32 [4, 8]", "audio_encoder -> float32 [4, 8]", "fusion_head -> float32 [4, 2]"):
        assert out.count(f"sss debug [fit] {part}") == 1
    assert out.count("sss debug [fit] loss:") == 1


def test_anomaly_detection_names_the_operation_that_made_a_nan():
    class NanLoss(BoringModule):
        def compute_loss(self, outputs, batch):
            return torch.sqrt(outputs - outputs.max() - 1).sum()  # sqrt of negatives: NaN forward and backward

    trainer = SSSTrainer(max_steps=1, callbacks=[DebugShapes()], **QUIET)
    with pytest.raises(RuntimeError, match="SqrtBackward0"), pytest.warns(UserWarning, match="[Aa]nomaly"):
        trainer.fit(NanLoss(), train_dataloaders=boring_loader(n=8))
    assert not torch.is_anomaly_enabled()
