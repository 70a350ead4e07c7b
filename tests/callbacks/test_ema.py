"""EMA weights: timm's formula, val_ema metrics, exact resume, export, float32 under bf16."""

from __future__ import annotations

import copy
import shutil
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file
from timm.utils.model_ema import ModelEmaV3

import sss
from sss.callbacks import EMA, Callback, ModelCheckpoint
from sss.callbacks.base import Event
from sss.callbacks.ema import EMA_WEIGHTS
from sss.cli import main
from sss.config import SSSConfig
from sss.run.export import export_checkpoint
from sss.testing import BoringDataModule, BoringModule, EventRecorder

QUIET = {"mixed_precision": "no", "log": {"progress": False, "trackers": []}}


class _Noisy(BoringModule):
    """Draws from the global RNG in every training step, so a pass that moved the RNG would change the training."""

    def compute_loss(self, outputs, batch):
        return super().compute_loss(outputs + 0.5 * torch.randn_like(outputs), batch)


class _Weights(Callback):
    """The module's weights at fit start and after every applied optimizer step; skips the window of `skip_at`."""

    def __init__(self, skip_at: int | None = None) -> None:
        self.skip_at, self.initial, self.after = skip_at, None, []

    def on_fit_start(self, trainer, module):
        self.initial = copy.deepcopy(module)

    def on_after_backward(self, trainer, module):
        trainer.state.skip_step = trainer.state.global_step + 1 == self.skip_at and not trainer.state.skipped_steps

    def on_after_optimizer_step(self, trainer, module):
        if not trainer.state.step_was_skipped:
            self.after.append((trainer.state.global_step, copy.deepcopy(module.state_dict())))


class _Seen(Callback):
    """What the callbacks after the EMA see at each validation end."""

    def __init__(self) -> None:
        self.passes: list[dict[str, float]] = []

    def on_validation_end(self, trainer, module):
        self.passes.append(dict(trainer.state.eval_metrics))


def _fit(callbacks, out: Path | None = None, ckpt: Path | None = None, module=None, **kw):
    if out is not None:
        kw["output_dir"] = str(out)
        callbacks = [*callbacks, ModelCheckpoint(every_epoch=True, keep_last=None, on_signal=False)]
    trainer = sss.SSSTrainer(**{"max_epochs": 2, **QUIET, **kw}, callbacks=callbacks)
    torch.manual_seed(0)  # the same initial weights in every run
    module = module if module is not None else _Noisy()
    trainer.fit(module, BoringDataModule(n_train=32, n_val=16), ckpt_path=ckpt)
    return trainer, module


def _equal(a: dict[str, torch.Tensor], b: dict[str, torch.Tensor]) -> bool:
    return a.keys() == b.keys() and all(torch.equal(a[k], b[k].to(a[k].device)) for k in a)


def test_the_average_is_timms_over_the_applied_steps():
    ema, weights = EMA(decay=0.8, warmup=True, warmup_power=2.0), _Weights(skip_at=3)
    trainer, module = _fit([ema, weights], max_epochs=None, max_steps=6)
    assert trainer.state.skipped_steps == 1 and [s for s, _ in weights.after] == [1, 2, 3, 4, 5, 6]
    assert ema.updates == 6

    def by_hand(decay: float) -> dict[str, torch.Tensor]:
        reference = ModelEmaV3(weights.initial, decay=decay, use_warmup=True, warmup_power=2.0)
        for step, state in weights.after:
            model = copy.deepcopy(weights.initial)
            model.load_state_dict(state)
            reference.update(model, step=step)
        return dict(reference.module.state_dict())

    assert _equal(ema.weights(), by_hand(0.8))
    assert not _equal(ema.weights(), by_hand(0.9))  # the comparison can tell decays apart
    assert not _equal(ema.weights(), module.state_dict())


def test_val_ema_is_reported_once_per_validation_and_leaves_the_training_alone():
    plain = _fit([])[1]
    ema, seen, events = EMA(decay=0.9), _Seen(), EventRecorder()
    trainer, module = _fit([ema, seen, events])
    metrics = trainer.state.metrics
    assert {"val_ema/loss", "val_ema/accuracy", "val/loss"} <= set(metrics)
    assert metrics["val_ema/loss"] != metrics["val/loss"]
    # one validation per epoch for the other callbacks, each with the EMA's figures beside the trained ones
    assert events.events.count(Event.VALIDATION_END) == 2 and len(seen.passes) == 2
    assert all({"val/loss", "val_ema/loss"} <= set(p) for p in seen.passes)
    assert not any(k.startswith("val_ema/") for k in trainer.state.eval_metrics)  # the end-of-fit evaluation's view
    # the trained weights are put back bit for bit and the RNG restored: the same training as without the EMA
    assert _equal(module.state_dict(), plain.state_dict())


