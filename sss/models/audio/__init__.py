"""Audio encoders over `LogMelFrontend` (waveform -> log-mel): `AudioCNN` and `AudioSpectrogramTransformer`."""

from sss.models.audio.ast import AudioSpectrogramTransformer
from sss.models.audio.cnn import AudioCNN
from sss.models.audio.frontend import LogMelFrontend

__all__ = ["AudioCNN", "AudioSpectrogramTransformer", "LogMelFrontend"]
