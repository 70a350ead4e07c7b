"""Each Accelerate workaround of sss/trainer/_accelerate_compat.py: upstream still needs it, and our path is right.

A ``test_upstream_*`` test records the Accelerate (or torch) behaviour a workaround exists for. When
one fails, upstream changed: read the issue named in the workaround's docstring and delete the
workaround (and that test). The other tests check our path, and fail if the workaround is removed.
On a CPU Accelerate's fp16 does nothing, so loss scaling runs through a real
``torch.amp.GradScaler("cpu")`` switched into Accelerate's own machinery (as in test_fp16_skip.py).
"""

from __future__ import annotations

import math
import sys
from types import SimpleNamespace

import accelerate.optimizer
import accelerate.utils.imports
import pytest
import torch
from accelerate import Accelerator
from accelerate.optimizer import AcceleratedOptimizer
from accelerate.utils import DataLoaderConfiguration
from torch import nn

import sss.trainer._accelerate_compat as compat
from sss import SSSTrainer
from sss.testing import BoringModule, boring_loader

QUIET = {"log": {"progress": False, "trackers": []}, "checkpoint": {"every_epoch": False}, "mixed_precision": "no"}
SCALE = 2.0**4


def _fp16_cpu_accelerator(accumulation: int = 1) -> Accelerator:
    accelerator = Accelerator(
        cpu=True,
        mixed_precision="fp16",
        gradient_accumulation_steps=accumulation,
        dataloader_config=DataLoaderConfiguration(use_seedable_sampler=True),
    )
    accelerator.native_amp = True
    accelerator.scaler = torch.amp.GradScaler("cpu", init_scale=SCALE)
    return accelerator


def _prepared(accelerator: Accelerator, fused: bool = False) -> tuple[nn.Module, AcceleratedOptimizer]:
    torch.manual_seed(0)
    optimizer_class = torch.optim.AdamW if fused else torch.optim.SGD
    model = nn.Linear(4, 2)
    options = {"fused": True} if fused else {}
    return accelerator.prepare(model, optimizer_class(model.parameters(), lr=0.1, **options))


def _backward(accelerator: Accelerator, model: nn.Module, poison: bool = False) -> None:
    loss = model(torch.ones(3, 4)).float().pow(2).mean()
    accelerator.backward(loss * math.inf if poison else loss)


def _weights(model: nn.Module) -> list[torch.Tensor]:
    return [p.detach().clone() for p in model.parameters()]


# --- clip_grad_norm_ after the loop's unscale_gradients -------------------------------------------------


def test_upstream_clip_grad_norm_unscales_again_and_the_scaler_refuses():
    accelerator = _fp16_cpu_accelerator()
    model, _ = _prepared(accelerator)
    _backward(accelerator, model)
    accelerator.unscale_gradients()
    with pytest.raises(RuntimeError, match=r"unscale_\(\) has already been called"):
        accelerator.clip_grad_norm_(model.parameters(), 1.0)


def test_clip_grad_norm_after_unscaling_returns_the_true_norm_clips_and_restores_the_scaler():
    accelerator = _fp16_cpu_accelerator()
    model, _ = _prepared(accelerator)
    _backward(accelerator, model)
    accelerator.unscale_gradients()
    true_norm = torch.linalg.vector_norm(torch.stack([p.grad.norm() for p in model.parameters()]))
    norm = compat.clip_grad_norm_(accelerator, model.parameters(), 1e-3)
    assert float(norm) == pytest.approx(float(true_norm)) and float(true_norm) > 1e-2
    clipped = torch.linalg.vector_norm(torch.stack([p.grad.norm() for p in model.parameters()]))
    assert float(clipped) == pytest.approx(1e-3, rel=1e-4)
    assert accelerator.native_amp is True

    def failing():
        raise ValueError("boom")
        yield

    with pytest.raises(ValueError, match="boom"):
        compat.clip_grad_norm_(accelerator, failing(), 1.0)
    assert accelerator.native_amp is True, "an error left the scaler hidden"


# --- fused optimizers skip inside their kernel (accelerate#4242) ----------------------------------------


