"""Registry-driven tests: every registered model trains with every head, handles a missing modality, fails clearly."""

from __future__ import annotations

import copy
import itertools
from collections.abc import Callable
from typing import Any

import pytest
import torch

from sss.models import HunterModule, create_model, list_models, model_class

FUSIONS = ("bottleneck", "cross_attention", "late")  # the stock ones: a test may register more
AUDIO_ENCODERS = ("ast", "cnn")
ALL_MODELS = list_models("hunter_*")  # the supervised models (contrastive_*: tests/models/test_contrastive.py)
COMBOS = list(itertools.product(FUSIONS, AUDIO_ENCODERS))
COMBO_IDS = [f"{fusion}-{audio}" for fusion, audio in COMBOS]
HEADS = {"num_event_classes": 2, "mask_head": True}


def _grads(model: torch.nn.Module) -> tuple[list[str], list[str]]:
    missing = [n for n, p in model.named_parameters() if p.requires_grad and p.grad is None]
    bad = [n for n, p in model.named_parameters() if p.grad is not None and not torch.isfinite(p.grad).all()]
    return missing, bad


def test_registry_lists_the_family() -> None:
    assert {"hunter_tiny", "hunter_small", "hunter_base"} <= set(ALL_MODELS)


@pytest.mark.parametrize("name", ALL_MODELS)
def test_forward_backward_every_head_and_parameter(name: str, make_batch: Callable[..., dict[str, Any]]) -> None:
    torch.manual_seed(0)
    model = create_model(name, num_classes=3, **HEADS)
    batch = make_batch(event_classes=2, mask=True)
    batch["label"] = batch["label"] % 3
    out = model(batch)
    assert set(out) == {"logits", "events", "mask"}
    assert out["logits"].shape == (2, 3)
    with torch.no_grad():
        frames = model.audio_encoder.to_frames(model.audio_encoder.eval()(batch["audio"])).shape[1]
        model.audio_encoder.train()
    assert out["events"].shape == (2, frames, 2) and frames >= 2
    h, w = model.image_encoder.grid
    assert out["mask"].shape == (2, 1, 4 * h, 4 * w)
    assert set(model.task_losses(out, batch)) == {"label", "events", "mask"}
    model.compute_loss(out, batch).backward()
    missing, bad = _grads(model)
    assert not missing, f"parameters unused in a full forward: {missing}"
    assert not bad, f"non-finite gradients: {bad}"


def test_head_shapes_of_hunter_tiny(make_batch: Callable[..., dict[str, Any]]) -> None:
    # 0.5 s = 51 frames; stride-2 stem + 2 pooling blocks -> ceil(51 / 8) = 7 frames; 64 px / 32 = 2 x 2 grid.
    out = create_model("hunter_tiny", num_event_classes=5, mask_head=True, mask_upsample=3)(make_batch())
    assert out["events"].shape == (2, 7, 5) and out["mask"].shape == (2, 1, 6, 6)
    ast = create_model("hunter_tiny", audio_encoder="ast", num_event_classes=5)(make_batch())
    assert ast["events"].shape == (2, 4, 5)  # 51 frames padded to 64 = 4 patch columns of 16


@pytest.mark.parametrize("name", ALL_MODELS)
def test_model_class_and_num_classes(name: str) -> None:
    assert model_class(name) is HunterModule
    model = create_model(name, num_classes=7, fusion="late")
    assert isinstance(model, HunterModule) and model.num_classes == 7


@pytest.mark.parametrize("name", ALL_MODELS)
@pytest.mark.parametrize("missing", ["image", "audio"])
def test_one_modality_alone(name: str, missing: str, batch: dict[str, Any]) -> None:
    model = create_model(name, **HEADS).eval()
    del batch[missing]
    with torch.no_grad():
        out = model(batch)
    assert out["logits"].shape == (2, 4)
    # the dense head of the missing modality gives nothing; the other one still runs
    assert set(out) == {"logits", "mask" if missing == "audio" else "events"}


