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


BORING = "model: {_target_: sss.testing.BoringModule}\ndata: {_target_: sss.testing.BoringDataModule}\n"
MANIFEST = str(Path(__file__).parents[2] / "examples" / "manifest.yaml")


def _closed_port() -> int:
    with socket.socket() as s:  # free a moment ago: nothing listens there
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_an_mlflow_server_that_is_down_fails_in_seconds_in_one_line_without_the_password(monkeypatch, capsys):
    # Without the pre-flight: MLflow's client retries for minutes, then `MlflowException (unexpected)`; these two
    # variables only shorten that, so that a run without the pre-flight fails this test quickly.
    from sss.cli import main

    port = _closed_port()
    monkeypatch.setenv("MLFLOW_TRACKING_URI", f"http://user:password@127.0.0.1:{port}")
    monkeypatch.setenv("MLFLOW_HTTP_REQUEST_MAX_RETRIES", "0")
    monkeypatch.setenv("MLFLOW_HTTP_REQUEST_TIMEOUT", "5")
    Path("run.yaml").write_text(BORING)
    started = time.monotonic()
    code = main(
        ["fit", "run.yaml", "trainer.max_steps=2", "trainer.log.trackers=[csv,mlflow]", "trainer.log.progress=false"]
    )
    err = capsys.readouterr().err
    assert code == 1 and time.monotonic() - started < 60
    assert err == (
        f"error: trainer.log.trackers has mlflow, and nothing answered at its tracking server http://user:***@127.0.0.1:"
        f"{port}: connection refused. Start the server, or set MLFLOW_TRACKING_URI to one that runs, or remove mlflow "
        "from trainer.log.trackers\n"
    )


def test_the_pre_flight_connects_through_the_proxy_and_leaves_local_stores_alone(monkeypatch):
    from sss._preflight import TrackerUnreachableError, check_trackers

    proxy = _closed_port()
    monkeypatch.setenv("http_proxy", f"http://127.0.0.1:{proxy}")  # what MLflow's client (requests) would go through
    monkeypatch.delenv("no_proxy", raising=False)
    monkeypatch.setenv("MLFLOW_TRACKING_URI", "http://mlflow.invalid:5000")
    with pytest.raises(
        TrackerUnreachableError, match=rf"through the proxy 127\.0\.0\.1:{proxy} .*: connection refused"
    ):
        check_trackers(["mlflow"])
    check_trackers(["mlflow"], is_main_process=False)  # only the main process starts the trackers
    for local in ("sqlite:///mlflow.db", "file:./mlruns"):
        monkeypatch.setenv("MLFLOW_TRACKING_URI", local)
        check_trackers(["csv", "mlflow"])


def test_the_error_line_and_warnings_show_no_url_password(capsys):
    import warnings

    from sss.cli import main
    from sss.warnings import SSSWarning, use_short_format

    # data.root is echoed in the error line (a path keeps one slash of "http://": the password is still there)
    code = main(["fit", MANIFEST, "data.root=http://user:password@example.com/x", "trainer.log.progress=false"])
    err = capsys.readouterr().err
    assert code != 0 and err.count("\n") == 1 and err.startswith("error: ")
    assert "password" not in err and "user:***@example.com" in err, err
    use_short_format()
    mine = warnings.formatwarning("http://me:password@host did not answer", SSSWarning, "x.py", 1, "")
    other = warnings.formatwarning("proxy https://token@proxy:3128 refused", UserWarning, "x.py", 1, "")
    assert mine == "sss: warning: http://me:***@host did not answer\n"
    assert "https://***@proxy:3128 refused" in other and "token" not in other
