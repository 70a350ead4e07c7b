"""``sss tune lr``: the learning-rate range test (an "LR finder"), on a copy of the run.

The LR grows geometrically from ``min_lr`` to ``max_lr`` over ``steps`` optimizer steps of the
run's own data, model, optimizer, precision and accumulation (as Lightning's ``Tuner.lr_find`` and
fastai's ``lr_find``); the loss of each step is recorded, smoothed (an exponential moving average
with bias correction), and the test stops early once the smoothed loss passes ``diverge`` times its
best. The suggestion is Lightning's: the LR where the smoothed loss falls fastest (the steepest
negative slope against log LR), skipping the first 10 steps and the last one.

Everything is built afresh (`sss.run.parts.build_parts`) in a temporary output folder with no
callback but the recorder: no checkpoint, tracker, plot or progress bar, and the RNG state of the
process (Python, NumPy, torch, CUDA) is restored afterwards, so a fit after a ``tune lr`` in the
same process trains bitwise what it would have without it.
"""

from __future__ import annotations

import copy
import dataclasses
import json
import math
import sys
import tempfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

from sss import checkpoint as ckpt_io
from sss.callbacks.base import Callback
from sss.config import SSSConfig
from sss.errors import SSSError
from sss.run.parts import build_parts
from sss.trainer.trainer import SSSTrainer

__all__ = ["LRFindError", "LRFindResult", "lr_find", "print_result", "sparkline", "steepest_descent", "write_result"]

LR_KEY = "trainer.optim.optimizer.lr"


class LRFindError(SSSError):
    """The LR range test cannot run or found nothing: the message names the key or flag to change."""


@dataclass
class LRFindResult:
    """The curve of an LR range test and its suggestion.

    Example:
        >>> result = LRFindResult(lrs=[1e-3, 1e-2], losses=[1.0, 0.5], raw_losses=[1.0, 0.4])
        >>> result.suggestion is None, result.stopped_early
        (True, False)
    """

    lrs: list[float]
    """The LR of each recorded step (the first parameter group's), increasing."""
    losses: list[float]
    """The smoothed loss at each LR (the mean over processes, then the moving average)."""
    raw_losses: list[float] = field(default_factory=list)
    """The loss of each step as it was (the mean over the step's micro-batches and the processes)."""
    suggestion: float | None = None
    """The suggested ``trainer.optim.optimizer.lr`` (None: too few steps before the loss diverged)."""
    stopped_early: bool = False
    """True when the loss diverged before the last step."""
    notes: list[str] = field(default_factory=list)
    """What the test had to adapt (the data cycled, a short curve), one sentence each."""

    def to_json(self) -> dict[str, Any]:
        """The result as a JSON-serialisable dict."""
        return dataclasses.asdict(self)


def lr_find(
    cfg: SSSConfig,
    *,
    steps: int = 100,
    min_lr: float = 1e-7,
    max_lr: float = 1.0,
    diverge: float = 4.0,
    beta: float = 0.98,
) -> LRFindResult:
    """Run the LR range test of `cfg` on a copy of its parts; `cfg` and the process's RNG state are left as they were.

    Args:
        cfg: The run's config (as ``sss fit`` would train it). It must set ``trainer.optim.optimizer.lr``.
        steps: Optimizer steps of the test; the training data is cycled (epoch after epoch) when it is shorter.
        min_lr: The LR of the first step.
        max_lr: The LR of the last step.
        diverge: Stop once the smoothed loss exceeds this multiple of its best.
        beta: Smoothing of the loss (an exponential moving average, bias-corrected).

    Returns:
        The `LRFindResult` (``lrs``, ``losses``, ``suggestion``).

    Raises:
        LRFindError: No ``trainer.optim.optimizer.lr`` in `cfg`, a bad range, or a loss that is not
            finite at the first step.

    Example:
        >>> from sss.config import load_config
        >>> parts = ["model._target_=sss.testing.BoringModule", "data._target_=sss.testing.BoringDataModule"]
        >>> cfg = load_config(None, [*parts, "trainer.mixed_precision=no"])
        >>> result = lr_find(cfg, steps=20, min_lr=1e-4, max_lr=1.0)  # doctest: +ELLIPSIS
        sss: mixed precision no
        ...
        >>> len(result.lrs) <= 20 and result.lrs == sorted(result.lrs)
        True
    """
    base_lr = _configured_lr(cfg)
    if not (0 < min_lr < max_lr) or steps < 2 or diverge <= 1 or not 0 <= beta < 1:
        raise LRFindError(
            f"sss tune lr: need 0 < --min-lr < --max-lr, --steps >= 2 (got min_lr={min_lr}, max_lr={max_lr}, "
            f"steps={steps}; diverge={diverge} must be > 1 and beta={beta} in [0, 1))"
        )
    saved = ckpt_io.get_rng_state()
    try:
        return _range_test(cfg, base_lr, steps, min_lr, max_lr, diverge, beta)
    finally:
        ckpt_io.set_rng_state(saved)  # a fit after this one draws what it would have drawn without it


