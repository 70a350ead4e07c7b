"""Plots: valid PNGs under OUTPUT_DIR/plots, a confusion matrix matching the accuracy, an error without matplotlib,
and the whole run's curves after a resume."""

from __future__ import annotations

import sys

import pytest
import torch

from sss import SSSTrainer
from sss.callbacks import GradNormMonitor, Plots
from sss.callbacks.stock import add_stock_callbacks
from sss.testing import BoringModule, boring_loader

PNG = b"\x89PNG\r\n\x1a\n"


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


def test_curves_and_confusion_matrix_are_written(tmp_path, capsys):
    from matplotlib.image import imread

    plots = Plots(every_n_steps=2)
    trainer = _trainer(tmp_path, [GradNormMonitor(every_n_steps=2), plots])
    trainer.fit(BoringModule(), train_dataloaders=boring_loader(n=64), val_dataloaders=boring_loader(n=24, seed=1))
    folder = tmp_path / "run" / "plots"
    names = ["loss.png", "metrics.png", "lr.png", "grad_norms.png", "confusion_matrix.png"]
    assert plots.files == [folder / n for n in names]
    for path in plots.files:
        data = path.read_bytes()
        assert data.startswith(PNG) and len(data) > 5000, path
        image = imread(path)
        assert image.shape[0] > 100 and image.shape[1] > 100 and image.std() > 0  # not a blank canvas
    # the summary line names every file
    out = capsys.readouterr().out
    assert all(str(p) in out for p in plots.files)
    # the matrix is over the latest validation: its diagonal is the reported accuracy
    assert set(plots.train) == {"train/loss", "train/lr"} | {
        f"train/grad_norm/{p}" for p in ("image", "audio", "fusion", "heads")
    }
    assert len(plots.train["train/loss"]) == 8 / 2 * 2  # 8 steps per epoch, every 2nd, 2 epochs
    preds, targets = torch.cat(plots._preds), torch.cat(plots._targets)
    assert len(targets) == 24
    assert float((preds == targets).double().mean()) == pytest.approx(trainer.state.metrics["val/accuracy"])
    assert [step for step, _ in plots.evals["val/accuracy"]] == [8, 16]


def test_missing_matplotlib_fails_at_fit_start_with_the_install_command(tmp_path, monkeypatch):
    monkeypatch.setitem(sys.modules, "matplotlib", None)  # makes `import matplotlib` raise ImportError
    trainer = _trainer(tmp_path, [Plots()])
    with pytest.raises(ModuleNotFoundError, match=r"pip install 'shadow-sound-hunter\[plots\]'"):
        trainer.fit(BoringModule(), train_dataloaders=boring_loader())
    assert trainer.state.global_step == 0


def _logged_fit(out, steps, ckpt_path=None):
    plots = Plots(every_n_steps=2)
    trainer = add_stock_callbacks(
        SSSTrainer(
            callbacks=[plots],
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
    assert resumed.train == whole.train  # steps 2 and 4 read back from metrics.csv, exactly as logged
    assert resumed.evals == whole.evals and [s for s, _ in resumed.evals["val/loss"]] == [8, 12]
