"""Micro-batch runners: the `MicroBatchRunner` protocol, and `SplittingRunner`, which splits batches after an OOM."""

from __future__ import annotations

import contextlib
import math
import warnings
from typing import Any, Protocol

import torch
from accelerate import Accelerator
from torch import nn

from sss.trainer._accelerate_compat import zero_grad
from sss.trainer._batches import batch_size, split_batch, step_loss
from sss.trainer.state import TrainState

__all__ = ["MicroBatchRunner", "SplittingRunner"]


class MicroBatchRunner(Protocol):
    """What the training step calls for each micro-batch: ``training_step`` and backward; returns the detached loss.

    The trainer chooses one at set-up: its plain forward and backward, or a `SplittingRunner` under
    ``trainer.auto_batch_size``. It runs inside ``accelerator.accumulate``.

    Example:
        >>> def runner(batch: Any, batch_idx: int) -> torch.Tensor:
        ...     return torch.zeros(())
        >>> chosen: MicroBatchRunner = runner
        >>> chosen({"image": torch.zeros(1)}, 0)
        tensor(0.)
    """

    def __call__(self, batch: Any, batch_idx: int) -> torch.Tensor: ...


class SplittingRunner:
    """Runs training_step and backward on a loader batch as ``state.batch_splits`` micro-batches; splits further on OOM.

    Each part's loss is weighted by its share of the batch, so the gradient is the whole batch's
    (``compute_loss`` is a per-sample mean). Gradients are synced across processes on the window's
    last backward only. On an out-of-memory error the split doubles, the window's partial
    gradients are discarded, the module's buffers (BatchNorm statistics) are restored to the
    window's start and the window's earlier batches are replayed: the step is the one an
    unsplit run takes, up to the order of the sums. The trainer calls it inside
    ``accelerator.accumulate`` in place of its plain forward/backward, only with
    ``trainer.auto_batch_size``.

    Args:
        accelerator: The trainer's Accelerator.
        model: The prepared model, called as ``model("training_step", batch, batch_idx)``.
        module: The `LitModule` inside it, whose buffers are restored before a replay.
        optimizer: The prepared optimizer, whose gradients are dropped before a replay.
        state: The trainer's state: ``batch_splits`` is read and raised, ``global_step`` named in messages.

    Example:
        >>> from sss.testing import BoringModule, boring_loader
        >>> accelerator = Accelerator(cpu=True)
        >>> module = BoringModule()
        >>> def model(method, *args):  # what the trainer's prepared model does
        ...     return getattr(module, method)(*args)
        >>> runner = SplittingRunner(accelerator, model, module, None, TrainState(batch_splits=2))
        >>> with accelerator.accumulate():
        ...     loss = runner(next(iter(boring_loader(batch_size=4))), 0)
        >>> loss.shape, all(p.grad is not None for p in module.parameters())
        (torch.Size([]), True)
    """

    def __init__(self, accelerator: Accelerator, model: Any, module: nn.Module, optimizer: Any, state: TrainState):
        self.accelerator, self.model, self.module = accelerator, model, module
        self.optimizer, self.state = optimizer, state
        self.window: list[tuple[Any, int]] = []
        """The current accumulation window's batches so far (replayed after an OOM)."""
        self.window_buffers: list[torch.Tensor] = []
        """The module's buffers at the window's start."""
        self.in_synced_part = False
        """Whether the micro-batch running now is the one whose backward syncs gradients."""

    def __call__(self, batch: Any, batch_idx: int) -> torch.Tensor:
        """Forward and backward of `batch`; returns its loss (detached). Call inside ``accelerator.accumulate``."""
        if not self.window:  # the state a replay starts from
            self.window_buffers = [b.detach().clone() for b in self.module.buffers()]
        replay = False
        while True:
            try:
                if replay:  # the window's earlier batches, whose gradients the failed try discarded
                    self._backward(self.window, last=False)
                loss = self._backward([(batch, batch_idx)], last=True)
                break
            except Exception as exc:  # only an out-of-memory is retried
                self._split_after_oom(exc, batch)
                replay = True
        if self.accelerator.sync_gradients:
            self.window = []
        else:
            self.window.append((batch, batch_idx))
        return loss

    def _backward(self, batches: list[tuple[Any, int]], last: bool) -> torch.Tensor:
        accelerator, loss = self.accelerator, None
        for n, (batch, batch_idx) in enumerate(batches):
            parts = split_batch(batch, self.state.batch_splits)
            size = sum(batch_size(part) for part in parts) if len(parts) > 1 else 1
            losses = []
            for i, part in enumerate(parts):
                final = last and n == len(batches) - 1 and i == len(parts) - 1
                self.in_synced_part = final and accelerator.sync_gradients
                with contextlib.nullcontext() if final else accelerator.no_sync(self.model):
                    part_loss = step_loss(self.model("training_step", part, batch_idx))
                    if len(parts) > 1:
                        part_loss = part_loss * (batch_size(part) / size)
                    accelerator.backward(part_loss)
                losses.append(part_loss.detach())
            loss = losses[0] if len(losses) == 1 else torch.stack(losses).sum()
        return loss

    def _split_after_oom(self, exc: Exception, batch: Any) -> None:
        from accelerate.utils.memory import clear_device_cache, should_reduce_batch_size

        if not should_reduce_batch_size(exc):
            raise exc
        accelerator, state = self.accelerator, self.state
        size, splits = batch_size(batch), state.batch_splits * 2
        if self.in_synced_part and accelerator.num_processes > 1:
            # DDP's reducer cannot redo a step whose synchronising backward failed on one process.
            raise RuntimeError(
                f"out of memory in the gradient-synchronising micro-batch at step {state.global_step} with "
                f"{accelerator.num_processes} processes, which cannot be retried: lower data.batch_size and "
                "raise trainer.gradient_accumulation_steps by the same factor (the effective batch stays)"
            ) from exc
        if splits > size:
            raise RuntimeError(
                f"out of memory with micro-batches of 1 sample (batch {size} split {size} ways): lower the image "
                "size or clip length, turn on gradient checkpointing (module.set_grad_checkpointing(True)) or use bf16"
            ) from exc
        zero_grad(self.optimizer)  # this window's partial gradients are recomputed from its batches
        for buffer, saved in zip(self.module.buffers(), self.window_buffers, strict=True):
            buffer.copy_(saved)  # BatchNorm statistics as before the window, which is replayed
        clear_device_cache(garbage_collection=True)
        state.batch_splits = splits
        accum = accelerator.gradient_accumulation_steps
        warnings.warn(
            f"out of memory at step {state.global_step}: each batch of {size} now runs as {splits} micro-batches "
            f"of about {math.ceil(size / splits)} ({accum * splits} backward passes per optimizer step; the "
            "effective batch is unchanged)",
            stacklevel=2,
        )
