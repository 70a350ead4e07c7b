"""Plots: on by default; the confusion matrix is the fused validation's with class-name ticks (the ablation passes get
their own files); metrics.png has one labelled panel per metric family; an error without matplotlib; the whole run's
curves after a resume."""

from __future__ import annotations

import sys
import warnings
from pathlib import Path

import pytest
import torch

from sss import SSSTrainer
from sss.callbacks import GradNormMonitor, Plots
from sss.callbacks.plots import FAMILIES
from sss.callbacks.stock import add_stock_callbacks
from sss.testing import BoringModule, boring_loader
from sss.warnings import SSSWarning

PNG = b"\x89PNG\r\n\x1a\n"
CONFIG = """\
name: boring
model: {_target_: sss.testing.BoringModule}
data: {_target_: sss.testing.BoringDataModule, n_train: 64, n_val: 24, batch_size: 8}
trainer:
  output_dir: run
  max_epochs: 2
  max_grad_norm: null
  mixed_precision: "no"
  log: {progress: false, trackers: [csv], every_n_steps: 2}
callbacks:
  - {_target_: sss.callbacks.GradNormMonitor, every_n_steps: 2}
  - {_target_: sss.callbacks.Throughput, every_n_steps: 2}
"""


def _trainer(tmp_path, callbacks):
    return SSSTrainer(
        callbacks=callbacks,
        max_epochs=2,
        mixed_precision="no",
        output_dir=str(tmp_path / "run"),
        log={"progress": False, "trackers": []},
        checkpoint={"every_epoch": False},
        max_grad_norm=None,  # BoringModule's gradients sit above the default clip value of 1.0
    )


def _matrix(preds, target, n=2):
    return torch.bincount(target.long() * n + preds.long(), minlength=n * n).reshape(n, n).tolist()


def _shown(fig):
    """The counts a confusion-matrix figure shows, as a list of rows, from its image and from its cell texts."""
    ax = fig.axes[0]
    image = ax.images[0].get_array().tolist()
    n = len(image)
    texts = [[None] * n for _ in range(n)]
    for t in ax.texts:
        x, y = t.get_position()
        texts[int(y)][int(x)] = int(t.get_text())
    assert texts == image
    return image


@pytest.fixture
def sss_fit_spy(monkeypatch):
    """The Plots instance and trainer of an `sss fit` run: a spy on `Plots.on_fit_end` that changes nothing."""
    seen = {}
    original = Plots.on_fit_end

    def spy(self, trainer, module):
        original(self, trainer, module)
        seen.update(plots=self, trainer=trainer)

    monkeypatch.setattr(Plots, "on_fit_end", spy)
    return seen


