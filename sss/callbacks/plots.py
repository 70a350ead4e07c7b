"""`Plots`: PNG curves (loss, metrics, learning rate, per-modality grad norms) and a confusion matrix at fit end."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch

from sss.callbacks.base import Callback
from sss.callbacks.metrics_logger import read_metrics

if TYPE_CHECKING:
    from sss.trainer.module import LitModule
    from sss.trainer.trainer import SSSTrainer

__all__ = ["Plots"]

MISSING = "Plots needs matplotlib, an optional extra: pip install 'shadow-sound-hunter[plots]'"


class Plots(Callback):
    """Writes ``OUTPUT_DIR/plots/*.png`` on the main process at FIT_END and lists them in `files`.

    * ``loss.png``: training loss every `every_n_steps` steps, and ``val/loss`` at each validation;
    * ``metrics.png``: every other validation metric; ``lr.png``: the learning rate;
    * ``grad_norms.png``: the ``train/grad_norm/<part>`` figures a `GradNormMonitor` listed *before*
      this callback published (use the same `every_n_steps` for both);
    * ``confusion_matrix.png``: predicted against true class over the latest validation pass of the
      fit, from the ``preds`` and ``target`` that `validation_step` returned (``state.eval_outputs``,
      gathered from all processes).

    A resumed fit starts its curves with the history the run logged up to the resumed step, read
    from ``OUTPUT_DIR/logs/metrics.csv`` (the CSV tracker's cadence, ``log.every_n_steps``); without
    the CSV tracker the curves start at the resume. The confusion matrix is the latest validation's.

    matplotlib is an optional extra; without it the callback fails at FIT_START, not after training.

    Example:
        >>> import tempfile
        >>> from sss import SSSTrainer
        >>> from sss.testing import boring_loader, BoringModule
        >>> plots = Plots(every_n_steps=1)
        >>> trainer = SSSTrainer(max_epochs=1, callbacks=[plots], mixed_precision="no", output_dir=tempfile.mkdtemp(),
        ...                      log={"progress": False, "trackers": []}, checkpoint={"every_epoch": False})
        sss: mixed precision no
        >>> _ = trainer.fit(BoringModule(), train_dataloaders=boring_loader(), val_dataloaders=boring_loader(n=16))
        sss: plots ...
        >>> [p.name for p in plots.files]
        ['loss.png', 'metrics.png', 'lr.png', 'confusion_matrix.png']
    """

    def __init__(self, every_n_steps: int | None = None, dpi: int = 100) -> None:
        self.every_n_steps = every_n_steps
        self.dpi = dpi
        self.files: list[Path] = []
        """The PNG files written at the latest FIT_END."""
        self.train: dict[str, list[tuple[int, float]]] = {}
        self.evals: dict[str, list[tuple[int, float]]] = {}
        self._preds: list[torch.Tensor] = []
        self._targets: list[torch.Tensor] = []
        self._capturing = False
        self._fitting = False
        self._history_until: int | None = None

    def on_fit_start(self, trainer: SSSTrainer, module: LitModule) -> None:
        try:
            import matplotlib  # noqa: F401
        except ImportError:
            raise ModuleNotFoundError(MISSING) from None
        if self.every_n_steps is None:
            self.every_n_steps = trainer.config.log.every_n_steps
        self.train, self.evals, self.files, self._fitting = {}, {}, [], True
        start = trainer.state.global_step  # above 0 after a resume
        self._history_until = start if start and trainer.accelerator.is_main_process else None

    def on_epoch_start(self, trainer: SSSTrainer, module: LitModule) -> None:
        self._load_history(trainer)

    def _load_history(self, trainer: SSSTrainer) -> None:
        # Read once the fit has started, not at FIT_START: the metrics logger (a stock callback, so
        # after this one) sets aside the rows the interrupted run logged past the checkpoint there.
        until, self._history_until = self._history_until, None
        if until is None:
            return
        for row in read_metrics(trainer.output_dir / "logs" / "metrics.csv", up_to_step=until):
            step = int(row.pop("step", 0))
            for key, value in row.items():
                if key in ("train/loss", "train/lr") or key.startswith("train/grad_norm/"):
                    self.train.setdefault(key, []).append((step, value))
                elif key.startswith("val/"):
                    self.evals.setdefault(key, []).append((step, value))

    def on_after_optimizer_step(self, trainer: SSSTrainer, module: LitModule) -> None:
        state = trainer.state
        if state.step_was_skipped or state.global_step % self.every_n_steps:
            return
        step = state.global_step
        self.train.setdefault("train/loss", []).append((step, float(state.loss)))
        self.train.setdefault("train/lr", []).append((step, state.lr))
        for key, value in state.logs.items():
            if key.startswith("train/grad_norm/"):
                self.train.setdefault(key, []).append((step, float(value)))

    def on_validation_start(self, trainer: SSSTrainer, module: LitModule) -> None:
        self._capturing = self._fitting and trainer.state.stage == "val"

    def on_validation_end(self, trainer: SSSTrainer, module: LitModule) -> None:
        outputs = trainer.state.eval_outputs
        if self._capturing and "preds" in outputs and "target" in outputs:
            self._preds, self._targets = [outputs["preds"].long().cpu()], [outputs["target"].long().cpu()]
        if self._capturing:
            for key, value in trainer.state.eval_metrics.items():
                self.evals.setdefault(key, []).append((trainer.state.global_step, float(value)))
        self._capturing = False

    def on_fit_end(self, trainer: SSSTrainer, module: LitModule) -> None:
        self._load_history(trainer)  # a resume with nothing left to train ran no epoch
        self._fitting = self._capturing = False
        if trainer.accelerator.is_main_process:
            self.files = self.write(trainer.output_dir / "plots", getattr(module, "num_classes", None))
            print(f"sss: plots {', '.join(str(p) for p in self.files)}", flush=True)

    def on_exception(self, trainer: SSSTrainer, module: LitModule) -> None:
        self._fitting = self._capturing = False
        self._history_until = None

    def write(self, folder: Path, num_classes: int | None = None) -> list[Path]:
        """Draw the recorded curves (and the confusion matrix) into `folder`; returns the files written.

        Example:
            >>> import tempfile
            >>> from pathlib import Path
            >>> plots = Plots()
            >>> plots.train = {"train/loss": [(1, 0.9), (2, 0.7)], "train/lr": [(1, 1e-3), (2, 1e-3)]}
            >>> [p.name for p in plots.write(Path(tempfile.mkdtemp()))]
            ['loss.png', 'lr.png']
        """
        folder.mkdir(parents=True, exist_ok=True)
        panels = {
            "loss.png": {k: v for k, v in {**self.train, **self.evals}.items() if k in ("train/loss", "val/loss")},
            "metrics.png": {k: v for k, v in self.evals.items() if k != "val/loss"},
            "lr.png": {k: v for k, v in self.train.items() if k == "train/lr"},
            "grad_norms.png": {k: v for k, v in self.train.items() if k.startswith("train/grad_norm/")},
        }
        files = [self._curves(folder / name, series) for name, series in panels.items() if series]
        if self._preds:
            files.append(self._confusion(folder / "confusion_matrix.png", num_classes))
        return files

    def _curves(self, path: Path, series: dict[str, list[tuple[int, float]]]) -> Path:
        fig, ax = _figure()
        for name, points in series.items():
            steps, values = zip(*points, strict=True)
            ax.plot(steps, values, marker="o" if len(points) < 30 else None, label=name)
        if path.name == "grad_norms.png" and all(v > 0 for pts in series.values() for _, v in pts):
            ax.set_yscale("log")  # the parts' norms differ by orders of magnitude
        ax.set_xlabel("global step")
        ax.legend()
        ax.grid(alpha=0.3)
        fig.savefig(path, dpi=self.dpi, bbox_inches="tight")
        return path

    def _confusion(self, path: Path, num_classes: int | None) -> Path:
        preds, targets = torch.cat(self._preds), torch.cat(self._targets)
        n = num_classes or int(max(preds.max(), targets.max())) + 1
        matrix = torch.bincount(targets * n + preds, minlength=n * n).reshape(n, n)
        fig, ax = _figure()
        ax.imshow(matrix.numpy(), cmap="Blues")
        for (t, p), count in zip(((t, p) for t in range(n) for p in range(n)), matrix.flatten().tolist(), strict=True):
            ax.text(p, t, str(count), ha="center", va="center")
        ax.set_xlabel("predicted class")
        ax.set_ylabel("true class")
        ax.set_title(f"latest validation ({len(targets)} samples)")
        fig.savefig(path, dpi=self.dpi, bbox_inches="tight")
        return path


def _figure() -> tuple[Any, Any]:
    # the object API, not pyplot: no global figure registry, no GUI backend chosen for the whole process
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    fig = Figure(figsize=(6, 4))
    FigureCanvasAgg(fig)
    return fig, fig.add_subplot()
