"""The Event enum and the Callback methods stay 1:1, and events fire in the order the docstring maps."""

from __future__ import annotations

import inspect
import re

import pytest
from torch import nn

from sss import Callback, Event, SSSTrainer
from sss.callbacks.stock import add_stock_callbacks
from sss.testing import BoringModule, EventRecorder, boring_loader

QUIET = {"log": {"progress": False, "trackers": []}}


def test_callbacks_map_to_events():
    methods = {name for name, _ in inspect.getmembers(Callback, inspect.isfunction) if name.startswith("on_")}
    assert methods == {event.value for event in Event}
    assert len(Event) <= 16
    for event in Event:
        params = list(inspect.signature(getattr(Callback, event.value)).parameters)
        assert params == ["self", "trainer", "module"], event


def _docstring_order() -> list[Event]:
    names = re.findall(r"# ([A-Z_]{4,})\b", Event.__doc__)
    return [Event[name] for name in dict.fromkeys(names)]


def _expected(epochs: int, batches: int, window: int, save_every_epoch: bool) -> list[Event]:
    seq = [Event.FIT_START]
    for _ in range(epochs):
        seq.append(Event.EPOCH_START)
        for i in range(batches):
            seq.append(Event.BATCH_START)
            if (i + 1) % window == 0 or i + 1 == batches:
                seq += [Event.AFTER_BACKWARD, Event.AFTER_OPTIMIZER_STEP]
            seq.append(Event.BATCH_END)
        seq += [Event.VALIDATION_START, Event.VALIDATION_END, Event.EPOCH_END]
        if save_every_epoch:
            seq.append(Event.SAVE_CHECKPOINT)  # the checkpoint callback runs after the recorder
    return [*seq, Event.FIT_END]


def test_event_order_matches_the_map_in_the_event_docstring():
    recorder = EventRecorder()
    trainer = add_stock_callbacks(
        SSSTrainer(max_epochs=2, gradient_accumulation_steps=2, callbacks=[recorder], mixed_precision="no", **QUIET)
    )
    trainer.fit(BoringModule(), train_dataloaders=boring_loader(n=24, batch_size=8), val_dataloaders=boring_loader(n=8))
    assert recorder.events == _expected(epochs=2, batches=3, window=2, save_every_epoch=True)
    # without accumulation, events appear for the first time in the order the docstring lists them
    recorder = EventRecorder()
    trainer = add_stock_callbacks(
        SSSTrainer(max_epochs=1, callbacks=[recorder], mixed_precision="no", output_dir="second", **QUIET)
    )
    trainer.fit(BoringModule(), train_dataloaders=boring_loader(n=16, batch_size=8), val_dataloaders=boring_loader(n=8))
    first_seen = list(dict.fromkeys(recorder.events))
    order = _docstring_order()
    assert [e for e in order if e in first_seen] == first_seen
    assert set(order) == set(Event), "every event must have a # marker in the Event docstring"


# (what the step's code does, how the Event docstring map says it), in the map's order
STEP_MAP = [
    ("Event.BATCH_START", "# BATCH_START"),
    ("accelerator.accumulate(self.model)", "with accelerator.accumulate(model):"),
    ("check_first_batch(batch, self.module)", "check_first_batch (keys, dtypes, shapes)"),
    ("state.loss = self._run_batch(batch, batch_idx)", "state.loss = module.training_step(batch, batch_idx)"),
    ("if accelerator.sync_gradients:", "if accelerator.sync_gradients:"),
    ("torch._foreach_mul_(grads", "rescale a short window"),
    ("accelerator.unscale_gradients()", "accelerator.unscale_gradients()"),
    ("Event.AFTER_BACKWARD", "# AFTER_BACKWARD"),
    ("state.skip_step", "if not state.skip_step:"),
    ("state.grad_norm = compat.clip_grad_norm_(", "state.grad_norm = accelerator.clip_grad_norm_(...)"),
    ("compat.optimizer_step(self.optimizer)", "optimizer.step()"),
    ("state.skipped_steps += 1", "skipped_steps += 1"),
    ("state.global_step += 1", "global_step += 1"),
    ("self.scheduler.step()", "scheduler.step()"),
    ("Event.AFTER_OPTIMIZER_STEP", "# AFTER_OPTIMIZER_STEP"),
    ("state.logs.clear()", "state.logs.clear()"),
    ("compat.zero_grad(self.optimizer)", "optimizer.zero_grad()"),
    ("Event.BATCH_END", "# BATCH_END"),
]


