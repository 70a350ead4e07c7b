"""`Throughput`: samples/s, time per optimizer step, and the fraction of time spent waiting for data."""

from __future__ import annotations

import re
import time
import warnings
from typing import TYPE_CHECKING

import torch

from sss.callbacks.base import Callback
from sss.callbacks.model_summary import BranchSummary, ModelSummary, training_flops

if TYPE_CHECKING:
    from sss.trainer.module import LitModule
    from sss.trainer.trainer import SSSTrainer

__all__ = ["PEAK_TFLOPS", "Throughput", "peak_flops"]

# Dense peak TFLOP/s (no 2:4 sparsity: datasheets print the sparse figure, twice the dense one, with a *),
# fp16/bf16 with FP32 accumulate, as PyTorch runs them; tf32 is the tensor-core figure for fp32 matmuls.
PEAK_TFLOPS: dict[str, dict[str, float]] = {
    # A100 datasheet (nvidia-a100-datasheet-us-nvidia-1758950-r4-web.pdf): SXM and PCIe alike
    "a100": {"fp32": 19.5, "tf32": 156, "bf16": 312, "fp16": 312},
    # H100 datasheet (resources.nvidia.com/en-us-tensor-core/nvidia-tensor-core-gpu-datasheet): sparse / 2
    "h100-sxm": {"fp32": 67, "tf32": 494.5, "bf16": 989.5, "fp16": 989.5},
    "h100-pcie": {"fp32": 51, "tf32": 378, "bf16": 756.5, "fp16": 756.5},
    "h100-nvl": {"fp32": 60, "tf32": 417.5, "bf16": 835.5, "fp16": 835.5},
    # H200 datasheet (nvidia.com/en-us/data-center/h200): the H100's compute, more memory
    "h200-sxm": {"fp32": 67, "tf32": 494.5, "bf16": 989.5, "fp16": 989.5},
    "h200-nvl": {"fp32": 60, "tf32": 417.5, "bf16": 835.5, "fp16": 835.5},
    # L4 datasheet (nvidia.com/en-us/data-center/l4): sparse / 2
    "l4": {"fp32": 30.3, "tf32": 60, "bf16": 121, "fp16": 121},
    # A10 datasheet (a10-datasheet.pdf); AWS's A10G has no NVIDIA sheet of its own (Lightning uses these too)
    "a10g": {"fp32": 31.2, "tf32": 62.5, "bf16": 125, "fp16": 125},
    # V100 datasheet (volta-v100-datasheet-update-us-1165301-r5.pdf): no bf16 or tf32 tensor cores
    "v100-sxm": {"fp32": 15.7, "fp16": 125},
    "v100-pcie": {"fp32": 14, "fp16": 112},
    "v100s": {"fp32": 16.4, "fp16": 130},
    # T4 datasheet (t4-tensor-core-datasheet-951643.pdf): no bf16 or tf32 tensor cores
    "t4": {"fp32": 8.1, "fp16": 65},
    # Ada (AD102) whitepaper, appendix A, and Ampere GA102 whitepaper, appendix A: FP32-accumulate figures
    "rtx4090": {"fp32": 82.6, "tf32": 82.6, "bf16": 165.2, "fp16": 165.2},
    "rtx3090": {"fp32": 35.6, "tf32": 35.6, "bf16": 71, "fp16": 71},
}
"""Dense peak TFLOP/s per GPU and precision (``fp32``, ``tf32``, ``bf16``, ``fp16``), from vendor datasheets."""

# torch.cuda.get_device_name() -> PEAK_TFLOPS key; first match wins. Anchored so that an A10 is not an A100,
# an L40S not an L4, and a 3090 Ti, 4090 D or laptop 4090 (other peaks) is not in the table.
_NAMES = (
    (r"\bH100\b.*\bNVL\b", "h100-nvl"),
    (r"\bH100\b.*\b(PCIe|HBM2e)\b", "h100-pcie"),
    (r"\bH100\b", "h100-sxm"),
    (r"\bH200\b.*\bNVL\b", "h200-nvl"),
    (r"\bH200\b", "h200-sxm"),
    (r"\bA100\b", "a100"),
    (r"\bA10G$", "a10g"),
    (r"\bL4$", "l4"),
    (r"\bV100S\b", "v100s"),
    (r"\bV100-PCIE\b", "v100-pcie"),
    (r"\bV100\b", "v100-sxm"),
    (r"\bT4$", "t4"),
    (r"\bRTX 4090$", "rtx4090"),
    (r"\bRTX 3090$", "rtx3090"),
)


