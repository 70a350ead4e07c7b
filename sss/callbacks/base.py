"""The one hook system of `sss`: an `Event` enum and a `Callback` base with one method per event."""

from __future__ import annotations

from enum import Enum
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from sss.trainer.module import LitModule
    from sss.trainer.trainer import SSSTrainer

__all__ = ["Callback", "Event"]


class Event(str, Enum):
    """Points in the loop where callbacks run; each value is the name of the `Callback` method.

    The map of the loop (``sss/trainer/trainer.py``), with the event fired at each point::

        fit(module):
            prepare model, optimizer, scheduler, loaders
            if ckpt_path: restore it
                # LOAD_CHECKPOINT
            # FIT_START
            sanity check: trainer.sanity_val_batches batches through validation_step and compute_metrics
                          (no events, nothing kept, RNG restored; not on a resume); the first batch's
                          keys, dtypes and shapes are checked when the loop reaches it
            for epoch in epochs:
                # EPOCH_START
                for batch_idx, batch in train_loader:   (at most limit_train_batches)
                    # BATCH_START
                    with accelerator.accumulate(model):
                        the fit's first batch only: check_first_batch (keys, dtypes, shapes)
                        state.loss = module.training_step(batch, batch_idx); accelerator.backward(loss)
                                     (under autocast; with trainer.auto_batch_size, in parts after an OOM)
                        if accelerator.sync_gradients:      (the end of an accumulation window)
                            rescale a short window; accelerator.unscale_gradients()
                            # AFTER_BACKWARD          (true-scale grads, before clipping)
                            if not state.skip_step:
                                state.grad_norm = accelerator.clip_grad_norm_(...)
                                optimizer.step()
                            skipped? -> skipped_steps += 1
                                else -> global_step += 1; scheduler.step()
                            module's self.log step values -> state.logs (at logging steps)
                            # AFTER_OPTIMIZER_STEP
                            state.logs.clear()      (at logging steps: every callback has read them)
                            optimizer.zero_grad()
                    if the step reached a multiple of trainer.val_every_n_steps:
                        the validation pass below, with its events   (RNG states restored after it)
                    # BATCH_END                   (checkpoints every N steps save here, after that pass)
                    stop at max_steps or when state.should_stop
                self.log epoch values: one all-reduce -> state.metrics
                if validation is due:          (and not already run at this step by val_every_n_steps)
                    # VALIDATION_START
                    gather_for_metrics(module.validation_step(...))   (a padded last batch per sample)
                        after each batch: a stop agreed after a signal leaves the pass (no metrics, no
                        VALIDATION_END); the checkpoint callback saves at BATCH_END / EPOCH_END / FIT_END
                    module.compute_metrics(outputs, classes=datamodule.classes) -> state.metrics
                    # VALIDATION_END
                # EPOCH_END
                # SAVE_CHECKPOINT   (fired by trainer.save_checkpoint once the state is written; the
                                    #  checkpoint callback saves at EPOCH_END, and at BATCH_END every N steps)
            # FIT_END
        any exception in fit: # EXCEPTION, then it is re-raised

    ``validate``/``test`` fire VALIDATION_START and VALIDATION_END only (``state.stage`` tells which).
    ``predict``::

        predict(module, dataloaders=...):
            for batch_idx, batch in loader:
                out = module.predict_step(batch, batch_idx)
                state.batch = batch; state.rank_prediction = out, less the sampler's padding rows
                state.prediction = gather_for_metrics(out)          (all processes, padding dropped)
                # PREDICT_BATCH_END
            # PREDICT_END

    Example:
        >>> Event.BATCH_END.value
        'on_batch_end'
    """

    FIT_START = "on_fit_start"
    LOAD_CHECKPOINT = "on_load_checkpoint"
    EPOCH_START = "on_epoch_start"
    BATCH_START = "on_batch_start"
    AFTER_BACKWARD = "on_after_backward"
    AFTER_OPTIMIZER_STEP = "on_after_optimizer_step"
    BATCH_END = "on_batch_end"
    VALIDATION_START = "on_validation_start"
    VALIDATION_END = "on_validation_end"
    SAVE_CHECKPOINT = "on_save_checkpoint"
    EPOCH_END = "on_epoch_end"
    FIT_END = "on_fit_end"
    EXCEPTION = "on_exception"
    PREDICT_BATCH_END = "on_predict_batch_end"
    PREDICT_END = "on_predict_end"


