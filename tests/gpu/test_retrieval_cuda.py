"""Retrieval metrics on a CUDA device equal those on the CPU (planted ties included)."""

from __future__ import annotations

import torch

from sss.metrics import retrieval_metrics


def test_retrieval_on_the_gpu_equals_the_cpu() -> None:
    g = torch.Generator().manual_seed(3)
    image = torch.randint(-1, 2, (50, 3), generator=g).float()  # small integer vectors: exact ties
    audio = torch.randint(-1, 2, (50, 3), generator=g).float() * 2.5
    audio[::7] = image[::7] * 3  # pairs pointing the same way
    ks = (1, 2, 5, 10)
    assert retrieval_metrics(image.cuda(), audio.cuda(), ks=ks) == retrieval_metrics(image, audio, ks=ks)
