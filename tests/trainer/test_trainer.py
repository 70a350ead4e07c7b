"""SSSTrainer behaviour: stopping, validation, unused parameters, settings, checkpoints."""

from __future__ import annotations

import copy
import json

import pytest
import torch
from torch import nn

from sss import SSSTrainer, TrainerConfig
from sss.callbacks.stock import add_stock_callbacks
from sss.checkpoint import complete_checkpoints
from sss.config import ConfigError
from sss.testing import BoringModule, boring_loader
from sss.trainer.trainer import resolve_precision

QUIET = {"log": {"progress": False, "trackers": []}, "mixed_precision": "no"}


def _params(module):
    return torch.cat([p.detach().flatten() for p in module.parameters()])


def test_max_steps_stops_mid_epoch_and_validates_at_the_end():
    trainer = add_stock_callbacks(SSSTrainer(max_steps=5, max_epochs=None, checkpoint={"every_epoch": False}, **QUIET))
    metrics = trainer.fit(BoringModule(), train_dataloaders=boring_loader(n=64), val_dataloaders=boring_loader(n=16))
    assert trainer.state.global_step == 5 and trainer.state.epoch == 0 and trainer.state.batch_idx == 4
    assert set(metrics) >= {"val/loss", "val/accuracy", "val/macro_f1", "val/micro_f1", "val/f1/1"}
    assert trainer.total_steps == 5


def test_max_epochs_and_val_every_n_epochs():
    seen = []

    class Spy(BoringModule):
        def compute_metrics(self, outputs):
            seen.append(trainer.state.epoch)  # the module has no trainer: read it from the test's
            return super().compute_metrics(outputs)

    trainer = add_stock_callbacks(
        SSSTrainer(max_epochs=5, val_every_n_epochs=2, checkpoint={"every_epoch": False}, **QUIET)
    )
    trainer.fit(Spy(), train_dataloaders=boring_loader(n=16), val_dataloaders=boring_loader(n=8))
    assert trainer.state.global_step == 10 and trainer.state.epoch == 5
    assert seen == [0, 1, 3, 4]  # the sanity pass before training, every 2nd epoch, and always the last


def test_training_learns_the_boring_task():
    module = BoringModule()
    trainer = add_stock_callbacks(
        SSSTrainer(
            max_epochs=12,
            checkpoint={"every_epoch": False},
            val_every_n_epochs=12,
            optim={"optimizer": {"_target_": "torch.optim.AdamW", "lr": 0.05}},
            **QUIET,
        )
    )
    metrics = trainer.fit(
        module, train_dataloaders=boring_loader(n=64, batch_size=16, shuffle=True), val_dataloaders=boring_loader(n=64)
    )
    assert metrics["val/accuracy"] >= 0.9


def test_parameter_without_gradient_is_named_at_the_first_step():
    class Unused(BoringModule):
        def __init__(self):
            super().__init__()
            self.spare = nn.Linear(2, 2)

    with pytest.raises(RuntimeError, match=r"spare\.weight, spare\.bias.*find_unused_parameters"):
        add_stock_callbacks(SSSTrainer(max_steps=2, checkpoint={"every_epoch": False}, **QUIET)).fit(
            Unused(), train_dataloaders=boring_loader()
        )
    trainer = add_stock_callbacks(
        SSSTrainer(max_steps=2, find_unused_parameters=True, checkpoint={"every_epoch": False}, **QUIET)
    )
    with pytest.warns(UserWarning, match="spare.weight"):
        trainer.fit(Unused(), train_dataloaders=boring_loader())
    assert trainer.state.global_step == 2


def test_clipping_records_the_pre_clip_norm_and_clips():
    norms = []

    class Watch(BoringModule):
        pass

    module = Watch()
    trainer = add_stock_callbacks(
        SSSTrainer(max_steps=1, max_grad_norm=1e-3, checkpoint={"every_epoch": False}, **QUIET)
    )
    from sss import Callback

    class After(Callback):
        def on_after_optimizer_step(self, trainer, module):
            norms.append(torch.norm(torch.stack([p.grad.norm() for p in module.parameters()])))

    trainer.callbacks.insert(0, After())
    trainer.fit(module, train_dataloaders=boring_loader())
    assert float(trainer.state.grad_norm) > 1e-2  # the norm before clipping
    assert float(norms[0]) == pytest.approx(1e-3, rel=1e-3)  # the gradient the optimizer used


