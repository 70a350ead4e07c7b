"""`HunterModule`: the Shadow & Sound Hunter family (timm image encoder, audio CNN, fusion head)."""

from __future__ import annotations

import difflib
import inspect
import os
from typing import Any

import torch.nn.functional as F
from torch import Tensor, nn

from sss.models.audio.cnn import AudioCNN
from sss.models.audio.frontend import LogMelFrontend
from sss.models.fusion.cross_attention import CrossModalFusion
from sss.models.fusion.late import LateFusion
from sss.models.image.timm_encoder import TimmImageEncoder
from sss.models.registry import register_model
from sss.trainer.module import LitModule

__all__ = ["FUSIONS", "HunterModule", "hunter_base", "hunter_small", "hunter_tiny"]

FUSIONS = ("cross_attention", "late")
"""Names accepted by ``HunterModule(fusion=...)``."""


class HunterModule(LitModule):
    """Image + audio classifier: `TimmImageEncoder`, `AudioCNN` over `LogMelFrontend`, a fusion head.

    ``forward(batch)`` (from `LitModule`) encodes ``batch["image"]`` and ``batch["audio"]`` to tokens
    of width ``dim`` and fuses them into logits ``[B, num_classes]``; either modality may be absent.
    The loss is cross entropy on ``batch["label"]``. Build it by name with ``create_model("hunter_small")``.

    Args:
        num_classes: Number of classes (logits).
        image_encoder: timm model name of the image backbone.
        image_pretrained: False, True (download timm's weights) or a local ``.safetensors`` path.
        image_channels_last: Run the image backbone in channels-last memory format (faster on CPU).
        image_kwargs: Extra ``timm.create_model`` arguments, e.g. ``{"channels": [16, 32, 64, 128]}``.
        dim: Token width shared by both encoders and the fusion head.
        audio_width: Channels of the first audio conv block (doubled per block).
        audio_depth: Number of audio conv blocks (each halves time and frequency).
        audio_stem_stride: Stride of the first audio convolution (2 = cheaper, coarser).
        n_mels: Mel bins of the audio front-end.
        sample_rate: Sample rate of ``batch["audio"]`` in Hz.
        freq_mask: Largest SpecAugment frequency mask in mel bins (training only; 0 disables).
        time_mask: Largest SpecAugment time mask in 10 ms frames (training only; 0 disables).
        fusion: ``"cross_attention"`` (`CrossModalFusion`) or ``"late"`` (`LateFusion`).
        fusion_depth: Bidirectional cross-attention layers (ignored by ``"late"``).
        heads: Attention heads of the fusion (must divide ``dim``).
        mlp_ratio: Hidden width of the fusion MLPs as a multiple of ``dim``.
        dropout: Dropout in the fusion head.
        label_smoothing: Label smoothing of the cross-entropy loss.

    Example:
        >>> import torch
        >>> model = HunterModule(num_classes=3, image_encoder="test_resnet", dim=16, audio_width=4, heads=2)
        >>> batch = {"image": torch.randn(2, 3, 32, 32), "audio": torch.randn(2, 1, 8000)}
        >>> batch["label"] = torch.tensor([0, 2])
        >>> model(batch).shape
        torch.Size([2, 3])
        >>> model.training_step(batch, 0).shape
        torch.Size([])
    """

    def __init__(
        self,
        num_classes: int = 4,
        image_encoder: str = "resnet10t",
        image_pretrained: bool | str | os.PathLike[str] = False,
        image_channels_last: bool = False,
        image_kwargs: dict[str, Any] | None = None,
        dim: int = 128,
        audio_width: int = 32,
        audio_depth: int = 3,
        audio_stem_stride: int = 1,
        n_mels: int = 64,
        sample_rate: int = 16000,
        freq_mask: int = 8,
        time_mask: int = 10,
        fusion: str = "cross_attention",
        fusion_depth: int = 1,
        heads: int = 4,
        mlp_ratio: float = 4.0,
        dropout: float = 0.0,
        label_smoothing: float = 0.0,
    ) -> None:
        super().__init__()
        if fusion not in FUSIONS:
            raise ValueError(f"unknown fusion {fusion!r}; choose one of {', '.join(FUSIONS)}")
        self.num_classes = num_classes
        self.label_smoothing = label_smoothing
        self.image_encoder = TimmImageEncoder(
            image_encoder,
            dim=dim,
            pretrained=image_pretrained,
            channels_last=image_channels_last,
            model_kwargs=dict(image_kwargs or {}),
        )
        # 10 ms hop and a 25 ms window at any sample rate; f_max stays below Nyquist.
        frontend = LogMelFrontend(
            sample_rate=sample_rate,
            n_fft=sample_rate // 40,
            hop_length=sample_rate // 100,
            n_mels=n_mels,
            f_max=min(8000.0, sample_rate / 2),
            freq_mask=freq_mask,
            time_mask=time_mask,
        )
        self.audio_encoder = AudioCNN(
            dim, width=audio_width, depth=audio_depth, stem_stride=audio_stem_stride, frontend=frontend
        )
        self.fusion_head: nn.Module = (
            CrossModalFusion(dim, fusion_depth, heads, num_classes, dropout, mlp_ratio)
            if fusion == "cross_attention"
            else LateFusion(dim, num_classes, dropout=dropout)
        )

    def compute_loss(self, outputs: Tensor, batch: dict[str, Any]) -> Tensor:
        """Mean cross entropy of the logits against ``batch["label"]`` (long ``[B]``).

        Args:
            outputs: Logits ``[B, num_classes]`` from `forward`.
            batch: The batch; must hold ``"label"``.

        Returns:
            The scalar loss.

        Example:
            >>> import torch
            >>> model = HunterModule(num_classes=2, image_encoder="test_resnet", dim=8, audio_width=4, heads=2)
            >>> float(model.compute_loss(torch.zeros(4, 2), {"label": torch.tensor([0, 1, 1, 0])}))  # ln 2
            0.6931...
        """
        if "label" not in batch:
            raise KeyError(
                f"{type(self).__name__}.compute_loss needs batch['label'] (long [B]); batch has {sorted(batch)}"
            )
        return F.cross_entropy(outputs, batch["label"], label_smoothing=self.label_smoothing)

    def set_grad_checkpointing(self, enabled: bool = True) -> None:
        """Turn activation checkpointing on or off in both encoders and the fusion head.

        Args:
            enabled: Turn checkpointing on (True) or off (False).

        Example:
            >>> model = HunterModule(image_encoder="test_resnet", dim=8, audio_width=4, heads=2)
            >>> model.set_grad_checkpointing()
            >>> model.audio_encoder.grad_checkpointing
            True
        """
        for part in (self.image_encoder, self.audio_encoder, self.fusion_head):
            if hasattr(part, "set_grad_checkpointing"):
                part.set_grad_checkpointing(enabled)


