"""Shadow BER: a worked example from the definition, the 8-bit threshold, resizing, dataset- vs per-image BER."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from sklearn.metrics import confusion_matrix

from sss.metrics import mask_counts, shadow_metrics


def oracle_masks() -> tuple[torch.Tensor, torch.Tensor]:
    """4x4 mask with 4 shadow pixels; the prediction finds 3 of them and flags 2 non-shadow pixels."""
    target = torch.zeros(1, 1, 4, 4)
    target[..., 0, :] = 1.0
    probs = torch.full((1, 1, 4, 4), 0.2)
    probs[..., 0, :3] = 0.8
    probs[..., 3, 2:] = 0.5  # exactly at the threshold counts as shadow
    return probs, target


def test_oracle():
    counts = mask_counts(*oracle_masks())
    assert counts.tolist() == [[3, 2, 10, 1]]
    m = shadow_metrics(counts)
    assert m["shadow_error"] == pytest.approx(25.0)
    assert m["nonshadow_error"] == pytest.approx(100 * 2 / 12)
    assert m["ber"] == pytest.approx(20.8333, abs=1e-4)
    assert m["ber_per_image"] == pytest.approx(m["ber"])  # one image


def test_8bit_mask_threshold_is_128():
    values = torch.arange(256.0)
    counts = mask_counts(torch.ones(1, 1, 1, 256), (values / 255).reshape(1, 1, 1, 256))
    assert counts.tolist() == [[128, 128, 0, 0]]  # v >= 128 is shadow: 128 TP, 0..127 are FP


@pytest.mark.parametrize("seed, size", [(0, (8, 8)), (1, (5, 7)), (2, (16, 12))])
def test_counts_match_sklearn_after_resizing(seed, size):
    gen = torch.Generator().manual_seed(seed)
    probs = torch.rand(6, 1, *size, generator=gen)
    target = (torch.rand(6, 1, 16, 16, generator=gen) > 0.6).float()
    counts = mask_counts(probs, target, threshold=0.4)
    resized = F.interpolate(probs, size=(16, 16), mode="bilinear", align_corners=False)
    for i in range(6):
        tn, fp, fn, tp = confusion_matrix(target[i].flatten() > 0.5, resized[i].flatten() >= 0.4, labels=[0, 1]).ravel()
        assert counts[i].tolist() == [tp, fp, tn, fn]
    assert counts.sum(dim=1).tolist() == [16 * 16] * 6  # counted at the ground truth's resolution


def test_dataset_level_is_not_the_per_image_mean():
    # image 0: a large shadow half found; image 1: a tiny shadow missed; image 2: no shadow at all
    counts = torch.tensor([[50, 0, 50, 50], [0, 0, 99, 1], [0, 10, 90, 0]])
    m = shadow_metrics(counts)
    tp, fp, tn, fn = counts.sum(dim=0).tolist()
    assert m["ber"] == pytest.approx(100 * (1 - 0.5 * (tp / (tp + fn) + tn / (tn + fp))))
    per_image = [100 * (1 - 0.5 * (50 / 100 + 1.0)), 100 * (1 - 0.5 * (0.0 + 1.0))]  # image 2 has no shadow
    assert m["ber_per_image"] == pytest.approx(np.mean(per_image))
    assert m["ber"] != pytest.approx(m["ber_per_image"])


def test_summing_per_image_counts_equals_one_pass():
    gen = torch.Generator().manual_seed(3)
    probs, target = torch.rand(10, 1, 6, 6, generator=gen), (torch.rand(10, 6, 6, generator=gen) > 0.5).float()
    halves = torch.cat([mask_counts(probs[:4], target[:4]), mask_counts(probs[4:], target[4:])])
    assert torch.equal(halves, mask_counts(probs, target))  # [N, H, W] masks are accepted too


def test_per_image_ber_is_nan_without_mixed_images():
    m = shadow_metrics(torch.tensor([[5, 0, 0, 0], [0, 0, 7, 0]]))
    assert m["ber"] == 0.0 and math.isnan(m["ber_per_image"])


@pytest.mark.parametrize(
    "call, message",
    [
        (lambda: shadow_metrics(torch.tensor([[0, 2, 10, 0]])), r"no shadow pixels \(TP \+ FN\)"),
        (lambda: shadow_metrics(torch.tensor([[3, 0, 0, 1]])), r"no non-shadow pixels \(TN \+ FP\)"),
        (lambda: shadow_metrics(torch.zeros(3, 3)), r"\[N, 4\].*\(3, 3\)"),
        (
            lambda: mask_counts(torch.rand(2, 3, 4, 4), torch.rand(2, 1, 4, 4)),
            r"probs must be \[N, 1, H, W\].*\(2, 3, 4, 4\)",
        ),
        (lambda: mask_counts(torch.rand(2, 1, 4, 4), torch.rand(3, 1, 4, 4)), "probs has 2 masks but target has 3"),
    ],
)
def test_bad_input_is_named(call, message):
    with pytest.raises(ValueError, match=message):
        call()
