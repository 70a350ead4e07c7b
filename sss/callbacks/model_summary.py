"""`ModelSummary`: a table of parameters and multiply-adds per branch (image / audio / fusion / heads) at fit start."""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import torch
from torch import nn
from torch.utils.flop_counter import FlopCounterMode

from sss.callbacks.base import Callback

if TYPE_CHECKING:
    from sss.trainer.module import LitModule
    from sss.trainer.trainer import SSSTrainer

__all__ = ["BranchSummary", "ModelSummary", "summarize", "training_flops"]

BRANCHES = ("image", "audio", "fusion", "heads")


@dataclass
class BranchSummary:
    """One row of the summary.

    Attributes:
        branch: ``image``, ``audio``, ``fusion``, ``heads`` or ``total``.
        params: Parameters (trainable and frozen).
        trainable: Trainable parameters.
        macs: Multiply-accumulates of one forward pass on the summary batch; None if it failed.
    """

    branch: str
    params: int
    trainable: int
    macs: int | None


def summarize(module: LitModule, batch: dict[str, Any] | None) -> list[BranchSummary]:
    """Parameters and multiply-adds per branch, and the total.

    Parameters are split as `LitModule.modality_groups` splits them: ``image_encoder``,
    ``audio_encoder``, ``fusion_head``, and ``heads`` for all the rest (frozen ones included).

    Multiply-adds come from one forward pass of `batch` in eval mode under ``torch.no_grad()`` and
    ``torch.utils.flop_counter.FlopCounterMode``, whose FLOPs (2 per multiply-add) are halved. It
    counts matrix products, convolutions and attention (what dominates these models), not
    element-wise ops, norms or FFTs. The image and audio rows are the FLOPs inside
    ``image_encoder`` / ``audio_encoder``, ``heads`` those inside any other child module except
    ``fusion_head``, and ``fusion`` the remainder (a fusion head may be called through methods such
    as ``fuse``/``classify``, which module hooks do not see). The RNG state and the train/eval mode
    are restored afterwards, so summarising does not change a run.

    A module with none of ``image_encoder``, ``audio_encoder`` and ``fusion_head`` (a plain model
    wrapped by ``LitModule.from_model``) has no branches to split by: it gets the ``total`` row only.

    Args:
        module: The model.
        batch: A batch the model's ``forward`` accepts (batch size 1 is enough); None skips the MACs.

    Returns:
        One `BranchSummary` per branch, then ``total``.

    Example:
        >>> import torch
        >>> from sss.testing import BoringModule
        >>> rows = summarize(BoringModule(), {"image": torch.zeros(1, 3, 4, 4), "audio": torch.zeros(1, 1, 16)})
        >>> [(r.branch, r.params, r.macs) for r in rows]  # 48*8 + 8, 16*8 + 8, 8*2 + 2
        [('image', 392, 384), ('audio', 136, 128), ('fusion', 18, 16), ('heads', 0, 0), ('total', 546, 528)]
    """
    owned = _owned(module)
    if "total" in owned:
        params = owned["total"]
        macs = _flops(module, batch).get("Global", 0) // 2 if batch is not None else None
        return [BranchSummary("total", _count(params), _count(p for p in params if p.requires_grad), macs)]
    macs = _macs(module, batch) if batch is not None else None
    rows = [
        BranchSummary(key, _count(owned[key]), _count(p for p in owned[key] if p.requires_grad), macs and macs[key])
        for key in BRANCHES
    ]
    total = [p for params in owned.values() for p in params]
    total_macs = sum(macs.values()) if macs else None
    rows.append(BranchSummary("total", _count(total), _count(p for p in total if p.requires_grad), total_macs))
    return rows


