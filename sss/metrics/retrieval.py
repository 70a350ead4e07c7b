"""Metrics of self-supervised audio-visual embeddings: cross-modal retrieval (R@k, median rank) and a linear probe.

Both take the whole validation split at once (gathered from every process), keep no state and return
plain floats under ``retrieval/...`` and ``linear_probe/...``. Definitions, costs and failure cases:
docs/metrics.md.
"""

from __future__ import annotations

import statistics
from collections.abc import Sequence

import torch
from torch import Tensor

from sss.metrics.classification import multilabel_metrics

__all__ = ["linear_probe", "retrieval_metrics"]

CHUNK_ELEMENTS = 1 << 24
"""Similarities held at once by `retrieval_metrics` (64 MB of float32): query rows per chunk = this // N."""

TIE_TOLERANCE = 1e-6
"""Cosine similarities closer than this are tied in `retrieval_metrics` (float32 rounding is about 1e-7 per term)."""

PROBE_L2 = 1e-3
"""The probe's L2 penalty on the weights, per training sample: loss = mean cross-entropy + PROBE_L2 / 2 · |W|²."""

PROBE_ITERATIONS = 100
"""L-BFGS iterations of each fold's fit: a fixed budget, so that the probe costs the same at every validation."""


def retrieval_metrics(
    image: Tensor, audio: Tensor, ks: Sequence[int] = (1, 5, 10), *, chunk_size: int | None = None
) -> dict[str, float]:
    """Cross-modal retrieval of paired embeddings: recall at k and median rank, each way, by cosine similarity.

    Row i of `image` and row i of `audio` are a pair. For ``audio_to_image`` the query is audio i and
    the candidates are all N images; the rank of the query is 1 + the number of *other* images whose
    similarity is ``>=`` that of image i (less ``TIE_TOLERANCE``). Ties therefore count against the
    query: a collapsed model (every embedding equal) ranks every pair last, R@1 = 0, not 1. ``R@k``
    is the fraction of queries with rank <= k (1.0 when k >= N); chance is k / N. The median rank is
    1-based, the mean of the two middle ranks when N is even. An all-zero row has no direction: its
    similarities are all 0.

    The similarities are computed in float32 on the inputs' device, a chunk of query rows at a time
    (`chunk_size` rows; by default as many as fit ``CHUNK_ELEMENTS``), never N x N at once; the
    result does not depend on the chunk size. Fewer than 2 pairs give ``{}``: with one candidate every
    query is trivially right, and a logged R@1 of 1.0 would be a lie.

    Args:
        image: Image embeddings ``[N, D]``, any scale.
        audio: Audio embeddings ``[N, D]``, paired row by row with `image`.
        ks: The k of each ``_r{k}`` key, each >= 1.
        chunk_size: Query rows per chunk (for tests and memory limits).

    Returns:
        ``retrieval/audio_to_image_r{k}``, ``retrieval/image_to_audio_r{k}`` for each k, and
        ``retrieval/audio_to_image_median_rank``, ``retrieval/image_to_audio_median_rank``.

    Example:
        >>> import torch
        >>> image = torch.eye(4)
        >>> audio = torch.eye(4)[[0, 1, 3, 2]]  # pairs 2 and 3 swapped: their own similarity 0 ties with 2 others
        >>> m = retrieval_metrics(image, audio, ks=(1, 5))
        >>> m["retrieval/audio_to_image_r1"], m["retrieval/audio_to_image_r5"]
        (0.5, 1.0)
        >>> m["retrieval/audio_to_image_median_rank"]  # ranks 1, 1, 4, 4
        2.5
        >>> retrieval_metrics(torch.ones(3, 2), torch.ones(3, 2), ks=(1, 3))["retrieval/image_to_audio_r1"]
        0.0
    """
    _check_pairs(image, audio)
    if any(int(k) != k or k < 1 for k in ks):
        raise ValueError(f"ks must be whole numbers >= 1 (the k of recall at k), got {list(ks)}")
    if chunk_size is not None and chunk_size < 1:
        raise ValueError(f"chunk_size must be >= 1 query rows, got {chunk_size}")
    n = image.shape[0]
    if n < 2:
        return {}
    with torch.no_grad():
        image = torch.nn.functional.normalize(image.detach().float(), dim=1)
        audio = torch.nn.functional.normalize(audio.detach().float(), dim=1)
        rows = chunk_size or max(1, CHUNK_ELEMENTS // n)
        out: dict[str, float] = {}
        for name, queries, candidates in (("audio_to_image", audio, image), ("image_to_audio", image, audio)):
            ranks = _ranks(queries, candidates, rows).cpu()
            for k in ks:
                out[f"retrieval/{name}_r{k}"] = (ranks <= k).double().mean().item()
            out[f"retrieval/{name}_median_rank"] = float(statistics.median(ranks.tolist()))
    return out


def _ranks(queries: Tensor, candidates: Tensor, rows: int) -> Tensor:
    """1-based rank of each query's own candidate (row i of both), ties against the query, `rows` queries at a time."""
    ranks = []
    for start in range(0, queries.shape[0], rows):
        sims = queries[start : start + rows] @ candidates.T  # [rows, N]
        own = torch.arange(start, start + sims.shape[0], device=sims.device)
        true = sims[torch.arange(sims.shape[0], device=sims.device), own]
        # The own candidate counts itself (1 + the others). Within TIE_TOLERANCE is a tie: float32 rounds
        # mathematically equal cosines (a collapsed model, duplicate rows) a few ulps apart, by device and chunk.
        ranks.append((sims >= true[:, None] - TIE_TOLERANCE).sum(dim=1))
    return torch.cat(ranks)


def _check_pairs(image: Tensor, audio: Tensor) -> None:
    if image.ndim != 2 or audio.ndim != 2 or image.shape != audio.shape:
        raise ValueError(
            f"image and audio must be paired embeddings [N, D] of the same shape, "
            f"got image {tuple(image.shape)} and audio {tuple(audio.shape)}"
        )
    for name, x in (("image", image), ("audio", audio)):
        if x.is_floating_point() and not torch.isfinite(x).all():
            raise ValueError(
                f"{name} embeddings contain NaN or inf (a diverged model?); retrieval on them is meaningless"
            )


def linear_probe(
    features: Tensor, labels: Tensor, num_classes: int | None = None, folds: int = 5, seed: int = 0
) -> dict[str, float]:
    """How linearly the frozen `features` predict `labels`: cross-validated logistic regression on the given samples.

    The samples are split into `folds` folds by a permutation seeded with `seed` (stratified by class
    for class indices: each class is dealt round the folds). For each fold, the other folds' features
    are standardised with their own mean and std, and a logistic regression with a small L2 penalty
    (``PROBE_L2``) is fitted by full-batch L-BFGS in float64 on the CPU for ``PROBE_ITERATIONS``
    iterations from zero weights; so the figure is deterministic. The held-out fold is scored with
    the same standardisation.

    * class indices ``[N]``: softmax regression; ``linear_probe/accuracy`` is the mean held-out accuracy
      over the folds. A class with fewer samples than `folds` still counts (its rare held-out samples
      are hard to get right).
    * multi-hot ``[N, K]``: one sigmoid per class; ``linear_probe/map`` is the mAP (as
      `sss.metrics.multilabel_metrics`) of the held-out scores of every sample, pooled over the folds.

    Returns ``{}`` when there is nothing to probe: fewer than ``2 * folds`` samples (a fold could not
    train on more than it tests), fewer than 2 classes present, or (multi-hot) no class with both
    positive and negative samples.

    Args:
        features: Frozen features ``[N, F]``.
        labels: Class indices ``[N]``, or multi-hot ``[N, K]`` of 0 and 1.
        num_classes: K for class indices (default: the largest index + 1).
        folds: Cross-validation folds, >= 2.
        seed: Seed of the fold assignment.

    Example:
        >>> import torch
        >>> labels = torch.arange(40) % 2
        >>> features = torch.randn(40, 3, generator=torch.Generator().manual_seed(0)) + 4 * labels[:, None]
        >>> linear_probe(features, labels)
        {'linear_probe/accuracy': 1.0}
    """
    multi = _check_probe(features, labels, num_classes, folds)
    x = features.detach().cpu().double()
    y = labels.detach().cpu().double() if multi else labels.detach().cpu().long()
    varied = bool(((y > 0).any(0) & (y == 0).any(0)).any()) if multi else y.unique().numel() >= 2
    if len(x) < 2 * folds or not varied:
        return {}
    fold = _folds(None if multi else y, len(x), folds, seed)
    classes = y.shape[1] if multi else max(num_classes or 0, int(y.max()) + 1)
    held_out = _out_of_fold(x, y, fold, classes, multi)
    if multi:
        return {"linear_probe/map": multilabel_metrics(held_out, y.long())["map"]}
    hits = (held_out.argmax(1) == y).double()
    return {"linear_probe/accuracy": sum(hits[fold == f].mean().item() for f in range(folds)) / folds}


def _out_of_fold(x: Tensor, y: Tensor, fold: Tensor, classes: int, multi: bool) -> Tensor:
    """The held-out logits [N, K] of every sample, from the regression fitted on the other folds."""
    held_out = torch.zeros(len(x), classes, dtype=torch.float64)
    for f in range(int(fold.max()) + 1):
        test = fold == f
        train = x[~test]
        # The training fold's own statistics (ddof 0, as sklearn's StandardScaler): nothing leaks from the test fold.
        mean, std = train.mean(0), train.std(0, correction=0).clamp_min(1e-12)
        weight, bias = _fit((train - mean) / std, y[~test], classes, multi)
        held_out[test] = (x[test] - mean) / std @ weight + bias
    return held_out


def _folds(y: Tensor | None, n: int, folds: int, seed: int) -> Tensor:
    """The fold of each sample: a seeded permutation dealt round the folds, class by class when `y` is given."""
    order = torch.randperm(n, generator=torch.Generator().manual_seed(seed))
    if y is not None:  # stable sort: within a class the permutation's order stays, so the deal is stratified
        order = order[torch.sort(y[order], stable=True).indices]
    fold = torch.empty(n, dtype=torch.long)
    fold[order] = torch.arange(n) % folds
    return fold


def _fit(x: Tensor, y: Tensor, classes: int, multi: bool) -> tuple[Tensor, Tensor]:
    """Logistic regression on standardised `x`: (weight [F, K], bias [K]), full-batch L-BFGS, L2 on the weight only."""
    weight = torch.zeros(x.shape[1], classes, dtype=torch.float64, requires_grad=True)
    bias = torch.zeros(classes, dtype=torch.float64, requires_grad=True)
    optimizer = torch.optim.LBFGS(
        [weight, bias],
        lr=1.0,
        max_iter=PROBE_ITERATIONS,
        history_size=10,
        tolerance_grad=1e-9,
        tolerance_change=1e-12,
        line_search_fn="strong_wolfe",
    )
    loss_of = torch.nn.functional.binary_cross_entropy_with_logits if multi else torch.nn.functional.cross_entropy

    def closure() -> Tensor:
        optimizer.zero_grad()
        # Summed over classes, meaned over samples: each sigmoid is the one-vs-rest regression of its class alone.
        loss = loss_of(x @ weight + bias, y, reduction="sum") / x.shape[0] + PROBE_L2 / 2 * weight.square().sum()
        loss.backward()
        return loss

    optimizer.step(closure)  # LBFGS runs the closure with grad enabled: fine under the trainer's no_grad
    return weight.detach(), bias.detach()


def _check_probe(features: Tensor, labels: Tensor, num_classes: int | None, folds: int) -> bool:
    """Check the probe's inputs; True for multi-hot labels."""
    if features.ndim != 2 or labels.ndim not in (1, 2) or labels.shape[0] != features.shape[0]:
        raise ValueError(
            f"linear_probe needs features [N, F] and labels [N] (class indices) or [N, K] (multi-hot) with the "
            f"same N, got features {tuple(features.shape)} and labels {tuple(labels.shape)}"
        )
    if not features.is_floating_point():
        raise ValueError(f"features must be floating-point [N, F], got {features.dtype}")
    if not torch.isfinite(features).all():
        raise ValueError("features contain NaN or inf (a diverged model?); a probe on them is meaningless")
    if folds < 2:
        raise ValueError(f"folds must be >= 2 (cross-validation), got {folds}")
    if labels.ndim == 2:
        if not ((labels == 0) | (labels == 1)).all():
            raise ValueError("multi-hot labels [N, K] must hold only 0 and 1")
        return True
    if labels.is_floating_point() or (labels.numel() and labels.min() < 0):
        raise ValueError(f"labels [N] must be class indices >= 0, got {labels.dtype}, min {labels.min()}")
    if num_classes is not None and labels.numel() and labels.max() >= num_classes:
        raise ValueError(f"labels hold class indices outside [0, {num_classes}): max {labels.max()}")
    return False
