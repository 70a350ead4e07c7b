"""`ProgressBar`: an epoch bar and a whole-run bar with time left, a status line, validation results with their step."""

from __future__ import annotations

import math
import time
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from torch import Tensor

from sss.callbacks.base import Callback
from sss.callbacks.metrics_logger import host_floats, step_figures

if TYPE_CHECKING:
    from sss.trainer.module import LitModule
    from sss.trainer.trainer import SSSTrainer

__all__ = ["ProgressBar", "validation_line"]

SHOW = (
    "train/grad_share/image",
    "train/grad_share/audio",
    "train/overflow/skipped",
    "train/data_wait_fraction",
    "memory/peak_rss_mb",
)
"""`state.logs` keys the bar shows when a callback publishes them."""

RATE_WINDOW_S = 2.0
"""samples/s is measured over windows of at least this many seconds, not since the fit started."""


def validation_line(metrics: dict[str, float], epoch: int | None, step: int) -> str:
    """The line an evaluation pass prints: ``[val] epoch 2 step 250: loss 0.3100 accuracy 0.9300``.

    The label is the pass's metric prefix (``val``, ``val_image_only`` for the modality ablation,
    ``test``); dataset-level figures only (per-class keys such as ``val/f1/<class>`` go to the trackers).

    Example:
        >>> validation_line({"val/loss": 0.31, "val/accuracy": 0.93, "val/f1/knock": 0.9}, 2, 250)
        '[val] epoch 2 step 250: loss 0.3100 accuracy 0.9300'
        >>> validation_line({"test/loss": 0.4}, None, 12)
        '[test] step 12: loss 0.4000'
        >>> validation_line({"val/accuracy": 0.93, "val_ema/accuracy": 0.95}, 2, 250)
        '[val] epoch 2 step 250: accuracy 0.9300 val_ema/accuracy 0.9500'
    """
    prefix = next(iter(metrics), "val/").split("/", 1)[0]
    # Figures of another pass merged in (the EMA callback's val_ema/...) keep their prefix, so they read apart.
    shown = " ".join(
        f"{k.split('/', 1)[1] if k.startswith(prefix + '/') else k} {v:.4f}"
        for k, v in metrics.items()
        if k.count("/") == 1
    )
    where = f"epoch {epoch} step {step}" if epoch is not None else f"step {step}"
    return f"[{prefix}] {where}: {shown}"


