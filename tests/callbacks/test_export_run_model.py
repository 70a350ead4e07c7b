"""`export_run_model`: the one model-folder export of a run (sss fit, HubPush, MLflow), EMA or trained weights."""

from __future__ import annotations

import pytest
import torch
from safetensors import safe_open
from safetensors.torch import load_file

from sss import SSSTrainer
from sss.callbacks import EMA
from sss.callbacks.export import export_run_model
from sss.config import SSSConfig, load_config, to_yaml
from sss.model_folder import export_model
from sss.testing import BoringModule, boring_loader

QUIET = {"mixed_precision": "no", "log": {"progress": False, "trackers": []}, "checkpoint": {"every_epoch": False}}
CFG = SSSConfig(name="boring", model={"_target_": "sss.testing.BoringModule"})


def _trained(tmp_path, callbacks=()):
    torch.manual_seed(0)
    module = BoringModule()
    trainer = SSSTrainer(max_steps=3, callbacks=list(callbacks), output_dir=str(tmp_path / "run"), **QUIET)
    trainer.fit(module, train_dataloaders=boring_loader())
    trainer.output_dir.mkdir(parents=True, exist_ok=True)
    return trainer, module


def _equal(a, b):
    return a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)


def _metadata(folder):
    with safe_open(str(folder / "model.safetensors"), "pt") as f:
        return f.metadata()


def _note(folder):
    return _metadata(folder).get("sss_weights")


def test_without_a_stored_config_it_writes_the_trained_weights_alone(tmp_path):
    trainer, module = _trained(tmp_path)
    folder = export_run_model(trainer, module, tmp_path / "model", trainer.state.metrics)
    assert sorted(p.name for p in folder.iterdir()) == ["model.safetensors"]
    assert _equal(load_file(str(folder / "model.safetensors")), module.state_dict())
    assert _note(folder) is None


def test_the_folder_is_export_models_with_the_stored_config_or_the_given_one(tmp_path):
    trainer, module = _trained(tmp_path)
    (trainer.output_dir / "config.yaml").write_text(to_yaml(CFG))  # what `sss fit` stores before training
    folder = export_run_model(trainer, module, tmp_path / "model", {"val/accuracy": 0.5})
    stored = load_config(trainer.output_dir / "config.yaml")
    direct = export_model(module, stored, {"val/accuracy": 0.5}, tmp_path / "direct", state_dict=module.state_dict())
    for name in ("config.yaml", "preprocessing.json"):  # the card has the export time
        assert (folder / name).read_bytes() == (direct / name).read_bytes(), name
    # safetensors writes its metadata in no fixed order: the tensors and the metadata are compared
    assert _equal(load_file(str(folder / "model.safetensors")), load_file(str(direct / "model.safetensors")))
    assert _metadata(folder) == _metadata(direct)
    given = SSSConfig(name="given", model={"_target_": "sss.testing.BoringModule"})
    other = export_run_model(trainer, module, tmp_path / "given", {}, cfg=given)
    assert (other / "README.md").read_text().startswith("# given\n")


@pytest.mark.parametrize("export", [True, False])
def test_with_ema_it_writes_the_average_only_when_ema_exports(tmp_path, export):
    ema = EMA(decay=0.5, export=export, eval=False)
    trainer, module = _trained(tmp_path, [ema])
    (trainer.output_dir / "config.yaml").write_text(to_yaml(CFG))
    folder = export_run_model(trainer, module, tmp_path / "model", trainer.state.metrics)
    weights = load_file(str(folder / "model.safetensors"))
    assert not _equal(ema.weights(), module.state_dict())
    assert _equal(weights, ema.weights() if export else module.state_dict())
    assert _note(folder) == ("ema (decay 0.5)" if export else None)
    assert ("- weights: ema (decay 0.5)" in (folder / "README.md").read_text()) is export


def test_every_process_gathers_and_only_the_main_one_writes(tmp_path, monkeypatch):
    trainer, module = _trained(tmp_path)
    gathers = []
    gather = trainer.accelerator.get_state_dict
    monkeypatch.setattr(trainer.accelerator, "get_state_dict", lambda model: gathers.append(model) or gather(model))
    monkeypatch.setattr(type(trainer.accelerator), "is_main_process", property(lambda self: False))
    assert export_run_model(trainer, module, tmp_path / "model", {}) is None
    assert gathers == [trainer.model] and not (tmp_path / "model").exists()
