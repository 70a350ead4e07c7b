"""Dataset-level classification metrics: single-label (accuracy, top-k, F1) and multi-label (mAP, mAUC, d′, F1).

The functions take the whole evaluation set at once, already gathered from every process with
``accelerator.gather_for_metrics``, and return plain floats ready for a logger. Definitions follow
the literature's definitions: macro-F1 averages over *all* classes with an undefined F1 counted as 0
(sklearn's ``zero_division=0``), mAP averages AP over the classes that have at least one positive.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from statistics import NormalDist

import torch
from torch import Tensor
from torchmetrics.functional.classification import (
    binary_auroc,
    binary_average_precision,
    multiclass_confusion_matrix,
)

__all__ = ["confusion_matrix", "dprime", "multiclass_metrics", "multilabel_metrics"]


def multiclass_metrics(
    scores: Tensor, target: Tensor, *, top_k: Sequence[int] = (5,), class_names: Sequence[str] | None = None
) -> dict[str, float]:
    """Accuracy, top-k accuracy, macro/micro F1 and per-class precision, recall and F1 of a single-label task.

    The prediction is the class with the highest score; among tied scores the lowest class index
    ranks first (as ``argmax`` does), for top-1 and top-k alike, so ``accuracy_top1`` would equal
    ``accuracy``. A class with no true and no predicted sample has precision, recall and F1 0 and
    still counts in ``macro_f1`` (sklearn ``zero_division=0``, ``labels=range(K)``).

    Args:
        scores: Logits or probabilities ``[N, K]``.
        target: True class indices ``[N]`` in ``[0, K)``.
        top_k: Extra ``accuracy_top{k}`` keys, for each ``1 < k < K`` (others are skipped).
        class_names: Names for the per-class keys (default: the class index).

    Returns:
        ``accuracy``, ``accuracy_top{k}``, ``macro_f1``, ``micro_f1`` and per class ``precision/{name}``,
        ``recall/{name}``, ``f1/{name}``.

    Example:
        >>> import torch
        >>> target = torch.tensor([0, 0, 1, 2, 2, 2])
        >>> scores = torch.nn.functional.one_hot(torch.tensor([0, 1, 1, 2, 2, 0]), 3).float()
        >>> m = multiclass_metrics(scores, target, class_names=["dog", "cat", "bird"])
        >>> round(m["accuracy"], 4), round(m["macro_f1"], 4), round(m["f1/bird"], 4)
        (0.6667, 0.6556, 0.8)
    """
    num_classes = _check_scores(scores, "scores")
    if target.shape != scores.shape[:1] or target.is_floating_point():
        raise ValueError(
            f"target must be integer class indices [N] = [{scores.shape[0]}] matching scores [N, K], "
            f"got {target.dtype} of shape {tuple(target.shape)}"
        )
    if target.min() < 0 or target.max() >= num_classes:
        raise ValueError(
            f"target holds class indices outside [0, {num_classes}): min {target.min()}, max {target.max()}"
        )
    names = _class_names(class_names, num_classes)
    rank = _rank_of_target(scores, target)
    out = {"accuracy": (rank < 1).double().mean().item()}
    for k in top_k:
        if 1 < k < num_classes:
            out[f"accuracy_top{k}"] = (rank < k).double().mean().item()
    counts = confusion_matrix(scores.argmax(dim=1), target, num_classes)
    tp = counts.diagonal()
    return out | _f1_metrics(tp, counts.sum(dim=0) - tp, counts.sum(dim=1) - tp, names)


def multilabel_metrics(
    scores: Tensor,
    target: Tensor,
    *,
    threshold: float = 0.5,
    class_names: Sequence[str] | None = None,
    logits: bool = True,
) -> dict[str, float]:
    """mAP, micro-AP, mAUC, d′ and thresholded macro/micro F1 of a multi-label task (AudioSet convention).

    ``map`` is the mean of the non-interpolated AP (sklearn ``average_precision_score``) over the
    classes with at least one positive; the others have no AP and are left out, not counted as 0.
    ``micro_ap`` is the AP of all (sample, class) pairs pooled. ``mauc`` averages ROC AUC over the
    classes with both positives and negatives; ``dprime`` is `dprime` of ``mauc`` (AST and PSLA report
    d′ from the mean AUC, not the mean of per-class d′). A value is ``nan`` when no class qualifies.
    F1 binarises ``sigmoid(scores) >= threshold`` (or ``scores >= threshold`` when ``logits`` is
    false) and, like `multiclass_metrics`, averages over all classes with an undefined F1 set to 0.

    Args:
        scores: Logits (``logits=True``) or probabilities ``[N, K]``.
        target: ``[N, K]`` in {0, 1} (any dtype).
        threshold: Probability at or above which a class is predicted.
        class_names: Names for the per-class keys (default: the class index).
        logits: Whether ``scores`` are logits.

    Returns:
        ``map``, ``micro_ap``, ``mauc``, ``dprime``, ``macro_f1``, ``micro_f1``, ``ap/{name}`` for the
        classes with a positive, ``f1/{name}`` for all.

    Example:
        >>> import torch
        >>> target = torch.tensor([[1, 0, 1], [0, 1, 0], [1, 1, 0], [0, 0, 0]])
        >>> probs = torch.tensor([[0.9, 0.2, 0.1], [0.3, 0.8, 0.4], [0.6, 0.3, 0.2], [0.1, 0.4, 0.3]])
        >>> m = multilabel_metrics(probs, target, logits=False)
        >>> round(m["map"], 4), round(m["micro_ap"], 4), round(m["ap/2"], 4), round(m["macro_f1"], 4)
        (0.6944, 0.7833, 0.25, 0.5556)
        >>> list(m)[:4], round(m["mauc"], 4), round(m["dprime"], 4)
        (['map', 'micro_ap', 'mauc', 'dprime'], 0.5833, 0.2976)
    """
    num_classes = _check_scores(scores, "scores")
    if target.shape != scores.shape:
        raise ValueError(f"target must be [N, K] = {list(scores.shape)} like scores, got shape {tuple(target.shape)}")
    not_binary = (target != 0) & (target != 1)
    if not_binary.any():
        raise ValueError(f"target must hold only 0 and 1 (multi-hot labels), found {target[not_binary][0].item()}")
    names = _class_names(class_names, num_classes)
    truth = target.bool()
    probs = torch.sigmoid(scores.double()) if logits else scores.double()
    pred = probs >= threshold
    tp = (pred & truth).sum(dim=0)
    f1 = _f1_metrics(tp, (pred & ~truth).sum(dim=0), (~pred & truth).sum(dim=0), names)
    f1 = {k: v for k, v in f1.items() if not k.startswith(("precision/", "recall/"))}
    return _ranking_metrics(scores, truth, names) | f1


def dprime(auc: float) -> float:
    """The sensitivity index d′ = √2·Φ⁻¹(AUC) of a ROC AUC (Φ⁻¹: the standard normal quantile).

    The d′ of two unit-variance Gaussians whose ROC curve has this area, as AudioSet papers (AST,
    PSLA) report it beside mAUC. An AUC of 0.5 gives 0, 1.0 gives ``inf`` (0.0 gives ``-inf``), NaN
    gives NaN; JSON writers turn the non-finite values into null.

    Args:
        auc: Area under the ROC curve, in [0, 1] (or NaN).

    Returns:
        d′ as a float.

    Raises:
        ValueError: `auc` is outside [0, 1].

    Example:
        >>> round(dprime(0.9), 4), dprime(0.5), dprime(1.0)
        (1.8124, 0.0, inf)
    """
    auc = float(auc)
    if math.isnan(auc):
        return math.nan
    if not 0.0 <= auc <= 1.0:
        raise ValueError(f"an AUC must be in [0, 1], got {auc}")
    if auc in (0.0, 1.0):  # NormalDist.inv_cdf raises at 0 and 1; the limits are -inf and inf
        return math.copysign(math.inf, auc - 0.5)
    return math.sqrt(2.0) * NormalDist().inv_cdf(auc)


def confusion_matrix(preds: Tensor, target: Tensor, num_classes: int) -> Tensor:
    """Counts ``[K, K]`` of (true class, predicted class) pairs: rows are the true class.

    Args:
        preds: Predicted class indices ``[N]``.
        target: True class indices ``[N]``.
        num_classes: ``K``.

    Returns:
        Long ``[K, K]``; ``cm[i, j]`` counts samples of class ``i`` predicted as ``j``.

    Example:
        >>> import torch
        >>> confusion_matrix(torch.tensor([0, 1, 1, 2]), torch.tensor([0, 0, 1, 2]), 3)
        tensor([[1, 1, 0],
                [0, 1, 0],
                [0, 0, 1]])
    """
    for name, labels in (("preds", preds), ("target", target)):
        if labels.ndim != 1 or labels.is_floating_point():
            raise ValueError(
                f"{name} must be integer class indices [N], got {labels.dtype} of shape {tuple(labels.shape)}"
            )
        if labels.numel() and (labels.min() < 0 or labels.max() >= num_classes):
            raise ValueError(f"{name} holds class indices outside [0, {num_classes})")
    if preds.shape != target.shape:
        raise ValueError(f"preds {tuple(preds.shape)} and target {tuple(target.shape)} must have the same length")
    return multiclass_confusion_matrix(preds, target, num_classes, validate_args=False).long()


def _check_scores(scores: Tensor, name: str) -> int:
    """Validate a ``[N, K]`` score matrix (N >= 1, finite) and return ``K``."""
    if scores.ndim != 2 or scores.shape[0] == 0 or not scores.is_floating_point():
        raise ValueError(
            f"{name} must be floating-point [N, K] with N >= 1, got {scores.dtype} of shape {tuple(scores.shape)}"
        )
    if not torch.isfinite(scores).all():
        raise ValueError(f"{name} contains NaN or inf; metrics on them would be meaningless")
    return scores.shape[1]


def _class_names(class_names: Sequence[str] | None, num_classes: int) -> list[str]:
    if class_names is None:
        return [str(c) for c in range(num_classes)]
    if len(class_names) != num_classes:
        raise ValueError(f"class_names has {len(class_names)} names, expected K = {num_classes}")
    return list(class_names)


def _rank_of_target(scores: Tensor, target: Tensor) -> Tensor:
    """0-based rank of each sample's true class, ties broken towards the lower class index.

    Done by hand because ``torch.topk`` (and so torchmetrics' top-k accuracy) leaves the order of
    tied scores unspecified; a fixed rule keeps top-k accuracy reproducible across devices.
    """
    true_score = scores.gather(1, target[:, None])
    lower_index = torch.arange(scores.shape[1], device=scores.device) < target[:, None]
    return ((scores > true_score) | ((scores == true_score) & lower_index)).sum(dim=1)


def _f1_metrics(tp: Tensor, fp: Tensor, fn: Tensor, names: list[str]) -> dict[str, float]:
    """Macro/micro F1 and per-class precision, recall, F1 from per-class counts; 0/0 counts as 0.

    Computed from counts rather than with torchmetrics' ``average="macro"``, which drops classes
    with TP + FP + FN = 0 from the mean where the usual definition (and sklearn with ``labels``) keeps them as 0.
    """
    tp, fp, fn = tp.double(), fp.double(), fn.double()
    precision, recall, f1 = _ratio(tp, tp + fp), _ratio(tp, tp + fn), _ratio(2 * tp, 2 * tp + fp + fn)
    micro = _ratio(2 * tp.sum(), 2 * tp.sum() + fp.sum() + fn.sum())
    out = {"macro_f1": f1.mean().item(), "micro_f1": micro.item()}
    for c, name in enumerate(names):
        out |= {
            f"precision/{name}": precision[c].item(),
            f"recall/{name}": recall[c].item(),
            f"f1/{name}": f1[c].item(),
        }
    return out


def _ratio(num: Tensor, den: Tensor) -> Tensor:
    return torch.where(den > 0, num / den.clamp(min=1), torch.zeros_like(num))


def _ranking_metrics(scores: Tensor, truth: Tensor, names: list[str]) -> dict[str, float]:
    """``map``, ``micro_ap``, ``mauc``, ``dprime`` and ``ap/{name}`` (classes with a positive only)."""
    # torchmetrics applies a sigmoid to scores outside [0, 1], and a float sigmoid saturates large
    # logits into ties (sigmoid(40.) == 1.0 in float64), which changes AP. AP and AUC only depend on
    # the order of the scores, so hand over dense ranks in [0, 1]: same order, same ties.
    ranks = torch.unique(scores, return_inverse=True)[1].double()
    ranks = ranks / ranks.max().clamp(min=1)
    target = truth.long()
    positives, negatives = truth.sum(dim=0), (~truth).sum(dim=0)
    ap = {c: binary_average_precision(ranks[:, c], target[:, c]).item() for c in range(len(names)) if positives[c] > 0}
    auc = [binary_auroc(ranks[:, c], target[:, c]).item() for c in range(len(names)) if positives[c] and negatives[c]]
    nan = float("nan")
    mauc = sum(auc) / len(auc) if auc else nan
    return {
        "map": sum(ap.values()) / len(ap) if ap else nan,
        "micro_ap": binary_average_precision(ranks.flatten(), target.flatten()).item() if ap else nan,
        "mauc": mauc,
        "dprime": dprime(mauc),
    } | {f"ap/{names[c]}": value for c, value in ap.items()}
