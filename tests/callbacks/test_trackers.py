"""MLflow (against a real tracking server on localhost) and W&B (offline) through Accelerate's trackers."""

from __future__ import annotations

import json
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pytest

from sss import SSSTrainer
from sss.callbacks import MetricsLogger, ModelCheckpoint
from sss.testing import BoringModule, boring_loader


@pytest.fixture(scope="module")
def mlflow_server(tmp_path_factory):
    """``mlflow server`` on a free localhost port, with its own SQLite store and artifact folder; its URI."""
    root = tmp_path_factory.mktemp("mlflow")
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    mlflow = Path(sys.executable).with_name("mlflow")
    command = [str(mlflow), "server", "--backend-store-uri", f"sqlite:///{root / 'store.db'}"]
    command += ["--artifacts-destination", str(root / "artifacts"), "--host", "127.0.0.1", "--port", str(port)]
    command += ["--workers", "1"]
    log = (root / "server.log").open("w")
    server = subprocess.Popen(command, stdout=log, stderr=subprocess.STDOUT, cwd=root)
    uri = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 60
    while True:
        try:
            with urllib.request.urlopen(f"{uri}/health", timeout=1) as reply:
                if reply.status == 200:
                    break
        except OSError:
            pass
        if server.poll() is not None or time.monotonic() > deadline:
            server.kill()
            raise RuntimeError(f"mlflow server did not start: {(root / 'server.log').read_text()[-2000:]}")
        time.sleep(0.25)
    yield uri
    server.terminate()
    try:
        server.wait(timeout=10)
    except subprocess.TimeoutExpired:
        server.kill()
    log.close()


def _trainer(out, steps, trackers, **overrides):
    logger = MetricsLogger(every_n_steps=1, trackers=trackers)
    checkpoints = ModelCheckpoint(every_n_steps=2, every_epoch=False, keep_last=None)
    return SSSTrainer(
        max_steps=steps,
        mixed_precision="no",
        output_dir=str(out),
        callbacks=[logger, checkpoints],
        log={"progress": False},
        **overrides,
    )


def test_mlflow_gets_params_metrics_and_the_model_and_a_resume_continues_the_run(mlflow_server, tmp_path, monkeypatch):
    from mlflow.tracking import MlflowClient

    monkeypatch.setenv("MLFLOW_TRACKING_URI", mlflow_server)
    out = tmp_path / "hunter_run"
    first = _trainer(out, 4, ["csv", "mlflow"])
    first.fit(BoringModule(), train_dataloaders=boring_loader())
    run_id = first.callbacks[0].run_ids["mlflow"]
    saved = json.loads((out / "checkpoints" / "step_0000004" / "trainer_state.json").read_text())
    assert saved["callbacks"][0]["state"] == {"run_ids": {"mlflow": run_id}}  # carried in the checkpoint
    resumed = _trainer(out, 6, ["csv", "mlflow"])
    resumed.fit(BoringModule(), train_dataloaders=boring_loader(), ckpt_path=out / "checkpoints" / "step_0000004")
    assert resumed.callbacks[0].run_ids["mlflow"] == run_id

    client = MlflowClient(mlflow_server)
    experiment = client.get_experiment_by_name("hunter_run")
    runs = client.search_runs([experiment.experiment_id])
    assert [r.info.run_id for r in runs] == [run_id]  # one run: the resume continued it
    run = runs[0]
    assert run.info.run_name == "hunter_run" and run.info.status == "FINISHED"
    params = run.data.params
    assert params["trainer.max_steps"] == "4" and params["trainer.seed"] == "42"
    assert params["trainer.optim.optimizer._target_"] == "torch.optim.AdamW"
    assert run.data.tags["resumed_at_step_4.trainer.max_steps"] == "6"  # MLflow refuses to change a param
    history = client.get_metric_history(run_id, "train/loss")
    assert sorted(m.step for m in history) == [1, 2, 3, 4, 5, 6]  # before and after the resume
    assert {m.step: m.value for m in history}[6] == pytest.approx(float(resumed.state.loss))
    artifacts = [a.path for a in client.list_artifacts(run_id, "model")]
    assert artifacts == ["model/model.safetensors"]  # the model folder (weights alone outside `sss fit`)


def test_wandb_offline_writes_its_run_folder_and_a_resume_continues_the_run_id(tmp_path, monkeypatch):
    monkeypatch.setenv("WANDB_MODE", "offline")
    monkeypatch.setenv("WANDB_SILENT", "true")
    monkeypatch.setenv("WANDB_CONSOLE", "off")
    monkeypatch.delenv("WANDB_DIR", raising=False)  # default: the run's own logs folder
    out = tmp_path / "hunter_run"
    first = _trainer(out, 4, ["wandb"])
    first.fit(BoringModule(), train_dataloaders=boring_loader())
    run_id = first.callbacks[0].run_ids["wandb"]
    folders = sorted((out / "logs" / "wandb").glob(f"offline-run-*-{run_id}"))
    assert len(folders) == 1
    # Offline, W&B keeps the run in one binary record log (its history, config and summary), for `wandb sync`.
    records = (folders[0] / f"run-{run_id}.wandb").read_bytes()
    assert b"train/loss" in records and b"trainer.max_steps" in records and b"hunter_run" in records
    assert records.count(b"train/loss") >= 4  # one history row per logged step

    logger = MetricsLogger(trackers=["wandb"])
    logger.load_state_dict(
        json.loads((out / "checkpoints" / "step_0000004" / "trainer_state.json").read_text())["callbacks"][0]["state"]
    )
    kwargs = logger._run_kwargs(first)["wandb"]
    assert kwargs["id"] == run_id and kwargs["resume"] == "allow"  # what wandb.init gets on a resume
