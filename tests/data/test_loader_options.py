"""The loader keys of the data modules (pin_memory, persistent_workers, prefetch_factor) and the device copy."""

from __future__ import annotations

import pytest
import torch
from accelerate import Accelerator

from sss.config import ConfigError, TrainerConfig
from sss.config.instantiate import check_target
from sss.data import IndustrialDataModule, ManifestDataModule
from sss.data.folder import loader_options
from sss.trainer._setup import build_accelerator


def untyped_data(num_workers=0, pin_memory="auto", persistent_workers=None, prefetch_factor=None):
    """A data target without annotations: only the key table of sss.config.instantiate can judge its values."""


def test_auto_pins_for_cuda_only():
    assert loader_options(2, device="cuda") == {
        "num_workers": 2,
        "pin_memory": True,
        "persistent_workers": True,
        "prefetch_factor": None,
    }
    assert loader_options(2, device="cpu")["pin_memory"] is False
    assert loader_options(0, pin_memory=True, device="cpu")["pin_memory"] is True  # an explicit choice is kept
    cuda = loader_options(4, pin_memory=False, persistent_workers=False, prefetch_factor=3, device="cuda")
    assert cuda == {"num_workers": 4, "pin_memory": False, "persistent_workers": False, "prefetch_factor": 3}


def test_auto_follows_the_accelerators_device(monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    assert loader_options(0)["pin_memory"] is True  # no Accelerator yet: a CUDA machine pins
    Accelerator(cpu=True)  # trainer.cpu=true on that machine: batches stay on the CPU
    assert loader_options(0)["pin_memory"] is False


@pytest.mark.parametrize(
    ("kwargs", "key"),
    [
        ({"prefetch_factor": 4}, "data.prefetch_factor=4"),
        ({"persistent_workers": True}, "data.persistent_workers=true"),
    ],
)
def test_worker_keys_without_workers_name_the_key(kwargs, key):
    with pytest.raises(ConfigError, match=rf"{key} applies to worker processes only, and data.num_workers is 0"):
        loader_options(0, **kwargs)
    with pytest.raises(ConfigError, match=key):
        ManifestDataModule(num_workers=0, **kwargs)
    with pytest.raises(ConfigError, match=key):
        IndustrialDataModule(num_workers=0, **kwargs)
    assert loader_options(0, persistent_workers=False)["persistent_workers"] is False  # off is harmless


def test_industrial_passes_the_keys_through(tmp_path):
    dm = IndustrialDataModule(tmp_path / "ind", num_workers=1, persistent_workers=False, prefetch_factor=3)
    assert (dm.pin_memory, dm.persistent_workers, dm.prefetch_factor) == ("auto", False, 3)
    with pytest.raises(ConfigError, match=r"data\.pin_memory must be true, false or 'auto'"):
        loader_options(1, pin_memory="yes")


def test_key_table_judges_untyped_data_targets():
    spec = {"_target_": f"{__name__}.untyped_data", "pin_memory": "always", "prefetch_factor": 0, "num_workers": -1}
    problems = "\n".join(check_target(spec, "data"))
    assert "data.pin_memory: must be one of 'auto', got 'always'" in problems
    assert "data.prefetch_factor: must be >= 1 (or null), got 0" in problems
    assert "data.num_workers: must be >= 0, got -1" in problems
    assert check_target({"_target_": f"{__name__}.untyped_data", "pin_memory": "auto"}, "data") == []


def test_the_accelerator_copies_batches_without_blocking():
    assert build_accelerator(TrainerConfig(cpu=True, mixed_precision="no")).dataloader_config.non_blocking is True
