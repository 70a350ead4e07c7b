"""EarlyStopping: decides after validation, stops at the right epoch, keeps its state in checkpoints."""

from __future__ import annotations

import json
import math

import pytest

from sss import Callback, SSSTrainer
from sss.callbacks import EarlyStopping
from sss.callbacks.stock import add_stock_callbacks
from sss.testing import BoringModule, boring_loader

# The tests count validations: no sanity pass before training.
QUIET = {"log": {"progress": False, "trackers": []}, "mixed_precision": "no", "sanity_val_batches": 0}


class Scripted(BoringModule):
    """Reports the next value of `values` as val/score at each validation."""

    def __init__(self, values):
        super().__init__()
        self.values = list(values)
        self.calls = 0

    def compute_metrics(self, outputs):
        metrics = super().compute_metrics(outputs)
        metrics["score"] = self.values[self.calls]
        self.calls += 1
        return metrics


def _fit(module, callbacks, epochs=10, ckpt_path=None, **kw):
    trainer = add_stock_callbacks(SSSTrainer(callbacks=callbacks, max_epochs=epochs, **QUIET, **kw))
    trainer.fit(
        module,
        train_dataloaders=boring_loader(n=16, batch_size=8),
        val_dataloaders=boring_loader(n=8),
        ckpt_path=ckpt_path,
    )
    return trainer


def test_stops_after_patience_validations_without_improvement(capsys):
    es = EarlyStopping(monitor="val/score", mode="min", patience=2)
    module = Scripted([1.0, 0.9, 0.95, 0.93, 0.5, 0.4])
    trainer = _fit(module, [es], checkpoint={"every_epoch": False})
    assert module.calls == 4 and trainer.state.epoch == 4  # stopped after the 4th epoch's validation, of 10
    assert (es.best, es.wait, es.stopped_step) == (0.9, 2, trainer.state.global_step)
    assert "EarlyStopping: val/score did not improve" in capsys.readouterr().out


def test_max_mode_and_min_delta():
    es = EarlyStopping(monitor="val/score", mode="max", patience=1, min_delta=0.05)
    module = Scripted([0.5, 0.6, 0.63, 0.9])
    _fit(module, [es], checkpoint={"every_epoch": False})
    assert module.calls == 3 and es.best == 0.6  # 0.63 is not better by more than 0.05


def test_keeps_training_while_improving():
    es = EarlyStopping(monitor="val/score", patience=1)
    module = Scripted([5, 4, 3, 2, 1])
    trainer = _fit(module, [es], epochs=5, checkpoint={"every_epoch": False})
    assert module.calls == 5 and trainer.state.epoch == 5 and es.stopped_step is None


def test_non_finite_metric_stops_at_once():
    es = EarlyStopping(monitor="val/score", patience=5)
    module = Scripted([1.0, math.nan, 0.5])
    _fit(module, [es], checkpoint={"every_epoch": False})
    assert module.calls == 2 and "check_finite" in es.reason


def test_unknown_monitor_names_the_available_metrics():
    with pytest.raises(KeyError, match=r"val/accuracy.*val/loss"):
        _fit(BoringModule(), [EarlyStopping(monitor="val/acc")], checkpoint={"every_epoch": False})


class StateAtFitStart(Callback):
    def __init__(self, es):
        self.es, self.seen = es, None

    def on_fit_start(self, trainer, module):
        self.seen = (self.es.best, self.es.wait)


def test_state_is_saved_after_its_update_and_restored_on_resume(tmp_path):
    values = [1.0, 0.9, 0.95, 0.97, 0.99]
    es = EarlyStopping(monitor="val/score", patience=3)
    _fit(Scripted(values), [es], epochs=3, output_dir=str(tmp_path / "run"), checkpoint={"keep_last": None})
    checkpoints = sorted((tmp_path / "run" / "checkpoints").iterdir())
    saved = [
        next(
            c["state"]
            for c in json.loads((p / "trainer_state.json").read_text())["callbacks"]
            if c["class"] == "EarlyStopping"
        )
        for p in checkpoints
    ]
    # each epoch's checkpoint holds the state after that epoch's validation, not one epoch stale (Lightning #1464)
    assert saved == [{"best": 1.0, "wait": 0}, {"best": 0.9, "wait": 0}, {"best": 0.9, "wait": 1}]

    resumed = EarlyStopping(monitor="val/score", patience=3)
    probe = StateAtFitStart(resumed)
    module = Scripted(values)
    module.calls = 3  # the validations the first run already did
    trainer = _fit(module, [resumed, probe], epochs=10, ckpt_path=checkpoints[-1], output_dir=str(tmp_path / "run"))
    assert probe.seen == (0.9, 1)
    assert module.calls == 5 and resumed.wait == 3 and trainer.state.epoch == 5  # the count went on: 2 more


def test_a_reused_instance_starts_fresh_on_a_new_fit():
    es = EarlyStopping(monitor="val/score", patience=1)
    _fit(Scripted([1.0, 2.0]), [es], checkpoint={"every_epoch": False})
    assert es.best == 1.0 and es.stopped_step is not None
    module = Scripted([5.0, 4.0, 3.0])
    _fit(module, [es], epochs=3, checkpoint={"every_epoch": False})
    assert module.calls == 3 and es.best == 3.0 and es.stopped_step is None  # 5.0 was not compared to 1.0


def test_health_callbacks_switch_on_from_yaml(tmp_path):
    from sss.config import check_config, instantiate, load_config

    (tmp_path / "run.yaml").write_text(
        "model: {_target_: sss.testing.BoringModule}\n"
        "callbacks:\n"
        "  - {_target_: sss.callbacks.GradNormMonitor, every_n_steps: 5, ogm_ge: true}\n"
        "  - {_target_: sss.callbacks.OverflowDetector, on_nan: raise, max_consecutive_skips: 20}\n"
        "  - {_target_: sss.callbacks.EarlyStopping, monitor: val/accuracy, mode: max, patience: 4}\n"
        "  - {_target_: sss.callbacks.LearningRateMonitor}\n"
        "  - {_target_: sss.callbacks.Throughput}\n"
        "  - {_target_: sss.callbacks.MemoryMonitor}\n"
        "  - {_target_: sss.callbacks.Plots}\n"
        "  - {_target_: sss.callbacks.HubPush, repo_id: me/hunter, strategy: every_save, private: true}\n"
    )
    cfg = load_config(tmp_path / "run.yaml")
    assert [e for e in check_config(cfg) if "callbacks" in e] == []
    built = [instantiate(spec) for spec in cfg.callbacks]
    names = ["GradNormMonitor", "OverflowDetector", "EarlyStopping", "LearningRateMonitor", "Throughput"]
    assert [type(c).__name__ for c in built] == [*names, "MemoryMonitor", "Plots", "HubPush"]
    assert built[0].ogm_ge and built[1].on_nan == "raise" and built[2].mode == "max" and built[7].private
