"""Fail fast: the batch contract on the first batches and the sanity validation, before any optimizer step."""

from __future__ import annotations

import os
import random
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from torch import nn

from sss import SSSTrainer, TrainerConfig
from sss.callbacks.base import Callback
from sss.config import ConfigError, load_config
from sss.data.contract import BatchFormatError
from sss.run.launch import launch_command
from sss.testing import BoringDataset, BoringModule, EventRecorder, boring_loader

QUIET = {"log": {"progress": False, "trackers": []}, "mixed_precision": "no"}


def _params(module: nn.Module) -> torch.Tensor:
    return torch.cat([p.detach().flatten() for p in module.parameters()])


class Steps(Callback):
    """Counts optimizer steps, and keeps what the state held when the first batch started."""

    def __init__(self) -> None:
        self.steps, self.at_first_batch = 0, None

    def on_batch_start(self, trainer, module):
        if self.at_first_batch is None:
            state = trainer.state
            self.at_first_batch = (dict(state.metrics), dict(state.eval_metrics), dict(state.eval_outputs))

    def on_after_optimizer_step(self, trainer, module):
        self.steps += 1


# ---------------------------------------------------------------- the batch contract at fit start
class IndexLabels(BoringDataset):
    """The newcomer's dataset: class indices under 'labels', which means multi-hot."""

    def __getitem__(self, i):
        item = super().__getitem__(i)
        item["labels"] = item.pop("label")
        return item


class LabelsModule(BoringModule):
    def compute_loss(self, outputs, batch):
        return F.cross_entropy(outputs, batch["labels"])  # trains fine on indices: only the metrics would crash


def _loader(dataset, batch_size=8, shuffle=False):
    return torch.utils.data.DataLoader(dataset, batch_size=batch_size, shuffle=shuffle)


@pytest.mark.parametrize(("sanity", "where"), [(2, "validation"), (0, "training")])
def test_integer_labels_fail_at_fit_start_with_the_fix(sanity, where):
    module, steps = LabelsModule(), Steps()
    before = _params(module)
    trainer = SSSTrainer(max_epochs=1, sanity_val_batches=sanity, callbacks=[steps], **QUIET)
    with pytest.raises(BatchFormatError) as caught:
        trainer.fit(module, train_dataloaders=_loader(IndexLabels(64)), val_dataloaders=_loader(IndexLabels(16)))
    assert str(caught.value) == (
        f"the first {where} batch's 'labels' is int64 [8]; 'labels' means multi-hot float [B, K]; "
        "for class indices use 'label'"
    )
    assert trainer.state.global_step == 0 and steps.steps == 0
    assert torch.equal(_params(module), before)  # no step ran


def test_batch_without_input_keys_names_the_keys_it_has():
    class Renamed(BoringDataset):
        def __getitem__(self, i):
            item = super().__getitem__(i)
            return {"images": item["image"], "sound": item["audio"], "label": item["label"]}

    trainer = SSSTrainer(max_epochs=1, **QUIET)
    with pytest.raises(BatchFormatError, match=r"^the first training batch has no 'image' or 'audio' key \(keys: "):
        trainer.fit(BoringModule(), train_dataloaders=_loader(Renamed(16)))
    assert trainer.state.global_step == 0


def test_a_module_names_its_own_input_keys():
    class Renamed(BoringDataset):
        def __getitem__(self, i):
            item = super().__getitem__(i)
            return {"images": item["image"], "sound": item["audio"], "label": item["label"]}

    class ReadsRenamed(BoringModule):
        input_keys = ("images", "sound")

        def forward(self, batch):
            return super().forward({"image": batch["images"], "audio": batch["sound"]})

    trainer = SSSTrainer(max_steps=2, **QUIET)
    trainer.fit(ReadsRenamed(), train_dataloaders=_loader(Renamed(16)), val_dataloaders=_loader(Renamed(8)))
    assert trainer.state.global_step == 2 and "val/accuracy" in trainer.state.metrics


