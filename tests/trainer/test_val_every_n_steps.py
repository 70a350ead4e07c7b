"""trainer.val_every_n_steps: validation mid-epoch, on a schedule that a resume lands on bit for bit."""

from __future__ import annotations

import pytest
import torch

from sss import SSSTrainer
from sss.callbacks.base import Callback
from sss.callbacks.stock import add_stock_callbacks
from sss.checkpoint import verify_checkpoint
from sss.config import ConfigError, TrainerConfig
from sss.testing import BoringModule, boring_loader

QUIET = {"log": {"progress": False, "trackers": []}, "mixed_precision": "no", "cpu": True, "seed": 3}
# 6 batches an epoch, 2 epochs, N=4: step passes at 4, 8, 12 and the epoch-end pass at 6; step 12 ends
# epoch 1, where the step pass and the epoch-end pass coincide and run once.
SCHEDULE = [4, 6, 8, 12]


class Noisy(BoringModule):
    """Draws from the global RNG in every training step, so the weights show any change of that stream."""

    def training_step(self, batch, batch_idx):
        return super().training_step(batch, batch_idx) * (1 + 0.1 * torch.rand(()))


class Record(Callback):
    """The steps validated at, and the model's mode at every BATCH_END."""

    def __init__(self) -> None:
        self.steps: list[int] = []
        self.training: list[bool] = []

    def on_validation_end(self, trainer, module):
        self.steps.append(trainer.state.global_step)

    def on_batch_end(self, trainer, module):
        self.training.append(module.training)


class Kill(Callback):
    """Fails the fit at BATCH_END of `step`, after the checkpoint callback saved it: a kill after that save."""

    def __init__(self, step: int) -> None:
        self.step = step

    def on_batch_end(self, trainer, module):
        if trainer.state.global_step == self.step:
            raise RuntimeError("killed")


def fit(tmp_path, name, *extra, ckpt_path=None, **settings):
    torch.manual_seed(0)
    module, record = Noisy(), Record()
    trainer = add_stock_callbacks(SSSTrainer(**{**QUIET, "output_dir": str(tmp_path / name), **settings}))
    trainer.callbacks += [record, *extra]
    loaders = {"train_dataloaders": boring_loader(n=48, shuffle=True), "val_dataloaders": boring_loader(n=16)}
    try:
        trainer.fit(module, **loaders, ckpt_path=ckpt_path)
    except RuntimeError as exc:
        assert str(exc) == "killed"
    return module, record


def params(module: torch.nn.Module) -> torch.Tensor:
    return torch.cat([p.detach().flatten() for p in module.parameters()])


def test_step_validations_keep_their_schedule_and_the_weights_across_a_kill_and_resume(tmp_path):
    settings = {"max_epochs": 2, "val_every_n_steps": 4, "checkpoint": {"every_n_steps": 4, "every_epoch": False}}
    straight, whole = fit(tmp_path, "a", **settings)
    assert whole.steps == SCHEDULE
    assert all(whole.training)  # every pass handed the model back in train mode
    _, first = fit(tmp_path, "b", Kill(8), **settings)  # killed mid-epoch 1, right after step 8's pass and save
    assert first.steps == [4, 6, 8]
    # the pass ran before BATCH_END, where the checkpoint was saved: keep_best ranks that checkpoint by it
    meta = verify_checkpoint(tmp_path / "b/checkpoints/step_0000008")
    mine = next(c["state"] for c in meta["callbacks"] if c["class"] == "ModelCheckpoint")
    assert mine["validated_step"] == meta["global_step"] == 8 and "val/loss" in meta["metrics"]
    resumed, rest = fit(tmp_path, "c", ckpt_path=tmp_path / "b/checkpoints/step_0000008", **settings)
    assert first.steps + rest.steps == whole.steps
    assert torch.equal(params(resumed), params(straight))
    # the passes left the training RNG stream as it was: the weights are those of a run without them
    plain, without = fit(tmp_path, "d", max_epochs=2, checkpoint={"every_epoch": False})
    assert without.steps == [6, 12]
    assert torch.equal(params(plain), params(straight))


@pytest.mark.parametrize("value", [0, -1, 2.5, "3"])
def test_val_every_n_steps_must_be_a_positive_integer(value):
    with pytest.raises(ConfigError, match=r"trainer.val_every_n_steps must be an integer >= 1 or null"):
        TrainerConfig(val_every_n_steps=value)
