"""Which modality each sample has: the presence masks of the batch, and seeded absences for evaluation.

Two-modality data carries ``image_present`` and ``audio_present`` (bool ``[B]``): a row with an empty
image or audio cell is a sample without that modality, and its input is a placeholder (zeros of the
usual shape) that a model reading the masks never looks at (`sss.models.hunter.HunterModule` replaces
the absent modality's tokens by a learned "missing" embedding). A batch without the keys has every
modality it holds. `mark_absent` makes a modality absent in a seeded fraction of the samples: the
robustness report and ``sss validate --missing image=0.5`` evaluate through it.
"""

from __future__ import annotations

import zlib
from collections.abc import Mapping
from typing import Any

import torch
from torch import Tensor

__all__ = [
    "MODALITIES",
    "PRESENT_KEYS",
    "absent_draw",
    "batch_edit",
    "mark_absent",
    "parse_missing",
    "presence",
    "zeroed",
]

MODALITIES = ("image", "audio")
PRESENT_KEYS: Mapping[str, str] = {"image": "image_present", "audio": "audio_present"}
"""The batch key of each modality's presence mask, by modality name (whatever the module's ``modality_keys``)."""


def presence(batch: Mapping[str, Any], modality: str, size: int, device: Any = None) -> Tensor:
    """The presence mask ``[size]`` of `modality` in `batch`: its ``<modality>_present`` entry, else all True.

    Example:
        >>> presence({"image_present": torch.tensor([True, False])}, "image", 2).tolist()
        [True, False]
        >>> presence({}, "audio", 2).tolist()
        [True, True]
    """
    found = batch.get(PRESENT_KEYS[modality]) if isinstance(batch, Mapping) else None
    if found is None:
        return torch.ones(size, dtype=torch.bool, device=device)
    return torch.as_tensor(found, device=device).reshape(-1).bool()


def absent_draw(ids: Tensor, modality: str, seed: int) -> Tensor:
    """A uniform number in [0, 1) per sample id, a fixed function of (seed, modality, id).

    A sample is made absent at rate r when its draw is below r, so the samples absent at 0.25 are
    also absent at 0.5, and the draw does not depend on the batch, the process count or the order.
    A 32-bit integer mix (murmur3's finaliser) in int64 arithmetic, whose low 32 bits are exact.

    Example:
        >>> draws = absent_draw(torch.arange(10_000), "image", seed=0)
        >>> 0.24 < float((draws < 0.25).float().mean()) < 0.26
        True
        >>> bool((absent_draw(torch.arange(4), "image", 0) == absent_draw(torch.arange(4), "image", 0)).all())
        True
    """
    salt = zlib.crc32(f"{seed}:{modality}".encode())
    mask = 0xFFFFFFFF
    x = (ids.to(torch.int64) * 0x9E3779B1 + salt) & mask
    for shift, factor in ((16, 0x85EBCA6B), (13, 0xC2B2AE35)):
        x = ((x ^ (x >> shift)) * factor) & mask
    x = x ^ (x >> 16)
    return x.to(torch.float64) / 2.0**32


def mark_absent(
    batch: dict[str, Any], modality: str, key: str, rate: float, seed: int, ids: Tensor | None = None
) -> dict[str, Any]:
    """`batch` with `modality` absent in a seeded fraction `rate` of its samples (a new dict; the batch is not changed).

    The presence mask ``<modality>_present`` becomes False for those samples (and stays False where it
    was), and the input at `key` is replaced by zeros there: the placeholder a model reading the masks
    ignores, and what a module that does not read them sees (the old "zeroed" ablation, at rate 1).
    Which samples: those whose `absent_draw` of their ``batch["index"]`` (else of `ids`, else of their
    position in the batch) is below `rate`.

    Args:
        batch: A dict batch holding `key`.
        modality: ``"image"`` or ``"audio"``.
        key: The batch key of the modality's input (the module's ``modality_keys[modality]``).
        rate: Fraction of samples made absent, in [0, 1].
        seed: Seed of the draws.
        ids: Sample ids when the batch has no ``"index"``.

    Raises:
        KeyError: The batch lacks `key` (rather than silently making nothing absent).

    Example:
        >>> batch = {"audio": torch.ones(4, 1, 8), "index": torch.arange(4)}
        >>> out = mark_absent(batch, "audio", "audio", rate=1.0, seed=0)
        >>> out["audio_present"].tolist(), float(out["audio"].abs().sum())
        ([False, False, False, False], 0.0)
        >>> mark_absent(batch, "audio", "audio", rate=0.0, seed=0)["audio_present"].all().item()
        True
    """
    if not isinstance(batch, Mapping) or key not in batch:
        keys = ", ".join(map(repr, batch)) if isinstance(batch, Mapping) else f"a {type(batch).__name__}"
        raise KeyError(
            f"making {modality} absent needs its input {key!r}, which the evaluation batch lacks ({keys}): set the "
            "module's modality_keys to the batch key of each modality, e.g. {'image': 'images', 'audio': 'audio'}"
        )
    value: Tensor = batch[key]
    size = value.shape[0]
    if ids is None:
        ids = batch.get("index")
    ids = torch.arange(size) if ids is None else torch.as_tensor(ids).reshape(-1)
    absent = (absent_draw(ids.cpu(), modality, seed) < rate).to(value.device)
    present = presence(batch, modality, size, value.device) & ~absent
    shape = (size,) + (1,) * (value.ndim - 1)
    blank = torch.where(present.view(shape), value, torch.zeros((), dtype=value.dtype, device=value.device))
    return {**batch, key: blank, PRESENT_KEYS[modality]: present}


