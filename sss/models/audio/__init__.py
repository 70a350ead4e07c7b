"""Audio encoders: `AudioCNN` and `AudioSpectrogramTransformer` over `LogMelFrontend` (waveform -> log-mel),
`PannsEncoder` (PANNs CNN14/10/6 over their own front-end) and `HFAudioEncoder` (a Hugging Face AST,
wav2vec2/HuBERT/WavLM, Whisper encoder or CLAP audio tower over its own front-end)."""

from sss.models.audio.ast import AudioSpectrogramTransformer
from sss.models.audio.cnn import AudioCNN
from sss.models.audio.frontend import LogMelFrontend
from sss.models.audio.hf import HFAudioEncoder
from sss.models.audio.panns import PannsEncoder

__all__ = ["AudioCNN", "AudioSpectrogramTransformer", "HFAudioEncoder", "LogMelFrontend", "PannsEncoder"]
