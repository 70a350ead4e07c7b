"""Callbacks: the `Event` enum, the `Callback` base and the stock callbacks."""

from sss.callbacks.base import Callback, Event
from sss.callbacks.checkpoint import ModelCheckpoint
from sss.callbacks.metrics_logger import CSVTracker, MetricsLogger
from sss.callbacks.progress import ProgressBar

__all__ = ["CSVTracker", "Callback", "Event", "MetricsLogger", "ModelCheckpoint", "ProgressBar"]
