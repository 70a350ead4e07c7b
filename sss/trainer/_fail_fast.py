"""Fail fast: the checks that stop a broken run before its first optimizer step.

The batch contract on the first training batch (and on the sanity validation's first batch), the
size and message of the sanity validation, and the parameters that got no gradient in the first
step. The sanity validation itself is a mode of the trainer's one evaluation pass
(``SSSTrainer._eval_pass``). Every check reads shapes, dtypes and flags only: it draws no random
numbers and changes no batch, so a run with them trains bitwise the same as one without them.
"""

from __future__ import annotations

import warnings
from typing import Any

import torch

from sss.config import TrainerConfig
from sss.data.contract import INPUT_KEYS, check_batch
from sss.trainer.module import LitModule

__all__ = ["check_first_batch", "check_gradients", "sanity_batches", "sanity_note"]


def _input_keys(module: Any) -> Any:
    # A module that reads other input keys names them in `input_keys` (None: a batch format of its own).
    # One with a forward of its own reads the keys it chose (batch["x"]): unless it named them, none of
    # ours is required, and the keys it shares with the contract ("label", ...) are still checked.
    keys = getattr(module, "input_keys", INPUT_KEYS)
    own_forward = isinstance(module, LitModule) and type(module).forward is not LitModule.forward
    if own_forward and keys is not None and "_input_keys" not in vars(module):
        return ()
    return keys


def check_first_batch(batch: Any, module: Any, stage: str = "training") -> bool:
    """Check `batch`, the first `stage` batch of a fit, against the batch contract (`sss.data.contract`).

    Returns True (checked), so the loop runs it once. It reads shapes and dtypes only.

    Example:
        >>> from sss.testing import BoringModule
        >>> batch = {"image": torch.zeros(2, 3, 4, 4), "audio": torch.zeros(2, 1, 16), "labels": torch.tensor([1, 0])}
        >>> check_first_batch(batch, BoringModule())
        Traceback (most recent call last):
        ...
        sss.data.contract.BatchFormatError: the first training batch's 'labels' is int64 [2]; 'labels' means \
multi-hot float [B, K]; for class indices use 'label'
    """
    check_batch(batch, where=f"the first {stage} batch", input_keys=_input_keys(module))
    return True


def sanity_batches(config: TrainerConfig, loader: Any) -> int:
    """How many validation batches the sanity validation runs before training (0: none).

    ``trainer.sanity_val_batches``, capped by ``limit_val_batches``; none without a validation
    loader or under ``fast_dev_run`` (which validates after its N batches anyway).

    Example:
        >>> sanity_batches(TrainerConfig(limit_val_batches=1), loader=[]), sanity_batches(TrainerConfig(), None)
        (1, 0)
    """
    batches = min(config.sanity_val_batches, config.limit_val_batches or config.sanity_val_batches)
    return 0 if loader is None or config.fast_dev_run else batches


def sanity_note(batches: int) -> str:
    """The note an error raised by the sanity validation carries.

    Example:
        >>> sanity_note(2)
        'sss: raised by the sanity validation before training (trainer.sanity_val_batches=2; 0 turns it off); \
no optimizer step has run'
    """
    return (
        f"sss: raised by the sanity validation before training (trainer.sanity_val_batches={batches}; "
        "0 turns it off); no optimizer step has run"
    )


def check_gradients(module: torch.nn.Module, find_unused: bool, is_main: bool) -> bool:
    """After the first backward: name the parameters that got no gradient (an error unless `find_unused`).

    Returns True (checked), so the loop runs it once. Example:
        >>> layer = torch.nn.Linear(2, 1)
        >>> layer(torch.ones(1, 2)).sum().backward()
        >>> check_gradients(layer, find_unused=False, is_main=True)
        True
    """
    missing = [n for n, p in module.named_parameters() if p.requires_grad and p.grad is None]
    if not missing:
        return True
    shown = ", ".join(missing[:8]) + (f" and {len(missing) - 8} more" if len(missing) > 8 else "")
    message = (
        f"{len(missing)} parameter(s) of {type(module).__name__} got no gradient in the first step: {shown}. "
        "Use them in the loss, freeze them with requires_grad_(False), or, if they are unused only in some "
        "steps (e.g. the encoder of a modality the data lacks), set trainer.find_unused_parameters=true."
    )
    if not find_unused:
        raise RuntimeError(message)
    if is_main:
        warnings.warn(message, stacklevel=2)
    return True