@pytest.mark.parametrize(("fusion", "audio_encoder"), COMBOS, ids=COMBO_IDS)
@pytest.mark.parametrize("missing", ["image", "audio"])
def test_missing_modality_trains(
    fusion: str, audio_encoder: str, missing: str, make_batch: Callable[..., dict[str, Any]]
) -> None:
    model = create_model("hunter_tiny", fusion=fusion, audio_encoder=audio_encoder, **HEADS)
    batch = make_batch(event_classes=2, mask=True)
    del batch[missing]
    out = model(batch)
    used = set(model.task_losses(out, batch))
    assert used == {"label", "mask" if missing == "audio" else "events"}
    model.compute_loss(out, batch).backward()
    absent = model.image_encoder if missing == "image" else model.audio_encoder
    present = model.audio_encoder if missing == "image" else model.image_encoder
    assert all(p.grad is None for p in absent.parameters())
    assert all(p.grad is not None for p in present.parameters())


def test_forward_without_any_modality_is_named() -> None:
    with pytest.raises(ValueError, match=r"needs batch\['image'\] and/or batch\['audio'\]"):
        create_model("hunter_tiny")({"label": torch.tensor([0])})


def test_late_fusion_uses_every_parameter(batch: dict[str, Any]) -> None:
    model = create_model("hunter_tiny", fusion="late")
    model.training_step(batch, 0).backward()
    assert all(p.grad is not None for p in model.parameters())


def test_validation_and_predict_steps(batch: dict[str, Any]) -> None:
    model = create_model("hunter_tiny", **HEADS).eval()
    with torch.no_grad():
        out = model.validation_step(batch, 0)
        predicted = model.predict_step(batch, 0)
    assert set(out) == {"loss", "scores", "preds", "target"} and out["preds"].shape == (2,)
    assert set(predicted) == {"logits", "events", "mask"}
    metrics = model.compute_metrics(out)
    assert {"loss", "accuracy", "macro_f1", "micro_f1", "f1/0"} <= set(metrics)


def test_validation_step_carries_every_task_and_metrics_follow(batch: dict[str, Any]) -> None:
    model = create_model("hunter_tiny", **HEADS).eval()
    targets = {"events": torch.zeros(2, 50, 2), "mask": torch.zeros(2, 1, 64, 64)}
    targets["events"][0, 10:20, 1] = 1.0  # a 0.1 s event in a 0.5 s clip
    targets["mask"][:, :, :32] = 1.0  # shadow on the top half
    with torch.no_grad():
        out = model.validation_step({**batch, **targets}, 0)
    assert out["event_probs"].shape[::2] == (2, 2) and out["event_target"].shape == (2, 50, 2)
    assert out["clip_seconds"].tolist() == [0.5, 0.5]
    assert out["mask_counts"].shape == (2, 4) and int(out["mask_counts"].sum()) == 2 * 64 * 64
    metrics = model.compute_metrics(out)
    assert {"event_f1", "event_er", "segment_f1", "segment_er", "ber", "shadow_error"} <= set(metrics)
    model.metrics = ["accuracy", "ber"]
    assert set(model.compute_metrics(out)) == {"loss", "accuracy", "ber"}


def test_task_values_are_the_hunter_models_own_and_a_plain_module_keeps_the_generic_ones(
    batch: dict[str, Any],
) -> None:
    from sss import LitModule

    hunter = create_model("hunter_tiny", **HEADS).eval()
    targets = {"events": torch.zeros(2, 50, 2), "mask": torch.zeros(2, 1, 64, 64)}

    class Plain(LitModule):  # the same outputs through LitModule's generic validation_outputs
        def forward(self, batch):
            return hunter(batch)

        def compute_loss(self, outputs, batch):
            return hunter.compute_loss(outputs, batch)

    both = {**batch, **targets}
    with torch.no_grad():
        full, generic = hunter.validation_step(both, 0), Plain().validation_step(both, 0)
    assert set(generic) == {"loss", "scores", "preds", "target"}
    # event_present: which clips have audio to score events on (all True here), in every batch of a pass
    assert set(full) == set(generic) | {"event_probs", "event_target", "clip_seconds", "event_present", "mask_counts"}
    assert bool(full["event_present"].all())
    assert all(torch.equal(full[k], generic[k]) for k in generic)


