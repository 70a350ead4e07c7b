"""`LogMelFrontend`: waveform -> normalised log-mel spectrogram, with SpecAugment in training."""

from __future__ import annotations

import torch
import torchaudio
from torch import Tensor, nn

__all__ = ["LogMelFrontend"]


class LogMelFrontend(nn.Module):
    """Waveform ``[B, S]`` / ``[B, C, S]`` to a log-mel spectrogram ``[B, 1, n_mels, T]``.

    Power mel spectrogram (Hann window, centred frames, so ``T = S // hop_length + 1``), then
    decibels (``10 log10(max(x, 1e-10))``, PANNs' choice), then a BatchNorm over the mel bins
    (PANNs' ``bn0``, without the affine part: each bin's running mean and variance are tracked, so
    no dataset statistics need computing), then SpecAugment masks in training mode only.
    Multi-channel audio is averaged to mono first.

    A 4-D input ``[B, 1, n_mels, T]`` is taken as an already computed log-mel (e.g. from a feature
    cache): only the normalisation and masks are applied to it.

    Args:
        sample_rate: Sample rate of the input waveform in Hz.
        n_fft: FFT size and window length in samples (400 = 25 ms at 16 kHz).
        hop_length: Frame step in samples (160 = 10 ms at 16 kHz).
        n_mels: Number of mel bins.
        f_min: Lowest mel filter frequency in Hz.
        f_max: Highest mel filter frequency in Hz; None means ``sample_rate / 2``.
        freq_mask: Largest frequency mask, in mel bins (width drawn uniformly in ``[0, freq_mask)``); 0 disables.
        time_mask: Largest time mask, in frames; 0 disables. Keep it shorter than the events to
            detect, or a mask can erase the event and turn the label into noise.
        num_masks: How many frequency masks and how many time masks per example.

    Example:
        >>> import torch
        >>> frontend = LogMelFrontend()
        >>> frontend(torch.randn(2, 1, 16000)).shape
        torch.Size([2, 1, 64, 101])
        >>> _ = frontend.eval()
        >>> torch.equal(frontend(torch.ones(1, 16000)), frontend(torch.ones(1, 16000)))  # no masks in eval
        True
    """

    def __init__(
        self,
        sample_rate: int = 16000,
        n_fft: int = 400,
        hop_length: int = 160,
        n_mels: int = 64,
        f_min: float = 50.0,
        f_max: float | None = 8000.0,
        freq_mask: int = 8,
        time_mask: int = 10,
        num_masks: int = 1,
    ) -> None:
        super().__init__()
        if f_max is not None and f_max > sample_rate / 2:
            raise ValueError(
                f"f_max={f_max} is above the Nyquist frequency of sample_rate={sample_rate}; "
                "pass f_max=None for sample_rate / 2"
            )
        self.sample_rate = sample_rate
        self.hop_length = hop_length
        self.n_mels = n_mels
        self.num_masks = num_masks
        # Complex STFT + MelScale rather than MelSpectrogram: squaring real and imaginary parts is ~3x
        # faster on CPU than MelSpectrogram's abs().pow(2) (which takes a square root first).
        self.stft = torchaudio.transforms.Spectrogram(n_fft=n_fft, hop_length=hop_length, power=None)
        self.mel_scale = torchaudio.transforms.MelScale(n_mels, sample_rate, f_min, f_max, n_stft=n_fft // 2 + 1)
        self.to_db = torchaudio.transforms.AmplitudeToDB(stype="power", top_db=None)
        # No affine: the conv that follows can weight the bands itself, and without parameters here no
        # gradient has to flow back into the spectrogram (that backward was ~15% of AudioCNN's step on CPU).
        self.norm = nn.BatchNorm2d(n_mels, affine=False)
        # iid_masks: a different mask per example, not one shared by the whole batch.
        self.freq_masking = torchaudio.transforms.FrequencyMasking(freq_mask, iid_masks=True) if freq_mask else None
        self.time_masking = torchaudio.transforms.TimeMasking(time_mask, iid_masks=True) if time_mask else None

    def forward(self, audio: Tensor) -> Tensor:
        """Compute the normalised (and, in training, masked) log-mel.

        Args:
            audio: Waveform ``[B, S]`` or ``[B, C, S]``, or a log-mel ``[B, 1, n_mels, T]``.

        Returns:
            Log-mel ``[B, 1, n_mels, T]``, float32.

        Example:
            >>> import torch
            >>> LogMelFrontend(n_mels=32)(torch.randn(2, 2, 8000)).shape  # stereo is averaged to mono
            torch.Size([2, 1, 32, 51])
        """
        mel = self._log_mel(audio) if audio.ndim < 4 else audio.float()
        if mel.shape[-2] != self.n_mels:
            raise ValueError(f"expected {self.n_mels} mel bins, got a spectrogram of shape {tuple(mel.shape)}")
        # BatchNorm2d normalises dim 1, so move the mel axis there and back (PANNs' bn0).
        mel = self.norm(mel.transpose(1, 2)).transpose(1, 2)
        if self.training:
            # Masks after the normalisation: a masked cell is 0 = the bin's mean, not -100 dB.
            for _ in range(self.num_masks):
                mel = self.freq_masking(mel) if self.freq_masking is not None else mel
                mel = self.time_masking(mel) if self.time_masking is not None else mel
        return mel

    def _log_mel(self, audio: Tensor) -> Tensor:
        if audio.ndim == 3:
            audio = audio.mean(dim=1)  # downmix to mono
        elif audio.ndim != 2:
            raise ValueError(f"expected a waveform [B, S] or [B, C, S], got shape {tuple(audio.shape)}")
        # The STFT runs in float32 even under autocast: fp16 power spectra overflow/underflow, and
        # cuFFT in half precision only takes power-of-two sizes.
        with torch.autocast(device_type=audio.device.type, enabled=False):
            spec = self.stft(audio.float())
            # In place: the complex spectrogram is the largest tensor of a forward pass, and one fewer
            # buffer of its size cuts the front-end's transient memory by a fifth (same values bitwise).
            power = spec.real.square()
            power += spec.imag.square()
            del spec
            return self.to_db(self.mel_scale(power)).unsqueeze(1)
