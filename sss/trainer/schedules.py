"""Learning-rate schedules sized in optimizer steps."""

from __future__ import annotations

import math

import torch

__all__ = ["cosine_with_warmup"]


def cosine_with_warmup(
    optimizer: torch.optim.Optimizer, total_steps: int, warmup_steps: int = 0, min_lr_ratio: float = 0.0
) -> torch.optim.lr_scheduler.LambdaLR:
    """Linear warm-up over `warmup_steps`, then cosine decay to ``min_lr_ratio * lr`` at `total_steps`.

    Example:
        >>> opt = torch.optim.SGD([torch.nn.Parameter(torch.zeros(1))], lr=1.0)
        >>> sched = cosine_with_warmup(opt, total_steps=10, warmup_steps=2)
        >>> [round(g["lr"], 3) for g in opt.param_groups]
        [0.0]
        >>> for _ in range(2):
        ...     opt.step(); sched.step()
        >>> round(opt.param_groups[0]["lr"], 3)
        1.0
    """
    if total_steps < 1 or warmup_steps < 0 or not 0.0 <= min_lr_ratio <= 1.0:
        raise ValueError(
            f"cosine_with_warmup: need total_steps >= 1, warmup_steps >= 0 and 0 <= min_lr_ratio <= 1 "
            f"(got {total_steps}, {warmup_steps}, {min_lr_ratio})"
        )

    def factor(step: int) -> float:
        if step < warmup_steps:
            return step / warmup_steps
        progress = min(1.0, (step - warmup_steps) / max(1, total_steps - warmup_steps))
        return min_lr_ratio + (1.0 - min_lr_ratio) * 0.5 * (1.0 + math.cos(math.pi * progress))

    return torch.optim.lr_scheduler.LambdaLR(optimizer, factor)
