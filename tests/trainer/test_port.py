"""The port of a plain PyTorch loop (docs/port.md): `LitModule.from_model` keeps the model's signature, and
SSSTrainer trains it to the plain loop's weights, bit for bit."""

from __future__ import annotations

import copy

import pytest
import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.data import DataLoader, Dataset, RandomSampler, TensorDataset

import sss
from sss.callbacks.model_summary import ModelSummary, summarize
from sss.evaluation import evaluate

SEED = 42
QUIET = {"cpu": True, "mixed_precision": "no", "seed": SEED}


class TinyNet(nn.Module):
    """A user's two-input model: ``forward(images, audio)``, no sss attribute names."""

    def __init__(self) -> None:
        super().__init__()
        self.image_net = nn.Sequential(nn.Flatten(), nn.Linear(3 * 4 * 4, 16), nn.ReLU())
        self.audio_net = nn.Sequential(nn.Flatten(), nn.Linear(16, 16), nn.ReLU())
        self.head = nn.Linear(32, 3)

    def forward(self, images: torch.Tensor, audio: torch.Tensor) -> torch.Tensor:
        return self.head(torch.cat([self.image_net(images), self.audio_net(audio)], dim=-1))


class Clips(Dataset):
    """The user's data, under the user's key names."""

    def __init__(self, n: int = 44, seed: int = 0) -> None:
        g = torch.Generator().manual_seed(seed)
        self.images, self.audio = torch.randn(n, 3, 4, 4, generator=g), torch.randn(n, 1, 16, generator=g)
        self.labels = torch.randint(0, 3, (n,), generator=g)

    def __len__(self) -> int:
        return len(self.labels)

    def __getitem__(self, i: int) -> dict[str, torch.Tensor]:
        return {"images": self.images[i], "audio": self.audio[i], "labels": self.labels[i]}


def plain_loop(model: nn.Module, dataset: Dataset, epochs: int, data_seed: int = SEED) -> None:
    """The loop a user has: AdamW, clipping at 1.0, shuffled batches of 8.

    Its sampler gives the order of Accelerate's seedable sampler, which SSSTrainer uses: epoch e is
    ``torch.randperm(n)`` from a generator seeded with ``seed + e``.
    """
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-2)
    generator = torch.Generator()
    loader = DataLoader(dataset, batch_size=8, sampler=RandomSampler(dataset, generator=generator))
    for epoch in range(epochs):
        generator.manual_seed(data_seed + epoch)
        for batch in loader:
            loss = F.cross_entropy(model(batch["images"], batch["audio"]), batch["labels"])
            loss.backward()
            torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
            optimizer.step()
            optimizer.zero_grad()


def ported(model: nn.Module, dataset: Dataset, epochs: int, tmp_path) -> sss.SSSTrainer:
    """The same program after the port of docs/port.md: the loop replaced by from_model + fit."""
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-2)
    loader = DataLoader(dataset, batch_size=8, shuffle=True)
    module = sss.LitModule.from_model(
        model, F.cross_entropy, inputs=("images", "audio"), target="labels", optimizer=optimizer
    )
    trainer = sss.SSSTrainer(max_epochs=epochs, output_dir=str(tmp_path / "run"), **QUIET)
    trainer.fit(module, train_dataloaders=loader)
    return trainer


def test_the_ported_loop_trains_the_plain_loops_weights_bit_for_bit(tmp_path):
    torch.manual_seed(0)
    initial = TinyNet()
    plain, port, shuffled_otherwise = (copy.deepcopy(initial) for _ in range(3))
    plain_loop(plain, Clips(), epochs=3)
    trainer = ported(port, Clips(), epochs=3, tmp_path=tmp_path)
    assert trainer.state.global_step == 3 * 6  # 44 samples in batches of 8, a short last one
    assert trainer.optimizer.optimizer.param_groups[0]["params"][0] is port.image_net[1].weight  # the user's own
    for (name, a), b in zip(plain.named_parameters(), port.parameters(), strict=True):
        assert torch.equal(a, b), name
    assert not torch.equal(initial.head.weight, port.head.weight)  # it trained
    # Negative control: another data order gives other weights, so the comparison above can fail.
    plain_loop(shuffled_otherwise, Clips(), epochs=3, data_seed=SEED + 1)
    assert not torch.equal(shuffled_otherwise.head.weight, port.head.weight)


