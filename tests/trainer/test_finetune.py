"""trainer.finetune: frozen parameters stay out of the optimizer and unchanged, join it at the window of
unfreeze_at_step, and a resume before, at or after that step is bitwise the straight run (Lightning #21901)."""

from __future__ import annotations

import json
import shutil

import pytest
import torch
from torch import nn

from sss import Callback, SSSTrainer
from sss.callbacks.stock import add_stock_callbacks
from sss.checkpoint import MARKER
from sss.config import ConfigError, FinetuneConfig
from sss.testing import BoringModule, boring_loader
from sss.trainer.finetune import Finetuning

QUIET = {"log": {"progress": False, "trackers": []}, "mixed_precision": "no"}
SCHEDULE = {
    "optimizer": {"_target_": "torch.optim.AdamW", "lr": 0.05, "weight_decay": 0.1},
    "scheduler": {"_target_": "sss.trainer.cosine_with_warmup", "warmup_steps": 2},
    "layer_decay": 0.5,
    "head_lr_scale": 2.0,
}


class NormModule(BoringModule):
    """BoringModule whose audio encoder has BatchNorm: one affine, one without parameters."""

    def __init__(self) -> None:
        super().__init__()
        self.audio_encoder = nn.Sequential(
            nn.Flatten(), nn.Linear(16, 8), nn.BatchNorm1d(8), nn.BatchNorm1d(8, affine=False)
        )


def _audio(module: nn.Module) -> dict[str, torch.Tensor]:
    return {k: v.detach().clone() for k, v in module.audio_encoder.state_dict().items()}


def _trainer(tmp_path, **overrides) -> SSSTrainer:
    settings = {**QUIET, "max_steps": 8, "output_dir": str(tmp_path), "checkpoint": {"every_epoch": False}}
    return add_stock_callbacks(SSSTrainer(**{**settings, **overrides}))


def test_frozen_for_the_whole_run_nothing_of_it_changes_and_the_optimizer_never_holds_it(tmp_path):
    module = NormModule()
    before = _audio(module)
    trainer = _trainer(tmp_path, finetune={"freeze": ["audio_encoder"]})
    trainer.fit(module, train_dataloaders=boring_loader())
    after = _audio(module)
    assert sorted(after) == sorted(before)
    for key in before:  # weights, running statistics and counters of both norms: as loaded
        assert torch.equal(after[key], before[key]), key
    held = {id(p) for p in module.audio_encoder.parameters()}
    in_optimizer = [id(p) for g in trainer.optimizer.param_groups for p in g["params"]]
    assert held.isdisjoint(in_optimizer) and held.isdisjoint(id(p) for p in trainer.optimizer.state)
    assert not any(p.requires_grad for p in module.audio_encoder.parameters())
    assert not torch.equal(module.fusion_head.head.weight, BoringModule().fusion_head.head.weight)


def test_train_bn_true_updates_the_running_statistics_of_frozen_norms(tmp_path):
    module = NormModule()
    before = _audio(module)
    _trainer(tmp_path, finetune={"freeze": ["audio_encoder"], "train_bn": True}).fit(
        module, train_dataloaders=boring_loader()
    )
    after = _audio(module)
    assert not torch.equal(after["2.running_mean"], before["2.running_mean"])
    assert torch.equal(after["2.weight"], before["2.weight"])  # the affine parameters stay frozen


class _Watch(Callback):
    """Per micro-batch: the step, micro-step and whether the audio encoder trains; per step: its weight."""

    def __init__(self) -> None:
        self.seen: list[tuple[int, int, bool]] = []
        self.weights: list[torch.Tensor] = []

    def on_batch_start(self, trainer, module) -> None:
        trainable = module.audio_encoder[1].weight.requires_grad
        self.seen.append((trainer.state.global_step, trainer.state.micro_step, trainable))

    def on_after_optimizer_step(self, trainer, module) -> None:
        self.weights.append(module.audio_encoder[1].weight.detach().clone())


def test_unfreeze_at_step_joins_at_the_start_of_that_steps_window(tmp_path):
    module, watch = BoringModule(), _Watch()
    initial = module.audio_encoder[1].weight.detach().clone()
    trainer = _trainer(
        tmp_path,
        max_steps=6,
        gradient_accumulation_steps=2,
        finetune={"freeze": ["audio_encoder"], "unfreeze_at_step": 3, "unfrozen_lr_scale": 0.5},
    )
    trainer.callbacks.append(watch)
    trainer.fit(module, train_dataloaders=boring_loader())
    # every micro-batch of the windows of steps 0..2 saw it frozen, every one of steps 3.. trainable
    assert [t for s, _, t in watch.seen] == [s >= 3 for s, _, _ in watch.seen]
    assert [m for _, m, _ in watch.seen] == [0, 1] * 6
    assert all(torch.equal(w, initial) for w in watch.weights[:3])
    assert not torch.equal(watch.weights[3], initial)
    held = trainer.optimizer.param_groups[-1]
    assert held["name"] == "frozen" and held["lr"] == pytest.approx(0.5 * trainer.optimizer.param_groups[0]["lr"])


