"""Workarounds for Accelerate behaviour the loop depends on, one function each, with the upstream issue it works around.

Every workaround has two tests in ``tests/trainer/test_accelerate_compat.py``: one that shows the
upstream behaviour still needs it (it fails once Accelerate changes: then delete the workaround)
and one that our path is correct. Written against Accelerate 1.15.

Nothing here assigns into Accelerate's modules or classes (``tests/trainer/test_no_accelerate_patch.py``):
a library must not change a third-party library under its user's feet. Three functions set an
attribute of the trainer's own `Accelerator` instance, each said in its docstring:
`clip_grad_norm_` (``native_amp``, for one call), `close_window_early` (``step``, Accelerate's
micro-batch counter) and `backward_without_unit_division` (``backward``).
"""

from __future__ import annotations

import contextlib
import sys
from collections.abc import Iterable
from typing import Any

import torch
from accelerate import Accelerator
from accelerate.optimizer import AcceleratedOptimizer
from accelerate.utils import DistributedType

__all__ = [
    "accumulate",
    "backward_without_unit_division",
    "clip_grad_norm_",
    "close_window_early",
    "end_skipped_step",
    "fused_loss_scale",
    "fused_step_skipped",
    "loader_from",
    "optimizer_step",
    "prepare_loader",
    "zero_grad",
]


def clip_grad_norm_(accelerator: Accelerator, parameters: Iterable[torch.Tensor], max_norm: float) -> torch.Tensor:
    """`Accelerator.clip_grad_norm_` on gradients the loop already unscaled; returns the norm before clipping.

    Upstream: ``clip_grad_norm_`` always calls ``unscale_gradients()`` first, and torch's GradScaler
    refuses a second ``unscale_`` in one step ("unscale_() has already been called on this optimizer
    since the last update()", accelerate#641, transformers#23935). The loop unscales once, before
    AFTER_BACKWARD, so that callbacks see true-scale gradients; this hides the scaler from the one call
    by setting ``native_amp`` on this `Accelerator` instance, restored on return or error.

    Example:
        >>> from torch import nn
        >>> accelerator = Accelerator(cpu=True)
        >>> layer = nn.Linear(2, 1)
        >>> layer(torch.ones(1, 2)).sum().backward()
        >>> round(float(clip_grad_norm_(accelerator, layer.parameters(), 1.0)), 4)
        1.7321
    """
    native_amp, accelerator.native_amp = accelerator.native_amp, False
    try:
        return accelerator.clip_grad_norm_(parameters, max_norm)
    finally:
        accelerator.native_amp = native_amp


def fused_loss_scale(accelerator: Accelerator, optimizer: Any) -> float | None:
    """The fp16 loss scale before the step of a fused optimizer (one that unscales in its kernel); None otherwise.

    Upstream (accelerate#4242, fix proposed in accelerate#4243): a fused optimizer skips an
    inf/NaN step inside its kernel, and ``optimizer_step_was_skipped`` reports the step as taken.
    The scaler backing off is the only trace, so `fused_step_skipped` compares the scale after the
    step with this one. Only fused optimizers pay ``get_scale()`` (a device sync), which the
    unfused ``GradScaler.step`` pays anyway.

    Example:
        >>> fused_loss_scale(Accelerator(cpu=True), torch.optim.SGD([torch.zeros(1)], lr=0.1)) is None
        True
    """
    scaler, inner = accelerator.scaler, getattr(optimizer, "optimizer", optimizer)
    if scaler is None or not scaler.is_enabled() or not getattr(inner, "_step_supports_amp_scaling", False):
        return None
    return scaler.get_scale()


def fused_step_skipped(accelerator: Accelerator, scale_before: float | None) -> bool:
    """Whether a fused optimizer's step was skipped: the loss scale fell below `scale_before` (see `fused_loss_scale`).

    Example:
        >>> fused_step_skipped(Accelerator(cpu=True), None)
        False
    """
    return scale_before is not None and accelerator.scaler.get_scale() < scale_before


def end_skipped_step(accelerator: Accelerator) -> None:
    """Close an optimizer step that the loop skips after it unscaled the gradients (``state.skip_step``).

    Upstream: Accelerate has no call to skip a step, and torch's GradScaler keeps its per-optimizer
    "unscaled" record until ``update()`` (pytorch#67590 asks for an explicit step state), so the next
    window's ``unscale_gradients()`` would raise "unscale_() has already been called". ``update()``
    ends the step as a scaler-skipped one ends: it backs the scale off when the gradients held
    inf/NaN, as they do for a NaN loss. Without a scaler (no fp16) there is nothing to close.

    Example:
        >>> end_skipped_step(Accelerator(cpu=True))
    """
    if accelerator.scaler is not None:
        accelerator.scaler.update()


