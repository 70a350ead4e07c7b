"""`SSSTrainer._fire` dispatches only to callbacks that override an event's method (sss/trainer/_dispatch.py)."""

from __future__ import annotations

import dataclasses

from sss import Callback, Event, SSSTrainer
from sss.testing import BoringModule, EventRecorder, boring_loader
from sss.trainer._dispatch import DispatchTable

QUIET = {"log": {"progress": False, "trackers": []}, "checkpoint": {"every_epoch": False}, "mixed_precision": "no"}


def _trainer(callbacks=(), **overrides) -> SSSTrainer:
    return SSSTrainer(callbacks=list(callbacks), max_steps=2, **{**QUIET, **overrides})


def test_callbacks_that_keep_the_base_no_op_are_not_called(monkeypatch):
    # Callback's own on_batch_start replaced by a counter: a loop that calls every callback's
    # method for every event (the dispatch before the table) would count each batch.
    calls = []
    monkeypatch.setattr(Callback, "on_batch_start", lambda self, trainer, module: calls.append(self))
    recorder = EventRecorder()
    trainer = _trainer([Callback(), recorder])
    trainer.fit(BoringModule(), train_dataloaders=boring_loader(n=16, batch_size=4))
    assert calls == []
    assert recorder.events.count(Event.BATCH_START) == 2  # an override still runs, once per batch


def test_table_lists_overrides_in_order_instance_attributes_and_duck_types():
    class OnEnd(Callback):
        def on_fit_end(self, trainer, module):
            pass

    class Duck:  # not a Callback: every event method it has
        def on_fit_end(self, trainer, module):
            pass

    plain, patched, first, duck = Callback(), Callback(), OnEnd(), Duck()
    patched.on_fit_end = lambda trainer, module: None
    table = DispatchTable([plain, first, patched, duck])
    assert table.methods[Event.FIT_END] == [first.on_fit_end, patched.on_fit_end, duck.on_fit_end]
    assert all(table.methods[e] == [] for e in Event if e is not Event.FIT_END)


def test_callbacks_added_after_construction_and_between_fit_and_validate_run():
    late = EventRecorder()
    trainer = _trainer()
    trainer.callbacks.append(late)  # before fit
    module = BoringModule()
    trainer.fit(module, train_dataloaders=boring_loader(n=16, batch_size=4))
    assert late.events[0] is Event.FIT_START and late.events[-1] is Event.FIT_END
    after = EventRecorder()
    trainer.callbacks.append(after)  # after fit, before validate
    trainer.validate(module, dataloaders=boring_loader(n=8, batch_size=4))
    assert after.events == [Event.VALIDATION_START, Event.VALIDATION_END]
    trainer.callbacks.remove(late)  # removed: no more events
    seen = len(late.events)
    trainer.validate(module, dataloaders=boring_loader(n=8, batch_size=4))
    assert len(late.events) == seen and len(after.events) == 4


def test_a_replaced_callback_equal_to_the_old_one_gets_the_events():
    ended = []

    @dataclasses.dataclass
    class Named(Callback):
        name: str = "same"

        def on_validation_end(self, trainer, module):
            ended.append(self)

    old, new = Named(), Named()
    assert old == new  # equal by value, yet another object: the table must not keep old's method
    trainer, module = _trainer([old]), BoringModule()
    trainer.validate(module, dataloaders=boring_loader(n=8, batch_size=4))
    trainer.callbacks[0] = new
    trainer.validate(module, dataloaders=boring_loader(n=8, batch_size=4))
    assert [c is old for c in ended] == [True, False] and ended[1] is new