def test_the_ablation_zeroes_the_modality_keys_the_wrapped_model_reads(tmp_path):
    seen: list[tuple[bool, bool]] = []

    class Recording(TinyNet):
        def forward(self, images, audio):
            seen.append((bool(images.abs().sum() == 0), bool(audio.abs().sum() == 0)))
            return super().forward(images, audio)

    module = sss.LitModule.from_model(Recording(), F.cross_entropy, inputs=("images", "audio"), target="labels")
    assert dict(module.modality_keys) == {"image": "images", "audio": "audio"}
    trainer = sss.SSSTrainer(output_dir=str(tmp_path / "run"), **QUIET)
    result = evaluate(trainer, module, dataloaders=DataLoader(Clips(12), batch_size=12))
    assert seen[:2] == [(False, True), (True, False)]  # image only, audio only: the other one absent throughout
    assert seen[2:] == [(False, False)] * 6  # the robustness passes (rate 0, part of the samples), then fused
    assert set(result["ablation"]) == {"image_only", "audio_only"} and result["samples"] == 12
    assert {"accuracy", "macro_f1", "loss"} <= set(result["metrics"])  # "labels" scored as class indices


def test_a_wrong_modality_key_is_named_not_ablated_silently(tmp_path):
    keys = {"image": "images", "audio": "sound"}  # "sound": a key the data does not have
    module = sss.LitModule.from_model(
        TinyNet(), F.cross_entropy, inputs=("images", "audio"), target="labels", modality_keys=keys
    )
    trainer = sss.SSSTrainer(output_dir=str(tmp_path / "run"), **QUIET)
    with pytest.raises(KeyError, match=r"making audio absent needs its input 'sound', which the evaluation batch"):
        evaluate(trainer, module, dataloaders=DataLoader(Clips(8), batch_size=8))


def test_one_modality_keys_entry_means_no_ablation(tmp_path):
    module = sss.LitModule.from_model(
        TinyNet(), F.cross_entropy, inputs=("images", "audio"), target="labels", modality_keys={"audio": "audio"}
    )
    trainer = sss.SSSTrainer(output_dir=str(tmp_path / "run"), **QUIET)
    assert evaluate(trainer, module, dataloaders=DataLoader(Clips(8), batch_size=8))["ablation"] == {}


def test_tuple_batches_port_with_positions(tmp_path):
    data = Clips(16)
    tensors = TensorDataset(data.images, data.audio, data.labels)  # for images, audio, labels in loader
    module = sss.LitModule.from_model(TinyNet(), F.cross_entropy, inputs=(0, 1), target=2)
    trainer = sss.SSSTrainer(max_epochs=1, output_dir=str(tmp_path / "run"), **QUIET)
    metrics = trainer.fit(module, train_dataloaders=DataLoader(tensors, batch_size=8))
    assert trainer.state.global_step == 2 and metrics == {}
    result = evaluate(trainer, module, dataloaders=DataLoader(tensors, batch_size=8))
    assert set(result["ablation"]) == {"image_only", "audio_only"} and result["samples"] == 16


def test_the_summary_of_a_wrapped_model_is_a_total_row(capsys):
    module = sss.LitModule.from_model(TinyNet(), F.cross_entropy, inputs=("images", "audio"), target="labels")
    callback = ModelSummary(image_size=4, audio_samples=16)
    batch = callback.dummy_batch(module)
    assert sorted(batch) == ["audio", "images"]  # under the module's modality keys
    rows = summarize(module, batch)
    params = sum(p.numel() for p in module.parameters())
    assert [(r.branch, r.params, r.trainable) for r in rows] == [("total", params, params)]
    assert rows[0].macs == 48 * 16 + 16 * 16 + 32 * 3
    callback.on_fit_start(type("T", (), {"accelerator": type("A", (), {"is_main_process": True})})(), module)
    out = capsys.readouterr().out
    assert "WrappedModel" in out and "total" in out and "dummy batch failed" not in out


