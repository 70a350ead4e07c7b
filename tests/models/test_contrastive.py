"""`ContrastiveModule`: InfoNCE, the gather across processes with gradients, settings, and the evaluation values."""

from __future__ import annotations

import math
import os
import socket
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F

from sss.config import load_config
from sss.config.instantiate import check_config
from sss.models import ContrastiveModule, create_model
from sss.models.contrastive import gather_with_grad, info_nce

TINY = {"image_encoder": "test_resnet", "proj_dim": 8}
PRETRAIN = str(Path(__file__).parents[2] / "examples" / "pretrain.yaml")


def _batch(n: int, seed: int = 0) -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    return {"image": torch.randn(n, 3, 32, 32, generator=g), "audio": torch.randn(n, 1, 4000, generator=g)}


def test_info_nce_is_the_mean_of_both_cross_entropies_by_hand():
    g = torch.Generator().manual_seed(1)
    image, audio = (
        F.normalize(torch.randn(5, 4, generator=g), dim=1),
        F.normalize(torch.randn(5, 4, generator=g), dim=1),
    )
    scale = 7.0
    by_hand = []
    for queries, keys in ((image, audio), (audio, image)):
        total = 0.0
        for i in range(5):
            logits = [scale * float(queries[i] @ keys[j]) for j in range(5)]
            total += math.log(sum(math.exp(v) for v in logits)) - logits[i]
        by_hand.append(total / 5)
    assert float(info_nce(image, audio, scale)) == pytest.approx(sum(by_hand) / 2, rel=1e-5)
    for chunk in (1, 2, 3, 5, 64):  # the evaluation's chunked form: the same value, never the whole matrix
        assert float(info_nce(image, audio, scale, chunk=chunk)) == pytest.approx(sum(by_hand) / 2, rel=1e-5)
    assert float(info_nce(image, audio, scale)) != pytest.approx(float(info_nce(image, audio.roll(1, 0), scale)))


def test_the_encoders_are_the_hunter_variants_own_names_shapes_and_initial_weights():
    torch.manual_seed(0)
    hunter = create_model("hunter_tiny", image_encoder="test_resnet")
    torch.manual_seed(0)
    pretrain = create_model("contrastive_tiny", image_encoder="test_resnet")
    for part in ("image_encoder", "audio_encoder"):
        mine, theirs = getattr(pretrain, part).state_dict(), getattr(hunter, part).state_dict()
        assert list(mine) == list(theirs)
        assert all(torch.equal(mine[k], theirs[k]) for k in mine)


def test_training_learns_the_pairing_and_the_temperature():
    torch.manual_seed(0)
    model = ContrastiveModule("hunter_tiny", **TINY)
    batch = _batch(8)
    optimizer = torch.optim.AdamW(model.parameters(), lr=3e-3)
    first = None
    scale = float(model.logit_scale.detach())
    for _ in range(25):
        loss = model.training_step(batch, 0)
        first = float(loss) if first is None else first
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
    assert float(loss) < first - 0.5  # eight fixed pairs: it learns which image goes with which clip
    assert float(model.logit_scale.detach()) != scale  # the temperature is a parameter, with a gradient


def test_fixed_temperature_is_a_buffer_and_never_above_the_clamp():
    model = ContrastiveModule("hunter_tiny", temperature=0.001, learn_temperature=False, **TINY)
    assert "logit_scale" not in dict(model.named_parameters()) and "logit_scale" in model.state_dict()
    assert float(model(_batch(2))["logit_scale"]) == pytest.approx(100.0)


def test_samples_without_a_modality_are_left_out_of_the_pairs():
    torch.manual_seed(0)
    model = ContrastiveModule("hunter_tiny", **TINY).eval()
    batch = _batch(4)
    partial = {**batch, "image_present": torch.tensor([True, False, True, True])}
    kept = {k: v[[0, 2, 3]] for k, v in batch.items()}
    # Training encodes the pairs only; their loss is that of a batch holding just them.
    model.train()
    trained = model(partial)
    assert trained["image_embedding"].shape[0] == 3 and "paired" not in trained
    model.eval()  # the same BatchNorm statistics below
    out = model(partial)
    # Evaluation keeps a row per sample (a multi-process gather needs as many rows on every process), marked.
    assert out["image_embedding"].shape[0] == 4 and out["paired"].tolist() == [True, False, True, True]
    assert torch.allclose(out["audio_embedding"][[0, 2, 3]], model(kept)["audio_embedding"], atol=1e-6)
    assert torch.allclose(model.compute_loss(out, partial), model.compute_loss(model(kept), kept), atol=1e-6)
    values = model.validation_outputs(out, {**partial, "label": torch.tensor([0, 1, 2, 3])})
    assert values["paired"].tolist() == [True, False, True, True] and values["label"].tolist() == [0, 1, 2, 3]
    alone = model.validation_outputs(model(kept), kept)
    assert alone["paired"].all() and values["image_features"].shape[0] == 4
    unlabelled = {k: v for k, v in values.items() if k != "label"}
    assert model.compute_metrics(unlabelled) == pytest.approx(model.compute_metrics(alone))  # the unpaired row out


