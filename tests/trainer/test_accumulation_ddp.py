"""Gradient accumulation with 2 processes (gloo, launched by `accelerate launch`) equals one process with the
same effective batch: 2 processes x batch 2 x 3 micro-batches train what 1 process x batch 12 trains; inside a
window DDP does not all-reduce (no_sync), at its last micro-batch it does."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest
import torch

from sss.run.launch import launch_command

SCRIPT = Path(__file__).parents[1] / "scripts" / "accumulation_parity.py"


def _run(tmp_path: Path, processes: int, batch: int, accum: int) -> list[dict]:
    out = tmp_path / f"p{processes}_b{batch}_a{accum}"
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    command = launch_command(processes, [str(SCRIPT), str(batch), str(accum), str(out)])
    done = subprocess.run(command, capture_output=True, text=True, timeout=300, env=env)
    assert done.returncode == 0, done.stderr[-3000:]
    return [torch.load(f"{out}.{rank}") for rank in range(processes)]


@pytest.fixture(scope="module")
def two_processes(tmp_path_factory) -> list[dict]:
    return _run(tmp_path_factory.mktemp("accumulation"), 2, batch=2, accum=3)


@pytest.mark.slow
def test_two_processes_with_accumulation_equal_one_process_with_the_whole_batch(two_processes, tmp_path):
    # 56 samples per epoch: windows of 12, 12, 12, 12 and a short last one of 8 samples (rescaled to its real size)
    rank0, rank1 = two_processes
    (single,) = _run(tmp_path, 1, batch=12, accum=1)
    (single_accumulated,) = _run(tmp_path, 1, batch=4, accum=3)
    assert rank0["processes"] == 2 and single["processes"] == 1
    assert rank0["step"] == single["step"] == single_accumulated["step"] == 10  # 5 optimizer steps per epoch
    assert rank0["samples"] == single["samples"] == 112
    assert torch.equal(rank0["params"], rank1["params"]), "the replicas drifted apart"
    for other in (single, single_accumulated):
        torch.testing.assert_close(rank0["params"], other["params"], rtol=1e-5, atol=1e-6)
        assert rank0["lr"] == pytest.approx(other["lr"], rel=1e-12)
    # negative control: another effective batch (4 instead of 12) trains another model, so the test can fail
    (smaller,) = _run(tmp_path, 1, batch=4, accum=1)
    assert (rank0["params"] - smaller["params"]).abs().max() > 1e-3


@pytest.mark.slow
def test_inside_a_window_each_process_keeps_its_own_gradients_and_the_sync_step_all_reduces(two_processes):
    # An all-reduce on every micro-batch (no no_sync) trains the same weights, only slower: the parity test above
    # cannot see it. Each rank's gradients can: its own data's inside a window, the same on both at the sync.
    rank0, rank1 = two_processes
    assert len(rank0["inside"]) == len(rank1["inside"]) == 2 * (4 * 2 + 1)  # 2 epochs of windows 3, 3, 3, 3, 2
    for mine, theirs in zip(rank0["inside"], rank1["inside"], strict=True):
        assert (mine - theirs).abs().max() > 1e-3, "the gradients were all-reduced inside an accumulation window"
    assert len(rank0["synced"]) == len(rank1["synced"]) == 10
    for mine, theirs in zip(rank0["synced"], rank1["synced"], strict=True):
        assert torch.equal(mine, theirs), "the window's last micro-batch did not all-reduce"
