"""How `HunterModule` builds its parts from its settings: the image and audio encoder settings, the fusion."""

from __future__ import annotations

import inspect
from typing import Any

from sss.models.audio.frontend import LogMelFrontend
from sss.models.base import TokenEncoder
from sss.models.fusion.base import FusionHead
from sss.models.registry import EncoderSettings, fusion_class

__all__ = ["audio_settings", "export_settings", "fusion", "image_settings", "preprocessing"]


def image_settings(settings: dict[str, Any]) -> EncoderSettings:
    """The image encoder's `EncoderSettings` from `HunterModule`'s arguments."""
    return EncoderSettings(
        settings["dim"],
        backbone=settings["image_encoder"],
        pretrained=settings["image_pretrained"],
        strict=settings["image_strict"],
        channels_last=settings["image_channels_last"],
        checkpointing=settings["image_checkpointing"],
        kwargs=dict(settings["image_kwargs"] or {}),
    )


def audio_settings(settings: dict[str, Any]) -> EncoderSettings:
    """The audio encoder's `EncoderSettings` (with its log-mel front-end) from `HunterModule`'s arguments."""
    # 10 ms hop and a 25 ms window at any sample rate; f_max stays below Nyquist.
    rate = settings["sample_rate"]
    frontend = LogMelFrontend(
        sample_rate=rate,
        n_fft=rate // 40,
        hop_length=rate // 100,
        n_mels=settings["n_mels"],
        f_max=min(8000.0, rate / 2),
        freq_mask=settings["freq_mask"],
        time_mask=settings["time_mask"],
    )
    return EncoderSettings(
        settings["dim"],
        width=settings["audio_width"],
        depth=settings["audio_depth"],
        heads=settings["heads"],
        mlp_ratio=settings["mlp_ratio"],
        dropout=settings["dropout"],
        stem_stride=settings["audio_stem_stride"],
        frontend=frontend,
        pretrained=settings["audio_pretrained"],
        strict=settings["audio_strict"],
        sample_rate=rate,
        n_mels=settings["n_mels"],
        kwargs=settings["audio_kwargs"] or {},
    )


def fusion(settings: dict[str, Any]) -> FusionHead:
    """The fusion head named by ``settings["fusion"]``, built with the shared constructor shape."""
    # The shared constructor shape; `num_bottlenecks` reaches the fusions whose constructor names it.
    cls = fusion_class(settings["fusion"])
    own = {"num_bottlenecks": settings["num_bottlenecks"]}
    own = {name: value for name, value in own.items() if name in inspect.signature(cls).parameters}
    shared = {name: settings[name] for name in ("heads", "mlp_ratio", "dropout")}
    return cls(
        settings["dim"],
        settings["num_classes"],
        depth=settings["fusion_depth"],
        **shared,
        **own,
        **(settings["fusion_kwargs"] or {}),
    )


def export_settings(kwargs: dict[str, Any], image_encoder: Any, audio_encoder: Any) -> dict[str, Any]:
    """Each encoder's `TokenEncoder.export_settings` merged into its ``image_kwargs``/``audio_kwargs`` (`kwargs`)."""
    found: dict[str, Any] = {}
    for key, encoder in (("image_kwargs", image_encoder), ("audio_kwargs", audio_encoder)):
        own = encoder.export_settings() if isinstance(encoder, TokenEncoder) else {}
        if own:
            found[key] = {**(kwargs.get(key) or {}), **own}
    return found


def preprocessing(*encoders: Any) -> dict[str, Any]:
    """Input preparation bound to the encoders' weights (`TokenEncoder.preprocessing` of each)."""
    found: dict[str, Any] = {}
    for encoder in encoders:
        found |= encoder.preprocessing() if isinstance(encoder, TokenEncoder) else {}
    return found
