"""`LearningRateMonitor`: the learning rate (and momentum) of every parameter group."""

from __future__ import annotations

from typing import TYPE_CHECKING

from sss.callbacks.base import Callback

if TYPE_CHECKING:
    from sss.trainer.module import LitModule
    from sss.trainer.trainer import SSSTrainer

__all__ = ["LearningRateMonitor"]


class LearningRateMonitor(Callback):
    """Publishes ``train/lr/<group>`` after every optimizer step, for all parameter groups.

    A group is named by its ``"name"`` key when it has one, else by its index (``group_0``, ...).
    With `log_momentum`, also ``train/momentum/<group>`` (SGD ``momentum`` or Adam ``betas[0]``).
    ``train/lr`` (the first group) is logged by `MetricsLogger` already.

    Example:
        >>> import torch
        >>> from types import SimpleNamespace
        >>> w = torch.nn.Parameter(torch.zeros(1))
        >>> opt = torch.optim.AdamW([{"params": [w], "lr": 0.1, "name": "heads"}])
        >>> trainer = SimpleNamespace(optimizer=opt, state=SimpleNamespace(logs={}))
        >>> LearningRateMonitor(log_momentum=True).on_after_optimizer_step(trainer, None)
        >>> trainer.state.logs
        {'train/lr/heads': 0.1, 'train/momentum/heads': 0.9}
    """

    def __init__(self, log_momentum: bool = False) -> None:
        self.log_momentum = log_momentum

    def on_after_optimizer_step(self, trainer: SSSTrainer, module: LitModule) -> None:
        logs = trainer.state.logs
        for i, group in enumerate(trainer.optimizer.param_groups):
            name = group.get("name") or f"group_{i}"
            logs[f"train/lr/{name}"] = float(group["lr"])
            if self.log_momentum:
                momentum = group.get("momentum", group.get("betas", (None,))[0])
                if momentum is not None:
                    logs[f"train/momentum/{name}"] = float(momentum)