def zero_grad(optimizer: Any) -> None:
    """``optimizer.zero_grad(set_to_none=True)`` without `AcceleratedOptimizer.zero_grad`'s per-call signature check.

    Upstream: ``AcceleratedOptimizer.zero_grad`` calls ``inspect.signature`` on the inner
    ``zero_grad`` at every call (added in accelerate#189; about 40 µs per step here). At a sync step
    it does nothing else than the inner call, which the loop only makes at sync steps, so call the
    inner one directly. Wrappers that override ``zero_grad`` (DeepSpeed's) keep their own.

    Example:
        >>> weight = torch.zeros(1, requires_grad=True)
        >>> weight.grad = torch.ones(1)
        >>> zero_grad(torch.optim.SGD([weight], lr=0.1)); weight.grad is None
        True
    """
    if type(optimizer).zero_grad is AcceleratedOptimizer.zero_grad:
        optimizer.optimizer.zero_grad(set_to_none=True)
    else:
        optimizer.zero_grad(set_to_none=True)


def optimizer_step(optimizer: Any) -> None:
    """``optimizer.step()`` without `AcceleratedOptimizer.step`'s per-call probes where each of them is a no-op.

    Upstream: ``AcceleratedOptimizer.step`` reads ``ACCELERATE_USE_FSDP`` from the environment
    (through ``GradientState.is_xla_gradients_synced``), compares the distributed type with XLA
    twice and asks whether ``lomo_optim`` is installed (a search of ``sys.path``, about 65 µs), at
    every call (accelerate#2695); then, with no loss scaler at a sync step, it calls the inner
    optimizer's ``step()`` and nothing else. Where every one of those checks says "nothing to do"
    (the exact upstream class, no scaler, gradients synced, not XLA, no LOMO optimizer), this calls
    the inner ``step()``; anything else (fp16's scaler, XLA, LOMO, DeepSpeed's wrapper) goes through
    upstream's own ``step``. An optimizer can only be one of ``lomo_optim``'s once that package is
    imported, so "no LOMO optimizer" is read from ``sys.modules`` (a dict lookup), not from the
    installed packages. ``optimizer_step_was_skipped`` stays right: without a scaler upstream never sets it.

    Example:
        >>> weight = torch.ones(1, requires_grad=True)
        >>> optimizer = Accelerator(cpu=True).prepare(torch.optim.SGD([weight], lr=0.5))
        >>> (2 * weight).sum().backward(); optimizer_step(optimizer); weight
        tensor([0.], requires_grad=True)
    """
    if (
        type(optimizer) is AcceleratedOptimizer
        and optimizer.scaler is None
        and optimizer.gradient_state.sync_gradients
        and optimizer.accelerator_state.distributed_type != DistributedType.XLA
        and "lomo_optim" not in sys.modules  # upstream's LOMO branch needs an optimizer of that package
    ):
        optimizer.optimizer.step()
    else:
        optimizer.step()


def close_window_early(accelerator: Accelerator) -> None:
    """Make the next ``accelerator.accumulate`` close its accumulation window (``trainer.limit_train_batches``).

    Upstream: ``accumulate`` syncs at a multiple of ``gradient_accumulation_steps`` or at the end of
    the prepared loader, and has no call to end a window early (accelerate#1847 documents the
    loader coupling). An epoch cut short by ``limit_train_batches`` ends before the loader does, so
    this sets Accelerate's micro-batch counter (``step``, an attribute of this `Accelerator`
    instance) one short of a multiple: the next ``accumulate`` reaches it and syncs, and the next
    window starts from a multiple, as after a full one.

    Example:
        >>> accelerator = Accelerator(cpu=True, gradient_accumulation_steps=4)
        >>> close_window_early(accelerator)
        >>> with accelerator.accumulate():
        ...     accelerator.sync_gradients
        True
    """
    accelerator.step = accelerator.gradient_accumulation_steps - 1


def backward_without_unit_division(accelerator: Accelerator) -> None:
    """Make ``accelerator.backward(loss)`` skip its division of the loss by an accumulation count of 1.

    Upstream: ``Accelerator.backward`` always computes ``loss / gradient_accumulation_steps``,
    also when that is 1 (the unconditional division: accelerate#3533), which adds a division and
    its ``DivBackward0`` node to every step (about 30 µs of the tiny MLP's 1.4 ms step here). When
    nothing else of ``backward`` applies, it then calls ``loss.backward()``: that is the case with
    an accumulation count of 1, no loss scaler (no fp16), no keyword arguments, an `Accelerator`
    whose ``backward`` is not overridden, and no engine that took the backward pass over (the
    DeepSpeed engine wrapper and the Megatron-LM plugin, which Accelerate stores only when it uses
    them). Dividing by 1 is exact in every float format, so the gradients are bitwise the same
    (tested). Count and scaler are read at each call; any other case calls Accelerate's own
    ``backward``. Installed once per Accelerator as an attribute of that instance (a no-op the
    second time); the `Accelerator` class and every other instance keep upstream's ``backward``.

    Example:
        >>> accelerator = Accelerator(cpu=True)
        >>> backward_without_unit_division(accelerator)
        >>> weight = torch.ones(1, requires_grad=True)
        >>> accelerator.backward((weight * 3).sum()); weight.grad
        tensor([3.])
    """
    if "backward" in vars(accelerator) or type(accelerator).backward is not Accelerator.backward:
        return  # installed already, or a subclass's own backward: leave it alone
    if vars(accelerator).get("deepspeed_engine_wrapped") is not None or vars(accelerator.state).get(
        "megatron_lm_plugin"
    ):
        return
    upstream = accelerator.backward

    def backward(loss: torch.Tensor, **kwargs: Any) -> None:
        if kwargs or accelerator.gradient_accumulation_steps != 1 or accelerator.scaler is not None:
            upstream(loss, **kwargs)
        else:
            loss.backward()

    accelerator.backward = backward


