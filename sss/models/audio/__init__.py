"""Audio encoders: `LogMelFrontend` (waveform -> log-mel) and `AudioCNN` (PANNs-style CNN)."""

from sss.models.audio.cnn import AudioCNN
from sss.models.audio.frontend import LogMelFrontend

__all__ = ["AudioCNN", "LogMelFrontend"]
