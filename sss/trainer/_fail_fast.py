"""Fail fast: the batch contract on the first training batch, and a sanity validation before training.

Both run once per fit and leave the run as it would have been without them: the first training
batch is checked when the loop runs it (nothing is taken from the loader ahead of the loop), and
the sanity validation restores the RNG states, the module's mode and the loader's position and
keeps nothing it computed. So a run with them trains bitwise the same as one without them.
"""

from __future__ import annotations

import itertools
import warnings
from typing import TYPE_CHECKING, Any

import torch

from sss import checkpoint as ckpt_io
from sss.data.contract import INPUT_KEYS, check_batch
from sss.trainer.module import LitModule
from sss.trainer.state import TrainState

if TYPE_CHECKING:
    from sss.trainer.trainer import SSSTrainer

__all__ = ["check_first_batch", "check_gradients", "sanity_validate"]


def _input_keys(trainer: SSSTrainer) -> Any:
    # A module that reads other input keys names them in `input_keys` (None: a batch format of its own).
    # One with a forward of its own reads the keys it chose (batch["x"]): unless it named them, none of
    # ours is required, and the keys it shares with the contract ("label", ...) are still checked.
    module = trainer.module
    keys = getattr(module, "input_keys", INPUT_KEYS)
    own_forward = isinstance(module, LitModule) and type(module).forward is not LitModule.forward
    if own_forward and keys is not None and "_input_keys" not in vars(module):
        return ()
    return keys


def check_first_batch(trainer: SSSTrainer) -> None:
    """Make the trainer's micro-batch runner check the batch contract on the first batch it runs, then step aside.

    The check wraps ``trainer._run_batch`` for one call and puts the runner back, so later steps
    pay nothing, and it reads shapes and dtypes only: it draws no random numbers and changes no
    batch the loop sees. `SSSTrainer.fit` calls it at set-up.

    Example:
        >>> from sss import SSSTrainer
        >>> from sss.testing import BoringModule
        >>> rows = [{"image": torch.zeros(3, 4, 4), "audio": torch.zeros(1, 16), "labels": 1}] * 4
        >>> trainer = SSSTrainer(max_steps=1, mixed_precision="no")
        sss: mixed precision no
        >>> trainer.fit(BoringModule(), train_dataloaders=torch.utils.data.DataLoader(rows, batch_size=2))
        Traceback (most recent call last):
        ...
        sss.data.contract.BatchFormatError: the first training batch's 'labels' is int64 [2]; 'labels' means \
multi-hot float [B, K]; for class indices use 'label'
        >>> trainer.state.global_step
        0
    """
    runner = trainer._run_batch

    def first(batch: Any, batch_idx: int) -> Any:
        trainer._run_batch = runner  # from the second batch on, the loop calls the runner directly
        check_batch(batch, where="the first training batch", input_keys=_input_keys(trainer))
        return runner(batch, batch_idx)

    trainer._run_batch = first


def sanity_validate(trainer: SSSTrainer, loader: Any) -> None:
    """Run ``trainer.sanity_val_batches`` validation batches and `compute_metrics` once, and keep nothing.

    As Lightning's ``num_sanity_val_steps``: a crash in ``validation_step`` or ``compute_metrics``
    surfaces before the first optimizer step instead of after an epoch. The first batch is also
    checked against the batch contract, and what ``validation_step`` logs with ``self.log`` is
    collected and checked as in a real pass. Every process runs it (the outputs are gathered). No
    event fires, and nothing reaches ``trainer.state``, loggers, checkpoint ranking or early
    stopping; the RNG states, the model's mode, the loader's epoch counter and Accelerate's
    dataloader stack are restored, so training continues exactly as without it. Skipped with
    ``trainer.sanity_val_batches=0``, without a validation loader and under ``fast_dev_run``;
    `SSSTrainer.fit` calls it after FIT_START, except on resume.

    Example:
        >>> from sss import SSSTrainer
        >>> from sss.testing import BoringModule, boring_loader
        >>> trainer = SSSTrainer(max_steps=1, mixed_precision="no")
        sss: mixed precision no
        >>> _, val = trainer._setup_fit(BoringModule(), None, boring_loader(), boring_loader(n=16))
        >>> rng = torch.get_rng_state()
        >>> sanity_validate(trainer, val)
        >>> torch.equal(torch.get_rng_state(), rng), trainer.state.metrics
        (True, {})
    """
    cfg = trainer.config
    batches = min(cfg.sanity_val_batches, cfg.limit_val_batches or cfg.sanity_val_batches)
    if loader is None or batches == 0 or cfg.fast_dev_run:
        return
    model, gradient_state = trainer.model, trainer.accelerator.gradient_state
    rng, was_training = ckpt_io.get_rng_state(), model.training
    # A prepared loader left before its end never takes itself off Accelerate's dataloader stack,
    # and one run to its end counts an epoch; the real validation must find both as they were.
    stack, epoch = list(gradient_state.dataloader_references), getattr(loader, "iteration", None)
    model.eval()
    trainer._logs.start_eval(trainer.module)
    try:
        chunks: dict[str, list[torch.Tensor]] = {}
        with torch.no_grad():
            for batch_idx, batch in enumerate(itertools.islice(loader, batches)):
                if batch_idx == 0:
                    check_batch(batch, where="the first validation batch", input_keys=_input_keys(trainer))
                outputs = trainer.accelerator.gather_for_metrics(trainer._validation_step(batch, batch_idx))
                for key, value in outputs.items():
                    chunks.setdefault(key, []).append(torch.atleast_1d(value.detach()))
            joined = {key: torch.cat(values) for key, values in chunks.items()}
            metrics = {f"val/{k}": v for k, v in trainer._compute_metrics(joined).items()} if joined else {}
            # What validation_step logged with self.log, reduced and checked as a real pass does, into a
            # throwaway state: a name clash with compute_metrics fails now too, and nothing is kept.
            trainer._logs.end_eval(TrainState(), trainer.accelerator, "val", metrics)
    except Exception as exc:
        exc.add_note(
            f"sss: raised by the sanity validation before training (trainer.sanity_val_batches={batches}; "
            "0 turns it off); no optimizer step has run"
        )
        raise
    finally:
        model.train(was_training)
        ckpt_io.set_rng_state(rng)
        gradient_state.dataloader_references = stack
        if epoch is not None:
            loader.iteration = epoch


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
