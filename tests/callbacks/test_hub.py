"""HubPush against a local HTTP server speaking the Hub API that huggingface_hub uses (no code patched out)."""

from __future__ import annotations

import json

import pytest
import torch
from hub_server import REPO, TOKEN, FakeHub, running_hub  # the local Hub server, shared with tests/run
from safetensors.torch import load as load_safetensors

from sss import Callback, SSSTrainer
from sss.callbacks import HubPush
from sss.callbacks.stock import add_stock_callbacks
from sss.errors import HubPushError
from sss.testing import BoringModule, boring_loader


@pytest.fixture
def hub(monkeypatch):
    with running_hub(monkeypatch) as server:
        yield server


def _trainer(tmp_path, callbacks, steps=3, checkpoint=None):
    return add_stock_callbacks(
        SSSTrainer(
            callbacks=callbacks,
            max_steps=steps,
            mixed_precision="no",
            output_dir=str(tmp_path / "run"),
            log={"progress": False, "trackers": []},
            checkpoint=checkpoint or {"every_epoch": False},
        )
    )


def test_end_pushes_the_model_folder(hub, tmp_path, capsys):
    push = HubPush(REPO, private=True, revision="v1", endpoint=hub.url)
    module = BoringModule()
    _trainer(tmp_path, [push]).fit(module, train_dataloaders=boring_loader())
    assert hub.repos[REPO]["visibility"] == "private" and hub.branches == ["v1"]
    assert [(c["revision"], c["message"]) for c in hub.commits] == [("v1", "model after global_step 3")]
    weights = load_safetensors(hub.commits[0]["files"]["model.safetensors"])
    for name, value in module.state_dict().items():
        assert torch.equal(weights[name], value), name
    assert push.pushed == ["model after global_step 3"] and push.errors == []
    out = capsys.readouterr()
    assert f"HubPush to {REPO}" in out.out and TOKEN not in out.out + out.err


def test_under_sss_fit_the_full_model_folder_is_pushed(hub, tmp_path):
    from sss.config import SSSConfig, to_yaml

    # what `sss fit` writes before training: OUTPUT_DIR/config.yaml
    (tmp_path / "run").mkdir()
    cfg = SSSConfig(name="boring", model={"_target_": "sss.testing.BoringModule"})
    (tmp_path / "run" / "config.yaml").write_text(to_yaml(cfg))
    _trainer(tmp_path, [HubPush(REPO, endpoint=hub.url)]).fit(BoringModule(), train_dataloaders=boring_loader())
    files = hub.commits[0]["files"]
    assert sorted(files) == ["README.md", "config.yaml", "model.safetensors", "preprocessing.json"]
    assert "_target_: sss.testing.BoringModule" in files["config.yaml"].decode() and b"# boring" in files["README.md"]


def test_with_ema_export_the_pushed_folder_holds_the_average_as_sss_fit_writes_it(hub, tmp_path):
    from sss.callbacks import EMA
    from sss.config import SSSConfig, to_yaml

    (tmp_path / "run").mkdir()
    cfg = SSSConfig(name="boring", model={"_target_": "sss.testing.BoringModule"})
    (tmp_path / "run" / "config.yaml").write_text(to_yaml(cfg))
    ema, module = EMA(decay=0.5, export=True, eval=False), BoringModule()
    _trainer(tmp_path, [ema, HubPush(REPO, endpoint=hub.url)]).fit(module, train_dataloaders=boring_loader())
    files = hub.commits[0]["files"]
    pushed = load_safetensors(files["model.safetensors"])
    average = ema.weights()
    assert any(not torch.equal(average[k], v) for k, v in module.state_dict().items())  # the two differ
    assert all(torch.equal(pushed[k], v) for k, v in average.items())
    assert b"- weights: ema (decay 0.5)" in files["README.md"]


class CommitsAtFitEnd(Callback):
    def __init__(self, hub):
        self.hub, self.seen = hub, None

    def on_fit_end(self, trainer, module):
        self.seen = len(self.hub.commits)


def test_every_save_against_a_slow_hub_loses_no_push(hub, tmp_path):
    hub.commit_delay = 0.4
    probe, push = CommitsAtFitEnd(hub), HubPush(REPO, strategy="every_save", endpoint=hub.url)
    checkpoint = {"every_n_steps": 1, "every_epoch": False, "keep_last": 1}  # rotation deletes while pushes queue
    _trainer(tmp_path, [probe, push], steps=4, checkpoint=checkpoint).fit(
        BoringModule(), train_dataloaders=boring_loader()
    )
    assert probe.seen < 4, "the pushes should still have been queued when training ended"
    messages = [c["message"] for c in hub.commits]
    assert messages == [f"checkpoint step_{s:07d}" for s in (1, 2, 3, 4)] + ["model after global_step 4"]
    for step, commit in enumerate(hub.commits[:4], start=1):
        state = json.loads(commit["files"]["last-checkpoint/trainer_state.json"])
        assert state["global_step"] == step
        assert any(name.startswith("last-checkpoint/model") for name in commit["files"])
    assert not (tmp_path / "run" / ".hub_staging").exists()  # staged copies removed after their push
    for path in (tmp_path / "run").rglob("*"):  # the token is written nowhere
        assert not path.is_file() or TOKEN.encode() not in path.read_bytes(), path


