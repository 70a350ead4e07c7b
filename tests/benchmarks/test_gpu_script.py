"""benchmarks/gpu.py, the one prepared device script, works before a GPU is at hand: its CPU dry run."""

from __future__ import annotations

import json

import pytest
import torch


@pytest.fixture
def gpu(benchmark_script):
    return benchmark_script("gpu")


def test_dry_run_writes_every_row_with_figures(gpu, tmp_path, capsys):
    out = tmp_path / "gpu.json"
    result = gpu.main(["--dry-run", "--out", str(out)])
    written = json.loads(out.read_text())
    assert written["rows"] == json.loads(json.dumps(result["rows"]))
    assert written["dry_run"] is True and written["gpu_tests"] == {"skipped": "--dry-run"}
    assert [r["variant"] for r in written["rows"]] == ["base", "checkpointing", "channels_last"]
    for row in written["rows"]:
        assert "error" not in row, row
        assert row["plain_samples_per_s"] > 0 and row["sss_samples_per_s"] > 0 and row["time_ratio"] > 0
    assert written["rows"][0]["syncs_per_step"] is not None  # the host-sync probe ran on the base row
    printed = capsys.readouterr().out
    assert "| hunter_tiny | no | checkpointing |" in printed


def test_a_failing_row_is_recorded_not_raised(gpu):
    args = gpu.argparse.Namespace(steps=1, warm=1, batch_size=2, probe_steps=0)
    row = gpu.run_row({"model": "hunter_huge", "precision": "no", "variant": "base"}, args, torch.device("cpu"), 30)
    assert row["model"] == "hunter_huge" and "hunter_huge" in row["error"]
    assert "| hunter_huge | no | base | - |" in gpu.markdown([row], "today")[2]
