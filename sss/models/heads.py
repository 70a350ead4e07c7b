"""Dense task heads on fused tokens and the target resampling their losses need.

`EventHead` gives frame-level sound-event logits from the audio tokens, `MaskHead` low-resolution
shadow-mask logits from the image tokens. Targets come at the data's resolution and are brought to
the head's with `resample_events` (adaptive max pool over time) and `resize_mask` (area pooling),
so data and model never have to agree on a frame rate or a mask size.
"""

from __future__ import annotations

import torch.nn.functional as F
from torch import Tensor, nn

__all__ = ["EventHead", "MaskHead", "resample_events", "resize_mask"]


class EventHead(nn.Module):
    """Frame-level sound-event detection: LayerNorm + Linear per audio frame, ``K`` sigmoid logits.

    Args:
        dim: Token width.
        num_classes: Event classes ``K``.

    Example:
        >>> import torch
        >>> EventHead(dim=8, num_classes=3)(torch.randn(2, 13, 8)).shape  # one row of logits per frame
        torch.Size([2, 13, 3])
    """

    def __init__(self, dim: int, num_classes: int) -> None:
        super().__init__()
        self.num_classes = num_classes
        self.norm = nn.LayerNorm(dim)
        self.out = nn.Linear(dim, num_classes)
        nn.init.trunc_normal_(self.out.weight, std=0.02)
        nn.init.zeros_(self.out.bias)

    def forward(self, frames: Tensor) -> Tensor:
        """``[B, T, dim]`` frames to event logits ``[B, T, num_classes]`` (apply a sigmoid for probabilities)."""
        return self.out(self.norm(frames))


class MaskHead(nn.Module):
    """Shadow-mask logits from the image token grid: LayerNorm + Linear per token, then pixel shuffle.

    Each token predicts an ``upsample x upsample`` patch of the mask (SETR-style linear decoder), so
    a ``h x w`` grid gives mask logits ``[B, 1, h * upsample, w * upsample]``: cheap, and enough for
    the low-resolution masks that BER is computed from after resizing.

    Args:
        dim: Token width.
        upsample: Mask pixels per token along each side.

    Example:
        >>> import torch
        >>> MaskHead(dim=8, upsample=4)(torch.randn(2, 8, 2, 3)).shape
        torch.Size([2, 1, 8, 12])
    """

    def __init__(self, dim: int, upsample: int = 4) -> None:
        super().__init__()
        if upsample < 1:
            raise ValueError(f"MaskHead needs upsample >= 1, got {upsample}")
        self.upsample = upsample
        self.norm = nn.LayerNorm(dim)
        self.out = nn.Linear(dim, upsample * upsample)
        nn.init.trunc_normal_(self.out.weight, std=0.02)
        nn.init.zeros_(self.out.bias)

    def forward(self, grid: Tensor) -> Tensor:
        """Token map ``[B, dim, h, w]`` to mask logits ``[B, 1, h * upsample, w * upsample]``."""
        logits = self.out(self.norm(grid.permute(0, 2, 3, 1)))  # [B, h, w, s*s]
        return F.pixel_shuffle(logits.permute(0, 3, 1, 2), self.upsample)


def resample_events(target: Tensor, frames: int) -> Tensor:
    """Frame targets ``[B, T, K]`` to ``[B, frames, K]`` by adaptive max pooling over time.

    Max, not nearest or mean: a 30 ms knock that covers part of an output frame makes that frame
    active, where nearest sampling could skip it entirely and a mean would turn it into 0.3. When
    ``frames > T`` each target frame is repeated (adaptive pooling then picks single frames).

    Args:
        target: Float frame targets in [0, 1], ``[B, T, K]``.
        frames: The head's frame count.

    Returns:
        ``[B, frames, K]``.

    Example:
        >>> import torch
        >>> target = torch.zeros(1, 10, 1)
        >>> target[0, 7, 0] = 1.0  # active in one of 10 frames
        >>> resample_events(target, 3)[0, :, 0]
        tensor([0., 0., 1.])
    """
    if target.ndim != 3:
        raise ValueError(f"batch['events'] must be [B, T, K] frame targets, got shape {tuple(target.shape)}")
    return F.adaptive_max_pool1d(target.float().transpose(1, 2), frames).transpose(1, 2)


def resize_mask(target: Tensor, size: tuple[int, int]) -> Tensor:
    """Mask targets ``[B, 1, H, W]`` in [0, 1] to ``[B, 1, *size]`` by area (adaptive average) pooling.

    Each low-resolution cell's target is the fraction of shadow pixels it covers (a soft target for
    BCE), which keeps thin shadows that nearest sampling would miss. Upsampling repeats pixels.

    Args:
        target: Float masks in [0, 1], ``[B, 1, H, W]`` (a ``[B, H, W]`` mask gets its channel added).
        size: The head's ``(h, w)``.

    Returns:
        ``[B, 1, h, w]``.

    Example:
        >>> import torch
        >>> mask = torch.zeros(1, 1, 4, 4)
        >>> mask[..., :2, :1] = 1.0  # 2 of the 4 pixels of the top-left 2x2 cell
        >>> resize_mask(mask, (2, 2))
        tensor([[[[0.5000, 0.0000],
                  [0.0000, 0.0000]]]])
    """
    if target.ndim == 3:
        target = target.unsqueeze(1)
    if target.ndim != 4 or target.shape[1] != 1:
        raise ValueError(f"batch['mask'] must be [B, 1, H, W], got shape {tuple(target.shape)}")
    return F.adaptive_avg_pool2d(target.float(), size)
