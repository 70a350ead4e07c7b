"""What callbacks publish reaches the trackers at the logger's cadence; a resume loses no row and no step."""

from __future__ import annotations

import csv

import pytest
import torch

from sss import Callback, SSSTrainer
from sss.callbacks import MetricsLogger
from sss.callbacks.metrics_logger import CSVTracker, host_floats, read_metrics
from sss.callbacks.stock import add_stock_callbacks
from sss.testing import BoringModule, boring_loader, count_host_syncs


class Publisher(Callback):
    def on_after_backward(self, trainer, module):
        trainer.state.logs["train/custom"] = float(trainer.state.global_step + 1)


def test_published_scalars_reach_the_csv_tracker(tmp_path):
    trainer = add_stock_callbacks(
        SSSTrainer(
            max_steps=4,
            callbacks=[Publisher()],
            mixed_precision="no",
            output_dir=str(tmp_path),
            log={"progress": False, "trackers": ["csv"], "every_n_steps": 2},
            checkpoint={"every_epoch": False},
        )
    )
    trainer.fit(BoringModule(), train_dataloaders=boring_loader())
    rows = list(csv.DictReader((tmp_path / "logs" / "metrics.csv").open()))
    assert [(r["step"], r["train/custom"]) for r in rows] == [("2", "2.0"), ("4", "4.0")]
    assert trainer.state.logs == {}


class Segment(Callback):
    """Publishes which fit logged a row; the second fit also publishes a name the first never did."""

    def __init__(self, n, extra=False):
        self.n, self.extra = n, extra

    def on_after_backward(self, trainer, module):
        trainer.state.logs["train/segment"] = float(self.n)
        if self.extra:
            trainer.state.logs["train/extra"] = 1.0


def _logged_trainer(out, steps, callbacks):
    return add_stock_callbacks(
        SSSTrainer(
            max_steps=steps,
            callbacks=callbacks,
            mixed_precision="no",
            output_dir=str(out),
            log={"progress": False, "trackers": ["csv", "tensorboard"], "every_n_steps": 2},
            checkpoint={"every_n_steps": 2, "every_epoch": False, "keep_last": None},
        )
    )


def _fit_then_resume_from_step_4(out):
    """Steps 1-6 (checkpoints at 2, 4, 6; validation at 6), then a resume of step 4 that trains to step 8.

    Resuming the step-4 checkpoint is what a run killed after step 6 and resumed from step 4 sees.
    """
    val = boring_loader(n=16, seed=1)
    _logged_trainer(out, 6, [Segment(1)]).fit(BoringModule(), train_dataloaders=boring_loader(), val_dataloaders=val)
    resumed = _logged_trainer(out, 8, [Segment(2, extra=True)])
    step_4 = out / "checkpoints" / "step_0000004"
    resumed.fit(BoringModule(), train_dataloaders=boring_loader(), val_dataloaders=val, ckpt_path=step_4)


def test_a_resume_keeps_every_earlier_row_and_sets_the_redone_steps_aside(tmp_path, capsys):
    _fit_then_resume_from_step_4(tmp_path)
    rows = list(csv.DictReader((tmp_path / "logs" / "metrics.csv").open()))
    # rows of steps 2 and 4 from the first fit survive the resume and the new column train/extra
    assert [(r["step"], r["train/segment"], r["train/extra"]) for r in rows if r["train/loss"]] == [
        ("2", "1.0", ""),
        ("4", "1.0", ""),
        ("6", "2.0", "1.0"),
        ("8", "2.0", "1.0"),
    ]
    steps = [int(r["step"]) for r in rows]
    assert steps == sorted(steps) and [r["step"] for r in rows if r["val/loss"]] == ["8"]
    # what the first fit logged after step 4 (its step 6 and its validation there) is kept aside, not lost
    aside = list(csv.DictReader((tmp_path / "logs" / "metrics.superseded.1.csv").open()))
    assert [(r["step"], r["train/segment"]) for r in aside] == [("6", "1.0"), ("6", "")]
    assert aside[1]["val/loss"] != ""
    assert "2 row(s) of" in capsys.readouterr().out


def test_tensorboard_continues_at_the_resumed_step(tmp_path):
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    _fit_then_resume_from_step_4(tmp_path)
    events = EventAccumulator(str(tmp_path / "logs" / tmp_path.name))  # Accelerate: logs/<project name>/
    events.Reload()
    assert len(list((tmp_path / "logs" / tmp_path.name).glob("events.out.tfevents.*"))) == 2  # one per fit
    # the first fit's step 6 is purged (purge_step=5): one point per step, the resumed run's
    assert [(e.step, e.value) for e in events.Scalars("train/segment")] == [(2, 1.0), (4, 1.0), (6, 2.0), (8, 2.0)]
    assert [e.step for e in events.Scalars("val/loss")] == [8]
    rows = list(csv.DictReader((tmp_path / "logs" / "metrics.csv").open()))
    logged = [(int(r["step"]), float(r["train/loss"])) for r in rows if r["train/loss"]]
    assert [e.step for e in events.Scalars("train/loss")] == [step for step, _ in logged]
    assert [e.value for e in events.Scalars("train/loss")] == pytest.approx([value for _, value in logged])


