"""Samples without a modality: the model never reads the placeholder, the losses and metrics leave it out."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import torch
from safetensors.torch import save_file

from sss.model_folder import load_trained_weights
from sss.models import create_model
from sss.models.fusion.bottleneck import BottleneckFusion
from sss.models.fusion.cross_attention import CrossModalFusion
from sss.models.fusion.late import LateFusion
from sss.testing import count_host_syncs

FUSIONS = ["cross_attention", "bottleneck", "late"]
HEADS = {"num_event_classes": 2, "mask_head": True, "unimodal_heads": True}
IMAGE_PRESENT = torch.tensor([True, False, True, True, True, False])
AUDIO_PRESENT = torch.tensor([True, True, False, True, False, True])


def _masked(batch: dict[str, Any], placeholder: str) -> dict[str, Any]:
    """`batch` with samples 1, 5 without image and 2, 4 without audio; placeholders zeros or noise."""
    out = {**batch, "image_present": IMAGE_PRESENT.clone(), "audio_present": AUDIO_PRESENT.clone()}
    gen = torch.Generator().manual_seed(7)
    for key, present in (("image", IMAGE_PRESENT), ("audio", AUDIO_PRESENT)):
        value = batch[key].clone()
        fill = torch.zeros_like(value) if placeholder == "zeros" else 50 * torch.randn(value.shape, generator=gen)
        value[~present] = fill[~present]
        out[key] = value
    return out


@pytest.mark.parametrize("fusion", FUSIONS)
@pytest.mark.parametrize("mode", ["train", "eval"])
def test_no_output_depends_on_an_absent_modality_placeholder(
    fusion: str, mode: str, make_batch: Callable[..., dict[str, Any]]
) -> None:
    batch = make_batch(batch_size=6, event_classes=2, mask=True)
    model = create_model("hunter_tiny", num_classes=4, fusion=fusion, **HEADS).train(mode == "train")
    outputs = []
    for placeholder in ("zeros", "noise"):
        torch.manual_seed(0)  # the same SpecAugment draws
        outputs.append(model(_masked(batch, placeholder)))
    assert sorted(outputs[0]) == sorted(outputs[1])
    for key in outputs[0]:
        assert torch.equal(outputs[0][key], outputs[1][key]), key
    # The encoders' BatchNorm statistics never saw a placeholder either.
    if mode == "train":
        for placeholder in ("zeros", "noise"):
            fresh = create_model("hunter_tiny", num_classes=4, fusion=fusion, **HEADS)
            torch.manual_seed(0)
            fresh(_masked(batch, placeholder))
            outputs.append(torch.cat([b for n, b in fresh.named_buffers() if "running_mean" in n]))
        assert torch.equal(outputs[2], outputs[3])


@pytest.mark.parametrize("cls", [CrossModalFusion, BottleneckFusion, LateFusion])
def test_each_fusion_takes_the_masks(cls: type) -> None:
    torch.manual_seed(0)
    fusion = cls(dim=8, num_classes=3, heads=2).eval()
    image, audio = torch.randn(4, 5, 8), torch.randn(4, 6, 8)
    image_present, audio_present = torch.tensor([True, False, True, True]), torch.tensor([True, True, False, True])
    a = fusion(image, audio, image_present, audio_present)
    b = fusion(image * 100 - 3, audio * -7, image_present, audio_present)
    assert not torch.equal(a[[0, 3]], b[[0, 3]])  # the complete samples read their (changed) tokens
    c = fusion(
        torch.where(image_present.view(-1, 1, 1), image, 9.0),
        torch.where(audio_present.view(-1, 1, 1), audio, -9.0),
        image_present,
        audio_present,
    )
    assert torch.equal(a, c)  # only the absent samples' tokens changed, and nothing reads them
    # every sample present: the masks change nothing, bit for bit
    ones = torch.ones(4, dtype=torch.bool)
    assert torch.equal(fusion(image, audio), fusion(image, audio, ones, ones))


def test_an_absent_modality_reads_as_the_learned_embedding(make_batch: Callable[..., dict[str, Any]]) -> None:
    batch = make_batch(batch_size=6)
    model = create_model("hunter_tiny", num_classes=4).eval()
    before = model(_masked(batch, "zeros"))["logits"]
    with torch.no_grad():
        model.fusion_head.missing.tokens["audio"].add_(1.0)
    after = model(_masked(batch, "zeros"))["logits"]
    no_audio = ~AUDIO_PRESENT
    assert not torch.equal(before[no_audio], after[no_audio])
    assert torch.equal(before[~no_audio], after[~no_audio])


@pytest.mark.parametrize("absent", ["some", "all_audio", "none"])
def test_every_parameter_gets_a_gradient(absent: str, make_batch: Callable[..., dict[str, Any]]) -> None:
    # DDP (find_unused_parameters=False) and the trainer's first-step check need every parameter in the graph.
    batch = _masked(make_batch(batch_size=6, event_classes=2, mask=True), "noise")
    if absent == "all_audio":
        batch["audio_present"] = torch.zeros(6, dtype=torch.bool)
        batch["image_present"] = torch.ones(6, dtype=torch.bool)
    if absent == "none":
        batch = {k: v for k, v in batch.items() if not k.endswith("_present")}
    model = create_model("hunter_tiny", num_classes=4, **HEADS)
    model.training_step(batch, 0).backward()
    assert [n for n, p in model.named_parameters() if p.grad is None] == []
    grad = model.fusion_head.missing.tokens["audio"].grad
    assert (grad.abs().sum() > 0) == (absent != "none")


def test_losses_leave_out_the_samples_without_the_modality(make_batch: Callable[..., dict[str, Any]]) -> None:
    batch = _masked(make_batch(batch_size=6, event_classes=2, mask=True), "zeros")
    model = create_model("hunter_tiny", num_classes=4, **HEADS).eval()
    outputs = model(batch)
    other = {**batch}
    other["mask"] = batch["mask"].clone()
    other["mask"][~IMAGE_PRESENT] = 1 - other["mask"][~IMAGE_PRESENT]
    other["events"] = batch["events"].clone()
    other["events"][~AUDIO_PRESENT] = 1 - other["events"][~AUDIO_PRESENT]
    other["label"] = batch["label"].clone()
    losses, changed = model.task_losses(outputs, batch), model.task_losses(outputs, other)
    assert set(losses) == {"label", "events", "mask", "image_head", "audio_head"}
    for key in ("events", "mask", "image_head", "audio_head"):
        assert torch.equal(losses[key], changed[key]), key
    # the audio head is scored on the samples with audio only
    labels = batch["label"].clone()
    labels[~AUDIO_PRESENT] = (labels[~AUDIO_PRESENT] + 1) % 4
    assert torch.equal(model.task_losses(outputs, {**batch, "label": labels})["audio_head"], losses["audio_head"])


def test_unimodal_heads_report_their_metrics_and_take_loss_weights(make_batch: Callable[..., dict[str, Any]]) -> None:
    batch = _masked(make_batch(batch_size=6), "zeros")
    model = create_model("hunter_tiny", num_classes=4, unimodal_heads=True, loss_weights={"audio_head": 0.0}).eval()
    outputs = model(batch)
    losses = model.task_losses(outputs, batch)
    assert torch.equal(model.compute_loss(outputs, batch), losses["label"] + losses["image_head"])
    metrics = model.compute_metrics(model.validation_outputs(outputs, batch))
    assert {"accuracy", "image_head/accuracy", "audio_head/accuracy"} <= set(metrics)
    scores = outputs["logits_image"][IMAGE_PRESENT].argmax(-1)
    expected = float((scores == batch["label"][IMAGE_PRESENT]).float().mean())
    assert metrics["image_head/accuracy"] == pytest.approx(expected)
    with pytest.raises(ValueError, match="unknown loss_weights key"):
        create_model("hunter_tiny", loss_weights={"image_heads": 1.0})


def test_weights_from_before_the_missing_embeddings_still_load(tmp_path: Path) -> None:
    model = create_model("hunter_tiny", num_classes=4)
    old = {k: v.contiguous() for k, v in model.state_dict().items() if ".missing." not in k}
    save_file(old, str(tmp_path / "model.safetensors"))
    fresh = create_model("hunter_tiny", num_classes=4)
    load_trained_weights(fresh, tmp_path, "")
    assert all(torch.equal(v, fresh.state_dict()[k]) for k, v in old.items())
    save_file({k: v for k, v in old.items() if "fusion_head.head." not in k}, str(tmp_path / "model.safetensors"))
    with pytest.raises(RuntimeError, match=r"fusion_head\.head"):
        load_trained_weights(fresh, tmp_path, "")


def test_modality_dropout_waits_for_no_device_value(make_batch: Callable[..., dict[str, Any]]) -> None:
    # Dropout's absences are drawn on the device and read only by torch.where: a step stays free of host syncs.
    # A batch with presence masks costs one read per modality (which path to take), the nonzero of the
    # present samples where some lack it.
    model = create_model("hunter_tiny", num_classes=4, modality_dropout={"image": 0.3, "audio": 0.3})
    batch = make_batch(batch_size=6)
    with count_host_syncs() as syncs:
        model.training_step(batch, 0)
    assert len(syncs) == 0, syncs.report(syncs.records)
    with count_host_syncs() as syncs:
        model.training_step(_masked(batch, "zeros"), 0)
    assert [r.kind for r in syncs.records] == ["item", "item", "nonzero", "nonzero"], syncs.report(syncs.records)
