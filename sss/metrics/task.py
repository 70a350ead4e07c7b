"""The evaluation values and metrics of each task: `task_outputs` per batch, `task_metrics` over the gathered set."""

from __future__ import annotations

import fnmatch
from collections.abc import Sequence
from typing import Any

import torch
from torch import Tensor

from sss.metrics.classification import multiclass_metrics, multilabel_metrics
from sss.metrics.sed import sed_metrics
from sss.metrics.shadow import mask_counts, shadow_metrics

__all__ = ["HEADLINE", "PER_CLASS_UP_TO", "task_metrics", "task_outputs"]

PER_CLASS_UP_TO = 32
"""Per-class keys (``f1/<class>``, ``ap/<class>``, ...) are reported by default up to this many classes."""

HEADLINE = ("accuracy", "macro_f1", "map", "event_f1", "segment_f1", "ber")
"""The metrics that the modality ablation reports per modality and as a fusion gain, where present."""


def task_outputs(outputs: Any, batch: dict[str, Any], *, clip_seconds: float | None = None) -> dict[str, Tensor]:
    """Per-sample evaluation values of the sound-event and shadow-mask tasks whose output and target are present.

    - sound events (``outputs["events"]`` logits ``[B, T', E]`` and ``batch["events"]``, with a known
      `clip_seconds`): ``event_probs`` ``[B, T', E]``, ``event_target`` ``[B, T, E]`` and
      ``clip_seconds`` ``[B]``;
    - shadow masks (``outputs["mask"]`` logits and ``batch["mask"]``): ``mask_counts`` ``[B, 4]`` pixel
      counts (`sss.metrics.mask_counts`), so the dataset-level BER needs no full-resolution masks gathered.

    A model's ``validation_outputs`` adds these to its loss and class values (`HunterModule` does);
    `task_metrics` turns the gathered values into metrics.

    Args:
        outputs: What the model's ``forward`` returned; only a dict holds these tasks' outputs.
        batch: The evaluation batch with its targets.
        clip_seconds: Length of the batch's audio clips in seconds, which event metrics need; None
            leaves the event values out.

    Example:
        >>> out = {"events": torch.zeros(2, 5, 3), "mask": torch.zeros(2, 1, 4, 4)}
        >>> batch = {"events": torch.zeros(2, 10, 3), "mask": torch.ones(2, 1, 8, 8)}
        >>> {key: tuple(value.shape) for key, value in task_outputs(out, batch, clip_seconds=1.0).items()}
        {'event_probs': (2, 5, 3), 'event_target': (2, 10, 3), 'clip_seconds': (2,), 'mask_counts': (2, 4)}
    """
    result: dict[str, Tensor] = {}
    if not isinstance(outputs, dict):
        return result
    if "events" in outputs and "events" in batch and clip_seconds is not None:
        events = outputs["events"]
        result["event_probs"] = events.float().sigmoid()
        result["event_target"] = batch["events"]
        result["clip_seconds"] = torch.full((events.shape[0],), clip_seconds, device=events.device)
    if "mask" in outputs and "mask" in batch:
        result["mask_counts"] = mask_counts(outputs["mask"].float().sigmoid(), batch["mask"])
    return result


def task_metrics(
    outputs: dict[str, Tensor],
    *,
    class_names: Sequence[str] | None = None,
    select: Sequence[str] | None = None,
) -> dict[str, float]:
    """Dataset-level metrics for every task whose outputs are present (`LitModule.validation_outputs`, `task_outputs`).

    - ``scores`` + ``target`` (class indices): `multiclass_metrics`;
    - ``scores`` + ``labels`` (multi-hot): `multilabel_metrics`;
    - ``event_probs`` + ``event_target`` + ``clip_seconds``: `sed_metrics`;
    - ``mask_counts``: `shadow_metrics`.

    Args:
        outputs: Gathered per-sample evaluation outputs.
        class_names: Names of the clip classes, for per-class keys.
        select: Metric names to keep, with ``*`` wildcards (e.g. ``["accuracy*", "event_f1"]``); None keeps
            the task's default set: everything, per-class keys only up to `PER_CLASS_UP_TO` classes.

    Example:
        >>> import torch
        >>> out = {"scores": torch.eye(3), "target": torch.tensor([0, 1, 1])}
        >>> metrics = task_metrics(out, select=["accuracy", "macro_f1"])
        >>> {k: round(v, 4) for k, v in metrics.items()}
        {'accuracy': 0.6667, 'macro_f1': 0.5556}
    """
    metrics: dict[str, float] = {}
    scores = outputs.get("scores")
    if scores is not None and "target" in outputs:
        metrics |= multiclass_metrics(scores.float(), outputs["target"].long(), class_names=class_names)
    if scores is not None and "labels" in outputs:
        metrics |= multilabel_metrics(scores.float(), outputs["labels"].float(), class_names=class_names)
    if "event_probs" in outputs and "event_target" in outputs and "clip_seconds" in outputs:
        keep = outputs.get("event_present")  # the clips without audio have no event predictions to score
        events = [outputs[k] if keep is None else outputs[k][keep.bool()] for k in ("event_probs", "event_target")]
        seconds = outputs["clip_seconds"] if keep is None else outputs["clip_seconds"][keep.bool()]
        if len(seconds):
            metrics |= sed_metrics(events[0].float(), events[1].float(), seconds)
    if "mask_counts" in outputs and _defined(outputs["mask_counts"]):
        metrics |= shadow_metrics(outputs["mask_counts"])
    metrics |= _head_metrics(outputs)
    if select is not None:
        return {k: v for k, v in metrics.items() if any(fnmatch.fnmatchcase(k, pattern) for pattern in select)}
    many = scores is not None and scores.shape[-1] > PER_CLASS_UP_TO
    return {k: v for k, v in metrics.items() if not (many and "/" in k)}


def _defined(counts: Tensor) -> bool:
    # BER needs shadow and non-shadow pixels in the set; a set without either (e.g. no shadows in
    # a small validation split) gets no BER rather than a failed evaluation.
    total = counts.sum(dim=0)
    return bool(total[0] + total[3] > 0 and total[1] + total[2] > 0)


def _head_metrics(outputs: dict[str, Tensor]) -> dict[str, float]:
    # Each unimodal head scored like the fused one, over the samples that have its modality, without
    # per-class keys: ``image_head/accuracy``, ``audio_head/map``, ...
    found: dict[str, float] = {}
    for name in ("image", "audio"):
        scores, present = outputs.get(f"{name}_head_scores"), outputs.get(f"{name}_head_present")
        if scores is None or present is None or not bool(present.any()):
            continue
        keep = present.bool()
        if "target" in outputs:
            values = multiclass_metrics(scores[keep].float(), outputs["target"][keep].long())
        elif "labels" in outputs:
            values = multilabel_metrics(scores[keep].float(), outputs["labels"][keep].float())
        else:
            continue
        found |= {f"{name}_head/{key}": value for key, value in values.items() if "/" not in key}
    return found
