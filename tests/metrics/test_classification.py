"""Classification metrics: worked examples from the definitions, and random sets against scikit-learn."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch
from sklearn import metrics as skm

from sss.metrics import confusion_matrix, multiclass_metrics, multilabel_metrics


def test_multiclass_oracle():
    target = torch.tensor([0, 0, 1, 2, 2, 2])
    scores = torch.nn.functional.one_hot(torch.tensor([0, 1, 1, 2, 2, 0]), 3).float()
    m = multiclass_metrics(scores, target, class_names=["a", "b", "c"])
    assert m["accuracy"] == pytest.approx(4 / 6)
    assert [m[f"f1/{c}"] for c in "abc"] == pytest.approx([0.5, 2 / 3, 0.8])
    assert m["macro_f1"] == pytest.approx(0.6556, abs=1e-4)
    assert m["micro_f1"] == pytest.approx(4 / 6)
    assert "accuracy_top5" not in m  # k >= K is skipped


def test_multilabel_oracle():
    target = torch.tensor([[1, 0, 1], [0, 1, 0], [1, 1, 0], [0, 0, 0]])
    probs = torch.tensor([[0.9, 0.2, 0.1], [0.3, 0.8, 0.4], [0.6, 0.3, 0.2], [0.1, 0.4, 0.3]])
    m = multilabel_metrics(probs, target, logits=False)
    assert [m["ap/0"], m["ap/1"], m["ap/2"]] == pytest.approx([1.0, 5 / 6, 0.25])
    assert m["map"] == pytest.approx(0.6944, abs=1e-4)
    assert m["micro_ap"] == pytest.approx(0.7833, abs=1e-4)
    assert [m["f1/0"], m["f1/1"], m["f1/2"]] == pytest.approx([1.0, 2 / 3, 0.0])
    assert m["macro_f1"] == pytest.approx(0.5556, abs=1e-4)
    # the same scores as logits give the same ranking metrics
    logit = multilabel_metrics(torch.logit(probs), target)
    assert logit["map"] == pytest.approx(m["map"]) and logit["macro_f1"] == pytest.approx(m["macro_f1"])


def random_multiclass(seed: int, n: int, k: int, ties: bool):
    gen = torch.Generator().manual_seed(seed)
    scores = torch.randn(n, k, generator=gen, dtype=torch.float64)
    if ties:
        scores = scores.round()  # many tied scores, also for the top class
    target = torch.randint(0, max(1, k - 2), (n,), generator=gen)  # the last classes never occur
    return scores, target


@pytest.mark.parametrize(
    "seed, n, k, ties", [(0, 1, 3, False), (1, 40, 5, False), (2, 200, 10, True), (3, 7, 12, False), (4, 500, 4, True)]
)
def test_multiclass_matches_sklearn(seed, n, k, ties):
    scores, target = random_multiclass(seed, n, k, ties)
    m = multiclass_metrics(scores, target, top_k=(1, 2, 3, 5, k))
    y, s, labels = target.numpy(), scores.numpy(), list(range(k))
    pred = s.argmax(axis=1)  # first maximum, like ours
    assert m["accuracy"] == pytest.approx(skm.accuracy_score(y, pred), abs=1e-6)
    for top in (2, 3, 5):
        if top < k:
            # sklearn breaks ties towards the higher class index, we towards the lower: mirror the classes
            expected = skm.top_k_accuracy_score(k - 1 - y, s[:, ::-1], k=top, labels=labels)
            assert m[f"accuracy_top{top}"] == pytest.approx(expected, abs=1e-6)
    assert {key for key in m if key.startswith("accuracy_top")} == {f"accuracy_top{t}" for t in (2, 3, 5) if t < k}
    precision, recall, f1, _ = skm.precision_recall_fscore_support(y, pred, labels=labels, zero_division=0)
    assert [m[f"precision/{c}"] for c in labels] == pytest.approx(precision, abs=1e-6)
    assert [m[f"recall/{c}"] for c in labels] == pytest.approx(recall, abs=1e-6)
    assert [m[f"f1/{c}"] for c in labels] == pytest.approx(f1, abs=1e-6)
    macro = skm.f1_score(y, pred, labels=labels, average="macro", zero_division=0)
    assert m["macro_f1"] == pytest.approx(macro, abs=1e-6)
    assert m["micro_f1"] == pytest.approx(skm.f1_score(y, pred, labels=labels, average="micro"), abs=1e-6)
    cm = confusion_matrix(torch.from_numpy(pred), target, k)
    assert cm.dtype == torch.long
    np.testing.assert_array_equal(cm.numpy(), skm.confusion_matrix(y, pred, labels=labels))


@pytest.mark.parametrize("seed, n, k, ties", [(0, 30, 4, False), (1, 200, 9, True), (2, 3, 2, False)])
def test_multilabel_matches_sklearn(seed, n, k, ties):
    gen = torch.Generator().manual_seed(seed)
    # large logits: a float sigmoid would turn many of them into tied 1.0s
    scores = 60 * torch.randn(n, k, generator=gen, dtype=torch.float64)
    scores = scores.round(decimals=-1) if ties else scores
    target = (torch.rand(n, k, generator=gen) < 0.3).long()
    target[:, 0] = 0  # a class without positives: no AP, no AUC
    target[:, -1] = 1  # a class without negatives: AP, no AUC
    m = multilabel_metrics(scores, target, threshold=0.4)
    y, s = target.numpy(), scores.numpy()
    with_pos = [c for c in range(k) if y[:, c].any()]
    aps = [skm.average_precision_score(y[:, c], s[:, c]) for c in with_pos]
    assert [m[f"ap/{c}"] for c in with_pos] == pytest.approx(aps, abs=1e-6)
    assert "ap/0" not in m
    assert m["map"] == pytest.approx(np.mean(aps), abs=1e-6)
    assert m["micro_ap"] == pytest.approx(skm.average_precision_score(y, s, average="micro"), abs=1e-6)
    both = [c for c in with_pos if not y[:, c].all()]
    aucs = [skm.roc_auc_score(y[:, c], s[:, c]) for c in both]
    assert m["mauc"] == pytest.approx(np.mean(aucs) if aucs else math.nan, abs=1e-6, nan_ok=True)
    pred = (1 / (1 + np.exp(-s))) >= 0.4
    f1 = skm.f1_score(y, pred, average=None, zero_division=0)
    assert [m[f"f1/{c}"] for c in range(k)] == pytest.approx(f1, abs=1e-6)
    assert m["macro_f1"] == pytest.approx(skm.f1_score(y, pred, average="macro", zero_division=0), abs=1e-6)
    assert m["micro_f1"] == pytest.approx(skm.f1_score(y, pred, average="micro", zero_division=0), abs=1e-6)


def test_multilabel_without_any_positive_has_nan_ranking_metrics():
    m = multilabel_metrics(torch.randn(5, 3), torch.zeros(5, 3), class_names=["x", "y", "z"])
    assert math.isnan(m["map"]) and math.isnan(m["micro_ap"]) and math.isnan(m["mauc"]) and math.isnan(m["dprime"])
    assert m["macro_f1"] == 0.0 and set(m) == {
        "map",
        "micro_ap",
        "mauc",
        "dprime",
        "macro_f1",
        "micro_f1",
        "f1/x",
        "f1/y",
        "f1/z",
    }


@pytest.mark.parametrize(
    "call, message",
    [
        (lambda: multiclass_metrics(torch.rand(5), torch.zeros(5, dtype=torch.long)), r"\[N, K\].*shape \(5,\)"),
        (lambda: multiclass_metrics(torch.rand(5, 3), torch.zeros(4, dtype=torch.long)), r"target must be .*\(4,\)"),
        (lambda: multiclass_metrics(torch.rand(5, 3), torch.zeros(5)), r"target must be integer .*torch.float32"),
        (lambda: multiclass_metrics(torch.rand(2, 3), torch.tensor([0, 3])), r"outside \[0, 3\)"),
        (
            lambda: multiclass_metrics(torch.rand(2, 3), torch.tensor([0, 1]), class_names=["a"]),
            "1 names, expected K = 3",
        ),
        (lambda: multiclass_metrics(torch.full((2, 3), math.nan), torch.tensor([0, 1])), "NaN"),
        (
            lambda: multilabel_metrics(torch.rand(4, 3), torch.zeros(4, 2)),
            r"target must be \[N, K\] = \[4, 3\].*\(4, 2\)",
        ),
        (lambda: multilabel_metrics(torch.rand(4, 3), torch.full((4, 3), 0.5)), "only 0 and 1"),
        (lambda: confusion_matrix(torch.tensor([0, 1]), torch.tensor([0]), 2), r"\(2,\) and target \(1,\)"),
        (lambda: confusion_matrix(torch.tensor([0, 5]), torch.tensor([0, 1]), 2), r"preds holds class indices outside"),
    ],
)
def test_bad_input_is_named(call, message):
    with pytest.raises(ValueError, match=message):
        call()
