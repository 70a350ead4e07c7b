"""On a CUDA GPU: the real GradScaler, bf16 by ``auto``, fused AdamW skips, checkpointing memory, channels-last,
``torch.compile``, and no host sync in a training step. Skipped without CUDA (tests/gpu/conftest.py).

They mirror the CPU tests of the same behaviour (tests/trainer/test_fp16_skip.py,
tests/trainer/test_accelerate_compat.py, tests/models/test_grad_checkpointing_config.py), with
the device's own machinery in place of the CPU stand-ins. ``benchmarks/gpu.py`` runs them first.
"""

from __future__ import annotations

import math

import pytest
import torch
from accelerate import Accelerator
from accelerate.utils import DataLoaderConfiguration, GradScalerKwargs
from torch.utils.data import DataLoader

from sss import Callback, SSSTrainer
from sss.models import create_model
from sss.testing import BoringModule, boring_loader

QUIET = {"log": {"progress": False, "trackers": []}, "checkpoint": {"every_epoch": False}}
FAST = {"optimizer": {"_target_": "torch.optim.AdamW", "lr": 0.05}}  # a loss that visibly falls in 20-30 steps


def _hunter_loader(n: int = 16, batch_size: int = 8) -> DataLoader:
    g = torch.Generator().manual_seed(0)
    items = [
        {
            "image": torch.randn(3, 64, 64, generator=g),
            "audio": torch.randn(1, 16000, generator=g) * 0.1,
            "label": i % 4,
        }
        for i in range(n)
    ]
    return DataLoader(items, batch_size=batch_size)


class Watch(Callback):
    """Per optimizer step: skipped?, parameters moved?, global step, skipped steps, LR; and each loss."""

    def __init__(self):
        self.rows, self.losses, self.before = [], [], None

    def on_after_backward(self, trainer, module):
        self.before = [p.detach().clone() for p in module.parameters()]

    def on_after_optimizer_step(self, trainer, module):
        moved = any(not torch.equal(a, p) for a, p in zip(self.before, module.parameters(), strict=True))
        s = trainer.state
        self.rows.append((s.step_was_skipped, moved, s.global_step, s.skipped_steps, s.lr))

    def on_batch_end(self, trainer, module):
        self.losses.append(float(trainer.state.loss))


def _poison_second_window(module: BoringModule) -> None:
    calls = {"n": 0}

    def hook(grad):
        calls["n"] += 1
        return grad * math.inf if calls["n"] == 2 else grad

    module.fusion_head.head.weight.register_hook(hook)


def _fp16_accelerator() -> Accelerator:
    # A small initial scale: the first steps of the tiny model never overflow by themselves.
    return Accelerator(
        mixed_precision="fp16",
        kwargs_handlers=[GradScalerKwargs(init_scale=2.0**4)],
        dataloader_config=DataLoaderConfiguration(use_seedable_sampler=True),
    )


@pytest.mark.parametrize("fused", [False, True])
def test_fp16_real_scaler_skips_an_inf_step_without_moving_step_or_lr(fused):
    module, watch = BoringModule(), Watch()
    _poison_second_window(module)
    accelerator = _fp16_accelerator()
    assert isinstance(accelerator.scaler, torch.amp.GradScaler) and accelerator.device.type == "cuda"
    optimizer = (
        {"_target_": "torch.optim.AdamW", "lr": 0.1, "fused": True}
        if fused
        else {"_target_": "torch.optim.SGD", "lr": 0.1}
    )
    sched = {"_target_": "torch.optim.lr_scheduler.StepLR", "step_size": 1, "gamma": 0.5}
    trainer = SSSTrainer(
        accelerator=accelerator,
        callbacks=[watch],
        max_steps=3,
        mixed_precision="fp16",
        max_grad_norm=None,
        optim={"optimizer": optimizer, "scheduler": sched},
        **QUIET,
    )
    trainer.fit(module, train_dataloaders=boring_loader(n=64, batch_size=4))
    assert [r[0] for r in watch.rows] == [False, True, False, False]
    skipped = watch.rows[1]
    assert skipped[1] is False, "a skipped step changed the parameters"
    assert skipped[2:4] == (1, 1) and skipped[4] == pytest.approx(0.1 * 0.5), "the skipped step moved step or LR"
    assert trainer.state.global_step == 3 and trainer.state.skipped_steps == 1
    assert accelerator.scaler.get_scale() == 2.0**3  # backed off once


