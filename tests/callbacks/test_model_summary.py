"""`ModelSummary`: per-branch parameters and multiply-adds, printed once at fit start on the main process."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch

from sss.callbacks.model_summary import ModelSummary, summarize
from sss.models import create_model
from sss.testing import BoringModule, boring_loader


def _trainer(main: bool = True) -> SimpleNamespace:
    return SimpleNamespace(accelerator=SimpleNamespace(is_main_process=main))


def test_rows_split_parameters_and_macs_by_branch() -> None:
    model = create_model("hunter_tiny", num_event_classes=3, mask_head=True)
    rows = {r.branch: r for r in summarize(model, ModelSummary().dummy_batch(model))}
    assert list(rows) == ["image", "audio", "fusion", "heads", "total"]
    for branch, part in (("image", model.image_encoder), ("audio", model.audio_encoder), ("fusion", model.fusion_head)):
        assert rows[branch].params == sum(p.numel() for p in part.parameters())
    heads = [*model.event_head.parameters(), *model.mask_head.parameters()]
    assert rows["heads"].params == sum(p.numel() for p in heads)
    assert rows["total"].params == sum(p.numel() for p in model.parameters()) == rows["total"].trainable
    assert sum(rows[b].params for b in ("image", "audio", "fusion", "heads")) == rows["total"].params
    # heads, by hand: 13 audio frames x Linear(32 -> 3), 2 x 2 image tokens x Linear(32 -> 4 * 4)
    assert rows["heads"].macs == 13 * 32 * 3 + 4 * 32 * 16
    # the fusion's classifier alone: Linear(2 * 32 -> 4); its attention layers add more
    assert rows["fusion"].macs > 64 * 4
    assert all(rows[b].macs > 0 for b in ("image", "audio"))
    assert rows["total"].macs == sum(rows[b].macs for b in ("image", "audio", "fusion", "heads"))


def test_late_fusion_macs_are_its_mlp() -> None:
    model = create_model("hunter_tiny", fusion="late")
    rows = {r.branch: r for r in summarize(model, ModelSummary().dummy_batch(model))}
    assert rows["fusion"].macs == 64 * 32 + 32 * 4  # Linear(64 -> 32), Linear(32 -> 4)


def test_frozen_parameters_count_but_are_not_trainable() -> None:
    model = create_model("hunter_tiny")
    model.image_encoder.requires_grad_(False)
    rows = {r.branch: r for r in summarize(model, None)}
    assert rows["image"].trainable == 0 < rows["image"].params and rows["image"].macs is None


def test_summary_changes_nothing_in_the_run() -> None:
    model = create_model("hunter_tiny")
    model.train()
    before = {k: v.clone() for k, v in model.state_dict().items()}
    torch.manual_seed(0)
    expected = torch.rand(3)
    torch.manual_seed(0)
    summarize(model, ModelSummary().dummy_batch(model))
    assert torch.equal(torch.rand(3), expected)  # the RNG stream is where it was
    assert model.training
    assert all(torch.equal(v, model.state_dict()[k]) for k, v in before.items())  # no BatchNorm update


def test_prints_on_main_process_only(capsys: pytest.CaptureFixture[str]) -> None:
    callback = ModelSummary()
    model = create_model("hunter_tiny")
    callback.on_fit_start(_trainer(main=False), model)
    assert capsys.readouterr().out == "" and callback.rows == []
    callback.on_fit_start(_trainer(), model)
    out = capsys.readouterr().out
    assert "HunterModule" in out and "MACs" in out and all(b in out for b in ("image", "audio", "fusion", "heads"))


def test_a_dummy_the_model_rejects_still_gives_parameters(capsys: pytest.CaptureFixture[str]) -> None:
    callback = ModelSummary(image_size=64, audio_samples=0)  # BoringModule wants 4 x 4 images and audio
    callback.on_fit_start(_trainer(), BoringModule())
    out = capsys.readouterr().out
    assert "no multiply-adds, the dummy batch failed" in out
    assert callback.rows[-1].params == sum(p.numel() for p in BoringModule().parameters())


def test_survives_two_fits(capsys: pytest.CaptureFixture[str]) -> None:
    from sss import SSSTrainer

    callback = ModelSummary(image_size=4, audio_samples=16)
    trainer = SSSTrainer(
        max_steps=2,
        mixed_precision="no",
        log={"progress": False, "trackers": []},
        checkpoint={"every_epoch": False},
        callbacks=[callback],
    )
    for _ in range(2):
        trainer.fit(BoringModule(), train_dataloaders=boring_loader(n=8, batch_size=4))
        assert capsys.readouterr().out.count("BoringModule: parameters and multiply-adds") == 1
    assert callback.rows[-1].macs == 48 * 8 + 16 * 8 + 8 * 2


@pytest.mark.parametrize("fusion", ["cross_attention", "bottleneck", "late"])
@pytest.mark.parametrize("audio_encoder", ["cnn", "ast"])
def test_every_fusion_and_audio_encoder_is_counted(fusion: str, audio_encoder: str) -> None:
    # FlopCounterMode's module tracker rejects parameter views made under no_grad (the bottleneck once did)
    model = create_model("hunter_tiny", fusion=fusion, audio_encoder=audio_encoder)
    rows = {r.branch: r for r in summarize(model, ModelSummary().dummy_batch(model))}
    assert all(rows[b].macs > 0 for b in ("image", "audio", "fusion")) and rows["heads"].macs == 0


def test_a_module_with_other_batch_keys_is_measured_on_them() -> None:
    class Renamed(BoringModule):
        modality_keys = {"image": "frames", "audio": "wave"}  # noqa: RUF012

    module = Renamed()
    batch = ModelSummary(image_size=4, audio_samples=16).dummy_batch(module)
    assert sorted(batch) == ["frames", "wave"]
    rows = {r.branch: r for r in summarize(module, batch)}
    assert (rows["image"].macs, rows["audio"].macs, rows["fusion"].macs) == (48 * 8, 16 * 8, 8 * 2)


def test_a_module_without_branches_gets_a_total_row() -> None:
    from torch import nn

    from sss import LitModule

    class Plain(LitModule):  # no image_encoder / audio_encoder / fusion_head: nothing to split by
        def __init__(self) -> None:
            super().__init__()
            self.net = nn.Linear(16, 2)

        def forward(self, batch):
            return self.net(batch["audio"].flatten(1))

    rows = summarize(Plain(), {"audio": torch.zeros(1, 1, 16)})
    assert [(r.branch, r.params, r.trainable, r.macs) for r in rows] == [("total", 34, 34, 32)]
    assert [r.branch for r in summarize(Plain(), None)] == ["total"]