def test_bad_token_fails_at_fit_start(hub, tmp_path, monkeypatch):
    monkeypatch.setenv("HF_TOKEN", "hf_wrong")
    trainer = _trainer(tmp_path, [HubPush(REPO, endpoint=hub.url)])
    with pytest.raises(RuntimeError, match="HubPush: cannot push to tester/boring") as err:
        trainer.fit(BoringModule(), train_dataloaders=boring_loader())
    assert "Invalid user token" in str(err.value) and "Training has not started" in str(err.value)
    assert "HF_TOKEN" in str(err.value) and "hf_wrong" not in str(err.value)
    assert trainer.state.global_step == 0 and hub.repos == {}


def test_unreachable_endpoint_fails_at_fit_start(tmp_path, monkeypatch):
    monkeypatch.setenv("HF_TOKEN", TOKEN)
    closed = FakeHub()  # bind a free port, then close it: nothing listens there
    url = closed.url
    closed.server_close()
    trainer = _trainer(tmp_path, [HubPush(REPO, endpoint=url)])
    with pytest.raises(
        RuntimeError, match=rf"HubPush: cannot push to tester/boring on {url}: .*Training has not started"
    ):
        trainer.fit(BoringModule(), train_dataloaders=boring_loader())
    assert trainer.state.global_step == 0


def test_a_failed_push_is_surfaced_at_fit_end(hub, tmp_path):
    hub.commit_status = 403
    push = HubPush(REPO, endpoint=hub.url, retries=2)
    with pytest.raises(
        RuntimeError, match=r"HubPush: 1 push\(es\) to tester/boring failed: model after global_step 3 \(from "
    ) as err:
        _trainer(tmp_path, [push]).fit(BoringModule(), train_dataloaders=boring_loader())
    assert hub.commits == [] and push.pushed == []
    assert isinstance(err.value, HubPushError)  # what `sss fit` tells apart, by type, from other failures


def test_a_failure_at_fit_start_is_no_hub_push_error(hub, tmp_path, monkeypatch):
    # `sss fit` reports a HubPushError as a push failed after a finished run: a refused token is not one.
    monkeypatch.setenv("HF_TOKEN", "hf_wrong")
    with pytest.raises(RuntimeError, match="HubPush: cannot push") as err:
        _trainer(tmp_path, [HubPush(REPO, endpoint=hub.url)]).fit(BoringModule(), train_dataloaders=boring_loader())
    assert not isinstance(err.value, HubPushError)


@pytest.mark.slow
def test_every_process_fails_at_fit_start_when_the_hub_is_unreachable(tmp_path):
    from test_overflow import _launch_two  # the two-process harness

    closed = FakeHub()
    url = closed.url
    closed.server_close()
    ranks = _launch_two(tmp_path, "hub", str(tmp_path / "out"), url)
    for r in ranks:  # rank 1 got the main process's verdict: it neither hung nor trained
        assert r["step"] == 0 and r["error"].startswith(f"HubPush: cannot push to tester/boring on {url}")


@pytest.mark.slow
def test_sss_fit_pushes_a_model_card_with_the_per_modality_figures(hub, tmp_path):
    from pathlib import Path

    from sss.config import load_config
    from sss.run.fit import run_fit

    example = Path(__file__).parents[2] / "examples" / "industrial.yaml"
    short = ["model.name=hunter_tiny", "data.n_train=32", "data.n_val=16", "data.n_test=8", "data.batch_size=8"]
    cfg = load_config(example, [*short, "trainer.max_steps=2", "trainer.log.progress=false"])
    cfg.callbacks = [{"_target_": "sss.callbacks.HubPush", "repo_id": REPO, "endpoint": hub.url}]
    results = run_fit(cfg)
    card = hub.commits[-1]["files"]["README.md"].decode()
    assert "val/accuracy_image_only" in card and "val/fusion_gain_accuracy" in card
    assert results["val/accuracy_audio_only"] == pytest.approx(float(card.split("val/accuracy_audio_only | ")[1][:6]))


@pytest.mark.slow
def test_with_two_processes_only_the_main_one_pushes(hub, tmp_path):
    import os
    import subprocess
    from pathlib import Path

    from sss.run.launch import launch_command

    script = Path(__file__).parents[1] / "scripts" / "hub_push_ddp.py"
    env = {**os.environ, "OMP_NUM_THREADS": "1", "HF_TOKEN": TOKEN}
    command = launch_command(2, [str(script), hub.url, str(tmp_path / "out")])
    done = subprocess.run(command, capture_output=True, text=True, timeout=300, env=env)
    assert done.returncode == 0, done.stderr[-3000:]
    rank0, rank1 = (json.loads((tmp_path / f"out.{rank}").read_text()) for rank in (0, 1))
    expected = ["checkpoint step_0000002", "checkpoint step_0000004", "model after global_step 4"]
    assert [c["message"] for c in hub.commits] == expected  # once each, not once per process
    assert hub.whoami_calls == 1 and list(hub.repos) == [REPO]
    assert rank0["pushed"] == expected and rank0["errors"] == []
    assert rank1["pushed"] == [] and rank1["errors"] == [] and rank1["step"] == rank0["step"] == 4
    # every process enters the weight gather (a collective under FSDP / ZeRO-3), not only the one that pushes
    assert (
        rank0["gathers"].count("export.py:export_run_model")
        == rank1["gathers"].count("export.py:export_run_model")
        == 1
    )
    # the pushed model is the trained one, equal on both ranks
    weights = load_safetensors(hub.commits[-1]["files"]["model.safetensors"])
    assert sorted(weights) == sorted(rank0["params"])
    for name, value in rank0["params"].items():
        assert weights[name].tolist() == value == rank1["params"][name], name
