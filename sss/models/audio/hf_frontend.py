"""On-device front-ends that compute what a Hugging Face feature extractor computes, batched, in float32.

Each one is built from a checkpoint's ``preprocessor_config.json`` (`frontend_for`), so ``sss fit``, ``sss predict``
and the ONNX graph feed the weights the inputs they were trained on: AST's kaldi fbank, the raw (normalised)
waveform of wav2vec2 / HuBERT / WavLM, Whisper's log-mel and CLAP's mel. No numpy and no per-clip Python loop
in ``forward``; each runs with autocast off (fp16 power spectra overflow). A clip longer than the weights'
fixed input is refused rather than cut, since cutting would drop audio the labels may depend on.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import torch
import torch.nn.functional as F
import torchaudio
from torch import Tensor, nn

__all__ = ["ClapMel", "HFFrontend", "KaldiFbank", "WaveformNorm", "WhisperLogMel", "frontend_for"]


class HFFrontend(nn.Module):
    """Base of the Hugging Face front-ends: mono float32 waveform handling, the clip-length check, `settings`.

    Attributes:
        sample_rate: Rate the weights were trained on (``preprocessor_config.json`` ``sampling_rate``).
        hop_length: Samples per output frame (1 for a raw-waveform front-end).
        kind: Feature type recorded in ``preprocessing.json``.
    """

    kind = "waveform"

    def __init__(self, sample_rate: int, hop_length: int) -> None:
        super().__init__()
        self.sample_rate = int(sample_rate)
        self.hop_length = int(hop_length)

    def settings(self) -> dict[str, Any]:
        """The input settings these features are bound to, for the model folder's ``preprocessing.json``.

        Example:
            >>> WaveformNorm(16000).settings()
            {'feature': 'waveform', 'sample_rate': 16000, 'do_normalize': True}
        """
        return {"feature": self.kind, "sample_rate": self.sample_rate}

    def _mono(self, audio: Tensor) -> Tensor:
        if audio.ndim == 4:
            raise ValueError(
                "model.audio_encoder=hf computes its own features from the waveform, but the batch holds a 4-D "
                f"log-mel {tuple(audio.shape)} (a feature cache of sss's own front-end): remove data.cache"
            )
        if audio.ndim == 3:
            audio = audio.mean(dim=1)  # downmix to mono: the extractors take mono only
        elif audio.ndim != 2:
            raise ValueError(f"expected a waveform [B, S] or [B, C, S], got shape {tuple(audio.shape)}")
        return audio.float()

    def _refuse_longer(self, samples: int, limit: int, what: str) -> None:
        if samples > limit:
            raise ValueError(
                f"a {samples / self.sample_rate:.3f} s clip is longer than the {limit / self.sample_rate:.3f} s the "
                f"weights take (preprocessor_config.json {what}; sss refuses to cut audio away): set "
                f"data.clip_seconds<={limit / self.sample_rate:.3f}"
            )


class KaldiFbank(HFFrontend):
    """AST's features: ``torchaudio.compliance.kaldi.fbank`` (Hanning, 25 ms / 10 ms, snip-edges, DC removed,
    pre-emphasis 0.97, 512-point FFT, kaldi mel banks, natural log), zero-padded to ``max_frames`` and then
    normalised ``(x - mean) / (2 std)`` as `ASTFeatureExtractor` does (so the padding is ``-mean / (2 std)``).

    Returns ``[B, max_frames, num_mel_bins]``, the layout of ``ASTModel``'s ``input_values``.

    Example:
        >>> fbank = KaldiFbank(16000, num_mel_bins=32, max_frames=100)
        >>> fbank(torch.randn(2, 1, 16000)).shape
        torch.Size([2, 100, 32])
    """

    kind = "kaldi_fbank"

    def __init__(
        self,
        sample_rate: int = 16000,
        num_mel_bins: int = 128,
        max_frames: int = 1024,
        mean: float = -4.2677393,
        std: float = 4.5689974,
        do_normalize: bool = True,
    ) -> None:
        super().__init__(sample_rate, int(sample_rate * 0.010))
        self.window_size = int(sample_rate * 0.025)
        self.num_mel_bins, self.max_frames = int(num_mel_bins), int(max_frames)
        self.mean, self.std, self.do_normalize = float(mean), float(std), bool(do_normalize)
        self.padded = 1 << (self.window_size - 1).bit_length()  # round_to_power_of_two
        banks, _ = torchaudio.compliance.kaldi.get_mel_banks(
            self.num_mel_bins, self.padded, float(sample_rate), 20.0, 0.0, 100.0, -500.0, 1.0
        )
        self.register_buffer("banks", F.pad(banks.float(), (0, 1)).T.contiguous(), persistent=False)
        self.register_buffer("window", torch.hann_window(self.window_size, periodic=False), persistent=False)

    def settings(self) -> dict[str, Any]:
        """See `HFFrontend.settings`."""
        own = {"num_mel_bins": self.num_mel_bins, "max_frames": self.max_frames, "mean": self.mean, "std": self.std}
        return super().settings() | own | {"do_normalize": self.do_normalize}

    def forward(self, audio: Tensor) -> Tensor:
        """Waveform ``[B, S]`` / ``[B, C, S]`` to normalised fbank ``[B, max_frames, num_mel_bins]``."""
        with torch.autocast(device_type=audio.device.type, enabled=False):
            wave = self._mono(audio)
            samples = wave.shape[-1]
            self._refuse_longer(
                samples,
                (self.max_frames - 1) * self.hop_length + self.window_size,
                f"max_length={self.max_frames} frames",
            )
            if samples < self.window_size:
                raise ValueError(f"a clip of {samples} samples is shorter than one 25 ms fbank frame")
            frames = wave.unfold(-1, self.window_size, self.hop_length)  # snip_edges: whole frames only
            frames = frames - frames.mean(dim=-1, keepdim=True)  # remove_dc_offset
            previous = torch.cat([frames[..., :1], frames[..., :-1]], dim=-1)  # replicate-padded x[n-1]
            frames = (frames - 0.97 * previous) * self.window
            spectrum = torch.fft.rfft(frames, n=self.padded)
            power = spectrum.real.square() + spectrum.imag.square()
            fbank = (power @ self.banks).clamp_min(torch.finfo(torch.float32).eps).log()
            fbank = F.pad(fbank, (0, 0, 0, self.max_frames - fbank.shape[1]))
            return (fbank - self.mean) / (2 * self.std) if self.do_normalize else fbank


class WaveformNorm(HFFrontend):
    """wav2vec2 / HuBERT / WavLM input: the raw mono waveform, zero-mean unit-variance per clip when ``do_normalize``
    (``(x - mean) / sqrt(var + 1e-7)``, as `Wav2Vec2FeatureExtractor`).

    Example:
        >>> out = WaveformNorm(16000)(torch.randn(2, 1, 800) * 3 + 1)
        >>> out.shape, bool(out.mean(dim=1).abs().max() < 1e-5)
        (torch.Size([2, 800]), True)
    """

    def __init__(self, sample_rate: int = 16000, do_normalize: bool = True) -> None:
        super().__init__(sample_rate, 1)
        self.do_normalize = bool(do_normalize)

    def settings(self) -> dict[str, Any]:
        """See `HFFrontend.settings`."""
        return super().settings() | {"do_normalize": self.do_normalize}

    def forward(self, audio: Tensor) -> Tensor:
        """Waveform ``[B, S]`` / ``[B, C, S]`` to ``[B, S]``."""
        with torch.autocast(device_type=audio.device.type, enabled=False):
            wave = self._mono(audio)
            if not self.do_normalize:
                return wave
            mean = wave.mean(dim=-1, keepdim=True)
            var = (wave - mean).square().mean(dim=-1, keepdim=True)  # population variance, as numpy's var()
            return (wave - mean) / torch.sqrt(var + 1e-7)


def _slaney(n_fft: int, n_mels: int, sample_rate: int, f_min: float, f_max: float) -> Tensor:
    return torchaudio.functional.melscale_fbanks(
        n_fft // 2 + 1, f_min, f_max, n_mels, sample_rate, norm="slaney", mel_scale="slaney"
    )


class WhisperLogMel(HFFrontend):
    """Whisper's features: the waveform zero-padded to ``chunk_length`` seconds (Whisper's encoder takes that length
    only), a centred reflect-padded STFT (Hann 400 / hop 160 at 16 kHz), the last frame dropped, a Slaney mel
    (0-8 kHz), ``log10(max(x, 1e-10))`` clamped to its clip maximum - 8, then ``(x + 4) / 4``.

    Returns ``[B, n_mels, chunk_samples // hop]``, the layout of ``WhisperEncoder``'s ``input_features``.

    Example:
        >>> mel = WhisperLogMel(16000, n_mels=80, chunk_length=2)
        >>> mel(torch.randn(3, 8000)).shape
        torch.Size([3, 80, 200])
    """

    kind = "whisper_log_mel"

    def __init__(
        self,
        sample_rate: int = 16000,
        n_mels: int = 80,
        n_fft: int = 400,
        hop_length: int = 160,
        chunk_length: int = 30,
    ) -> None:
        super().__init__(sample_rate, hop_length)
        self.n_mels, self.n_fft, self.chunk_length = int(n_mels), int(n_fft), int(chunk_length)
        self.chunk_samples = self.chunk_length * self.sample_rate
        self.register_buffer("mel", _slaney(self.n_fft, self.n_mels, self.sample_rate, 0.0, 8000.0), persistent=False)
        self.register_buffer("window", torch.hann_window(self.n_fft), persistent=False)

    def settings(self) -> dict[str, Any]:
        """See `HFFrontend.settings`."""
        own = {"n_mels": self.n_mels, "n_fft": self.n_fft, "hop_length": self.hop_length}
        return super().settings() | own | {"chunk_length": self.chunk_length}

    def forward(self, audio: Tensor) -> Tensor:
        """Waveform ``[B, S]`` / ``[B, C, S]`` to ``[B, n_mels, frames]``."""
        with torch.autocast(device_type=audio.device.type, enabled=False):
            wave = self._mono(audio)
            self._refuse_longer(wave.shape[-1], self.chunk_samples, f"chunk_length={self.chunk_length} s")
            wave = F.pad(wave, (0, self.chunk_samples - wave.shape[-1]))
            spec = torch.stft(wave, self.n_fft, self.hop_length, window=self.window, return_complex=True)
            power = spec[..., :-1].abs().square()
            log_spec = (power.transpose(1, 2) @ self.mel).clamp_min(1e-10).log10().transpose(1, 2)
            peak = log_spec.amax(dim=(1, 2), keepdim=True)
            return (torch.maximum(log_spec, peak - 8.0) + 4.0) / 4.0


class ClapMel(HFFrontend):
    """CLAP's features for an unfused checkpoint: the clip repeated to fill ``max_length_s`` and zero-padded
    (``repeatpad``), a centred reflect-padded STFT (periodic Hann), a mel (Slaney for ``rand_trunc``, HTK without
    norm for ``fusion``), ``10 log10(max(x, 1e-10))`` dB. ``fusion`` stacks four identical copies for a clip no
    longer than ``max_length_s``; an unfused tower reads the first, so one is returned.

    Returns ``[B, 1, frames, n_mels]``, the layout of ``ClapAudioModel``'s ``input_features``.

    Example:
        >>> mel = ClapMel(48000, n_mels=16, max_length_s=1)
        >>> mel(torch.randn(2, 24000)).shape
        torch.Size([2, 1, 101, 16])
    """

    kind = "clap_mel"

    def __init__(
        self,
        sample_rate: int = 48000,
        n_mels: int = 64,
        n_fft: int = 1024,
        hop_length: int = 480,
        max_length_s: int = 10,
        f_min: float = 0.0,
        f_max: float = 14000.0,
        truncation: str = "rand_trunc",
    ) -> None:
        super().__init__(sample_rate, hop_length)
        self.n_mels, self.n_fft, self.max_length_s = int(n_mels), int(n_fft), int(max_length_s)
        self.f_min, self.f_max, self.truncation = float(f_min), float(f_max), str(truncation)
        self.max_samples = self.max_length_s * self.sample_rate
        if self.truncation == "fusion":  # the extractor's HTK filters without norm for its fusion input
            banks = torchaudio.functional.melscale_fbanks(
                n_fft // 2 + 1, self.f_min, self.f_max, self.n_mels, self.sample_rate, norm=None, mel_scale="htk"
            )
        else:
            banks = _slaney(self.n_fft, self.n_mels, self.sample_rate, self.f_min, self.f_max)
        self.register_buffer("mel", banks, persistent=False)
        self.register_buffer("window", torch.hann_window(self.n_fft), persistent=False)

    def settings(self) -> dict[str, Any]:
        """See `HFFrontend.settings`."""
        own = {"n_mels": self.n_mels, "n_fft": self.n_fft, "hop_length": self.hop_length, "f_max": self.f_max}
        return super().settings() | own | {"max_length_s": self.max_length_s, "truncation": self.truncation}

    def forward(self, audio: Tensor) -> Tensor:
        """Waveform ``[B, S]`` / ``[B, C, S]`` to ``[B, 1, frames, n_mels]``."""
        with torch.autocast(device_type=audio.device.type, enabled=False):
            wave = self._mono(audio)
            samples = wave.shape[-1]
            self._refuse_longer(samples, self.max_samples, f"max_length_s={self.max_length_s}")
            wave = wave.repeat(1, self.max_samples // samples)  # repeatpad: whole repeats, then zeros
            wave = F.pad(wave, (0, self.max_samples - wave.shape[-1]))
            spec = torch.stft(wave, self.n_fft, self.hop_length, window=self.window, return_complex=True)
            power = spec.abs().square().transpose(1, 2)  # [B, frames, bins]
            return (10.0 * (power @ self.mel).clamp_min(1e-10).log10()).unsqueeze(1)


def frontend_for(model_type: str, extractor: Mapping[str, Any], max_frames: int | None = None) -> HFFrontend:
    """The front-end of a checkpoint of `model_type` from its feature-extractor settings (the class defaults where a
    key is absent, as ``from_pretrained`` fills them).

    Example:
        >>> frontend_for("wav2vec2", {"sampling_rate": 16000, "do_normalize": False}).settings()
        {'feature': 'waveform', 'sample_rate': 16000, 'do_normalize': False}
    """
    get = extractor.get
    if model_type == "audio-spectrogram-transformer":
        return KaldiFbank(
            get("sampling_rate", 16000),
            get("num_mel_bins", 128),
            max_frames or get("max_length", 1024),
            get("mean", -4.2677393),
            get("std", 4.5689974),
            get("do_normalize", True),
        )
    if model_type == "whisper":
        sizes = (get("n_fft", 400), get("hop_length", 160), get("chunk_length", 30))
        return WhisperLogMel(get("sampling_rate", 16000), get("feature_size", 80), *sizes)
    if model_type in ("clap", "clap_audio_model"):
        return ClapMel(
            get("sampling_rate", 48000),
            get("feature_size", 64),
            get("fft_window_size", 1024),
            get("hop_length", 480),
            get("max_length_s", 10),
            get("frequency_min", 0.0),
            get("frequency_max", 14000.0),
            get("truncation", "fusion"),
        )
    return WaveformNorm(get("sampling_rate", 16000), get("do_normalize", True))
