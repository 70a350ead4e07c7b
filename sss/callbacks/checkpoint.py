"""`ModelCheckpoint`: full-state checkpoints every N steps and at each epoch end, with rotation."""

from __future__ import annotations

import re
import shutil
from pathlib import Path
from typing import TYPE_CHECKING, Any

from sss.callbacks.base import Callback

if TYPE_CHECKING:
    from sss.trainer.module import LitModule
    from sss.trainer.trainer import SSSTrainer

__all__ = ["ModelCheckpoint", "complete_checkpoints"]

_NAME = re.compile(r"^step_(\d{7,})$")


def complete_checkpoints(folder: str | Path) -> list[Path]:
    """Complete checkpoint folders (``step_NNNNNNN`` with ``trainer_state.json``), oldest first.

    Example:
        >>> complete_checkpoints("/nonexistent")
        []
    """
    folder = Path(folder)
    if not folder.is_dir():
        return []
    found = [p for p in folder.iterdir() if _NAME.match(p.name) and (p / "trainer_state.json").is_file()]
    return sorted(found, key=lambda p: int(_NAME.match(p.name).group(1)))


class ModelCheckpoint(Callback):
    """Saves ``OUTPUT_DIR/checkpoints/step_NNNNNNN`` through `SSSTrainer.save_checkpoint` (Accelerate ``save_state``).

    Saves every `every_n_steps` optimizer steps and at each epoch end (after validation, so the
    epoch's metrics and callback states are in it), keeping the newest `keep_last`. A fresh run
    refuses to start over checkpoints of an earlier run: resume it or pick another output_dir.

    Example:
        >>> ModelCheckpoint(every_n_steps=100, keep_last=2).keep_last
        2
    """

    def __init__(
        self,
        every_n_steps: int | None = None,
        every_epoch: bool = True,
        keep_last: int | None = 3,
        dirpath: str | None = None,
    ) -> None:
        self.every_n_steps = every_n_steps
        self.every_epoch = every_epoch
        self.keep_last = keep_last
        self.dirpath = dirpath
        self._saved_step = -1

    def folder(self, trainer: SSSTrainer) -> Path:
        """Where the checkpoints go."""
        return Path(self.dirpath) if self.dirpath else trainer.output_dir / "checkpoints"

    def on_fit_start(self, trainer: SSSTrainer, module: LitModule) -> None:
        folder = self.folder(trainer)
        existing = complete_checkpoints(folder)
        if existing and trainer.state.last_checkpoint is None:
            raise FileExistsError(
                f"{folder} already holds checkpoints of an earlier run ({existing[-1].name}, ...). "
                "Resume it (sss fit CONFIG --resume), choose another trainer.output_dir, or delete that folder."
            )
        if trainer.accelerator.is_main_process and folder.is_dir():
            for leftover in folder.glob("step_*.tmp"):  # saves that were interrupted
                shutil.rmtree(leftover, ignore_errors=True)
        self._saved_step = trainer.state.global_step if trainer.state.last_checkpoint else -1

    def on_batch_end(self, trainer: SSSTrainer, module: LitModule) -> None:
        state = trainer.state
        at_step = state.micro_step == 0 and not state.step_was_skipped  # an optimizer step just happened
        if self.every_n_steps and at_step and state.global_step % self.every_n_steps == 0:
            self._save(trainer)

    def on_epoch_end(self, trainer: SSSTrainer, module: LitModule) -> None:
        if self.every_epoch:
            self._save(trainer, replace=True)

    def _save(self, trainer: SSSTrainer, replace: bool = False) -> None:
        step = trainer.state.global_step
        if step == self._saved_step and not replace:
            return
        self._saved_step = step
        trainer.save_checkpoint(self.folder(trainer) / f"step_{step:07d}")
        if self.keep_last and trainer.accelerator.is_main_process:
            for old in complete_checkpoints(self.folder(trainer))[: -self.keep_last]:
                shutil.rmtree(old, ignore_errors=True)

    def state_dict(self) -> dict[str, Any]:
        return {"saved_step": self._saved_step}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self._saved_step = int(state.get("saved_step", -1))
