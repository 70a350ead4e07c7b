"""`SSSTrainer`: the training loop, thin over an Accelerate `Accelerator`.

Read it top to bottom: `fit` -> `_train_epoch` -> `_train_step` -> `_optimizer_step`; every
evaluation, the sanity validation included, is one pass (`_eval_pass`). Hardware, precision,
gradient sync and sharding belong to Accelerate; the loop never branches on the distributed type.
The map of events is in the `Event` docstring (``sss/callbacks/base.py``).
"""

from __future__ import annotations

import contextlib
import dataclasses
import itertools
import shutil
import warnings
from collections.abc import Iterable, Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any

import torch
from accelerate import Accelerator
from torch import nn

import sss.trainer._accelerate_compat as compat  # each Accelerate workaround, with its upstream issue
from sss import checkpoint as ckpt_io
from sss.callbacks.base import Callback, Event
from sss.config import ConfigError, TrainerConfig
from sss.data.presence import batch_edit
from sss.trainer._batches import batch_size, first_batches, own_buffer_storage, split_batch, step_loss
from sss.trainer._compile import compile_module
from sss.trainer._dispatch import EMPTY as EMPTY_DISPATCH
from sss.trainer._dispatch import DispatchTable
from sss.trainer._fail_fast import check_first_batch, check_gradients, sanity_batches, sanity_note
from sss.trainer._logged import ModuleLogs, stamp
from sss.trainer._oom import MicroBatchRunner, SplittingRunner
from sss.trainer._processes import destroy_group_at_exit, tag_warnings_with_rank
from sss.trainer._resume import check_resumable, marker_meta, restore_rng_and_position, stream_of
from sss.trainer._setup import (
    build_accelerator,
    count_total_steps,
    fast_dev_config,
    optimizer_and_scheduler,
    resolve_precision,
    use_cpu,
    warn_unseedable,
    with_overrides,
)
from sss.trainer._stop import EvaluationStopped, StopRequest
from sss.trainer.finetune import Finetuning, rewrap
from sss.trainer.module import LitModule, compute_metrics
from sss.trainer.state import TrainState

__all__ = ["EvaluationStopped", "SSSTrainer", "resolve_precision", "use_cpu"]


class _StepRouter(nn.Module):
    """Calls a `LitModule` method through the prepared model's ``forward``.

    DDP syncs only gradients of work done inside its ``forward``, and Accelerate puts autocast
    on ``forward``: routing ``training_step`` through it gives both (Lightning wraps the same way).
    It also stamps what the call logged with ``self.log`` with the call's step and batch size.
    """

    def __init__(self, module: LitModule) -> None:
        super().__init__()
        self.module = module
        object.__setattr__(self, "_lit", module)  # also a plain attribute: read without nn.Module.__getattr__

    def forward(self, method: str, *args: Any) -> Any:
        module = self._lit
        logged = module.__dict__.get("_logged")
        start = len(logged) if logged is not None else 0
        out = getattr(module, method)(*args)
        if module.__dict__.get("_logged"):
            stamp(module, method, batch_size(args[0]), start)
        return out

    def caller(self, prepared: nn.Module) -> Any:
        """What runs a step: `prepared` (this router, prepared), or ``forward`` where that is all it would do."""
        # nn.Module.__call__ of an unhooked module only calls forward: skipping it is ~2 µs a step, a tenth of
        # the loop's overhead on a tiny model. DDP, FSDP and compile wrap the router and Accelerate's autocast
        # patches its forward: each of them keeps the call through the prepared model.
        bare = prepared is self and "forward" not in vars(self)
        return self.forward if bare and not (self._forward_hooks or self._forward_pre_hooks) else prepared