def test_clip_seconds_of_waveforms_cached_log_mels_and_the_batch() -> None:
    model = create_model("hunter_tiny")  # 16 kHz, hop 160
    assert model.clip_seconds({"audio": torch.zeros(2, 1, 8000)}) == 0.5
    assert model.clip_seconds({"audio": torch.zeros(2, 1, 32, 51)}) == 0.5  # 51 centred frames of hop 160
    assert model.clip_seconds({"audio": torch.zeros(2, 1, 8000), "clip_seconds": torch.tensor([10.0, 10.0])}) == 10.0
    assert model.clip_seconds({"image": torch.zeros(2, 3, 8, 8)}) is None


# --- the multi-task loss ---------------------------------------------------------------------------------


def test_loss_is_cross_entropy_with_only_a_label(batch: dict[str, Any]) -> None:
    model = create_model("hunter_tiny", **HEADS)
    out = model(batch)
    torch.testing.assert_close(
        model.compute_loss(out, batch), torch.nn.functional.cross_entropy(out["logits"], batch["label"])
    )
    model.compute_loss(out, batch).backward()
    # heads without a target in the batch get no gradient: they were not part of the loss
    assert all(p.grad is None for p in [*model.event_head.parameters(), *model.mask_head.parameters()])


def test_loss_is_the_weighted_sum_of_present_targets(make_batch: Callable[..., dict[str, Any]]) -> None:
    import torch.nn.functional as F

    model = create_model("hunter_tiny", **HEADS, loss_weights={"events": 0.5, "mask": 2.0})
    batch = make_batch(event_classes=2, mask=True)
    out = model(batch)
    # expected, written out: events max-pooled 50 -> 7 frames, the mask area-pooled 64 x 64 -> 8 x 8
    events = F.adaptive_max_pool1d(batch["events"].transpose(1, 2), 7).transpose(1, 2)
    mask = F.adaptive_avg_pool2d(batch["mask"], (8, 8))
    expected = (
        F.cross_entropy(out["logits"], batch["label"])
        + 0.5 * F.binary_cross_entropy_with_logits(out["events"], events)
        + 2.0 * F.binary_cross_entropy_with_logits(out["mask"], mask)
    )
    torch.testing.assert_close(model.compute_loss(out, batch), expected)


def test_multilabel_targets_use_bce(batch: dict[str, Any]) -> None:
    model = create_model("hunter_tiny", num_classes=3)
    labels = torch.tensor([[1.0, 0.0, 1.0], [0.0, 0.0, 0.0]])
    del batch["label"]
    batch["labels"] = labels
    out = model(batch)
    expected = torch.nn.functional.binary_cross_entropy_with_logits(out["logits"], labels)
    torch.testing.assert_close(model.compute_loss(out, batch), expected)
    with pytest.raises(ValueError, match=r"multi-hot \[B, 3\]"):
        model.compute_loss(out, {**batch, "labels": torch.ones(2, 4)})
    with pytest.raises(ValueError, match="both 'label'"):
        model.compute_loss(out, {**batch, "label": torch.tensor([0, 1])})


def test_target_without_its_head_is_skipped_and_bad_targets_are_named(
    make_batch: Callable[..., dict[str, Any]],
) -> None:
    plain = create_model("hunter_tiny")
    batch = make_batch(event_classes=2, mask=True)
    assert set(plain.task_losses(plain(batch), batch)) == {"label"}
    model = create_model("hunter_tiny", num_event_classes=3)
    with pytest.raises(ValueError, match=r"has 2 classes, the event head 3 \(model.num_event_classes\)"):
        model.compute_loss(model(batch), batch)
    with pytest.raises(ValueError, match=r"\[B, T, K\]"):
        model.compute_loss(model(batch), {"events": torch.zeros(2, 3)})


def test_missing_targets_are_named(batch: dict[str, Any]) -> None:
    model = create_model("hunter_tiny")
    del batch["label"]
    with pytest.raises(KeyError, match=r"batch\['label'\].*batch\['labels'\]"):
        model.training_step(batch, 0)


# --- modality dropout ------------------------------------------------------------------------------------


