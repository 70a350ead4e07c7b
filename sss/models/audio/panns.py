"""PANNs CNN14 / CNN10 / CNN6 (Kong et al. 2020) as sss audio encoders, with PANNs' own front-end and names.

``model.audio_encoder: cnn14 | cnn10 | cnn6`` builds `PannsEncoder`: the PANNs conv stack under its PANNs
parameter names (``bn0.*``, ``conv_block1.conv1.weight``, ..., ``fc1.*``), so a checkpoint that
``sss convert panns IN.pth OUT.safetensors`` converted loads name for name with
``model.audio_pretrained: OUT.safetensors``. The front-end (`PannsFrontend`) is PANNs' log-mel, bound to the
weights: 32 kHz, 1024-point Hann STFT, hop 320, 64 Slaney mels over 50-14,000 Hz, power to dB (ref 1, amin
1e-10, no top_db), then the affine ``bn0`` over the mel bins.

The sample rate is not resampled on the device: 16 kHz audio brought up to 32 kHz would leave every mel band
above 8 kHz empty, which the weights never saw, so ``model.sample_rate != 32000`` is an error naming both keys
(``data.sample_rate`` resamples the files on load instead).
"""

from __future__ import annotations

import logging
import math
import os
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F
import torchaudio
from torch import Tensor, nn
from torch.utils.checkpoint import checkpoint

from sss.config.errors import ConfigError
from sss.models.base import TokenEncoder
from sss.models.loading import LoadReport
from sss.models.registry import EncoderSettings, register_encoder

__all__ = [
    "ARCHITECTURES",
    "PANNS_FRONTEND",
    "PannsConvBlock",
    "PannsEncoder",
    "PannsFrontend",
    "cnn6_encoder",
    "cnn10_encoder",
    "cnn14_encoder",
    "load_panns",
    "panns_filterbank",
    "panns_setting_problems",
]

_LOG = logging.getLogger(__name__)

PANNS_FRONTEND: dict[str, Any] = {
    "sample_rate": 32000,
    "n_fft": 1024,
    "hop_length": 320,
    "n_mels": 64,
    "f_min": 50.0,
    "f_max": 14000.0,
}
"""PANNs' log-mel settings (its 32 kHz checkpoints: Cnn14_mAP=0.431.pth, Cnn10, Cnn6), bound to the weights."""

ARCHITECTURES: dict[str, tuple[int, tuple[int, ...]]] = {
    "cnn14": (3, (64, 128, 256, 512, 1024, 2048)),
    "cnn10": (3, (64, 128, 256, 512)),
    "cnn6": (5, (64, 128, 256, 512)),
}
"""Architecture -> (kernel size of its conv blocks, channels of each block), as in PANNs' models.py."""

DROPPED = ("fc_audioset.",)
"""Prefixes of checkpoint tensors an encoder does not use: PANNs' AudioSet classifier (527 classes)."""


def panns_filterbank() -> Tensor:
    """PANNs' mel filterbank ``[n_fft // 2 + 1, n_mels]`` = ``[513, 64]`` (librosa's Slaney mel, as PANNs' ``melW``).

    Example:
        >>> fb = panns_filterbank()
        >>> tuple(fb.shape), bool(fb[0].sum() == 0)  # the DC bin is below 50 Hz
        ((513, 64), True)
    """
    s = PANNS_FRONTEND
    with torch.device("cpu"):  # a constant, also when the model is built on the meta device
        return torchaudio.functional.melscale_fbanks(
            s["n_fft"] // 2 + 1,
            s["f_min"],
            s["f_max"],
            s["n_mels"],
            s["sample_rate"],
            norm="slaney",
            mel_scale="slaney",
        )