def test_settings_are_checked_without_building_with_the_key_named():
    def problems(*overrides: str) -> list[str]:
        return check_config(load_config(PRETRAIN, ["data.root=d", *overrides]))

    assert problems() == []
    assert problems("model.name=contrastive_tiny", "model.dim=48") == []
    (fusion,) = problems("model.fusion=late")
    assert fusion.startswith("model.fusion: fusion='late' is no encoder setting") and "fine-tuning" in fusion
    (typo,) = problems("model.audio_widht=8")
    assert "unknown argument 'audio_widht' of ContrastiveModule (did you mean 'audio_width'?)" in typo
    (heads,) = problems("model.dim=30")
    assert heads == "model.dim: dim=30 must be divisible by heads=4 (model.dim / model.heads)"
    (rate,) = problems("data.sample_rate=8000")
    assert rate.startswith("data.sample_rate=8000 differs from model.sample_rate=16000")
    assert problems("model.init_from=3") == [
        "model.init_from: expected the path of a run, model or checkpoint folder, got int 3"
    ]
    with pytest.raises(ValueError, match="contrastive pretraining pairs each image with its audio"):
        ContrastiveModule("hunter_tiny", modalities=["audio"], **TINY)


def test_evaluation_values_give_retrieval_and_a_probe_only_with_labels():
    model = ContrastiveModule("hunter_tiny", **TINY).eval()
    batch = _batch(12)
    with torch.no_grad():
        values = model.validation_step(batch, 0)
    metrics = model.compute_metrics(values)
    assert {"loss", "retrieval/audio_to_image_r1", "retrieval/image_to_audio_r10"} <= set(metrics)
    assert not any(k.startswith("linear_probe/") for k in metrics)
    assert metrics["loss"] == pytest.approx(float(info_nce(values["image_embedding"], values["audio_embedding"],
                                                           model(batch)["logit_scale"])), rel=1e-5)  # fmt: skip
    values["label"] = torch.arange(12) % 2
    assert "linear_probe/accuracy" in model.compute_metrics(values)


def test_gather_without_a_process_group_is_the_identity():
    x = torch.randn(3, 2, requires_grad=True)
    assert gather_with_grad(x) is x


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _one_of_two(rank: int, port: int, out: str, sizes: tuple[int, int]) -> None:
    # One process of two (gloo): its share of the rows, the model in DDP, loss and gradients saved.
    import torch.distributed as dist
    from torch.nn.parallel import DistributedDataParallel

    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    dist.init_process_group("gloo", rank=rank, world_size=2)
    torch.manual_seed(0)
    model = ContrastiveModule("hunter_tiny", **TINY).eval()  # BatchNorm's running stats: per-process batches equal
    ddp = DistributedDataParallel(model)
    batch = _batch(sum(sizes), seed=5)
    start = sum(sizes[:rank])
    mine = {k: v[start : start + sizes[rank]] for k, v in batch.items()}
    outputs = ddp(mine)
    loss = model.compute_loss(outputs, mine)
    loss.backward()
    grads = {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}
    torch.save({"loss": loss.detach(), "grads": grads}, f"{out}/rank{rank}.pt")
    dist.destroy_process_group()


@pytest.mark.parametrize("sizes", [(3, 3), (4, 1)], ids=["b-and-b", "uneven"])
def test_two_processes_of_b_compute_the_loss_and_gradients_of_one_process_of_2b(tmp_path, sizes):
    torch.manual_seed(0)
    model = ContrastiveModule("hunter_tiny", **TINY).eval()
    batch = _batch(sum(sizes), seed=5)
    loss = model.compute_loss(model(batch), batch)
    loss.backward()
    torch.multiprocessing.spawn(_one_of_two, args=(_free_port(), str(tmp_path), sizes), nprocs=2, join=True)
    for rank in (0, 1):
        got = torch.load(tmp_path / f"rank{rank}.pt")
        assert torch.allclose(got["loss"], loss.detach(), rtol=1e-5, atol=1e-6)
        for name, param in model.named_parameters():
            assert torch.allclose(got["grads"][name], param.grad, rtol=1e-4, atol=1e-6), name