def _configured_lr(cfg: SSSConfig) -> float:
    lr = cfg.trainer.optim.optimizer.get("lr")
    if not isinstance(lr, (int, float)) or isinstance(lr, bool) or lr <= 0:
        target = cfg.trainer.optim.optimizer.get("_target_", "the optimizer")
        raise LRFindError(
            f"sss tune lr: {LR_KEY} is {lr!r} in this config ({target}): the range test sets the LR of that "
            f"key, so it needs a positive number there; add e.g. {LR_KEY}=1e-3"
        )
    return float(lr)


def _range_test(
    cfg: SSSConfig, base_lr: float, steps: int, min_lr: float, max_lr: float, diverge: float, beta: float
) -> LRFindResult:
    work = copy.deepcopy(cfg)  # the caller's config (and what a later fit builds from it) stays as it was
    with tempfile.TemporaryDirectory(prefix="sss-lr-find-") as tmp:
        t = work.trainer
        work.trainer = dataclasses.replace(
            t,
            output_dir=tmp,
            max_steps=steps,
            max_epochs=None,  # cycle the data when one epoch is shorter than the test
            fast_dev_run=0,
            resume="never",
            sanity_val_batches=0,
            optim=dataclasses.replace(t.optim, scheduler=None),  # the range test's schedule replaces the run's
            checkpoint=dataclasses.replace(t.checkpoint, every_epoch=False, every_n_steps=None, on_signal=False),
            log=dataclasses.replace(t.log, trackers=[], progress=False, summary=False, plots=False),
        )
        parts = build_parts(work, init_from=True)  # the range test is of the model the run will train
        recorder = _Recorder(min_lr, max_lr, steps, diverge, beta)
        trainer = SSSTrainer(work.trainer, callbacks=[recorder])
        loader = parts.datamodule.train_dataloader() if hasattr(parts.datamodule, "train_dataloader") else None
        if loader is None:
            raise LRFindError("sss tune lr: the config's data section gives no training data (data._target_)")
        notes = _cycling_note(loader, work, steps)
        trainer.fit(parts.module, train_dataloaders=loader)  # training data only: no validation pass
        main = trainer.accelerator.is_main_process
    result = recorder.result(base_lr)
    result.notes = notes + result.notes
    if main:
        for note in result.notes:
            print(f"sss: tune lr: {note}", flush=True)
    return result


def _cycling_note(loader: Any, cfg: SSSConfig, steps: int) -> list[str]:
    t = cfg.trainer
    if not hasattr(loader, "__len__"):
        return []
    batches = len(loader)
    if t.limit_train_batches:
        batches = min(batches, t.limit_train_batches)
    per_epoch = max(1, math.ceil(batches / t.gradient_accumulation_steps))  # before the launch shards it
    if per_epoch >= steps:
        return []
    return [
        f"one epoch of the training data is {per_epoch} optimizer step(s) (or fewer per process), fewer than "
        f"--steps {steps}: the test cycles through the data {math.ceil(steps / per_epoch)} time(s)"
    ]