def test_upstream_fused_optimizer_skip_is_reported_as_a_step_taken():
    accelerator = _fp16_cpu_accelerator()
    model, optimizer = _prepared(accelerator, fused=True)
    before = _weights(model)
    _backward(accelerator, model, poison=True)
    optimizer.step()
    assert all(torch.equal(a, b) for a, b in zip(before, model.parameters(), strict=True)), "the kernel stepped"
    assert accelerator.optimizer_step_was_skipped is False  # accelerate#4242: fixed once this is True


def test_fused_skip_is_read_from_the_loss_scale_and_a_good_step_is_not():
    accelerator = _fp16_cpu_accelerator()
    model, optimizer = _prepared(accelerator, fused=True)
    _backward(accelerator, model, poison=True)
    scale = compat.fused_loss_scale(accelerator, optimizer)
    optimizer.step()
    assert scale == SCALE and compat.fused_step_skipped(accelerator, scale)
    optimizer.optimizer.zero_grad()
    before = _weights(model)
    _backward(accelerator, model)
    scale = compat.fused_loss_scale(accelerator, optimizer)
    optimizer.step()
    assert not compat.fused_step_skipped(accelerator, scale)
    assert any(not torch.equal(a, b) for a, b in zip(before, model.parameters(), strict=True))


def test_unfused_optimizers_pay_no_loss_scale_read():
    accelerator = _fp16_cpu_accelerator()
    _, optimizer = _prepared(accelerator, fused=False)
    assert compat.fused_loss_scale(accelerator, optimizer) is None
    assert not compat.fused_step_skipped(accelerator, None)


# --- a step the loop skips after unscaling --------------------------------------------------------------


def test_upstream_a_step_left_open_after_unscaling_refuses_the_next_unscale():
    accelerator = _fp16_cpu_accelerator()
    model, optimizer = _prepared(accelerator)
    _backward(accelerator, model, poison=True)
    accelerator.unscale_gradients()
    optimizer.optimizer.zero_grad()  # the loop discards the window: no optimizer.step()
    _backward(accelerator, model)
    with pytest.raises(RuntimeError, match=r"unscale_\(\) has already been called"):
        accelerator.unscale_gradients()


def test_end_skipped_step_closes_the_step_backs_off_and_the_next_one_runs():
    accelerator = _fp16_cpu_accelerator()
    model, optimizer = _prepared(accelerator)
    _backward(accelerator, model, poison=True)
    accelerator.unscale_gradients()
    compat.end_skipped_step(accelerator)
    assert accelerator.scaler.get_scale() == SCALE / 2  # backed off, as a scaler-skipped step does
    optimizer.optimizer.zero_grad()
    before = _weights(model)
    _backward(accelerator, model)
    accelerator.unscale_gradients()
    optimizer.step()
    assert not accelerator.optimizer_step_was_skipped
    assert any(not torch.equal(a, b) for a, b in zip(before, model.parameters(), strict=True))


def test_end_skipped_step_without_a_scaler_does_nothing():
    accelerator = Accelerator(cpu=True)
    compat.end_skipped_step(accelerator)
    assert accelerator.scaler is None


# --- AcceleratedOptimizer.zero_grad's per-call signature check --------------------------------------------


def _count_signature_calls(monkeypatch: pytest.MonkeyPatch) -> list[object]:
    import inspect

    calls: list[object] = []

    def signature(obj, *args, **kwargs):
        calls.append(obj)
        return inspect.signature(obj, *args, **kwargs)

    # Only accelerate.optimizer's own lookups are counted (it uses nothing else from inspect).
    monkeypatch.setattr(accelerate.optimizer, "inspect", SimpleNamespace(signature=signature))
    return calls


def test_upstream_zero_grad_inspects_the_signature_at_every_call(monkeypatch):
    calls = _count_signature_calls(monkeypatch)
    accelerator = Accelerator(cpu=True)
    _, optimizer = _prepared(accelerator)
    for _ in range(3):
        optimizer.zero_grad()
    assert len(calls) == 3


