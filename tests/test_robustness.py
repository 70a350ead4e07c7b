"""The robustness report: each modality absent from 0, 25, 50 and 100 % of the samples, through the absent path.

`sss.evaluation.evaluate` returns it, `sss fit` writes it to results.json and plots/robustness.png.
"""

from __future__ import annotations

import json
from pathlib import Path

import torch
import torch.nn.functional as F

from sss import SSSTrainer
from sss.callbacks.plots import robustness_figure
from sss.cli import main
from sss.data.presence import presence
from sss.evaluation import REPORTED, ROBUSTNESS_RATES, evaluate
from sss.testing import BoringModule, boring_loader

QUIET = {"mixed_precision": "no", "log": {"progress": False, "trackers": []}}
RATES = ["0.0", "0.25", "0.5", "1.0"]


def _strip(metrics: dict[str, float], prefix: str = "val") -> dict[str, float]:
    return {k.removeprefix(f"{prefix}/"): v for k, v in metrics.items()}


def _reported(metrics: dict[str, float]) -> dict[str, float]:
    return {k: v for k, v in metrics.items() if k in REPORTED}


def test_the_report_has_each_modality_at_each_rate_and_rate_zero_is_the_plain_validation():
    assert [str(rate) for rate in ROBUSTNESS_RATES] == RATES
    module, loader = BoringModule(), boring_loader(n=20, batch_size=8)
    trainer = SSSTrainer(**QUIET)
    result = evaluate(trainer, module, dataloaders=loader)
    report = result["robustness"]
    assert list(report) == ["image", "audio"] and all(list(rows) == RATES for rows in report.values())
    assert all(set(row) == {"accuracy", "macro_f1", "loss"} for rows in report.values() for row in rows.values())

    plain = _strip(SSSTrainer(**QUIET).validate(module, dataloaders=loader))
    assert report["image"]["0.0"] == report["audio"]["0.0"] == _reported(plain)  # exactly: the same numbers
    assert report["image"]["1.0"] == _reported(result["ablation"]["audio_only"])  # rate 1: the ablation pass
    assert report["audio"]["1.0"] == _reported(result["ablation"]["image_only"])
    # Half the audio gone changes a module that reads it: the report is not the plain validation repeated.
    assert report["audio"]["0.5"]["loss"] != report["audio"]["0.0"]["loss"]

    # A module that does not read the presence masks sees zeros: its ablation figures are the old zeroing's.
    zeroed = _strip(SSSTrainer(**QUIET).validate(module, dataloaders=loader, zero="audio", prefix="z"), "z")
    assert result["ablation"]["image_only"] == zeroed


class ImageReader(BoringModule):
    """Right wherever the image is present, wrong where it is absent; blind to the audio. Records the absent ids."""

    def __init__(self) -> None:
        super().__init__()
        self.absent: list[tuple[set[int], set[int]]] = []  # per forward: (image absent, audio absent) sample ids

    def forward(self, batch):
        logits = super().forward(batch)
        ids = batch["index"]
        size = len(ids)
        image, audio = (presence(batch, m, size) for m in ("image", "audio"))
        self.absent.append((set(ids[~image].tolist()), set(ids[~audio].tolist())))
        target = F.one_hot(batch["label"], 2).float() * 10
        return torch.where(image[:, None], target, -target) + 0 * logits