class _Recorder(Callback):
    """The range test as a callback: its LR schedule (set at FIT_START), the loss record and the early stop."""

    def __init__(self, min_lr: float, max_lr: float, steps: int, diverge: float, beta: float) -> None:
        self.min_lr, self.max_lr, self.steps, self.diverge, self.beta = min_lr, max_lr, steps, diverge, beta
        self.lrs: list[float] = []
        self.raw: list[float] = []
        self.smooth: list[float] = []
        self.stopped_early = False
        self._pending: list[torch.Tensor] = []
        self._lr = 0.0
        self._first_lr = 1.0
        self._avg = 0.0
        self._window_loss = math.nan

    def on_fit_start(self, trainer: SSSTrainer, module: Any) -> None:
        optimizer = getattr(trainer.optimizer, "optimizer", trainer.optimizer)  # the one under Accelerate's wrapper
        self._first_lr = float(optimizer.param_groups[0]["lr"])
        start, growth = self.min_lr / self._first_lr, (self.max_lr / self.min_lr) ** (1 / (self.steps - 1))
        # Every group's LR is multiplied by the same factor: groups set apart by param_groups keep their ratio.
        trainer.scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda step: start * growth**step)

    def on_batch_end(self, trainer: SSSTrainer, module: Any) -> None:
        if trainer.state.micro_step:  # inside an accumulation window: its losses are averaged at its end
            self._pending.append(trainer.state.loss)

    def on_after_backward(self, trainer: SSSTrainer, module: Any) -> None:
        self._lr = float(trainer.optimizer.param_groups[0]["lr"])  # the LR this window's step uses
        window = torch.stack([*(loss.float() for loss in self._pending), trainer.state.loss.float()]).mean()
        self._pending = []
        self._window_loss = float(trainer.accelerator.reduce(window.to(trainer.accelerator.device), "mean"))

    def on_after_optimizer_step(self, trainer: SSSTrainer, module: Any) -> None:
        if trainer.state.step_was_skipped:  # an fp16 overflow: no update at this LR, and the LR stays
            return
        loss = self._window_loss
        if not math.isfinite(loss) and not self.raw:
            raise LRFindError(
                f"sss tune lr: the loss is {loss} at the first step (lr={self._lr:.3g}), before the LR grew: the "
                "model or data gives no finite loss to begin with; check them with `sss fit CONFIG --debug`"
            )
        self.lrs.append(self._lr)
        self.raw.append(loss)
        if not math.isfinite(loss):  # the LR is far too high
            self.smooth.append(loss)
            self._stop(trainer)
            return
        self._avg = self.beta * self._avg + (1 - self.beta) * loss
        smoothed = self._avg / (1 - self.beta ** len(self.raw))
        self.smooth.append(smoothed)
        best = min(s for s in self.smooth if math.isfinite(s))
        if len(self.smooth) > 1 and smoothed > self.diverge * best:
            self._stop(trainer)

    def _stop(self, trainer: SSSTrainer) -> None:
        self.stopped_early = len(self.raw) < self.steps
        trainer.state.should_stop = True

    def result(self, base_lr: float) -> LRFindResult:
        suggestion, notes = steepest_descent(self.lrs, self.smooth), []
        if suggestion is not None:
            suggestion *= base_lr / self._first_lr  # as the optimizer's lr, when the first group has its own
        else:
            notes.append(
                f"the loss diverged after {len(self.raw)} step(s), too few for a suggestion: lower --min-lr "
                "or --max-lr, or raise --steps"
            )
        if self.stopped_early:
            notes.append(f"stopped after {len(self.raw)} of {self.steps} steps: the loss diverged")
        return LRFindResult(list(self.lrs), list(self.smooth), list(self.raw), suggestion, self.stopped_early, notes)


def steepest_descent(lrs: list[float], losses: list[float], skip_begin: int = 10, skip_end: int = 1) -> float | None:
    """The LR where `losses` falls fastest against log LR (Lightning's suggestion); None for fewer than 3 points.

    The first `skip_begin` and last `skip_end` points are left out (when enough remain): the
    moving average is still warming up at the start and may be exploding at the end.

    Example:
        >>> lrs = [10 ** (k / 4 - 5) for k in range(20)]
        >>> losses = [2.0] * 8 + [2.0 - 0.3 * k for k in range(1, 6)] + [0.5] * 7
        >>> round(steepest_descent(lrs, losses, skip_begin=0), 6)
        0.001
    """
    import numpy as np

    keep = [(lr, loss) for lr, loss in zip(lrs, losses, strict=True) if math.isfinite(loss)]
    if len(keep) - skip_begin - skip_end < 3:
        skip_begin, skip_end = 0, 0
    keep = keep[skip_begin : len(keep) - skip_end]
    if len(keep) < 3:
        return None
    x = np.log10([lr for lr, _ in keep])
    slope = np.gradient(np.array([loss for _, loss in keep]), x)
    return float(keep[int(np.argmin(slope))][0])


_BARS = "▁▂▃▄▅▆▇█"


def sparkline(lrs: list[float], losses: list[float], width: int = 60) -> str:
    """The loss against log LR as one line of block characters (`width` columns, the mean loss of each).

    Example:
        >>> sparkline([1e-4, 1e-3, 1e-2, 1e-1], [2.0, 1.5, 1.0, 3.0], width=4)
        '▅▃▁█'
    """
    points = [(math.log10(lr), loss) for lr, loss in zip(lrs, losses, strict=True) if math.isfinite(loss)]
    if not points:
        return ""
    lo, hi = points[0][0], points[-1][0]
    columns: list[list[float]] = [[] for _ in range(min(width, len(points)))]
    for x, loss in points:
        at = 0 if hi == lo else min(int((x - lo) / (hi - lo) * len(columns)), len(columns) - 1)
        columns[at].append(loss)
    means = [sum(c) / len(c) for c in columns if c]
    # Capped at twice the first value: a diverged tail would flatten the part of the curve that matters.
    low, high = min(means), max(means) if means[0] <= 0 else min(max(means), 2 * means[0])
    means = [min(m, high) for m in means]
    scale = (len(_BARS) - 1) / (high - low) if high > low else 0.0
    return "".join(_BARS[round((m - low) * scale)] for m in means)


