"""``LitModule.log``, the trainer's side: the values a module logs, folded into sums, reduced and named.

The module appends `Logged` values to its own buffer (``module._logged``) and knows nothing of the
trainer. The trainer's step router stamps each value with the step method and the batch size of
the call that logged it (`stamp`); `ModuleLogs` then takes them from the buffer: at each optimizer
step (a step value is the mean over the step's micro-batches, published to ``state.logs`` at the
logging steps), at the end of an epoch and of an evaluation pass (one all-reduce of the sums and
counts of every process). Values stay tensors until then: logging costs no device sync per step, and
a step's values reach ``state.logs`` as device tensors, which the logging callbacks read with the loss
in one transfer at the logging step.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass
from typing import Any

import torch
from torch import Tensor, nn

__all__ = ["STEP_METHODS", "Logged", "ModuleLogs", "stamp"]

STEP_METHODS = ("training_step", "validation_step")
"""The module methods whose ``self.log`` values the trainer collects."""

BUFFER_SIZE = 100_000
"""Values a module keeps for a trainer to collect; older ones go (a loop without a trainer never collects)."""


@dataclass(eq=False)
class Logged:
    """One ``self.log(name, value, ...)`` call; ``stage``, ``weight`` and ``fresh`` are set by the trainer's router."""

    name: str
    value: Tensor | float
    on_step: bool | None
    on_epoch: bool | None
    prog_bar: bool
    batch_size: int | None
    stage: str | None = None
    """The step method that logged it (``training_step`` or ``validation_step``); None: logged outside a step."""
    weight: float = 1.0
    """Its weight in epoch and pass means: ``batch_size``, else the size of the batch of its call."""
    fresh: bool = False
    """Whether its call began with no gradients: the first of an accumulation window, or of its replay after an OOM."""


def new_buffer() -> deque[Logged]:
    """An empty buffer for a module's logged values (the oldest go beyond `BUFFER_SIZE`)."""
    return deque(maxlen=BUFFER_SIZE)


def stamp(module: nn.Module, method: str, size: int, start: int) -> None:
    """Mark the values `module` logged in a `method` call since buffer position `start` as that call's.

    Values logged outside a step method are dropped, also those left from before `start` (e.g. by
    a ``forward`` that a callback called directly).

    Example:
        >>> from torch import nn
        >>> m = nn.Linear(1, 1)
        >>> m._logged = new_buffer()
        >>> m._logged.append(Logged("x", 1.0, None, None, False, None))
        >>> stamp(m, "training_step", 4, 0)
        >>> m._logged[0].stage, m._logged[0].weight, m._logged[0].fresh
        ('training_step', 4.0, True)
    """
    buffer = module.__dict__.get("_logged")
    if not buffer:
        return
    entries = list(buffer)
    buffer.clear()
    if method not in STEP_METHODS:
        return
    fresh = method == "training_step" and all(p.grad is None for p in module.parameters())
    for i, entry in enumerate(entries):
        if i >= start:
            entry.stage, entry.fresh = method, fresh
            entry.weight = float(entry.batch_size if entry.batch_size is not None else size)
        if entry.stage is not None:
            buffer.append(entry)


def _take(module: nn.Module, stage: str) -> list[Logged]:
    buffer = module.__dict__.get("_logged")
    if not buffer:
        return []
    taken = [entry for entry in buffer if entry.stage == stage]
    kept = [entry for entry in buffer if entry.stage is not None and entry.stage != stage]
    buffer.clear()
    buffer.extend(kept)
    return taken


