"""The industrial label needs both modalities: each one alone gets ~50%, the two together ~100%.

A 4-class logistic regression on one hand-made feature per modality stands in for a model:
the image feature counts soft luminance ramps (motion blur), the audio feature is the peak
frame energy over the median (a transient). Fitted on one half, scored on the other.
"""

from __future__ import annotations

import pytest
import torch
from torch import Tensor

from sss.data import ManifestDataset, make_industrial
from sss.data.manifest import IMAGENET_MEAN, IMAGENET_STD


def blur_feature(images: Tensor, span: int = 2, rise: float = 0.12, ratio: float = 0.45) -> Tensor:
    """log(1 + number of pixels on a soft ramp) per image ``[B]``.

    A pixel is on a soft ramp when log-luminance changes by more than ``rise`` across
    ``2 * span`` pixels (a real shadow edge, not texture or the lamp's gradient) while no single
    one-pixel step in that window exceeds ``ratio`` of the change (spread out, not a sharp edge).
    """
    std, mean = torch.tensor(IMAGENET_STD).view(1, 3, 1, 1), torch.tensor(IMAGENET_MEAN).view(1, 3, 1, 1)
    luminance = torch.log((images * std + mean).mean(1) + 0.02)
    count = torch.zeros(len(images))
    for lum in (luminance, luminance.transpose(1, 2)):  # horizontal, then vertical ramps
        change = (lum[:, :, 2 * span :] - lum[:, :, : -2 * span]).abs()
        biggest_step = (lum[:, :, 1:] - lum[:, :, :-1]).abs().unfold(2, 2 * span, 1).amax(-1)
        count += ((change > rise) & (biggest_step < ratio * change)).sum((1, 2))
    return torch.log1p(count)


def transient_feature(audio: Tensor, frame: int = 256) -> Tensor:
    """Loudest 16-ms frame over the median frame, in log energy, per clip ``[B]``."""
    wave = audio[:, 0, : audio.shape[-1] // frame * frame]
    energy = wave.reshape(len(wave), -1, frame).pow(2).mean(-1).add(1e-10).log()
    return energy.amax(1) - energy.median(1).values


def holdout_accuracy(features: Tensor, labels: Tensor) -> float:
    """Fit multinomial logistic regression on the first half, return accuracy on the second."""
    torch.manual_seed(0)
    half = len(labels) // 2
    mean, std = features[:half].mean(0), features[:half].std(0) + 1e-6
    x = (features - mean) / std
    model = torch.nn.Linear(x.shape[1], 4)
    optimizer = torch.optim.LBFGS(model.parameters(), max_iter=50, line_search_fn="strong_wolfe")

    def closure() -> Tensor:
        optimizer.zero_grad()
        # A little L2 keeps the optimum finite: the fused features are nearly separable.
        loss = torch.nn.functional.cross_entropy(model(x[:half]), labels[:half]) + 1e-3 * model.weight.pow(2).sum()
        loss.backward()
        return loss

    optimizer.step(closure)
    with torch.no_grad():
        return (model(x[half:]).argmax(1) == labels[half:]).float().mean().item()


@pytest.fixture(scope="module")
def features(tmp_path_factory: pytest.TempPathFactory) -> tuple[Tensor, Tensor, Tensor]:
    root = make_industrial(tmp_path_factory.mktemp("learn") / "ds", n_train=320, n_val=0, n_test=0, seed=7)
    items = [item for item in ManifestDataset(root, "train")]
    images = torch.stack([item["image"] for item in items])
    audio = torch.stack([item["audio"] for item in items])
    labels = torch.stack([item["label"] for item in items])
    return blur_feature(images)[:, None], transient_feature(audio)[:, None], labels


def test_each_cue_is_clear_on_its_own(features: tuple[Tensor, Tensor, Tensor]) -> None:
    image, audio, labels = features
    moving, transient = labels // 2, labels % 2
    # One threshold per cue separates its two halves of the classes almost perfectly.
    assert max(((image[:, 0] > t) == (moving == 1)).float().mean().item() for t in image[:, 0]) >= 0.93
    assert max(((audio[:, 0] > t) == (transient == 1)).float().mean().item() for t in audio[:, 0]) >= 0.97


def test_the_label_needs_both_modalities(features: tuple[Tensor, Tensor, Tensor]) -> None:
    image, audio, labels = features
    image_only, audio_only = holdout_accuracy(image, labels), holdout_accuracy(audio, labels)
    fused = holdout_accuracy(torch.cat([image, audio], 1), labels)
    assert image_only <= 0.65 and audio_only <= 0.65, (image_only, audio_only)
    assert fused >= 0.90, fused