def write_result(result: LRFindResult, folder: str | Path) -> tuple[Path, Path]:
    """Write the curve as ``lr_find.json`` and ``lr_find.png`` in `folder`; a name taken gets ``_1``, ``_2``, ...

    Nothing in `folder` is overwritten: when either file exists, both move on to the next free number.

    Example:
        >>> import tempfile
        >>> result = LRFindResult(lrs=[1e-3, 1e-2, 1e-1], losses=[1.0, 0.5, 2.0], suggestion=1e-2)
        >>> with tempfile.TemporaryDirectory() as tmp:
        ...     first, second = write_result(result, tmp), write_result(result, tmp)
        ...     [p.name for p in (*first, *second)]
        ['lr_find.json', 'lr_find.png', 'lr_find_1.json', 'lr_find_1.png']
    """
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    n, stem = 0, "lr_find"
    while (folder / f"{stem}.json").exists() or (folder / f"{stem}.png").exists():
        n += 1
        stem = f"lr_find_{n}"
    json_path, png_path = folder / f"{stem}.json", folder / f"{stem}.png"
    with open(json_path, "x") as handle:  # "x": never over a file that appeared meanwhile
        json.dump(result.to_json(), handle, indent=2)
    fig, ax = plt.subplots(figsize=(6, 4))
    ax.plot(result.lrs, result.raw_losses or result.losses, color="0.75", linewidth=1, label="loss")
    ax.plot(result.lrs, result.losses, linewidth=2, label="smoothed")
    if result.suggestion is not None:
        ax.axvline(result.suggestion, color="red", linestyle="--", label=f"suggestion {result.suggestion:.2e}")
    # The y range follows the smoothed curve: a diverging raw spike (often 10x the start) would flatten the
    # descent the suggestion is read from. Raw points above the range are drawn off the top.
    finite = [v for v in result.losses if math.isfinite(v)]
    if finite:
        raw = [v for v in (result.raw_losses or []) if math.isfinite(v)]
        low, high = min(finite + raw), max(finite[0], min(max(finite), 2 * finite[0]))
        pad = 0.1 * (high - low or abs(high) or 1.0)
        ax.set_ylim(low - pad, high + pad)
    ax.set_xscale("log")
    ax.set_xlabel("learning rate")
    ax.set_ylabel("training loss")
    ax.set_title("LR range test")
    ax.legend()
    fig.tight_layout()
    with open(png_path, "xb") as handle:
        fig.savefig(handle, format="png", dpi=100)
    plt.close(fig)
    return json_path, png_path


def print_result(result: LRFindResult, folder: str | Path, config: str, overrides: list[str], apply: bool) -> int:
    """Write the curve to `folder` (`write_result`) and print ``sss tune lr``'s summary; the command's exit code.

    The suggestion is printed as the override that sets it; with `apply`, also as the ``sss fit``
    command line of `config` and `overrides` with it. No suggestion (the notes say why) exits 1.

    Example:
        >>> import tempfile
        >>> result = LRFindResult(lrs=[1e-3, 1e-2, 1e-1], losses=[1.0, 0.5, 2.0], suggestion=1e-2)
        >>> with tempfile.TemporaryDirectory() as tmp:  # doctest: +ELLIPSIS
        ...     print_result(result, tmp, "x.yaml", ["trainer.optim.optimizer.lr=1"], apply=True)
        lr range test: 3 steps, lr 1.00e-03 .. 1.00e-01
        ...
        suggested lr: 1.00e-02 (steepest descent of the smoothed loss); use trainer.optim.optimizer.lr=1.00e-02
        sss fit x.yaml trainer.optim.optimizer.lr=1.00e-02
        0
    """
    json_path, png_path = write_result(result, folder)
    print(f"lr range test: {len(result.lrs)} steps, lr {result.lrs[0]:.2e} .. {result.lrs[-1]:.2e}")
    print(f"  {result.lrs[0]:.0e} {sparkline(result.lrs, result.losses)} {result.lrs[-1]:.0e}")
    print(f"curve: {png_path} and {json_path}")
    if result.suggestion is None:
        print("no suggestion: " + " ".join(result.notes), file=sys.stderr)
        return 1
    override = f"{LR_KEY}={result.suggestion:.2e}"
    print(f"suggested lr: {result.suggestion:.2e} (steepest descent of the smoothed loss); use {override}")
    if apply:
        kept = [o for o in overrides if not o.startswith(f"{LR_KEY}=")]
        print("sss fit " + " ".join([config, *kept, override]))
    return 0
