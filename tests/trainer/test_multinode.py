"""Two "machines" on the loopback interface (two `accelerate launch` commands, one process each) train the
same model as one process with the double batch: the multi-node launch of docs/distributed.md, on a CPU."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from sss.run.launch import launch_command

SCRIPTS = Path(__file__).parents[1] / "scripts"
SCRIPT = SCRIPTS / "ddp_parity.py"
# ddp_parity.py ending like `sss fit` (barrier, then destroy the group): see that file for why
NODE_SCRIPT = SCRIPTS / "multinode_parity.py"


def node_command(machine_rank: int, port: int, *target: str) -> list[str]:
    """One machine's command line; --num_processes counts the processes of all machines together."""
    return [
        sys.executable,
        "-m",
        "accelerate.commands.launch",
        "--multi_gpu",  # torchrun; without GPUs the processes form a gloo group on the CPU
        "--num_machines",
        "2",
        "--machine_rank",
        str(machine_rank),
        "--main_process_ip",
        "127.0.0.1",
        "--main_process_port",
        str(port),
        "--num_processes",
        "2",
        "--mixed_precision",
        "no",
        "--dynamo_backend",
        "no",
        *target,
    ]


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


@pytest.mark.slow
def test_two_machines_equal_one_process_with_double_batch(tmp_path):
    nodes_out, single_out = tmp_path / "nodes.pt", tmp_path / "single.pt"
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    port = free_port()
    logs = [tmp_path / f"machine{rank}.log" for rank in (0, 1)]
    nodes = []
    for rank, log in enumerate(logs):  # to files: a full pipe of one machine would stall both
        with log.open("w") as out:
            nodes.append(
                subprocess.Popen(
                    node_command(rank, port, str(NODE_SCRIPT), "4", str(nodes_out)),
                    stdout=out,
                    stderr=subprocess.STDOUT,
                    env=env,
                    start_new_session=True,  # its own process group: a hung machine goes with its workers
                )
            )
    try:
        for node in nodes:
            node.wait(timeout=300)
    finally:
        for node in nodes:
            if node.poll() is None:
                os.killpg(node.pid, signal.SIGKILL)
    for rank, (node, log) in enumerate(zip(nodes, logs, strict=True)):
        assert node.returncode == 0, f"machine {rank}:\n{log.read_text()[-3000:]}"
    cmd = launch_command(1, [str(SCRIPT), "8", str(single_out)])
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=300, env=env)
    assert done.returncode == 0, done.stderr[-3000:]
    ddp, single = torch.load(nodes_out), torch.load(single_out)
    assert ddp["processes"] == 2 and single["processes"] == 1  # one group across both machines
    assert ddp["step"] == single["step"] == ddp["total_steps"] == 12
    assert ddp["samples"] == single["samples"] == 96
    torch.testing.assert_close(ddp["params"], single["params"], rtol=1e-5, atol=1e-6)
    assert ddp["lr"] == pytest.approx(single["lr"], rel=1e-12)
    assert ddp["metrics"]["val/count"] == single["metrics"]["val/count"] == 21
    assert ddp["metrics"]["val/accuracy"] == pytest.approx(single["metrics"]["val/accuracy"])