class _Sums:
    """Weighted sums (tensors, on the values' device) and weights per name, and which names go to the bar."""

    def __init__(self) -> None:
        self.sums: dict[str, Tensor] = {}
        self.weights: dict[str, float] = {}
        self.bar: set[str] = set()

    def add(self, name: str, entry: Logged) -> None:
        value = torch.as_tensor(entry.value).detach()
        # float64 sums (where the device has it): an epoch adds up many values
        value = (value.float() if value.device.type == "mps" else value.double()) * entry.weight
        self.sums[name] = self.sums[name] + value if name in self.sums else value
        self.weights[name] = self.weights.get(name, 0.0) + entry.weight
        if entry.prog_bar:
            self.bar.add(name)

    def means(self, accelerator: Any = None) -> dict[str, float]:
        """Weighted means; with an `accelerator`, over all its processes (one all-reduce)."""
        names = sorted(self.sums)
        if accelerator is not None and accelerator.num_processes > 1:
            from accelerate.utils import gather_object

            # Every process must reduce the same names in one order, also those it did not log itself.
            names = sorted(set().union(*gather_object([names])))
        if not names:
            return {}
        device = accelerator.device if accelerator is not None else next(iter(self.sums.values())).device
        dtype = torch.float32 if torch.device(device).type == "mps" else torch.float64
        zero = torch.zeros((), device=device, dtype=dtype)
        sums = torch.stack([self.sums.get(n, zero).to(zero) for n in names])
        weights = torch.tensor([self.weights.get(n, 0.0) for n in names], device=zero.device, dtype=dtype)
        totals = torch.stack([sums, weights])
        if accelerator is not None and accelerator.num_processes > 1:
            totals = accelerator.reduce(totals, reduction="sum")
        return dict(zip(names, (totals[0] / totals[1]).tolist(), strict=True))  # the one device sync

    def tensors(self) -> dict[str, Tensor]:
        """This process's weighted means as one-element tensors on the values' device: no device sync."""
        return {name: self.sums[name] / self.weights[name] for name in sorted(self.sums)}


def _read_logs(state: Any) -> None:
    # Device values callbacks and the step logs left in state.logs (no logger read them): floats by the epoch's end,
    # in one transfer per device, so that what a fit leaves behind is plain numbers.
    tensors = {k: v for k, v in state.logs.items() if isinstance(v, Tensor) and v.numel() == 1}
    by_device: dict[torch.device, list[str]] = {}
    for key, value in tensors.items():
        by_device.setdefault(value.device, []).append(key)
    for device, keys in by_device.items():
        dtype = torch.float32 if device.type == "mps" else torch.float64
        values = torch.stack([tensors[k].detach().reshape(()).to(dtype) for k in keys]).tolist()
        state.logs.update(zip(keys, values, strict=True))
        state.bar.update({k: v for k, v in zip(keys, values, strict=True) if k in state.bar})


def _train_names(entry: Logged) -> tuple[str | None, str | None]:
    # A name gets the train/ prefix (unless it has it); logged per step and per epoch, it ends in _step / _epoch.
    base = entry.name if entry.name.startswith("train/") else f"train/{entry.name}"
    on_step = True if entry.on_step is None else entry.on_step
    on_epoch = False if entry.on_epoch is None else entry.on_epoch
    if on_step and on_epoch:
        return f"{base}_step", f"{base}_epoch"
    return (base if on_step else None), (base if on_epoch else None)


def _check_eval(entry: Logged) -> None:
    if entry.on_step or entry.on_epoch is False:
        raise ValueError(
            f"validation_step logged {entry.name!r} with on_step={entry.on_step}, on_epoch={entry.on_epoch}: values "
            "logged in validation_step are means over the whole evaluation pass, named val/<name>; leave on_step "
            "and on_epoch at their defaults"
        )


def _eval_name(name: str) -> str:
    # my_metric and val/my_metric are both my_metric, named <prefix>/my_metric at the pass's end
    for stage in ("val", "test"):
        name = name.removeprefix(f"{stage}/")
    return name


