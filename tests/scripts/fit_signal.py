"""A callback for ``sss fit`` runs that tests stop with a signal at a chosen evaluation pass (tests/trainer/test_stop).

    callbacks: [{_target_: fit_signal.SignalAt, name: SIGTERM, validation: 2}]   # with tests/scripts on PYTHONPATH

At the N-th VALIDATION_START of the run (counted from 1: the fit's validations, then the passes of
``sss fit``'s final evaluation) the process sends itself the signal, which therefore arrives before
the pass's first batch. ``sss fit`` takes callbacks as neutral config fields, so a resume leaves it out.
"""

from __future__ import annotations

import os
import signal

from sss import Callback


class SignalAt(Callback):
    def __init__(self, name: str = "SIGTERM", validation: int = 1) -> None:
        self.signum, self.validation, self.seen = getattr(signal, name), validation, 0

    def on_validation_start(self, trainer, module):
        self.seen += 1
        if self.seen == self.validation:
            os.kill(os.getpid(), self.signum)