def test_modality_dropout_draws_are_seeded_and_never_both() -> None:
    model = create_model("hunter_tiny", modality_dropout=0.3)
    ones = torch.ones(2000, 1)

    def dropped(seed: int) -> tuple[torch.Tensor, torch.Tensor]:
        torch.manual_seed(seed)
        masks = model.drop_modalities({"image": None, "audio": None}, ones, ones)
        return ~masks["image"], ~masks["audio"]

    image, audio = dropped(0)
    assert not (image & audio).any()
    assert 0.25 < image.float().mean() < 0.35 and 0.25 < audio.float().mean() < 0.35
    assert all(torch.equal(a, b) for a, b in zip(dropped(0), (image, audio), strict=True))
    assert not torch.equal(dropped(1)[0], image)


def test_modality_dropout_per_modality_rates_and_the_data_absences() -> None:
    model = create_model("hunter_tiny", modality_dropout={"image": 0.5, "audio": 0.25})
    ones, n = torch.ones(4000, 1), 4000
    no_audio = torch.arange(n) % 2 == 0  # half the samples already lack audio: their image is never dropped
    torch.manual_seed(0)
    masks = model.drop_modalities({"image": None, "audio": ~no_audio}, ones, ones)
    assert not (~masks["image"] & ~masks["audio"]).any()
    assert masks["image"][no_audio].all() and not masks["audio"][no_audio].any()
    assert 0.45 < (~masks["image"][~no_audio]).float().mean() < 0.55
    assert 0.2 < (~masks["audio"][~no_audio]).float().mean() < 0.3
    # a number is the rate of each modality: the same draws as {image: p, audio: p}
    both = [create_model("hunter_tiny", modality_dropout=rate) for rate in (0.2, {"image": 0.2, "audio": 0.2})]
    drawn = []
    for m in both:
        torch.manual_seed(1)
        drawn.append(m.drop_modalities({"image": None, "audio": None}, ones, ones))
    assert all(torch.equal(drawn[0][k], drawn[1][k]) for k in ("image", "audio"))


def test_modality_dropout_is_off_in_eval_and_with_one_modality() -> None:
    model = create_model("hunter_tiny", modality_dropout=0.5)
    ones = torch.ones(64, 1)
    assert model.drop_modalities({"image": None, "audio": None}, ones, None) == {"image": None, "audio": None}
    model.eval()
    assert model.drop_modalities({"image": None, "audio": None}, ones, ones) == {"image": None, "audio": None}


def test_a_dropped_modality_does_not_reach_the_logits(make_batch: Callable[..., dict[str, Any]]) -> None:
    model = create_model("hunter_tiny", modality_dropout=0.5, freq_mask=0, time_mask=0)
    batch = make_batch(batch_size=16)
    torch.manual_seed(3)
    dropped = torch.rand(16) < 0.5  # the draw drop_modalities makes with this seed: u < p drops the image
    assert dropped.any() and (~dropped).any()
    other = {**batch, "image": torch.randn_like(batch["image"])}
    logits = []
    for b in (batch, other):
        torch.manual_seed(3)
        logits.append(model(b)["logits"])
    torch.testing.assert_close(logits[0][dropped], logits[1][dropped])
    assert not torch.allclose(logits[0][~dropped], logits[1][~dropped])


def test_modality_dropout_keeps_every_parameter_in_the_graph(batch: dict[str, Any]) -> None:
    # DDP needs every parameter used in every step: a dropped modality reads the missing embedding, and its
    # encoder still runs on the samples that keep it.
    model = create_model("hunter_tiny", modality_dropout=0.5)
    torch.manual_seed(0)
    model.training_step(batch, 0).backward()
    assert not _grads(model)[0]


def test_modality_dropout_range_is_checked() -> None:
    with pytest.raises(ValueError, match=r"modality_dropout=0.6 must be in \[0, 0.5\]"):
        create_model("hunter_tiny", modality_dropout=0.6)
    with pytest.raises(ValueError, match=r"sums to over 1"):
        create_model("hunter_tiny", modality_dropout={"image": 0.6, "audio": 0.5})
    with pytest.raises(ValueError, match=r"unknown key\(s\) \['video'\]"):
        create_model("hunter_tiny", modality_dropout={"video": 0.1})


# --- configuration errors --------------------------------------------------------------------------------


def test_unknown_override_is_named() -> None:
    with pytest.raises(TypeError, match=r"'image_encodr' \(did you mean 'image_encoder'\?\)"):
        create_model("hunter_small", image_encodr="resnet18")
    with pytest.raises(TypeError, match="'banana'"):
        create_model("hunter_tiny", banana=1)


