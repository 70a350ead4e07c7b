"""Pre-flight rendezvous: a launched run whose other process never comes fails within `trainer.rendezvous_timeout`
with one line naming the ranks seen, the master's address and what to check, instead of torch's 30-minute wait."""

from __future__ import annotations

import os
import re
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

CONFIG = """\
name: lonely
model: {_target_: sss.testing.BoringModule}
data: {_target_: sss.testing.BoringDataModule, n_train: 16, n_val: 8, batch_size: 4}
trainer: {max_steps: 2, log: {progress: false, trackers: [], plots: false}}
"""
CHECK = (
    r"Check that every machine runs the same command with the same --num_machines and --num_processes, that "
    r"--main_process_ip \(MASTER_ADDR\) is machine 0's address as the other machines reach it, and that port {port} "
    r"is open between the machines \(firewall\)"
)


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def _one_of_two(rank: int, port: int, command: list[str]) -> tuple[subprocess.CompletedProcess, float]:
    # What torchrun gives each process, for a group of 2 of which only this one ever starts
    env = {**os.environ, "RANK": str(rank), "LOCAL_RANK": "0", "WORLD_SIZE": "2", "LOCAL_WORLD_SIZE": "1"}
    env |= {"MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(port), "OMP_NUM_THREADS": "1", "HF_HOME": "hf"}
    start = time.monotonic()
    # Without the pre-flight, rank 0 waits in init_process_group for 30 minutes: the timeout here fails the test.
    done = subprocess.run(command, env=env, capture_output=True, text=True, timeout=120)
    return done, time.monotonic() - start


@pytest.mark.slow
def test_a_missing_rank_fails_sss_fit_within_the_timeout_naming_the_ranks_seen():
    Path("run.yaml").write_text(CONFIG)
    port = _free_port()
    fit = [sys.executable, "-m", "sss", "fit", "run.yaml", "trainer.rendezvous_timeout=3"]
    done, seconds = _one_of_two(0, port, fit)
    assert done.returncode == 1, done.stderr[-3000:]
    assert seconds < 60
    errors = [line for line in done.stderr.splitlines() if line.strip()]
    assert len(errors) == 1 and "Traceback" not in done.stdout + done.stderr, done.stderr[-3000:]
    assert re.fullmatch(
        rf"error: pre-flight rendezvous: rank 0 of 2 waited 3 s \(trainer\.rendezvous_timeout\) at 127\.0\.0\.1:{port} "
        rf"and saw rank\(s\) 0; missing: 1\. {CHECK.format(port=port)}; a process that failed before it joined "
        r"printed its own error\.",
        errors[0],
    )
    assert not Path("runs/lonely/checkpoints").exists()  # nothing was built or trained


@pytest.mark.slow
def test_an_unreachable_master_fails_within_the_timeout():
    code = "from sss.run.cluster import main, preflight_rendezvous\nwith preflight_rendezvous(2):\n    pass\n"
    port = _free_port()  # nobody serves it
    done, seconds = _one_of_two(1, port, [sys.executable, "-c", code])
    assert done.returncode == 1 and seconds < 60
    assert re.search(
        rf"RendezvousError: pre-flight rendezvous: rank 1 of 2 could not reach the master \(rank 0\) at "
        rf"127\.0\.0\.1:{port} within 2 s \(trainer\.rendezvous_timeout; last: .*Connection refused\)\. "
        rf"{CHECK.format(port=port)}; rank 0's own error, if it started, says more\.",
        done.stderr,
    ), done.stderr[-3000:]


PAIR = """\
import os, sys, time
import torch, torch.distributed as dist
from sss.run.cluster import preflight_rendezvous
if os.environ["RANK"] == "1":
    time.sleep(1.5)  # the other one comes late, within the timeout
with preflight_rendezvous(30):
    dist.init_process_group("gloo")  # served by rank 0's pre-flight store (multi-tenant on MASTER_PORT)
value = torch.tensor([float(os.environ["RANK"]) + 1])
dist.all_reduce(value)
dist.barrier()
dist.destroy_process_group()
print("sum", value.item())
"""


@pytest.mark.slow
def test_processes_that_all_come_pass_and_form_the_process_group():
    port = _free_port()
    procs = []
    for rank in (0, 1):
        env = {**os.environ, "RANK": str(rank), "WORLD_SIZE": "2", "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(port)}
        procs.append(subprocess.Popen([sys.executable, "-c", PAIR], env=env, stdout=subprocess.PIPE, text=True))
    outputs = [proc.communicate(timeout=120)[0] for proc in procs]
    assert [proc.returncode for proc in procs] == [0, 0]
    assert all("sum 3.0" in out for out in outputs), outputs


CHECK_IN = """\
import sys
from sss.run.cluster import RendezvousError, preflight_rendezvous
try:
    with preflight_rendezvous(float(sys.argv[1])):
        pass
except RendezvousError as exc:
    print(exc)
    sys.exit(1)
"""


@pytest.mark.slow
def test_when_rank_0_gives_up_every_process_that_came_reports_its_view():
    port = _free_port()  # 3 processes, rank 2 never comes; rank 1 would wait longer than rank 0
    procs = []
    for rank, timeout in ((0, "3"), (1, "30")):
        env = {**os.environ, "RANK": str(rank), "WORLD_SIZE": "3", "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(port)}
        procs.append(
            subprocess.Popen(
                [sys.executable, "-c", CHECK_IN, timeout],
                env=env,
                stdout=subprocess.PIPE,
                stderr=subprocess.PIPE,
                text=True,
            )
        )
    start = time.monotonic()
    (out0, err0), (out1, err1) = (proc.communicate(timeout=120) for proc in procs)
    assert [proc.returncode for proc in procs] == [1, 1] and time.monotonic() - start < 25
    assert "rank 0 of 3 waited 3 s (trainer.rendezvous_timeout)" in out0 and "saw rank(s) 0-1; missing: 2." in out0
    assert out1.startswith(
        f"pre-flight rendezvous: rank 1 of 3: rank 0 waited its trainer.rendezvous_timeout at 127.0.0.1:{port} and "
        "saw rank(s) 0-1; missing: 2. Check that"
    )
    assert "frame #" not in err0 + err1  # no C++ stack traces from a store that closed under a waiting client
