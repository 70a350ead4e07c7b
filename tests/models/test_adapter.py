"""model.adapter: LoRA (PEFT) on the Conv2d layers of the audio CNN and the Linear layers of the sss AST, the frozen /
trainable split and its count, the refusals (a target matching nothing, a target without layers, unknown keys),
and the merge for export: plain weights whose outputs equal the adapted module's to 1e-5."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from torch import nn

from sss.config import ConfigError, OptimConfig, check_config, instantiate, load_config
from sss.models import create_model
from sss.models.adapter import adapted_layers, apply_adapter, merged_copy
from sss.trainer._setup import build_optimizer

INDUSTRIAL = str(Path(__file__).parents[2] / "examples" / "industrial.yaml")
LORA = {"type": "lora", "r": 4, "alpha": 8, "dropout": 0.0, "target": ["audio_encoder"]}


def _hunter(audio_encoder: str = "cnn") -> nn.Module:
    torch.manual_seed(0)
    return create_model("hunter_tiny", num_classes=3, audio_encoder=audio_encoder, dim=32, heads=4)


def _perturb(module: nn.Module) -> None:
    # LoRA starts at B = 0 (the adapted layer equals the plain one): train-like values make the merge matter.
    gen = torch.Generator().manual_seed(1)
    with torch.no_grad():
        for name, p in module.named_parameters():
            if ".lora_" in name:
                p.copy_(0.2 * torch.randn(p.shape, generator=gen))


@pytest.mark.parametrize(("audio_encoder", "kind"), [("cnn", nn.Conv2d), ("ast", nn.Linear)])
def test_lora_goes_on_the_targets_layers_and_trains_them_and_what_is_above_only(audio_encoder, kind):
    module = _hunter(audio_encoder)
    layers_before = {n: type(m) for n, m in module.named_modules() if isinstance(m, (nn.Linear, nn.Conv2d))}
    summary = apply_adapter(module, LORA)
    assert type(module).__name__ == "HunterModule"  # the LitModule itself: compute_loss, training_step are its own
    assert summary.layers == [n for n in layers_before if n.startswith("audio_encoder.")]
    assert kind in {layers_before[n] for n in summary.layers} and adapted_layers(module) == summary.layers
    for name, p in module.named_parameters():
        expected = ".lora_" in name or not name.startswith("audio_encoder.")
        assert p.requires_grad == expected, name  # the image encoder, fusion and the fresh head still train
    trainable = sum(p.numel() for p in module.parameters() if p.requires_grad)
    assert (summary.trainable, summary.total) == (trainable, sum(p.numel() for p in module.parameters()))
    assert summary.line().endswith(
        f"trainable parameters: {trainable:,} of {summary.total:,} ({100 * trainable / summary.total:.2f} %)"
    )
    optimizer, _ = build_optimizer(OptimConfig(), module, total_steps=1)  # the wrapped module's trainable params
    held = {id(p) for g in optimizer.param_groups for p in g["params"]}
    assert held == {id(p) for p in module.parameters() if p.requires_grad}


def test_a_glob_targets_only_the_layers_it_names():
    module = _hunter("ast")
    summary = apply_adapter(module, {**LORA, "target": "audio_encoder.blocks.*.attn.qkv"})
    assert summary.layers == ["audio_encoder.blocks.0.attn.qkv", "audio_encoder.blocks.1.attn.qkv"]
    assert module.audio_encoder.blocks[0].mlp.fc1.weight.requires_grad  # outside the target: as it was


@pytest.mark.parametrize(
    ("target", "message"),
    [
        (
            "audio_encodr",
            r"'audio_encodr' matches no module of HunterModule \(did you mean 'audio_encoder'\?\); "
            r"its modules start with audio_encoder, fusion_head, image_encoder",
        ),
        ("audio_encoder.frontend", r"'audio_encoder.frontend' holds no Linear, Conv1d or Conv2d layer \(it holds "),
    ],
)
def test_a_target_that_matches_nothing_or_holds_no_layer_is_one_error_naming_it(target, message):
    module = _hunter("ast")
    before = {k: v.clone() for k, v in module.state_dict().items()}
    with pytest.raises(ConfigError, match=r"^model.adapter.target: " + message):
        apply_adapter(module, {**LORA, "target": [target]})
    assert not adapted_layers(module) and all(p.requires_grad for p in module.parameters())
    assert all(torch.equal(v, before[k]) for k, v in module.state_dict().items())


def test_unknown_keys_and_types_and_a_second_adapter_are_refused():
    with pytest.raises(ConfigError, match=r"model.adapter.type: must be one of 'lora', got 'ia3'"):
        apply_adapter(_hunter(), {**LORA, "type": "ia3"})
    with pytest.raises(ConfigError, match=r"model.adapter.rank: unknown setting; valid: type, r, alpha"):
        apply_adapter(_hunter(), {**LORA, "rank": 4})
    module = _hunter()
    apply_adapter(module, LORA)
    with pytest.raises(ConfigError, match="already has LoRA adapters"):
        apply_adapter(module, LORA)


@pytest.mark.parametrize("audio_encoder", ["cnn", "ast"])
def test_the_merged_model_is_plain_and_its_outputs_equal_the_adapted_ones(audio_encoder, make_batch):
    module = _hunter(audio_encoder)
    apply_adapter(module, LORA)
    _perturb(module)
    plain = merged_copy(module)
    assert not any("lora_" in k or "base_layer" in k for k in plain.state_dict())
    assert adapted_layers(module) and not adapted_layers(plain)  # the trained module keeps its adapters
    fresh = _hunter(audio_encoder)  # what load_model builds from the exported config: no adapter
    fresh.load_state_dict(plain.state_dict())  # strict: the same names and shapes
    batch = make_batch(samples=16000)
    module.eval(), fresh.eval()
    with torch.no_grad():
        got, want = fresh(batch), module(batch)
    assert not torch.allclose(want["logits"], _plain_logits(audio_encoder, batch), atol=1e-3)  # the adapter counts
    torch.testing.assert_close(got["logits"], want["logits"], atol=1e-5, rtol=1e-5)


def _plain_logits(audio_encoder: str, batch: dict) -> torch.Tensor:
    with torch.no_grad():
        return _hunter(audio_encoder).eval()(batch)["logits"]


def test_dotted_overrides_make_the_mapping_and_check_config_judges_it_without_building():
    overrides = ["model.adapter.type=lora", "model.adapter.r=4", "model.adapter.target=[audio_encoder]"]
    cfg = load_config(INDUSTRIAL, overrides)
    assert cfg.model["adapter"] == {"type": "lora", "r": 4, "target": ["audio_encoder"]}
    assert check_config(cfg) == []
    bad = load_config(INDUSTRIAL, [*overrides, "model.adapter.r=0", "model.adapter.dropuot=0.1"])
    assert check_config(bad) == [
        "model.adapter.dropuot: unknown setting (did you mean 'dropout'?); valid: type, r, alpha, dropout, target",
        "model.adapter.r: must be >= 1, got 0",
    ]
    missing = load_config(INDUSTRIAL, ["model.adapter.r=4"])
    assert check_config(missing) == [
        "model.adapter.type: missing; set it, e.g. model.adapter.type=lora",
        "model.adapter.target: missing; set it, e.g. model.adapter.target=[audio_encoder]",
    ]


def test_build_parts_wraps_the_model_and_keeps_the_adapter_in_the_runs_config(capsys):
    from sss.run.parts import build_parts

    cfg = load_config(None, ["model._target_=sss.testing.BoringModule", "data._target_=sss.testing.BoringDataModule"])
    cfg.model["adapter"] = {"type": "lora", "r": 2, "target": ["audio_encoder"]}
    parts = build_parts(cfg)
    assert adapted_layers(parts.module) == ["audio_encoder.1"]
    assert cfg.model["adapter"]["r"] == 2  # stored with the run: a resume, validate or export rebuilds the adapter
    assert "sss: LoRA r=2 on 1 layers under audio_encoder; trainable parameters: " in capsys.readouterr().out
    with pytest.raises(TypeError):  # it is no argument of the model: instantiate alone would refuse it
        instantiate(cfg.model)
