"""`compat.accumulate`: with an accumulation count of 1, Accelerate's ``accumulate`` reduced to its counters."""

from __future__ import annotations

import pytest
import torch
from accelerate import Accelerator
from torch.utils.data import DataLoader

import sss.trainer._accelerate_compat as compat


def _trace(window: int, enter, epochs: int = 2) -> list[tuple[int, bool, bool]]:
    # (Accelerate's micro-batch counter, sync_gradients, end_of_dataloader) at each batch of two epochs
    accelerator = Accelerator(cpu=True, gradient_accumulation_steps=window)
    model, loader = accelerator.prepare(torch.nn.Linear(1, 1), DataLoader(torch.arange(5.0), batch_size=2))
    seen = []
    for _ in range(epochs):
        for _batch in loader:
            with enter(accelerator, model):
                state = accelerator.gradient_state
                seen.append((accelerator.step, state.sync_gradients, state.end_of_dataloader))
    return seen


@pytest.mark.parametrize("window", [1, 2])
def test_same_gradient_state_as_accelerate_accumulate(window):
    ours = _trace(window, compat.accumulate)
    assert ours == _trace(window, lambda accelerator, model: accelerator.accumulate(model))
    assert [sync for _, sync, _ in ours] == ([True] * 6 if window == 1 else [False, True, True] * 2)
    assert [end for _, _, end in ours] == [False, False, True] * 2  # the loader's end resets the counter


def test_upstream_accumulate_with_one_step_never_enters_no_sync(monkeypatch):
    # Why the skip is safe: with a count of 1, accumulate syncs at every batch, so its no_sync branch
    # (the only other work it does) is dead. If upstream starts calling it, delete compat.accumulate.
    accelerator = Accelerator(cpu=True)
    calls = []
    monkeypatch.setattr(accelerator, "no_sync", lambda model: calls.append(model))
    for _ in range(3):
        with accelerator.accumulate(torch.nn.Linear(1, 1)):
            pass
    assert calls == []
    assert type(compat.accumulate(accelerator, torch.nn.Linear(1, 1))) is not type(accelerator.accumulate())
    two = Accelerator(cpu=True, gradient_accumulation_steps=2)
    assert type(compat.accumulate(two, torch.nn.Linear(1, 1))) is type(two.accumulate())