def test_zero_grad_calls_the_inner_optimizer_directly_and_keeps_an_override(monkeypatch):
    calls = _count_signature_calls(monkeypatch)
    accelerator = Accelerator(cpu=True)
    model, optimizer = _prepared(accelerator)
    _backward(accelerator, model)
    compat.zero_grad(optimizer)
    assert calls == [] and all(p.grad is None for p in model.parameters())

    class OwnZeroGrad(AcceleratedOptimizer):  # as DeepSpeed's wrapper overrides zero_grad
        def zero_grad(self, set_to_none=None):
            self.cleared = set_to_none

    own = OwnZeroGrad(torch.optim.SGD(model.parameters(), lr=0.1))
    compat.zero_grad(own)
    assert own.cleared is True


def test_fit_never_runs_the_signature_check(monkeypatch):
    calls = _count_signature_calls(monkeypatch)
    trainer = SSSTrainer(max_steps=3, **QUIET)
    trainer.fit(BoringModule(), train_dataloaders=boring_loader())
    assert trainer.state.global_step == 3 and calls == []


# --- an accumulation window closed before the loader ends (limit_train_batches) --------------------------


def _syncs(accelerator: Accelerator, loader, stop: int, close: bool) -> list[bool]:
    syncs = []
    for i, _ in enumerate(loader):
        if close and i == stop:
            compat.close_window_early(accelerator)
        with accelerator.accumulate():
            syncs.append(accelerator.sync_gradients)
        if i == stop:
            break
    return syncs


def test_upstream_accumulate_leaves_a_window_cut_before_the_loader_end_open():
    accelerator = Accelerator(cpu=True, gradient_accumulation_steps=2)
    loader = accelerator.prepare(torch.utils.data.DataLoader(range(10), batch_size=2))
    assert _syncs(accelerator, loader, stop=2, close=False) == [False, True, False]


def test_close_window_early_syncs_that_batch_and_the_next_window_is_full_length():
    # The trainer-level check is test_limits_and_oom.py::test_limit_train_batches_equals_training_on_...
    accelerator = Accelerator(cpu=True, gradient_accumulation_steps=2)
    loader = accelerator.prepare(torch.utils.data.DataLoader(range(10), batch_size=2))
    assert _syncs(accelerator, loader, stop=2, close=True) == [False, True, True]
    assert _syncs(accelerator, loader, stop=2, close=True) == [False, True, True]  # the next epoch alike
    accelerator = Accelerator(cpu=True, gradient_accumulation_steps=3)
    loader = accelerator.prepare(torch.utils.data.DataLoader(range(20), batch_size=2))
    assert _syncs(accelerator, loader, stop=3, close=True) == [False, False, True, True]
    assert _syncs(accelerator, loader, stop=3, close=True) == [False, False, True, True]


# --- the optional-package probe in AcceleratedOptimizer.step ---------------------------------------------


def test_upstream_optimizer_step_probes_for_lomo_at_every_step(monkeypatch):
    calls = []
    monkeypatch.setattr(accelerate.optimizer, "is_lomo_available", lambda: calls.append(1) or False)
    accelerator = Accelerator(cpu=True)
    model, optimizer = _prepared(accelerator)
    for _ in range(2):
        _backward(accelerator, model)
        optimizer.step()
    assert len(calls) >= 2
    assert not hasattr(accelerate.utils.imports.is_lomo_available, "cache_info"), "upstream caches it now"


def test_fit_never_probes_for_lomo_and_leaves_the_probe_as_it_is(monkeypatch):
    calls = []

    def probe() -> bool:
        calls.append(1)
        return False

    monkeypatch.setattr(accelerate.optimizer, "is_lomo_available", probe)
    trainer = SSSTrainer(max_steps=3, **QUIET)
    trainer.fit(BoringModule(), train_dataloaders=boring_loader())
    assert trainer.state.global_step == 3 and calls == []
    assert accelerate.optimizer.is_lomo_available is probe  # not wrapped: see test_no_accelerate_patch.py


# --- the division of the loss by an accumulation count of 1 in Accelerator.backward -------------------


