"""A callback for ``sss fit`` runs that tests interrupt at a chosen micro-batch (kill -9, SIGUSR1).

    callbacks: [{_target_: fit_pause.Pause, at: "E:B"}]     # with tests/scripts on PYTHONPATH
    model: {_target_: fit_pause.DropoutBoring}               # a model whose training draws from the RNG

After micro-batch B of epoch E (BATCH_END) the main process writes OUTPUT_DIR/paused and every process waits
there (at most 60 s) until the checkpoint callback caught a signal, so the test can kill -9 or signal the run
at exactly that point. ``sss fit`` takes callbacks as neutral config fields, so a resume leaves this one out.
"""

from __future__ import annotations

import time

from torch import nn

from sss import Callback
from sss.testing import BoringModule


class DropoutBoring(BoringModule):
    """`BoringModule` with dropout: a resume that restored the RNG state wrongly trains other weights."""

    def __init__(self, dim: int = 8, num_classes: int = 2) -> None:
        super().__init__(dim=dim, num_classes=num_classes)
        self.image_encoder = nn.Sequential(nn.Flatten(), nn.Linear(48, dim), nn.Dropout(0.3))
        self.audio_encoder = nn.Sequential(nn.Flatten(), nn.Linear(16, dim), nn.GELU(), nn.Dropout(0.3))


class Pause(Callback):
    def __init__(self, at: str) -> None:
        epoch, batch = at.split(":")
        self.at = (int(epoch), int(batch))

    def on_batch_end(self, trainer, module):
        state = trainer.state
        if (state.epoch, state.batch_idx) != self.at:
            return
        if trainer.accelerator.is_main_process:
            (trainer.output_dir / "paused").write_text(f"{state.epoch} {state.batch_idx} {state.global_step}")
        ckpt = next(c for c in trainer.callbacks if type(c).__name__ == "ModelCheckpoint")
        deadline = time.monotonic() + 60
        while ckpt._signal is None and time.monotonic() < deadline:  # killed here, or signalled
            time.sleep(0.01)