def test_none_override_keeps_variant_default() -> None:
    assert create_model("hunter_tiny", dim=None).fusion_head.dim == 32


def test_unknown_names_list_the_valid_ones() -> None:
    with pytest.raises(ValueError, match=r"unknown fusion 'early'; choose one of bottleneck, cross_attention, late"):
        create_model("hunter_tiny", fusion="early")
    with pytest.raises(ValueError, match=r"unknown fusion 'botleneck' \(did you mean 'bottleneck'\?\)"):
        create_model("hunter_tiny", fusion="botleneck")
    with pytest.raises(ValueError, match=r"unknown audio encoder 'transformer'; choose one of ast, cnn"):
        create_model("hunter_tiny", audio_encoder="transformer")
    with pytest.raises(ValueError, match=r"unknown timm model 'resnet10x'.*resnet10t"):
        create_model("hunter_tiny", image_encoder="resnet10x")
    with pytest.raises(ValueError, match=r"unknown loss_weights key\(s\) \['lable'\]"):
        create_model("hunter_tiny", loss_weights={"lable": 1.0})


@pytest.mark.parametrize(("fusion", "audio_encoder"), COMBOS, ids=COMBO_IDS)
def test_heads_must_divide_dim(fusion: str, audio_encoder: str) -> None:
    with pytest.raises(ValueError, match=r"dim=30 must be divisible by heads=4"):
        create_model("hunter_tiny", dim=30, heads=4, fusion=fusion, audio_encoder=audio_encoder)


def test_ast_width_must_fit_heads() -> None:
    with pytest.raises(ValueError, match=r"width=30 must be divisible by heads=4"):
        create_model("hunter_tiny", audio_encoder="ast", heads=4, audio_kwargs={"width": 30})


# --- gradient checkpointing ------------------------------------------------------------------------------


@pytest.mark.parametrize(("fusion", "audio_encoder"), COMBOS, ids=COMBO_IDS)
def test_grad_checkpointing_gives_same_loss_and_grads(
    fusion: str, audio_encoder: str, make_batch: Callable[..., dict[str, Any]]
) -> None:
    batch = make_batch(batch_size=4, event_classes=2, mask=True)
    torch.manual_seed(0)
    # dropout and modality dropout: checkpointing must replay the same random draws
    plain = create_model(
        "hunter_tiny", fusion=fusion, audio_encoder=audio_encoder, dropout=0.1, modality_dropout=0.2, **HEADS
    )
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


@pytest.mark.parametrize("name", ["hunter_small"])
@pytest.mark.parametrize("image_checkpointing", ["backbone", "stages"])
def test_grad_checkpointing_hunter_small(
    name: str, image_checkpointing: str, make_batch: Callable[..., dict[str, Any]]
) -> None:
    batch = make_batch(batch_size=4)
    torch.manual_seed(0)
    plain = create_model(name, dropout=0.1, image_checkpointing=image_checkpointing)
    ckpt = copy.deepcopy(plain)
    ckpt.set_grad_checkpointing(True)
    grads = []
    for model in (plain, ckpt):
        torch.manual_seed(1)
        model.training_step(batch, 0).backward()
        grads.append([p.grad for p in model.parameters()])
    for a, b in zip(*grads, strict=True):
        torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-7)