def peak_flops(device_name: str, precision: str) -> float | None:
    """Dense peak FLOP/s of a GPU, by its ``torch.cuda.get_device_name()``, at a precision.

    A GPU without tf32 tensor cores runs tf32-allowed fp32 at its fp32 peak. A MIG slice has a
    fraction of the GPU's peak, so it is not looked up.

    Args:
        device_name: The GPU's name, e.g. ``"NVIDIA H100 80GB HBM3"``.
        precision: ``fp32``, ``tf32``, ``bf16`` or ``fp16``.

    Returns:
        FLOP/s from `PEAK_TFLOPS`, or None for a GPU or precision not in it.

    Example:
        >>> peak_flops("NVIDIA A100-SXM4-80GB", "bf16") / 1e12
        312.0
        >>> peak_flops("NVIDIA A10", "bf16") is None, peak_flops("Tesla T4", "bf16") is None
        (True, True)
    """
    if " MIG " in f"{device_name} ":
        return None
    kind = next((kind for pattern, kind in _NAMES if re.search(pattern, device_name, re.IGNORECASE)), None)
    peaks = PEAK_TFLOPS.get(kind, {}) if kind else {}
    tflops = peaks.get(precision) or (peaks.get("fp32") if precision == "tf32" else None)
    return tflops * 1e12 if tflops else None


def _precision(trainer: SSSTrainer) -> str:
    # What the matmuls run in: autocast's dtype, else fp32 (tf32 where torch allows it for fp32 matmuls)
    mixed = str(trainer.accelerator.mixed_precision)
    if mixed != "no":
        return mixed
    return "fp32" if torch.get_float32_matmul_precision() == "highest" else "tf32"