def test_auto_chooses_bf16_and_trains():
    if not torch.cuda.is_bf16_supported():
        pytest.skip("this GPU has no bf16: auto picks fp16 (tested above)")
    module, watch, dtypes = BoringModule(), Watch(), []
    module.fusion_head.head.register_forward_hook(lambda mod, inp, out: dtypes.append(out.dtype))
    trainer = SSSTrainer(
        callbacks=[watch], max_steps=30, overfit_batches=1, mixed_precision="auto", optim=FAST, **QUIET
    )
    assert trainer.accelerator.mixed_precision == "bf16"
    trainer.fit(module, train_dataloaders=boring_loader(n=8, batch_size=8))
    assert dtypes and all(d == torch.bfloat16 for d in dtypes)
    assert watch.losses[-1] < watch.losses[0] * 0.7


def test_gradient_checkpointing_lowers_peak_cuda_memory():
    torch.manual_seed(0)
    model = create_model("hunter_small", num_classes=4).cuda().train()
    batch = {k: v.cuda() for k, v in next(iter(_hunter_loader(32, 32))).items()}

    def peak(enabled: bool) -> int:
        model.set_grad_checkpointing(enabled)
        model.zero_grad(set_to_none=False)  # gradients exist before the measured step in both cases
        model.training_step(batch, 0).backward()
        torch.cuda.synchronize()
        torch.cuda.reset_peak_memory_stats()
        base = torch.cuda.memory_allocated()
        model.training_step(batch, 0).backward()
        torch.cuda.synchronize()
        return torch.cuda.max_memory_allocated() - base

    off, on = peak(False), peak(True)
    assert on < off * 0.9, f"checkpointing peak {on} B is not below {off} B by 10%"


def test_channels_last_is_in_effect_and_the_log_mel_stays_on_the_gpu():
    module = create_model("hunter_tiny", num_classes=4, image_channels_last=True)
    conv = next(m for m in module.image_encoder.modules() if isinstance(m, torch.nn.Conv2d))
    formats, mel_devices = [], []
    conv.register_forward_pre_hook(
        lambda mod, inp: formats.append(inp[0].is_contiguous(memory_format=torch.channels_last))
    )
    module.audio_encoder.frontend.register_forward_hook(lambda mod, inp, out: mel_devices.append(out.device.type))
    trainer = SSSTrainer(max_steps=2, mixed_precision="bf16", **QUIET)
    trainer.fit(module, train_dataloaders=_hunter_loader())
    assert formats and all(formats), "the first conv saw a contiguous (NCHW) input"
    assert conv.weight.is_contiguous(memory_format=torch.channels_last)
    assert mel_devices and set(mel_devices) == {"cuda"}


def test_compile_on_cuda_trains():
    watch = Watch()
    trainer = SSSTrainer(callbacks=[watch], max_steps=20, overfit_batches=1, compile=True, optim=FAST, **QUIET)
    trainer.fit(BoringModule(), train_dataloaders=boring_loader(n=8, batch_size=8))
    assert trainer.state.global_step == 20 and watch.losses[-1] < watch.losses[0] * 0.7


class SyncsAreErrors(Callback):
    """From the third batch on, CUDA's sync debug mode turns any host sync inside a step into an error."""

    def __init__(self):
        self.checked = 0

    def on_batch_start(self, trainer, module):
        if trainer.state.batch_idx >= 2:  # the first steps run one-off checks (the batch contract, gradients)
            torch.cuda.set_sync_debug_mode("error")

    def on_batch_end(self, trainer, module):
        if torch.cuda.get_sync_debug_mode() != 0:
            torch.cuda.set_sync_debug_mode("default")
            self.checked += 1

    def on_exception(self, trainer, module):
        torch.cuda.set_sync_debug_mode("default")


def test_a_training_step_of_the_default_model_does_not_sync():
    guard = SyncsAreErrors()
    module = create_model("hunter_small", num_classes=4)  # the model of examples/industrial.yaml
    trainer = SSSTrainer(callbacks=[guard], max_steps=6, mixed_precision="bf16", **QUIET)
    trainer.fit(module, train_dataloaders=_hunter_loader(48, 8))
    assert guard.checked == 4
