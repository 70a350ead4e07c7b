"""Callbacks: the `Event` enum, the `Callback` base and the stock callbacks."""

from sss.callbacks.base import Callback, Event
from sss.callbacks.checkpoint import ModelCheckpoint
from sss.callbacks.debug import DebugShapes
from sss.callbacks.early_stopping import EarlyStopping
from sss.callbacks.ema import EMA
from sss.callbacks.grad_norm import GradNormMonitor
from sss.callbacks.hub import HubPush
from sss.callbacks.lr_monitor import LearningRateMonitor
from sss.callbacks.memory import MemoryMonitor
from sss.callbacks.metrics_logger import CSVTracker, MetricsLogger
from sss.callbacks.model_summary import ModelSummary
from sss.callbacks.ogm_ge import OGMGE
from sss.callbacks.overflow import OverflowDetector
from sss.callbacks.plots import Plots
from sss.callbacks.prediction_writer import CSVPredictionWriter, PredictionWriter
from sss.callbacks.profiler import Profiler
from sss.callbacks.progress import ProgressBar
from sss.callbacks.skipped import SkippedRows
from sss.callbacks.throughput import Throughput

__all__ = [
    "EMA",
    "OGMGE",
    "CSVPredictionWriter",
    "CSVTracker",
    "Callback",
    "DebugShapes",
    "EarlyStopping",
    "Event",
    "GradNormMonitor",
    "HubPush",
    "LearningRateMonitor",
    "MemoryMonitor",
    "MetricsLogger",
    "ModelCheckpoint",
    "ModelSummary",
    "OverflowDetector",
    "Plots",
    "PredictionWriter",
    "Profiler",
    "ProgressBar",
    "SkippedRows",
    "Throughput",
]