def _divisions(monkeypatch) -> list:
    """Records every ``tensor / x`` from now on (the divisor), passing the division through."""
    seen, divide = [], torch.Tensor.__truediv__

    def recording(self, other):
        seen.append(other)
        return divide(self, other)

    monkeypatch.setattr(torch.Tensor, "__truediv__", recording)
    return seen


def test_upstream_backward_divides_the_loss_by_an_accumulation_count_of_1(monkeypatch):
    accelerator, weight = Accelerator(cpu=True), torch.ones(2, requires_grad=True)
    loss = (weight * 3).sum()
    seen = _divisions(monkeypatch)
    accelerator.backward(loss)
    assert seen == [1]  # the extra division (and DivBackward0 node) that backward_without_unit_division skips


def test_backward_skips_only_the_unit_division(monkeypatch):
    from accelerate.state import AcceleratorState, GradientState

    makers = [
        lambda: Accelerator(cpu=True),
        lambda: Accelerator(cpu=True, gradient_accumulation_steps=2),
        _fp16_cpu_accelerator,
    ]
    seen = _divisions(monkeypatch)
    for make in makers:  # one at a time: Accelerate's process-wide state takes one precision
        accelerator = make()
        compat.backward_without_unit_division(accelerator)
        weight = torch.ones(2, requires_grad=True)
        accelerator.backward((weight * 3).sum())
        assert weight.grad is not None
        AcceleratorState._reset_state(reset_partial_state=True)
        GradientState._reset_state()
    assert seen == [2, 1]  # plain: none; accumulation 2 and the fp16 path still go through Accelerate


def test_training_without_the_unit_division_is_bitwise_the_same(monkeypatch):
    def train() -> tuple[list[torch.Tensor], bool]:
        torch.manual_seed(0)
        module = BoringModule()
        optim = {"optimizer": {"_target_": "torch.optim.AdamW", "lr": 0.05}}
        trainer = SSSTrainer(max_steps=4, optim=optim, **QUIET)
        trainer.fit(module, train_dataloaders=boring_loader(n=32, batch_size=4))
        return [p.detach().clone() for p in module.parameters()], "backward" in vars(trainer.accelerator)

    ours, installed = train()
    monkeypatch.setattr(compat, "backward_without_unit_division", lambda accelerator: None)
    upstream, off = train()
    assert installed and not off
    assert all(torch.equal(a, b) for a, b in zip(ours, upstream, strict=True))


# --- AcceleratedOptimizer.step's per-call probes -----------------------------------------------------------


