"""`model.grad_checkpointing=true` turns activation checkpointing on from the YAML or the command line."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from sss.config import check_config, instantiate, load_config

EXAMPLE = Path(__file__).parents[2] / "examples" / "industrial.yaml"
BATCH = {"image": torch.randn(2, 3, 64, 64), "audio": torch.randn(2, 1, 8000), "label": torch.tensor([0, 1])}


def _built(*overrides: str):
    cfg = load_config(EXAMPLE, ["model.name=hunter_tiny", *overrides])
    assert check_config(cfg) == []  # `sss check` accepts the key
    return instantiate(cfg.model)


def _checkpointed_calls(model) -> int:
    calls = []
    original = torch.utils.checkpoint.checkpoint

    def counting(fn, *args, **kwargs):
        calls.append(fn)
        return original(fn, *args, **kwargs)

    with pytest.MonkeyPatch.context() as mp:
        for module in ("sss.models.audio.cnn", "sss.models.image.timm_encoder", "sss.models.fusion.cross_attention"):
            mp.setattr(f"{module}.checkpoint", counting)
        model.training_step(BATCH, 0).backward()
    return len(calls)


def test_grad_checkpointing_from_an_override_reaches_every_branch():
    model = _built("model.grad_checkpointing=true")
    parts = (model.image_encoder, model.audio_encoder, model.fusion_head)
    assert all(part.grad_checkpointing for part in parts)
    assert _checkpointed_calls(model) > 0  # the checkpointed path really runs


def test_grad_checkpointing_is_off_by_default_and_changes_no_weight():
    torch.manual_seed(0)
    plain = _built()
    torch.manual_seed(0)
    checkpointed = _built("model.grad_checkpointing=true")
    for (name, a), b in zip(plain.state_dict().items(), checkpointed.state_dict().values(), strict=True):
        assert torch.equal(a, b), name
    assert not any(part.grad_checkpointing for part in (plain.image_encoder, plain.audio_encoder, plain.fusion_head))
    assert _checkpointed_calls(plain) == 0