class ProgressBar(Callback):
    """Rich progress bars on a terminal; one plain line every N steps otherwise (logs, CI).

    On a terminal, three lines redrawn in place::

        epoch 1  ━━━━━━━━━━━━━━━━━━━━━━━━━━━━━━━━━━━━━━━━━━━━━   8/8  eta 0:00:00
        total    ━━━━━━━━━━━━━━━━━━━━━━━╸━━━━━━━━━━━━━━━━━━━━━━  12/16 eta 0:00:03
        loss 0.4859 lr 1.00e-03 60 samples/s grad_share/image 0.546 grad_share/audio 0.…

    the optimizer steps of the current epoch and of the whole run, each with its time left, bars
    as wide as the terminal leaves them (the label and count columns have fixed widths, so the bars
    keep their width); under them the status line (loss, lr, samples/s over the last seconds, the
    health figures), cut with ``…`` where the terminal is narrower, so nothing wraps. They redraw at
    most every `refresh_seconds`. The loss and the health figures are those of the latest logging
    step (every `every_n_steps` steps), read from the device with the metrics logger's figures in
    one transfer (`sss.callbacks.metrics_logger.step_figures`): the bar adds no device sync. Each evaluation pass
    prints a line above them, ``[val] epoch 1 step 16: loss 0.5563 accuracy 0.6875 ...``
    (`validation_line`); warnings print above them too. Only the main process draws. Turn it off
    with ``log.progress=false``. It also shows the latest value of each `show` key that health
    callbacks publish in ``state.logs`` (``train/`` dropped).

    Example:
        >>> ProgressBar(every_n_steps=20).every_n_steps
        20
    """

    def __init__(self, every_n_steps: int = 10, refresh_seconds: float = 0.25, show: Sequence[str] = SHOW) -> None:
        self.every_n_steps = every_n_steps
        self.refresh_seconds = refresh_seconds
        self.show = tuple(show)
        self._shown: dict[str, float] = {}
        self._loss: float | None = None
        self._progress: Any = None
        self._live: Any = None
        self._epoch_task: Any = None
        self._run_task: Any = None
        self._per_epoch: int | None = None
        self._epoch: int | None = None
        self._epoch_first_step = 0
        self._epoch_done = 0
        self._rate: float | None = None
        self._mark: tuple[float, int] | None = None
        self._last_draw = 0.0
        self._active = False
        self._fitting = False

    def on_fit_start(self, trainer: SSSTrainer, module: LitModule) -> None:
        from rich.console import Console

        self._active = trainer.accelerator.is_main_process
        self._fitting = True
        self._shown, self._epoch, self._loss = {}, None, None
        self._per_epoch = _steps_per_epoch(trainer)
        self._mark, self._rate = None, None
        console = Console()
        if not self._active or not console.is_terminal:
            return
        from rich.live import Live
        from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn
        from rich.table import Column

        epochs = trainer.config.max_epochs
        label = max(len(f"epoch {epochs - 1 if epochs else 999}"), len("total"))
        # The Progress is a renderable of our own Live, not started itself: the Live shows it above the status line.
        self._progress = Progress(
            TextColumn("[bold]{task.description}", table_column=Column(width=label, no_wrap=True)),
            BarColumn(bar_width=None),  # what the fixed-width columns leave of the line
            MofNCompleteColumn(),
            _eta_column(),
            console=console,
            expand=True,
        )
        self._epoch_task = self._progress.add_task("epoch 0", total=self._per_epoch)  # None: "?" until known
        self._run_task = self._progress.add_task("total", total=trainer.total_steps or None)
        self._live = Live(self._display(""), console=console, auto_refresh=False)
        self._live.start()

    def on_epoch_start(self, trainer: SSSTrainer, module: LitModule) -> None:
        state = trainer.state
        if self._epoch is not None and self._per_epoch is None:
            self._per_epoch = state.global_step - self._epoch_first_step or None  # learnt from the first epoch
        self._epoch, self._epoch_first_step, self._epoch_done = state.epoch, state.global_step, 0
        if self._progress is not None:
            self._progress.reset(self._epoch_task, total=self._per_epoch, description=f"epoch {state.epoch}")

    def on_after_optimizer_step(self, trainer: SSSTrainer, module: LitModule) -> None:
        # keep the latest values: the trainer clears state.logs after each logging step
        state = trainer.state
        if self._active and not state.step_was_skipped and state.global_step % self.every_n_steps == 0:
            self._loss = step_figures(state).get("train/loss")  # device values: read at logging steps only
            state.bar.update(host_floats(state.bar))  # what the module logged with self.log(..., prog_bar=True)
        logs = state.logs
        self._shown.update((k, logs[k]) for k in self.show if k in logs and not isinstance(logs[k], Tensor))
        self._shown.update((k, v) for k, v in state.bar.items() if not isinstance(v, Tensor))

    def on_batch_end(self, trainer: SSSTrainer, module: LitModule) -> None:
        if not self._active:
            return
        state = trainer.state
        if self._mark is None:  # samples/s from the first batch on: the set-up and the sanity check are not training
            self._mark = (time.monotonic(), state.samples)
        self._epoch_done = self._epoch_steps(trainer)
        if self._progress is not None:
            now = time.monotonic()
            if now - self._last_draw >= self.refresh_seconds:
                self._last_draw = now
                self._draw(trainer)
        elif state.micro_step == 0 and state.global_step % self.every_n_steps == 0 and not state.step_was_skipped:
            total = f"/{trainer.total_steps}" if trainer.total_steps else ""
            print(f"epoch {state.epoch} step {state.global_step}{total} {self._info(trainer)}", flush=True)

    def on_validation_start(self, trainer: SSSTrainer, module: LitModule) -> None:
        if self._live is not None and self._fitting:  # the bars as the epoch ended, not as last redrawn
            self._draw(trainer)

    def on_validation_end(self, trainer: SSSTrainer, module: LitModule) -> None:
        state = trainer.state
        if not (self._active and state.eval_metrics):
            return
        line = validation_line(state.eval_metrics, self._epoch if self._fitting else None, state.global_step)
        if self._live is not None:  # above the bars; markup=False, or rich would take "[val]" for a style
            self._live.console.print(line, markup=False)
        else:
            print(line, flush=True)

    def on_fit_end(self, trainer: SSSTrainer, module: LitModule) -> None:
        if self._live is not None:
            self._draw(trainer)
        self._stop()

    def on_exception(self, trainer: SSSTrainer, module: LitModule) -> None:
        self._stop()

    def _stop(self) -> None:
        if self._live is not None:
            self._live.stop()
        self._live = self._progress = None
        self._fitting = False

    def _draw(self, trainer: SSSTrainer) -> None:
        self._progress.update(self._epoch_task, completed=self._epoch_done)
        self._progress.update(self._run_task, completed=trainer.state.global_step)
        self._live.update(self._display(self._info(trainer)), refresh=True)

    def _epoch_steps(self, trainer: SSSTrainer) -> int:
        state = trainer.state
        if self._per_epoch is None:
            return state.global_step - self._epoch_first_step
        # Optimizer windows of this epoch so far, skipped fp16 steps included: batch_idx counts them (a resume too),
        # and a short last window is one window.
        window = max(trainer.config.gradient_accumulation_steps, 1)
        return min(math.ceil((state.batch_idx + 1 - state.micro_step) / window), self._per_epoch)

    def _display(self, info: str) -> Any:
        from rich.console import Group
        from rich.text import Text

        return Group(self._progress, Text(info, no_wrap=True, overflow="ellipsis"))

    def _info(self, trainer: SSSTrainer) -> str:
        state = trainer.state
        now = time.monotonic()
        since, samples = self._mark or (now, state.samples)
        current = (state.samples - samples) / (now - since) if state.samples > samples and now > since else None
        if current is not None and now - since >= RATE_WINDOW_S:
            self._rate, self._mark = current, (now, state.samples)
        rate = self._rate if self._rate is not None else current
        loss = f"loss {self._loss:.4f}" if self._loss is not None else ""  # of the latest logging step
        speed = f" {rate:.0f} samples/s" if rate is not None else " … samples/s"  # known from the second batch on
        skipped = f" skipped {state.skipped_steps}" if state.skipped_steps else ""
        extra = "".join(f" {k.removeprefix('train/')} {v:.3g}" for k, v in self._shown.items())
        return f"{loss} lr {state.lr:.2e}{speed}{skipped}{extra}"


def _steps_per_epoch(trainer: SSSTrainer) -> int | None:
    """Optimizer steps of a full epoch, where the trainer's count of the run's steps gives it away."""
    cfg, total = trainer.config, trainer.total_steps
    if not total or not cfg.max_epochs:
        return None
    if cfg.max_steps is not None and total >= cfg.max_steps:
        return None  # max_steps cuts the run: the first epoch tells
    return total // cfg.max_epochs  # total is max_epochs full epochs


def _eta_column() -> Any:
    from rich.progress import ProgressColumn
    from rich.table import Column
    from rich.text import Text

    class Eta(ProgressColumn):
        """``eta 0:01:23`` while running, ``took 0:02:45`` when the task is done; a fixed width."""

        def render(self, task: Any) -> Text:
            if task.finished:
                return Text(f"took {_clock(task.finished_time or task.elapsed)}", style="progress.elapsed")
            left = task.time_remaining
            return Text(f"eta {_clock(left) if left is not None else '-:--:--'}", style="progress.remaining")

    return Eta(table_column=Column(width=12, no_wrap=True))


def _clock(seconds: float | None) -> str:
    s = max(int(seconds or 0), 0)
    return f"{s // 3600}:{s % 3600 // 60:02d}:{s % 60:02d}"
