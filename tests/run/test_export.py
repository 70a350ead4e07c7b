"""Export round trip: the model folder predicts what the trainer's module predicts."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

import sss
from sss.callbacks.stock import add_stock_callbacks
from sss.checkpoint import complete_checkpoints
from sss.cli import main
from sss.config import SSSConfig
from sss.model_folder import export_model
from sss.run.export import export_checkpoint
from sss.testing import BoringModule, boring_loader

CFG = SSSConfig(name="boring", model={"_target_": "sss.testing.BoringModule", "dim": 8})


def _trained(tmp_path) -> tuple[sss.SSSTrainer, BoringModule]:
    module = BoringModule(dim=8)
    trainer = add_stock_callbacks(
        sss.SSSTrainer(
            max_steps=6,
            mixed_precision="no",
            output_dir=str(tmp_path / "run"),
            log={"progress": False, "trackers": []},
            checkpoint={"every_n_steps": 3},
        )
    )
    trainer.fit(module, train_dataloaders=boring_loader(n=32), val_dataloaders=boring_loader(n=8, seed=1))
    return trainer, module


def test_exported_folder_predicts_like_the_trainer(tmp_path):
    trainer, module = _trained(tmp_path)
    folder = export_model(module, CFG, dict(trainer.state.metrics), tmp_path / "model")
    loaded = sss.load_model(folder)
    batch = next(iter(boring_loader(n=16, seed=3, batch_size=16)))
    module.eval()
    with torch.no_grad():
        torch.testing.assert_close(loaded(batch), module(batch), rtol=1e-6, atol=0)
    card = (folder / "README.md").read_text()
    assert "val/accuracy" in card and "BoringModule" in card and "seed 42" in card


def test_export_from_a_checkpoint_equals_the_module_at_that_step(tmp_path):
    _, module = _trained(tmp_path)
    last = complete_checkpoints(tmp_path / "run" / "checkpoints")[-1]
    folder = export_checkpoint(CFG, last, tmp_path / "exported")
    loaded = sss.load_model(folder)
    for a, b in zip(loaded.state_dict().values(), module.state_dict().values(), strict=True):
        assert torch.equal(a, b)
    with pytest.raises(FileExistsError, match="already exists and is not empty"):
        export_checkpoint(CFG, last, tmp_path / "exported")


def test_cli_export_and_its_errors(tmp_path, capsys):
    _trained(tmp_path)
    last = complete_checkpoints(tmp_path / "run" / "checkpoints")[-1]
    config = tmp_path / "boring.yaml"
    config.write_text(
        "name: boring\nmodel:\n  _target_: sss.testing.BoringModule\n  dim: 8\n"
        "data:\n  _target_: sss.testing.BoringDataset\n  n: 8\n"
    )
    local = f"trainer.output_dir={tmp_path / 'run'}"  # an absolute local path: not published in the folder
    assert main(["export", str(config), str(tmp_path / "out"), local, "--ckpt", str(last)]) == 0
    written = {p.name for p in (tmp_path / "out").iterdir()}
    assert written == {"model.safetensors", "config.yaml", "preprocessing.json", "README.md"}
    for name in ("config.yaml", "README.md"):
        assert str(tmp_path) not in (tmp_path / "out" / name).read_text()
    assert main(["check", str(tmp_path / "out")]) == 0  # loads without trust_code
    assert main(["export", str(config), str(tmp_path / "out"), "--ckpt", str(last)]) == 1
    assert "already exists" in capsys.readouterr().err
    assert main(["export", str(config), str(tmp_path / "o2"), "--ckpt", str(tmp_path)]) == 1
    assert "not a complete sss checkpoint" in capsys.readouterr().err
    assert main(["export", str(config), str(tmp_path / "o3"), "model.dim=4", "--ckpt", str(last)]) == 1
    assert "does not fit the model" in capsys.readouterr().err


def test_load_model_names_what_is_missing(tmp_path):
    with pytest.raises(FileNotFoundError, match=r"model\.safetensors is missing"):
        sss.load_model(tmp_path)
    assert not Path(tmp_path / "model.safetensors").exists()
