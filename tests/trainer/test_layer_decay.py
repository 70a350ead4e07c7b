"""trainer.optim.layer_decay / head_lr_scale: each tower its own depth map, the LR set on the param groups (so
every scheduler applies it: timm #2532), composing with trainer.optim.param_groups; off, the groups are as before."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from sss import SSSTrainer
from sss.config import OptimConfig
from sss.models import TimmImageEncoder
from sss.models.audio import AudioCNN
from sss.testing import BoringModule, boring_loader
from sss.trainer._setup import build_optimizer
from sss.trainer.finetune import depth_map

ADAMW = {"_target_": "torch.optim.AdamW", "lr": 0.1, "weight_decay": 0.01}


class _HFStyle(nn.Module):
    """Names as Hugging Face prints them: embeddings, encoder.layer.N, a final layernorm."""

    def __init__(self, layers: int) -> None:
        super().__init__()
        self.embeddings = nn.Linear(2, 4)
        self.encoder = nn.Module()
        self.encoder.layer = nn.ModuleList(nn.Linear(4, 4) for _ in range(layers))
        self.layernorm = nn.LayerNorm(4)


class _Towers(BoringModule):
    def __init__(self) -> None:
        super().__init__()
        self.image_encoder = TimmImageEncoder(
            "vit_tiny_patch16_224",
            dim=8,
            model_kwargs={"depth": 2, "embed_dim": 16, "num_heads": 2, "img_size": 32},
        )
        self.audio_encoder = nn.Sequential()
        self.audio_encoder.add_module("hf", _HFStyle(layers=4))


def test_each_tower_has_its_own_depth_map():
    table = depth_map(_Towers())
    # the timm ViT through its group_matcher: stem 0, blocks 1-2, the final norm with the last block (timm's
    # MATCH_PREV_GROUP); sss's projection after the blocks takes the top layer; the HF tower: embeddings 0,
    # encoder.layer.N is N + 1, the final norm the top
    assert table["image_encoder.model.cls_token"] == ("image_encoder", 0, 2)
    assert table["image_encoder.model.blocks.1.attn.qkv.weight"] == ("image_encoder", 2, 2)
    assert table["image_encoder.model.norm.weight"] == ("image_encoder", 2, 2)
    assert table["image_encoder.proj.weight"] == ("image_encoder", 2, 2)
    assert table["audio_encoder.hf.embeddings.weight"] == ("audio_encoder", 0, 4)
    assert table["audio_encoder.hf.encoder.layer.3.weight"] == ("audio_encoder", 4, 4)
    assert table["audio_encoder.hf.layernorm.weight"] == ("audio_encoder", 4, 4)  # one map would merge the two
    assert table["fusion_head.head.weight"] == ("heads", 0, 0)


def test_a_name_the_timm_matcher_misses_takes_its_neighbours_depth_not_the_top():
    class Model(nn.Module):  # timm #2712: a token its group_matcher omits was left undecayed on top
        def __init__(self) -> None:
            super().__init__()
            self.reg_token = nn.Parameter(torch.zeros(4))
            self.patch_embed = nn.Linear(2, 4)
            self.blocks = nn.ModuleList(nn.Linear(4, 4) for _ in range(2))
            self.head_norm = nn.LayerNorm(4)

        def group_matcher(self, coarse: bool = False) -> dict:
            return {"stem": r"^patch_embed", "blocks": r"^blocks\.(\d+)"}

    tower = nn.Module()
    tower.model = Model()
    table = depth_map(nn.ModuleDict({"image_encoder": tower}))
    assert table["image_encoder.model.reg_token"] == ("image_encoder", 0, 2)  # before the first block
    assert table["image_encoder.model.blocks.0.weight"] == ("image_encoder", 1, 2)
    assert table["image_encoder.model.head_norm.weight"] == ("image_encoder", 2, 2)  # after the last block


def test_audio_cnn_blocks_are_its_layers():
    table = depth_map(nn.ModuleDict({"audio_encoder": AudioCNN(dim=8)}))
    assert table["audio_encoder.blocks.0.conv1.weight"] == ("audio_encoder", 1, 3)
    assert table["audio_encoder.proj.weight"] == ("audio_encoder", 3, 3)


def _lrs(optimizer) -> dict[str, float]:
    return {g["name"]: g["lr"] for g in optimizer.param_groups}


def test_the_lr_of_each_group_is_decayed_from_the_top_of_its_tower_and_scaled_above():
    optim = OptimConfig(optimizer=ADAMW, layer_decay=0.5, head_lr_scale=10.0)
    optimizer, _ = build_optimizer(optim, _Towers(), 10)
    lrs = _lrs(optimizer)
    assert lrs["image_encoder.L0"] == pytest.approx(0.1 * 0.5**3)  # decay ** (depth + 1 - layer)
    assert lrs["image_encoder.L2"] == pytest.approx(0.1 * 0.5)
    assert lrs["audio_encoder.L0"] == pytest.approx(0.1 * 0.5**5)
    assert lrs["audio_encoder.L4"] == pytest.approx(0.1 * 0.5)
    assert lrs["heads"] == pytest.approx(1.0)
    decays = {(g["name"], g["weight_decay"]) for g in optimizer.param_groups}
    assert ("heads", 0.01) in decays and ("heads", 0.0) in decays  # biases and norms keep no decay


def test_every_scheduler_applies_it_because_it_is_the_groups_lr():
    optim = OptimConfig(
        optimizer=ADAMW,
        scheduler={"_target_": "torch.optim.lr_scheduler.StepLR", "step_size": 1, "gamma": 0.5},
        layer_decay=0.5,
    )
    optimizer, scheduler = build_optimizer(optim, BoringModule(), 10)
    optimizer.step()
    scheduler.step()
    lrs = _lrs(optimizer)  # the towers have no blocks: one layer each, decayed once
    assert lrs["image_encoder.L0"] == pytest.approx(0.1 * 0.5 * 0.5) and lrs["heads"] == pytest.approx(0.1 * 0.5)


def test_param_groups_rules_set_the_lr_first_then_the_scales_multiply_it():
    rules = [{"params": "audio_encoder.*", "lr": 0.01, "name": "audio"}]
    optim = OptimConfig(optimizer=ADAMW, param_groups=rules, layer_decay=0.5, head_lr_scale=3.0)
    lrs = _lrs(build_optimizer(optim, BoringModule(), 10)[0])
    assert lrs["audio.audio_encoder.L0"] == pytest.approx(0.01 * 0.5)
    assert lrs["heads"] == pytest.approx(0.3) and lrs["image_encoder.L0"] == pytest.approx(0.05)


def test_without_the_settings_the_groups_are_parameter_groups_unchanged():
    module = BoringModule()
    optimizer, _ = build_optimizer(OptimConfig(optimizer=ADAMW), module, 10)
    expected = module.parameter_groups(0.01)
    assert [[id(p) for p in g["params"]] for g in optimizer.param_groups] == [
        [id(p) for p in g["params"]] for g in expected
    ]
    assert all("name" not in g for g in optimizer.param_groups)
    assert {g["lr"] for g in optimizer.param_groups} == {0.1}


def test_the_group_table_is_printed_once_at_fit_start(capsys):
    trainer = SSSTrainer(
        max_steps=2,
        mixed_precision="no",
        log={"progress": False, "trackers": []},
        checkpoint={"every_epoch": False},
        optim={"optimizer": ADAMW, "layer_decay": 0.75},
    )
    trainer.fit(BoringModule(), train_dataloaders=boring_loader())
    out = capsys.readouterr().out
    assert out.count("sss: optimizer groups") == 1
    assert "image_encoder.L0" in out and "heads" in out
