"""Streaming predictions: `CSVPredictionWriter` writes `predict` outputs as they come, in 1 or 2 processes alike,
with flat memory, and never overwrites a file."""

from __future__ import annotations

import csv
import json
import os
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch

import sss.run.predict as run_predict
from sss import Callback, SSSTrainer
from sss.callbacks import CSVPredictionWriter
from sss.config import SSSConfig
from sss.data import make_industrial
from sss.data.synthetic import CLASSES
from sss.model_folder import export_model
from sss.models import create_model
from sss.run.launch import launch_command
from sss.testing import BoringModule, boring_loader

SCRIPT = Path(__file__).parents[1] / "scripts" / "predict_stream.py"
MEMORY = Path(__file__).parents[1] / "scripts" / "predict_memory.py"
QUIET = {"cpu": True, "mixed_precision": "no", "log": {"progress": False, "trackers": []}}


def _rows(path: Path) -> list[list[str]]:
    with path.open(newline="") as f:
        return list(csv.reader(f))


def _one_process(path: Path, index_key: str = "index") -> list[list[str]]:
    torch.manual_seed(0)  # the model of tests/scripts/predict_stream.py
    trainer = SSSTrainer(callbacks=[CSVPredictionWriter(path, index_key=index_key)], **QUIET)
    trainer.predict(BoringModule(), dataloaders=boring_loader(n=21, batch_size=4), return_predictions=False)
    return _rows(path)


def _assert_same_rows(got: list[list[str]], want: list[list[str]]) -> None:
    assert got[0] == want[0] == ["index", "prediction_0", "prediction_1"]
    assert [row[0] for row in got] == [row[0] for row in want]  # the same rows, in the same order
    torch.testing.assert_close(
        torch.tensor([[float(v) for v in row[1:]] for row in got[1:]]),
        torch.tensor([[float(v) for v in row[1:]] for row in want[1:]]),
    )


@pytest.mark.slow
def test_two_processes_write_the_rows_of_one_process(tmp_path):
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    done = subprocess.run(
        launch_command(2, [str(SCRIPT), str(tmp_path)]), capture_output=True, text=True, timeout=180, env=env
    )
    assert done.returncode == 0, done.stderr[-3000:]
    single = _one_process(tmp_path / "single.csv")
    assert [row[0] for row in single[1:]] == [str(i) for i in range(21)]
    # 2 x 4 rows per step: the sampler pads the third step's 5 rows with 3 repeats, which are not written
    _assert_same_rows(_rows(tmp_path / "by_index.csv"), single)
    _assert_same_rows(_rows(tmp_path / "by_position.csv"), single)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["by_index.csv", "by_position.csv", "single.csv"]


def test_memory_stays_flat_over_20000_rows(tmp_path):
    # In a fresh process (tests/scripts/predict_memory.py): in this one, memory earlier tests freed is reused.
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    done = subprocess.run(
        [sys.executable, str(MEMORY), str(tmp_path)], capture_output=True, text=True, timeout=180, env=env
    )
    assert done.returncode == 0, done.stderr[-3000:]
    measured = json.loads(done.stdout.strip().splitlines()[-1])
    assert measured["rows"] == 20_001
    # measured: about 50 KB streamed, 4.6 MB kept (5.1 MB of outputs, some of it in memory freed before)
    kept, streamed = measured["kept"], measured["streamed"]
    assert kept > 3_000_000, f"the control kept {kept} bytes: the measurement cannot see 5 MB of outputs"
    assert streamed < 1_500_000, f"streaming 20,000 rows grew the resident memory by {streamed} bytes"


def test_the_writer_never_overwrites_a_file(tmp_path):
    out = tmp_path / "predictions.csv"
    out.write_text("mine\n")
    trainer = SSSTrainer(callbacks=[CSVPredictionWriter(out)], **QUIET)
    with pytest.raises(FileExistsError, match=r"predictions\.csv already exists; CSVPredictionWriter never overwrites"):
        trainer.predict(BoringModule(), dataloaders=boring_loader(n=8), return_predictions=False)
    assert out.read_text() == "mine\n" and sorted(tmp_path.iterdir()) == [out]
    # a part left by an interrupted run is not overwritten either
    out.unlink()
    part = tmp_path / "predictions.csv.rank0.part"
    part.write_text("left\n")
    with pytest.raises(FileExistsError, match=r"rank0\.part already exists"):
        trainer.predict(BoringModule(), dataloaders=boring_loader(n=8), return_predictions=False)
    assert part.read_text() == "left\n" and not out.exists()


def test_an_output_that_appears_during_predict_is_kept_and_so_are_the_rows(tmp_path):
    out = tmp_path / "predictions.csv"

    class Intruder(Callback):
        def on_predict_batch_end(self, trainer, module):
            if trainer.state.batch_idx == 1:
                out.write_text("theirs\n")

    trainer = SSSTrainer(callbacks=[CSVPredictionWriter(out), Intruder()], **QUIET)
    with pytest.raises(FileExistsError, match="appeared during predict; the rows stay in"):
        trainer.predict(BoringModule(), dataloaders=boring_loader(n=24), return_predictions=False)
    assert out.read_text() == "theirs\n"
    assert len(_rows(tmp_path / "predictions.csv.rank0.part")) == 25


def test_a_shuffled_loader_is_refused_and_predict_returns_the_outputs_by_default(tmp_path):
    trainer = SSSTrainer(callbacks=[CSVPredictionWriter(tmp_path / "p.csv")], **QUIET)
    with pytest.raises(ValueError, match=r"must give the rows in dataset order \(shuffle=False\)"):
        trainer.predict(BoringModule(), dataloaders=boring_loader(n=64, shuffle=True), return_predictions=False)
    trainer = SSSTrainer(**QUIET)
    outputs = trainer.predict(BoringModule(), dataloaders=boring_loader(n=10, batch_size=4))
    assert [len(o) for o in outputs] == [4, 4, 2] and trainer.state.prediction is None


def test_sss_predict_writes_each_batch_before_the_next(tmp_path, monkeypatch):
    data = make_industrial(tmp_path / "data", n_train=1, n_val=0, n_test=7, seed=3)
    torch.manual_seed(0)
    spec = {"_target_": "sss.models.create_model", "name": "hunter_tiny", "num_classes": len(CLASSES)}
    settings = SimpleNamespace(classes=list(CLASSES), task=None, image_size=64, sample_rate=16000, clip_seconds=1.0)
    module, cfg = create_model("hunter_tiny", num_classes=len(CLASSES)), SSSConfig(name="tiny", model=spec)
    folder = export_model(module, cfg, {}, tmp_path / "model", settings)
    out, lines_at = tmp_path / "preds.csv", {}
    relative = run_predict._relative

    def watch(paths, index, root):  # called for each row as it is written: how far is the CSV on disk?
        part = out.with_name(out.name + ".partial")  # rows stream to the partial file, renamed when complete
        lines_at[index] = len(part.read_text().splitlines()) if part.exists() else None
        return relative(paths, index, root)

    monkeypatch.setattr(run_predict, "_relative", watch)
    run_predict.predict(folder, data / "test.csv", out, batch_size=3)
    # batches of 3: the first row of each later batch finds the header and every earlier batch on disk
    assert {index: lines_at[index] for index in (3, 6)} == {3: 4, 6: 7}
    assert len(_rows(out)) == 8