def test_the_first_batch_is_checked_once_per_fit(monkeypatch):
    import sss.trainer.trainer as loop

    checked = []

    def check(batch, module, stage="training"):
        checked.append(stage)
        return loop_check(batch, module, stage)

    loop_check = loop.check_first_batch
    monkeypatch.setattr(loop, "check_first_batch", check)  # the step's explicit line calls the loop's name
    trainer = SSSTrainer(max_steps=3, **QUIET)
    trainer.fit(BoringModule(), train_dataloaders=boring_loader(n=32), val_dataloaders=boring_loader(n=16))
    assert checked == ["validation", "training"]  # the sanity validation's first batch, then the loop's
    trainer.config.max_steps = 5
    trainer.fit(BoringModule(), train_dataloaders=boring_loader(n=32))
    assert checked == ["validation", "training", "training"]  # a new fit checks its own first batch
    assert trainer._run_batch == trainer._forward_backward  # the runner chosen at set-up, never swapped


def test_a_bad_validation_batch_fails_before_training():
    class FloatLabels(BoringDataset):
        def __getitem__(self, i):
            return {**super().__getitem__(i), "label": self.label[i].float()}

    steps = Steps()
    trainer = SSSTrainer(max_epochs=1, callbacks=[steps], **QUIET)
    with pytest.raises(BatchFormatError, match=r"^the first validation batch's 'label' is float32 \[8\]; .*long"):
        trainer.fit(BoringModule(), train_dataloaders=boring_loader(n=64), val_dataloaders=_loader(FloatLabels(16)))
    assert trainer.state.global_step == 0 and steps.steps == 0


# ---------------------------------------------------------------- the sanity validation
def test_a_crashing_compute_metrics_fails_before_the_first_optimizer_step():
    class BrokenMetrics(BoringModule):
        def compute_metrics(self, outputs, classes=None):
            return {"f1": outputs["no such output"]}

    steps = Steps()
    trainer = SSSTrainer(max_epochs=1, callbacks=[steps], **QUIET)
    with pytest.raises(KeyError, match="no such output") as caught:
        trainer.fit(BrokenMetrics(), train_dataloaders=boring_loader(n=64), val_dataloaders=boring_loader(n=16))
    assert trainer.state.global_step == 0 and steps.steps == 0
    assert any("sanity validation before training (trainer.sanity_val_batches=2" in n for n in caught.value.__notes__)


def test_a_logged_name_that_clashes_with_a_metric_fails_before_the_first_optimizer_step():
    class Clash(BoringModule):
        def validation_step(self, batch, batch_idx):
            self.log("accuracy", 1.0)  # compute_metrics returns accuracy too
            return super().validation_step(batch, batch_idx)

    steps = Steps()
    trainer = SSSTrainer(max_epochs=1, callbacks=[steps], **QUIET)
    with pytest.raises(ValueError, match=r"validation_step logged val/accuracy, which compute_metrics also returns"):
        trainer.fit(Clash(), train_dataloaders=boring_loader(n=64), val_dataloaders=boring_loader(n=16))
    assert trainer.state.global_step == 0 and steps.steps == 0


class Counting(BoringModule):
    def __init__(self) -> None:
        super().__init__()
        self.calls: list[str] = []

    def training_step(self, batch, batch_idx):
        self.calls.append("train")
        return super().training_step(batch, batch_idx)

    def validation_step(self, batch, batch_idx):
        self.calls.append("val")
        return super().validation_step(batch, batch_idx)

    def before_training(self) -> int:
        return self.calls.index("train")


@pytest.mark.parametrize(
    ("settings", "sanity_batches"),
    [
        ({}, 2),
        ({"sanity_val_batches": 0}, 0),
        ({"sanity_val_batches": 3}, 3),
        ({"sanity_val_batches": 9}, 4),  # the loader has 4 batches
        ({"limit_val_batches": 1}, 1),
        ({"fast_dev_run": 1}, 0),  # as in Lightning: the smoke test validates after its one batch anyway
    ],
)
def test_sanity_runs_the_batches_it_is_told(settings, sanity_batches):
    module = Counting()
    SSSTrainer(**{"max_steps": 1, **settings}, **QUIET).fit(
        module, train_dataloaders=boring_loader(n=16), val_dataloaders=boring_loader(n=32)
    )
    assert module.before_training() == sanity_batches