class Callback:
    """Base class: override the `on_*` methods you need; all take `(trainer, module)`.

    Data that varies between calls (loss, grad norm, metrics, the skipped-step flag) is on
    ``trainer.state``. Callbacks run in the order of the list given to the trainer. A callback
    that keeps state across a resume returns it from `state_dict` (JSON-serialisable).

    Example:
        >>> class PrintLoss(Callback):
        ...     def on_batch_end(self, trainer, module):
        ...         if trainer.state.global_step % 100 == 0:
        ...             print(float(trainer.state.loss))
        >>> PrintLoss().state_dict()
        {}
    """

    def on_fit_start(self, trainer: SSSTrainer, module: LitModule) -> None:
        """Model, optimizer and loaders are prepared; nothing has been trained yet."""

    def on_load_checkpoint(self, trainer: SSSTrainer, module: LitModule) -> None:
        """A checkpoint was restored (weights, optimizer, counters, callback states)."""

    def on_epoch_start(self, trainer: SSSTrainer, module: LitModule) -> None:
        """A training epoch begins (`trainer.state.epoch`)."""

    def on_batch_start(self, trainer: SSSTrainer, module: LitModule) -> None:
        """A micro-batch is about to run (`trainer.state.batch_idx`, `trainer.state.micro_step`)."""

    def on_after_backward(self, trainer: SSSTrainer, module: LitModule) -> None:
        """End of an accumulation window: gradients are synced, at true scale, not yet clipped."""

    def on_after_optimizer_step(self, trainer: SSSTrainer, module: LitModule) -> None:
        """The optimizer stepped, or the loss scaler skipped it (`trainer.state.step_was_skipped`)."""

    def on_batch_end(self, trainer: SSSTrainer, module: LitModule) -> None:
        """A micro-batch finished (`trainer.state.loss` holds its loss as a tensor)."""

    def on_validation_start(self, trainer: SSSTrainer, module: LitModule) -> None:
        """An evaluation pass begins (`trainer.state.stage` is "val" or "test")."""

    def on_validation_end(self, trainer: SSSTrainer, module: LitModule) -> None:
        """An evaluation pass ended; its metrics are in `trainer.state.metrics`, equal on every process."""

    def on_save_checkpoint(self, trainer: SSSTrainer, module: LitModule) -> None:
        """A checkpoint was written to `trainer.state.last_checkpoint`."""

    def on_epoch_end(self, trainer: SSSTrainer, module: LitModule) -> None:
        """A training epoch ended, after its validation."""

    def on_fit_end(self, trainer: SSSTrainer, module: LitModule) -> None:
        """Training finished normally."""

    def on_exception(self, trainer: SSSTrainer, module: LitModule) -> None:
        """`fit` is failing; `trainer.state.exception` holds the error, which is re-raised afterwards."""

    def on_predict_batch_end(self, trainer: SSSTrainer, module: LitModule) -> None:
        """`predict` ran a batch: `trainer.state.prediction` (gathered), `trainer.state.rank_prediction`
        (this process's rows), `trainer.state.batch`, `trainer.state.batch_idx`."""

    def on_predict_end(self, trainer: SSSTrainer, module: LitModule) -> None:
        """`predict` ran its last batch (e.g. a writer merges its files here)."""

    def state_dict(self) -> dict[str, Any]:
        """What this callback must carry across a resume (JSON-serialisable). Default: nothing."""
        return {}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Restore what `state_dict` returned."""
