"""`TrainState`: the small, typed state that callbacks read (and the loop writes)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

__all__ = ["TrainState"]


@dataclass
class TrainState:
    """Counters and the latest values of a run, on ``trainer.state``.

    Tensors (``loss``, ``grad_norm``) are kept as tensors: reading them with ``float()`` is a
    device sync, so callbacks do it only when they display or log.

    Example:
        >>> TrainState().global_step
        0
    """

    stage: str = "fit"
    """fit | val | test | predict: what the trainer is running now."""
    global_step: int = 0
    """Optimizer steps applied; steps the fp16 loss scaler skipped do not count."""
    skipped_steps: int = 0
    """Optimizer steps the loss scaler skipped (inf/NaN gradients)."""
    step_was_skipped: bool = False
    """Whether the latest optimizer step was skipped."""
    epoch: int = 0
    """Current epoch, from 0."""
    batch_idx: int = 0
    """Index of the current micro-batch in the epoch."""
    micro_step: int = 0
    """Micro-batches in the current accumulation window so far."""
    batch_splits: int = 1
    """Micro-batches each loader batch runs as (raised by ``trainer.auto_batch_size`` after an out-of-memory)."""
    samples: int = 0
    """Training samples seen, over all processes."""
    loss: Any = None
    """Loss of the latest micro-batch (a detached tensor)."""
    grad_norm: Any = None
    """Global gradient norm before clipping at the latest optimizer step (None without clipping)."""
    lr: float = 0.0
    """Learning rate of the first parameter group after the latest step."""
    metrics: dict[str, float] = field(default_factory=dict)
    """Latest value of every evaluation metric so far, e.g. ``{"val/accuracy": 0.97}``, and of every epoch value
    the module logs (``self.log(..., on_epoch=True)``, e.g. ``train/audio_rms``); equal on every process."""
    eval_metrics: dict[str, float] = field(default_factory=dict)
    """The metrics of the latest evaluation pass only (what VALIDATION_END reports)."""
    eval_outputs: dict[str, Any] = field(default_factory=dict)
    """The gathered `validation_step` outputs of the latest evaluation pass (e.g. ``preds``, ``target``),
    padding duplicates dropped; what `compute_metrics` saw. Replaced by the next pass."""
    logs: dict[str, Any] = field(default_factory=dict)
    """Scalars callbacks publish for the trackers (e.g. ``{"train/grad_norm/audio": 0.3}``), and the step
    values the module logs (``self.log``), published at every ``trainer.log.every_n_steps``-th step; the
    metrics logger writes them at its next logging step, and the trainer clears them once every callback
    has handled that step (AFTER_OPTIMIZER_STEP), so their order does not matter. Values may be one-element
    device tensors until a logging step reads them all at once (`sss.callbacks.metrics_logger.step_figures`:
    one host sync), and are floats after that."""
    bar: dict[str, float] = field(default_factory=dict)
    """Latest value of each name the module logged with ``self.log(..., prog_bar=True)``, for the progress bar."""
    skip_step: bool = False
    """Set by a callback at AFTER_BACKWARD to discard this window's gradients: no optimizer step,
    counted as skipped (e.g. a NaN loss under the ``skip`` policy). Reset by the trainer."""
    should_stop: bool = False
    """Set by a callback to stop training after the current batch."""
    last_checkpoint: str | None = None
    """Folder of the latest complete checkpoint."""
    exception: BaseException | None = None
    """The error `fit` is failing with, during the EXCEPTION event."""
    prediction: Any = None
    """`predict`: the latest batch's `predict_step` output gathered from all processes (padding dropped)."""
    rank_prediction: Any = None
    """`predict`: the latest batch's `predict_step` output of this process only, less the rows a distributed
    sampler repeated to pad the last batch (what a per-process writer writes)."""
    batch: Any = None
    """`predict`: the latest batch as this process loaded it (padding rows included)."""