class PannsFrontend(nn.Module):
    """Waveform ``[B, S]`` / ``[B, C, S]`` (32 kHz) to PANNs' log-mel ``[B, 1, T, 64]`` (time, then mel: PANNs' layout).

    Centred frames with reflect padding (``T = S // 320 + 1``), periodic Hann window, power spectrum, Slaney mel
    filterbank (`panns_filterbank`), then ``10 log10(max(x, 1e-10))``. Computed in float32 even under autocast.
    Its window and filterbank are constants, not weights: kept out of the state dict. Multi-channel audio is
    averaged to mono. A 4-D input (a cached sss log-mel, ``data.cache=features``) is refused: it was computed
    with other settings than the ones the weights were trained on.

    Example:
        >>> import torch
        >>> PannsFrontend()(torch.randn(2, 32000)).shape  # 1 s: 101 frames of 64 mels
        torch.Size([2, 1, 101, 64])
    """

    def __init__(self) -> None:
        super().__init__()
        self.sample_rate: int = PANNS_FRONTEND["sample_rate"]
        self.hop_length: int = PANNS_FRONTEND["hop_length"]
        self.n_fft: int = PANNS_FRONTEND["n_fft"]
        self.n_mels: int = PANNS_FRONTEND["n_mels"]
        self.register_buffer("window", torch.hann_window(self.n_fft, device="cpu"), persistent=False)
        self.register_buffer("melW", panns_filterbank(), persistent=False)

    def forward(self, audio: Tensor) -> Tensor:
        """The log-mel in dB, ``[B, 1, T, n_mels]``, float32.

        Example:
            >>> import torch
            >>> PannsFrontend()(torch.zeros(1, 2, 3200)).shape  # stereo is averaged; silence is -100 dB
            torch.Size([1, 1, 11, 64])
        """
        if audio.ndim == 4:
            raise ValueError(
                "data.cache=features stores sss's own log-mel, but model.audio_encoder=cnn14/cnn10/cnn6 computes "
                "PANNs' log-mel on the device: remove data.cache"
            )
        if audio.ndim == 3:
            audio = audio.mean(dim=1)
        elif audio.ndim != 2:
            raise ValueError(f"expected a waveform [B, S] or [B, C, S], got shape {tuple(audio.shape)}")
        with torch.autocast(device_type=audio.device.type, enabled=False):
            spec = torch.stft(
                audio.float(),
                self.n_fft,
                self.hop_length,
                window=self.window,
                center=True,
                pad_mode="reflect",
                return_complex=True,
            )
            power = spec.real.square() + spec.imag.square()  # [B, F, T]
            mel = power.transpose(1, 2) @ self.melW  # [B, T, n_mels]
            return (10.0 * torch.log10(mel.clamp(min=1e-10))).unsqueeze(1)


class PannsConvBlock(nn.Module):
    """PANNs' ``ConvBlock`` (kernel 3: (conv - BN - ReLU) x 2) or ``ConvBlock5x5`` (kernel 5: once), then avg-pool.

    Args:
        in_channels: Input channels.
        out_channels: Output channels.
        kernel_size: 3 (Cnn14, Cnn10) or 5 (Cnn6).
        pool: Average-pool size (2 halves time and mel, floor as PANNs; 1 keeps them: Cnn14's last block).

    Example:
        >>> import torch
        >>> PannsConvBlock(1, 4, kernel_size=5)(torch.randn(2, 1, 11, 64)).shape
        torch.Size([2, 4, 5, 32])
    """

    def __init__(self, in_channels: int, out_channels: int, kernel_size: int = 3, pool: int = 2) -> None:
        super().__init__()
        pad = kernel_size // 2
        self.conv1 = nn.Conv2d(in_channels, out_channels, kernel_size, padding=pad, bias=False)
        self.bn1 = nn.BatchNorm2d(out_channels)
        if kernel_size == 3:  # ConvBlock5x5 has one conv, ConvBlock two
            self.conv2 = nn.Conv2d(out_channels, out_channels, kernel_size, padding=pad, bias=False)
            self.bn2 = nn.BatchNorm2d(out_channels)
        self.pool = pool
        for conv in (m for m in self.children() if isinstance(m, nn.Conv2d)):
            nn.init.xavier_uniform_(conv.weight)  # PANNs' init_layer

    def forward(self, x: Tensor) -> Tensor:
        """``[B, C_in, T, M]`` to ``[B, C_out, T // pool, M // pool]``."""
        x = F.relu(self.bn1(self.conv1(x)))
        if hasattr(self, "conv2"):
            x = F.relu(self.bn2(self.conv2(x)))
        return F.avg_pool2d(x, self.pool) if self.pool > 1 else x