def test_unknown_or_bad_settings_are_named():
    with pytest.raises(ConfigError, match="unknown setting 'max_step'"):
        add_stock_callbacks(SSSTrainer(max_step=3))
    with pytest.raises(ConfigError, match=r"trainer\.gradient_accumulation_steps must be >= 1"):
        add_stock_callbacks(SSSTrainer(gradient_accumulation_steps=0))
    with pytest.raises(ConfigError, match=r"trainer\.mixed_precision must be one of"):
        TrainerConfig(mixed_precision="fp8")


def test_auto_precision_resolution():
    assert resolve_precision("auto", torch.device("cpu")) == "no"
    assert resolve_precision("bf16", torch.device("cpu")) == "bf16"


def test_checkpoints_rotate_refuse_an_earlier_run_and_resume(tmp_path):
    out = str(tmp_path / "run")
    cfg = dict(max_epochs=4, output_dir=out, checkpoint={"every_n_steps": 3, "keep_last": 2}, **QUIET)
    start = BoringModule()
    straight = copy.deepcopy(start)
    trainer = add_stock_callbacks(SSSTrainer(**cfg))
    trainer.fit(straight, train_dataloaders=boring_loader(n=32, shuffle=True))
    kept = complete_checkpoints(tmp_path / "run" / "checkpoints")
    assert [p.name for p in kept] == ["step_0000015", "step_0000016"]  # 16 steps: every 3rd + epoch ends, last 2
    assert not list((tmp_path / "run" / "checkpoints").glob("*.tmp"))
    meta = json.loads((kept[-1] / "trainer_state.json").read_text())
    assert meta["global_step"] == 16 and meta["resume_epoch"] == 4 and meta["resume_batch"] == 0

    with pytest.raises(FileExistsError, match="already holds checkpoints"):
        add_stock_callbacks(SSSTrainer(**cfg)).fit(
            copy.deepcopy(start), train_dataloaders=boring_loader(n=32, shuffle=True)
        )

    # resume the epoch-end checkpoint after epoch 2 in a new run and finish: same weights
    first = add_stock_callbacks(SSSTrainer(**{**cfg, "max_epochs": 2, "output_dir": str(tmp_path / "half")}))
    first.fit(copy.deepcopy(start), train_dataloaders=boring_loader(n=32, shuffle=True))
    resumed = copy.deepcopy(start)
    second = add_stock_callbacks(SSSTrainer(**{**cfg, "output_dir": str(tmp_path / "half")}))
    second.fit(resumed, train_dataloaders=boring_loader(n=32, shuffle=True), ckpt_path=first.state.last_checkpoint)
    assert second.state.global_step == 16
    assert torch.equal(_params(resumed), _params(straight))


def test_buffers_that_view_a_longer_storage_still_checkpoint(tmp_path):
    # torch.hann_window (torchaudio's Spectrogram window) is a view of a longer storage, which
    # safetensors refuses; the trainer gives such buffers their own storage.
    module = BoringModule()
    module.register_buffer("window", torch.hann_window(400))
    assert module.window.untyped_storage().nbytes() > 400 * 4
    trainer = add_stock_callbacks(
        SSSTrainer(max_steps=2, output_dir=str(tmp_path / "w"), checkpoint={"every_n_steps": 1}, **QUIET)
    )
    trainer.fit(module, train_dataloaders=boring_loader())
    assert torch.equal(module.window, torch.hann_window(400))
    assert len(complete_checkpoints(tmp_path / "w" / "checkpoints")) == 2


