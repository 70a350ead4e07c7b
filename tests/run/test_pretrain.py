"""`sss pretrain`, then `sss fit ... model.init_from=RUN`: the commands as typed, the load, kill -9 and resume."""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file, save_file

from sss.cli import main
from sss.config import load_config
from sss.config._untrusted import without_outside_files
from sss.data.synthetic import make_industrial
from sss.models import create_model
from sss.run.init_from import init_encoders_from
from sss.run.parts import build_parts
from sss.testing import subprocess_env

EXAMPLES = Path(__file__).parents[2] / "examples"
PRETRAIN, MANIFEST = str(EXAMPLES / "pretrain.yaml"), str(EXAMPLES / "manifest.yaml")
QUIET = ["data.num_workers=0", "data.batch_size=8", "trainer.log.progress=false", "trainer.log.trackers=[]"]
TINY_PRETRAIN = ["model.name=contrastive_tiny", "model.proj_dim=16", *QUIET]
TINY_FIT = ["model.name=hunter_tiny", *QUIET, "trainer.max_epochs=1"]
RETRIEVAL = [f"val/retrieval/{way}_r{k}" for way in ("audio_to_image", "image_to_audio") for k in (1, 5, 10)]


@pytest.fixture(scope="module")
def data(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return make_industrial(tmp_path_factory.mktemp("pairs") / "d", n_train=32, n_val=16, n_test=0)


@pytest.fixture(scope="module")
def pretrained(data: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("pretrain") / "run"
    words = ["pretrain", PRETRAIN, f"data.root={data}", *TINY_PRETRAIN, "trainer.max_steps=6"]
    assert main([*words, f"trainer.output_dir={out}"]) == 0
    return out


def test_pretrain_reports_retrieval_and_the_probe_and_exports_the_encoders(pretrained, capsys):
    results = json.loads((pretrained / "results.json").read_text())
    assert set(RETRIEVAL) <= set(results) and "val/linear_probe/accuracy" in results  # the val split has labels
    assert all(0.0 <= results[k] <= 1.0 for k in RETRIEVAL)
    assert not any(k.startswith(("val_image_only", "val_audio_only", "robustness")) for k in results)  # no ablation
    weights = load_file(str(pretrained / "model" / "model.safetensors"))
    assert {"logit_scale", "image_projection.0.weight"} <= set(weights)
    assert any(k.startswith("image_encoder.") for k in weights) and any(k.startswith("audio_encoder.") for k in weights)
    assert (pretrained / "plots").is_dir()


def test_fit_with_init_from_starts_every_encoder_tensor_from_the_pretraining(pretrained, data, tmp_path, capsys):
    # The command as a user types it; its first lines report what was loaded.
    words = ["fit", MANIFEST, f"data.root={data}", f"model.init_from={pretrained}", *TINY_FIT]
    assert main([*words, f"trainer.output_dir={tmp_path / 'fine'}"]) == 0
    out = capsys.readouterr().out
    assert "sss: image encoder (model.init_from) from " in out and "0 missing, 0 unexpected" in out
    exported = (tmp_path / "fine" / "model" / "config.yaml").read_text()
    assert "init_from" not in exported  # the folder's weights are the fine-tuned ones: it needs no pretraining run
    assert "init_from" in (tmp_path / "fine" / "config.yaml").read_text()  # the run's own record keeps it
    # The build sss fit does, in process: each encoder tensor is the pretrained one, the head the fresh one.
    cfg = load_config(MANIFEST, [f"data.root={data}", f"model.init_from={pretrained}", *TINY_FIT])
    module = build_parts(cfg, init_from=True).module
    fresh = build_parts(load_config(MANIFEST, [f"data.root={data}", *TINY_FIT])).module
    source = load_file(str(pretrained / "model" / "model.safetensors"))
    for part in ("image_encoder", "audio_encoder"):
        for name, tensor in getattr(module, part).state_dict().items():
            assert torch.equal(tensor, source[f"{part}.{name}"]), f"{part}.{name}"
    head, fresh_head = module.fusion_head.state_dict(), fresh.fusion_head.state_dict()
    assert all(torch.equal(head[k], fresh_head[k]) for k in head)


def test_init_from_loads_every_tensor_or_none(tmp_path):
    # Every encoder tensor of the source is the model's initial value + 1: one left behind keeps its init.
    torch.manual_seed(0)
    target = create_model("hunter_tiny", image_encoder="test_resnet")
    before = {k: v.clone() for k, v in target.state_dict().items()}
    shifted = {k: v + 1 for k, v in before.items()}
    folder = tmp_path / "m"
    folder.mkdir()
    save_file({k: v.contiguous() for k, v in shifted.items()}, str(folder / "model.safetensors"))
    reports = init_encoders_from(target, folder)
    after = target.state_dict()
    encoders = [k for k in after if k.startswith(("image_encoder.", "audio_encoder."))]
    assert encoders and all(torch.equal(after[k], shifted[k]) for k in encoders)
    assert all(torch.equal(after[k], before[k]) for k in after if k not in encoders)  # the rest stays fresh
    assert sum(len(r.loaded) for r in reports) == len(encoders)
    # Another model's encoders: refused naming the shapes, and nothing is loaded.
    other = create_model("hunter_small", image_encoder="test_resnet")
    kept = {k: v.clone() for k, v in other.state_dict().items()}
    with pytest.raises(ValueError, match=r"does not fit this model's: .* in the file, .* in the model"):
        init_encoders_from(other, folder)
    assert all(torch.equal(v, kept[k]) for k, v in other.state_dict().items())


def test_init_from_finds_the_weights_of_a_run_and_says_what_it_wants(pretrained, tmp_path, capsys):
    from sss.run.init_from import init_source

    assert init_source(pretrained) == pretrained / "model" / "model.safetensors"
    checkpoint = sorted((pretrained / "checkpoints").iterdir())[-1]
    assert init_source(checkpoint) == checkpoint / "model.safetensors"  # verified against its manifest first
    killed = tmp_path / "killed"
    killed.mkdir()
    shutil.copytree(pretrained / "checkpoints", killed / "checkpoints")  # a run that never exported: its checkpoint
    assert init_source(killed) == killed / "checkpoints" / checkpoint.name / "model.safetensors"
    assert main(["fit", MANIFEST, "data.root=nowhere", f"model.init_from={tmp_path / 'no'}", *TINY_FIT]) == 2  # first
    err = capsys.readouterr().err
    assert f"model.init_from={tmp_path / 'no'}: no such folder; give a run folder" in err
    damaged = tmp_path / "damaged"
    shutil.copytree(checkpoint, damaged)
    (damaged / "model.safetensors").write_bytes(b"truncated")  # the manifest's size and CRC no longer match
    with pytest.raises(FileNotFoundError, match=rf"model.init_from={damaged}: .*model.safetensors.*give another"):
        init_source(damaged)
    assert main(["fit", MANIFEST, "data.root=nowhere", f"model.init_from={damaged}", *TINY_FIT]) == 2
    assert f"model.init_from={damaged}: " in capsys.readouterr().err


def test_fit_refuses_a_train_split_read_as_unlabelled_naming_the_file_and_the_key(tmp_path, capsys):
    root = make_industrial(tmp_path / "d", n_train=8, n_val=4, n_test=0)
    rows = (root / "train.csv").read_text().splitlines()
    header = rows[0].split(",")
    cells = rows[1].split(",")
    cells[header.index("label")] = ""  # one row without its label: the split is unlabelled as a whole
    (root / "train.csv").write_text("\n".join([rows[0], ",".join(cells), *rows[2:]]) + "\n")
    words = ["fit", MANIFEST, f"data.root={root}", "data.labels=optional", *TINY_FIT]
    words += [f"trainer.output_dir={tmp_path / 'r'}"]
    assert main(words) == 2
    err = capsys.readouterr().err
    assert f"data.labels=optional read {root / 'train.csv'} as unlabelled (1 row(s) without a label" in err
    assert "HunterModule trains on labels" in err and "sss pretrain" in err


def test_the_lr_range_test_is_of_the_model_the_run_trains_its_encoders_loaded(pretrained, data, tmp_path, capsys):
    words = ["tune", "lr", MANIFEST, f"data.root={data}", f"model.init_from={pretrained}", *TINY_FIT]
    assert main([*words, f"trainer.output_dir={tmp_path / 'tune'}", "--steps", "5"]) == 0
    assert capsys.readouterr().out.count("(model.init_from) from ") == 2  # both encoders, before the test


def test_a_model_folder_config_never_opens_init_from():
    assert without_outside_files({"name": "hunter_tiny", "init_from": "/home/me/runs/pre"}, "c.yaml") == {
        "name": "hunter_tiny"
    }


def test_pretrain_refuses_a_model_that_needs_labels(data, capsys):
    assert main(["pretrain", MANIFEST, f"data.root={data}", *QUIET]) == 2
    err = capsys.readouterr().err
    assert "sss pretrain learns without labels, but model 'hunter_small' trains on them: use sss fit" in err


KILLER = """
import os, signal
from sss.callbacks.base import Callback

class KillAt(Callback):
    def __init__(self, step):
        self.step = step

    def on_after_optimizer_step(self, trainer, module):
        if trainer.state.global_step == self.step:
            os.kill(os.getpid(), signal.SIGKILL)
"""


@pytest.mark.slow
def test_kill9_during_pretraining_then_resume_is_bitwise_the_straight_run(data, tmp_path):
    (tmp_path / "killer.py").write_text(KILLER)
    run = [sys.executable, "-m", "sss", "pretrain", PRETRAIN, f"data.root={data}", *TINY_PRETRAIN]
    run += ["trainer.max_steps=8", "trainer.checkpoint.every_n_steps=2", "trainer.checkpoint.every_epoch=false"]
    env = subprocess_env(OMP_NUM_THREADS="1")

    def sss(*words: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run([*run, *words], cwd=tmp_path, env=env, capture_output=True, text=True, timeout=600)

    straight = sss("trainer.output_dir=straight")
    assert straight.returncode == 0, straight.stderr[-2000:]
    killed = sss("trainer.output_dir=killed", "callbacks=[{_target_: killer.KillAt, step: 5}]")
    assert killed.returncode == -signal.SIGKILL, killed.stderr[-2000:]
    assert not (tmp_path / "killed" / "results.json").exists()
    resumed = sss("trainer.output_dir=killed", "--resume")
    assert resumed.returncode == 0, resumed.stderr[-2000:]
    assert "killed/checkpoints/step_0000004" in resumed.stdout
    a = load_file(str(tmp_path / "straight" / "model" / "model.safetensors"))
    b = load_file(str(tmp_path / "killed" / "model" / "model.safetensors"))
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)
    first = json.loads((tmp_path / "straight" / "results.json").read_text())
    again = json.loads((tmp_path / "killed" / "results.json").read_text())
    assert [first[k] for k in RETRIEVAL] == [again[k] for k in RETRIEVAL]


@pytest.mark.slow
def test_pretrain_on_two_processes_as_typed(data, tmp_path):
    words = [sys.executable, "-m", "sss", "pretrain", PRETRAIN, f"data.root={data}", *TINY_PRETRAIN]
    words += ["trainer.max_steps=4", "trainer.output_dir=run", "--num-processes", "2"]
    env = subprocess_env(OMP_NUM_THREADS="1")
    done = subprocess.run(words, cwd=tmp_path, env=env, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    results = json.loads((tmp_path / "run" / "results.json").read_text())
    assert results["num_processes"] == 2 and set(RETRIEVAL) <= set(results)
    assert os.path.isfile(tmp_path / "run" / "model" / "model.safetensors")
    assert done.stdout.count("sss: fine-tune from it: sss fit CONFIG model.init_from=run") == 1  # the main process


@pytest.mark.slow
def test_two_process_validation_with_unpaired_samples_is_the_one_process_evaluation(tmp_path):
    # 15 validation rows over 2 processes and batches of 8: the last batch is padded and run sample by sample,
    # and with an image missing from 30 % of the rows some process's sample has no pair. Every process still
    # sends one row per sample; the metrics are those of one process over the pairs of the whole split.
    from sss import load_model
    from sss.data import ManifestDataModule

    data = make_industrial(tmp_path / "d", n_train=16, n_val=15, n_test=0, task="shared", missing={"image": 0.3})
    words = [sys.executable, "-m", "sss", "pretrain", PRETRAIN, f"data.root={data}", *TINY_PRETRAIN]
    words += ["trainer.max_steps=2", "trainer.output_dir=run", "--num-processes", "2"]
    done = subprocess.run(words, cwd=tmp_path, env=subprocess_env(OMP_NUM_THREADS="1"), capture_output=True,
                          text=True, timeout=600)  # fmt: skip
    assert done.returncode == 0, done.stderr[-3000:]
    results = json.loads((tmp_path / "run" / "results.json").read_text())
    model = load_model(tmp_path / "run" / "model")
    module = ManifestDataModule(str(data), batch_size=8, num_workers=0, labels="optional")
    module.setup("fit")
    chunks: dict[str, list[torch.Tensor]] = {}
    with torch.no_grad():
        for batch in module.val_dataloader():
            for key, value in model.validation_outputs(model(batch), batch).items():
                chunks.setdefault(key, []).append(value)
    outputs = {key: torch.cat(values) for key, values in chunks.items()}
    assert 0 < int(outputs["paired"].sum()) < 15  # some rows lack their image
    expected = model.compute_metrics(outputs)
    for key in [*RETRIEVAL, "val/loss"]:
        assert results[key] == pytest.approx(expected[key.removeprefix("val/")], rel=1e-5, abs=1e-6), key