def test_sanity_is_skipped_without_validation_data_and_on_resume():
    module = Counting()
    first = SSSTrainer(max_steps=2, **QUIET)
    first.fit(module, train_dataloaders=boring_loader(n=32))
    assert module.before_training() == 0  # no validation loader: nothing to check
    first.save_checkpoint("ck")
    resumed = Counting()
    SSSTrainer(max_steps=3, **QUIET).fit(
        resumed, train_dataloaders=boring_loader(n=32), val_dataloaders=boring_loader(n=16), ckpt_path="ck"
    )
    assert resumed.before_training() == 0  # as Lightning: a resumed run was checked when it started


class Jitter(BoringDataset):
    """Augmentation that draws from the torch, NumPy and Python RNGs in the main process."""

    def __getitem__(self, i):
        item = super().__getitem__(i)
        noise = 0.1 * torch.randn(()) + 0.1 * np.random.rand() + 0.1 * random.random()
        return {**item, "image": item["image"] + noise}


class Dropped(BoringModule):
    """Dropout: every training step draws from the torch RNG."""

    def __init__(self) -> None:
        super().__init__()
        self.drop = nn.Dropout(0.5)

    def forward(self, batch):
        return super().forward({**batch, "image": self.drop(batch["image"])})

    def validation_step(self, batch, batch_idx):
        self.log("image_mean", batch["image"].mean())  # a pass mean: values of the sanity batches must not count
        return super().validation_step(batch, batch_idx)


def _train(sanity: int) -> tuple[torch.Tensor, dict, list, tuple]:
    torch.manual_seed(0)
    module, recorder, steps = Dropped(), EventRecorder(), Steps()
    trainer = SSSTrainer(max_epochs=2, sanity_val_batches=sanity, callbacks=[recorder, steps], **QUIET)
    train, val = _loader(Jitter(48), shuffle=True), _loader(Jitter(16, seed=1), shuffle=True)
    trainer.fit(module, train_dataloaders=train, val_dataloaders=val)
    return _params(module), trainer.state.metrics, recorder.events, steps.at_first_batch


@pytest.mark.parametrize("sanity", [1, 2, 3])  # the loader has 2 batches: 3 runs it to its end
def test_sanity_on_and_off_train_bitwise_equal_weights(sanity):
    on, off = _train(sanity), _train(0)
    assert torch.equal(on[0], off[0])
    assert "val/image_mean" in on[1]
    assert on[1] == off[1]  # the validation order (a shuffled loader counts its epochs) is untouched too
    assert on[2] == off[2]  # no VALIDATION_START/END, nothing for callbacks
    assert on[3] == ({}, {}, {})  # the sanity metrics and outputs were not kept


def test_the_weights_test_sees_an_rng_leak(monkeypatch):
    # Negative control: without restoring the RNG states, the sanity pass changes the run.
    monkeypatch.setattr("sss.checkpoint.set_rng_state", lambda saved: None)
    assert not torch.equal(_train(2)[0], _train(0)[0])


def test_sanity_restores_the_mode_and_accelerate_dataloader_stack():
    trainer = SSSTrainer(max_steps=1, **QUIET)
    module = BoringModule()
    _, val = trainer._setup_fit(module, None, boring_loader(n=16), boring_loader(n=16, seed=1))
    references, epoch = list(trainer.accelerator.gradient_state.dataloader_references), val.iteration
    for training, batches in ((True, 1), (False, 2), (True, 3)):  # stopped before, at and by the loader's end
        trainer.model.train(training)
        trainer.config.sanity_val_batches = batches
        trainer._sanity_validate(val)
        assert trainer.model.training is training and module.training is training
        assert trainer.accelerator.gradient_state.dataloader_references == references and val.iteration == epoch