def test_sss_fit_plots_the_fused_validation_by_default(sss_fit_spy, capsys):
    from sss.cli import main

    Path("boring.yaml").write_text(CONFIG)  # no Plots in the config: the stock one
    assert main(["fit", "boring.yaml"]) == 0
    plots, trainer = sss_fit_spy["plots"], sss_fit_spy["trainer"]
    folder = Path("run") / "plots"
    names = [
        "metrics.png",
        "confusion_matrix.png",
        "confusion_matrix_audio_only.png",
        "confusion_matrix_image_only.png",
        "robustness.png",  # no confusion matrix for the robustness passes: one curve
    ]
    assert [p.name for p in plots.files] == names
    for path in plots.files:
        data = path.read_bytes()
        assert path.parent == folder and data.startswith(PNG) and len(data) > 5000, path
    assert f"sss: plots in {folder}: {', '.join(names)}" in capsys.readouterr().out

    # The confusion matrix is the fused pass's: what trainer.state holds after the final evaluation (whose
    # ablation passes ran after it), not the audio-only pass that ran last.
    fused = trainer.state.eval_outputs
    assert len(fused["target"]) == 24
    fig = plots.figures["confusion_matrix"]
    assert _shown(fig) == _matrix(fused["preds"], fused["target"])
    ax = fig.axes[0]
    assert [t.get_text() for t in ax.get_xticklabels()] == ["a", "b"]  # BoringDataModule.classes
    assert [t.get_text() for t in ax.get_yticklabels()] == ["a", "b"]
    assert (ax.get_xlabel(), ax.get_ylabel()) == ("predicted class", "true class")
    step = trainer.state.global_step
    assert ax.get_title().startswith(f"val, fused (image + audio): 24 samples at step {step}\naccuracy ")
    accuracy = float((fused["preds"] == fused["target"]).double().mean())
    assert f"accuracy {accuracy:.3f}" in ax.get_title()
    assert accuracy == pytest.approx(trainer.state.metrics["val/accuracy"])
    audio = plots.passes["val_audio_only"]
    assert _shown(plots.figures["confusion_matrix_audio_only"]) == _matrix(audio.preds, audio.target)
    assert _matrix(audio.preds, audio.target) != _matrix(fused["preds"], fused["target"])  # the check can tell them
    title = plots.figures["confusion_matrix_audio_only"].axes[0].get_title()
    assert title.startswith(f"val, audio only (image absent): 24 samples at step {step}")
    assert plots.figures["confusion_matrix_image_only"].axes[0].get_title().startswith("val, image only (audio absent)")

    # metrics.png: one panel per family, each with its y label, x the optimizer step
    axes = plots.figures["metrics"].axes
    titles = [a.get_title().split(": ")[0] for a in axes]  # "update ratio: train/update_ratio" for one series
    assert titles == [
        "loss",
        "validation metrics",
        "learning rate",
        "gradient norm",
        "gradient share",
        "update ratio",
        "throughput",
        "step time",
        "data wait",
    ]
    ylabels = {f.title: f.ylabel for f in FAMILIES}
    for title, a in zip(titles, axes, strict=True):
        assert a.get_xlabel() == "optimizer step" and a.get_ylabel() == ylabels[title], title
    by_title = dict(zip(titles, axes, strict=True))
    series = {t: {line.get_label() for line in a.get_lines()} for t, a in by_title.items()}
    assert series["loss"] == {"train/loss", "val/loss"}
    assert series["validation metrics"] == {"val/accuracy", "val/macro_f1", "val/micro_f1"}  # no per-class keys
    assert any(k.count("/") == 2 for k in trainer.state.metrics)  # per-class keys were there to leave out
    parts = {f"train/grad_norm/{p}" for p in ("image", "audio", "fusion", "heads")}
    assert series["gradient norm"] == {"train/grad_norm", *parts}
    assert not any(k.startswith(("val_image_only", "val_audio_only", "val_absent")) for s in series.values() for k in s)
    # a legend beside the data, not over it; none for a single series
    for a in axes:
        legend = a.get_legend()
        if len(a.get_lines()) == 1:
            assert legend is None and a.get_title().endswith(": " + a.get_lines()[0].get_label()), a.get_title()
        else:
            assert legend.get_window_extent().x0 >= a.get_window_extent().x1, a.get_title()


def test_a_fit_writes_the_latest_validation_of_its_own(tmp_path, capsys):
    from matplotlib.image import imread

    plots = Plots(every_n_steps=2)
    trainer = _trainer(tmp_path, [GradNormMonitor(every_n_steps=2), plots])
    trainer.fit(BoringModule(), train_dataloaders=boring_loader(n=64), val_dataloaders=boring_loader(n=24, seed=1))
    folder = tmp_path / "run" / "plots"
    assert plots.files == [folder / "metrics.png", folder / "confusion_matrix.png"]
    for path in plots.files:
        image = imread(path)
        assert image.shape[0] > 100 and image.shape[1] > 100 and image.std() > 0  # not a blank canvas
    assert set(plots.train) == {"train/loss", "train/lr"} | {
        f"train/grad_norm/{p}" for p in ("image", "audio", "fusion", "heads")
    } | {f"train/grad_share/{p}" for p in ("image", "audio", "fusion", "heads")} | {
        "train/grad_norm",
        "train/update_ratio",
    }
    assert len(plots.train["train/loss"]) == 8 / 2 * 2  # 8 steps per epoch, every 2nd, 2 epochs
    assert [step for step, _ in plots.evals["val/accuracy"]] == [8, 16]
    latest = trainer.state.eval_outputs
    assert _shown(plots.figures["confusion_matrix"]) == _matrix(latest["preds"], latest["target"])
    ticks = [t.get_text() for t in plots.figures["confusion_matrix"].axes[0].get_xticklabels()]
    assert ticks == ["0", "1"]  # loaders without a datamodule: no class names


def test_plots_are_stock_and_one_setting_turns_them_off(tmp_path):
    on = add_stock_callbacks(SSSTrainer(mixed_precision="no", output_dir=str(tmp_path)))
    off = add_stock_callbacks(SSSTrainer(mixed_precision="no", output_dir=str(tmp_path), log={"plots": False}))
    assert [type(c) for c in on.callbacks].count(Plots) == 1
    assert Plots not in [type(c) for c in off.callbacks]
    mine = Plots(dpi=50)
    assert [c for c in add_stock_callbacks(SSSTrainer(callbacks=[mine], mixed_precision="no")).callbacks
            if isinstance(c, Plots)] == [mine]  # fmt: skip


