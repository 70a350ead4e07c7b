"""`LitModule`: the model a user subclasses. Encoders, a fusion head and `compute_loss`; no hooks.

A plain `nn.Module` contract: every method gets what it needs as arguments (the trainer passes the
class names, builds the optimizer over `LitModule.parameter_groups`), so a module is used and
tested without a trainer.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch
from torch import Tensor, nn

from sss.trainer._batches import batch_size

__all__ = ["LitModule", "output_logits"]

Batch = dict[str, Any]


class LitModule(nn.Module):
    """A Shadow & Sound Hunter model: image encoder, audio encoder, fusion head, loss.

    Subclasses set the three parts in ``__init__`` and implement `compute_loss`. The defaults
    below cover the usual case; override any of them. Lifecycle code belongs in callbacks:
    the module has no ``on_*`` hooks, and no reference to the trainer that runs it.

    Example:
        >>> import torch
        >>> from torch import nn
        >>> import torch.nn.functional as F
        >>> class Tiny(LitModule):
        ...     def __init__(self):
        ...         super().__init__()
        ...         self.image_encoder = nn.Sequential(nn.Flatten(), nn.Linear(3 * 4 * 4, 8))
        ...         self.audio_encoder = nn.Linear(16, 8)
        ...         self.fusion_head = FuseSum(8, 2)
        ...     def compute_loss(self, outputs, batch):
        ...         return F.cross_entropy(outputs, batch["label"])
        >>> class FuseSum(nn.Module):
        ...     def __init__(self, dim, classes):
        ...         super().__init__()
        ...         self.out = nn.Linear(dim, classes)
        ...     def forward(self, image, audio):
        ...         return self.out(image + audio.flatten(1))
        >>> batch = {"image": torch.randn(2, 3, 4, 4), "audio": torch.randn(2, 1, 16), "label": torch.tensor([0, 1])}
        >>> Tiny().training_step(batch, 0).shape
        torch.Size([])
    """

    image_encoder: nn.Module | None
    audio_encoder: nn.Module | None
    fusion_head: nn.Module | None
    metrics: list[str] | None = None
    """Metric names `compute_metrics` keeps (``*`` wildcards; the loss always); None: the task's defaults."""

    def __init__(self) -> None:
        super().__init__()
        self.image_encoder = None
        self.audio_encoder = None
        self.fusion_head = None

    def forward(self, batch: Batch) -> Any:
        """Encode each modality present in the batch and fuse them.

        A modality missing from the batch (or without an encoder) reaches the fusion head as None.
        """
        if self.fusion_head is None:
            raise NotImplementedError(
                f"{type(self).__name__} sets no fusion_head: set self.fusion_head in __init__ or override forward()"
            )
        image = batch.get("image")
        audio = batch.get("audio")
        image_tokens = self.image_encoder(image) if self.image_encoder is not None and image is not None else None
        audio_tokens = self.audio_encoder(audio) if self.audio_encoder is not None and audio is not None else None
        return self.fusion_head(image_tokens, audio_tokens)

    def compute_loss(self, outputs: Any, batch: Batch) -> Tensor:
        """The scalar training loss of `outputs` (what `forward` returned) against the batch targets.

        Use a mean over the samples of the batch: the trainer relies on it to make gradient
        accumulation and multi-process training equal to one big batch.
        """
        raise NotImplementedError(f"{type(self).__name__} must implement compute_loss(outputs, batch)")

    def training_step(self, batch: Batch, batch_idx: int) -> Tensor:
        """One micro-batch of training; returns the loss to backpropagate."""
        return self.compute_loss(self(batch), batch)

    def validation_step(self, batch: Batch, batch_idx: int) -> dict[str, Tensor]:
        """Per-sample outputs of one evaluation batch: `validation_outputs` of ``self(batch)``.

        Every value has the batch as its first dimension. The trainer gathers them across processes
        (dropping the samples a distributed sampler duplicated; it runs a possibly padded last batch
        of a multi-process evaluation sample by sample, so a batch-mean value never mixes them in)
        and hands the concatenation to `compute_metrics`.
        """
        return self.validation_outputs(self(batch), batch)

    def validation_outputs(self, outputs: Any, batch: Batch) -> dict[str, Tensor]:
        """The per-sample evaluation values of `forward`'s `outputs` on `batch`.

        The default: ``loss`` (the batch's `compute_loss`, repeated per sample) and, when the outputs
        hold class logits (`output_logits`): ``scores`` (logits ``[B, K]``) with ``target`` (class
        indices) and ``preds`` for a ``"label"`` batch, or with ``labels`` (multi-hot) for a
        ``"labels"`` batch. Models with more tasks add theirs (`HunterModule`: sound events, shadow
        masks, via `sss.metrics.task.task_outputs`).

        Example:
            >>> from sss.testing import BoringModule, boring_loader
            >>> module, batch = BoringModule(), next(iter(boring_loader(batch_size=4)))
            >>> {key: tuple(value.shape) for key, value in module.validation_outputs(module(batch), batch).items()}
            {'loss': (4,), 'scores': (4, 2), 'preds': (4,), 'target': (4,)}
        """
        logits = output_logits(outputs)
        size = logits.shape[0] if logits is not None else batch_size(batch)
        result = {"loss": self.compute_loss(outputs, batch).detach().float().expand(size)}
        if logits is not None and "label" in batch:
            result.update(scores=logits.float(), preds=logits.argmax(dim=-1), target=batch["label"])
        elif logits is not None and "labels" in batch:
            result.update(scores=logits.float(), labels=batch["labels"])
        return result

    def compute_metrics(self, outputs: dict[str, Tensor], classes: Sequence[str] | None = None) -> dict[str, float]:
        """Dataset-level metrics from the gathered `validation_step` outputs (names without a prefix).

        Default: mean ``loss`` plus the metrics of each task present (`sss.metrics.task_metrics`):
        accuracy, top-5 accuracy, macro/micro F1 and per-class P/R/F1 for single-label; mAP, mAUC
        and F1 for multi-label; segment- and event-based F1 and error rate for sound events; BER
        for shadow masks. Set ``metrics`` (a list of names with ``*`` wildcards) to keep fewer.

        Args:
            outputs: The gathered per-sample outputs.
            classes: Names of the clip classes, for per-class keys (``f1/<name>``); the trainer passes
                its datamodule's ``classes``. None: per-class keys by class index. (An override with
                the one-argument signature ``compute_metrics(self, outputs)`` still works; the trainer
                then passes no names.)

        Example:
            >>> from sss.testing import BoringModule
            >>> out = {"loss": torch.ones(2), "scores": torch.eye(2), "target": torch.tensor([0, 1])}
            >>> sorted(k for k in BoringModule().compute_metrics(out, classes=["cat", "dog"]) if k.startswith("f1/"))
            ['f1/cat', 'f1/dog']
        """
        from sss.metrics import task_metrics

        metrics = {"loss": float(outputs["loss"].float().mean())} if "loss" in outputs else {}
        names = list(classes) if classes else None
        return metrics | task_metrics(outputs, class_names=names, select=self.metrics)

    def predict_step(self, batch: Batch, batch_idx: int) -> Any:
        """Outputs for inference; default: `forward`."""
        return self(batch)

    def configure_optimizers(self) -> torch.optim.Optimizer | tuple[torch.optim.Optimizer, Any] | None:
        """Your own optimizer, or ``(optimizer, scheduler)``; the default None lets the trainer build ``trainer.optim``.

        The trainer instantiates the config's optimizer over `parameter_groups` and its scheduler
        (with ``total_steps`` when the scheduler takes it), as torchtune instantiates
        ``cfg.optimizer`` with the model's parameters. Override this only for what a config cannot
        say (e.g. per-part learning rates); a scheduler returned here is stepped once per applied
        optimizer step, like the config's.
        """
        return None

    def parameter_groups(self, weight_decay: float) -> list[dict[str, Any]]:
        """The trainable parameters as optimizer groups: `weight_decay` on weight matrices and kernels only.

        Biases and norm parameters (tensors of one dimension) get no decay, as is common practice
        for AdamW. Empty groups are left out.

        Example:
            >>> from sss.testing import BoringModule
            >>> [(len(group["params"]), group["weight_decay"]) for group in BoringModule().parameter_groups(0.1)]
            [(3, 0.1), (3, 0.0)]
        """
        params = [p for p in self.parameters() if p.requires_grad]
        groups = [
            {"params": [p for p in params if p.ndim > 1], "weight_decay": weight_decay},
            {"params": [p for p in params if p.ndim <= 1], "weight_decay": 0.0},
        ]
        return [g for g in groups if g["params"]]

    def modality_groups(self) -> dict[str, list[nn.Parameter]]:
        """Trainable parameters by part: ``image``, ``audio``, ``fusion`` and ``heads`` (all the rest).

        Per-modality health callbacks read these; parts that are absent give empty lists.
        """
        groups: dict[str, list[nn.Parameter]] = {"image": [], "audio": [], "fusion": [], "heads": []}
        seen: set[int] = set()
        for key, part in (("image", self.image_encoder), ("audio", self.audio_encoder), ("fusion", self.fusion_head)):
            if part is not None:
                for p in part.parameters():
                    if p.requires_grad and id(p) not in seen:
                        groups[key].append(p)
                        seen.add(id(p))
        groups["heads"] = [p for p in self.parameters() if p.requires_grad and id(p) not in seen]
        return groups


def output_logits(outputs: Any) -> Tensor | None:
    """The class logits in a module's ``forward`` output: the tensor itself or its ``"logits"`` entry, else None.

    Example:
        >>> output_logits({"logits": torch.zeros(2, 3)}).shape
        torch.Size([2, 3])
    """
    if isinstance(outputs, Tensor):
        return outputs
    if isinstance(outputs, dict) and isinstance(outputs.get("logits"), Tensor):
        return outputs["logits"]
    return None
