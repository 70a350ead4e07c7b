"""Registry-driven tests: every registered model trains, handles a missing modality, and fails clearly."""

from __future__ import annotations

import copy
from collections.abc import Callable
from typing import Any

import pytest
import torch

from sss.models import HunterModule, create_model, list_models, model_class

ALL_MODELS = list_models()


def test_registry_lists_the_family() -> None:
    assert {"hunter_tiny", "hunter_small", "hunter_base"} <= set(ALL_MODELS)


@pytest.mark.parametrize("name", ALL_MODELS)
def test_forward_backward_every_parameter_gets_a_gradient(name: str, batch: dict[str, Any]) -> None:
    torch.manual_seed(0)
    model = create_model(name, num_classes=3)
    batch["label"] = batch["label"] % 3
    logits = model(batch)
    assert logits.shape == (2, 3)
    model.compute_loss(logits, batch).backward()
    no_grad = [n for n, p in model.named_parameters() if p.requires_grad and p.grad is None]
    assert not no_grad, f"parameters unused in a full forward: {no_grad}"
    bad = [n for n, p in model.named_parameters() if p.grad is not None and not torch.isfinite(p.grad).all()]
    assert not bad, f"non-finite gradients: {bad}"


@pytest.mark.parametrize("name", ALL_MODELS)
def test_model_class_and_num_classes(name: str) -> None:
    assert model_class(name) is HunterModule
    model = create_model(name, num_classes=7, fusion="late")
    assert isinstance(model, HunterModule) and model.num_classes == 7


@pytest.mark.parametrize("name", ALL_MODELS)
@pytest.mark.parametrize("missing", ["image", "audio"])
def test_one_modality_alone(name: str, missing: str, batch: dict[str, Any]) -> None:
    model = create_model(name).eval()
    del batch[missing]
    with torch.no_grad():
        assert model(batch).shape == (2, 4)


@pytest.mark.parametrize("fusion", ["cross_attention", "late"])
def test_missing_modality_trains(fusion: str, batch: dict[str, Any]) -> None:
    model = create_model("hunter_tiny", fusion=fusion)
    del batch["image"]
    model.training_step(batch, 0).backward()
    assert all(p.grad is None for p in model.image_encoder.parameters())
    assert all(p.grad is not None for p in model.audio_encoder.parameters())


def test_late_fusion_uses_every_parameter(batch: dict[str, Any]) -> None:
    model = create_model("hunter_tiny", fusion="late")
    model.training_step(batch, 0).backward()
    assert all(p.grad is not None for p in model.parameters())


def test_validation_step_gives_predictions(batch: dict[str, Any]) -> None:
    model = create_model("hunter_tiny").eval()
    with torch.no_grad():
        out = model.validation_step(batch, 0)
    assert set(out) == {"loss", "preds", "target"} and out["preds"].shape == (2,)


def test_unknown_override_is_named() -> None:
    with pytest.raises(TypeError, match=r"'image_encodr' \(did you mean 'image_encoder'\?\)"):
        create_model("hunter_small", image_encodr="resnet18")
    with pytest.raises(TypeError, match="'banana'"):
        create_model("hunter_tiny", banana=1)


def test_none_override_keeps_variant_default() -> None:
    assert create_model("hunter_tiny", dim=None).fusion_head.dim == 32


def test_unknown_fusion_and_backbone_are_named() -> None:
    with pytest.raises(ValueError, match=r"unknown fusion 'early'.*cross_attention, late"):
        create_model("hunter_tiny", fusion="early")
    with pytest.raises(ValueError, match=r"unknown timm model 'resnet10x'.*resnet10t"):
        create_model("hunter_tiny", image_encoder="resnet10x")


def test_missing_label_is_named(batch: dict[str, Any]) -> None:
    model = create_model("hunter_tiny")
    del batch["label"]
    with pytest.raises(KeyError, match=r"batch\['label'\]"):
        model.training_step(batch, 0)


@pytest.mark.parametrize("name", ["hunter_tiny", "hunter_small"])
def test_grad_checkpointing_gives_same_loss_and_grads(name: str, make_batch: Callable[..., dict[str, Any]]) -> None:
    batch = make_batch(batch_size=4)
    torch.manual_seed(0)
    plain = create_model(name, dropout=0.1)  # dropout: checkpointing must replay the same masks
    ckpt = copy.deepcopy(plain)
    ckpt.set_grad_checkpointing(True)
    losses = []
    for model in (plain, ckpt):
        torch.manual_seed(1)  # same SpecAugment masks and dropout draws in both runs
        loss = model.training_step(batch, 0)
        loss.backward()
        losses.append(loss.detach())
    torch.testing.assert_close(losses[0], losses[1], rtol=1e-5, atol=1e-7)
    for (n, p), q in zip(plain.named_parameters(), ckpt.parameters(), strict=True):
        torch.testing.assert_close(p.grad, q.grad, rtol=1e-5, atol=1e-7, msg=lambda m, n=n: f"{n}: {m}")


def test_grad_checkpointing_is_really_on() -> None:
    model = create_model("hunter_tiny")
    model.set_grad_checkpointing(True)
    assert model.image_encoder.model.grad_checkpointing
    assert model.audio_encoder.grad_checkpointing and model.fusion_head.grad_checkpointing
    model.set_grad_checkpointing(False)
    assert not model.image_encoder.model.grad_checkpointing


def test_any_image_size_and_clip_length(make_batch: Callable[..., dict[str, Any]]) -> None:
    model = create_model("hunter_tiny").eval()
    with torch.no_grad():
        for image_size, samples in ((32, 4000), (96, 16000)):
            assert model(make_batch(3, image_size, samples)).shape == (3, 4)


def test_train_step_learns_without_nan(make_batch: Callable[..., dict[str, Any]]) -> None:
    # A fixed batch must be memorised quickly; catches broken init, frozen parts, NaNs.
    torch.manual_seed(0)
    model = create_model("hunter_tiny", freq_mask=0, time_mask=0)
    batch = make_batch(batch_size=8)
    optimizer = torch.optim.AdamW(model.parameters(), lr=3e-3)
    losses = []
    for step in range(30):
        loss = model.training_step(batch, step)
        loss.backward()
        optimizer.step()
        optimizer.zero_grad()
        losses.append(loss.item())
    assert all(torch.isfinite(torch.tensor(losses)))
    assert losses[-1] < 0.5 * losses[0]
