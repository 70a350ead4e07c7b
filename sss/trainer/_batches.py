"""Batches as the loop handles them: split into micro-batches; modules made ready to save."""

from __future__ import annotations

import math
from typing import Any

import torch
from torch import Tensor, nn

__all__ = ["batch_size", "first_batches", "own_buffer_storage", "split_batch", "step_loss"]


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
    size = batch_size(batch)
    bounds = [math.ceil(i * size / parts) for i in range(parts + 1)]

    def piece(value: Any, i: int) -> Any:
        if isinstance(value, dict):
            return {k: piece(v, i) for k, v in value.items()}
        if isinstance(value, (list, tuple)) and value and all(isinstance(v, torch.Tensor) for v in value):
            return type(value)(piece(v, i) for v in value)  # a container of batch tensors, e.g. (logits, aux)
        if isinstance(value, torch.Tensor) and value.ndim > 0 and len(value) == size:
            return value[bounds[i] : bounds[i + 1]]
        if isinstance(value, (list, tuple)) and len(value) == size:  # per-sample values, e.g. file paths
            return value[bounds[i] : bounds[i + 1]]
        return value

    return [piece(batch, i) for i in range(parts) if bounds[i + 1] > bounds[i]]


def first_batches(loader: Any, n: int) -> torch.utils.data.DataLoader:
    """A loader over the first `n` batches' samples of `loader`'s dataset, in order (``trainer.overfit_batches``).

    Example:
        >>> from sss.testing import boring_loader
        >>> [b["index"].tolist() for b in first_batches(boring_loader(n=20, batch_size=4, shuffle=True), 2)]
        [[0, 1, 2, 3], [4, 5, 6, 7]]
    """
    if not isinstance(loader, torch.utils.data.DataLoader) or loader.batch_size is None:
        raise ValueError("trainer.overfit_batches needs a torch DataLoader with a batch_size as training data")
    rows = torch.utils.data.Subset(loader.dataset, range(min(n * loader.batch_size, len(loader.dataset))))
    return torch.utils.data.DataLoader(
        rows, batch_size=loader.batch_size, shuffle=False, collate_fn=loader.collate_fn, num_workers=loader.num_workers
    )


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


def batch_size(batch: Any) -> int:
    """The number of samples in a batch: the first dimension of its first tensor (1 when it has none).

    Example:
        >>> batch_size({"index": 3, "audio": torch.zeros(5, 1, 16)})
        5
    """
    if isinstance(batch, Tensor):
        return batch.shape[0] if batch.ndim else 1
    values = batch.values() if isinstance(batch, dict) else batch if isinstance(batch, (list, tuple)) else ()
    for value in values:
        if isinstance(value, Tensor) and value.ndim > 0:
            return value.shape[0]
    return 1


def step_loss(out: Any) -> Tensor:
    """The loss to backpropagate in what ``training_step`` returned: the tensor itself or its ``"loss"`` entry.

    Example:
        >>> step_loss({"loss": torch.tensor(0.5), "logits": torch.zeros(2, 3)})
        tensor(0.5000)
    """
    loss = out["loss"] if isinstance(out, dict) else out
    if not isinstance(loss, Tensor):
        raise TypeError(f"training_step must return the loss tensor (or a dict with 'loss'), got {type(out)}")
    return loss