def test_tensorboard_event_files_hold_the_logged_scalars(tmp_path):
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    trainer = add_stock_callbacks(
        SSSTrainer(
            max_steps=4,
            callbacks=[Publisher()],
            mixed_precision="no",
            output_dir=str(tmp_path),
            log={"progress": False, "trackers": ["tensorboard"], "every_n_steps": 2},
            checkpoint={"every_epoch": False},
        )
    )
    trainer.fit(BoringModule(), train_dataloaders=boring_loader(), val_dataloaders=boring_loader(n=8))
    events = EventAccumulator(str(tmp_path / "logs" / tmp_path.name))
    events.Reload()
    scalars = set(events.Tags()["scalars"])
    assert {"train/loss", "train/lr", "train/grad_norm", "train/custom", "val/loss", "val/accuracy"} <= scalars
    assert [(e.step, e.value) for e in events.Scalars("train/custom")] == [(2, 2.0), (4, 4.0)]
    assert [e.step for e in events.Scalars("val/accuracy")] == [4]
    assert events.Scalars("val/accuracy")[0].value == pytest.approx(trainer.state.metrics["val/accuracy"])
    assert not (tmp_path / "logs" / "metrics.csv").exists()  # trackers: [tensorboard] only


def test_a_new_column_keeps_the_rows_an_earlier_process_wrote(tmp_path):
    CSVTracker(tmp_path).log({"train/loss": 0.5}, step=1)
    CSVTracker(tmp_path).log({"train/loss": 0.4, "val/accuracy": 0.9}, step=2)  # a resumed process, a new name
    assert read_metrics(tmp_path / "metrics.csv") == [
        {"step": 1.0, "train/loss": 0.5},
        {"step": 2.0, "train/loss": 0.4, "val/accuracy": 0.9},
    ]
    assert not (tmp_path / "metrics.csv.tmp").exists()


def test_a_line_cut_by_a_kill_is_set_aside_and_later_rows_are_whole(tmp_path):
    tracker = CSVTracker(tmp_path)
    for step in (1, 2):
        tracker.log({"train/loss": 0.5}, step=step)
    with (tmp_path / "metrics.csv").open("a") as f:
        f.write("3,0.4")  # killed while appending: no newline
    assert [r["step"] for r in read_metrics(tmp_path / "metrics.csv")] == [1.0, 2.0]
    CSVTracker(tmp_path).log({"train/loss": 0.3}, step=3)
    assert [r["step"] for r in read_metrics(tmp_path / "metrics.csv")] == [1.0, 2.0, 3.0]
    assert (tmp_path / "metrics.superseded.1.csv").read_text() == "step,train/loss\n3,0.4\n"


def test_a_fresh_fit_sets_an_earlier_fits_rows_aside(tmp_path):
    for _ in range(2):  # the same output_dir twice, without checkpoints: the second is a fresh run
        trainer = add_stock_callbacks(
            SSSTrainer(
                max_steps=2,
                mixed_precision="no",
                output_dir=str(tmp_path),
                log={"progress": False, "trackers": ["csv"], "every_n_steps": 1},
                checkpoint={"every_epoch": False},
            )
        )
        trainer.fit(BoringModule(), train_dataloaders=boring_loader())
    assert [r["step"] for r in read_metrics(tmp_path / "logs" / "metrics.csv")] == [1.0, 2.0]
    assert [r["step"] for r in read_metrics(tmp_path / "logs" / "metrics.superseded.1.csv")] == [1.0, 2.0]


class Reader(Callback):
    """What state.logs holds when this callback runs at each optimizer step."""

    def __init__(self):
        self.seen = []

    def on_after_optimizer_step(self, trainer, module):
        self.seen.append(dict(trainer.state.logs))


def test_a_callback_after_the_logger_still_reads_what_it_logged(tmp_path):
    reader = Reader()
    trainer = SSSTrainer(
        max_steps=4,
        callbacks=[Publisher(), MetricsLogger(every_n_steps=2, trackers=["csv"]), reader],
        mixed_precision="no",
        output_dir=str(tmp_path),
        log={"progress": False, "trackers": [], "every_n_steps": 2},
        checkpoint={"every_epoch": False},
    )
    trainer.fit(BoringModule(), train_dataloaders=boring_loader())
    assert [row.get("train/custom") for row in reader.seen] == [1.0, 2.0, 3.0, 4.0]  # the logger left them
    rows = read_metrics(tmp_path / "logs" / "metrics.csv")
    assert [(r["step"], r["train/custom"]) for r in rows if "train/custom" in r] == [(2.0, 2.0), (4.0, 4.0)]


def test_each_tensor_keeps_its_own_read_value_whatever_was_read_between():
    a, b = torch.tensor(0.25), torch.tensor(0.5)
    assert host_floats({"a": a}) == {"a": 0.25}
    assert host_floats({"b": b}) == {"b": 0.5}  # another reader, another run: nothing shared evicts a's value
    with count_host_syncs() as syncs:
        assert host_floats({"a": a, "b": b, "lr": 0.1}) == {"a": 0.25, "b": 0.5, "lr": 0.1}
    assert len(syncs) == 0
    for value in range(20):  # freed tensors' ids come back: each new tensor is read for itself
        assert host_floats({"x": torch.tensor(float(value))}) == {"x": float(value)}