def _env_reads(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """Records the names of Accelerate's flag reads from the environment (what the XLA probe does per call)."""
    import accelerate.state

    seen, parse = [], accelerate.state.parse_flag_from_env
    monkeypatch.setattr(
        accelerate.state, "parse_flag_from_env", lambda key, *a, **k: seen.append(key) or parse(key, *a, **k)
    )
    return seen


def test_upstream_optimizer_step_reads_the_environment_at_every_step(monkeypatch):
    seen = _env_reads(monkeypatch)
    accelerator = Accelerator(cpu=True)
    model, optimizer = _prepared(accelerator)
    for _ in range(3):
        _backward(accelerator, model)
        optimizer.step()
    assert seen.count("ACCELERATE_USE_FSDP") == 3  # via GradientState.is_xla_gradients_synced


def test_optimizer_step_calls_the_inner_step_and_updates_as_upstream_does(monkeypatch):
    seen = _env_reads(monkeypatch)
    ours, theirs = (_prepared(Accelerator(cpu=True)) for _ in range(2))
    for _ in range(3):
        for (model, optimizer), step in ((ours, compat.optimizer_step), (theirs, type(theirs[1]).step)):
            _backward(Accelerator(cpu=True), model)
            step(optimizer)
            optimizer.optimizer.zero_grad()
    assert all(torch.equal(a, b) for a, b in zip(ours[0].parameters(), theirs[0].parameters(), strict=True))
    assert seen.count("ACCELERATE_USE_FSDP") == 3  # the 3 upstream steps only: ours read nothing
    assert not Accelerator(cpu=True).optimizer_step_was_skipped


def _counting_upstream_step(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    calls, step = [], AcceleratedOptimizer.step
    monkeypatch.setattr(AcceleratedOptimizer, "step", lambda self, *a, **k: calls.append(1) or step(self, *a, **k))
    return calls


def test_optimizer_step_leaves_a_scaler_a_subclass_an_open_window_and_lomo_to_upstream(monkeypatch):
    accelerator = _fp16_cpu_accelerator()
    model, optimizer = _prepared(accelerator)
    calls = _counting_upstream_step(monkeypatch)
    _backward(accelerator, model, poison=True)
    compat.optimizer_step(optimizer)  # fp16: the scaler's step, which finds the inf and skips
    assert calls == [1] and accelerator.optimizer_step_was_skipped

    class Own(AcceleratedOptimizer):  # as DeepSpeed's wrapper is a subclass with its own step
        pass

    own = Own(torch.optim.SGD(nn.Linear(1, 1).parameters(), lr=0.1))
    compat.optimizer_step(own)
    assert calls == [1, 1]
    plain = Accelerator(cpu=True, gradient_accumulation_steps=2)
    _, optimizer = _prepared(plain)
    plain.gradient_state._set_sync_gradients(False)  # inside an accumulation window: upstream does nothing
    compat.optimizer_step(optimizer)
    assert calls == [1, 1, 1]
    plain.gradient_state._set_sync_gradients(True)
    monkeypatch.setattr(accelerate.optimizer, "is_lomo_available", lambda: True)
    compat.optimizer_step(optimizer)  # LOMO installed but never imported: no optimizer can be one of its
    assert calls == [1, 1, 1]
    lomo = SimpleNamespace(Lomo=type("Lomo", (), {}), AdaLomo=type("AdaLomo", (), {}))
    monkeypatch.setitem(sys.modules, "lomo_optim", lomo)  # what upstream's step imports when LOMO is installed
    compat.optimizer_step(optimizer)  # LOMO installed: upstream decides whether the step is a no-op
    assert calls == [1, 1, 1, 1]


def test_fit_never_runs_upstreams_optimizer_step_without_a_scaler(monkeypatch):
    calls = _counting_upstream_step(monkeypatch)
    trainer = SSSTrainer(max_steps=3, **QUIET)
    trainer.fit(BoringModule(), train_dataloaders=boring_loader())
    assert trainer.state.global_step == 3 and calls == []


def _stream_loader(batch: int = 2) -> torch.utils.data.DataLoader:
    from sss.data.records import Record, Shard, Source
    from sss.data.stream import StreamDataset

    class Rows(Source):
        def read(self, shard, start=0, stop=None):
            for row in range(start, 6 if stop is None else stop):
                yield Record("s.tar", row, str(row), target=shard * 6 + row)

    source = Rows("rows", [Shard("a", 6), Shard("b", 6)], ["x"], ())
    stream = StreamDataset(source, lambda record, index: {"index": index}, batch_size=batch, shuffle=False)
    return torch.utils.data.DataLoader(stream, batch_size=batch)


def test_upstream_prepare_splits_an_iterable_dataset_again_and_drops_batches():
    from accelerate.data_loader import prepare_data_loader

    # What Accelerate does on process 0 of 2 (dispatch off): one batch in two of a stream already split.
    loader = prepare_data_loader(_stream_loader(), num_processes=2, process_index=0, dispatch_batches=False)
    assert type(loader.dataset).__name__ == "IterableDatasetShard"
    assert [b["index"].tolist() for b in loader] == [[0, 1], [4, 5], [8, 9]]


def test_prepare_loader_leaves_a_stream_whole_and_places_it_on_the_device():
    loader = compat.prepare_loader(Accelerator(cpu=True), _stream_loader())
    assert type(loader).__name__ == "DataLoaderShard" and type(loader.dataset).__name__ == "StreamDataset"
    assert [i for b in loader for i in b["index"].tolist()] == list(range(12))
    loader.dataset.start_at(4)
    assert [b["index"].tolist() for b in compat.loader_from(Accelerator(cpu=True), loader, 4)] == [[8, 9], [10, 11]]
