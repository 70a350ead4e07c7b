"""linear_probe: separable and random labels, scikit-learn's figure on the same folds, determinism, refusals."""

from __future__ import annotations

import pytest
import torch

from sss.metrics import linear_probe
from sss.metrics.retrieval import PROBE_L2, _folds


def _blobs(n: int, f: int, classes: int, spread: float, seed: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    labels = torch.arange(n) % classes
    centres = torch.randn(classes, f, generator=g) * spread
    return torch.randn(n, f, generator=g) + centres[labels], labels


def test_separable_features_score_one() -> None:
    features, labels = _blobs(200, 16, 4, spread=10.0)
    assert linear_probe(features, labels) == {"linear_probe/accuracy": 1.0}


def test_labels_independent_of_the_features_score_chance() -> None:
    g = torch.Generator().manual_seed(1)
    features = torch.randn(800, 32, generator=g)
    labels = torch.randint(0, 4, (800,), generator=g)
    assert linear_probe(features, labels)["linear_probe/accuracy"] == pytest.approx(0.25, abs=0.06)


def test_the_same_figure_as_scikit_learn_on_the_same_folds() -> None:
    sklearn = pytest.importorskip("sklearn")
    from sklearn.linear_model import LogisticRegression
    from sklearn.preprocessing import StandardScaler

    assert sklearn
    # Overlapping and with many features per sample: the fit's objective decides (3 x PROBE_L2 moves it by 0.01).
    features, labels = _blobs(200, 30, 4, spread=0.4, seed=5)
    fold = _folds(labels, len(labels), 5, seed=0)
    scores = []
    for f in range(5):
        test, train = (fold == f).numpy(), (fold != f).numpy()
        scaler = StandardScaler().fit(features[train].double().numpy())
        # sklearn minimises C * sum(loss) + |w|^2 / 2; the probe mean(loss) + PROBE_L2 / 2 * |w|^2.
        model = LogisticRegression(C=1 / (PROBE_L2 * train.sum()), tol=1e-10, max_iter=10_000)
        model.fit(scaler.transform(features[train].double().numpy()), labels[train].numpy())
        scores.append(model.score(scaler.transform(features[test].double().numpy()), labels[test].numpy()))
    expected = sum(scores) / 5
    assert 0.5 < expected < 0.95  # neither trivial nor chance
    # Less than one sample of one fold (1/40/5); the probe gets features far from standardised, sklearn the raw ones.
    assert linear_probe(features * 7 + 30, labels)["linear_probe/accuracy"] == pytest.approx(expected, abs=0.004)


def test_multi_hot_labels_give_the_map_of_one_vs_rest_regressions() -> None:
    pytest.importorskip("sklearn")
    from sklearn.linear_model import LogisticRegression
    from sklearn.metrics import average_precision_score
    from sklearn.preprocessing import StandardScaler

    g = torch.Generator().manual_seed(3)
    features = torch.randn(200, 6, generator=g)
    target = (features[:, :3] + torch.randn(200, 3, generator=g) > 0.5).long()  # class k follows feature k
    fold = _folds(None, 200, 5, seed=0)
    held_out = torch.zeros(200, 3, dtype=torch.float64)
    for f in range(5):
        test, train = (fold == f).numpy(), (fold != f).numpy()
        scaler = StandardScaler().fit(features[train].double().numpy())
        for k in range(3):
            model = LogisticRegression(C=1 / (PROBE_L2 * train.sum()), tol=1e-10, max_iter=10_000)
            model.fit(scaler.transform(features[train].double().numpy()), target[train, k].numpy())
            held_out[test, k] = torch.from_numpy(
                model.decision_function(scaler.transform(features[test].double().numpy()))
            )
    expected = sum(average_precision_score(target[:, k], held_out[:, k]) for k in range(3)) / 3
    got = linear_probe(features * 7 + 30, target)
    assert list(got) == ["linear_probe/map"]
    assert 0.6 < got["linear_probe/map"] == pytest.approx(expected, abs=1e-6)  # the same optimum, so the same ranking


def test_deterministic_and_runs_under_no_grad() -> None:
    features, labels = _blobs(120, 8, 3, spread=0.8, seed=4)
    first = linear_probe(features, labels)
    with torch.no_grad():  # as the trainer calls compute_metrics
        assert linear_probe(features, labels) == first
    assert linear_probe(features.clone(), labels.clone(), num_classes=5) == first  # an absent class changes nothing


def test_folds_are_stratified_and_balanced() -> None:
    labels = torch.tensor([0] * 10 + [1] * 25 + [2] * 5)
    fold = _folds(labels, 40, 5, seed=0)
    assert torch.bincount(fold).tolist() == [8] * 5
    for c in range(3):
        counts = torch.bincount(fold[labels == c], minlength=5)
        assert counts.max() - counts.min() <= 1
    assert not torch.equal(fold, _folds(labels, 40, 5, seed=1))


def test_too_little_to_probe_gives_nothing() -> None:
    features, labels = _blobs(9, 4, 2, spread=3.0)
    assert linear_probe(features, labels) == {}  # fewer than 2 x 5 samples
    assert linear_probe(features[:9], torch.zeros(9, dtype=torch.long), folds=2) == {}  # one class
    assert linear_probe(torch.randn(20, 3), torch.zeros(20, 4)) == {}  # multi-hot without a positive


@pytest.mark.parametrize(
    ("features", "labels", "kwargs", "message"),
    [
        (torch.randn(10, 3), torch.zeros(9, dtype=torch.long), {}, r"features \[N, F\] and labels \[N\]"),
        (torch.randn(10, 3), torch.zeros(10), {}, "labels \\[N\\] must be class indices"),
        (torch.randn(10, 3), -torch.ones(10, dtype=torch.long), {}, "must be class indices >= 0"),
        (torch.randn(10, 3), torch.full((10,), 3), {"num_classes": 3}, r"outside \[0, 3\)"),
        (torch.randn(10, 3), torch.full((10, 2), 0.5), {}, "must hold only 0 and 1"),
        (torch.full((10, 3), float("nan")), torch.zeros(10, dtype=torch.long), {}, "NaN or inf"),
        (torch.randn(10, 3), torch.zeros(10, dtype=torch.long), {"folds": 1}, "folds must be >= 2"),
    ],
)
def test_bad_input_is_refused(features: torch.Tensor, labels: torch.Tensor, kwargs: dict, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        linear_probe(features, labels, **kwargs)
