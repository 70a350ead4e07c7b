"""Plots draws the self-supervised validation metrics: val/retrieval/* in their own panels, val/linear_probe/* among
the scores, per-class keys still left out; from a fit and from the history a resume reads back."""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

import torch

from sss import SSSTrainer
from sss.callbacks import Plots
from sss.callbacks.metrics_logger import CSVTracker
from sss.metrics import linear_probe, retrieval_metrics
from sss.testing import BoringModule, boring_loader

RECALLS = {f"val/retrieval/{way}_r{k}" for way in ("audio_to_image", "image_to_audio") for k in (1, 5, 10)}
RANKS = {"val/retrieval/audio_to_image_median_rank", "val/retrieval/image_to_audio_median_rank"}


class PairedBoring(BoringModule):
    """BoringModule that also reports what a contrastive module does: retrieval and a probe on its encoders."""

    def validation_outputs(self, outputs: Any, batch: dict[str, Any]) -> dict[str, torch.Tensor]:
        out = super().validation_outputs(outputs, batch)
        out["image_embedding"] = self.image_encoder(batch["image"])
        out["audio_embedding"] = self.audio_encoder(batch["audio"])
        return out

    def compute_metrics(self, outputs: dict[str, torch.Tensor], classes: Any = None) -> dict[str, float]:
        image, audio = outputs["image_embedding"], outputs["audio_embedding"]
        probe = linear_probe(torch.cat([image, audio], 1), outputs["target"], folds=2)
        return super().compute_metrics(outputs, classes) | retrieval_metrics(image, audio) | probe


def _series(fig: Any) -> dict[str, set[str]]:
    return {ax.get_title().split(": ")[0]: {line.get_label() for line in ax.get_lines()} for ax in fig.axes}


def test_a_fit_plots_retrieval_and_probe_curves(tmp_path) -> None:
    plots = Plots(every_n_steps=2)
    trainer = SSSTrainer(
        callbacks=[plots],
        max_epochs=2,
        mixed_precision="no",
        output_dir=str(tmp_path / "run"),
        log={"progress": False, "trackers": []},
        checkpoint={"every_epoch": False},
        max_grad_norm=None,
    )
    trainer.fit(PairedBoring(), train_dataloaders=boring_loader(n=32), val_dataloaders=boring_loader(n=24))
    assert RECALLS | RANKS | {"val/linear_probe/accuracy"} <= set(trainer.state.metrics)
    assert any(k.startswith("val/f1/") for k in trainer.state.metrics)  # per-class keys there, to be left out

    fig = plots.figures["metrics"]
    series = _series(fig)
    assert series["retrieval"] == RECALLS
    assert series["retrieval rank"] == RANKS
    assert "val/linear_probe/accuracy" in series["validation metrics"]
    assert not any("/f1/" in name for names in series.values() for name in names)
    by_title = {ax.get_title().split(": ")[0]: ax for ax in fig.axes}
    assert by_title["retrieval"].get_ylabel() == "recall at k (chance k / N)"
    rank_axis = by_title["retrieval rank"]
    assert rank_axis.get_ylabel() == "median rank of the true pair" and rank_axis.get_yscale() == "linear"
    fig.canvas.draw()  # tick labels exist once drawn: the ranks' axis must show numbers
    assert any(t.get_text() for t in rank_axis.get_yticklabels())
    for line in by_title["retrieval"].get_lines():  # one point per validation, at its step, each a recall
        steps, values = line.get_data()
        assert len(steps) == 2 and all(0.0 <= v <= 1.0 for v in values), line.get_label()
    assert (tmp_path / "run" / "plots" / "metrics.png").read_bytes().startswith(b"\x89PNG")


def test_the_history_a_resume_reads_back_keeps_them(tmp_path) -> None:
    tracker = CSVTracker(tmp_path / "logs")
    tracker.log({"train/loss": 0.9}, step=1)
    tracker.log({"val/retrieval/audio_to_image_r1": 0.2, "val/linear_probe/accuracy": 0.6, "val/f1/dog": 0.5}, step=2)
    tracker.log({"val/retrieval/audio_to_image_r1": 0.4, "val/linear_probe/accuracy": 0.7, "val/f1/dog": 0.6}, step=4)
    plots = Plots()
    plots._history_until = 4
    plots._load_history(SimpleNamespace(output_dir=tmp_path))
    assert plots.evals == {
        "val/retrieval/audio_to_image_r1": [(2, 0.2), (4, 0.4)],
        "val/linear_probe/accuracy": [(2, 0.6), (4, 0.7)],
    }
    series = _series(plots.build()["metrics"])
    assert series["retrieval"] == {"val/retrieval/audio_to_image_r1"}
    assert series["validation metrics"] == {"val/linear_probe/accuracy"}
