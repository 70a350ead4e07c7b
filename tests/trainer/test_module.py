"""The `LitModule` contract: a plain nn.Module that gets what it needs as arguments, used with and without a trainer."""

from __future__ import annotations

import pytest
import torch
from accelerate import Accelerator
from torch import nn

from sss import SSSTrainer
from sss.testing import BoringDataModule, BoringModule, boring_loader
from sss.trainer._batches import split_batch

QUIET = {"log": {"progress": False, "trackers": []}, "checkpoint": {"every_epoch": False}, "mixed_precision": "no"}
ADAMW = {"_target_": "torch.optim.AdamW", "lr": 0.01, "weight_decay": 0.1}


def test_the_module_holds_no_trainer_before_during_or_after_a_fit():
    seen = []

    class Probe(BoringModule):
        def training_step(self, batch, batch_idx):
            seen.append(hasattr(self, "trainer"))
            return super().training_step(batch, batch_idx)

    module = Probe()
    assert not hasattr(module, "trainer")
    SSSTrainer(max_steps=2, **QUIET).fit(module, train_dataloaders=boring_loader())
    assert seen == [False, False] and not hasattr(module, "trainer")


def test_parameter_groups_decay_matrices_only_and_leave_out_frozen_and_empty_groups():
    module = BoringModule()
    groups = module.parameter_groups(0.1)
    assert [g["weight_decay"] for g in groups] == [0.1, 0.0]
    assert all(p.ndim > 1 for p in groups[0]["params"]) and all(p.ndim == 1 for p in groups[1]["params"])
    assert sum(len(g["params"]) for g in groups) == len(list(module.parameters()))
    for p in module.parameters():
        p.requires_grad_(p.ndim > 1)  # biases frozen: no empty no-decay group
    assert [g["weight_decay"] for g in module.parameter_groups(0.1)] == [0.1]


def test_the_trainer_builds_the_config_optimizer_over_parameter_groups_in_their_order():
    module = BoringModule()
    sched = {"_target_": "sss.trainer.cosine_with_warmup", "warmup_steps": 1, "min_lr_ratio": 0.0}
    trainer = SSSTrainer(max_steps=4, optim={"optimizer": ADAMW, "scheduler": sched}, **QUIET)
    assert module.configure_optimizers() is None  # the default: "build it from the config"
    trainer.fit(module, train_dataloaders=boring_loader())
    built, expected = trainer.optimizer.param_groups, module.parameter_groups(0.1)
    assert [g["weight_decay"] for g in built] == [g["weight_decay"] for g in expected]
    assert [[id(p) for p in g["params"]] for g in built] == [[id(p) for p in g["params"]] for g in expected]
    assert trainer.scheduler is not None and trainer.state.lr == pytest.approx(0.0, abs=1e-12)  # total_steps=4 reached


def test_an_own_optimizer_from_configure_optimizers_is_used():
    class Own(BoringModule):
        def configure_optimizers(self):
            self.built = torch.optim.SGD(self.parameters(), lr=0.5)
            return self.built

    module = Own()
    trainer = SSSTrainer(max_steps=1, optim={"optimizer": ADAMW}, **QUIET)
    trainer.fit(module, train_dataloaders=boring_loader())
    assert trainer.optimizer.optimizer is module.built and trainer.scheduler is None


def test_compute_metrics_gets_the_class_names_from_the_loop():
    got = []

    class Names(BoringModule):
        def compute_metrics(self, outputs, classes=None):
            got.append(classes)
            return super().compute_metrics(outputs, classes=classes)

    trainer = SSSTrainer(max_steps=2, **QUIET)
    metrics = trainer.fit(Names(), BoringDataModule(n_train=16, n_val=8))
    assert got == [["a", "b"]] * 2 and {"val/f1/a", "val/f1/b"} <= set(metrics)  # the sanity pass, then the run's
    out = {"loss": torch.ones(2), "scores": torch.eye(2), "target": torch.tensor([0, 1])}
    assert {"f1/x", "f1/y"} <= set(BoringModule().compute_metrics(out, classes=["x", "y"]))  # no trainer needed


def test_a_one_argument_compute_metrics_override_still_works():
    class OldStyle(BoringModule):
        def compute_metrics(self, outputs):
            return {**super().compute_metrics(outputs), "count": float(len(outputs["loss"]))}

    trainer = SSSTrainer(max_steps=2, **QUIET)
    with pytest.warns(UserWarning, match=r"OldStyle\.compute_metrics\(outputs\) takes no class names.*classes=None"):
        metrics = trainer.fit(OldStyle(), BoringDataModule(n_train=16, n_val=8))
    assert metrics["val/count"] == 8 and {"val/accuracy", "val/f1/0", "val/f1/1"} <= set(metrics)  # names by index


def test_validation_step_needs_no_trainer():
    module = BoringModule().eval()
    batch = next(iter(boring_loader(n=4, batch_size=4)))
    with torch.no_grad():
        out = module.validation_step(batch, 0)
    assert set(out) == {"loss", "scores", "preds", "target"} and out["loss"].shape == (4,)
    assert torch.equal(out["loss"], module.compute_loss(module(batch), batch).expand(4))


class MeanLoss(BoringModule):
    """A validation_step that returns the batch-mean loss for every sample, and counts its calls."""

    def __init__(self) -> None:
        super().__init__()
        self.calls: list[int] = []

    def validation_step(self, batch, batch_idx):
        self.calls.append(len(batch["label"]))
        return {"loss": self.compute_loss(self(batch), batch).expand(len(batch["label"])), "index": batch["index"]}


@pytest.mark.parametrize("processes", [1, 2])
def test_the_last_batch_of_a_multi_process_evaluation_runs_sample_by_sample(processes, monkeypatch):
    # A distributed sampler pads that batch with repeated samples, which gather_for_metrics drops by
    # position: a batch-mean value would mix them into the samples kept. The real two-process check
    # is test_distributed_eval.py; here the process count is raised after the loader was prepared.
    module = MeanLoss().eval()
    trainer = SSSTrainer(**QUIET)
    trainer.validate(module, dataloaders=boring_loader(n=4, batch_size=4))  # prepares the model
    loader = trainer.accelerator.prepare(boring_loader(n=10, batch_size=4))
    monkeypatch.setattr(Accelerator, "num_processes", property(lambda self: processes))
    module.calls.clear()
    with torch.no_grad():
        outputs = [trainer._validation_step(batch, i) for i, batch in enumerate(loader)]
        last = {k: v[8:] for k, v in next(iter(boring_loader(n=10, batch_size=10))).items()}
        mean = module.compute_loss(module(last), last).expand(2)
        each = torch.stack([module.compute_loss(module(one), one) for one in split_batch(last, 2)])
    assert outputs[-1]["index"].tolist() == [8, 9] and not torch.equal(mean, each)
    if processes == 1:
        assert module.calls == [4, 4, 2] and torch.equal(outputs[-1]["loss"], mean)
    else:
        assert module.calls == [4, 4, 1, 1] and torch.equal(outputs[-1]["loss"], each)


def test_modality_groups_and_parameter_groups_cover_the_same_parameters():
    module = BoringModule()
    module.extra = nn.Linear(2, 2)
    by_part = {id(p) for ps in module.modality_groups().values() for p in ps}
    by_decay = {id(p) for g in module.parameter_groups(0.0) for p in g["params"]}
    assert by_part == by_decay == {id(p) for p in module.parameters()}
