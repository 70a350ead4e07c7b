"""Batches as the loop handles them: split into micro-batches; modules made ready to save."""

from __future__ import annotations

import math
from typing import Any

import torch
from torch import nn

from sss.trainer.module import _batch_size

__all__ = ["own_buffer_storage", "split_batch"]


def split_batch(batch: Any, parts: int) -> list[Any]:
    """`batch` as `parts` micro-batches along the first dimension (a dict of image, audio and targets alike).

    Tensors and lists as long as the batch are split; other values (settings, scalars) go to every part.

    Example:
        >>> parts = split_batch({"image": torch.zeros(5, 3), "label": torch.arange(5), "sr": 16000}, 2)
        >>> [(p["image"].shape[0], p["label"].tolist(), p["sr"]) for p in parts]
        [(3, [0, 1, 2], 16000), (2, [3, 4], 16000)]
    """
    if parts == 1:
        return [batch]
    size = _batch_size(batch)
    bounds = [math.ceil(i * size / parts) for i in range(parts + 1)]

    def piece(value: Any, i: int) -> Any:
        if isinstance(value, dict):
            return {k: piece(v, i) for k, v in value.items()}
        if isinstance(value, (torch.Tensor, list, tuple)) and getattr(value, "ndim", 1) > 0 and len(value) == size:
            return value[bounds[i] : bounds[i + 1]]
        return value

    return [piece(batch, i) for i in range(parts) if bounds[i + 1] > bounds[i]]


def own_buffer_storage(module: nn.Module) -> None:
    """Give every buffer of `module` its own storage (safetensors refuses views of a longer one).

    Example:
        >>> import torchaudio
        >>> own_buffer_storage(torchaudio.transforms.Spectrogram(n_fft=64))
    """
    # torch.hann_window(n) returns a view of a longer storage, so torchaudio's Spectrogram
    # window is one; safetensors then refuses the whole state dict (in save_state and export).
    for owner in module.modules():
        for name, buf in owner.named_buffers(recurse=False):
            if buf is not None and buf.untyped_storage().nbytes() != buf.numel() * buf.element_size():
                owner._buffers[name] = buf.clone()
