"""`Profiler`: a few optimizer steps under ``torch.profiler``, as a trace, TensorBoard profile files and a summary.

The profiler starts at FIT_START and takes one step per optimizer step (at the BATCH_END of the
micro-batch that closed an accumulation window), so each ``ProfilerStep#N`` span of the trace is one
whole optimizer step: its micro-batches, their data fetches and the callbacks between them.
``torch.profiler.schedule(wait, warmup, active, repeat)`` picks the steps recorded; the first span
also holds the sanity validation, which the default ``wait=1`` leaves out.
"""

from __future__ import annotations

import os
import shutil
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch

from sss.callbacks.base import Callback

if TYPE_CHECKING:
    from sss.trainer.module import LitModule
    from sss.trainer.trainer import SSSTrainer

__all__ = ["Profiler", "summarize"]

_ACTIVITIES = ("cpu", "cuda", "xpu", "mtia")

_LOADER = "enumerate(DataLoader)#"
"""The prefix of the span torch's DataLoader records around each batch fetch (its ``__next__``)."""


class Profiler(Callback):
    """Profiles optimizer steps with ``torch.profiler``; writes ``OUTPUT_DIR/profile`` and prints the top operators.

    Each recorded window (``active`` steps after ``wait`` + ``warmup``, ``repeat`` times) is written as a
    Chrome/Perfetto trace ``trace_step_N.json`` (N: the global step at the window's end; open it at
    https://ui.perfetto.dev or chrome://tracing) and, for TensorBoard's profile plugin
    (``pip install torch-tb-profiler``; ``tensorboard --logdir OUT_DIR``), the same file as
    ``tensorboard/rank<R>.<N>.pt.trace.json``. The main process prints the ten operators with the
    most self time and the share of the steps spent waiting for the data loader (its fetch spans).
    Several processes each write their own trace (``.rank<R>`` in the name).

    Args:
        wait: Optimizer steps skipped before each window (the first one holds the sanity validation).
        warmup: Steps profiled but discarded (the profiler's own start-up cost).
        active: Steps recorded per window.
        repeat: Windows (0: until the fit ends).
        activities: ``"cpu"``, ``"cuda"``, ...; None: the CPU, and CUDA when the trainer's device is a GPU.
        record_shapes: Record operator input shapes.
        profile_memory: Record tensor allocations.
        with_stack: Record Python stacks (large traces).
        out_dir: Where to write; None: ``OUTPUT_DIR/profile``.

    Example:
        >>> from sss import SSSTrainer
        >>> from sss.testing import BoringModule, boring_loader
        >>> import tempfile
        >>> out = tempfile.mkdtemp()
        >>> trainer = SSSTrainer(max_steps=4, mixed_precision="no", output_dir=out, callbacks=[Profiler(active=2)])
        sss: mixed precision no
        >>> _ = trainer.fit(BoringModule(), train_dataloaders=boring_loader())  # doctest: +ELLIPSIS
        sss: profiler: optimizer steps 3-4: ... ms per step, ...% of it waiting for data ...
        >>> sorted(p.name for p in (Path(out) / "profile").glob("*.json"))
        ['trace_step_4.json']
    """

    def __init__(
        self,
        wait: int = 1,
        warmup: int = 1,
        active: int = 3,
        repeat: int = 1,
        activities: Sequence[str] | None = None,
        record_shapes: bool = True,
        profile_memory: bool = True,
        with_stack: bool = False,
        out_dir: str | Path | None = None,
    ) -> None:
        if min(wait, warmup, repeat) < 0 or active < 1:
            raise ValueError(
                f"Profiler: wait, warmup and repeat must be >= 0 and active >= 1, got {wait=}, "
                f"{warmup=}, {active=}, {repeat=}"
            )
        unknown = [a for a in activities or () if a not in _ACTIVITIES]
        if unknown:
            raise ValueError(f"Profiler: unknown activities {unknown}; choose from {', '.join(_ACTIVITIES)}")
        self.wait, self.warmup, self.active, self.repeat = wait, warmup, active, repeat
        self.activities = None if activities is None else list(activities)
        self.record_shapes, self.profile_memory, self.with_stack = record_shapes, profile_memory, with_stack
        self.out_dir = None if out_dir is None else Path(out_dir)
        self.files: list[Path] = []
        """The traces written (``trace_step_N.json``), in order."""
        self.summaries: list[str] = []
        """What the main process printed for each window."""
        self._prof: torch.profiler.profile | None = None
        self._trainer: SSSTrainer | None = None
        self._window_start = 0

    def on_fit_start(self, trainer: SSSTrainer, module: LitModule) -> None:
        self._trainer = trainer
        names = self.activities
        if names is None:
            names = ["cpu", "cuda"] if trainer.accelerator.device.type == "cuda" else ["cpu"]
        activities = [getattr(torch.profiler.ProfilerActivity, name.upper()) for name in names]
        schedule = torch.profiler.schedule(wait=self.wait, warmup=self.warmup, active=self.active, repeat=self.repeat)
        self._prof = torch.profiler.profile(
            activities=activities,
            schedule=schedule,
            on_trace_ready=self._write,
            record_shapes=self.record_shapes,
            profile_memory=self.profile_memory,
            with_stack=self.with_stack,
        )
        self._prof.start()
        self._window_start = trainer.state.global_step + self.wait + self.warmup + 1

    def on_batch_end(self, trainer: SSSTrainer, module: LitModule) -> None:
        if self._prof is not None and trainer.state.micro_step == 0:  # this micro-batch closed a window
            self._prof.step()

    def on_fit_end(self, trainer: SSSTrainer, module: LitModule) -> None:
        self._stop(trainer)

    def on_exception(self, trainer: SSSTrainer, module: LitModule) -> None:
        try:
            self._stop(trainer)  # what was recorded before the failure is written
        except Exception:  # the fit's own error is the one to surface, not the profiler's
            self._prof = None

    def _stop(self, trainer: SSSTrainer) -> None:
        prof, self._prof = self._prof, None
        if prof is None:
            return
        prof.stop()  # a window still recording is written now, shorter
        if not self.files and trainer.accelerator.is_main_process:
            print(
                f"sss: profiler: the fit ended before the first recorded step (after wait={self.wait} + "
                f"warmup={self.warmup} optimizer steps): nothing written; train longer or lower them",
                flush=True,
            )

    def _write(self, prof: torch.profiler.profile) -> None:
        trainer = self._trainer
        accelerator, step = trainer.accelerator, trainer.state.global_step
        out = self.out_dir if self.out_dir is not None else trainer.output_dir / "profile"
        out.mkdir(parents=True, exist_ok=True)
        rank = f".rank{accelerator.process_index}" if accelerator.num_processes > 1 else ""
        trace = _free(out / f"trace_step_{step}{rank}.json")  # a resumed run profiling the same steps keeps both
        prof.export_chrome_trace(str(trace))
        board = out / "tensorboard"
        board.mkdir(exist_ok=True)
        # The name torch.profiler.tensorboard_trace_handler gives ("<worker>.<span>.pt.trace.json"), which
        # TensorBoard's profile plugin reads; a hard link, not a second export of the same trace.
        _link(trace, _free(board / f"rank{accelerator.process_index}.{step}.pt.trace.json"))
        self.files.append(trace)
        first = self._window_start
        self._window_start = step + self.wait + self.warmup + 1
        if accelerator.is_main_process:
            text = summarize(prof, first, step, trace)
            self.summaries.append(text)
            print(text, flush=True)


