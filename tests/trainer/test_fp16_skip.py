"""fp16 on the CPU with a real GradScaler and real fp16 autocast: a skipped step is not a step."""

from __future__ import annotations

import math

import pytest
import torch
from accelerate import Accelerator
from accelerate.utils import DataLoaderConfiguration

from sss import Callback, SSSTrainer
from sss.testing import BoringModule, boring_loader

QUIET = {"log": {"progress": False, "trackers": []}, "checkpoint": {"every_epoch": False}}


class ParamWatch(Callback):
    """Records, at each optimizer step, whether it was skipped and whether the parameters moved."""

    def __init__(self):
        self.before = None
        self.rows = []

    def on_after_backward(self, trainer, module):
        self.before = [p.detach().clone() for p in module.parameters()]
        self.grads_finite = all(torch.isfinite(p.grad).all() for p in module.parameters())

    def on_after_optimizer_step(self, trainer, module):
        moved = any(not torch.equal(a, p) for a, p in zip(self.before, module.parameters(), strict=True))
        s = trainer.state
        self.rows.append((s.step_was_skipped, moved, s.global_step, s.skipped_steps, s.lr, self.grads_finite))


def _fp16_cpu_accelerator(init_scale: float, accumulation: int) -> Accelerator:
    # Accelerate leaves fp16 off on a CPU; switch on its own machinery (autocast on the prepared
    # forward, GradScaler in backward/step/unscale) with a real CPU GradScaler.
    accelerator = Accelerator(
        cpu=True,
        mixed_precision="fp16",
        gradient_accumulation_steps=accumulation,
        dataloader_config=DataLoaderConfiguration(use_seedable_sampler=True),
    )
    accelerator.native_amp = True
    accelerator.scaler = torch.amp.GradScaler("cpu", init_scale=init_scale)
    return accelerator


@pytest.mark.parametrize("accumulation", [1, 2])
def test_skipped_fp16_step_leaves_step_and_lr(accumulation):
    module = BoringModule()
    dtypes = []
    module.fusion_head.head.register_forward_hook(lambda mod, inp, out: dtypes.append(out.dtype))
    calls = {"n": 0}

    def poison_second_window(grad):
        calls["n"] += 1
        return grad * math.inf if calls["n"] == 2 * accumulation else grad

    module.fusion_head.head.weight.register_hook(poison_second_window)
    watch = ParamWatch()
    accelerator = _fp16_cpu_accelerator(init_scale=2.0**4, accumulation=accumulation)
    sched = {"_target_": "torch.optim.lr_scheduler.StepLR", "step_size": 1, "gamma": 0.5}
    trainer = SSSTrainer(
        accelerator=accelerator,
        callbacks=[watch],
        max_steps=4,
        gradient_accumulation_steps=accumulation,
        optim={"optimizer": {"_target_": "torch.optim.SGD", "lr": 0.1}, "scheduler": sched},
        **QUIET,
    )
    trainer.fit(module, train_dataloaders=boring_loader(n=64, batch_size=4))

    assert dtypes and all(d == torch.float16 for d in dtypes), "the forward did not run under fp16 autocast"
    assert [r[0] for r in watch.rows] == [False, True, False, False, False]
    skipped = watch.rows[1]
    assert skipped[1] is False, "a skipped step changed the parameters"
    assert skipped[2] == 1 and skipped[3] == 1, "a skipped step advanced global_step"
    assert skipped[4] == pytest.approx(0.1 * 0.5), "a skipped step advanced the LR schedule"
    assert trainer.state.global_step == 4 and trainer.state.skipped_steps == 1
    assert trainer.optimizer.param_groups[0]["lr"] == pytest.approx(0.1 * 0.5**4)
    assert trainer.scheduler.last_epoch == 4
    assert accelerator.scaler.get_scale() == 2.0**3  # the scaler backed off once
    # unscaled before AFTER_BACKWARD: finite grads at every applied step are at true scale
    assert all(r[5] for r in watch.rows if not r[0])


def test_given_accelerator_must_agree_on_accumulation():
    with pytest.raises(ValueError, match="gradient_accumulation_steps"):
        SSSTrainer(accelerator=Accelerator(cpu=True), gradient_accumulation_steps=2, **QUIET)


class SkipSecondWindow(Callback):
    """A callback that discards the second window's gradients, as a NaN-loss policy would."""

    def __init__(self):
        self.windows = 0

    def on_after_backward(self, trainer, module):
        self.windows += 1
        trainer.state.skip_step = self.windows == 2


@pytest.mark.parametrize("fp16", [False, True])
def test_callback_can_discard_a_window(fp16):
    watch, skipper = ParamWatch(), SkipSecondWindow()
    accelerator = _fp16_cpu_accelerator(init_scale=2.0**4, accumulation=1) if fp16 else None
    trainer = SSSTrainer(
        accelerator=accelerator,
        callbacks=[skipper, watch],
        max_steps=3,
        optim={"optimizer": {"_target_": "torch.optim.AdamW", "lr": 0.1}},
        **QUIET,
    )
    trainer.fit(BoringModule(), train_dataloaders=boring_loader(n=64, batch_size=4))
    assert [r[0] for r in watch.rows] == [False, True, False, False]
    assert watch.rows[1][1] is False, "a discarded window changed the parameters (AdamW would move them on zero grads)"
    assert trainer.state.global_step == 3 and trainer.state.skipped_steps == 1
    assert trainer.state.skip_step is False
    if fp16:  # the scaler's per-step record was closed: the next steps unscaled and stepped normally
        assert all(r[1] for i, r in enumerate(watch.rows) if i != 1)


def test_fused_optimizer_skip_is_a_skipped_step():
    # A fused AdamW skips inside its kernel and Accelerate reports a step taken (accelerate#4242);
    # the trainer reads the loss scale backing off instead.
    module = BoringModule()
    calls = {"n": 0}

    def poison_second(grad):
        calls["n"] += 1
        return grad * math.inf if calls["n"] == 2 else grad

    module.fusion_head.head.weight.register_hook(poison_second)
    accelerator = _fp16_cpu_accelerator(init_scale=2.0**4, accumulation=1)
    sched = {"_target_": "torch.optim.lr_scheduler.StepLR", "step_size": 1, "gamma": 0.5}
    optim = {"optimizer": {"_target_": "torch.optim.AdamW", "lr": 0.01, "fused": True}, "scheduler": sched}
    trainer = SSSTrainer(accelerator=accelerator, max_steps=3, optim=optim, **QUIET)
    trainer.fit(module, train_dataloaders=boring_loader(n=64, batch_size=4))
    assert trainer.state.global_step == 3 and trainer.state.skipped_steps == 1
    assert trainer.scheduler.last_epoch == 3  # the skipped step did not advance the schedule