class Throughput(Callback):
    """Every N optimizer steps: ``train/samples_per_sec``, ``train/step_time_s`` and ``train/data_wait_fraction``.

    Data wait is the host time between one BATCH_END and the next BATCH_START (the loader producing
    the next batch), plus the time from EPOCH_START to the first batch (worker start-up); checkpoint
    saves are not counted. A fraction near 1 means the loader is the bottleneck: raise
    ``num_workers`` or cache decoded data. On CUDA the times are host times: the GPU queue can hide
    a slow loader, never invent one. `every_n_steps` defaults to ``trainer.log.every_n_steps``.

    Only this process's training counts: the sanity validation before the first epoch and the
    validations and saves between epochs are left out, and the first window after a resume counts
    from the checkpoint's step and samples, never from step 0. A run resumed mid-epoch starts its
    loader past the batches already trained; a map-style dataset skips them for free, an iterable
    one reads them, and that shows as data wait in the first window.

    On a GPU of `PEAK_TFLOPS` it also logs ``train/mfu``, the model FLOPs utilisation: FLOPs per
    sample (`sss.callbacks.model_summary.training_flops`: 2 per multiply-add of the model summary's
    forward, x 3 for a branch that trains) x samples/s / the GPU's dense peak at the run's precision
    (``bf16``/``fp16`` under mixed precision, else ``fp32``, or ``tf32`` where
    ``torch.set_float32_matmul_precision`` allows it). The FLOPs are counted once at fit start on a
    one-sample dummy batch of the datamodule's sizes (`ModelSummary.measure`), so MFU adds no host
    sync. On a CPU, an unlisted GPU or precision, or a MIG slice there is no ``train/mfu`` (the last
    three say so once) unless `peak_tflops` gives the peak.

    Args:
        every_n_steps: Optimizer steps per figure; None: ``trainer.log.every_n_steps``.
        peak_tflops: This device's peak TFLOP/s at the run's precision, in place of the table's.

    Example:
        >>> from sss import SSSTrainer
        >>> from sss.testing import boring_loader, BoringModule
        >>> trainer = SSSTrainer(max_steps=4, callbacks=[Throughput(every_n_steps=2)], mixed_precision="no",
        ...                      log={"progress": False, "trackers": []}, checkpoint={"every_epoch": False})
        sss: mixed precision no
        >>> _ = trainer.fit(BoringModule(), train_dataloaders=boring_loader())
        >>> 0.0 <= trainer.state.logs["train/data_wait_fraction"] <= 1.0
        True
    """

    def __init__(self, every_n_steps: int | None = None, peak_tflops: float | None = None) -> None:
        self.every_n_steps = every_n_steps
        self.peak_tflops = peak_tflops
        self.mfu: float | None = None
        """The last ``train/mfu``; None while there is none."""
        self._peak: float | None = None
        self._rows: list[BranchSummary] | None = None
        self._summary: ModelSummary | None = None
        self.samples_per_sec = 0.0
        self.step_time_s = 0.0
        self.data_wait_fraction = 0.0
        self._last_end: float | None = None
        self._wait = 0.0
        self._window_start = 0.0
        self._window_samples = 0
        self._window_steps = 0
        self._gap_start: float | None = None

    def on_fit_start(self, trainer: SSSTrainer, module: LitModule) -> None:
        if self.every_n_steps is None:
            self.every_n_steps = trainer.config.log.every_n_steps
        self._reset(trainer)  # after load_checkpoint: a resumed run's samples so far are not this window's
        self._gap_start = self._window_start  # until the first epoch starts: the sanity validation, not training
        self.mfu, self._rows, self._summary = None, None, None
        self._peak = self.peak_tflops * 1e12 if self.peak_tflops else _device_peak(trainer)
        if self._peak is None:
            return
        # The FLOPs per sample: a ModelSummary's, which it measures at fit start on the main process, else our own.
        self._summary = next((c for c in trainer.callbacks if isinstance(c, ModelSummary)), None)
        if self._summary is None or not trainer.accelerator.is_main_process:
            self._summary = None
            try:
                self._rows = ModelSummary().measure(module, getattr(trainer, "datamodule", None))
            except Exception as err:  # a meter must never stop a run
                self._omit(f"counting the model's FLOPs failed ({type(err).__name__}: {err})")

    def _reset(self, trainer: SSSTrainer) -> None:
        self._window_start = time.perf_counter()
        self._window_samples, self._window_steps, self._wait = trainer.state.samples, 0, 0.0

    def on_epoch_start(self, trainer: SSSTrainer, module: LitModule) -> None:
        now = time.perf_counter()
        if self._gap_start is not None:  # validation and saves between epochs are not training time
            self._window_start += now - self._gap_start
            self._gap_start = None
        self._last_end = now  # from here to the first batch: the loader (and its workers) starting

    def on_epoch_end(self, trainer: SSSTrainer, module: LitModule) -> None:
        # from the epoch's last batch on, the time went to validation and saving
        self._gap_start, self._last_end = self._last_end or time.perf_counter(), None

    def on_batch_start(self, trainer: SSSTrainer, module: LitModule) -> None:
        if self._last_end is not None:
            self._wait += time.perf_counter() - self._last_end
            self._last_end = None

    def on_batch_end(self, trainer: SSSTrainer, module: LitModule) -> None:
        self._last_end = time.perf_counter()

    def on_save_checkpoint(self, trainer: SSSTrainer, module: LitModule) -> None:
        if self._last_end is not None:  # a save between batches is not data wait
            self._last_end = time.perf_counter()

    def on_after_optimizer_step(self, trainer: SSSTrainer, module: LitModule) -> None:
        self._window_steps += 1
        if trainer.state.global_step % self.every_n_steps and self._window_steps < self.every_n_steps:
            return
        elapsed = max(time.perf_counter() - self._window_start, 1e-9)
        self.samples_per_sec = (trainer.state.samples - self._window_samples) / elapsed
        self.step_time_s = elapsed / self._window_steps
        self.data_wait_fraction = min(self._wait / elapsed, 1.0)
        logs = trainer.state.logs
        logs["train/samples_per_sec"] = self.samples_per_sec
        logs["train/step_time_s"] = self.step_time_s
        logs["train/data_wait_fraction"] = self.data_wait_fraction
        if self._peak is not None:
            self._log_mfu(trainer, module)
        self._reset(trainer)

    def _log_mfu(self, trainer: SSSTrainer, module: LitModule) -> None:
        # host numbers only: samples/s, the FLOPs counted at fit start and requires_grad flags (no device sync)
        rows = self._rows if self._summary is None else self._summary.rows
        flops = training_flops(module, rows) if rows else None
        if flops is None:
            self._omit("the model summary has no multiply-adds (its dummy batch failed)")
            return
        assert self._peak is not None
        self.mfu = flops * self.samples_per_sec / self._peak
        trainer.state.logs["train/mfu"] = self.mfu

    def _omit(self, why: str) -> None:
        self._peak = None  # said once: no MFU for the rest of this fit
        warnings.warn(f"Throughput: no train/mfu in this run: {why}", stacklevel=2)


def _device_peak(trainer: SSSTrainer) -> float | None:
    # The table's peak for this process's GPU at the run's precision; None, said once, for one not in it; on a CPU,
    # None silently (a CPU's peak depends on its cores, clocks and vector units: pass Throughput(peak_tflops=)).
    device = trainer.accelerator.device
    if device.type != "cuda":
        return None
    name, precision = torch.cuda.get_device_name(device), _precision(trainer)
    peak = peak_flops(name, precision)
    if peak is None:
        warnings.warn(
            f"Throughput: no train/mfu in this run: no dense {precision} peak for {name!r} in "
            "sss.callbacks.throughput.PEAK_TFLOPS (an unlisted GPU or precision, or a MIG slice); "
            "pass Throughput(peak_tflops=...) with its datasheet figure",
            stacklevel=3,
        )
    return peak