@pytest.mark.parametrize("audio_encoder", AUDIO_ENCODERS)
@pytest.mark.parametrize("fusion", ["cross_attention", "bottleneck"])
def test_grad_checkpointing_is_really_on(audio_encoder: str, fusion: str) -> None:
    model = create_model("hunter_tiny", audio_encoder=audio_encoder, fusion=fusion)
    model.set_grad_checkpointing(True)
    assert not model.image_encoder.model.grad_checkpointing  # "backbone": one segment around timm's model
    assert model.audio_encoder.grad_checkpointing and model.fusion_head.grad_checkpointing
    # the checkpointed path really runs: torch.utils.checkpoint is called once per block / layer
    calls = []
    original = torch.utils.checkpoint.checkpoint

    def counting(fn: Any, *args: Any, **kwargs: Any) -> Any:
        calls.append(type(fn).__name__)
        return original(fn, *args, **kwargs)

    with pytest.MonkeyPatch.context() as mp:
        for module in ("sss.models.audio.cnn", "sss.models.audio.ast", "sss.models.image.timm_encoder"):
            mp.setattr(f"{module}.checkpoint", counting)
        mp.setattr("sss.models.fusion.bottleneck.checkpoint", counting)
        mp.setattr("sss.models.fusion.cross_attention.checkpoint", counting)
        model.training_step(
            {"image": torch.randn(2, 3, 64, 64), "audio": torch.randn(2, 1, 8000), "label": torch.tensor([0, 1])}, 0
        )
    expected_audio = {"cnn": "ConvBlock", "ast": "Block"}[audio_encoder]
    expected_fusion = {"cross_attention": "CrossModalLayer", "bottleneck": "BottleneckLayer"}[fusion]
    assert calls.count(expected_audio) == 2 and calls.count(expected_fusion) == 1
    assert calls.count("method") == 1  # the image backbone's forward_features
    model.set_grad_checkpointing(False)
    assert not model.audio_encoder.grad_checkpointing


def test_image_checkpointing_per_stage() -> None:
    model = create_model("hunter_tiny", image_checkpointing="stages")
    model.set_grad_checkpointing(True)
    assert model.image_encoder.model.grad_checkpointing
    model.set_grad_checkpointing(False)
    assert not model.image_encoder.model.grad_checkpointing
    with pytest.raises(ValueError, match=r"unknown image checkpointing 'stage' \(did you mean 'stages'\?\)"):
        create_model("hunter_tiny", image_checkpointing="stage")


def test_any_image_size_and_clip_length(make_batch: Callable[..., dict[str, Any]]) -> None:
    for audio_encoder in AUDIO_ENCODERS:
        model = create_model("hunter_tiny", audio_encoder=audio_encoder, **HEADS).eval()
        with torch.no_grad():
            for image_size, samples in ((32, 1000), (96, 16000)):
                out = model(make_batch(3, image_size, samples))
                assert out["logits"].shape == (3, 4)
                assert out["mask"].shape[-1] == 4 * -(-image_size // 32)


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


def test_dense_heads_learn(make_batch: Callable[..., dict[str, Any]]) -> None:
    # The event and mask heads must be able to fit fixed targets: their losses fall well below chance.
    torch.manual_seed(0)
    model = create_model("hunter_tiny", freq_mask=0, time_mask=0, **HEADS)
    batch = make_batch(batch_size=4, event_classes=2)
    # a mask made of 8 x 8-pixel cells, so that the head's 8 x 8 target is binary (not ~0.5 everywhere)
    cells = (torch.rand(4, 1, 8, 8, generator=torch.Generator().manual_seed(1)) > 0.5).float()
    batch["mask"] = cells.repeat_interleave(8, dim=-1).repeat_interleave(8, dim=-2)
    optimizer = torch.optim.AdamW(model.parameters(), lr=5e-3)
    history = []
    for _ in range(30):
        losses = model.task_losses(model(batch), batch)
        sum(losses.values()).backward()
        optimizer.step()
        optimizer.zero_grad()
        history.append({k: float(v.detach()) for k, v in losses.items()})
    assert history[-1]["events"] < 0.5 * history[0]["events"], history[-1]
    assert history[-1]["mask"] < 0.7 * history[0]["mask"], history[-1]


@pytest.mark.parametrize("modality", ["image", "audio"])
def test_one_modality_builds_one_encoder_and_every_parameter_learns(modality):
    model = create_model("hunter_tiny", modalities=[modality], fusion="late")
    other = "audio" if modality == "image" else "image"
    assert getattr(model, f"{other}_encoder") is None and model.modality_groups()[other] == []
    batch = {"image": torch.randn(2, 3, 32, 32)} if modality == "image" else {"audio": torch.randn(2, 1, 16000)}
    model.compute_loss(model(batch), {"label": torch.tensor([0, 1])}).backward()
    assert [n for n, p in model.named_parameters() if p.grad is None] == []
    with pytest.raises(ValueError, match=r"fuses two modalities.*use model\.fusion=late"):
        create_model("hunter_tiny", modalities=[modality])