def test_a_datamodule_subclass_feeds_the_wrapped_model(tmp_path):
    class ClipData(sss.DataModule):
        def __init__(self) -> None:
            super().__init__()
            self.classes = ["hum", "knock", "scrape"]

        def train_dataloader(self):
            return DataLoader(Clips(16), batch_size=8, shuffle=True)

        def val_dataloader(self):
            return DataLoader(Clips(8, seed=1), batch_size=8)

    module = sss.LitModule.from_model(TinyNet(), F.cross_entropy, inputs=("images", "audio"), target="labels")
    trainer = sss.SSSTrainer(max_epochs=1, output_dir=str(tmp_path / "run"), **QUIET)
    metrics = trainer.fit(module, ClipData())
    assert {"val/accuracy", "val/f1/knock"} <= set(metrics)  # class names from the DataModule


def test_configure_optimizers_may_return_a_plain_optimizer(tmp_path):
    from sss.testing import BoringModule, boring_loader

    class WithSGD(BoringModule):
        def configure_optimizers(self):
            self.made = torch.optim.SGD(self.parameters(), lr=0.1)
            return self.made

    module = WithSGD()
    trainer = sss.SSSTrainer(max_steps=2, output_dir=str(tmp_path / "run"), **QUIET)
    trainer.fit(module, train_dataloaders=boring_loader(n=16))
    assert trainer.optimizer.optimizer is module.made and trainer.scheduler is None


def test_mistakes_are_named():
    module = sss.LitModule.from_model(TinyNet(), F.cross_entropy, inputs=("images", "audio"), target="labels")
    batch = Clips(2)[0]
    with pytest.raises(KeyError, match=r"the batch has no 'audio' \(it has 'images', 'labels'\)"):
        module({"images": batch["images"][None], "labels": batch["labels"][None]})
    with pytest.raises(KeyError, match=r"from_model\(target=...\) names the batch key of the target"):
        module.compute_loss(torch.zeros(1, 3), {"images": batch["images"][None]})
    with pytest.raises(ValueError, match=r"modality_keys names the modalities image and audio, got \['video'\]"):
        sss.LitModule.from_model(TinyNet(), F.cross_entropy, modality_keys={"video": "v"})
    with pytest.raises(ValueError, match="from_model got a scheduler without its optimizer"):
        sss.LitModule.from_model(TinyNet(), F.cross_entropy, scheduler=object())


def test_a_litmodule_subclass_reads_its_own_keys_through_modality_keys_and_target_key(tmp_path):
    from sss.testing import BoringModule

    class Renamed(BoringModule):
        modality_keys = {"image": "images", "audio": "sound"}  # noqa: RUF012
        target_key = "y"

        def compute_loss(self, outputs, batch):
            return F.cross_entropy(outputs, batch["y"])

    g = torch.Generator().manual_seed(0)
    rows = [
        {"images": torch.randn(3, 4, 4, generator=g), "sound": torch.randn(1, 16, generator=g), "y": i % 2}
        for i in range(16)
    ]
    trainer = sss.SSSTrainer(max_epochs=1, output_dir=str(tmp_path / "run"), **QUIET)
    loader = DataLoader(rows, batch_size=8)
    metrics = trainer.fit(Renamed(), train_dataloaders=loader, val_dataloaders=loader)  # the batch contract passes
    assert {"val/loss", "val/accuracy"} <= set(metrics)  # "y" scored as class indices
    result = evaluate(trainer, Renamed(), dataloaders=loader)
    assert set(result["ablation"]) == {"image_only", "audio_only"}