def test_a_resumed_run_ends_with_the_uninterrupted_runs_weights_and_average(tmp_path):
    whole, whole_module = _fit([EMA(decay=0.7)], out=tmp_path / "a", max_epochs=3)
    first = tmp_path / "a" / "checkpoints" / "step_0000004"
    assert (first / EMA_WEIGHTS).is_file()
    (tmp_path / "b" / "checkpoints").mkdir(parents=True)
    shutil.copytree(first, tmp_path / "b" / "checkpoints" / first.name)
    ema = EMA(decay=0.7)
    resumed, module = _fit([ema], out=tmp_path / "b", ckpt=tmp_path / "b" / "checkpoints" / first.name, max_epochs=3)
    assert resumed.state.global_step == whole.state.global_step == 12
    assert _equal(module.state_dict(), whole_module.state_dict())
    whole_ema = next(c for c in whole.callbacks if isinstance(c, EMA))
    assert ema.updates == whole_ema.updates == 12
    assert _equal(ema.weights(), whole_ema.weights())
    last = load_file(str(tmp_path / "b" / "checkpoints" / "step_0000012" / EMA_WEIGHTS))
    assert _equal(last, ema.weights())


CONFIG = """\
name: boring
model: {_target_: sss.testing.BoringModule}
data: {_target_: sss.testing.BoringDataModule, n_train: 16, n_val: 8, batch_size: 8}
callbacks: [{_target_: sss.callbacks.EMA, decay: 0.9, export: true}]
trainer:
  output_dir: run
  max_epochs: 2
  log: {progress: false, trackers: [], plots: false}
"""


def test_export_holds_the_ema_weights_when_asked_and_the_trained_ones_when_not(capsys):
    Path("boring.yaml").write_text(CONFIG)
    assert main(["fit", "boring.yaml"]) == 0
    last = Path("run/checkpoints/step_0000004")
    ema, trained = load_file(str(last / EMA_WEIGHTS)), load_file(str(last / "model.safetensors"))
    trained = {k.removeprefix("module."): v for k, v in trained.items()}
    assert not _equal(ema, trained)
    assert _equal(load_file("run/model/model.safetensors"), ema)
    assert "- weights: ema (decay 0.9)" in Path("run/model/README.md").read_text()
    # sss export --ckpt with the stored config (export: true) writes the average too
    assert main(["export", "exported", "--ckpt", str(last)]) == 0
    assert _equal(load_file("exported/model.safetensors"), ema)
    plain = export_checkpoint(SSSConfig(name="boring", model={"_target_": "sss.testing.BoringModule"}), last, "raw")
    assert _equal(load_file(str(plain / "model.safetensors")), trained)
    assert "weights:" not in (plain / "README.md").read_text()


def test_the_average_stays_float32_under_bf16():
    ema = EMA(decay=0.9, eval=False)
    trainer, _ = _fit([ema], max_epochs=None, max_steps=2, mixed_precision="bf16", module=BoringModule())
    assert trainer.accelerator.mixed_precision == "bf16"
    assert all(v.dtype == torch.float32 for v in ema.weights().values())
    half = EMA(decay=0.9, eval=False)._new(BoringModule().to(torch.bfloat16))  # a module kept in bf16 itself
    assert all(v.dtype == torch.float32 for v in half.module.state_dict().values())


def test_bad_settings_are_named():
    with pytest.raises(ValueError, match="decay and min_decay must be in"):
        EMA(decay=1.5)
    with pytest.raises(ValueError, match="every_n_steps >= 1"):
        EMA(every_n_steps=0)


@pytest.mark.slow
def test_two_processes_average_like_one_process_with_the_double_batch(monkeypatch, capsys):
    # Data-parallel processes hold equal weights, so each one's own average equals the one-process average.
    monkeypatch.setenv("OMP_NUM_THREADS", "1")
    Path("boring.yaml").write_text(CONFIG)
    assert main(["fit", "boring.yaml", "data.batch_size=4", "--num-processes", "2"]) == 0
    assert main(["fit", "boring.yaml", "trainer.output_dir=one"]) == 0
    two, one = (load_file(f"{run}/checkpoints/step_0000004/{EMA_WEIGHTS}") for run in ("run", "one"))
    assert two.keys() == one.keys() and all(torch.allclose(two[k], one[k], atol=1e-6) for k in one)
    assert "val_ema/accuracy" in Path("run/results.json").read_text()
