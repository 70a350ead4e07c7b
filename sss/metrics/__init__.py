"""Dataset-level metrics on gathered outputs: classification, sound event detection, shadow BER, retrieval, probes.

Each function takes the whole evaluation set (already gathered from every process with
``accelerator.gather_for_metrics``), keeps no state and returns plain floats, so results go straight
to loggers and JSON. Definitions and conventions: docs/metrics.md.

Example:
    >>> import torch
    >>> from sss.metrics import multiclass_metrics
    >>> multiclass_metrics(torch.eye(3), torch.tensor([0, 1, 2]))["accuracy"]
    1.0
"""

from sss.metrics.classification import confusion_matrix, multiclass_metrics, multilabel_metrics
from sss.metrics.retrieval import linear_probe, retrieval_metrics
from sss.metrics.sed import (
    Event,
    event_based_metrics,
    frames_to_events,
    median_filter,
    sed_metrics,
    segment_based_metrics,
)
from sss.metrics.shadow import mask_counts, shadow_metrics
from sss.metrics.task import task_metrics

__all__ = [
    "Event",
    "confusion_matrix",
    "event_based_metrics",
    "frames_to_events",
    "linear_probe",
    "mask_counts",
    "median_filter",
    "multiclass_metrics",
    "multilabel_metrics",
    "retrieval_metrics",
    "sed_metrics",
    "segment_based_metrics",
    "shadow_metrics",
    "task_metrics",
]
