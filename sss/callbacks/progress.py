"""`ProgressBar`: epoch, step, loss, lr, samples/s and ETA; plain lines when stdout is not a terminal."""

from __future__ import annotations

import time
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from sss.callbacks.base import Callback

if TYPE_CHECKING:
    from sss.trainer.module import LitModule
    from sss.trainer.trainer import SSSTrainer

__all__ = ["ProgressBar"]

SHOW = (
    "train/grad_share/image",
    "train/grad_share/audio",
    "train/overflow/skipped",
    "train/data_wait_fraction",
    "memory/peak_rss_mb",
)
"""`state.logs` keys the bar shows when a callback publishes them."""


class ProgressBar(Callback):
    """A rich progress bar on a terminal; one plain line every N steps otherwise (logs, CI).

    On a terminal: a bar line (epoch, bar, step/total, time left) that fills the terminal's width,
    and under it the info line (loss, lr, samples/s, health figures), cut with an ellipsis where the
    terminal is narrower, so neither ever wraps. Reading the loss is a device sync, so both redraw
    at most every `refresh_seconds`.
    Only the main process draws. Turn it off with ``log.progress=false``. It also shows the latest
    value of each `show` key that health callbacks publish in ``state.logs`` (``train/`` dropped).

    Example:
        >>> ProgressBar(every_n_steps=20).every_n_steps
        20
    """

    def __init__(self, every_n_steps: int = 10, refresh_seconds: float = 0.25, show: Sequence[str] = SHOW) -> None:
        self.every_n_steps = every_n_steps
        self.refresh_seconds = refresh_seconds
        self.show = tuple(show)
        self._shown: dict[str, float] = {}
        self._progress: Any = None
        self._live: Any = None
        self._task: Any = None
        self._start = 0.0
        self._last_draw = 0.0
        self._active = False

    def on_fit_start(self, trainer: SSSTrainer, module: LitModule) -> None:
        from rich.console import Console

        self._active = trainer.accelerator.is_main_process
        self._shown = {}
        self._start = time.monotonic()
        console = Console()
        if not self._active or not console.is_terminal:
            return
        from rich.live import Live
        from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeRemainingColumn

        # The Progress is a renderable of our own Live, not started itself: the Live shows it above the info line.
        self._progress = Progress(
            TextColumn("[bold]epoch {task.fields[epoch]}"),
            BarColumn(bar_width=None),  # what the other columns leave of the line
            MofNCompleteColumn(),
            TimeRemainingColumn(),
            console=console,
            expand=True,
        )
        self._task = self._progress.add_task("train", total=trainer.total_steps or None, epoch=0)
        self._live = Live(self._display(""), console=console, auto_refresh=False)
        self._live.start()

    def on_after_optimizer_step(self, trainer: SSSTrainer, module: LitModule) -> None:
        # keep the latest values: the metrics logger clears state.logs when it writes them
        logs = trainer.state.logs
        self._shown.update((k, logs[k]) for k in self.show if k in logs)

    def on_batch_end(self, trainer: SSSTrainer, module: LitModule) -> None:
        if not self._active:
            return
        state = trainer.state
        if self._progress is not None:
            now = time.monotonic()
            if now - self._last_draw >= self.refresh_seconds:
                self._last_draw = now
                self._progress.update(self._task, completed=state.global_step, epoch=state.epoch)
                self._live.update(self._display(self._info(trainer)), refresh=True)
        elif state.micro_step == 0 and state.global_step % self.every_n_steps == 0 and not state.step_was_skipped:
            total = f"/{trainer.total_steps}" if trainer.total_steps else ""
            print(f"epoch {state.epoch} step {state.global_step}{total} {self._info(trainer)}", flush=True)

    def on_validation_end(self, trainer: SSSTrainer, module: LitModule) -> None:
        if self._active and trainer.state.eval_metrics:
            # Dataset-level figures only: per-class keys (val/f1/<class>) go to the loggers, not the console.
            shown = {k: v for k, v in trainer.state.eval_metrics.items() if k.count("/") == 1}
            line = f"[{trainer.state.stage}] " + "  ".join(f"{k} {v:.4f}" for k, v in shown.items())
            if self._live is not None:  # above the bar; markup=False, or rich would take "[val]" for a style
                self._live.console.print(line, markup=False)
            else:
                print(line, flush=True)

    def on_fit_end(self, trainer: SSSTrainer, module: LitModule) -> None:
        if self._live is not None:
            self._progress.update(self._task, completed=trainer.state.global_step)  # epoch: the last one run
            self._live.update(self._display(self._info(trainer)), refresh=True)
        self._stop()

    def on_exception(self, trainer: SSSTrainer, module: LitModule) -> None:
        self._stop()

    def _stop(self) -> None:
        if self._live is not None:
            self._live.stop()
        self._live = self._progress = None

    def _display(self, info: str) -> Any:
        from rich.console import Group
        from rich.text import Text

        return Group(self._progress, Text(info, no_wrap=True, overflow="ellipsis"))

    def _info(self, trainer: SSSTrainer) -> str:
        state = trainer.state
        rate = state.samples / max(time.monotonic() - self._start, 1e-9)
        loss = f"loss {float(state.loss):.4f}" if state.loss is not None else ""
        skipped = f" skipped {state.skipped_steps}" if state.skipped_steps else ""
        extra = "".join(f" {k.removeprefix('train/')} {v:.3g}" for k, v in self._shown.items())
        return f"{loss} lr {state.lr:.2e} {rate:.0f} samples/s{skipped}{extra}"
