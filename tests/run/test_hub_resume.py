"""`sss fit --resume hub://OWNER/REPO[@REVISION]`: download the checkpoint HubPush pushed and continue bitwise.

Against the local Hub server of tests/hub_server.py (huggingface_hub's own download code runs).
"""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from hub_server import REPO, FakeHub, running_hub
from safetensors.torch import load_file

from sss.callbacks.stock import add_stock_callbacks
from sss.cli import main
from sss.testing import BoringModule, boring_loader
from sss.trainer.trainer import SSSTrainer

SCRIPTS = Path(__file__).parents[1] / "scripts"  # fit_pause.DropoutBoring: a model whose training draws from the RNG
CONFIG = """\
name: hubres
model: {_target_: fit_pause.DropoutBoring}
data: {_target_: sss.testing.BoringDataModule, n_train: 32, n_val: 8, batch_size: 4}
trainer:
  max_steps: 6
  log: {progress: false, trackers: [], plots: false}
  checkpoint: {every_n_steps: 3, every_epoch: false}
"""


@pytest.fixture
def hub(monkeypatch):
    monkeypatch.syspath_prepend(str(SCRIPTS))
    Path("run.yaml").write_text(CONFIG)
    with running_hub(monkeypatch) as server:
        monkeypatch.setenv("HF_ENDPOINT", server.url)
        yield server


def _weights(folder: str) -> dict[str, torch.Tensor]:
    return load_file(f"{folder}/model/model.safetensors")


def test_resume_from_a_pushed_checkpoint_ends_bitwise_equal(hub, capsys):
    push = (
        f'callbacks=[{{_target_: sss.callbacks.HubPush, repo_id: {REPO}, strategy: every_save, endpoint: "{hub.url}"}}]'
    )
    assert main(["fit", "run.yaml", "trainer.output_dir=straight", push]) == 0  # pushes step 3, step 6, the model
    step3 = next(c["oid"] for c in hub.commits if c["message"] == "checkpoint step_0000003")
    capsys.readouterr()
    # the commit of step 3 (the branch head holds step 6): continued on another machine, into a fresh folder
    assert main(["fit", "run.yaml", "trainer.output_dir=resumed", "--resume", f"hub://{REPO}@{step3}"]) == 0
    out = capsys.readouterr().out
    folder = f"resumed/checkpoints/hub-{step3}"
    assert f"sss: --resume hub://{REPO}@{step3}: downloaded step 3 of {REPO}@{step3} on {hub.url} to {folder}" in out
    assert f"(resuming {folder})" in out
    a, b = _weights("resumed"), _weights("straight")
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a), "weights differ from the straight run"
    assert sorted(p.name for p in Path("resumed/checkpoints").iterdir() if not p.name.startswith(".")) == [
        f"hub-{step3}",
        "step_0000006",
    ]  # nothing of the download's staging left
    # a local resume's refusals apply: here a changed math field
    code = main(["fit", "run.yaml", "trainer.output_dir=other", "trainer.seed=1", "--resume", f"hub://{REPO}@{step3}"])
    assert code == 2 and "trainer.seed: 42 in the checkpoint, 1 now" in capsys.readouterr().err


def _upload(hub: FakeHub, files: dict[str, bytes]) -> None:
    hub.repos[REPO] = {"name": "boring", "organization": "tester"}
    hub.commits.append({"repo": REPO, "revision": "main", "oid": "a" * 40, "message": "by hand", "files": files})


def test_an_altered_download_is_refused_and_kept_and_never_downloaded_over(hub, capsys):
    trainer = add_stock_callbacks(
        SSSTrainer(max_steps=1, mixed_precision="no", output_dir="local", log={"progress": False, "trackers": []})
    )
    trainer.fit(BoringModule(), train_dataloaders=boring_loader(n=8, batch_size=4))
    checkpoint = Path(trainer.state.last_checkpoint)
    files = {
        f"last-checkpoint/{p.relative_to(checkpoint)}": p.read_bytes() for p in checkpoint.rglob("*") if p.is_file()
    }
    weights = bytearray(files["last-checkpoint/model.safetensors"])
    weights[-1] ^= 1  # one bit changed after the save: same size, another CRC32
    _upload(hub, {**files, "last-checkpoint/model.safetensors": bytes(weights)})
    capsys.readouterr()
    assert main(["fit", "run.yaml", "trainer.output_dir=r", "--resume", f"hub://{REPO}"]) == 1
    err = capsys.readouterr().err.strip().splitlines()[-1]  # after huggingface_hub's progress bar
    target = "r/checkpoints/hub-main"
    assert err.startswith(
        f"error: --resume hub://{REPO}: the download of {REPO} on {hub.url} does not match its marker: "
        f"{target}/model.safetensors does not match the CRC32 recorded in trainer_state.json"
    )
    assert f"The download stays in {target}: move it away" in err
    assert Path(target, "model.safetensors").read_bytes() == bytes(weights)
    assert main(["fit", "run.yaml", "trainer.output_dir=r", "--resume", f"hub://{REPO}"]) == 1
    assert capsys.readouterr().err.strip() == (
        f"error: --resume hub://{REPO}: {target} already exists (an earlier download?) and is never downloaded over: "
        f"resume it as it is (--resume {target}), or move it away to download {REPO} again"
    )


def test_no_repo_no_checkpoint_no_revision_and_no_network_each_say_what_to_do(hub, capsys):
    def error(resume: str, folder: str = "r") -> str:
        capsys.readouterr()
        assert main(["fit", "run.yaml", f"trainer.output_dir={folder}", "--resume", resume]) == 1
        return capsys.readouterr().err.strip().splitlines()[-1]

    assert error("hub://tester/nope") == (
        f"error: --resume hub://tester/nope: {hub.url} has no repo tester/nope that this token may read: check the "
        "name, and set HF_TOKEN (or run `hf auth login`) for a private repo"
    )
    _upload(hub, {"model.safetensors": b"weights", "README.md": b"# boring"})  # HubPush(strategy="end") pushed
    assert error(f"hub://{REPO}") == (
        f"error: --resume hub://{REPO}: {REPO} on {hub.url} holds no last-checkpoint/ with a checkpoint: push "
        f"checkpoints there with HubPush(repo_id='{REPO}', strategy='every_save'), or name the revision that has "
        "one (@REVISION)"
    )
    assert error(f"hub://{REPO}@v9") == (
        f"error: --resume hub://{REPO}@v9: {REPO} on {hub.url} has no revision 'v9': name a branch, tag or commit "
        f"of it (hub://{REPO}@REVISION), or leave @REVISION out for main"
    )
    closed = FakeHub()  # bind a free port, then close it: nothing listens there
    closed.server_close()
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("HF_ENDPOINT", closed.url)
        message = error(f"hub://{REPO}", folder="r2")
    assert message.startswith(f"error: --resume hub://{REPO}: cannot download {REPO} on {closed.url} (")
    assert message.endswith("check the network and HF_ENDPOINT, then run the same command again")
    for folder in ("r", "r2"):
        assert not any(Path(folder).glob("checkpoints/*")), folder  # neither a download nor its staging left