class PannsEncoder(TokenEncoder):
    """PANNs CNN14 / CNN10 / CNN6 as a `TokenEncoder`: one token per time step left after the conv stack.

    `PannsFrontend`, ``bn0`` over the 64 mel bins (affine, as PANNs), SpecAugment stripes in training, the conv
    blocks (dropout 0.2 after each in training, as PANNs), the mean over the mel axis, then PANNs' ``fc1`` (with
    its ReLU) on each time step and a new projection ``proj`` to `dim`. Cnn14 pools 5 times, Cnn10 and Cnn6 4
    times: a 1 s clip (101 frames) gives 3 or 6 tokens.

    Args:
        arch: ``"cnn14"``, ``"cnn10"`` or ``"cnn6"``.
        dim: Token width after the projection.
        widths: Channels of each block, default PANNs' (a narrower stack keeps the names: for tests and tiny runs).
        block_dropout: Dropout after each conv block in training (PANNs: 0.2).
        freq_mask: Widest frequency stripe in mel bins (2 stripes per example in training; 0 disables).
        time_mask: Widest time stripe in frames (2 per example; 0 disables).

    Example:
        >>> import torch
        >>> enc = PannsEncoder("cnn6", dim=8, widths=[4, 4, 8, 8])
        >>> enc(torch.randn(2, 32000)).shape  # 101 frames -> 101 // 16 = 6 tokens
        torch.Size([2, 6, 8])
    """

    def __init__(
        self,
        arch: str = "cnn14",
        dim: int = 128,
        *,
        widths: Sequence[int] | None = None,
        block_dropout: float = 0.2,
        freq_mask: int = 8,
        time_mask: int = 64,
    ) -> None:
        super().__init__(output_dim=dim)
        kernel, default = ARCHITECTURES[arch]
        widths = tuple(int(w) for w in (default if widths is None else widths))
        if len(widths) != len(default) or min(widths) < 1:
            raise ConfigError(
                f"model.audio_kwargs.widths={list(widths)}: {arch} has {len(default)} conv blocks, so give "
                f"{len(default)} positive channel counts (PANNs: {list(default)})"
            )
        self.arch, self.widths, self.block_dropout = arch, widths, block_dropout
        self.frontend = PannsFrontend()
        self.bn0 = nn.BatchNorm2d(PANNS_FRONTEND["n_mels"])
        pools = [1 if arch == "cnn14" and i == 5 else 2 for i in range(len(widths))]  # Cnn14's block 6 keeps its size
        self.pools = math.prod(pools)
        for i, (c_in, c_out) in enumerate(zip((1, *widths[:-1]), widths, strict=True)):
            self.add_module(f"conv_block{i + 1}", PannsConvBlock(c_in, c_out, kernel, pools[i]))
        self.fc1 = nn.Linear(widths[-1], widths[-1])
        self.proj = nn.Linear(widths[-1], dim)  # sss's own: trained from scratch, never in a PANNs file
        self.masks = _masks(freq_mask, time_mask)
        self.load_report: LoadReport | None = None

    @property
    def blocks(self) -> list[PannsConvBlock]:
        """The conv blocks in order (``conv_block1``, ...)."""
        return [getattr(self, f"conv_block{i + 1}") for i in range(len(self.widths))]

    def encode(self, x: Tensor) -> Tensor:
        """Waveform ``[B, S]`` / ``[B, C, S]`` at 32 kHz to tokens ``[B, N, dim]``, ``N = frames // 32`` (Cnn14).

        Example:
            >>> import torch
            >>> PannsEncoder("cnn14", dim=4, widths=[2, 2, 2, 2, 2, 2]).encode(torch.randn(1, 32000)).shape
            torch.Size([1, 3, 4])
        """
        x = self.frontend(x)
        if x.shape[2] < self.pools:
            seconds = self.pools * self.frontend.hop_length / self.frontend.sample_rate
            raise ValueError(
                f"model.audio_encoder={self.arch} needs clips of at least {self.pools} frames ({seconds:.2f} s at "
                f"32 kHz), got {x.shape[2]}: make data.clip_seconds longer"
            )
        x = self.bn0(x.transpose(1, 3)).transpose(1, 3)  # PANNs' bn0: mel bins on the channel axis
        if self.training:
            x = self._augment(x)
        for block in self.blocks:
            use_checkpoint = self.grad_checkpointing and torch.is_grad_enabled()
            x = checkpoint(block, x, use_reentrant=False) if use_checkpoint else block(x)
            x = F.dropout(x, self.block_dropout, self.training)
        x = x.mean(dim=3).transpose(1, 2)  # [B, C, T, M] -> [B, T, C]
        return self.proj(F.relu(self.fc1(x)))

    def _augment(self, x: Tensor) -> Tensor:
        # torchaudio's masks take (..., freq, time): PANNs' [B, 1, T, M] is turned round and back.
        x = x.transpose(2, 3)
        for mask in self.masks:
            x = mask(x)
        return x.transpose(2, 3)

    def preprocessing(self) -> dict[str, Any]:
        """The front-end bound to the weights and, when loaded, the source weights (file name and sha256).

        Example:
            >>> PannsEncoder("cnn6", dim=4, widths=[1, 1, 1, 1]).preprocessing()["audio_frontend"]["sample_rate"]
            32000
        """
        found: dict[str, Any] = {"audio_frontend": {"kind": "panns", **PANNS_FRONTEND}}
        if self.load_report is not None:
            found["audio_weights"] = {"kind": "panns", "arch": self.arch, **self.load_report.source}
        return found


