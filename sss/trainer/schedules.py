"""Learning-rate schedules sized in optimizer steps, or in fractions of the run."""

from __future__ import annotations

import math
from typing import Annotated

import torch

from sss.config import ConfigError
from sss.config.constraints import Ge, Lt, NonNegativeInt, UnitFloat
from sss.config.errors import both_warmups

__all__ = ["cosine_with_warmup"]

_KEY = "trainer.optim.scheduler"


def cosine_with_warmup(
    optimizer: torch.optim.Optimizer,
    total_steps: int,
    warmup_steps: NonNegativeInt | None = None,
    min_lr_ratio: UnitFloat = 0.0,
    *,
    warmup_ratio: Annotated[float, Ge(0), Lt(1)] | None = None,
    decay_ratio: Annotated[float, Ge(0), Lt(1)] | None = None,
) -> torch.optim.lr_scheduler.LambdaLR:
    """Linear warm-up, optionally a constant phase, then cosine decay to ``min_lr_ratio * lr`` at `total_steps`.

    The warm-up lasts `warmup_ratio` of `total_steps` (the optimizer steps of the whole run, which
    ``sss fit`` passes), or `warmup_steps` steps; neither means none. A ratio keeps the curve's
    shape when the run's length changes (more data, more epochs, another process count); a
    fractional warm-up length is kept as such, not rounded. `decay_ratio` (the last fraction of the
    run) holds the peak LR constant between the warm-up and a shorter decay (warm-up, stable,
    decay); without it the decay takes every step after the warm-up.

    Raises:
        ConfigError: both `warmup_steps` and `warmup_ratio` given; a ratio outside [0, 1); a ratio
            while `total_steps` is unknown (0: a loader without a length and no ``trainer.max_steps``).

    Example:
        >>> opt = torch.optim.SGD([torch.nn.Parameter(torch.zeros(1))], lr=1.0)
        >>> sched = cosine_with_warmup(opt, total_steps=10, warmup_steps=2)
        >>> [round(g["lr"], 3) for g in opt.param_groups]
        [0.0]
        >>> for _ in range(2):
        ...     opt.step(); sched.step()
        >>> round(opt.param_groups[0]["lr"], 3)
        1.0
        >>> opt = torch.optim.SGD([torch.nn.Parameter(torch.zeros(1))], lr=1.0)
        >>> sched = cosine_with_warmup(opt, total_steps=100, warmup_ratio=0.1)  # 10 warm-up steps
        >>> for _ in range(5):
        ...     opt.step(); sched.step()
        >>> round(opt.param_groups[0]["lr"], 3)
        0.5
    """
    warmup, decay = _phases(total_steps, warmup_steps, min_lr_ratio, warmup_ratio, decay_ratio)

    def factor(step: int) -> float:
        if step < warmup:
            return step / warmup
        if decay is None:  # the decay takes every step after the warm-up (the formula of earlier versions)
            progress = min(1.0, (step - warmup) / max(1, total_steps - warmup))
        elif step < total_steps - decay:
            return 1.0  # the stable phase
        else:
            progress = min(1.0, (step - (total_steps - decay)) / decay) if decay > 0 else 1.0
        return min_lr_ratio + (1.0 - min_lr_ratio) * 0.5 * (1.0 + math.cos(math.pi * progress))

    return torch.optim.lr_scheduler.LambdaLR(optimizer, factor)


def _phases(
    total_steps: int,
    warmup_steps: int | None,
    min_lr_ratio: float,
    warmup_ratio: float | None,
    decay_ratio: float | None,
) -> tuple[float, float | None]:
    # The warm-up and decay lengths in steps (None: the decay takes every step after the warm-up), checked.
    for name, ratio in (("warmup_ratio", warmup_ratio), ("decay_ratio", decay_ratio)):
        if ratio is not None and not 0.0 <= ratio < 1.0:
            raise ConfigError(f"{_KEY}.{name}: a fraction of the run's steps in [0, 1), got {ratio!r}")
    if warmup_ratio is not None and warmup_steps is not None:
        raise ConfigError(both_warmups(_KEY, warmup_steps, warmup_ratio))
    relative = [name for name, r in (("warmup_ratio", warmup_ratio), ("decay_ratio", decay_ratio)) if r is not None]
    if total_steps < 1 and relative:
        raise ConfigError(
            f"{_KEY}.{relative[0]} is a fraction of the run's optimizer steps, which are unknown here (the training "
            "loader has no length): set trainer.max_steps, or give trainer.optim.scheduler.warmup_steps instead"
        )
    if total_steps < 1 or (warmup_steps or 0) < 0 or not 0.0 <= min_lr_ratio <= 1.0:
        raise ValueError(
            f"cosine_with_warmup: need total_steps >= 1, warmup_steps >= 0 and 0 <= min_lr_ratio <= 1 "
            f"(got {total_steps}, {warmup_steps}, {min_lr_ratio})"
        )
    warmup = warmup_ratio * total_steps if warmup_ratio is not None else (warmup_steps or 0)
    decay = decay_ratio * total_steps if decay_ratio is not None else None
    if decay is not None and warmup + decay > total_steps:
        raise ConfigError(
            f"{_KEY}: the warm-up ({warmup:g} steps) and the decay_ratio={decay_ratio} decay ({decay:g} steps) "
            f"together exceed the run's {total_steps} optimizer steps: lower one of them"
        )
    return warmup, decay