def summarize(prof: Any, first: int, last: int, trace: Path, top: int = 10) -> str:
    """The lines printed for a recorded window: steps, time per step, the loader's share, the top operators.

    The data-wait share is the time in the DataLoader's fetch spans (``enumerate(DataLoader)#...``)
    over the time of the ``ProfilerStep#`` spans; with loader workers, it is the main process waiting for them.
    """
    averages = prof.key_averages()
    steps = [e for e in averages if e.key.startswith("ProfilerStep")]  # "ProfilerStep*": all spans as one
    step_us = sum(e.cpu_time_total for e in steps)
    fetch_us = sum(e.cpu_time_total for e in averages if e.key.startswith(_LOADER))
    count = sum(e.count for e in steps) or 1
    cuda = any(getattr(e, "self_device_time_total", 0) for e in averages)
    sort = "self_cuda_time_total" if cuda else "self_cpu_time_total"
    share = f"{100 * fetch_us / step_us:.1f}%" if step_us else "n/a"
    head = (
        f"sss: profiler: optimizer steps {first}-{last}: {step_us / count / 1000:.1f} ms per step, "
        f"{share} of it waiting for data (the loader's fetch); trace {trace}"
    )
    table = averages.table(sort_by=sort, row_limit=top, max_name_column_width=60)
    return f"{head}\nsss: profiler: top {top} operators by self {'CUDA' if cuda else 'CPU'} time:\n{table}"


def _free(path: Path) -> Path:
    n, candidate = 0, path
    while candidate.exists():
        n += 1
        stem, _, ext = path.name.partition(".")
        candidate = path.with_name(f"{stem}_{n}.{ext}")
    return candidate


def _link(source: Path, target: Path) -> None:
    try:
        os.link(source, target)
    except OSError:  # a file system without hard links
        shutil.copyfile(source, target)
