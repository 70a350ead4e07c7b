"""Debug limits (limit_train/val_batches, overfit_batches, fast_dev_run) and auto batch size on out-of-memory."""

from __future__ import annotations

import warnings

import pytest
import torch

from sss import SSSTrainer
from sss.callbacks.stock import add_stock_callbacks
from sss.testing import BoringDataset, BoringModule, boring_loader
from sss.trainer.trainer import split_batch

QUIET = {"log": {"progress": False, "trackers": []}, "checkpoint": {"every_epoch": False}, "mixed_precision": "no"}


def trainer(**settings) -> SSSTrainer:
    return add_stock_callbacks(SSSTrainer(**{**QUIET, "cpu": True, **settings}))


def params(module: torch.nn.Module) -> torch.Tensor:
    return torch.cat([p.detach().flatten() for p in module.parameters()])


class Counting(BoringModule):
    """Records the dataset rows it trains on, and counts evaluation samples."""

    def __init__(self) -> None:
        super().__init__()
        self.seen: list[list[int]] = []

    def training_step(self, batch, batch_idx):
        self.seen.append(batch["index"].tolist())
        return super().training_step(batch, batch_idx)

    def compute_metrics(self, outputs):
        return {**super().compute_metrics(outputs), "count": float(len(outputs["loss"]))}


def test_limit_train_batches_equals_training_on_those_batches_and_steps_the_short_window():
    torch.manual_seed(0)
    limited = Counting()
    t = trainer(max_epochs=2, limit_train_batches=3, gradient_accumulation_steps=2)
    t.fit(limited, train_dataloaders=boring_loader(n=80, batch_size=8))
    # 3 batches per epoch with windows of 2: one full window and one short one, per epoch
    assert t.state.global_step == t.total_steps == 4
    assert limited.seen == [list(range(24))[i * 8 : i * 8 + 8] for i in range(3)] * 2
    torch.manual_seed(0)
    reference = BoringModule()
    r = trainer(max_epochs=2, gradient_accumulation_steps=2)
    rows = torch.utils.data.Subset(BoringDataset(80), range(24))  # exactly those 3 batches
    r.fit(reference, train_dataloaders=torch.utils.data.DataLoader(rows, batch_size=8))
    assert torch.equal(params(limited), params(reference))


def test_limit_val_batches_counts_only_those_batches():
    t = trainer(max_steps=1, limit_val_batches=2)
    metrics = t.fit(Counting(), train_dataloaders=boring_loader(n=8), val_dataloaders=boring_loader(n=40, batch_size=8))
    assert metrics["val/count"] == 16


def test_overfit_batches_trains_and_validates_on_the_same_batches_every_epoch():
    module = Counting()
    t = trainer(max_epochs=3, overfit_batches=2)
    metrics = t.fit(module, train_dataloaders=boring_loader(n=64, batch_size=8, shuffle=True))
    assert len(module.seen) == 6 and module.seen[0:2] == module.seen[2:4] == module.seen[4:6]
    assert module.seen[0] == list(range(8))  # the dataset's first samples, in order
    assert metrics["val/count"] == 16 and t.state.global_step == 6


def test_fast_dev_run_runs_n_batches_once_and_keeps_nothing(tmp_path):
    module = Counting()
    t = add_stock_callbacks(
        SSSTrainer(cpu=True, mixed_precision="no", fast_dev_run=2, max_epochs=5, output_dir=str(tmp_path / "run"))
    )
    metrics = t.fit(module, train_dataloaders=boring_loader(n=64), val_dataloaders=boring_loader(n=64))
    assert t.state.global_step == 2 and t.state.epoch == 1 and metrics["val/count"] == 16
    assert not (tmp_path / "run" / "checkpoints").exists() and not (tmp_path / "run" / "logs").exists()


class OutOfMemoryAbove(BoringModule):
    """Raises the CUDA out-of-memory error for micro-batches larger than `limit` after `after` good calls."""

    def __init__(self, limit: int, after: int = 0) -> None:
        super().__init__()
        self.limit, self.after, self.calls = limit, after, 0

    def training_step(self, batch, batch_idx):
        self.calls += 1
        if batch["label"].shape[0] > self.limit and self.calls > self.after:
            raise torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 2.00 GiB (simulated)")
        return super().training_step(batch, batch_idx)


@pytest.mark.parametrize("after", [0, 1], ids=["first_batch", "mid_window"])
def test_auto_batch_size_splits_and_matches_the_run_that_fit(after):
    settings = {"max_epochs": 2, "gradient_accumulation_steps": 2, "seed": 3}
    torch.manual_seed(0)
    reference = BoringModule()
    trainer(**settings).fit(reference, train_dataloaders=boring_loader(n=40, batch_size=8, shuffle=True))
    torch.manual_seed(0)
    module = OutOfMemoryAbove(limit=4, after=after)
    t = trainer(auto_batch_size=True, **settings)
    with pytest.warns(UserWarning, match="now runs as 2 micro-batches of about 4"):
        t.fit(module, train_dataloaders=boring_loader(n=40, batch_size=8, shuffle=True))
    assert t.state.batch_splits == 2 and t.state.global_step == 6
    torch.testing.assert_close(params(module), params(reference), rtol=1e-5, atol=1e-7)


