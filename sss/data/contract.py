"""The batch contract: which keys a batch may carry, with which dtype and shape, checked in one place.

`BATCH_KEYS` is the table of ``docs/data.md`` ("The batch") as data: one `KeyRule` per known key,
with the mistakes people make with that key and what to do about each. `check_batch` applies it
to one batch, reading only dtypes and shapes (no values, so no device sync and no RNG draw), and
raises a `BatchFormatError` naming the key, what it got, what it must be and the fix. Keys not in
the table are the dataset's own business and pass unchecked. The trainer checks the first
training batch and the first validation batch of a fit with it.

This module describes the data format only; it imports nothing from the trainer.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import torch
from torch import Tensor

from sss.data._decode import DataError

__all__ = ["BATCH_KEYS", "INPUT_KEYS", "BatchFormatError", "KeyRule", "check_batch"]

INPUT_KEYS = ("image", "audio")
"""The keys `LitModule.forward` reads; a batch must carry at least one of them (a module's ``input_keys`` overrides)."""


class BatchFormatError(DataError):
    """A batch breaks the batch contract (`BATCH_KEYS`); the message names the key, what it got and the fix.

    Example:
        >>> isinstance(BatchFormatError("x"), ValueError)
        True
    """


@dataclass(frozen=True)
class KeyRule:
    """What one batch key must be: a dtype family and one or more shapes, and the fixes of common mistakes.

    A shape is a tuple of dimensions: ``"B"`` is the batch dimension (the same for every key of a
    batch), an ``int`` a fixed size, any other string a free size.
    """

    key: str
    kind: str
    """``float`` (any floating dtype), ``int`` (any integer dtype, not bool) or ``bool``."""
    shapes: tuple[tuple[int | str, ...], ...]
    must: str
    """What the key must be, as the message says it, e.g. ``RGB float [B, 3, H, W]``."""
    fix: str
    """What to do when the value does not match and no `hints` entry says something more precise."""
    hints: tuple[tuple[Callable[[Tensor], bool], str], ...] = ()
    """``(when, say)`` pairs for common mistakes, tried in order: the first `when` that holds gives the message
    (``{must}`` in `say` stands for `must`)."""


def _integer(t: Tensor) -> bool:
    return not (t.is_floating_point() or t.is_complex() or t.dtype == torch.bool)


BATCH_KEYS: tuple[KeyRule, ...] = (
    KeyRule(
        "image",
        "float",
        (("B", 3, "H", "W"),),
        "RGB float [B, 3, H, W]",
        "return one float [3, H, W] tensor per sample from your dataset",
        (
            (
                lambda t: t.ndim == 4 and t.shape[-1] == 3 and t.shape[1] != 3,
                "it must be {must} and looks channels-last [B, H, W, 3]: permute each sample to [3, H, W] in "
                "your dataset (torchvision's ToTensor does)",
            ),
            (
                lambda t: t.ndim == 4 and t.shape[1] in (1, 4),
                "it must be {must}: convert the images to RGB in your dataset (PIL's image.convert('RGB'))",
            ),
            (
                lambda t: t.dtype == torch.uint8,
                "it must be {must}: scale the pixels to floats in your dataset (torchvision's ToTensor, or "
                "image.float() / 255, then normalise)",
            ),
        ),
    ),
    KeyRule(
        "audio",
        "float",
        (("B", "S"), ("B", "C", "S"), ("B", 1, "M", "T")),
        "a float waveform [B, C, S] (or [B, S]) or float features [B, 1, M, T]",
        "return one float waveform [C, S] (or features [1, M, T]) per sample from your dataset",
        (
            (
                lambda t: not t.is_floating_point() and t.ndim in (2, 3),
                "it must be {must}: convert integer PCM to floats in your dataset (audio.float() / 32768 for 16-bit)",
            ),
        ),
    ),
    KeyRule(
        "label",
        "int",
        (("B",),),
        "class indices int64 [B]",
        "return each sample's class index as an int (or a 0-d int64 tensor) from your dataset",
        (
            (
                lambda t: t.ndim == 2 and t.shape[1] == 1,
                "it must be {must}: return a scalar class index per sample, not a [1] tensor",
            ),
            (
                lambda t: t.ndim == 2,
                "'label' means class indices int64 [B]; for multi-hot float [B, K] targets use 'labels'",
            ),
            (lambda t: t.is_floating_point(), "it must be {must}: convert it with .long() in your dataset"),
        ),
    ),
    KeyRule(
        "labels",
        "float",
        (("B", "K"),),
        "multi-hot float [B, K]",
        "return one multi-hot float [K] tensor per sample from your dataset",
        (
            (lambda t: t.ndim == 1, "'labels' means multi-hot float [B, K]; for class indices use 'label'"),
            (lambda t: t.ndim == 2, "it must be {must}: convert it with .float() in your dataset"),
        ),
    ),
    KeyRule(
        "events",
        "float",
        (("B", "T", "K"),),
        "float frame targets [B, T, K]",
        "return one float [T, K] tensor of frame targets per sample from your dataset",
        ((lambda t: t.ndim == 3, "it must be {must}: convert it with .float() in your dataset"),),
    ),
    KeyRule(
        "mask",
        "float",
        (("B", 1, "h", "w"),),
        "a float shadow mask [B, 1, h, w] in [0, 1]",
        "return one float [1, h, w] mask per sample from your dataset",
        (
            (lambda t: t.ndim == 3, "it must be {must}: add the channel dimension, a [1, h, w] mask per sample"),
            (
                lambda t: t.ndim == 4 and t.shape[1] == 1,
                "it must be {must}: convert it to floats in your dataset (mask.float(), divided by 255 for 8-bit)",
            ),
        ),
    ),
    KeyRule(
        "index",
        "int",
        (("B",),),
        "the dataset row indices int64 [B]",
        "return the row index as an int per sample, and put other ids under another key",
    ),
    *(
        KeyRule(
            f"{modality}_present",
            "bool",
            (("B",),),
            f"a bool presence mask [B] (False: the sample has no {modality})",
            f"return {modality}_present=True/False per sample, with a zero placeholder {modality} where it is False",
        )
        for modality in ("image", "audio")
    ),
)
"""The known batch keys (``docs/data.md``, "The batch"); any other key passes unchecked."""

_RULES = {rule.key: rule for rule in BATCH_KEYS}


def check_batch(batch: Any, *, where: str = "the batch", input_keys: Sequence[str] | None = INPUT_KEYS) -> None:
    """Raise a `BatchFormatError` if `batch` breaks the batch contract (`BATCH_KEYS`); reads dtypes and shapes only.

    Args:
        batch: One collated batch: a dict of named tensors.
        where: How the message names the batch, e.g. ``"the first training batch"``.
        input_keys: The keys the model reads as inputs; at least one must be present (an empty
            tuple requires none). None skips every check (a module that takes another batch
            format says so with ``input_keys = None``).

    Example:
        >>> import torch
        >>> check_batch({"image": torch.zeros(2, 3, 8, 8), "label": torch.tensor([0, 1]), "path": ["a", "b"]})
        >>> check_batch({"audio": torch.zeros(2, 1, 16), "labels": torch.tensor([0, 1])})
        Traceback (most recent call last):
        ...
        sss.data.contract.BatchFormatError: the batch's 'labels' is int64 [2]; 'labels' means multi-hot float [B, K]; \
for class indices use 'label'
    """
    if input_keys is None:
        return
    if not isinstance(batch, Mapping):
        raise BatchFormatError(
            f"{where} is a {type(batch).__name__}, not a dict of named tensors ('image', 'audio', 'label', ...): "
            "return a dict from your Dataset's __getitem__ (docs/data.md, The batch), or set input_keys = None on "
            "a module that takes another batch format"
        )
    if input_keys and not any(key in batch for key in input_keys):
        wanted = " or ".join(repr(k) for k in input_keys)
        raise BatchFormatError(
            f"{where} has no {wanted} key (keys: {', '.join(map(str, batch)) or 'none'}): rename them in your "
            "dataset, or, if your module reads other keys, name them in its input_keys "
            "(e.g. input_keys = ('images', 'sound'))"
        )
    sizes: dict[str, int] = {}
    for key, value in batch.items():
        rule = _RULES.get(key)
        if rule is not None:
            _check_key(rule, value, where)
            sizes[key] = value.shape[0]
    if len(set(sizes.values())) > 1:
        shown = ", ".join(f"'{k}' {n}" for k, n in sizes.items())
        raise BatchFormatError(
            f"{where}'s keys disagree on the batch size ({shown}): every per-sample key must have the batch as "
            "its first dimension"
        )


def _check_key(rule: KeyRule, value: Any, where: str) -> None:
    if not isinstance(value, Tensor):
        raise BatchFormatError(
            f"{where}'s '{rule.key}' is a {type(value).__name__}, not a tensor; it must be {rule.must}: {rule.fix}"
        )
    kinds = {"float": Tensor.is_floating_point, "int": _integer, "bool": lambda t: t.dtype == torch.bool}
    kind_ok = kinds[rule.kind](value)
    if kind_ok and any(_fits(value.shape, shape) for shape in rule.shapes):
        return
    got = f"{str(value.dtype).removeprefix('torch.')} [{', '.join(map(str, value.shape))}]"
    for when, say in rule.hints:
        if when(value):
            raise BatchFormatError(f"{where}'s '{rule.key}' is {got}; {say.format(must=rule.must)}")
    raise BatchFormatError(f"{where}'s '{rule.key}' is {got}; it must be {rule.must}: {rule.fix}")


def _fits(shape: torch.Size, rule: tuple[int | str, ...]) -> bool:
    return len(shape) == len(rule) and all(not isinstance(d, int) or n == d for n, d in zip(shape, rule, strict=True))
