"""`StopOnRefusal`: Ray Train ends the run at a worker's `WorkerRefusal` instead of starting the workers again.

Ray Train's ``FailureConfig(max_failures=K)`` restarts the worker group after any worker error, which is
right for a lost node or a killed process and wrong for sss's own deterministic errors: an undecodable
WAV or a bad config value fails the same way on every attempt, so ``--max-failures -1`` would restart
forever. Ray Train (v2) leaves no public way to classify errors for its failure policy; an error that a
controller callback raises is not retried (a ``ControllerError`` of no retryable kind), so this callback
raises the worker's refusal there, and ``trainer.fit()`` ends with it. `quiet_refusals` keeps Ray from
logging the refusal's traceback in the worker and the controller: the driver prints its one line.
"""

from __future__ import annotations

import logging
from typing import Any

try:
    from ray.train import UserCallback
except ImportError:  # Ray Train v1 (RAY_TRAIN_V2_ENABLED=0): no callbacks of this kind; a refusal is retried there
    UserCallback = object  # type: ignore[assignment,misc]

__all__ = ["StopOnRefusal", "quiet_refusals"]

# Where Ray Train (v2) logs a worker's error ("Error in training function") and a controller callback's
# ("Error in control loop iteration"); a renamed module only brings the tracebacks back.
_RAY_LOGGERS = ("ray.train.v2._internal.util", "ray.train.v2._internal.execution.controller.controller")


class StopOnRefusal(UserCallback):
    """Raise the first (lowest rank's) `sss.run.ray_train.WorkerRefusal` among a failed poll's worker errors.

    Other errors pass: Ray's failure policy retries them as ``--max-failures`` allows.

    Example:
        >>> StopOnRefusal().after_exception(None, {0: RuntimeError("a lost node")})  # retried by Ray
    """

    def after_exception(self, run_context: Any, worker_exceptions: dict[int, Exception]) -> None:
        for _, error in sorted(worker_exceptions.items()):
            # Ray Train wraps a worker's exception with its traceback text (UserExceptionWithTraceback)
            refusal = getattr(error, "_base_exc", error)
            if getattr(refusal, "sss_refusal", False):
                quiet_refusals()
                raise refusal


class _QuietRefusals(logging.Filter):
    def filter(self, record: logging.LogRecord) -> bool:
        error = record.exc_info[1] if record.exc_info else None
        return not (getattr(error, "sss_refusal", False) or "WorkerRefusal: " in record.getMessage())


def quiet_refusals() -> None:
    """Drop Ray Train's log records of a `WorkerRefusal` (its traceback) in this process; others stay.

    Example:
        >>> quiet_refusals()
        >>> logging.getLogger(_RAY_LOGGERS[0]).filter(logging.makeLogRecord({"msg": "x.WorkerRefusal: bad.wav"}))
        False
    """
    for name in _RAY_LOGGERS:
        logger = logging.getLogger(name)
        if not any(isinstance(f, _QuietRefusals) for f in logger.filters):
            logger.addFilter(_QuietRefusals())
