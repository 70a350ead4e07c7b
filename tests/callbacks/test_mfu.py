"""Throughput's MFU: the peak table, FLOPs x samples/s / peak, frozen branches forward only, no host sync."""

from __future__ import annotations

import warnings
from collections import Counter
from types import SimpleNamespace

import pytest
import torch
from torch.utils.data import DataLoader

from sss import Callback, SSSTrainer
from sss.callbacks import ModelSummary, Throughput
from sss.callbacks.model_summary import training_flops
from sss.callbacks.throughput import _device_peak, peak_flops
from sss.models import create_model
from sss.testing import RandomClips, count_host_syncs


class Broken(ModelSummary):
    def dummy_batch(self, module):
        return {}  # the model's forward raises: a summary without multiply-adds


class StepLabel(Callback):
    def __init__(self, syncs) -> None:
        self.syncs = syncs

    def on_batch_start(self, trainer, module) -> None:
        self.syncs.label = trainer.state.global_step + 1


def _fit(callbacks, steps=4, every=1000, model=None, n=16):
    model = model or create_model("hunter_tiny", num_classes=4)
    trainer = SSSTrainer(
        max_steps=steps,
        mixed_precision="no",
        callbacks=callbacks,
        log={"every_n_steps": every, "progress": False, "trackers": []},
        checkpoint={"every_epoch": False},
    )
    trainer.fit(model, train_dataloaders=DataLoader(RandomClips(n, samples=16000), batch_size=2))
    return trainer, model


@pytest.mark.parametrize(
    ("name", "precision", "tflops"),
    [
        ("NVIDIA H100 80GB HBM3", "bf16", 989.5),  # SXM: the datasheet's 1,979 with sparsity, halved
        ("NVIDIA H100 PCIe", "fp16", 756.5),
        ("NVIDIA H200", "tf32", 494.5),
        ("NVIDIA A100-SXM4-40GB", "tf32", 156),
        ("NVIDIA A100 80GB PCIe", "fp32", 19.5),
        ("NVIDIA A10G", "bf16", 125),
        ("NVIDIA L4", "bf16", 121),
        ("Tesla V100-SXM2-16GB", "fp16", 125),
        ("Tesla V100-PCIE-32GB", "tf32", 14),  # no tf32 tensor cores: the fp32 peak
        ("Tesla T4", "fp16", 65),
        ("NVIDIA GeForce RTX 4090", "bf16", 165.2),
        ("NVIDIA GeForce RTX 3090", "fp16", 71),
    ],
)
def test_the_peak_table_by_device_name(name, precision, tflops) -> None:
    assert peak_flops(name, precision) == pytest.approx(tflops * 1e12)


@pytest.mark.parametrize(
    ("name", "precision"),
    [
        ("NVIDIA A10", "bf16"),  # not an A100, nor an A10G
        ("NVIDIA L40S", "bf16"),  # not an L4
        ("NVIDIA GeForce RTX 3090 Ti", "bf16"),  # other peaks than the 3090
        ("NVIDIA GeForce RTX 4090 Laptop GPU", "bf16"),
        ("NVIDIA A100-SXM4-40GB MIG 1g.5gb", "bf16"),  # a slice: a fraction of the peak
        ("Tesla T4", "bf16"),  # no bf16 tensor cores
        ("NVIDIA H100 80GB HBM3", "fp8"),
    ],
)
def test_no_peak_for_a_gpu_or_precision_the_table_lacks(name, precision) -> None:
    assert peak_flops(name, precision) is None


def _gpu_trainer(mixed_precision: str) -> SimpleNamespace:
    return SimpleNamespace(accelerator=SimpleNamespace(device=torch.device("cuda", 0), mixed_precision=mixed_precision))


def test_the_device_peak_follows_the_run_precision_and_says_once_when_unknown(monkeypatch) -> None:
    name = "NVIDIA H100 80GB HBM3"
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda device=None: name)
    assert _device_peak(_gpu_trainer("bf16")) == pytest.approx(989.5e12)
    assert _device_peak(_gpu_trainer("no")) == pytest.approx(67e12)
    previous = torch.get_float32_matmul_precision()
    try:
        torch.set_float32_matmul_precision("high")  # tf32 matmuls
        assert _device_peak(_gpu_trainer("no")) == pytest.approx(494.5e12)
    finally:
        torch.set_float32_matmul_precision(previous)
    name = "NVIDIA B300"
    with pytest.warns(UserWarning, match=r"no train/mfu .*no dense bf16 peak for 'NVIDIA B300'.*peak_tflops") as seen:
        assert _device_peak(_gpu_trainer("bf16")) is None
    assert len(seen) == 1
    assert _device_peak(SimpleNamespace(accelerator=SimpleNamespace(device=torch.device("cpu")))) is None


def test_mfu_is_flops_per_sample_times_samples_per_second_over_the_peak() -> None:
    summary = ModelSummary(image_size=64, audio_samples=16000)
    meter = Throughput(every_n_steps=2, peak_tflops=0.5)
    trainer, model = _fit([meter, summary])
    flops = training_flops(model, summary.rows)
    # hunter_tiny trains every branch: 2 FLOPs per multiply-add, x 3 for forward and backward
    assert flops == 6 * summary.rows[-1].macs > 0
    assert meter.mfu == pytest.approx(flops * meter.samples_per_sec / 0.5e12, rel=1e-12)
    assert trainer.state.logs["train/mfu"] == meter.mfu


def test_without_a_summary_the_meter_counts_the_flops_itself_and_a_frozen_branch_counts_forward_only() -> None:
    model = create_model("hunter_tiny", num_classes=4)
    model.audio_encoder.requires_grad_(False)
    meter = Throughput(every_n_steps=2, peak_tflops=0.5)
    _fit([meter], model=model)
    rows = {r.branch: r.macs for r in ModelSummary().measure(model)}
    frozen = 2 * (3 * (rows["image"] + rows["fusion"] + rows["heads"]) + rows["audio"])
    assert meter.mfu == pytest.approx(frozen * meter.samples_per_sec / 0.5e12, rel=1e-12)


def test_no_mfu_on_a_cpu_without_a_peak_and_a_failed_count_says_so_once() -> None:
    meter = Throughput(every_n_steps=2)
    trainer, _ = _fit([meter])
    assert meter.mfu is None and "train/mfu" not in trainer.state.logs
    meter = Throughput(every_n_steps=2, peak_tflops=0.5)
    broken = Broken()
    with pytest.warns(UserWarning, match="no train/mfu in this run: the model summary has no multiply-adds") as seen:
        trainer, _ = _fit([meter, broken], steps=6)
    assert len([w for w in seen if "train/mfu" in str(w.message)]) == 1
    assert meter.mfu is None and "train/mfu" not in trainer.state.logs


def test_mfu_adds_no_host_sync_to_the_training_steps() -> None:
    def steps_syncs(meter):
        with count_host_syncs() as syncs, warnings.catch_warnings():
            warnings.simplefilter("ignore")
            _fit([StepLabel(syncs), meter], steps=20, every=10, n=40)
        return Counter(r.label for r in syncs.inside("_train_step", outside=("save_checkpoint",))), syncs

    with_mfu, syncs = steps_syncs(Throughput(peak_tflops=0.5))
    without, _ = steps_syncs(Throughput())
    assert with_mfu == without, syncs.report(syncs.inside("_train_step"))
    assert set(with_mfu) <= {10, 20}  # quiet steps: none
