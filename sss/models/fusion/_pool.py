"""Pooling shared by the fusion heads: one vector per modality, zeros for a missing one."""

from __future__ import annotations

import torch
from torch import Tensor, nn


def check_tokens(image: Tensor | None, audio: Tensor | None, dim: int) -> int:
    """Validate the token streams a fusion head receives; returns the batch size."""
    present = [(name, t) for name, t in (("image", image), ("audio", audio)) if t is not None]
    if not present:
        raise ValueError("fusion needs at least one modality, got neither image nor audio tokens (is the batch empty?)")
    for name, tokens in present:
        if tokens.ndim != 3 or tokens.shape[-1] != dim:
            raise ValueError(f"{name} tokens must be [B, N, {dim}], got {tuple(tokens.shape)}")
    sizes = {t.shape[0] for _, t in present}
    if len(sizes) > 1:
        raise ValueError(f"image and audio tokens have different batch sizes: {image.shape[0]} vs {audio.shape[0]}")
    return sizes.pop()


def pool_streams(image: Tensor | None, audio: Tensor | None, norms: nn.ModuleList) -> Tensor:
    """Mean-pool each stream, LayerNorm it, and concatenate ``[image | audio]`` into ``[B, 2D]``.

    Each stream has its own norm, so a missing stream contributes exact zeros (not a norm's bias)
    and the present stream's half looks the same as in a full batch.
    """
    ref = image if image is not None else audio
    assert ref is not None  # check_tokens ran first
    halves = [
        norm(tokens.mean(dim=1)) if tokens is not None else ref.new_zeros(ref.shape[0], ref.shape[-1])
        for norm, tokens in zip(norms, (image, audio), strict=True)
    ]
    return torch.cat(halves, dim=-1)
