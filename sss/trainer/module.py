"""`LitModule`: the model a user subclasses. Encoders, a fusion head and `compute_loss`; no hooks."""

from __future__ import annotations

import inspect
from typing import TYPE_CHECKING, Any

import torch
from torch import Tensor, nn

if TYPE_CHECKING:
    from sss.trainer.trainer import SSSTrainer

__all__ = ["LitModule", "output_logits"]

Batch = dict[str, Any]


class LitModule(nn.Module):
    """A Shadow & Sound Hunter model: image encoder, audio encoder, fusion head, loss.

    Subclasses set the three parts in ``__init__`` and implement `compute_loss`. The defaults
    below cover the usual case; override any of them. Lifecycle code belongs in callbacks:
    the module has no ``on_*`` hooks.

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
    trainer: SSSTrainer | None
    """The trainer running this module (set by `SSSTrainer`); None outside a run."""
    metrics: list[str] | None = None
    """Metric names `compute_metrics` keeps (``*`` wildcards; the loss always); None: the task's defaults."""

    def __init__(self) -> None:
        super().__init__()
        self.image_encoder = None
        self.audio_encoder = None
        self.fusion_head = None
        self.trainer = None

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
        """Per-sample outputs of one evaluation batch; every value has the batch as its first dimension.

        The trainer gathers them across processes (dropping the samples a distributed sampler
        duplicated) and hands the concatenation to `compute_metrics`. The default returns the loss
        per sample (the batch mean repeated; each sample's own in the last batch of a multi-process
        evaluation, which the sampler may have padded, so the dataset mean stays exact) and, for
        each task whose output and target are present:

        - clip classes: ``scores`` (logits ``[B, K]``) with ``target`` (class indices; also ``preds``)
          or ``labels`` (multi-hot);
        - sound events: ``event_probs`` ``[B, T', E]``, ``event_target`` ``[B, T, E]`` and
          ``clip_seconds`` ``[B]`` (from `clip_seconds`);
        - shadow masks: ``mask_counts`` ``[B, 4]`` pixel counts (`sss.metrics.mask_counts`), so the
          dataset-level BER needs no full-resolution masks gathered.
        """
        from sss.metrics import mask_counts
        from sss.trainer._batches import batch_size, split_batch

        outputs = self(batch)
        logits = output_logits(outputs)
        size = logits.shape[0] if logits is not None else batch_size(batch)
        accelerator = getattr(self.trainer, "accelerator", None)
        if accelerator is not None and accelerator.num_processes > 1 and accelerator.gradient_state.end_of_dataloader:
            # One loss per sample in a last batch that a distributed sampler may have padded with
            # repeated samples, which a batch mean would mix into the rows gather_for_metrics keeps.
            pairs = zip(split_batch(outputs, size), split_batch(batch, size), strict=True)
            loss = torch.stack([self.compute_loss(out, one).detach().float() for out, one in pairs])
        else:
            loss = self.compute_loss(outputs, batch).detach().float().expand(size)
        result = {"loss": loss}
        if logits is not None and "label" in batch:
            result.update(scores=logits.float(), preds=logits.argmax(dim=-1), target=batch["label"])
        elif logits is not None and "labels" in batch:
            result.update(scores=logits.float(), labels=batch["labels"])
        if not isinstance(outputs, dict):
            return result
        seconds = self.clip_seconds(batch)
        if "events" in outputs and "events" in batch and seconds is not None:
            result["event_probs"] = outputs["events"].float().sigmoid()
            result["event_target"] = batch["events"]
            result["clip_seconds"] = torch.full((size,), seconds, device=result["loss"].device)
        if "mask" in outputs and "mask" in batch:
            result["mask_counts"] = mask_counts(outputs["mask"].float().sigmoid(), batch["mask"])
        return result

    def compute_metrics(self, outputs: dict[str, Tensor]) -> dict[str, float]:
        """Dataset-level metrics from the gathered `validation_step` outputs (names without a prefix).

        Default: mean ``loss`` plus the metrics of each task present (`sss.metrics.task_metrics`):
        accuracy, top-5 accuracy, macro/micro F1 and per-class P/R/F1 for single-label; mAP, mAUC
        and F1 for multi-label; segment- and event-based F1 and error rate for sound events; BER
        for shadow masks. Set ``metrics`` (a list of names with ``*`` wildcards) to keep fewer.
        """
        from sss.metrics import task_metrics

        metrics = {"loss": float(outputs["loss"].float().mean())} if "loss" in outputs else {}
        datamodule = getattr(self.trainer, "datamodule", None)
        names = getattr(datamodule, "classes", None)
        return metrics | task_metrics(outputs, class_names=list(names) if names else None, select=self.metrics)

    def clip_seconds(self, batch: Batch) -> float | None:
        """Length in seconds of the batch's audio clips, which event metrics need; None when unknown.

        Read from ``batch["clip_seconds"]`` when the data provides it, else from the audio and the
        audio encoder's ``frontend`` (its ``sample_rate``, and ``hop_length`` for log-mel features).
        """
        if "clip_seconds" in batch:
            return float(torch.as_tensor(batch["clip_seconds"]).flatten()[0])
        frontend = getattr(self.audio_encoder, "frontend", None)
        audio, rate = batch.get("audio"), getattr(frontend, "sample_rate", None)
        if not isinstance(audio, Tensor) or rate is None:
            return None
        if audio.ndim == 4:  # cached log-mel [B, 1, M, T] of centred frames: T = S // hop + 1
            return (audio.shape[-1] - 1) * frontend.hop_length / rate
        return audio.shape[-1] / rate

    def predict_step(self, batch: Batch, batch_idx: int) -> Any:
        """Outputs for inference; default: `forward`."""
        return self(batch)

    def configure_optimizers(self) -> torch.optim.Optimizer | tuple[torch.optim.Optimizer, Any]:
        """Build the optimizer (and optionally a scheduler) from ``trainer.optim`` in the config.

        Weight decay applies to weight matrices and kernels only: biases and norm parameters
        (tensors of one dimension) are left undecayed, as is common practice for AdamW. The
        scheduler's ``_target_`` receives the optimizer and, when it accepts ``total_steps``,
        the number of optimizer steps of the whole run.
        """
        from sss.config import OptimConfig, instantiate

        optim = self.trainer.config.optim if self.trainer is not None else OptimConfig()
        spec = dict(optim.optimizer)
        decay = float(spec.get("weight_decay", 0.0))
        params = [p for p in self.parameters() if p.requires_grad]
        groups = [
            {"params": [p for p in params if p.ndim > 1], "weight_decay": decay},
            {"params": [p for p in params if p.ndim <= 1], "weight_decay": 0.0},
        ]
        optimizer = instantiate(spec, [g for g in groups if g["params"]])
        if optim.scheduler is None:
            return optimizer
        extra: dict[str, Any] = {}
        target = _target_callable(optim.scheduler)
        if "total_steps" in inspect.signature(target).parameters and "total_steps" not in optim.scheduler:
            extra["total_steps"] = self.trainer.total_steps if self.trainer is not None else 1
        return optimizer, instantiate(dict(optim.scheduler), optimizer, **extra)

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


def _target_callable(spec: dict[str, Any]) -> Any:
    from sss.config import resolve_target

    return resolve_target(spec["_target_"])
