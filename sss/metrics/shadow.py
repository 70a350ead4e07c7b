"""Shadow detection: balanced error rate (BER) over all pixels of the evaluation set.

`mask_counts` turns each image into pixel counts (TP, FP, TN, FN), per image so that the trainer can
gather them across processes and sum without padded duplicates counting twice; `shadow_metrics`
sums them into the dataset-level BER of the shadow-detection literature (the ComputeBERonSet / BDRAR
convention), and also reports the per-image average, which is a different number.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor

__all__ = ["mask_counts", "shadow_metrics"]


def mask_counts(probs: Tensor, target: Tensor, *, threshold: float = 0.5) -> Tensor:
    """Per-image pixel counts ``[N, 4]`` = (TP, FP, TN, FN) of predicted against true shadow masks.

    The prediction is first resized (bilinear) to the ground truth's resolution, as the standard
    evaluation resizes it to the mask. A pixel is predicted shadow when its probability is
    ``>= threshold`` and is shadow in the ground truth when ``target > 0.5``: for a float mask
    ``v / 255`` of an 8-bit mask that is exactly ``v >= 128`` (the benchmarks binarise ``mask > 127``).

    Args:
        probs: Shadow probabilities (after the sigmoid) ``[N, 1, h, w]`` or ``[N, h, w]``.
        target: Ground-truth masks in [0, 1] ``[N, 1, H, W]`` or ``[N, H, W]``.
        threshold: Probability at or above which a pixel is predicted shadow.

    Returns:
        Long ``[N, 4]``.

    Example:
        >>> import torch
        >>> target = torch.zeros(1, 1, 4, 4)
        >>> target[..., 0, :] = 1.0  # 4 shadow pixels
        >>> probs = torch.zeros(1, 1, 4, 4)
        >>> probs[..., 0, :3] = 0.9  # 3 of them found
        >>> probs[..., 2, :2] = 0.7  # and 2 false alarms
        >>> mask_counts(probs, target)
        tensor([[ 3,  2, 10,  1]])
    """
    probs, target = _as_masks(probs, "probs"), _as_masks(target, "target")
    if probs.shape[0] != target.shape[0]:
        raise ValueError(f"probs has {probs.shape[0]} masks but target has {target.shape[0]}")
    if probs.shape[-2:] != target.shape[-2:]:
        probs = F.interpolate(probs.float(), size=target.shape[-2:], mode="bilinear", align_corners=False)
    pred, truth = probs >= threshold, target > 0.5
    counts = [pred & truth, pred & ~truth, ~pred & ~truth, ~pred & truth]
    return torch.stack([c.sum(dim=(1, 2, 3)) for c in counts], dim=1).long()


def shadow_metrics(counts: Tensor) -> dict[str, float]:
    """Dataset-level BER, shadow and non-shadow error (in %, lower is better) from `mask_counts`.

    ``ber = 100 * (1 - (TP / Np + TN / Nn) / 2)`` with the counts summed over every pixel of the set,
    ``Np = TP + FN`` shadow and ``Nn = TN + FP`` non-shadow pixels; ``shadow_error = 100 * (1 - TP / Np)``,
    ``nonshadow_error = 100 * (1 - TN / Nn)``. ``ber_per_image`` is the mean of each image's own BER
    over the images that have both shadow and non-shadow pixels (``nan`` if none has): it weighs small
    shadows more and is *not* the number papers report.

    Args:
        counts: Per-image (TP, FP, TN, FN) ``[N, 4]``, gathered from all processes.

    Returns:
        ``ber``, ``shadow_error``, ``nonshadow_error``, ``ber_per_image``.

    Raises:
        ValueError: The set has no shadow pixel or no non-shadow pixel, so BER is undefined.

    Example:
        >>> import torch
        >>> m = shadow_metrics(torch.tensor([[3, 2, 10, 1]]))
        >>> round(m["ber"], 2), round(m["shadow_error"], 2), round(m["nonshadow_error"], 2)
        (20.83, 25.0, 16.67)
    """
    if counts.ndim != 2 or counts.shape[1] != 4:
        raise ValueError(f"counts must be [N, 4] (TP, FP, TN, FN) per image, got shape {tuple(counts.shape)}")
    tp, fp, tn, fn = counts.double().sum(dim=0).tolist()
    for pixels, name in ((tp + fn, "shadow pixels (TP + FN)"), (tn + fp, "non-shadow pixels (TN + FP)")):
        if pixels == 0:
            raise ValueError(f"BER is undefined: the evaluated set of {len(counts)} images has no {name}")
    shadow_error, nonshadow_error = 100 * (1 - tp / (tp + fn)), 100 * (1 - tn / (tn + fp))
    return {
        "ber": (shadow_error + nonshadow_error) / 2,
        "shadow_error": shadow_error,
        "nonshadow_error": nonshadow_error,
        "ber_per_image": _ber_per_image(counts.double()),
    }


def _ber_per_image(counts: Tensor) -> float:
    tp, fp, tn, fn = counts.unbind(dim=1)
    both = (tp + fn > 0) & (tn + fp > 0)
    if not both.any():
        return float("nan")
    ber = 100 * (1 - 0.5 * (tp / (tp + fn) + tn / (tn + fp)))
    return ber[both].mean().item()


def _as_masks(masks: Tensor, name: str) -> Tensor:
    """``[N, H, W]`` or ``[N, 1, H, W]`` to ``[N, 1, H, W]``."""
    if masks.ndim == 3:
        masks = masks.unsqueeze(1)
    if masks.ndim != 4 or masks.shape[1] != 1:
        raise ValueError(f"{name} must be [N, 1, H, W] (or [N, H, W]) masks, got shape {tuple(masks.shape)}")
    return masks
