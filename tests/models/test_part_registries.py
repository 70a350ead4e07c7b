"""A fusion and an audio encoder of one's own: one new file, one decorator each, chosen by ``model.fusion=NAME``."""

from __future__ import annotations

import copy
import importlib
import sys
from pathlib import Path
from types import ModuleType

import pytest
import torch

from sss import SSSTrainer
from sss.config import check_config, instantiate, load_config
from sss.models import registry
from sss.models.registry import fusion_class, list_encoders, list_fusions
from sss.run.parts import build_parts

EXAMPLE = str(Path(__file__).parents[2] / "examples" / "industrial.yaml")
TINY = [
    "model.name=hunter_tiny",
    "data.n_train=16",
    "data.n_val=8",
    "data.n_test=8",
    "data.batch_size=8",
    "trainer.max_steps=2",
    "trainer.log.progress=false",
]

# The whole of what a user writes: one module, one decorator per part.
MY_PARTS = '''
"""My fusion (each stream gated by the other's mean) and my audio encoder (mel bins projected per frame)."""

import torch
from torch import nn

from sss.models import create_model  # noqa: F401  (so that `_target_: my_parts.create_model` imports this file)
from sss.models.base import TokenEncoder
from sss.models.fusion.base import FusionHead, check_tokens
from sss.models.registry import register_encoder, register_fusion


@register_fusion("gated")
class GatedFusion(FusionHead):
    def __init__(self, dim, num_classes=4, *, depth=1, heads=4, mlp_ratio=4.0, dropout=0.0, scale=1.0):
        super().__init__()
        self.scale = scale
        self.gate = nn.Linear(dim, dim)
        self.build_head(dim, num_classes, dropout)

    def fuse(self, image, audio):
        check_tokens(image, audio, self.dim)
        if image is None or audio is None:
            return image, audio
        image_gate = torch.sigmoid(self.scale * self.gate(audio.mean(1, keepdim=True)))
        audio_gate = torch.sigmoid(self.scale * self.gate(image.mean(1, keepdim=True)))
        return image * image_gate, audio * audio_gate


class MelFrames(TokenEncoder):
    def __init__(self, dim, frontend):
        super().__init__(output_dim=dim)
        self.frontend = frontend
        self.proj = nn.LazyLinear(dim)

    def encode(self, x):
        return self.proj(self.frontend(x)[:, 0].transpose(1, 2))  # [B, 1, M, T] -> [B, T, dim]


@register_encoder("audio", "mel_frames")
def mel_frames(settings):
    return MelFrames(settings.dim, settings.frontend)
'''


@pytest.fixture
def parts_file(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """`MY_PARTS` as the importable module ``my_parts`` (not imported yet); the registries are restored afterwards."""
    (tmp_path / "my_parts.py").write_text(MY_PARTS)
    monkeypatch.syspath_prepend(str(tmp_path))
    # The registries are process-wide: register into copies, so other tests see the stock parts only.
    monkeypatch.setattr(registry, "_FUSIONS", dict(registry._FUSIONS))
    monkeypatch.setattr(registry, "_ENCODERS", copy.deepcopy(registry._ENCODERS))
    monkeypatch.delitem(sys.modules, "my_parts", raising=False)
    return tmp_path / "my_parts.py"


@pytest.fixture
def my_parts(parts_file: Path) -> ModuleType:
    """`MY_PARTS` imported."""
    return importlib.import_module("my_parts")


def test_a_fusion_in_its_own_file_is_chosen_by_name_checked_and_trained(my_parts: ModuleType) -> None:
    assert "gated" in list_fusions() and fusion_class("gated") is my_parts.GatedFusion
    cfg = load_config(EXAMPLE, [*TINY, "model.fusion=gated", "model.fusion_kwargs={scale: 2.0}"])
    assert check_config(cfg) == []  # what `sss check` runs
    fusion = instantiate(cfg.model).fusion_head
    assert type(fusion) is my_parts.GatedFusion and fusion.scale == 2.0 and fusion.gate.in_features == 32

    parts = build_parts(cfg)
    before = parts.module.fusion_head.gate.weight.detach().clone()
    trainer = SSSTrainer(cfg.trainer)
    trainer.fit(parts.module, parts.datamodule)
    assert trainer.state.global_step == 2
    assert not torch.equal(before, parts.module.fusion_head.gate.weight)  # the fusion's own layer trained


def test_naming_the_factory_through_the_parts_module_imports_and_registers_them(parts_file: Path) -> None:
    # What `sss check` / `sss fit` need when nothing imported the module before: the spec's _target_ does.
    assert "gated" not in list_fusions()
    cfg = load_config(EXAMPLE, [*TINY, "model._target_=my_parts.create_model", "model.fusion=gated"])
    assert check_config(cfg) == []
    assert type(instantiate(cfg.model).fusion_head).__name__ == "GatedFusion"
    bad = load_config(EXAMPLE, [*TINY, "model._target_=my_parts.create_model", "model.fusion=gated", "model.dim=31"])
    assert check_config(bad) == ["model.dim: dim=31 must be divisible by heads=2 (model.dim / model.heads)"]


def test_an_audio_encoder_in_its_own_file_is_chosen_by_name(my_parts: ModuleType) -> None:
    assert "mel_frames" in list_encoders("audio")
    cfg = load_config(EXAMPLE, [*TINY, "model.audio_encoder=mel_frames", "model.fusion=late"])
    assert check_config(cfg) == []
    model = instantiate(cfg.model)
    assert type(model.audio_encoder) is my_parts.MelFrames
    assert model.audio_encoder.frontend.n_mels == 32  # the model's front-end, built for every audio encoder
    out = model({"image": torch.randn(2, 3, 32, 32), "audio": torch.randn(2, 1, 8000)})
    assert out["logits"].shape == (2, 4)


def test_an_unknown_fusion_is_refused_naming_the_registered_ones(my_parts: ModuleType) -> None:
    cfg = load_config(EXAMPLE, [*TINY, "model.fusion=gatd"])
    why = "unknown fusion 'gatd' (did you mean 'gated'?); choose one of bottleneck, cross_attention, gated, late"
    assert check_config(cfg) == [f"model.fusion: {why} (model.fusion)"]
    with pytest.raises(ValueError, match=r"unknown fusion 'gatd' .*; choose one of bottleneck, .*gated, late"):
        instantiate(cfg.model)
    with pytest.raises(KeyError, match="unknown fusion 'nope'; registered fusions: bottleneck, cross_attention"):
        fusion_class("nope")


def test_a_fusion_that_needs_both_modalities_is_refused_for_one(my_parts: ModuleType) -> None:
    # GatedFusion keeps FusionHead's needs_both_modalities = True; the hint names the fusions that do not.
    cfg = load_config(EXAMPLE, [*TINY, "model.fusion=gated", "model.modalities=[audio]"])
    assert check_config(cfg) == [
        "model.fusion: fusion='gated' fuses two modalities; with modalities=['audio'] use model.fusion=late"
    ]


def test_a_name_is_registered_once() -> None:
    with pytest.raises(ValueError, match="a fusion named 'late' is already registered"):
        registry.register_fusion("late")(type("Other", (), {}))
    with pytest.raises(ValueError, match="audio: an encoder named 'cnn' is already registered"):
        registry.register_encoder("audio", "cnn")(lambda settings: None)