def test_a_side_pass_restores_the_rng_the_mode_the_stack_and_the_loaders_epoch():
    trainer = SSSTrainer(max_steps=1, **QUIET)
    _, val = trainer._setup_fit(BoringModule(), None, boring_loader(n=16), boring_loader(n=16, seed=1, shuffle=True))
    references, epoch = list(trainer.accelerator.gradient_state.dataloader_references), val.iteration
    rng = (torch.get_rng_state(), np.random.get_state()[1].copy(), random.getstate())
    with trainer._side_pass(rewind=val):
        trainer.model.eval()
        list(val)  # run to its end: counts an epoch
        left = iter(val)
        next(left)  # left before its end: stays on Accelerate's stack; __iter__ drew a seed
        assert trainer.accelerator.gradient_state.dataloader_references != references
        torch.rand(3), np.random.rand(), random.random()
    assert trainer.model.training and trainer.accelerator.gradient_state.dataloader_references == references
    assert val.iteration == epoch
    assert torch.equal(torch.get_rng_state(), rng[0]) and (np.random.get_state()[1] == rng[1]).all()
    assert random.getstate() == rng[2]


# ---------------------------------------------------------------- the setting
def test_sanity_val_batches_must_not_be_negative():
    with pytest.raises(ConfigError, match=r"^trainer.sanity_val_batches must be >= 0 \(0 turns it off\), got -1$"):
        TrainerConfig(sanity_val_batches=-1)
    with pytest.raises(ConfigError, match=r"trainer\.sanity_val_batches must be >= 0"):
        load_config(None, ["trainer.sanity_val_batches=-1"])
    assert TrainerConfig().sanity_val_batches == 2 and TrainerConfig(sanity_val_batches=0).sanity_val_batches == 0


def test_fit_help_documents_sanity_val_batches():
    out = subprocess.run([sys.executable, "-m", "sss", "fit", "--help"], capture_output=True, text=True).stdout
    assert "trainer.sanity_val_batches" in out and "compute_metrics" in out


@pytest.mark.slow
def test_two_processes_all_run_the_sanity_validation_and_train_the_same(tmp_path):
    # Every process runs it (the outputs are gathered, the padded last batch sample by sample) and
    # restores its own RNG states; a crash in compute_metrics stops every process before a step.
    out = tmp_path / "sanity"
    cmd = launch_command(2, [str(Path(__file__).parents[1] / "scripts" / "sanity_ddp.py"), str(out)])
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=300, env={**os.environ, "OMP_NUM_THREADS": "1"})
    assert done.returncode == 0, done.stderr[-3000:]
    for rank in (0, 1):
        result = torch.load(f"{out}.rank{rank}.pt")
        assert result["rank"] == rank
        assert result[2] == result[9] == (True, True)  # weights and metrics equal to the run without it
        assert result["crash_step"] == 0


def test_a_module_with_its_own_forward_and_batch_keys_is_not_asked_for_image_or_audio():
    # A custom forward reads the keys it chose (batch["x"]); the keys it shares with the contract
    # are still checked: an integer "labels" is refused all the same.
    import torch.nn.functional as F
    from torch import nn

    from sss import LitModule, SSSTrainer

    class Own(LitModule):
        def __init__(self):
            super().__init__()
            self.net = nn.Linear(4, 2)

        def forward(self, batch):
            return self.net(batch["x"])

        def compute_loss(self, outputs, batch):
            return F.cross_entropy(outputs, batch["label"])

    rows = [{"x": torch.randn(4), "label": i % 2} for i in range(8)]
    trainer = SSSTrainer(max_steps=2, mixed_precision="no")
    trainer.fit(Own(), train_dataloaders=torch.utils.data.DataLoader(rows, batch_size=4))
    assert trainer.state.global_step == 2
    bad = [{"x": torch.randn(4), "label": i % 2, "labels": i % 2} for i in range(8)]
    with pytest.raises(Exception, match="'labels' means multi-hot float"):
        SSSTrainer(max_steps=2, mixed_precision="no").fit(
            Own(), train_dataloaders=torch.utils.data.DataLoader(bad, batch_size=4)
        )
