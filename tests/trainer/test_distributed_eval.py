"""Two-process evaluation of 21 samples in batches of 4 equals one-process evaluation (no padded duplicates)."""

from __future__ import annotations

import math
import os
import subprocess
from pathlib import Path

import pytest
import torch

from sss.run.launch import launch_command

SCRIPT = Path(__file__).parents[1] / "scripts" / "eval_parity.py"


def launch(nproc: int, *args: str) -> subprocess.CompletedProcess:
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    return subprocess.run(launch_command(nproc, list(args)), capture_output=True, text=True, timeout=300, env=env)


@pytest.mark.slow
def test_two_process_metrics_equal_one_process_metrics(tmp_path):
    outs = {n: tmp_path / f"eval{n}.pt" for n in (1, 2)}
    for n, out in outs.items():
        done = launch(n, str(SCRIPT), str(out))
        assert done.returncode == 0, done.stderr[-3000:]
    one, two = (torch.load(outs[n], weights_only=False) for n in (1, 2))
    assert (one["processes"], two["processes"]) == (1, 2)
    a, b = one["result"], two["result"]
    assert a["samples"] == b["samples"] == 21
    assert a["confusion_matrix"] == b["confusion_matrix"] and sum(map(sum, a["confusion_matrix"])) == 21
    for part in ("metrics", "image_only", "audio_only"):
        left = a["metrics"] if part == "metrics" else a["ablation"][part]
        right = b["metrics"] if part == "metrics" else b["ablation"][part]
        # An absent modality's dense task is not scored: no event metrics without audio, no BER without the image.
        expected = {"metrics": {"event_f1", "segment_er", "ber"}, "image_only": {"ber"}, "audio_only": {"event_f1"}}
        assert set(left) == set(right) and {"accuracy", *expected[part]} <= set(left)
        assert not {"image_only": {"event_f1"}, "audio_only": {"ber"}}.get(part, set()) & set(left)
        for key, value in left.items():
            both_nan = math.isnan(value) and math.isnan(right[key])
            assert both_nan or math.isclose(value, right[key], rel_tol=0, abs_tol=1e-6), key
