"""`EarlyStopping`: stop when a validation metric stops improving."""

from __future__ import annotations

import math
from typing import TYPE_CHECKING, Any

from sss.callbacks.base import Callback

if TYPE_CHECKING:
    from sss.trainer.module import LitModule
    from sss.trainer.trainer import SSSTrainer

__all__ = ["EarlyStopping"]


class EarlyStopping(Callback):
    """Stops training when `monitor` has not improved by more than `min_delta` for `patience` validations.

    It decides at VALIDATION_END of the validations run during `fit`, on ``state.metrics``, which are
    equal on every process, so every process stops at the same step without a broadcast. The loop
    then finishes the epoch (EPOCH_END, where the checkpoint callback, which runs after this one,
    saves the updated `best`/`wait`: a resumed run continues the same count). ``check_finite`` stops
    at once on a NaN/inf value.

    Example:
        >>> es = EarlyStopping(monitor="val/loss", mode="min", patience=2)
        >>> for value in [1.0, 0.9, 0.95, 0.93]:
        ...     stop = es.update(value)
        >>> stop, es.best, es.wait
        (True, 0.9, 2)
    """

    def __init__(
        self,
        monitor: str = "val/loss",
        mode: str = "min",
        patience: int = 3,
        min_delta: float = 0.0,
        check_finite: bool = True,
    ) -> None:
        if mode not in ("min", "max"):
            raise ValueError(f"EarlyStopping mode must be 'min' or 'max', got {mode!r}")
        self.monitor, self.mode, self.patience = monitor, mode, patience
        self.min_delta, self.check_finite = abs(min_delta), check_finite
        self.best: float | None = None
        """Best value seen so far (None before the first validation)."""
        self.wait = 0
        """Validations since the last improvement."""
        self.stopped_step: int | None = None
        self.reason = ""
        self._fitting = False

    def update(self, value: float) -> bool:
        """Record one validation value; True when training should stop.

        Example:
            >>> es = EarlyStopping(mode="max", patience=1, min_delta=0.1)
            >>> es.update(0.5), es.update(0.55), es.reason
            (False, True, 'val/loss did not improve by more than 0.1 over 1 validations (best 0.5)')
        """
        if self.check_finite and not math.isfinite(value):
            self.reason = f"{self.monitor} is {value}: stopping (check_finite)"
            return True
        better = self.best is None or (
            value < self.best - self.min_delta if self.mode == "min" else value > self.best + self.min_delta
        )
        if better:
            self.best, self.wait = value, 0
            return False
        self.wait += 1
        self.reason = (
            f"{self.monitor} did not improve by more than {self.min_delta} over {self.wait} validations "
            f"(best {self.best:.6g})"
        )
        return self.wait >= self.patience

    def on_fit_start(self, trainer: SSSTrainer, module: LitModule) -> None:
        self._fitting = True
        if trainer.state.last_checkpoint is None:  # a fresh fit; a resume restored best/wait before FIT_START
            self.best, self.wait, self.stopped_step, self.reason = None, 0, None, ""

    def on_validation_end(self, trainer: SSSTrainer, module: LitModule) -> None:
        state = trainer.state
        if not self._fitting or state.stage != "val" or not state.eval_metrics:
            return
        if self.monitor not in state.eval_metrics:
            if not any(k.startswith("val/") for k in state.eval_metrics):
                return  # another evaluation (e.g. an ablation with its own prefix)
            raise KeyError(
                f"EarlyStopping monitors {self.monitor!r}, which validation does not report; "
                f"available: {', '.join(sorted(state.eval_metrics))}"
            )
        if self.update(float(state.eval_metrics[self.monitor])):
            state.should_stop = True
            self.stopped_step = state.global_step
            if trainer.accelerator.is_main_process:  # one message, not one per process
                print(f"EarlyStopping: {self.reason}; stopping at global_step {state.global_step}", flush=True)

    def on_fit_end(self, trainer: SSSTrainer, module: LitModule) -> None:
        self._fitting = False

    def on_exception(self, trainer: SSSTrainer, module: LitModule) -> None:
        self._fitting = False

    def state_dict(self) -> dict[str, Any]:
        return {"best": self.best, "wait": self.wait}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.best, self.wait = state["best"], int(state["wait"])
