"""Cluster launches: SLURM's (and PyTorchJob's) variables -> accelerate launch arguments, the job script's
requeue, SIGUSR1 -> save and the requeue exit code -> a requeued `--resume auto` run that continues bitwise."""

from __future__ import annotations

import os
import re
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch
from accelerate.commands.launch import launch_command_parser
from safetensors.torch import load_file

from sss.checkpoint import complete_checkpoints
from sss.run.cluster import REQUEUE_EXIT_CODE, ClusterError, env_launch_args, first_host, slurm_launch_args
from sss.testing import subprocess_env

ROOT = Path(__file__).parents[2]
SBATCH = ROOT / "examples" / "slurm" / "train.sbatch"
SCRIPTS = ROOT / "tests" / "scripts"  # fit_pause.py: the Pause callback and a model with dropout

# What SLURM sets in the task of node 1 of `sbatch --nodes=2 --gpus-per-node=4` (job 4242 on gpu-a07, gpu-a08)
TWO_NODES = {
    "SLURM_JOB_ID": "4242",
    "SLURM_NNODES": "2",
    "SLURM_NODEID": "1",
    "SLURM_PROCID": "1",
    "SLURM_JOB_NODELIST": "gpu-a[07-08]",
    "SLURM_GPUS_ON_NODE": "4",
}


def _parsed(args: list[str]):
    return launch_command_parser().parse_args([*args, "-m", "sss", "fit", "x.yaml", "--resume", "auto"])


def test_a_two_node_slurm_allocation_resolves_to_the_accelerate_launch_arguments():
    args = slurm_launch_args(TWO_NODES)
    assert args == [
        "--multi_gpu",
        "--num_machines",
        "2",
        "--machine_rank",
        "1",
        "--main_process_ip",
        "gpu-a07",
        "--main_process_port",
        str(15000 + 4242 % 15000),
        "--num_processes",
        "8",
        "--dynamo_backend",
        "no",
    ]
    launch = _parsed(args)  # what Accelerate's own parser makes of them
    assert (launch.num_machines, launch.machine_rank, launch.num_processes) == (2, 1, 8)
    assert (launch.main_process_ip, launch.main_process_port, launch.multi_gpu) == ("gpu-a07", 19242, True)
    assert launch.training_script_args == ["fit", "x.yaml", "--resume", "auto"]
    # node 0 of the same job: the same command but its rank; the script's MASTER_ADDR / MASTER_PORT win
    node0 = {**TWO_NODES, "SLURM_NODEID": "0", "MASTER_ADDR": "10.0.0.7", "MASTER_PORT": "29400"}
    launch = _parsed(slurm_launch_args(node0, rendezvous_timeout=120))
    assert (launch.machine_rank, launch.main_process_ip, launch.main_process_port) == (0, "10.0.0.7", 29400)
    assert launch.rdzv_conf == "timeout=120"


@pytest.mark.parametrize(
    ("gpus", "processes"),
    [
        ({"SLURM_GPUS_PER_NODE": "a100:2"}, 4),
        ({"SLURM_GPUS_PER_NODE": "2"}, 4),
        ({"SLURM_JOB_GPUS": "0,1,2"}, 6),
    ],
)
def test_the_gpus_per_node_come_from_any_of_slurms_variables(gpus, processes):
    env = {k: v for k, v in TWO_NODES.items() if k != "SLURM_GPUS_ON_NODE"} | gpus
    assert _parsed(slurm_launch_args(env)).num_processes == processes


def test_one_process_in_all_is_a_plain_launch():
    env = {**TWO_NODES, "SLURM_NNODES": "1", "SLURM_NODEID": "0", "SLURM_GPUS_ON_NODE": "1"}
    launch = _parsed(slurm_launch_args(env))
    assert (launch.num_processes, launch.multi_gpu) == (1, False)


def test_missing_or_inconsistent_variables_are_named():
    with pytest.raises(ClusterError, match=r"^SLURM_NODEID is not set: run this inside the job"):
        slurm_launch_args({k: v for k, v in TWO_NODES.items() if k != "SLURM_NODEID"})
    with pytest.raises(ClusterError, match=r"machine rank 2 is not below the machine count 2"):
        slurm_launch_args({**TWO_NODES, "SLURM_NODEID": "2"})
    with pytest.raises(ClusterError, match=r"SLURM_NNODES='two' is not a whole number"):
        slurm_launch_args({**TWO_NODES, "SLURM_NNODES": "two"})


def test_first_host_of_a_slurm_host_list():
    assert first_host("gpu-a[07-08]") == "gpu-a07"
    assert first_host("n[1,3-4],m2") == "n1"
    assert first_host("login") == "login"