class _UnitWindow(contextlib.AbstractContextManager):
    """What ``accelerator.accumulate(model)`` amounts to with an accumulation count of 1 (see `accumulate`)."""

    __slots__ = ("accelerator",)

    def __init__(self, accelerator: Accelerator) -> None:
        self.accelerator = accelerator

    def __enter__(self) -> None:
        self.accelerator._do_sync()

    def __exit__(self, *exc: object) -> None:
        return None


def accumulate(accelerator: Accelerator, model: torch.nn.Module) -> contextlib.AbstractContextManager:
    """``accelerator.accumulate(model)``, without its generator and ``ExitStack`` when every micro-batch is a window.

    Upstream: ``accumulate`` is a ``@contextmanager`` that calls ``_do_sync()`` (the micro-batch
    counter, ``sync_gradients``, and the end-of-loader reset) and then enters ``no_sync(model)``
    unless ``sync_gradients`` is set. With an accumulation count of 1, ``_do_sync`` sets it at every
    call (``step % 1 == 0``, or the end of the loader), so ``no_sync`` is never entered on any
    process count or device: the context is ``_do_sync()`` and nothing else (about 3 µs less per
    step here; tested against ``accumulate``'s own effects). Accelerate has no public call for it
    (accelerate#1847 documents the coupling). The count is read at each call.

    Example:
        >>> accelerator = Accelerator(cpu=True)
        >>> with accumulate(accelerator, torch.nn.Linear(1, 1)):
        ...     accelerator.sync_gradients, accelerator.step
        (True, 1)
    """
    if accelerator.gradient_state.num_steps != 1:
        return accelerator.accumulate(model)
    return _UnitWindow(accelerator)


def prepare_loader(accelerator: Accelerator, loader: Any) -> Any:
    """``accelerator.prepare(loader)``, except for a loader whose dataset already reads one process's share.

    A `sss.data.stream.StreamDataset` splits its stream between processes and workers itself. Accelerate
    would split it again: ``dispatch_batches`` (its default for iterable datasets) reads every batch on
    process 0 and sends slices, and without it ``IterableDatasetShard`` keeps one batch in N of each process's
    stream, so samples are silently never seen (accelerate PR #4276). Such a loader is prepared as for one
    process: device placement and the end-of-loader flag accumulation needs, nothing re-split.

    Example:
        >>> from torch.utils.data import DataLoader
        >>> [batch.tolist() for batch in prepare_loader(Accelerator(cpu=True), DataLoader([1, 2, 3], batch_size=2))]
        [[1, 2], [3]]
    """
    from sss.data.stream import splits_itself

    if not splits_itself(getattr(loader, "dataset", None)):
        return accelerator.prepare(loader)
    from accelerate.data_loader import prepare_data_loader

    return prepare_data_loader(
        loader,
        accelerator.device,
        num_processes=1,
        process_index=0,
        put_on_device=True,
        dispatch_batches=False,
        non_blocking=accelerator.dataloader_config.non_blocking,
    )


def loader_from(accelerator: Accelerator, loader: Any, start: int) -> Any:
    """The loader an epoch iterates when `start` of its batches were taken before a resume.

    A dataset that can start anywhere (``start_at``: `sss.data.stream.StreamDataset`) is placed there, and
    reads nothing before it; any other loader goes through ``accelerator.skip_first_batches``, which skips
    a map-style loader's first batches in its batch sampler (indices only, no sample is loaded) and an
    iterable one's by reading them.

    Example:
        >>> from torch.utils.data import DataLoader
        >>> loader = DataLoader([1, 2, 3])
        >>> loader_from(Accelerator(cpu=True), loader, 0) is loader
        True
    """
    dataset = getattr(loader, "dataset", None)
    if hasattr(dataset, "start_at"):
        dataset.start_at(start)
        return loader
    return accelerator.skip_first_batches(loader, start) if start else loader