def _masks(freq_mask: int, time_mask: int) -> list[nn.Module]:
    # PANNs' SpecAugmentation: 2 frequency and 2 time stripes per example, set to 0 (the mean after bn0).
    masks: list[nn.Module] = []
    for _ in range(2):
        if freq_mask:
            masks.append(torchaudio.transforms.FrequencyMasking(freq_mask, iid_masks=True))
        if time_mask:
            masks.append(torchaudio.transforms.TimeMasking(time_mask, iid_masks=True))
    return masks


def load_panns(encoder: PannsEncoder, path: str | os.PathLike[str], strict: bool = True) -> LoadReport:
    """Load a ``sss convert panns`` file into `encoder`; return the load report (also ``encoder.load_report``).

    Every PANNs tensor of the encoder (``bn0``, ``conv_block*``, ``fc1``) must be in the file with its shape:
    otherwise the load is refused unless `strict` is False (then the rest trains from scratch). The file's
    ``fc_audioset.*`` (PANNs' AudioSet classifier) is left out as unused; ``proj`` is new.

    Raises:
        ConfigError: Not a converted file, another architecture or widths, or (strict) a partial load.

    Example:
        >>> import tempfile
        >>> from safetensors.torch import save_file
        >>> src = PannsEncoder("cnn6", dim=4, widths=[1, 1, 1, 1])
        >>> path = tempfile.mkdtemp() + "/w.safetensors"
        >>> state = {k: v for k, v in src.state_dict().items() if not k.startswith("proj.")}
        >>> save_file(state, path, metadata={"sss_source": "panns", "arch": "cnn6"})
        >>> report = load_panns(PannsEncoder("cnn6", dim=4, widths=[1, 1, 1, 1]), path)
        >>> len(report.loaded), report.missing, report.new
        (31, [], ['proj.weight', 'proj.bias'])
    """
    state, meta = _read_converted(Path(path), encoder.arch)
    own = {k: v for k, v in encoder.state_dict().items() if not k.startswith("proj.")}
    fits = {k: v for k, v in state.items() if k in own and tuple(v.shape) == tuple(own[k].shape)}
    unused = sorted(k for k in state if k.startswith(DROPPED))
    report = LoadReport(
        f"audio {encoder.arch}",
        {"file": Path(path).name, "sha256": meta.get("source_sha256", "")},
        loaded=list(fits),
        missing=[k for k in own if k not in fits and not k.endswith("num_batches_tracked")],
        unexpected=sorted(k for k in state if k not in own and k not in unused),
        mismatched=sorted(k for k in state if k in own and k not in fits),
        unused=unused,
        new=[k for k in encoder.state_dict() if k.startswith("proj.")],
    )
    if strict and (report.missing or report.unexpected):
        raise ConfigError(_partial_message(path, encoder.arch, report, len(own)))
    encoder.load_state_dict(fits, strict=False)
    encoder.load_report = report
    _LOG.info("%s", report.summary())
    return report