def test_the_map_follows_the_step_line_for_line():
    step = inspect.getsource(SSSTrainer._train_step)
    optimizer_step = inspect.getsource(SSSTrainer._optimizer_step)
    in_map = [Event.__doc__.index(described) for _, described in STEP_MAP]
    assert in_map == sorted(in_map), "the map lists the step out of order"
    outer = [code for code, _ in STEP_MAP[:5]] + ["self._optimizer_step()", STEP_MAP[-1][0]]
    assert [step.index(code) for code in outer] == sorted(step.index(code) for code in outer)
    inner = [code for code, _ in STEP_MAP[5:-1]]
    assert [optimizer_step.index(code) for code in inner] == sorted(optimizer_step.index(c) for c in inner)


def test_exception_event_fires_and_error_is_reraised():
    class Boom(BoringModule):
        def training_step(self, batch, batch_idx):
            raise RuntimeError("boom")

    recorder = EventRecorder()
    trainer = add_stock_callbacks(
        SSSTrainer(max_epochs=1, callbacks=[recorder], mixed_precision="no", checkpoint={"every_epoch": False}, **QUIET)
    )
    with pytest.raises(RuntimeError, match="boom"):
        trainer.fit(Boom(), train_dataloaders=boring_loader())
    assert recorder.events[-1] is Event.EXCEPTION
    assert isinstance(trainer.state.exception, RuntimeError)


def test_stock_callbacks_come_after_user_callbacks_and_can_be_replaced():
    from sss.callbacks import MetricsLogger, ModelCheckpoint, Plots, ProgressBar
    from sss.callbacks.model_summary import ModelSummary
    from sss.callbacks.skipped import SkippedRows

    mine = ModelCheckpoint(every_n_steps=5)
    trainer = add_stock_callbacks(SSSTrainer(callbacks=[EventRecorder(), mine], mixed_precision="no"))
    kinds = [type(c) for c in trainer.callbacks]
    assert kinds == [EventRecorder, ModelCheckpoint, ModelSummary, ProgressBar, Plots, MetricsLogger, SkippedRows]
    assert trainer.callbacks[1] is mine


STOCK_AND_HEALTH = [
    "ProgressBar",
    "MetricsLogger",
    "ModelCheckpoint",
    "EventRecorder",
    "GradNormMonitor",
    "OGMGE",
    "OverflowDetector",
    "EarlyStopping",
    "LearningRateMonitor",
    "DebugShapes",
    "Throughput",
    "MemoryMonitor",
    "Plots",
    "ModelSummary",
    "SkippedRows",
]  # HubPush needs a Hub server: tests/callbacks/test_hub.py


@pytest.mark.parametrize("callback_name", STOCK_AND_HEALTH)
def test_every_callback_survives_two_fits(callback_name, tmp_path):
    import sss.callbacks
    import sss.testing

    cls = getattr(sss.callbacks, callback_name, None) or getattr(sss.testing, callback_name)
    callback = cls()
    for run in range(2):
        trainer = add_stock_callbacks(
            SSSTrainer(
                max_steps=3,
                callbacks=[callback],
                mixed_precision="no",
                output_dir=str(tmp_path / f"r{run}"),
                log={"progress": False, "trackers": ["csv"]},
            )
        )
        trainer.fit(BoringModule(), train_dataloaders=boring_loader(), val_dataloaders=boring_loader(n=8))
        assert trainer.state.global_step == 3


def test_module_has_no_hooks():
    hooks = [n for n, _ in inspect.getmembers(BoringModule) if n.startswith("on_") and n not in dir(nn.Module)]
    assert hooks == []
