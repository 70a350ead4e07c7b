"""`StopRequest`: a stop asked by a signal, agreed by every process, acted on at the loop's next safe point.

The checkpoint callback's signal handler asks (`StopRequest.ask`); the training loop's safe points
are the end of an optimizer step (the callback checks at BATCH_END and EPOCH_END) and, inside a
validation or the final evaluation, the end of each evaluation batch (the trainer checks and leaves
the pass with `EvaluationStopped`). With several processes the answer is agreed through
``accelerator.check_trigger`` (a one-element all-reduce), so every process leaves at the same point.
"""

from __future__ import annotations

import signal
from typing import Any

__all__ = ["EvaluationStopped", "StopRequest"]


class EvaluationStopped(Exception):
    """An evaluation pass was left after a batch because a stop was agreed; nothing of the pass was kept."""


class StopRequest:
    """The trainer's stop flag (``trainer.stop``), set from a signal handler and agreed across processes.

    Example:
        >>> from accelerate import Accelerator
        >>> stop, accelerator = StopRequest(), Accelerator(cpu=True)
        >>> stop.agreed(accelerator)  # nobody watches: no stop, and no collective
        False
        >>> stop.watch(); stop.ask(15, accelerator); stop.agreed(accelerator), stop.signum
        (True, 15)
    """

    def __init__(self) -> None:
        self.watching = False
        """A handler may ask (set by the checkpoint callback for the fit): only then do evaluation passes check."""
        self.signum: int | None = None
        """The signal that asked on this process (SIGTERM where another process got it)."""
        self.during: str | None = None
        """What the stop cut short ("validation", "the final evaluation"), for the message; None: a training step."""
        self._agreed = False

    def watch(self) -> None:
        """Start a fit's watch: nothing asked yet."""
        self.watching, self.signum, self.during, self._agreed = True, None, None, False

    def unwatch(self) -> None:
        """End the watch (the fit ended): evaluation passes stop checking."""
        self.watching = False

    def ask(self, signum: int, accelerator: Any) -> None:
        """Ask for a stop (called from a signal handler: it only sets flags)."""
        self.signum = signum
        accelerator.set_trigger()

    def agreed(self, accelerator: Any) -> bool:
        """Whether the processes agreed to stop; once true it stays true (check_trigger resets its flag)."""
        if self._agreed or not self.watching:
            return self._agreed
        if accelerator.num_processes == 1:
            self._agreed = self.signum is not None
        elif accelerator.check_trigger():  # every process makes this call at the same point
            self._agreed = True
        if self._agreed and self.signum is None:
            self.signum = int(signal.SIGTERM)  # another process got the signal
        return self._agreed