def test_the_splitting_runner_is_used_only_with_auto_batch_size():
    from sss.trainer._oom import SplittingRunner

    plain, splitting = trainer(max_steps=1), trainer(max_steps=1, auto_batch_size=True)
    for t in (plain, splitting):
        t.fit(BoringModule(), train_dataloaders=boring_loader(n=16))
    assert plain._run_batch == plain._forward_backward and isinstance(splitting._run_batch, SplittingRunner)


def test_out_of_memory_without_auto_batch_size_is_raised():
    with pytest.raises(torch.OutOfMemoryError):
        trainer(max_steps=1).fit(OutOfMemoryAbove(limit=4), train_dataloaders=boring_loader(n=16))


def test_out_of_memory_at_one_sample_per_micro_batch_says_what_to_do():
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        with pytest.raises(RuntimeError, match=r"micro-batches of 1 sample.*gradient checkpointing"):
            trainer(max_steps=1, auto_batch_size=True).fit(
                OutOfMemoryAbove(limit=0), train_dataloaders=boring_loader(n=16, batch_size=4)
            )


def test_split_batch_splits_nested_dicts_and_lists_and_keeps_settings():
    batch = {"image": torch.zeros(5, 3), "meta": {"path": list("abcde")}, "sr": 16000, "scalar": torch.tensor(1.0)}
    parts = split_batch(batch, 3)
    assert [p["meta"]["path"] for p in parts] == [["a", "b"], ["c", "d"], ["e"]]
    assert all(p["sr"] == 16000 and p["scalar"].item() == 1.0 for p in parts)
    assert len(split_batch(batch, 5)) == 5 and split_batch(batch, 1) == [batch]


@pytest.mark.slow
def test_compile_trains_like_eager():
    from torch._dynamo.utils import counters

    settings = {"max_steps": 4, "seed": 0}
    torch.manual_seed(0)
    eager = BoringModule()
    trainer(**settings).fit(eager, train_dataloaders=boring_loader(n=32))
    torch.manual_seed(0)
    compiled = BoringModule()
    t = trainer(compile=True, **settings)
    torch._dynamo.reset()  # no graph cached by an earlier test: this fit must capture its own
    counters.clear()
    t.fit(compiled, train_dataloaders=boring_loader(n=32))
    # compilation happened (a fit that skipped it trains like eager too): dynamo captured the module's forward
    assert counters["stats"]["unique_graphs"] >= 1 and counters["frames"]["ok"] >= 1, dict(counters["frames"])
    assert compiled._compiled_call_impl is not None
    torch.testing.assert_close(params(compiled), params(eager), rtol=1e-5, atol=1e-6)
    assert sorted(compiled.state_dict()) == sorted(eager.state_dict())  # checkpoints keep their names


def test_resume_right_after_the_last_limited_batch_trains_no_extra_batch(tmp_path):
    settings = {"max_epochs": 2, "limit_train_batches": 3, "seed": 1}
    torch.manual_seed(0)
    straight = BoringModule()
    saving = trainer(
        **{**settings, "checkpoint": {"every_n_steps": 3, "every_epoch": False}}, output_dir=str(tmp_path / "a")
    )
    saving.fit(straight, train_dataloaders=boring_loader(n=40, shuffle=True))
    torch.manual_seed(0)
    resumed = BoringModule()
    t = trainer(**settings, output_dir=str(tmp_path / "b"))
    t.fit(
        resumed, train_dataloaders=boring_loader(n=40, shuffle=True), ckpt_path=tmp_path / "a/checkpoints/step_0000003"
    )
    assert t.state.global_step == saving.state.global_step == 6
    assert torch.equal(params(resumed), params(straight))


def test_overfit_batches_covering_the_whole_loader_keeps_accumulation_and_counts():
    t = trainer(max_epochs=2, overfit_batches=3, gradient_accumulation_steps=2)
    metrics = t.fit(Counting(), train_dataloaders=boring_loader(n=20, batch_size=8))
    assert t.state.global_step == 4 and metrics["val/count"] == 20  # 3 batches (8, 8, 4): 2 windows per epoch


def test_auto_batch_size_replays_a_window_from_the_same_batchnorm_statistics():
    class WithNorm(OutOfMemoryAbove):
        def __init__(self) -> None:
            super().__init__(limit=4, after=1)
            self.image_encoder = torch.nn.Sequential(
                torch.nn.Flatten(), torch.nn.BatchNorm1d(48), torch.nn.Linear(48, 8)
            )

    torch.manual_seed(0)
    module = WithNorm()
    with pytest.warns(UserWarning, match="2 micro-batches"):
        trainer(max_steps=1, gradient_accumulation_steps=2, auto_batch_size=True).fit(
            module, train_dataloaders=boring_loader(n=16, batch_size=8)
        )
    # the first batch (whole) ran once before the OOM and was replayed in two halves: without the
    # restore, BatchNorm would have counted it twice plus the second batch's halves
    assert int(module.image_encoder[1].num_batches_tracked) == 4


def test_validate_leaves_the_module_in_the_mode_it_found():
    module = BoringModule().eval()
    trainer(max_steps=1).validate(module, dataloaders=boring_loader(n=8))
    assert not module.training
