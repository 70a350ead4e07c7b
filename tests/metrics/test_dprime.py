"""d′ beside mAUC: √2·Φ⁻¹(mAUC), against an independent reference (scipy's normal quantile, and statistics')."""

from __future__ import annotations

import json
import math
from statistics import NormalDist

import numpy as np
import pytest
import torch
from scipy.stats import norm
from sklearn.metrics import roc_auc_score

from sss.metrics import multilabel_metrics
from sss.metrics.classification import dprime


@pytest.mark.parametrize("auc", [0.5, 0.6, 0.75, 0.9, 0.95, 0.99, 0.3, 1e-6, 1 - 1e-9])
def test_dprime_matches_scipy_and_statistics(auc):
    assert dprime(auc) == pytest.approx(math.sqrt(2) * norm.ppf(auc), rel=1e-9, abs=1e-12)
    assert dprime(auc) == pytest.approx(math.sqrt(2) * NormalDist().inv_cdf(auc), rel=1e-12, abs=1e-12)


def test_dprime_limits_and_bad_input():
    assert dprime(1.0) == math.inf and dprime(0.0) == -math.inf and dprime(0.5) == 0.0
    assert math.isnan(dprime(math.nan))
    with pytest.raises(ValueError, match=r"AUC must be in \[0, 1\], got 1.5"):
        dprime(1.5)


def test_multilabel_metrics_reports_dprime_of_the_mean_auc_right_after_mauc():
    rng = np.random.default_rng(0)
    y = (rng.random((64, 5)) < 0.3).astype(int)
    y[0], y[1] = 1, 0  # every class has a positive and a negative
    s = y * 0.8 + rng.standard_normal((64, 5))
    m = multilabel_metrics(torch.tensor(s), torch.tensor(y))
    keys = list(m)
    assert keys[keys.index("mauc") + 1] == "dprime"
    mean_auc = np.mean([roc_auc_score(y[:, c], s[:, c]) for c in range(5)])
    assert m["dprime"] == pytest.approx(math.sqrt(2) * norm.ppf(mean_auc), abs=1e-6)
    # From the mean AUC, not the mean of per-class d' (the two differ whenever the AUCs do).
    per_class = np.mean([math.sqrt(2) * norm.ppf(roc_auc_score(y[:, c], s[:, c])) for c in range(5)])
    assert abs(m["dprime"] - per_class) > 1e-4


def test_multilabel_metrics_dprime_nan_without_auc_and_inf_when_perfect():
    none = multilabel_metrics(torch.randn(5, 3), torch.zeros(5, 3))
    assert math.isnan(none["mauc"]) and math.isnan(none["dprime"])
    target = torch.tensor([[1, 0], [0, 1], [1, 1], [0, 0]])
    perfect = multilabel_metrics(target.double() * 4 - 2, target)
    assert perfect["mauc"] == 1.0 and perfect["dprime"] == math.inf


def test_non_finite_dprime_is_written_as_null_by_sss_evaluate():
    from sss.run.folder import json_safe

    text = json.dumps(json_safe({"val/dprime": math.inf, "val/mauc": math.nan, "val/map": 0.5}))
    assert json.loads(text) == {"val/dprime": None, "val/mauc": None, "val/map": 0.5}