def _partial_message(path: Any, arch: str, report: LoadReport, total: int) -> str:
    missing, unexpected, shape = report.missing, report.unexpected, report.mismatched
    parts = [f"{len(report.loaded)} of {total} tensors loaded", f"{len(missing)} missing{_eg(missing)}"]
    parts += [f"{len(shape)} of another shape{_eg(shape)} (model.audio_kwargs.widths?)"] if shape else []
    parts += [f"{len(unexpected)} unexpected{_eg(unexpected)}"]
    return (
        f"model.audio_pretrained={path} fits model.audio_encoder={arch} only in part: {', '.join(parts)}: "
        "another architecture? model.audio_strict=false trains the missing ones from scratch"
    )


def _eg(names: Sequence[str]) -> str:
    return f" (e.g. {', '.join(names[:3])})" if names else ""


def _read_converted(path: Path, arch: str) -> tuple[dict[str, Tensor], dict[str, str]]:
    # The file `sss convert panns` wrote: safetensors (never a pickle), marked as PANNs, of this architecture.
    from safetensors import SafetensorError, safe_open
    from safetensors.torch import load_file

    key = "model.audio_pretrained"
    if path.suffix in (".pth", ".pt", ".ckpt", ".bin"):
        raise ConfigError(
            f"{key}={path} is a pickle, which sss never loads as weights: convert it first with "
            f"sss convert panns {path} {path.with_suffix('.safetensors')}"
        )
    if not path.is_file():
        raise ConfigError(f"{key}={path}: no such file (a .safetensors file made by sss convert panns IN.pth OUT)")
    try:
        with safe_open(str(path), framework="pt") as f:
            meta = dict(f.metadata() or {})
        state = load_file(str(path))
    except (SafetensorError, OSError) as exc:
        raise ConfigError(f"{key}={path} is not a safetensors file ({exc}): make it with sss convert panns") from exc
    found = meta.get("arch")
    if meta.get("sss_source") == "panns" and found and found != arch:
        raise ConfigError(
            f"{key}={path} holds PANNs {found} weights but model.audio_encoder={arch}: set model.audio_encoder={found}"
        )
    return state, meta


def panns_setting_problems(settings: Mapping[str, Any]) -> list[tuple[str, str]]:
    """What ``sss check`` refuses for ``model.audio_encoder=cnn14|cnn10|cnn6``, building nothing.

    The front-end is bound to the weights: 32 kHz and 64 mel bins; ``audio_pretrained`` must be a file.

    Example:
        >>> panns_setting_problems({"audio_encoder": "cnn14", "sample_rate": 16000, "n_mels": 64})[0][1][:74]
        'model.sample_rate=16000 but model.audio_encoder=cnn14 takes 32000 Hz audio'
        >>> panns_setting_problems({"audio_encoder": "cnn", "sample_rate": 16000})
        []
    """
    arch = settings.get("audio_encoder")
    if arch not in ARCHITECTURES or "audio" not in settings.get("modalities", ("image", "audio")):
        return []
    problems = []
    rate, n_mels, want = settings.get("sample_rate", 16000), settings.get("n_mels", 64), PANNS_FRONTEND
    if rate != want["sample_rate"]:
        problems.append(("sample_rate", _rate_message(arch, rate)))
    if n_mels != want["n_mels"]:
        problems.append(
            (
                "n_mels",
                f"model.n_mels={n_mels} but model.audio_encoder={arch} takes PANNs' {want['n_mels']} mel bins "
                f"(its bn0 and filterbank are bound to the weights): set model.n_mels={want['n_mels']}",
            )
        )
    pretrained = settings.get("audio_pretrained")
    if pretrained is not None and not isinstance(pretrained, str | os.PathLike):
        problems.append(("audio_pretrained", _pretrained_message(arch, pretrained)))
    return problems


