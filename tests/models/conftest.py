"""Shared fixtures of the model tests: a small two-modality batch."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest
import torch


def _make_batch(batch_size: int = 2, image_size: int = 64, samples: int = 8000, num_classes: int = 4) -> dict[str, Any]:
    """A random batch shaped like the data modules' (0.5 s of 16 kHz audio by default, to keep tests fast)."""
    gen = torch.Generator().manual_seed(0)
    return {
        "image": torch.randn(batch_size, 3, image_size, image_size, generator=gen),
        "audio": 0.1 * torch.randn(batch_size, 1, samples, generator=gen),
        "label": torch.randint(0, num_classes, (batch_size,), generator=gen),
    }


@pytest.fixture
def make_batch() -> Callable[..., dict[str, Any]]:
    """``make_batch(batch_size=2, image_size=64, samples=8000, num_classes=4)``: a fresh random batch."""
    return _make_batch


@pytest.fixture
def batch() -> dict[str, Any]:
    """Two samples: 64x64 images and 0.5 s of 16 kHz audio."""
    return _make_batch()
