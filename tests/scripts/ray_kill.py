"""A callback for ``sss fit --engine ray`` runs that a test kills with ``kill -9`` at a chosen optimizer step.

    callbacks: [{_target_: ray_kill.KillPoint, at: 5, rank: 1}]    # with tests/scripts on the workers' PYTHONPATH

After optimizer step `at`, the worker of rank `rank` writes its pid to OUTPUT_DIR/kill_me.pid and waits there (at
most 60 s) for the test to kill it. Once per run folder: the restarted worker group finds the file and trains on.
"""

from __future__ import annotations

import os
import time

from sss import Callback


class KillPoint(Callback):
    def __init__(self, at: int, rank: int = 1) -> None:
        self.at, self.rank = at, rank

    def on_batch_end(self, trainer, module):
        state = trainer.state
        if state.global_step != self.at or state.micro_step or trainer.accelerator.process_index != self.rank:
            return
        marker = trainer.output_dir / "kill_me.pid"
        if marker.exists():  # the group Ray started again after the kill
            return
        marker.write_text(str(os.getpid()))
        time.sleep(60)