def _create(variant: str, defaults: dict[str, Any], overrides: dict[str, Any]) -> HunterModule:
    # Name a misspelt override here rather than let Python's message point into HunterModule.__init__.
    accepted = list(inspect.signature(HunterModule).parameters)
    unknown = [key for key in overrides if key not in accepted]
    if unknown:
        hints = [
            repr(key) + "".join(f" (did you mean {m!r}?)" for m in difflib.get_close_matches(key, accepted, 1))
            for key in unknown
        ]
        raise TypeError(
            f"{variant}() got unknown argument(s) {', '.join(hints)}; HunterModule takes {', '.join(accepted)}"
        )
    return HunterModule(**{**defaults, **overrides})


# --- variants: defaults only; every argument of HunterModule can be overridden -------------------------------


@register_model
def hunter_tiny(**overrides: Any) -> HunterModule:
    """Test scale: a resnet10t of 8-64 channels, 32-d tokens, a 2-block 4-wide audio CNN over 32 mels."""
    image = {"image_encoder": "resnet10t", "image_kwargs": {"channels": [8, 16, 32, 64], "stem_width": 8}}
    audio = {"audio_width": 4, "audio_depth": 2, "audio_stem_stride": 2, "n_mels": 32}
    defaults = {**image, **audio, "image_channels_last": True, "dim": 32, "heads": 2, "mlp_ratio": 2.0}
    return _create("hunter_tiny", defaults, overrides)


@register_model
def hunter_small(**overrides: Any) -> HunterModule:
    """CPU scale: a narrow resnet10t in channels-last, 64-d tokens, a 3-block 8-wide strided audio CNN."""
    image = {"image_encoder": "resnet10t", "image_kwargs": {"channels": [16, 32, 64, 128], "stem_width": 8}}
    defaults = {**image, "image_channels_last": True, "dim": 64, "audio_width": 8, "audio_stem_stride": 2}
    return _create("hunter_small", {**defaults, "mlp_ratio": 2.0}, overrides)


@register_model
def hunter_base(**overrides: Any) -> HunterModule:
    """GPU scale: resnet50 image side, 256-d tokens, a 4-block 64-wide audio CNN, two fusion layers."""
    defaults = {"image_encoder": "resnet50", "dim": 256, "audio_width": 64, "audio_depth": 4, "fusion_depth": 2}
    return _create("hunter_base", {**defaults, "heads": 8, "dropout": 0.1}, overrides)