def test_mid_epoch_resume_is_bitwise_equal_with_a_negative_control(tmp_path):
    # 5 steps per epoch, shuffled; checkpoints at steps 3, 6, 9, 12 fall mid-epoch and across epochs.
    quiet = {"log": {"progress": False, "trackers": []}, "mixed_precision": "no"}
    start = BoringModule()
    straight = copy.deepcopy(start)
    every3 = {"every_n_steps": 3, "keep_last": None, "every_epoch": False}
    add_stock_callbacks(SSSTrainer(max_epochs=3, output_dir=str(tmp_path / "a"), checkpoint=every3, **quiet)).fit(
        straight, train_dataloaders=boring_loader(n=40, batch_size=8, shuffle=True)
    )
    checkpoints = complete_checkpoints(tmp_path / "a" / "checkpoints")
    assert [p.name for p in checkpoints] == [f"step_{n:07d}" for n in (3, 6, 9, 12, 15)]
    for ckpt in (checkpoints[0], checkpoints[2]):
        resumed = copy.deepcopy(start)
        trainer = add_stock_callbacks(
            SSSTrainer(max_epochs=3, output_dir=str(tmp_path / ckpt.name), checkpoint={"every_epoch": False}, **quiet)
        )
        trainer.fit(resumed, train_dataloaders=boring_loader(n=40, batch_size=8, shuffle=True), ckpt_path=ckpt)
        assert trainer.state.global_step == 15
        assert torch.equal(_params(resumed), _params(straight)), ckpt.name

    # Negative control: the same resume with the data position forgotten replays the epoch from its start.
    resumed = copy.deepcopy(start)
    trainer = add_stock_callbacks(
        SSSTrainer(max_epochs=3, output_dir=str(tmp_path / "control"), checkpoint={"every_epoch": False}, **quiet)
    )
    meta = json.loads((checkpoints[0] / "trainer_state.json").read_text())
    meta["resume_batch"] = 0
    (checkpoints[0] / "trainer_state.json").write_text(json.dumps(meta))
    trainer.fit(resumed, train_dataloaders=boring_loader(n=40, batch_size=8, shuffle=True), ckpt_path=checkpoints[0])
    assert not torch.equal(_params(resumed), _params(straight))


def test_the_loop_stays_readable():
    # fit -> _train_epoch -> _train_step in one file of at most 650 lines, each at most 60; the
    # step and the optimizer step together under 50, which the Event docstring maps line for line.
    import inspect

    from sss.trainer import trainer as loop

    lines = {
        name: len(inspect.getsource(getattr(SSSTrainer, name)).splitlines())
        for name in ("fit", "_train_epoch", "_train_step", "_optimizer_step")
    }
    assert len(inspect.getsource(loop).splitlines()) <= 650
    assert max(lines["fit"], lines["_train_epoch"], lines["_train_step"]) <= 60, lines
    assert lines["_train_step"] + lines["_optimizer_step"] <= 50, lines
    assert "distributed_type" not in inspect.getsource(loop)


def test_a_step_skips_the_routers_module_call_only_where_it_would_only_call_forward():
    from accelerate import Accelerator
    from accelerate.state import AcceleratorState

    from sss.trainer.trainer import _StepRouter

    trainer = SSSTrainer(max_steps=2, **QUIET)
    trainer.fit(BoringModule(), train_dataloaders=boring_loader())
    assert trainer._train_call == trainer.model.forward  # one CPU process, fp32: nothing wraps or patches it
    router = _StepRouter(BoringModule())
    assert router.caller(nn.Sequential(router)) is not router.forward  # a wrapper (DDP, FSDP, compile) is called
    hooked = _StepRouter(BoringModule())
    hooked.register_forward_pre_hook(lambda module, args: None)
    assert hooked.caller(hooked) is hooked
    autocast = _StepRouter(BoringModule())
    AcceleratorState._reset_state(reset_partial_state=True)  # the fit above set fp32 for the process
    prepared = Accelerator(cpu=True, mixed_precision="bf16").prepare(autocast)  # patches forward with autocast
    assert prepared is autocast and "forward" in vars(autocast) and autocast.caller(prepared) is prepared
    batch = next(iter(boring_loader(batch_size=4)))
    assert prepared("training_step", batch, 0).dtype == torch.float32  # still a loss, through the patched call