def test_the_master_addr_world_size_rank_contract():
    # Kubernetes' PyTorchJob, one launcher per pod: WORLD_SIZE pods, RANK this pod's index
    pod = {"MASTER_ADDR": "job-master-0", "MASTER_PORT": "23456", "WORLD_SIZE": "3", "RANK": "2"}
    launch = _parsed(env_launch_args(pod, gpus=4))
    assert (launch.num_machines, launch.machine_rank, launch.num_processes) == (3, 2, 12)
    assert (launch.main_process_ip, launch.main_process_port) == ("job-master-0", 23456)
    # the operator's torchrun variables win; NPROC_PER_NODE wins over the GPUs found
    pet = {**pod, "PET_NNODES": "2", "PET_NODE_RANK": "1", "PET_NPROC_PER_NODE": "8"}
    launch = _parsed(env_launch_args(pet, gpus=4))
    assert (launch.num_machines, launch.machine_rank, launch.num_processes) == (2, 1, 16)


def _fake_slurm(tmp_path: Path, srun_code: int) -> tuple[dict[str, str], Path]:
    # srun and scontrol stand-ins: srun records its command line and exits with srun_code
    bin_dir, log = tmp_path / "bin", tmp_path / "calls.txt"
    bin_dir.mkdir()
    (bin_dir / "srun").write_text(f'#!/bin/bash\necho "srun MASTER_ADDR=$MASTER_ADDR $*" >> {log}\nexit {srun_code}\n')
    (bin_dir / "scontrol").write_text(
        f'#!/bin/bash\necho "scontrol $*" >> {log}\n[ "$1 $2" = "show hostnames" ] && printf "gpu-a07\\ngpu-a08\\n"\n'
        "exit 0\n"
    )
    for tool in ("srun", "scontrol"):
        (bin_dir / tool).chmod(0o755)
    env = {**os.environ, **TWO_NODES, "SLURM_NODEID": "0", "PATH": f"{bin_dir}:{os.environ['PATH']}"}
    return env, log


@pytest.mark.parametrize(
    ("srun_code", "requeued", "code"), [(REQUEUE_EXIT_CODE, True, 0), (0, False, 0), (1, False, 1)]
)
def test_the_job_script_requeues_exactly_on_the_requeue_code(tmp_path, srun_code, requeued, code):
    env, log = _fake_slurm(tmp_path, srun_code)
    done = subprocess.run(
        ["bash", str(SBATCH), "examples/industrial.yaml", "trainer.max_epochs=20"],
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == code, done.stderr
    calls = log.read_text().splitlines()
    assert calls[0] == "scontrol show hostnames gpu-a[07-08]"
    assert calls[1] == (
        "srun MASTER_ADDR=gpu-a07 --ntasks-per-node=1 --kill-on-bad-exit=0 python -m sss.run.cluster launch "
        "--source slurm --rendezvous-timeout 300 -m sss fit examples/industrial.yaml --resume auto "
        "trainer.max_epochs=20"
    )
    assert (calls[2:] == ["scontrol requeue 4242"]) is requeued
    script = SBATCH.read_text()
    assert f"REQUEUE_EXIT_CODE={REQUEUE_EXIT_CODE}\n" in script  # the script's code is sss's
    assert re.search(r"^#SBATCH --signal=USR1@\d+$", script, re.M) and "#SBATCH --requeue\n" in script


# ---------------------------------------------------------------- SIGUSR1 -> save, requeue code, continue

CONFIG = """\
name: job
model: {_target_: fit_pause.DropoutBoring}
data: {_target_: sss.testing.BoringDataModule, n_train: 32, n_val: 8, batch_size: 4}
trainer:
  max_steps: 10
  gradient_accumulation_steps: 2
  log: {progress: false, trackers: [], plots: false}
  checkpoint: {every_n_steps: null, keep_last: 2}
"""


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def _job(cwd: Path, *words: str, machines: int = 1, timeout: str = "300") -> subprocess.Popen:
    # one SLURM task: `python -m sss.run.cluster launch` as examples/slurm/train.sbatch runs it under srun
    cwd.mkdir(parents=True, exist_ok=True)
    (cwd / "run.yaml").write_text(CONFIG)
    slurm = {**TWO_NODES, "SLURM_NNODES": str(machines), "SLURM_NODEID": "0", "SLURM_GPUS_ON_NODE": "1"}
    env = subprocess_env(SCRIPTS, **slurm, MASTER_ADDR="127.0.0.1", MASTER_PORT=str(_free_port()))  # the checkout's sss
    env |= {"MKL_CBWR": "AUTO,STRICT", "OMP_NUM_THREADS": "1", "HF_HOME": str(cwd / "hf")}
    command = [sys.executable, "-m", "sss.run.cluster", "launch", "--source", "slurm", "--rendezvous-timeout", timeout]
    command += ["-m", "sss", "fit", "run.yaml", "--resume", "auto", *words]
    log = (cwd / "output.txt").open("ab")
    return subprocess.Popen(command, cwd=cwd, env=env, stdout=log, stderr=subprocess.STDOUT)


def _output(cwd: Path) -> str:
    return (cwd / "output.txt").read_text()


def _weights(cwd: Path) -> dict[str, torch.Tensor]:
    return load_file(str(cwd / "runs" / "job" / "model" / "model.safetensors"))


@pytest.mark.slow
def test_sigusr1_mid_step_saves_exits_with_the_requeue_code_and_the_requeued_job_continues_bitwise(tmp_path):
    straight, job = tmp_path / "straight", tmp_path / "job"
    assert _job(straight).wait(timeout=180) == 0, _output(straight)[-3000:]
    # epoch 1 has 4 steps of 2 micro-batches: after batch 2 the run is inside the window of step 6
    first = _job(job, 'callbacks=[{_target_: fit_pause.Pause, at: "1:2"}]')
    deadline = time.monotonic() + 120
    while not (job / "runs" / "job" / "paused").exists():
        assert first.poll() is None, _output(job)[-3000:]
        assert time.monotonic() < deadline, "the run did not reach the pause"
        time.sleep(0.02)
    first.send_signal(signal.SIGUSR1)  # to the launcher alone (its process group, as SLURM's proctrack/pgid does)
    assert first.wait(timeout=120) == REQUEUE_EXIT_CODE, _output(job)[-3000:]
    out = _output(job)
    assert "sss: stopped by SIGUSR1 after step 6; checkpoint saved to runs/job/checkpoints/step_0000006." in out
    assert f"Exit code {REQUEUE_EXIT_CODE} asks the job script to requeue the job" in out
    assert complete_checkpoints(job / "runs" / "job" / "checkpoints")[-1].name == "step_0000006"
    # the requeued job: the same command (the pause was the test's, callbacks are neutral in a resume)
    assert _job(job).wait(timeout=180) == 0, _output(job)[-3000:]
    assert "sss: --resume auto: using runs/job/checkpoints/step_0000006, the newest checkpoint that verifies" in (
        _output(job)
    )
    a, b = _weights(job), _weights(straight)
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a), "weights differ from the straight run"