def test_frozen_norms_train_again_from_the_unfreeze_step(tmp_path):
    module = NormModule()
    before = _audio(module)
    trainer = _trainer(tmp_path, max_steps=3, finetune={"freeze": ["audio_encoder"], "unfreeze_at_step": 1})
    trainer.fit(module, train_dataloaders=boring_loader())  # 8 batches: the unfreeze and the end in one epoch
    after = _audio(module)
    for key in ("2.running_mean", "3.running_mean", "1.weight"):
        assert not torch.equal(after[key], before[key]), key


def _state(trainer: SSSTrainer) -> dict[str, torch.Tensor]:
    flat = {f"model.{k}": v for k, v in trainer.module.state_dict().items()}
    optimizer = trainer.optimizer.state_dict()
    for i, state in optimizer["state"].items():
        flat.update({f"optim.{i}.{k}": torch.as_tensor(v) for k, v in state.items()})
    for i, group in enumerate(optimizer["param_groups"]):
        flat[f"group.{i}.params"] = torch.tensor(group["params"])
        flat[f"group.{i}.lr"] = torch.tensor(group["lr"], dtype=torch.float64)
    flat["step"] = torch.tensor(trainer.state.global_step)
    return flat


def _fit(tmp_path, ckpt=None) -> SSSTrainer:
    trainer = _trainer(
        tmp_path,
        optim=SCHEDULE,
        gradient_accumulation_steps=2,
        checkpoint={"every_n_steps": 1, "every_epoch": False, "keep_last": None},
        finetune={"freeze": ["audio_encoder", "image_encoder.1.weight"], "unfreeze_at_step": 4},
    )
    trainer.fit(BoringModule(), train_dataloaders=boring_loader(shuffle=True), ckpt_path=ckpt)
    return trainer


@pytest.fixture(scope="module")
def straight(tmp_path_factory):
    folder = tmp_path_factory.mktemp("straight")
    return folder, _state(_fit(folder))


@pytest.mark.parametrize("stop", [3, 4, 5])  # before, at and after unfreeze_at_step=4
def test_resume_before_at_and_after_the_unfreeze_is_bitwise_the_straight_run(stop, straight, tmp_path):
    folder, expected = straight
    ckpt = folder / "checkpoints" / f"step_{stop:07d}"
    meta = json.loads((ckpt / MARKER).read_text())
    assert meta["finetune"] == {"frozen": 3, "released": stop > 4}  # recorded: a function of the step
    got = _state(_fit(tmp_path, ckpt))
    assert sorted(got) == sorted(expected)
    for key in expected:
        assert torch.equal(got[key], expected[key]), key


def test_a_resume_that_refreezes_after_the_unfreeze_step_fails(straight, tmp_path, monkeypatch):
    # The negative control (Lightning #21901): a resume that keeps the backbone frozen after the unfreeze
    # step cannot restore the optimizer whose groups hold it, so it cannot pass for the straight run.
    monkeypatch.setattr(Finetuning, "restore", lambda self, meta, optimizer, module: False)
    folder, _ = straight
    with pytest.raises(ValueError, match="size of optimizer's group"):
        _fit(tmp_path, folder / "checkpoints" / "step_0000005")


def test_a_resume_that_refreezes_the_parameters_after_loading_differs_from_the_straight_run(
    straight, tmp_path, monkeypatch
):
    # The other negative control: Lightning's re-freeze (requires_grad off again after the optimizer loaded)
    # trains nothing of the backbone after the resume, and the comparison above sees it.
    restore = Finetuning.restore

    def refreeze(self, meta, optimizer, module):
        released = restore(self, meta, optimizer, module)
        for name, p in module.named_parameters():
            p.requires_grad_(p.requires_grad and name not in self.frozen)
        return released

    monkeypatch.setattr(Finetuning, "restore", refreeze)
    folder, expected = straight
    got = _state(_fit(tmp_path, folder / "checkpoints" / "step_0000005"))
    assert not torch.equal(got["model.audio_encoder.1.weight"], expected["model.audio_encoder.1.weight"])


def test_a_checkpoint_whose_recorded_freeze_state_disagrees_with_its_step_is_refused(straight, tmp_path):
    folder, _ = straight
    ckpt = tmp_path / "step_0000005"
    shutil.copytree(folder / "checkpoints" / "step_0000005", ckpt)
    meta = json.loads((ckpt / MARKER).read_text())
    meta["finetune"]["released"] = False
    (ckpt / MARKER).write_text(json.dumps(meta))
    with pytest.raises(ConfigError, match=r"records trainer.finetune state .*'released': False"):
        _fit(tmp_path / "run", ckpt)