class SSSTrainer:
    """Trains a `LitModule`: precision, accumulation, clipping, validation, checkpoints.

    Settings come from a `TrainerConfig` (YAML ``trainer:``) or keyword overrides. The trainer
    runs the callbacks it is given, in order; the stock ones that ``sss fit`` adds from the
    config (progress bar, metric logger, checkpoints) come from
    ``sss.callbacks.stock.with_stock_callbacks(callbacks, config)``.

    Example:
        >>> from sss.testing import BoringModule, boring_loader
        >>> trainer = SSSTrainer(max_steps=3, mixed_precision="no")
        sss: mixed precision no
        >>> trainer.fit(BoringModule(), train_dataloaders=boring_loader())
        {}
        >>> trainer.state.global_step
        3
    """

    def __init__(
        self,
        config: TrainerConfig | None = None,
        *,
        callbacks: Sequence[Callback] = (),
        accelerator: Accelerator | None = None,
        run_config: dict[str, Any] | None = None,
        **overrides: Any,
    ) -> None:
        tag_warnings_with_rank()  # first: warnings while building the Accelerator carry their rank too
        self.config = fast_dev_config(with_overrides(config or TrainerConfig(), overrides))
        self.run_config = run_config
        """The whole run's config (model, data, ...), saved in checkpoints and checked on resume."""
        self.accelerator = accelerator if accelerator is not None else build_accelerator(self.config)
        destroy_group_at_exit()
        if self.accelerator.gradient_accumulation_steps != self.config.gradient_accumulation_steps:
            raise ConfigError(
                f"trainer.gradient_accumulation_steps is {self.config.gradient_accumulation_steps} but the given "
                f"Accelerator accumulates {self.accelerator.gradient_accumulation_steps}: build it with "
                f"Accelerator(gradient_accumulation_steps={self.config.gradient_accumulation_steps})"
            )
        if accelerator is not None:
            warn_unseedable(accelerator)
        self.callbacks: list[Callback] = list(callbacks)
        self.state = TrainState()
        self.module: LitModule | None = None
        self.datamodule: Any = None
        """The datamodule of the current fit (None when loaders were passed)."""
        self.model: nn.Module | None = None
        """The prepared model (DDP/FSDP wrapper around the module) that the loop calls."""
        self.optimizer: Any = None
        self.scheduler: Any = None
        self.total_steps = 0
        """Optimizer steps this fit will run (0 when unknown: an unsized loader without max_steps)."""
        self.stop = StopRequest()
        """A stop asked by a signal (the checkpoint callback's handler): the loop leaves an evaluation pass for it."""
        self._grads_checked = self._batch_checked = False
        self._epoch_finished = self._epoch_counted = False
        self._resume_batches = 0
        self._resume_rng: dict[str, Any] | None = None
        self._run_batch: MicroBatchRunner | None = None  # chosen at set-up: _forward_backward or a SplittingRunner
        self._train_call: Any = None  # chosen at set-up: what a step calls to run the module (_StepRouter.caller)
        self._logs = ModuleLogs()
        self._val_loader: Any = None  # the fit's validation loader, for trainer.val_every_n_steps
        self._dispatch = EMPTY_DISPATCH  # event -> the callbacks' methods that override it (built in _fire)
        self._resize_history: tuple[TrainState | None, list[dict[str, int]]] = (None, [])
        """The process-count changes since step 0 (trainer.resume_resize), kept with the state they belong to."""
        self._finetune = Finetuning()  # trainer.finetune: the held-out parameters of this fit (at set-up)
        self._stream: Any = None  # the fit's training StreamDataset, whose position checkpoints record

    @property
    def output_dir(self) -> Path:
        """Where checkpoints, logs and exports go (``trainer.output_dir``, default ``runs/run``)."""
        return Path(self.config.output_dir or "runs/run")

    # ------------------------------------------------------------------ the loop
    def fit(
        self,
        module: LitModule,
        datamodule: Any = None,
        *,
        train_dataloaders: Iterable[Any] | None = None,
        val_dataloaders: Iterable[Any] | None = None,
        ckpt_path: str | Path | None = None,
    ) -> dict[str, float]:
        """Train `module`; returns the latest evaluation metrics. `ckpt_path` resumes a checkpoint."""
        train_loader, val_loader = self._setup_fit(module, datamodule, train_dataloaders, val_dataloaders)
        try:
            if ckpt_path is not None:
                self.load_checkpoint(ckpt_path)
            self._fire(Event.FIT_START)
            if ckpt_path is None:  # validation_step and compute_metrics fail in seconds; skipped on resume
                self._sanity_validate(val_loader)
            while not self._should_finish():
                self._train_epoch(train_loader, val_loader)
            self._fire(Event.FIT_END)
        except BaseException as exc:
            self.state.exception = exc
            self._fire(Event.EXCEPTION)
            raise
        return dict(self.state.metrics)

    def _train_epoch(self, loader: Any, val_loader: Any) -> None:
        state, cfg = self.state, self.config
        state.stage, self._epoch_finished, self._epoch_counted = "fit", False, False
        self.model.train()
        if hasattr(loader, "set_epoch"):
            loader.set_epoch(state.epoch)  # data order is a function of (seed, epoch): resumable
        if hasattr(getattr(loader, "dataset", None), "set_epoch"):
            loader.dataset.set_epoch(state.epoch)  # so is a dataset's augmentation, when it offers that
        start, self._resume_batches = self._resume_batches, 0
        self._val_loader = val_loader  # for trainer.val_every_n_steps, run from _train_step
        self._logs.start_epoch(self.module)
        self._fire(Event.EPOCH_START)
        for batch_idx, batch in self._epoch_batches(loader, start):
            if self._resume_rng is not None:  # starting the loader mid-epoch drew from the RNG; undo that
                ckpt_io.set_rng_state(self._resume_rng)
                self._resume_rng = None
            state.batch_idx = batch_idx
            self._train_step(batch, batch_idx)
            if state.should_stop or self._max_steps_reached():
                break
        else:
            self._epoch_finished = True
        if self._resume_rng is not None:  # resumed after the epoch's last batch: nothing was left to run
            ckpt_io.set_rng_state(self._resume_rng)
            self._resume_rng = None
        self._logs.end_epoch(self.module, state, self.accelerator)  # self.log(..., on_epoch=True) -> state.metrics
        last_epoch = cfg.max_epochs is not None and self._epoch_finished and state.epoch + 1 >= cfg.max_epochs
        ending = last_epoch or state.should_stop or self._max_steps_reached()
        due = self._epoch_finished and (state.epoch + 1) % cfg.val_every_n_epochs == 0
        if val_loader is not None and (due or ending) and not self._step_validated():
            with contextlib.suppress(EvaluationStopped):  # a signal: the checkpoint callback saves at EPOCH_END
                self._evaluate(val_loader, "val")
        self._fire(Event.EPOCH_END)
        if self._epoch_finished:
            state.epoch += 1
            self._epoch_counted = True

    def _epoch_batches(self, loader: Any, start: int) -> Iterator[tuple[int, Any]]:
        limit = self.config.limit_train_batches
        if limit is not None and start >= limit:
            return iter(())  # resumed after the limited epoch's last batch
        batches = enumerate(compat.loader_from(self.accelerator, loader, start), start=start)
        return batches if limit is None else self._until(batches, limit)  # no generator of ours when unlimited

    def _until(self, batches: Iterator[tuple[int, Any]], limit: int) -> Iterator[tuple[int, Any]]:
        for batch_idx, batch in batches:
            if batch_idx + 1 >= limit:
                compat.close_window_early(self.accelerator)  # the epoch ends here, before the loader does
                yield batch_idx, batch
                return
            yield batch_idx, batch

    def _train_step(self, batch: Any, batch_idx: int) -> None:
        state, accelerator = self.state, self.accelerator
        step = state.global_step
        if not state.micro_step and self._finetune.due(step):  # a window's start: its micro-batches train alike
            self._bind(self._finetune.unfreeze(self.optimizer, self.module, self.accelerator, self.model), False)
        self._fire(Event.BATCH_START)
        with compat.accumulate(accelerator, self.model):  # accelerator.accumulate(self.model), less window-1 no-ops
            if not self._batch_checked:  # the batch contract (sss.data.contract), on the fit's first batch only
                self._batch_checked = check_first_batch(batch, self.module)
            state.loss = self._run_batch(batch, batch_idx)
            state.micro_step += 1
            state.samples += batch_size(batch) * accelerator.num_processes
            if accelerator.sync_gradients:  # the end of an accumulation window
                self._optimizer_step()
        if state.global_step != step and self._step_validated():
            self._validate_mid_epoch()  # before BATCH_END: a checkpoint saved at this step ranks by it
        self._fire(Event.BATCH_END)

    def _step_validated(self) -> bool:
        # trainer.val_every_n_steps validates at every step that reaches a multiple of N, so an epoch-end
        # pass at such a step would repeat it (the weights are the same); a resume lands on the same rule.
        n, step = self.config.val_every_n_steps, self.state.global_step
        return n is not None and step > 0 and step % n == 0 and self._val_loader is not None

    def _validate_mid_epoch(self) -> None:
        # A side pass: training continues as without it. A signal leaves it; the checkpoint callback saves at BATCH_END.
        with self._side_pass(), contextlib.suppress(EvaluationStopped):
            self._evaluate(self._val_loader, "val")

    def _optimizer_step(self) -> None:
        state, accelerator, cfg = self.state, self.accelerator, self.config
        window = accelerator.gradient_accumulation_steps
        if state.micro_step < window:  # a short last window: Accelerate divided by the full one (Lightning #19987)
            grads = [p.grad for p in self.model.parameters() if p.grad is not None]
            torch._foreach_mul_(grads, window / state.micro_step)  # a mean over the window's real size
        accelerator.unscale_gradients()  # callbacks and clipping see true-scale fp16 gradients
        if not self._grads_checked:
            self._grads_checked = check_gradients(self.module, cfg.find_unused_parameters, accelerator.is_main_process)
        self._fire(Event.AFTER_BACKWARD)
        skipped = state.skip_step  # a callback discarded this window (e.g. a NaN loss under on_nan=skip)
        if skipped:
            compat.end_skipped_step(accelerator)
        else:
            if cfg.max_grad_norm is not None:
                state.grad_norm = compat.clip_grad_norm_(accelerator, self.model.parameters(), cfg.max_grad_norm)
            scale = compat.fused_loss_scale(accelerator, self.optimizer)
            compat.optimizer_step(self.optimizer)  # optimizer.step(), less its per-call no-op probes
            skipped = accelerator.optimizer_step_was_skipped or compat.fused_step_skipped(accelerator, scale)
        state.step_was_skipped, state.skip_step = skipped, False
        if skipped:  # no update: not a step, and the LR schedule stays
            state.skipped_steps += 1
        else:
            state.global_step += 1
            if self.scheduler is not None:
                self.scheduler.step()  # not prepared, so once per step on every process (Accelerate #2926)
        state.lr = self.optimizer.param_groups[0]["lr"]
        self._logs.end_window(self.module, state, cfg.log.every_n_steps, replays=cfg.auto_batch_size)
        self._fire(Event.AFTER_OPTIMIZER_STEP)
        if not skipped and state.global_step % cfg.log.every_n_steps == 0:
            state.logs.clear()  # every callback has read this logging step's values, whatever their order
        compat.zero_grad(self.optimizer)
        state.micro_step = 0

    def _forward_backward(self, batch: Any, batch_idx: int) -> torch.Tensor:
        # The micro-batch runner of a fit without trainer.auto_batch_size (a MicroBatchRunner).
        loss = step_loss(self._train_call("training_step", batch, batch_idx))
        self.accelerator.backward(loss)
        return loss.detach()

    # ------------------------------------------------------------------ evaluation
    def validate(
        self,
        module: LitModule,
        datamodule: Any = None,
        *,
        dataloaders: Iterable[Any] | None = None,
        prefix: str = "val",
        zero: str | None = None,
        missing: Mapping[str, float] | None = None,
    ) -> dict[str, float]:
        """Evaluate on the validation data; metrics are named ``<prefix>/<name>``.

        `zero` names a batch key to replace by zeros; `missing` (``{"image": 0.5}``) makes each modality absent in
        that seeded fraction of the samples (`sss.data.presence.batch_edit`): the ablation and robustness passes.
        Values the module logs in ``validation_step`` (``self.log``) join the metrics as ``<prefix>/<name>``.
        """
        edit = batch_edit(module, zero=zero, missing=missing, seed=self.config.seed)
        return self._evaluate(self._eval_loader(module, datamodule, dataloaders, "validate"), prefix, edit)

    def test(
        self,
        module: LitModule,
        datamodule: Any = None,
        *,
        dataloaders: Iterable[Any] | None = None,
        prefix: str = "test",
        zero: str | None = None,
        missing: Mapping[str, float] | None = None,
    ) -> dict[str, float]:
        """Evaluate on the test data; metrics are named ``<prefix>/<name>`` (see `validate` for `zero`, `missing`)."""
        edit = batch_edit(module, zero=zero, missing=missing, seed=self.config.seed)
        return self._evaluate(self._eval_loader(module, datamodule, dataloaders, "test"), prefix, edit)

    def predict(
        self,
        module: LitModule,
        datamodule: Any = None,
        *,
        dataloaders: Iterable[Any] | None = None,
        return_predictions: bool = True,
    ) -> list[Any] | None:
        """`predict_step` outputs per batch, gathered from all processes (padding duplicates dropped).

        After each batch's gather, PREDICT_BATCH_END fires with ``state.prediction`` (gathered),
        ``state.rank_prediction`` (this process's rows, less the sampler's padding), ``state.batch`` and
        ``state.batch_idx``; PREDICT_END fires after the last batch. With ``return_predictions=False``
        nothing is kept and None is returned, so memory stays flat over any number of rows when a
        callback writes the outputs as they come (`sss.callbacks.PredictionWriter`).

        Example:
            >>> from sss.testing import BoringModule, boring_loader
            >>> trainer = SSSTrainer(mixed_precision="no", log={"progress": False, "trackers": []})
            sss: mixed precision no
            >>> [p.shape for p in trainer.predict(BoringModule(), dataloaders=boring_loader(n=10, batch_size=8))]
            [torch.Size([8, 2]), torch.Size([2, 2])]
        """
        from accelerate.utils import recursively_apply

        loader = self._eval_loader(module, datamodule, dataloaders, "predict")
        state, accelerator = self.state, self.accelerator
        state.stage = "predict"
        self.model.eval()
        kept: list[Any] = []
        with torch.no_grad():
            for batch_idx, batch in enumerate(loader):
                output = self.model("predict_step", batch, batch_idx)
                state.batch_idx, state.batch, state.rank_prediction = batch_idx, batch, output
                if accelerator.num_processes > 1 and accelerator.gradient_state.end_of_dataloader:
                    # the rows of this process that gather_for_metrics keeps (the rest repeat the first samples)
                    size, remainder = batch_size(batch), accelerator.gradient_state.remainder
                    real = size if remainder <= 0 else min(max(remainder - accelerator.process_index * size, 0), size)
                    state.rank_prediction = recursively_apply(lambda t, n=real: t[:n], output)
                state.prediction = accelerator.gather_for_metrics(output)
                self._fire(Event.PREDICT_BATCH_END)
                if return_predictions:
                    kept.append(state.prediction)
        state.batch = state.prediction = state.rank_prediction = None  # the last batch is not held after predict
        self._fire(Event.PREDICT_END)
        return kept if return_predictions else None

    def _evaluate(self, loader: Any, prefix: str, edit: Any = None) -> dict[str, float]:
        state = self.state
        previous, state.stage = state.stage, "test" if prefix.startswith("test") else "val"
        self._fire(Event.VALIDATION_START)
        try:
            metrics, outputs = self._eval_pass(loader, prefix, self.config.limit_val_batches, edit)
        except EvaluationStopped:  # a signal left the pass after a batch: nothing of it is kept
            state.stage, self.stop.during = previous, self.stop.during or "validation"
            raise
        state.metrics.update(metrics)
        state.eval_metrics, state.eval_outputs = metrics, outputs
        self._fire(Event.VALIDATION_END)
        state.stage = previous
        return metrics

    def _sanity_validate(self, loader: Any) -> None:
        # As Lightning's num_sanity_val_steps: a crash in validation_step or compute_metrics surfaces before the first
        # step. The evaluation pass's sanity mode, as a side pass: training continues as without it (docs/trainer.md).
        batches = sanity_batches(self.config, loader)
        if not batches:
            return
        try:
            with self._side_pass(rewind=loader):
                self._eval_pass(loader, "val", batches, sanity=True)
        except Exception as exc:
            exc.add_note(sanity_note(batches))
            raise

    def _eval_pass(
        self, loader: Any, prefix: str, limit: int | None, edit: Any = None, sanity: bool = False
    ) -> tuple[dict[str, float], dict[str, torch.Tensor]]:
        """The one evaluation pass: `limit` batches through ``validation_step``, gathered, then `compute_metrics`.

        Returns the pass's metrics, with the means of what ``validation_step`` logged (``<prefix>/<name>``),
        and the gathered outputs. It fires no event and leaves the model in the mode it found. In the
        `sanity` mode (the sanity validation) the first batch is checked against the batch contract, a
        stop is not looked for, and the logged values' names are checked into a throwaway state.
        """
        was_training = self.model.training
        self.model.eval()
        self._logs.start_eval(self.module)
        chunks: dict[str, list[torch.Tensor]] = {}
        try:
            with torch.no_grad():
                for batch_idx, batch in enumerate(itertools.islice(loader, limit)):
                    if sanity and batch_idx == 0:
                        check_first_batch(batch, self.module, "validation")
                    batch = batch if edit is None else edit(batch)  # an ablation or robustness pass
                    outputs = self.accelerator.gather_for_metrics(self._validation_step(batch, batch_idx))
                    for key, value in outputs.items():
                        chunks.setdefault(key, []).append(torch.atleast_1d(value.detach()))
                    if not sanity and self.stop.agreed(self.accelerator):  # a signal: leave after this batch
                        raise EvaluationStopped(prefix)
            joined = {key: torch.cat(values) for key, values in chunks.items()}
            metrics = {f"{prefix}/{k}": v for k, v in self._compute_metrics(joined).items()} if joined else {}
            into = TrainState() if sanity else self.state  # a sanity pass keeps nothing, not even the bar's values
            metrics = self._logs.end_eval(into, self.accelerator, prefix, metrics)  # self.log: <prefix>/<name>
        finally:
            self.model.train(was_training)
        return metrics, joined

    @contextlib.contextmanager
    def _side_pass(self, rewind: Any = None) -> Iterator[None]:
        """Around a pass beside training (the sanity and step validations): the run trains as without it.

        Restores the RNG states, Accelerate's dataloader stack, the model's mode and `rewind`'s epoch counter.
        """
        # A loader's __iter__ draws a seed from the global RNG; one left before its end never takes itself off
        # Accelerate's dataloader stack, where it would hide the end of the training loader (the last window's
        # sync); one run to its end counts an epoch, which seeds its next shuffle.
        gradient_state = self.accelerator.gradient_state
        rng, was_training = ckpt_io.get_rng_state(), self.model.training
        stack, epoch = list(gradient_state.dataloader_references), getattr(rewind, "iteration", None)
        try:
            yield
        finally:
            self.model.train(was_training)
            ckpt_io.set_rng_state(rng)
            gradient_state.dataloader_references = stack
            if epoch is not None:
                rewind.iteration = epoch

    def _validation_step(self, batch: Any, batch_idx: int) -> dict[str, torch.Tensor]:
        accelerator = self.accelerator
        if accelerator.num_processes == 1 or not accelerator.gradient_state.end_of_dataloader:
            outputs = self.model("validation_step", batch, batch_idx)
            self._logs.fold_eval(self.module)
            return outputs
        # A distributed sampler may have padded this last batch with repeated samples, which
        # gather_for_metrics drops by position: run it sample by sample, so that no batch-level
        # value (the mean loss) mixes them into the samples kept, and drop what the repeats logged.
        size, remainder = batch_size(batch), accelerator.gradient_state.remainder
        real = size if remainder <= 0 else min(max(remainder - accelerator.process_index * size, 0), size)
        parts = []
        for i, one in enumerate(split_batch(batch, size)):
            parts.append(self.model("validation_step", one, batch_idx))
            self._logs.fold_eval(self.module, drop=i >= real)
        return {key: torch.cat([torch.atleast_1d(part[key]) for part in parts]) for key in parts[0]}

    def _compute_metrics(self, outputs: dict[str, torch.Tensor]) -> dict[str, float]:
        return compute_metrics(self.module, outputs, getattr(self.datamodule, "classes", None))

    # ------------------------------------------------------------------ checkpoints
    def save_checkpoint(self, directory: str | Path) -> Path:
        """Write the full state (Accelerate's ``save_state`` + ``trainer_state.json``) to `directory`.

        It is written beside the target as ``<name>.tmp`` and renamed when complete, so an
        interrupted save never looks like a checkpoint. The marker, written last, lists every
        file with its size and CRC32 (`sss.checkpoint.write_marker`): loading verifies them.
        """
        accelerator, final = self.accelerator, Path(directory)
        tmp = final.with_name(final.name + ".tmp")
        if accelerator.is_main_process and tmp.exists():
            shutil.rmtree(tmp)
        accelerator.wait_for_everyone()
        accelerator.save_state(str(tmp))
        accelerator.wait_for_everyone()  # every process's RNG file is in tmp
        if accelerator.is_main_process:
            missing = [n for i in range(accelerator.num_processes) if not (tmp / (n := ckpt_io.rng_file(i))).is_file()]
            if missing:  # processes on machines that do not share this folder: the checkpoint cannot resume
                warnings.warn(
                    f"{final}: {', '.join(missing)} not in the folder (the processes do not share {final.parent}?); "
                    "this checkpoint cannot be resumed exactly and will be refused on resume",
                    stacklevel=2,
                )
            ckpt_io.write_marker(tmp, self._checkpoint_meta())  # written last
            ckpt_io.commit_folder(tmp, final)
        accelerator.wait_for_everyone()
        self.state.last_checkpoint = str(final)
        self._fire(Event.SAVE_CHECKPOINT)
        return final

    def load_checkpoint(self, path: str | Path) -> None:
        """Restore a checkpoint written by `save_checkpoint` (call inside `fit` via ``ckpt_path``).

        The folder is verified first (`sss.checkpoint.verify_checkpoint`: a missing, truncated or
        altered file raises `DamagedCheckpointError` naming it), then checked for pickles that would
        run code, and after ``load_state`` the RNG state must be the saved one.

        A checkpoint of another process count resumes only under ``trainer.resume_resize``: the
        weights, optimizer, schedule and counters restore exactly; the data position is the batch
        that follows the samples already seen in the epoch (`sss.checkpoint.resized_resume_batch`),
        and ranks the checkpoint has no RNG file for are seeded from process 0's
        (`sss.checkpoint.seed_missing_rng`).
        """
        path, meta = ckpt_io.verify_for_resume(path)  # a VerifiedCheckpoint (run_fit's) is not checked again
        check_resumable(path, meta, self.config, self.accelerator.num_processes, self._config_record(), self._stream)
        ckpt_io.check_no_code_on_load(path)
        if self._finetune.restore(meta, self.optimizer, self.module):  # before the optimizer state (Lightning #21901)
            self._bind(rewrap(self.accelerator, self.model))
        self.accelerator.load_state(str(path))
        state = self.state
        state.global_step, state.skipped_steps = meta["global_step"], meta["skipped_steps"]
        state.batch_splits = meta.get("batch_splits", 1)
        state.epoch = meta["resume_epoch"]
        self._resume_batches = restore_rng_and_position(path, meta, self.accelerator)
        # Kept with the state this fit trains (a new fit replaces it), for the checkpoints it writes.
        self._resize_history = (state, ckpt_io.resize_history(meta, self.accelerator.num_processes))
        # The uninterrupted run had its epoch's loader running when it saved; a resumed one starts
        # it anew, and DataLoader.__iter__ draws a seed from the global RNG. Mid-epoch, the saved
        # state is restored again at the first batch (transformers #39215).
        self._resume_rng = ckpt_io.get_rng_state() if self._resume_batches else None
        state.samples, state.metrics = meta["samples"], dict(meta["metrics"])
        for callback, saved in zip(self.callbacks, meta["callbacks"], strict=False):
            if type(callback).__name__ == saved["class"]:
                callback.load_state_dict(saved["state"])
        state.last_checkpoint = str(path)
        self._fire(Event.LOAD_CHECKPOINT)

    def _config_record(self) -> dict[str, Any]:
        record = dict(self.run_config) if self.run_config is not None else {}
        record["trainer"] = dataclasses.asdict(self.config)  # the effective one, with overrides
        return record

    def _checkpoint_meta(self) -> dict[str, Any]:
        state = self.state
        # the process-count changes since step 0 (trainer.resume_resize), when this fit resumed one
        kept_state, resized = self._resize_history
        position = (state.epoch, state.batch_idx + 1)
        if self._epoch_finished:  # the next epoch's start, which state.epoch counts once EPOCH_END has run
            position = (state.epoch + (not self._epoch_counted), 0)
        callbacks = [{"class": type(c).__name__, "state": c.state_dict()} for c in self.callbacks]
        resized = resized if kept_state is state else []
        record, finetune, procs = self._config_record(), self._finetune.record(), self.accelerator.num_processes
        stream = self._stream and {**self._stream.position(*position), "processes": procs}
        return marker_meta(state, position, callbacks, procs, record, resized, finetune, stream)

    # ------------------------------------------------------------------ set-up
    def _setup_fit(self, module: LitModule, datamodule: Any, train: Any, val: Any) -> tuple[Any, Any]:
        from accelerate.utils import set_seed

        set_seed(self.config.seed)
        self.datamodule = datamodule
        if datamodule is not None:
            datamodule.setup("fit")
            train = train if train is not None else datamodule.train_dataloader()
            val = val if val is not None else datamodule.val_dataloader()
        if train is None:
            raise ValueError("fit() needs training data: pass a datamodule or train_dataloaders=")
        if self.config.overfit_batches:
            train = val = first_batches(train, self.config.overfit_batches)
        train = compat.prepare_loader(self.accelerator, train)  # a stream is split by itself, not again
        self._stream = stream_of(train)  # its position is recorded in checkpoints and checked on resume
        val = self.accelerator.prepare(val) if val is not None else None
        self.total_steps = count_total_steps(train, self.config, self.accelerator.gradient_accumulation_steps)
        own_buffer_storage(module)
        if self.config.compile:  # in place (whole or per block): the state dict keeps its names, checkpoints portable
            compile_module(module, self.config.compile)
        self._finetune = Finetuning(module, self.config.finetune, self.config.fsdp, self.config.deepspeed)
        optimizer, self.scheduler = optimizer_and_scheduler(self.config, module, self.total_steps, self._finetune)
        self.model, self.optimizer = self.accelerator.prepare(_StepRouter(module), optimizer)
        compat.backward_without_unit_division(self.accelerator)  # after prepare: an engine taking backward is known
        self.module = module
        if self.scheduler is not None:
            self.accelerator.register_for_checkpointing(self.scheduler)
        self.state, self._grads_checked, self._batch_checked = TrainState(), False, False
        self._bind(self.model)
        self._finetune.announce(self.accelerator, self.optimizer, self.config.optim)  # the group table, when LRs differ
        return train, val

    def _bind(self, model: nn.Module, checked: bool = True) -> None:  # the prepared router every step calls
        self.model, self._grads_checked = model, self._grads_checked and checked  # a new trainable set: check again
        self._train_call = self.accelerator.unwrap_model(model, keep_torch_compile=True).caller(model)
        self._run_batch = (  # chosen once: the step calls it for every micro-batch
            SplittingRunner(self.accelerator, model, self.module, self.optimizer, self.state)
            if self.config.auto_batch_size
            else self._forward_backward
        )

    def _eval_loader(self, module: LitModule, datamodule: Any, loader: Any, stage: str) -> Any:
        if datamodule is not None:
            self.datamodule = datamodule  # class names and settings for compute_metrics
        if module is not self.module:
            own_buffer_storage(module)
            router = _StepRouter(module).train(module.training)  # validate() restores the mode it found
            self.model, self.module = self.accelerator.prepare(router), module
        if loader is None and datamodule is not None:
            datamodule.setup(stage)
            loader = getattr(
                datamodule, {"validate": "val", "test": "test", "predict": "predict"}[stage] + "_dataloader"
            )()
        if loader is None:
            raise ValueError(
                f"{stage}() found no data: pass dataloaders= or a datamodule that provides the {stage} split"
            )
        return self.accelerator.prepare(loader)

    def _max_steps_reached(self) -> bool:
        return self.config.max_steps is not None and self.state.global_step >= self.config.max_steps

    def _should_finish(self) -> bool:
        epochs, state = self.config.max_epochs, self.state
        return state.should_stop or self._max_steps_reached() or (epochs is not None and state.epoch >= epochs)

    def _fire(self, event: Event) -> None:
        # Only the callbacks that override the event's method run (sss/trainer/_dispatch.py); the table is
        # rebuilt when self.callbacks changed since it was built (appended before fit, or before validate).
        table = self._dispatch
        if not table.current(self.callbacks):
            table = self._dispatch = DispatchTable(self.callbacks)
        for method in table.methods[event]:
            method(self, self.module)
