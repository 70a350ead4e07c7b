"""Shared fixtures of the model tests: a small two-modality batch, with optional dense targets."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest
import torch


def _make_batch(
    batch_size: int = 2,
    image_size: int = 64,
    samples: int = 8000,
    num_classes: int = 4,
    event_classes: int = 0,
    event_frames: int = 50,
    mask: bool = False,
) -> dict[str, Any]:
    """A random batch shaped like the data modules' (0.5 s of 16 kHz audio by default, to keep tests fast).

    With ``event_classes`` it also holds frame targets ``"events"`` ``[B, event_frames, K]`` (a data frame
    rate that differs from any model's on purpose), with ``mask`` a soft shadow mask ``[B, 1, H, W]``.
    """
    gen = torch.Generator().manual_seed(0)
    batch = {
        "image": torch.randn(batch_size, 3, image_size, image_size, generator=gen),
        "audio": 0.1 * torch.randn(batch_size, 1, samples, generator=gen),
        "label": torch.randint(0, num_classes, (batch_size,), generator=gen),
    }
    if event_classes:
        batch["events"] = (torch.rand(batch_size, event_frames, event_classes, generator=gen) > 0.7).float()
    if mask:
        batch["mask"] = (torch.rand(batch_size, 1, image_size, image_size, generator=gen) > 0.5).float()
    return batch


@pytest.fixture
def make_batch() -> Callable[..., dict[str, Any]]:
    """``make_batch(batch_size=2, image_size=64, samples=8000, num_classes=4, event_classes=0, mask=False)``."""
    return _make_batch


@pytest.fixture
def batch() -> dict[str, Any]:
    """Two samples: 64x64 images and 0.5 s of 16 kHz audio."""
    return _make_batch()
