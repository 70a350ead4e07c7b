"""`ModelCheckpoint`: full-state checkpoints every N steps and at each epoch end, rotation, preemption."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import sys
import threading
from pathlib import Path
from typing import TYPE_CHECKING, Any, NoReturn

from sss.callbacks.base import Callback
from sss.checkpoint import (
    MARKER,
    FolderLock,
    checkpoint_step,
    complete_checkpoints,
    lock_folder,
    recover_leftovers,
    remove_checkpoint,
)

if TYPE_CHECKING:
    from sss.trainer.module import LitModule
    from sss.trainer.trainer import SSSTrainer

__all__ = ["REQUEUE_EXIT_CODE", "ModelCheckpoint", "Preempted"]

# SIGUSR1 is what SLURM sends before a job's time limit (``#SBATCH --signal=USR1@120``): save, then ask for a requeue.
# SIGHUP is a closed terminal or a dropped ssh session: a stop like SIGTERM, not a kill without a save.
_SIGNALS = ("SIGTERM", "SIGINT", "SIGHUP", "SIGUSR1")

REQUEUE_EXIT_CODE = 128 + signal.SIGUSR1 if hasattr(signal, "SIGUSR1") else 138
"""``sss fit``'s exit code after SIGUSR1 (138 on Linux: 128 + the signal, as for SIGTERM's 143): the checkpoint is
saved, requeue the job (``examples/slurm/train.sbatch`` runs ``scontrol requeue`` on it) and ``--resume auto``
continues from it."""


class Preempted(Exception):
    """Training stopped on SIGTERM/SIGINT/SIGHUP/SIGUSR1 after saving a checkpoint; the message says how to resume.

    ``sss fit`` exits with 128 + `signum`; for SIGUSR1 that is `REQUEUE_EXIT_CODE` (`requeue` is true).

    Example:
        >>> import signal
        >>> Preempted("stopped", signal.SIGUSR1).requeue, Preempted("stopped", signal.SIGTERM).requeue
        (True, False)
    """

    def __init__(self, message: str, signum: int) -> None:
        super().__init__(message)
        self.signum = signum

    @property
    def requeue(self) -> bool:
        """Whether the signal asked for a requeue (SIGUSR1: a cluster's warning before the time limit)."""
        return 128 + self.signum == REQUEUE_EXIT_CODE


class ModelCheckpoint(Callback):
    """Saves ``OUTPUT_DIR/checkpoints/step_NNNNNNN`` through `SSSTrainer.save_checkpoint` (Accelerate ``save_state``).

    Saves every `every_n_steps` optimizer steps and at each epoch end (after validation, so the
    epoch's metrics and callback states are in it). Rotation keeps the newest `keep_last` plus
    the best `keep_best` by `monitor` (`mode` min or max); ranks are read from the checkpoints
    themselves, so rotation keeps its promise across resumes. Only checkpoints saved right after a
    validation rank: a mid-epoch save carries a stale score. A fresh run refuses to start over
    checkpoints of an earlier run, and leftovers of interrupted saves are cleaned at fit start.
    Rotation deletes a checkpoint's marker first; checkpoints newer than the current step (left
    by a run resumed from an older checkpoint) are neither counted nor deleted until the run
    passes them. For the whole fit the main process holds the checkpoints folder's lock
    (``.sss.lock``, `sss.checkpoint.lock_folder`): a second fit on the same folder is refused.

    With `on_signal`, SIGTERM, SIGINT or SIGHUP (preemption, Ctrl-C, a closed terminal) lets the
    current optimizer step finish, saves, and stops with `Preempted` (a second Ctrl-C stops at once);
    SIGUSR1 (a cluster's warning before the time limit) does the same and asks for a requeue
    (`REQUEUE_EXIT_CODE`). A signal during a validation or the final evaluation ends the pass after
    its current batch (nothing of the pass is kept), then saves and stops the same way. With several
    processes the stop is agreed through ``accelerator.check_trigger`` (`SSSTrainer.stop`) so all save
    the same step.

    Example:
        >>> ModelCheckpoint(every_n_steps=100, keep_last=2, keep_best=1, monitor="val/accuracy", mode="max").keep_best
        1
    """

    def __init__(
        self,
        every_n_steps: int | None = None,
        every_epoch: bool = True,
        keep_last: int | None = 3,
        dirpath: str | None = None,
        keep_best: int = 0,
        monitor: str = "val/loss",
        mode: str = "min",
        on_signal: bool = True,
    ) -> None:
        if mode not in ("min", "max"):
            raise ValueError(f"ModelCheckpoint mode must be 'min' or 'max', got {mode!r}")
        self.every_n_steps = every_n_steps
        self.every_epoch = every_epoch
        self.keep_last = keep_last
        self.dirpath = dirpath
        self.keep_best = keep_best
        self.monitor = monitor
        self.mode = mode
        self.on_signal = on_signal
        self._saved_step = -1
        self._validated_step = -1
        self._signal: int | None = None
        self._previous_handlers: dict[int, Any] = {}
        self._warned_monitor = False
        self._fitting = False
        self._lock: FolderLock | None = None

    def folder(self, trainer: SSSTrainer) -> Path:
        """Where the checkpoints go."""
        return Path(self.dirpath) if self.dirpath else trainer.output_dir / "checkpoints"

    # ------------------------------------------------------------------ events
    def on_fit_start(self, trainer: SSSTrainer, module: LitModule) -> None:
        folder = self.folder(trainer)
        if trainer.accelerator.is_main_process:
            self._lock = lock_folder(folder, "run")  # first: cleaning up is only safe with the folder to ourselves
            for line in recover_leftovers(folder):
                print(f"sss: checkpoints: {line}", flush=True)
        trainer.accelerator.wait_for_everyone()
        existing = complete_checkpoints(folder)
        if existing and trainer.state.last_checkpoint is None:
            raise FileExistsError(
                f"{folder} already holds checkpoints of an earlier run ({existing[-1].name}, ...). "
                "Resume it (sss fit CONFIG --resume), choose another trainer.output_dir, or delete that folder."
            )
        self._saved_step = trainer.state.global_step if trainer.state.last_checkpoint else -1
        self._signal, self._fitting = None, True
        if self.on_signal:
            trainer.stop.watch()
            self._install_handlers(trainer)

    def on_batch_end(self, trainer: SSSTrainer, module: LitModule) -> None:
        state = trainer.state
        if state.micro_step:  # inside an accumulation window: the gradients so far are not in a checkpoint
            return
        if self.on_signal and self._stop_requested(trainer):
            self.save_and_stop(trainer)
        at_step = not state.step_was_skipped  # an optimizer step was just applied
        if self.every_n_steps and at_step and state.global_step % self.every_n_steps == 0:
            self._save(trainer)

    def on_validation_end(self, trainer: SSSTrainer, module: LitModule) -> None:
        metrics = trainer.state.eval_metrics
        if not self._fitting or not any(k.startswith("val/") for k in metrics):
            return  # a standalone validate()/test(), or an ablation pass with its own prefix, ranks nothing
        self._validated_step = trainer.state.global_step
        if self.keep_best and self.monitor not in metrics and not self._warned_monitor and metrics:
            self._warned_monitor = True
            print(
                f"sss: warning: ModelCheckpoint monitor {self.monitor!r} is not among the metrics "
                f"({', '.join(sorted(metrics))}); set trainer.checkpoint.monitor to one of them",
                flush=True,
            )

    def on_epoch_end(self, trainer: SSSTrainer, module: LitModule) -> None:
        if self.on_signal and self._stop_requested(trainer):  # also a validation the signal cut short
            self.save_and_stop(trainer)
        if self.every_epoch:
            self._save(trainer, replace=True)

    def on_fit_end(self, trainer: SSSTrainer, module: LitModule) -> None:
        # A signal during what ran at FIT_END before this callback (a Hub push, plots) still stops with a save.
        stopping = self.on_signal and self._stop_requested(trainer)
        self._fitting = False
        trainer.stop.unwatch()
        self._restore_handlers()
        if stopping:
            self.save_and_stop(trainer, replace=False)  # the lock goes at EXCEPTION
        self._release()

    def on_exception(self, trainer: SSSTrainer, module: LitModule) -> None:
        self._fitting = False
        trainer.stop.unwatch()
        self._restore_handlers()
        self._release()

    def save_and_stop(self, trainer: SSSTrainer, replace: bool = True) -> NoReturn:
        """Save the checkpoint a signal was promised and raise `Preempted` (the message says how to resume).

        Called at a safe point once the processes agreed to stop (`SSSTrainer.stop`): after an optimizer
        step or at an epoch's end (`replace`: this step's checkpoint is written again, with the data
        position reached), or at the end of the fit, after an evaluation batch of the final evaluation
        (``sss fit``; not `replace`: a checkpoint of the last step is kept as it is).
        """
        state = trainer.state
        self._save(trainer, replace=replace)
        signum = int(self._signal or trainer.stop.signum or signal.SIGTERM)
        during = f", during {trainer.stop.during}" if trainer.stop.during else ""
        stopped = (
            f"stopped by {signal.Signals(signum).name} after step {state.global_step}{during}; "
            f"checkpoint saved to {state.last_checkpoint}."
        )
        if 128 + signum == REQUEUE_EXIT_CODE:
            raise Preempted(
                f"{stopped} Exit code {REQUEUE_EXIT_CODE} asks the job script to requeue the job; the requeued "
                "sss fit CONFIG --resume auto (the same config and overrides) continues from it",
                signum,
            )
        raise Preempted(f"{stopped} Resume with: sss fit CONFIG --resume (the same config and overrides)", signum)

    def _release(self) -> None:
        if self._lock is not None:
            self._lock.release()
            self._lock = None

    # ------------------------------------------------------------------ saving and rotation
    def _save(self, trainer: SSSTrainer, replace: bool = False) -> None:
        step = trainer.state.global_step
        if step == self._saved_step and not replace:
            return
        self._saved_step = step
        trainer.save_checkpoint(self.folder(trainer) / f"step_{step:07d}")
        if trainer.accelerator.is_main_process:
            for old in self._to_remove(complete_checkpoints(self.folder(trainer)), step):
                remove_checkpoint(old)  # the marker first: a kill halfway leaves no "complete" half-folder

    def _to_remove(self, found: list[Path], step: int) -> list[Path]:
        if not self.keep_last:
            return []
        # Newer ones are from beyond a resume point (say, a damaged newest checkpoint the resume fell
        # back from): counting them would delete the good ones just saved.
        found = [p for p in found if checkpoint_step(p) <= step]
        keep = set(found[-self.keep_last :])
        if self.keep_best:
            scored = [(s, p) for p in found if (s := _score(p, self.monitor)) is not None]
            scored.sort(key=lambda sp: sp[0], reverse=self.mode == "max")  # stable: the earlier wins a tie
            keep.update(p for _, p in scored[: self.keep_best])
        return [p for p in found if p not in keep]

    def state_dict(self) -> dict[str, Any]:
        return {"saved_step": self._saved_step, "validated_step": self._validated_step, "monitor": self.monitor}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self._saved_step = int(state.get("saved_step", -1))
        self._validated_step = int(state.get("validated_step", -1))

    # ------------------------------------------------------------------ preemption
    def _install_handlers(self, trainer: SSSTrainer) -> None:
        if threading.current_thread() is not threading.main_thread():
            return  # Python allows signal handlers in the main thread only

        owner = os.getpid()

        def handler(signum: int, frame: Any) -> None:
            if os.getpid() != owner:
                return  # a forked DataLoader worker inherited this handler: the training process decides
            if self._signal is not None and signum == signal.SIGINT:
                self._restore_handlers()
                raise KeyboardInterrupt  # a second Ctrl-C: stop now
            if self._signal is not None:
                return  # already stopping; a cluster may deliver one signal twice (to every process, and forwarded)
            self._signal = signum
            trainer.stop.ask(signum, trainer.accelerator)
            what = "this step" if trainer.state.stage == "fit" else "this evaluation batch"
            _say(f"sss: {signal.Signals(signum).name}: finishing {what}, then saving a checkpoint")

        for name in _SIGNALS:
            signum = getattr(signal, name, None)
            if signum is not None:  # Windows has no SIGUSR1
                self._previous_handlers[signum] = signal.signal(signum, handler)

    def _restore_handlers(self) -> None:
        for signum, previous in self._previous_handlers.items():
            signal.signal(signum, previous)
        self._previous_handlers.clear()

    def _stop_requested(self, trainer: SSSTrainer) -> bool:
        # Processes may get the signal at different steps; all must save the same one, so with several
        # they agree every step (a one-element all-reduce, in trainer.stop).
        if not self._fitting or not trainer.stop.agreed(trainer.accelerator):
            return False
        self._signal = self._signal or trainer.stop.signum
        return True


def _say(line: str) -> None:
    # From the signal handler. After SIGHUP the terminal may be gone (a closed window, a dropped ssh
    # session): writing to it fails with EIO (a pipe to a tee that died: EPIPE). Then what the run still
    # prints there goes to /dev/null, so that the save is not lost to a failed print; a stream that is
    # another file (stderr to a log) keeps it.
    try:
        print(line, flush=True)
    except OSError:
        with contextlib.suppress(OSError, ValueError, AttributeError):  # a stream without a file: nothing to do
            _to_devnull(os.fstat(sys.stdout.fileno()))


def _to_devnull(gone: os.stat_result) -> None:
    devnull = os.open(os.devnull, os.O_WRONLY)
    try:
        for stream in (sys.stdout, sys.stderr):
            with contextlib.suppress(OSError, ValueError, AttributeError):
                now = os.fstat(stream.fileno())
                if (now.st_dev, now.st_ino, now.st_rdev) == (gone.st_dev, gone.st_ino, gone.st_rdev):
                    os.dup2(devnull, stream.fileno())
    finally:
        os.close(devnull)


def _score(checkpoint: Path, monitor: str) -> float | None:
    try:
        meta = json.loads((checkpoint / MARKER).read_text())
        mine = next((c["state"] for c in meta.get("callbacks", []) if c["class"] == "ModelCheckpoint"), {})
        if mine.get("validated_step") != meta.get("global_step"):
            return None  # saved away from a validation: its score is stale
        value = meta.get("metrics", {}).get(monitor)
        return float(value) if value is not None else None
    except (OSError, ValueError, TypeError, KeyError, AttributeError):
        return None  # a damaged marker ranks nothing (a resume skips it with the reason)
