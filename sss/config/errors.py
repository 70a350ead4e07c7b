"""`ConfigError`, the one error type of configuration problems."""

from __future__ import annotations

from sss.errors import SSSError

__all__ = ["ConfigError", "both_warmups", "require", "workers_only"]


class ConfigError(ValueError, SSSError):
    """A configuration problem; the message names the file and the YAML key. ``sss`` exits with 2."""

    exit_code = 2


def require(ok: bool, message: str) -> None:
    """Raise `ConfigError` with `message` unless `ok`.

    Example:
        >>> require(True, "never shown")
    """
    if not ok:
        raise ConfigError(message)


def both_warmups(key: str, steps: object, ratio: object) -> str:
    """The message for a scheduler given both ``warmup_steps`` and ``warmup_ratio`` (`sss check` and the build).

    Example:
        >>> both_warmups("trainer.optim.scheduler", 50, 0.05)[:60]
        'trainer.optim.scheduler.warmup_steps and trainer.optim.sched'
    """
    return (
        f"{key}.warmup_steps and {key}.warmup_ratio are both set ({steps} steps, ratio {ratio}): keep one of them "
        "(warmup_ratio, a fraction of the run, keeps its shape when the run's length changes)"
    )


def workers_only(name: str, value: object) -> str:
    """The message for a loader setting that needs workers, given with ``data.num_workers`` 0.

    Example:
        >>> workers_only("prefetch_factor", 4)[:40]
        'data.prefetch_factor=4 applies to worker'
    """
    shown = "true" if value is True else value
    return (
        f"data.{name}={shown} applies to worker processes only, and data.num_workers is 0: set "
        f"data.num_workers (e.g. 2) or remove data.{name}"
    )