def training_flops(module: nn.Module, rows: list[BranchSummary]) -> int | None:
    """FLOPs of training on one sample, from the multiply-adds of `summarize`'s rows.

    2 FLOPs per multiply-add; a branch with a trainable parameter now counts forward and backward
    (3 x its forward, the usual MFU convention), a frozen one its forward only (nothing is
    backpropagated through it), so a ``trainer.finetune`` unfreeze shows from the next call on.

    Args:
        module: The model the rows describe (its parameters' ``requires_grad`` are read now).
        rows: `summarize`'s rows.

    Returns:
        FLOPs per sample, or None when the rows have no multiply-adds.

    Example:
        >>> from sss.testing import BoringModule
        >>> model = BoringModule()
        >>> rows = summarize(model, {"image": torch.zeros(1, 3, 4, 4), "audio": torch.zeros(1, 1, 16)})
        >>> training_flops(model, rows)  # 2 x 3 x (384 + 128 + 16)
        3168
        >>> _ = model.audio_encoder.requires_grad_(False)
        >>> training_flops(model, rows)  # the audio branch forward only: 2 x (3 x (384 + 16) + 128)
        2656
    """
    macs = {row.branch: row.macs for row in rows}
    owned = _owned(module)
    if any(macs.get(branch) is None for branch in owned):
        return None
    passes = {branch: 3 if any(p.requires_grad for p in params) else 1 for branch, params in owned.items()}
    return sum(2 * passes[branch] * macs[branch] for branch in owned)  # type: ignore[operator]


def _owned(module: nn.Module) -> dict[str, list[nn.Parameter]]:
    # Parameters by branch, as modality_groups splits them; {"total": ...} for a module with no branches.
    if not any(isinstance(getattr(module, attr, None), nn.Module) for attr in _ATTRS.values()):
        return {"total": list(module.parameters())}
    owned: dict[str, list[nn.Parameter]] = {}
    for key, attr in _ATTRS.items():
        part = getattr(module, attr, None)
        owned[key] = list(part.parameters()) if isinstance(part, nn.Module) else []
    seen = {id(p) for params in owned.values() for p in params}
    owned["heads"] = [p for p in module.parameters() if id(p) not in seen]
    return owned


def _count(params: Iterable[nn.Parameter]) -> int:
    return sum(p.numel() for p in params)


_ATTRS = {"image": "image_encoder", "audio": "audio_encoder", "fusion": "fusion_head"}


def _flops(module: nn.Module, batch: dict[str, Any]) -> dict[str, int]:
    # FLOPs of one forward pass by module name ("Global": all of them), leaving the run as it was.
    was_training = module.training
    module.eval()  # no SpecAugment/dropout draws, no BatchNorm statistics updates
    try:
        with torch.random.fork_rng(devices=[]), torch.no_grad(), FlopCounterMode(display=False) as counter:
            module(batch)
    finally:
        module.train(was_training)
    return {name: sum(counts.values()) for name, counts in counter.get_flop_counts().items()}


