"""`MetricsLogger`: training and evaluation figures to Accelerate's trackers (CSV; TensorBoard when installed)."""

from __future__ import annotations

import csv
import dataclasses
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from accelerate.tracking import GeneralTracker

from sss.callbacks.base import Callback

if TYPE_CHECKING:
    from sss.trainer.module import LitModule
    from sss.trainer.trainer import SSSTrainer

__all__ = ["CSVTracker", "MetricsLogger", "make_trackers"]


class CSVTracker(GeneralTracker):
    """An Accelerate tracker writing ``metrics.csv``: one row per logged step, one column per name.

    A name seen for the first time adds a column (the file is rewritten once); later rows append.

    Example:
        >>> import tempfile
        >>> d = tempfile.mkdtemp()
        >>> t = CSVTracker(d)
        >>> t.log({"train/loss": 0.5}, step=1); t.log({"val/accuracy": 0.9}, step=2)
        >>> print(open(f"{d}/metrics.csv").read().strip())
        step,train/loss,val/accuracy
        1,0.5,
        2,,0.9
    """

    name = "csv"
    requires_logging_directory = True
    main_process_only = True

    def __init__(self, logging_dir: str | Path) -> None:
        super().__init__()
        self.path = Path(logging_dir) / "metrics.csv"
        self.columns: list[str] = ["step"]
        self.rows: list[dict[str, Any]] = []

    @property
    def tracker(self) -> Path:
        return self.path

    def store_init_configuration(self, values: dict[str, Any]) -> None:
        """The run's configuration is saved by the CLI as ``config.yaml``; nothing to add here."""

    def log(self, values: dict[str, Any], step: int | None = None, **kwargs: Any) -> None:
        row = {"step": step, **{k: v for k, v in values.items() if isinstance(v, (int, float))}}
        self.rows.append(row)
        new = [k for k in row if k not in self.columns]
        self.path.parent.mkdir(parents=True, exist_ok=True)
        if new or not self.path.exists():
            self.columns += new
            with self.path.open("w", newline="") as f:
                writer = csv.DictWriter(f, fieldnames=self.columns)
                writer.writeheader()
                writer.writerows(self.rows)
        else:
            with self.path.open("a", newline="") as f:
                csv.DictWriter(f, fieldnames=self.columns).writerow(row)


def make_trackers(names: list[str], logging_dir: Path) -> list[Any]:
    """Accelerate ``log_with`` entries for tracker names; ``csv`` becomes a `CSVTracker`.

    Example:
        >>> [type(t).__name__ for t in make_trackers(["csv"], Path("/tmp/logs"))]
        ['CSVTracker']
    """
    return [CSVTracker(logging_dir) if name == "csv" else name for name in names]


class MetricsLogger(Callback):
    """Logs ``train/loss``, ``train/lr``, ``train/grad_norm`` every N steps and all metrics after each evaluation.

    Values reach every tracker of the Accelerator (on the main process), keyed by ``global_step``.

    Example:
        >>> MetricsLogger(every_n_steps=50).every_n_steps
        50
    """

    def __init__(self, every_n_steps: int = 10, trackers: Sequence[str] = ("csv", "tensorboard")) -> None:
        self.every_n_steps = every_n_steps
        self.trackers = list(trackers)

    def on_fit_start(self, trainer: SSSTrainer, module: LitModule) -> None:
        from accelerate.tracking import filter_trackers

        accelerator = trainer.accelerator
        if not accelerator.log_with:  # an Accelerator built with its own log_with keeps it
            logging_dir = trainer.output_dir / "logs"
            accelerator.log_with = filter_trackers(make_trackers(self.trackers, logging_dir), logging_dir)
        config = {k: str(v) for k, v in _flatten(dataclasses.asdict(trainer.config)).items()}
        accelerator.init_trackers(trainer.output_dir.name or "sss", config=config)

    def on_after_optimizer_step(self, trainer: SSSTrainer, module: LitModule) -> None:
        state = trainer.state
        if state.step_was_skipped or state.global_step % self.every_n_steps:
            return
        values = {"train/loss": float(state.loss), "train/lr": state.lr, "train/epoch": state.epoch}
        if state.grad_norm is not None:
            values["train/grad_norm"] = float(state.grad_norm)
        values["train/skipped_steps"] = state.skipped_steps
        values.update(state.logs)  # what other callbacks published since the last log
        state.logs.clear()
        trainer.accelerator.log(values, step=state.global_step)

    def on_validation_end(self, trainer: SSSTrainer, module: LitModule) -> None:
        if trainer.state.eval_metrics:
            trainer.accelerator.log(dict(trainer.state.eval_metrics), step=trainer.state.global_step)

    def on_fit_end(self, trainer: SSSTrainer, module: LitModule) -> None:
        self._finish(trainer)

    def on_exception(self, trainer: SSSTrainer, module: LitModule) -> None:
        self._finish(trainer)

    def _finish(self, trainer: SSSTrainer) -> None:
        # Not accelerator.end_training(): it also destroys the process group, and evaluation or
        # export may still follow the fit.
        for tracker in trainer.accelerator.trackers:
            tracker.finish()
        trainer.accelerator.trackers.clear()


def _flatten(tree: dict[str, Any], prefix: str = "") -> dict[str, Any]:
    flat: dict[str, Any] = {}
    for key, value in tree.items():
        if isinstance(value, dict):
            flat.update(_flatten(value, f"{prefix}{key}."))
        else:
            flat[f"{prefix}{key}"] = value
    return flat