def test_rates_are_nested_and_the_metrics_follow_the_absent_samples():
    n = 200
    module = ImageReader()
    result = evaluate(SSSTrainer(**QUIET), module, dataloaders=boring_loader(n=n, batch_size=n))
    # One batch per pass: image only, audio only, rate 0, image 0.25, image 0.5, audio 0.25, audio 0.5, fused.
    passes = module.absent
    assert len(passes) == 8
    everyone = set(range(n))
    assert passes[0] == (set(), everyone) and passes[1] == (everyone, set())
    assert passes[2] == passes[7] == (set(), set())
    image25, image50, audio25, audio50 = passes[3][0], passes[4][0], passes[5][1], passes[6][1]
    assert passes[3][1] == passes[4][1] == passes[5][0] == passes[6][0] == set()  # one modality at a time
    assert image25 < image50 and audio25 < audio50  # the samples absent at 0.25 are absent at 0.5 too
    assert 30 <= len(image25) <= 70 and 75 <= len(image50) <= 125 and 30 <= len(audio25) <= 70
    assert image25 != audio25  # each modality draws its own samples

    report = result["robustness"]
    for rate, gone in (("0.0", set()), ("0.25", image25), ("0.5", image50), ("1.0", everyone)):
        assert report["image"][rate]["accuracy"] == 1 - len(gone) / n, rate
    assert [report["audio"][rate]["accuracy"] for rate in RATES] == [1.0] * 4  # the audio is never read

    # The same seed draws the same samples in a second evaluation.
    again = ImageReader()
    evaluate(SSSTrainer(**QUIET), again, dataloaders=boring_loader(n=n, batch_size=n))
    assert again.absent == passes


def test_no_report_without_the_ablation_or_with_one_modality():
    module, loader = BoringModule(), boring_loader(n=8)
    assert "robustness" not in evaluate(SSSTrainer(**QUIET), module, dataloaders=loader, ablation=False)

    class ImageOnly(BoringModule):
        modalities = ("image",)

    assert "robustness" not in evaluate(SSSTrainer(**QUIET), ImageOnly(), dataloaders=loader)


def test_the_curve_has_a_line_per_modality_over_the_rates():
    report = {
        "image": {r: {"accuracy": a, "loss": 1.0} for r, a in zip(RATES, (0.9, 0.8, 0.7, 0.5), strict=True)},
        "audio": {r: {"accuracy": a, "loss": 1.0} for r, a in zip(RATES, (0.9, 0.85, 0.8, 0.6), strict=True)},
    }
    ax = robustness_figure(report).axes[0]
    lines = {line.get_label(): line for line in ax.get_lines()}
    assert list(lines) == ["image absent", "audio absent"] and ax.get_ylabel() == "accuracy"
    assert list(lines["image absent"].get_xdata()) == [0.0, 0.25, 0.5, 1.0]
    assert list(lines["audio absent"].get_ydata()) == [0.9, 0.85, 0.8, 0.6]


CONFIG = """\
name: boring
model: {_target_: sss.testing.BoringModule}
data: {_target_: sss.testing.BoringDataModule, n_train: 16, n_val: 24, batch_size: 8}
trainer:
  output_dir: run
  max_epochs: 1
  log: {progress: false, trackers: [csv]}
"""


def test_sss_fit_writes_the_report_to_results_json_a_table_and_a_png(capsys):
    Path("boring.yaml").write_text(CONFIG)
    assert main(["fit", "boring.yaml"]) == 0
    out = capsys.readouterr().out
    assert "rate absent" in out and "image absent" in out and "audio absent" in out
    results = json.loads(Path("run/results.json").read_text())
    report = results["robustness"]
    assert list(report) == ["image", "audio"] and all(list(rows) == RATES for rows in report.values())
    # Rate 0 is the final validation's figures; rate 1 the ablation's, which results.json also names.
    for name in ("accuracy", "macro_f1", "loss"):
        assert report["image"]["0.0"][name] == report["audio"]["0.0"][name] == results[f"val/{name}"]
    assert report["image"]["1.0"]["accuracy"] == results["val/accuracy_audio_only"]
    assert report["audio"]["1.0"]["accuracy"] == results["val/accuracy_image_only"]
    assert not any(k.startswith("val_absent") for k in results)  # the passes' own keys stay out
    png = Path("run/plots/robustness.png")
    assert results["plot/robustness"] == str(png) and png.read_bytes().startswith(b"\x89PNG")
    summary = out.split("sss fit boring: results")[1]
    assert "│ plot/robustness " in summary and "│ robustness " not in summary  # the report has its own table