@pytest.mark.slow
def test_a_machine_that_never_comes_fails_the_launch_within_the_timeout(tmp_path):
    # machine 0 of 2, and machine 1 never starts: torchrun's agent would wait 600 s, then print a traceback
    start = time.monotonic()
    proc = _job(tmp_path / "alone", machines=2, timeout="3")
    assert proc.wait(timeout=120) == 1
    assert time.monotonic() - start < 60
    lines = [line for line in _output(tmp_path / "alone").splitlines() if line.startswith("error:")]
    assert len(lines) == 1 and "Traceback" not in _output(tmp_path / "alone")
    assert re.fullmatch(
        r"error: machine rendezvous: machine 0 of 2 did not meet the others at 127\.0\.0\.1:\d+ within 3 s "
        r"\(Timed out after \d+ seconds waiting for clients\. 1/2 clients joined\)\. Check that every machine runs "
        r"the same command with the same --num_machines and --num_processes, .*firewall\); --rendezvous-timeout S "
        r"sets the wait",
        lines[0],
    )


CHILD = """\
import signal, sys, time
from pathlib import Path
if sys.argv[1] == "handles-sigterm":
    signal.signal(signal.SIGTERM, lambda signum, frame: (print("got SIGTERM", flush=True), sys.exit(143)))
Path("ready").write_text("")
time.sleep(60)
"""


@pytest.mark.parametrize(
    ("mode", "signum", "code"),
    [
        ("handles-sigterm", signal.SIGTERM, 143),  # a pod's eviction reaches the launcher only: passed on, waited for
        ("plain", signal.SIGUSR1, REQUEUE_EXIT_CODE),  # a SIGUSR1 before training set its handler: requeue all the same
    ],
)
def test_the_launcher_passes_signals_on_and_ends_with_the_processs_code(tmp_path, mode, signum, code):
    (tmp_path / "child.py").write_text(CHILD)
    env = {**os.environ, "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(_free_port()), "WORLD_SIZE": "1", "RANK": "0"}
    env |= {"NPROC_PER_NODE": "1", "HF_HOME": str(tmp_path / "hf")}
    command = [sys.executable, "-m", "sss.run.cluster", "launch", "--source", "env", "child.py", mode]
    proc = subprocess.Popen(command, cwd=tmp_path, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    deadline = time.monotonic() + 60
    while not (tmp_path / "ready").exists():
        assert proc.poll() is None and time.monotonic() < deadline, proc.communicate()[0]
        time.sleep(0.02)
    proc.send_signal(signum)
    out = proc.communicate(timeout=60)[0]
    assert proc.returncode == code, out
    assert ("got SIGTERM" in out) is (signum == signal.SIGTERM)