def _rate_message(arch: str, rate: Any) -> str:
    want = PANNS_FRONTEND["sample_rate"]
    return (
        f"model.sample_rate={rate} but model.audio_encoder={arch} takes {want} Hz audio (PANNs' front-end is "
        f"bound to the weights): set model.sample_rate={want} data.sample_rate={want} (files are resampled on load)"
    )


def _pretrained_message(arch: str, value: Any) -> str:
    return (
        f"model.audio_pretrained={value!r}: model.audio_encoder={arch} takes a .safetensors file made by "
        "sss convert panns IN.pth OUT.safetensors (nothing is downloaded)"
    )


def _build(arch: str, settings: EncoderSettings) -> PannsEncoder:
    # The same rules `sss check` applies, raised here too for a model built without the check.
    problems = panns_setting_problems(
        {"audio_encoder": arch, "sample_rate": settings.sample_rate, "n_mels": settings.n_mels}
    )
    if problems:
        raise ConfigError(problems[0][1])
    pretrained = settings.pretrained
    if pretrained is not None and pretrained is not False and not isinstance(pretrained, str | os.PathLike):
        raise ConfigError(_pretrained_message(arch, pretrained))
    # model.freq_mask / model.time_mask reach the model's own front-end; PANNs' stripes take the same widths.
    masks = {name: _mask_width(settings.frontend, attr) for name, attr in _MASKS.items()}
    kwargs = {**{k: v for k, v in masks.items() if v is not None}, **settings.kwargs}
    encoder = PannsEncoder(arch, settings.dim, **kwargs)
    if pretrained:
        load_panns(encoder, pretrained, strict=settings.strict)
    return encoder


_MASKS = {"freq_mask": "freq_masking", "time_mask": "time_masking"}


def _mask_width(frontend: Any, attr: str) -> int | None:
    if frontend is None or not hasattr(frontend, attr):
        return None  # no model front-end to read: PannsEncoder's PANNs defaults
    mask = getattr(frontend, attr)
    return 0 if mask is None else int(mask.mask_param)


@register_encoder("audio", "cnn14")
def cnn14_encoder(settings: EncoderSettings) -> PannsEncoder:
    """``model.audio_encoder=cnn14``: PANNs' Cnn14 (6 blocks, 64 to 2048 channels; ~80M parameters).

    Example:
        >>> cnn14_encoder(EncoderSettings(dim=8, sample_rate=32000, kwargs={"widths": [1] * 6})).arch
        'cnn14'
    """
    return _build("cnn14", settings)


@register_encoder("audio", "cnn10")
def cnn10_encoder(settings: EncoderSettings) -> PannsEncoder:
    """``model.audio_encoder=cnn10``: PANNs' Cnn10 (4 blocks of two 3x3 convs, 64 to 512 channels).

    Example:
        >>> cnn10_encoder(EncoderSettings(dim=8, sample_rate=32000, kwargs={"widths": [1] * 4})).arch
        'cnn10'
    """
    return _build("cnn10", settings)


@register_encoder("audio", "cnn6")
def cnn6_encoder(settings: EncoderSettings) -> PannsEncoder:
    """``model.audio_encoder=cnn6``: PANNs' Cnn6 (4 blocks of one 5x5 conv, 64 to 512 channels).

    Example:
        >>> cnn6_encoder(EncoderSettings(dim=8, sample_rate=32000, kwargs={"widths": [1] * 4})).arch
        'cnn6'
    """
    return _build("cnn6", settings)
