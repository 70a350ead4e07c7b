"""A window of k micro-batches equals one batch of the whole window, including a short last window."""

from __future__ import annotations

import copy

import torch
from torch.utils.data import DataLoader

from sss import SSSTrainer
from sss.testing import BoringDataset, BoringModule

QUIET = {"log": {"progress": False, "trackers": []}, "checkpoint": {"every_epoch": False}}
SGD = {"optimizer": {"_target_": "torch.optim.SGD", "lr": 0.5}}


def _trainer(**kw):
    return SSSTrainer(mixed_precision="no", cpu=True, max_grad_norm=None, optim=SGD, **QUIET, **kw)


def _params(module):
    return torch.cat([p.detach().flatten() for p in module.parameters()])


def _manual_sgd(module, windows, data, lr, divide_by):
    """Plain PyTorch: one SGD step per window; each micro-batch loss divided by `divide_by(window)`."""
    module = copy.deepcopy(module)
    opt = torch.optim.SGD(module.parameters(), lr=lr)
    for window in windows:
        for micro in window:
            batch = {k: v[micro] for k, v in data.items()}
            (module.compute_loss(module(batch), batch) / divide_by(window)).backward()
        opt.step()
        opt.zero_grad()
    return module


def test_accumulation_with_partial_last_window_equals_full_batches():
    # 20 samples, micro-batch 4, window 3: windows of 12 and 8 samples (the last one short).
    dataset = BoringDataset(20)
    start = BoringModule()
    accumulated = copy.deepcopy(start)
    _trainer(max_epochs=1, gradient_accumulation_steps=3).fit(
        accumulated, train_dataloaders=DataLoader(dataset, batch_size=4)
    )
    full = copy.deepcopy(start)
    big_batches = DataLoader(dataset, batch_sampler=[list(range(12)), list(range(12, 20))])
    trainer = _trainer(max_epochs=1)
    trainer.fit(full, train_dataloaders=big_batches)
    assert trainer.state.global_step == 2
    torch.testing.assert_close(_params(accumulated), _params(full), rtol=1e-5, atol=1e-7)

    # Negative control: dividing the short window by the configured 3 (Accelerate's and
    # Lightning's behaviour) gives a different model, so the test above can fail.
    data = {k: dataset[list(range(20))][k] for k in ("image", "audio", "label")}
    micro = [list(range(i, i + 4)) for i in range(0, 20, 4)]
    naive = _manual_sgd(start, [micro[:3], micro[3:]], data, 0.5, divide_by=lambda w: 3)
    exact = _manual_sgd(start, [micro[:3], micro[3:]], data, 0.5, divide_by=lambda w: len(w))
    torch.testing.assert_close(_params(exact), _params(full), rtol=1e-5, atol=1e-7)
    assert (_params(naive) - _params(full)).abs().max() > 1e-3


def test_epoch_shorter_than_window_still_steps_with_the_right_scale():
    # 2 micro-batches per epoch, window 4 (Lightning #21808): one step per epoch, over 2 batches.
    dataset = BoringDataset(8)
    start = BoringModule()
    accumulated = copy.deepcopy(start)
    trainer = _trainer(max_epochs=2, gradient_accumulation_steps=4)
    trainer.fit(accumulated, train_dataloaders=DataLoader(dataset, batch_size=4))
    assert trainer.state.global_step == 2
    full = copy.deepcopy(start)
    _trainer(max_epochs=2).fit(full, train_dataloaders=DataLoader(dataset, batch_size=8))
    torch.testing.assert_close(_params(accumulated), _params(full), rtol=1e-5, atol=1e-7)