def _macs(module: nn.Module, batch: dict[str, Any]) -> dict[str, int]:
    root = type(module).__name__
    flops = _flops(module, batch)
    out = {key: flops.get(f"{root}.{attr}", 0) // 2 for key, attr in _ATTRS.items() if key != "fusion"}
    children = {f"{root}.{name}" for name, _ in module.named_children()} - {f"{root}.{a}" for a in _ATTRS.values()}
    out["heads"] = sum(flops.get(name, 0) for name in children) // 2
    out["fusion"] = flops.get("Global", 0) // 2 - out["image"] - out["audio"] - out["heads"]
    return out


class ModelSummary(Callback):
    """Print a rich table of parameters and multiply-adds per branch when `fit` starts (main process only).

    The multiply-adds are measured on a dummy batch of one sample, ``{"image": zeros[1, 3, S, S],
    "audio": zeros[1, 1, N]}`` under the module's ``modality_keys`` (``LitModule.modality_keys``);
    see `summarize` for how they are counted. Sizes left as None come
    from the fit's datamodule (``image_size``; ``sample_rate * clip_seconds``; only the modalities
    it has), else 64 px and 16000 samples. A model whose forward rejects the dummy still gets its
    parameter counts, with the error in place of the multiply-adds. A stock callback
    (``trainer.log.summary``).

    Args:
        image_size: Side ``S`` of the dummy image; 0 leaves the image out; None: from the data.
        audio_samples: Samples ``N`` of the dummy waveform; 0 leaves the audio out; None: from the data.

    Example:
        >>> ModelSummary(image_size=64, audio_samples=16000).image_size
        64
    """

    def __init__(self, image_size: int | None = None, audio_samples: int | None = None) -> None:
        self.image_size = image_size
        self.audio_samples = audio_samples
        self.rows: list[BranchSummary] = []
        """The rows of the last summary (for tests and other callbacks)."""

    def on_fit_start(self, trainer: SSSTrainer, module: LitModule) -> None:
        if not trainer.accelerator.is_main_process:
            return
        error = ""
        try:
            self.rows = self.measure(module, getattr(trainer, "datamodule", None))
        except Exception as err:  # a summary must never stop a run
            self.rows, error = summarize(module, None), f"{type(err).__name__}: {err}"
        _print(type(module).__name__, self.rows, error)

    def measure(self, module: nn.Module, datamodule: Any = None) -> list[BranchSummary]:
        """`summarize` on `dummy_batch`, its sizes left as None taken from `datamodule`; raises what the forward raises.

        Args:
            module: The model.
            datamodule: The fit's datamodule, or None.

        Returns:
            The rows, with multiply-adds.

        Example:
            >>> from sss.testing import BoringModule
            >>> ModelSummary(4, 16).measure(BoringModule())[-1].macs
            528
        """
        sizes = self.image_size, self.audio_samples
        self.image_size, self.audio_samples = _sizes_from(datamodule, *sizes)
        try:
            return summarize(module, self.dummy_batch(module))
        finally:
            self.image_size, self.audio_samples = sizes

    def dummy_batch(self, module: nn.Module) -> dict[str, torch.Tensor]:
        """The one-sample batch the multiply-adds are measured on, on the module's device.

        Args:
            module: The model (its first parameter gives the device).

        Returns:
            ``{"image": [1, 3, S, S], "audio": [1, 1, N]}`` of zeros, under the batch keys of the
            module's ``modality_keys`` (keys with size 0, or that the module does not name, left out).

        Example:
            >>> {k: tuple(v.shape) for k, v in ModelSummary(32, 8000).dummy_batch(nn.Linear(1, 1)).items()}
            {'image': (1, 3, 32, 32), 'audio': (1, 1, 8000)}
        """
        device = next(module.parameters()).device
        keys = getattr(module, "modality_keys", {"image": "image", "audio": "audio"})
        image_size, audio_samples = _sizes_from(None, self.image_size, self.audio_samples)
        batch = {}
        if image_size and "image" in keys:
            batch[keys["image"]] = torch.zeros(1, 3, image_size, image_size, device=device)
        if audio_samples and "audio" in keys:
            batch[keys["audio"]] = torch.zeros(1, 1, audio_samples, device=device)
        return batch


def _sizes_from(datamodule: Any, image_size: int | None, audio_samples: int | None) -> tuple[int, int]:
    modalities = getattr(datamodule, "modalities", ("image", "audio"))
    if image_size is None:
        image_size = int(getattr(datamodule, "image_size", 64) or 64) if "image" in modalities else 0
    if audio_samples is None:
        rate, seconds = getattr(datamodule, "sample_rate", None), getattr(datamodule, "clip_seconds", None)
        audio_samples = (round(rate * seconds) if rate and seconds else 16000) if "audio" in modalities else 0
    return image_size, audio_samples


def _print(name: str, rows: list[BranchSummary], error: str) -> None:
    from rich.console import Console
    from rich.table import Table

    console = Console()
    # The heading is a line of its own: a table title wraps to the (narrow) table width.
    console.print(f"[bold]{name}[/bold]: parameters and multiply-adds per sample")
    table = Table()
    for column in ("branch", "params", "trainable", "MACs"):
        table.add_column(column, justify="left" if column == "branch" else "right")
    for row in rows:
        macs = _human(row.macs) if row.macs is not None else "n/a"
        table.add_row(
            row.branch, _human(row.params), _human(row.trainable), macs, style="bold" * (row.branch == "total")
        )
    console.print(table)
    if error:
        console.print(f"[yellow]model summary: no multiply-adds, the dummy batch failed: {error}")


def _human(n: int) -> str:
    for unit, size in (("G", 1e9), ("M", 1e6), ("K", 1e3)):
        if abs(n) >= size:
            return f"{n / size:.2f} {unit}"
    return str(n)
