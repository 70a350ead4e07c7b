"""`OverflowDetector`: fp16 skipped steps (fused optimizers too), a NaN/inf loss policy, and an abort with advice."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import torch

from sss.callbacks.base import Callback
from sss.callbacks.grad_norm import _warn_once
from sss.callbacks.metrics_logger import host_floats

if TYPE_CHECKING:
    from sss.trainer.module import LitModule
    from sss.trainer.trainer import SSSTrainer

__all__ = ["OverflowDetector"]

ADVICE = (
    "Try trainer.mixed_precision=bf16 (fp32's range, no loss scaling), a lower learning rate "
    "(trainer.optim.optimizer.lr), gradient clipping (trainer.max_grad_norm), or clamping the loss/logits in "
    "compute_loss; OverflowDetector(find_culprit=true) names the first module that overflows."
)


class OverflowDetector(Callback):
    """Counts skipped optimizer steps, applies a policy to non-finite losses, and aborts a run that cannot step.

    * Steps the fp16 loss scaler skipped are in ``state.skipped_steps``, those a fused optimizer
      (``AdamW(fused=True)``) skipped inside its kernel too: Accelerate reports those as taken
      (accelerate#4242), and the trainer counts them from the loss scale backing off.
    * A NaN/inf loss anywhere in the accumulation window: ``on_nan="skip"`` discards the window
      (``state.skip_step``); ``on_nan="raise"`` stops with a `FloatingPointError` naming the step and batch.
    * `max_consecutive_skips` skipped steps in a row raise a `RuntimeError` with advice.
    * ``find_culprit=True`` installs forward hooks (a device sync per module and step, so only on
      request) and names the first module whose output or gradient is not finite.
    * Host syncs: deciding on the host whether a window's loss was finite reads a device flag, one
      sync per optimizer step; ``on_nan="skip"`` needs that decision before the update. With
      ``deferred=True`` (``on_nan="raise"`` only) the flags stay on the device and are read with the
      logged figures at each logging step (``trainer.log.every_n_steps``), at each epoch end and when
      the fit ends: no sync of its own; the run stops there, naming the first non-finite window, up
      to ``every_n_steps - 1`` updates after it (the weights may be NaN by then: a checkpoint saved
      in between holds them, so align ``checkpoint.every_n_steps`` with the logging steps).

    Publishes ``train/overflow/skipped`` (``state.skipped_steps``: all kinds), ``train/overflow/nan_losses``
    and ``train/loss_scale``.

    Example:
        >>> OverflowDetector(on_nan="raise").on_nan
        'raise'
        >>> OverflowDetector(on_nan="ignore")
        Traceback (most recent call last):
        ...
        ValueError: OverflowDetector on_nan must be 'skip' or 'raise', got 'ignore'
    """

    def __init__(
        self,
        on_nan: str = "skip",
        max_consecutive_skips: int = 100,
        find_culprit: bool = False,
        deferred: bool = False,
    ) -> None:
        if on_nan not in ("skip", "raise"):
            raise ValueError(f"OverflowDetector on_nan must be 'skip' or 'raise', got {on_nan!r}")
        if deferred and on_nan == "skip":
            raise ValueError(
                "OverflowDetector deferred=True reads the non-finite flags at logging steps, after the updates, but "
                "on_nan='skip' must decide before each update: use on_nan='raise' with deferred=True, or deferred=False"
            )
        self.on_nan = on_nan
        self.deferred = deferred
        self.max_consecutive_skips = max_consecutive_skips
        self.find_culprit = find_culprit
        self.nan_losses = 0
        """Windows with a non-finite loss so far."""
        self.consecutive = 0
        self._window_bad: torch.Tensor | None = None
        self._flags: list[torch.Tensor] = []  # deferred: each window's flag since the latest read
        self._windows: list[str] = []  # and where it was
        self._published: torch.Tensor | None = None
        self._every = 0
        self._order: list[tuple[str, torch.nn.Module]] = []
        self._bad_output: str | None = None
        self._hooks: list[Any] = []
        self._warned: set[str] = set()

    def on_fit_start(self, trainer: SSSTrainer, module: LitModule) -> None:
        if trainer.state.last_checkpoint is None:  # a fresh fit; a resume restored the counts before FIT_START
            self.nan_losses = 0
        self.consecutive, self._window_bad = 0, None
        self._flags, self._windows, self._published = [], [], None
        self._every = trainer.config.log.every_n_steps
        if self.find_culprit and not self._hooks:
            self._hooks = [sub.register_forward_hook(self._output_hook(name)) for name, sub in module.named_modules()]

    def _output_hook(self, name: str) -> Any:
        def hook(sub: torch.nn.Module, args: Any, output: Any) -> None:
            if sub.training:
                self._order.append((name, sub))  # children finish first: execution order, innermost first
                if self._bad_output is None and not _finite(output):
                    self._bad_output = f"{name or '<root>'} ({type(sub).__name__}) output"

        return hook

    def on_batch_start(self, trainer: SSSTrainer, module: LitModule) -> None:
        if trainer.state.micro_step == 0:  # a new accumulation window
            self._order, self._bad_output = [], None

    def on_after_backward(self, trainer: SSSTrainer, module: LitModule) -> None:
        state, accelerator = trainer.state, trainer.accelerator
        bad = ~torch.isfinite(state.loss).all()
        if self._window_bad is not None:
            bad, self._window_bad = bad | self._window_bad, None
        if accelerator.num_processes > 1:  # every process must take the same decision, or the replicas drift
            bad = accelerator.reduce(bad.float().reshape(1), reduction="sum") > 0
        if self.find_culprit and self._bad_output is None:
            self._bad_output = _bad_gradient(self._order)
        where = f"global_step {state.global_step} (epoch {state.epoch}, batch index {state.batch_idx})"
        culprit = f"; first non-finite: {self._bad_output}" if self._bad_output else ""
        if self.deferred:  # read at the next logging step (see _read_deferred)
            self._flags.append(bad.reshape(()))
            self._windows.append(f"{where}{culprit}")
            return
        if not bool(bad):  # one sync per optimizer step
            return
        self.nan_losses += 1
        if self.on_nan == "raise":
            raise FloatingPointError(
                f"OverflowDetector: the loss is {float(state.loss)} at {where}{culprit}. {ADVICE} "
                "To skip such batches instead, set on_nan: skip."
            )
        state.skip_step = True
        _warn_once(
            trainer,
            self._warned,
            "nan",
            f"OverflowDetector: non-finite loss at {where}{culprit}: batch skipped (on_nan=skip); "
            "further ones are counted in train/overflow/nan_losses",
        )

    def on_after_optimizer_step(self, trainer: SSSTrainer, module: LitModule) -> None:
        state, scaler = trainer.state, trainer.accelerator.scaler
        skipped = state.step_was_skipped  # fused optimizers' skips included: the trainer detects those
        self.consecutive = self.consecutive + 1 if skipped else 0
        if skipped and self._bad_output:
            _warn_once(
                trainer,
                self._warned,
                f"culprit:{self._bad_output}",
                f"OverflowDetector: skipped global_step {state.global_step}; first non-finite: {self._bad_output}",
                local=True,  # the hooks saw this process's data: other processes may name another module
            )
        logs = state.logs
        logs["train/overflow/skipped"] = state.skipped_steps
        logs["train/overflow/nan_losses"] = self.nan_losses
        if self._flags and self._logging_step(trainer):  # a device count, read with the logged figures
            self._published = self.nan_losses + torch.stack(self._flags).sum()
            logs["train/overflow/nan_losses"] = self._published
        if scaler is not None:
            # the scale as a device tensor where torch offers it: get_scale() is a sync (fp16's own, per step)
            scale = getattr(scaler, "_get_scale_async", None)
            logs["train/loss_scale"] = scale().detach().clone() if scale is not None else scaler.get_scale()
        if self.consecutive >= self.max_consecutive_skips:
            raise RuntimeError(
                f"OverflowDetector: {self.consecutive} optimizer steps in a row were skipped (up to global_step "
                f"{state.global_step}, epoch {state.epoch}, batch index {state.batch_idx}): the loss or the gradients "
                f"are not finite at every step, so the model has stopped learning. {ADVICE}"
            )

    def _logging_step(self, trainer: SSSTrainer) -> bool:
        state = trainer.state
        return self._every > 0 and state.global_step % self._every == 0 and not state.step_was_skipped

    def _read_deferred(self, trainer: SSSTrainer) -> None:
        """Deferred: count the non-finite windows since the latest read; under on_nan=raise, stop at the first."""
        flags, windows, published = self._flags, self._windows, self._published
        self._flags, self._windows, self._published = [], [], None
        if not flags:
            return
        total = published if published is not None else self.nan_losses + torch.stack(flags).sum()
        found = int(host_floats({"n": total})["n"]) - self.nan_losses  # no sync when the logger read it
        if found <= 0:
            return
        self.nan_losses += found
        first = windows[torch.stack(flags).int().argmax().item()]  # a second read, only when one was not finite
        if self.on_nan == "raise":
            raise FloatingPointError(
                f"OverflowDetector: the loss was not finite at {first} ({found} window(s) up to global_step "
                f"{trainer.state.global_step}, read at a logging step: deferred=True). {ADVICE}"
            )

    def on_batch_end(self, trainer: SSSTrainer, module: LitModule) -> None:
        loss = trainer.state.loss
        if trainer.state.micro_step != 0 and loss is not None:  # mid-window: remember, without a device sync
            bad = ~torch.isfinite(loss).all()
            self._window_bad = bad if self._window_bad is None else self._window_bad | bad
        elif self._flags and self._logging_step(trainer):
            self._read_deferred(trainer)

    def on_epoch_end(self, trainer: SSSTrainer, module: LitModule) -> None:
        self._read_deferred(trainer)  # before the epoch's checkpoint (a stock callback, so after this one)

    def on_fit_end(self, trainer: SSSTrainer, module: LitModule) -> None:
        self._read_deferred(trainer)
        self._remove_hooks()

    def on_exception(self, trainer: SSSTrainer, module: LitModule) -> None:
        self._remove_hooks()

    def _remove_hooks(self) -> None:
        for handle in self._hooks:
            handle.remove()
        self._hooks, self._order = [], []

    def state_dict(self) -> dict[str, Any]:
        if self._flags:  # deferred: the windows since the latest read count too (a read at a save)
            return {"nan_losses": int(self.nan_losses + torch.stack(self._flags).sum())}
        return {"nan_losses": self.nan_losses}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.nan_losses = int(state["nan_losses"])  # an older checkpoint's fused_skips: the trainer counts those now


def _finite(output: Any) -> bool:
    if isinstance(output, torch.Tensor):
        return not output.is_floating_point() or bool(torch.isfinite(output).all())
    if isinstance(output, (tuple, list)):
        return all(_finite(o) for o in output)
    if isinstance(output, dict):
        return all(_finite(o) for o in output.values())
    return True


def _bad_gradient(order: list[tuple[str, torch.nn.Module]]) -> str | None:
    # Backward runs the forward order in reverse, so the first bad gradient is the last module's.
    seen: set[int] = set()
    for name, sub in reversed(order):
        if id(sub) in seen:
            continue
        seen.add(id(sub))
        for pname, p in sub.named_parameters(recurse=False):
            if p.grad is not None and not bool(torch.isfinite(p.grad).all()):
                return f"{name or '<root>'} ({type(sub).__name__}) gradient of {pname}"
    return None