def test_a_pattern_that_matches_nothing_is_one_error_naming_it_and_real_names():
    with pytest.raises(ConfigError, match=r"'audio_enc' matches no trainable parameter of BoringModule.*audio_encoder"):
        Finetuning(BoringModule(), FinetuneConfig(freeze=["audio_enc"]))


def test_freezing_everything_is_refused():
    with pytest.raises(ConfigError, match="covers every trainable parameter"):
        Finetuning(BoringModule(), FinetuneConfig(freeze=["*"]))


def test_fsdp1_is_refused_with_the_key_to_change():
    with pytest.raises(ConfigError, match=r"needs FSDP2.*fsdp_version=2"):
        Finetuning(BoringModule(), FinetuneConfig(freeze=["audio_encoder"]), fsdp={"fsdp_version": 1})
    Finetuning(BoringModule(), FinetuneConfig(freeze=["audio_encoder"]), fsdp={})  # FSDP2: accepted


def test_a_module_that_builds_its_own_optimizer_refuses_the_freeze(tmp_path):
    class Own(BoringModule):
        def configure_optimizers(self):
            return torch.optim.SGD(self.parameters(), lr=0.1)

    with pytest.raises(ConfigError, match=r"trainer.finetune.freeze is set but Own.configure_optimizers"):
        _trainer(tmp_path, finetune={"freeze": ["audio_encoder"]}).fit(Own(), train_dataloaders=boring_loader())


def test_a_glob_matches_the_name_without_the_encoders_wrapped_model():
    from sss.trainer.finetune import matches

    name = "image_encoder.model.blocks.0.attn.qkv.weight"
    assert matches("image_encoder.blocks.0*", name) and matches("image_encoder.model.blocks.0*", name)
    assert not matches("image_encoder.blocks.1*", name)
    assert not matches("fusion_head.0*", "fusion_head.layers.0.weight")  # only under an *_encoder


DDP_SCRIPT = """
import sys
import torch
from accelerate import PartialState
from torch.utils.data import DataLoader
from sss import SSSTrainer
from sss.callbacks.stock import add_stock_callbacks
from sss.testing import BoringDataset, BoringModule

out, ckpt = sys.argv[1], (sys.argv[2] if len(sys.argv) > 2 else None)
torch.manual_seed(0)
module = BoringModule()
trainer = add_stock_callbacks(SSSTrainer(
    max_steps=6, cpu=True, mixed_precision="no", output_dir=out, gradient_accumulation_steps=2,
    optim={"optimizer": {"_target_": "torch.optim.AdamW", "lr": 0.05}, "layer_decay": 0.5},
    finetune={"freeze": ["audio_encoder"], "unfreeze_at_step": 2},
    log={"progress": False, "trackers": []}, checkpoint={"every_n_steps": 3, "every_epoch": False},
))
initial = module.audio_encoder[1].weight.detach().clone()
trainer.fit(module, train_dataloaders=DataLoader(BoringDataset(64), batch_size=4, shuffle=True), ckpt_path=ckpt)
result = {
    "params": {k: v.detach().clone() for k, v in module.state_dict().items()},
    "audio_trained": not torch.equal(initial, module.audio_encoder[1].weight),
    "wrapper": type(trainer.model).__name__,
    "listed": len(trainer.accelerator._models),
    "optimizer": trainer.optimizer.state_dict()["state"],
}
torch.save(result, f"{out}/result.{trainer.accelerator.process_index}")
state = PartialState()
state.wait_for_everyone()
state.destroy_process_group()
"""


def _launch(tmp_path, out, *args) -> list[dict]:
    import os
    import subprocess

    from sss.run.launch import launch_command

    script = tmp_path / "ddp_finetune.py"
    script.write_text(DDP_SCRIPT)
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    done = subprocess.run(
        launch_command(2, [str(script), str(out), *map(str, args)]),
        capture_output=True,
        text=True,
        timeout=300,
        env=env,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    return [torch.load(out / f"result.{rank}") for rank in range(2)]


@pytest.mark.slow
def test_two_processes_rewrap_ddp_at_the_unfreeze_and_resume_bitwise(tmp_path):
    straight = tmp_path / "straight"
    rank0, rank1 = _launch(tmp_path, straight)
    assert rank0["wrapper"] == "DistributedDataParallel" and rank0["listed"] == 1  # one model, one weights file
    assert rank0["audio_trained"]
    for key, value in rank0["params"].items():  # the unfrozen encoder's gradients were all-reduced: no drift
        assert torch.equal(value, rank1["params"][key]), key
    assert sorted(p.name for p in (straight / "checkpoints" / "step_0000003").glob("model*")) == ["model.safetensors"]
    resumed0, _ = _launch(tmp_path, tmp_path / "resumed", straight / "checkpoints" / "step_0000003")
    for key, value in rank0["params"].items():
        assert torch.equal(value, resumed0["params"][key]), key
    for index, state in rank0["optimizer"].items():
        for name, tensor in state.items():
            assert torch.equal(torch.as_tensor(tensor), torch.as_tensor(resumed0["optimizer"][index][name]))
