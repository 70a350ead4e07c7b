"""The embedded default trains end to end: fused accuracy >= 0.95, each modality alone >= 30 points below."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

EXAMPLE = Path(__file__).parents[2] / "examples" / "industrial.yaml"


@pytest.mark.slow
def test_default_industrial_run_meets_its_promise(tmp_path):
    env = {**os.environ, "SSS_CACHE": str(tmp_path / "cache")}
    cmd = [sys.executable, "-m", "sss", "fit", str(EXAMPLE), "trainer.log.progress=false"]
    done = subprocess.run(cmd, cwd=tmp_path, capture_output=True, text=True, timeout=900, env=env)
    assert done.returncode == 0, done.stderr[-4000:]
    results = json.loads((tmp_path / "runs" / "industrial" / "results.json").read_text())
    fused = results["val/accuracy"]
    assert fused >= 0.95, results
    assert results["val/accuracy_image_only"] <= fused - 0.30, results
    assert results["val/accuracy_audio_only"] <= fused - 0.30, results
    assert results["val/macro_f1"] >= 0.9
