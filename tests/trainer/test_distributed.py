"""Two CPU processes (gloo, launched by `accelerate launch`) with per-process batch b train the same
model as one process with batch 2b."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest
import torch

from sss.run.launch import launch_command

SCRIPT = Path(__file__).parents[1] / "scripts" / "ddp_parity.py"


def launch(nproc: int, *args: str, timeout: int = 300) -> subprocess.CompletedProcess:
    """Run a script in fresh processes (never fork a process that already ran torch ops)."""
    cmd = launch_command(nproc, list(args))
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    return subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, env=env)


@pytest.mark.slow
def test_two_processes_equal_one_process_with_double_batch(tmp_path):
    ddp_out, single_out = tmp_path / "ddp.pt", tmp_path / "single.pt"
    done = launch(2, str(SCRIPT), "4", str(ddp_out))
    assert done.returncode == 0, done.stderr[-3000:]
    done = launch(1, str(SCRIPT), "8", str(single_out))
    assert done.returncode == 0, done.stderr[-3000:]
    ddp, single = torch.load(ddp_out), torch.load(single_out)
    assert ddp["processes"] == 2 and single["processes"] == 1
    assert ddp["step"] == single["step"] == ddp["total_steps"] == 12
    assert ddp["samples"] == single["samples"] == 96
    torch.testing.assert_close(ddp["params"], single["params"], rtol=1e-5, atol=1e-6)
    # the schedule stepped once per optimizer step, not once per process (Accelerate #2926)
    assert ddp["lr"] == pytest.approx(single["lr"], rel=1e-12)
    # gather_for_metrics dropped the sampler's padding: 21 samples, not 24
    assert ddp["metrics"]["val/count"] == single["metrics"]["val/count"] == 21
    assert ddp["metrics"]["val/accuracy"] == pytest.approx(single["metrics"]["val/accuracy"])