class ModuleLogs:
    """Collects what a module logs with ``self.log`` and publishes it per step, per epoch and per evaluation pass.

    Example:
        >>> from types import SimpleNamespace
        >>> from sss.trainer.state import TrainState
        >>> module = nn.Linear(1, 1)
        >>> module._logged = new_buffer()
        >>> for value, size in ((1.0, 2), (4.0, 1)):  # two micro-batches of one optimizer step
        ...     module._logged.append(Logged("x", torch.tensor(value), None, True, False, None))
        ...     stamp(module, "training_step", size, len(module._logged) - 1)
        >>> logs, state = ModuleLogs(), TrainState(global_step=10)
        >>> logs.end_window(module, state, every_n_steps=10, replays=False)
        >>> {k: float(v) for k, v in state.logs.items()}  # the step's value: the mean over its 3 samples
        {'train/x_step': 2.0}
        >>> logs.end_epoch(module, state, SimpleNamespace(num_processes=1, device="cpu", log=lambda v, step: None))
        >>> state.metrics
        {'train/x_epoch': 2.0}
    """

    def __init__(self) -> None:
        self.epoch = _Sums()
        self.eval = _Sums()

    # ------------------------------------------------------------------ training
    def start_epoch(self, module: nn.Module) -> None:
        """Forget the sums of an epoch that did not end (a failed fit) and values logged before it."""
        self.epoch = _Sums()
        _take(module, "training_step")

    def end_window(self, module: nn.Module, state: Any, every_n_steps: int, replays: bool) -> None:
        """At an optimizer step: the window's values into the epoch sums; at a logging step, their means in state.logs.

        `every_n_steps` 0 publishes nothing. `replays`: under ``trainer.auto_batch_size`` a window
        replayed after an out-of-memory error logged its values again; only those from its last
        fresh start count.
        """
        entries = _take(module, "training_step")
        if not entries:  # most steps of most modules: nothing logged, nothing to add or publish
            return
        if replays:
            starts = [i for i, entry in enumerate(entries) if entry.fresh]
            entries = entries[starts[-1] :] if starts else entries
        step = _Sums()
        for entry in entries:
            step_name, epoch_name = _train_names(entry)
            if step_name is not None:
                step.add(step_name, entry)
            if epoch_name is not None:
                self.epoch.add(epoch_name, entry)
        due = every_n_steps > 0 and state.global_step % every_n_steps == 0 and not state.step_was_skipped
        if step.sums and due:
            # The main process's values, as train/loss (no cross-process sync per step), left on the
            # device: the logging callbacks read them with the loss in one transfer.
            values = step.tensors()
            state.logs.update(values)
            state.bar.update({k: v for k, v in values.items() if k in step.bar})

    def end_epoch(self, module: nn.Module, state: Any, accelerator: Any) -> None:
        """The epoch's means over all processes into ``state.metrics`` (and the bar), and to the trackers now."""
        self.end_window(module, state, every_n_steps=0, replays=False)  # a window cut short (state.should_stop)
        _read_logs(state)
        epoch, self.epoch = self.epoch, _Sums()
        values = epoch.means(accelerator)
        if values:
            state.metrics.update(values)
            state.bar.update({k: v for k, v in values.items() if k in epoch.bar})
            # Logged here rather than through state.logs, which waits for the next logging step: the
            # last epoch has none after it.
            accelerator.log(values, step=state.global_step)

    # ------------------------------------------------------------------ evaluation
    def start_eval(self, module: nn.Module) -> None:
        """Forget values of an evaluation pass that did not end."""
        self.eval = _Sums()
        _take(module, "validation_step")

    def fold_eval(self, module: nn.Module, drop: bool = False) -> None:
        """The values the latest ``validation_step`` call(s) logged into the pass's sums; `drop` discards them.

        `drop` is for a sample that a distributed sampler repeated to pad the last batch, which
        ``gather_for_metrics`` drops from the outputs too.
        """
        for entry in _take(module, "validation_step"):
            _check_eval(entry)
            if not drop:
                self.eval.add(_eval_name(entry.name), entry)

    def end_eval(self, state: Any, accelerator: Any, prefix: str, metrics: dict[str, float]) -> dict[str, float]:
        """The pass's means over all processes, named ``<prefix>/<name>``, added to `metrics` (the pass's)."""
        means, bar = self.eval.means(accelerator), self.eval.bar
        self.eval = _Sums()
        values = {f"{prefix}/{name}": value for name, value in means.items()}
        clash = sorted(set(values) & set(metrics))
        if clash:
            raise ValueError(
                f"validation_step logged {', '.join(clash)}, which compute_metrics also returns: give the logged "
                "value another name"
            )
        state.bar.update({f"{prefix}/{name}": means[name] for name in bar})
        return {**metrics, **values}