def test_missing_matplotlib_fails_at_fit_start_with_the_install_command(tmp_path, monkeypatch):
    monkeypatch.setitem(sys.modules, "matplotlib", None)  # makes `import matplotlib` raise ImportError
    trainer = _trainer(tmp_path, [Plots()])
    with pytest.raises(ModuleNotFoundError, match=r"pip install 'matplotlib>=3.7'.*trainer\.log\.plots=false"):
        trainer.fit(BoringModule(), train_dataloaders=boring_loader())
    assert trainer.state.global_step == 0


def _logged_fit(out, steps, ckpt_path=None):
    plots = Plots(every_n_steps=2)
    trainer = add_stock_callbacks(
        SSSTrainer(
            callbacks=[GradNormMonitor(every_n_steps=2), plots],
            max_steps=steps,
            mixed_precision="no",
            output_dir=str(out),
            log={"progress": False, "trackers": ["csv"], "every_n_steps": 2},
            checkpoint={"every_n_steps": 2, "every_epoch": False, "keep_last": None},
            max_grad_norm=None,
        )
    )
    torch.manual_seed(0)  # the same initial weights in every fit (a resume replaces them anyway)
    val = boring_loader(n=16, seed=1)
    trainer.fit(BoringModule(), train_dataloaders=boring_loader(n=64), val_dataloaders=val, ckpt_path=ckpt_path)
    return plots


def test_a_resumed_fit_plots_the_whole_run(tmp_path):
    whole = _logged_fit(tmp_path / "whole", 12)
    _logged_fit(tmp_path / "cut", 6)  # as if killed after step 6, then resumed from its step-4 checkpoint
    resumed = _logged_fit(tmp_path / "cut", 12, ckpt_path=tmp_path / "cut" / "checkpoints" / "step_0000004")
    assert [s for s, _ in resumed.train["train/loss"]] == [2, 4, 6, 8, 10, 12]
    assert "train/grad_share/audio" in resumed.train
    assert resumed.train == whole.train  # steps 2 and 4 read back from metrics.csv, exactly as logged
    assert resumed.evals == whole.evals and [s for s, _ in resumed.evals["val/loss"]] == [8, 12]


# Monitoring from the quick start: TensorBoard and matplotlib come with `pip install -e .`, imported lazily, and a
# tracker that is missing all the same is named with the command that installs it.


def test_tensorboard_and_matplotlib_are_dependencies_imported_lazily():
    import re
    import subprocess

    text = (Path(__file__).parents[2] / "pyproject.toml").read_text()
    dependencies = text.split("\ndependencies = [", 1)[1].split("\n]", 1)[0]  # [project] dependencies, not extras
    assert re.search(r'"tensorboard>=[\d.]+"', dependencies) and re.search(r'"matplotlib>=[\d.]+"', dependencies)
    code = "import sys, sss, sss.callbacks; print(sorted(m for m in ('matplotlib', 'tensorboard') if m in sys.modules))"
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert done.returncode == 0 and done.stdout.strip() == "[]", done.stderr[-2000:]


def _tracked_fit(trackers):
    trainer = add_stock_callbacks(
        SSSTrainer(
            max_steps=2,
            mixed_precision="no",
            output_dir="tracked",
            log={"progress": False, "plots": False, "trackers": trackers, "every_n_steps": 1},
            checkpoint={"every_epoch": False},
        )
    )
    with pytest.warns() as caught:
        warnings.warn("a marker, so that pytest.warns sees at least one warning", UserWarning, stacklevel=1)
        trainer.fit(BoringModule(), train_dataloaders=boring_loader())
    return [str(w.message) for w in caught if w.category is SSSWarning]


def test_a_requested_tracker_that_is_not_installed_is_named_with_its_pip_command(monkeypatch):
    import accelerate.tracking

    assert _tracked_fit(["csv", "tensorboard"]) == []  # installed: written, no warning
    assert any(Path("tracked/logs/tracked").glob("events.out.tfevents.*"))
    monkeypatch.setattr(accelerate.tracking, "_available_trackers", [])  # as on a machine without tensorboard
    assert _tracked_fit(["csv", "tensorboard"]) == [
        "tracker 'tensorboard' of trainer.log.trackers is not installed, so nothing is logged to it: "
        "pip install tensorboard (or remove it from trainer.log.trackers)"
    ]
    assert Path("tracked/logs/metrics.csv").exists()  # the others still log