def parse_missing(items: Mapping[str, Any] | list[str] | tuple[str, ...] | None) -> dict[str, float]:
    """``["image=0.5"]`` or ``{"image": 0.5}`` as ``{modality: rate}``, checked (``sss validate --missing``).

    Raises:
        ValueError: An unknown modality, a rate outside [0, 1], or a malformed item, named.

    Example:
        >>> parse_missing(["image=0.5", "audio=1"])
        {'image': 0.5, 'audio': 1.0}
    """
    pairs: list[tuple[str, Any]] = []
    if isinstance(items, Mapping):
        pairs = list(items.items())
    else:
        for item in items or ():
            name, sep, rate = str(item).partition("=")
            if not sep:
                raise ValueError(f"--missing {item!r}: write MODALITY=RATE, e.g. --missing image=0.5")
            pairs.append((name.strip(), rate.strip()))
    found: dict[str, float] = {}
    for name, raw in pairs:
        if name not in MODALITIES:
            raise ValueError(f"--missing {name}={raw}: unknown modality {name!r}; choose image or audio")
        try:
            rate = float(raw)
        except (TypeError, ValueError):
            raise ValueError(f"--missing {name}={raw}: the rate must be a number in [0, 1]") from None
        if not 0.0 <= rate <= 1.0:
            raise ValueError(f"--missing {name}={raw}: the rate must be in [0, 1] (the fraction of samples)")
        found[name] = rate
    return found


def batch_edit(
    module: Any, *, zero: str | None = None, missing: Mapping[str, float] | None = None, seed: int = 0
) -> Any:
    """What an evaluation pass does to each batch: zero the input `zero`, and/or make modalities absent (`missing`).

    Returns None when there is nothing to do, else ``edit(batch) -> batch``. The module's
    ``modality_keys`` (``image`` and ``audio`` by default) give each modality's batch key; a modality
    in `missing` it lacks is an error.

    Example:
        >>> from sss.testing import BoringModule
        >>> edit = batch_edit(BoringModule(), missing={"image": 1.0})
        >>> edit({"image": torch.ones(2, 3), "audio": torch.ones(2, 4)})["image_present"].tolist()
        [False, False]
        >>> batch_edit(BoringModule()) is None
        True
    """
    keys = dict(getattr(module, "modality_keys", {"image": "image", "audio": "audio"}))
    rates = parse_missing(missing)
    unknown = [m for m in rates if m not in keys]
    if unknown:
        raise ValueError(f"cannot make {unknown[0]} absent: the module has no {unknown[0]} input ({dict(keys)})")
    if zero is None and not rates:
        return None

    def edit(batch: Any) -> Any:
        if zero is not None:
            batch = zeroed(batch, zero)
        for modality, rate in rates.items():
            batch = mark_absent(batch, modality, keys[modality], rate, seed)
        return batch

    return edit


def zeroed(batch: Any, key: Any) -> Any:
    """`batch` with the input `key` replaced by zeros: the modality ablation.

    A key the batch lacks raises a KeyError rather than silently ablating nothing.

    Example:
        >>> zeroed({"image": torch.ones(2), "audio": torch.ones(2)}, "image")["image"].tolist()
        [0.0, 0.0]
    """
    if isinstance(batch, (list, tuple)) and isinstance(key, int) and -len(batch) <= key < len(batch):
        return type(batch)(torch.zeros_like(v) if i == key % len(batch) else v for i, v in enumerate(batch))
    if not isinstance(batch, dict) or key not in batch:
        keys = ", ".join(map(repr, batch)) if isinstance(batch, dict) else f"a {type(batch).__name__}"
        raise KeyError(
            f"the modality ablation zeroes {key!r}, which the evaluation batch lacks ({keys}): set the module's "
            "modality_keys to the batch key of each modality, e.g. {'image': 'images', 'audio': 'audio'}"
        )
    return {**batch, key: torch.zeros_like(batch[key])}
