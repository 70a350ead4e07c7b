"""Running ``sss fit`` on a cluster: launch arguments from the scheduler, requeue on a time-limit warning, pre-flight.

- `slurm_launch_args` / `env_launch_args`: the ``accelerate launch`` arguments of this machine, from SLURM's
  variables or from ``MASTER_ADDR``, ``MASTER_PORT``, ``WORLD_SIZE`` and ``RANK`` (Kubernetes' PyTorchJob,
  SkyPilot, any scheduler that sets them); ``examples/slurm/train.sbatch`` uses them.
- `launch`: ``accelerate launch`` with those arguments, in this process, passing SIGUSR1 on to the training
  processes and exiting with `REQUEUE_EXIT_CODE` when they stopped on it (Accelerate's launcher exits 1 on any
  failure of its processes, which would hide the code the job script requeues on).
- `preflight_rendezvous`: before anything is built, every process of a launched run checks in with the master's
  store, with a deadline; a missing process ends the run with an error naming the ranks seen.

``python -m sss.run.cluster slurm-args | env-args | launch ... | requeue-code`` runs them from a job script.
"""

from __future__ import annotations

import argparse
import contextlib
import itertools
import os
import re
import shlex
import signal
import socket
import sys
import time
from collections.abc import Iterator, Mapping
from datetime import timedelta
from typing import Any

from sss.callbacks.checkpoint import REQUEUE_EXIT_CODE
from sss.errors import SSSError
from sss.run._rank_errors import Rerun, launch_ranks

__all__ = [
    "REQUEUE_EXIT_CODE",
    "ClusterError",
    "RendezvousError",
    "env_launch_args",
    "first_host",
    "launch",
    "main",
    "preflight_rendezvous",
    "slurm_launch_args",
]

_CHECK = (
    "Check that every machine runs the same command with the same --num_machines and --num_processes, that "
    "--main_process_ip (MASTER_ADDR) is machine 0's address as the other machines reach it, and that port {port} "
    "is open between the machines (firewall)"
)


class ClusterError(SSSError):
    """The scheduler's variables do not describe a launch, or the machines did not meet; the message says why."""


class RendezvousError(SSSError):
    """A process of a launched run did not meet the others within ``trainer.rendezvous_timeout``."""


def first_host(nodelist: str) -> str:
    """The first host of a SLURM host list (what ``scontrol show hostnames LIST | head -n 1`` prints).

    Example:
        >>> first_host("gpu[07-09,12],cpu01"), first_host("node1,node2"), first_host("rack[2-3]-n[010-011]")
        ('gpu07', 'node1', 'rack2-n010')
    """
    item = re.split(r",(?![^\[]*\])", nodelist.strip())[0]
    return re.sub(r"\[([^\]]*)\]", lambda m: m.group(1).split(",")[0].split("-")[0], item)


def slurm_launch_args(env: Mapping[str, str] | None = None, rendezvous_timeout: float | None = None) -> list[str]:
    """The ``accelerate launch`` arguments of this SLURM task (one task per node, each starting that node's processes).

    Machines: ``SLURM_NNODES``; this machine: ``SLURM_NODEID``; machine 0's address: ``MASTER_ADDR``, else the first
    host of ``SLURM_JOB_NODELIST``; the port: ``MASTER_PORT``, else 15000 + the job id modulo 15000 (two jobs
    sharing a node get different ports, below Linux's ephemeral range); processes per node: the GPUs SLURM gave
    the node (``SLURM_GPUS_ON_NODE``, ``SLURM_GPUS_PER_NODE``, ``SLURM_JOB_GPUS``), else those present, at least 1.
    `rendezvous_timeout` bounds how long machine 0's launcher waits for the others (torchrun's default: 600 s).

    Example:
        >>> env = {"SLURM_JOB_ID": "4242", "SLURM_NNODES": "2", "SLURM_NODEID": "1",
        ...        "SLURM_JOB_NODELIST": "gpu[07-08]", "SLURM_GPUS_ON_NODE": "4"}
        >>> " ".join(slurm_launch_args(env))
        '--multi_gpu --num_machines 2 --machine_rank 1 --main_process_ip gpu07 --main_process_port 19242 --num_processes 8 --dynamo_backend no'
    """  # noqa: E501
    env = os.environ if env is None else env
    machines = _int(env, "SLURM_NNODES", "SLURM_JOB_NUM_NODES")
    rank = _int(env, "SLURM_NODEID")
    address = env.get("MASTER_ADDR") or first_host(_need(env, "SLURM_JOB_NODELIST"))
    port = int(env["MASTER_PORT"]) if env.get("MASTER_PORT") else 15000 + _int(env, "SLURM_JOB_ID") % 15000
    per_node = _slurm_gpus(env)
    return _accelerate_args(machines, rank, address, port, per_node, rendezvous_timeout)


def env_launch_args(
    env: Mapping[str, str] | None = None, gpus: int | None = None, rendezvous_timeout: float | None = None
) -> list[str]:
    """The ``accelerate launch`` arguments from ``MASTER_ADDR``, ``MASTER_PORT``, ``WORLD_SIZE`` and ``RANK``.

    Here ``WORLD_SIZE`` counts the machines (pods, nodes) and ``RANK`` is this machine's index, as Kubernetes'
    PyTorchJob sets them for one launcher per pod (``PET_NNODES`` and ``PET_NODE_RANK`` win when set). Processes
    per machine: ``NPROC_PER_NODE`` (or ``PET_NPROC_PER_NODE``), else `gpus`, else the GPUs present, at least 1.

    Example:
        >>> env = {"MASTER_ADDR": "trainer-master-0", "MASTER_PORT": "23456", "WORLD_SIZE": "2", "RANK": "0"}
        >>> " ".join(env_launch_args(env, gpus=8))
        '--multi_gpu --num_machines 2 --machine_rank 0 --main_process_ip trainer-master-0 --main_process_port 23456 --num_processes 16 --dynamo_backend no'
    """  # noqa: E501
    env = os.environ if env is None else env
    machines = _int(env, "PET_NNODES", "WORLD_SIZE")
    rank = _int(env, "PET_NODE_RANK", "RANK")
    address, port = _need(env, "MASTER_ADDR"), int(env.get("MASTER_PORT") or 29500)
    per_node = env.get("NPROC_PER_NODE") or env.get("PET_NPROC_PER_NODE")
    count = int(per_node) if per_node else (gpus if gpus is not None else _gpus_present())
    return _accelerate_args(machines, rank, address, port, count, rendezvous_timeout)


def _accelerate_args(
    machines: int, rank: int, address: str, port: int, per_node: int, rendezvous_timeout: float | None
) -> list[str]:
    if not 0 <= rank < machines:
        raise ClusterError(f"machine rank {rank} is not below the machine count {machines}: the variables disagree")
    total = machines * max(per_node, 1)
    # --multi_gpu selects torchrun (also for a CPU-only gloo group); one process in all is a plain one.
    # Precision is left to sss (the YAML, or Accelerate's config file): a flag here would outrank the YAML.
    args = ["--multi_gpu"] if total > 1 else []
    args += ["--num_machines", str(machines), "--machine_rank", str(rank), "--main_process_ip", address]
    args += ["--main_process_port", str(port), "--num_processes", str(total), "--dynamo_backend", "no"]
    if rendezvous_timeout is not None:
        args += ["--rdzv_conf", f"timeout={max(1, round(rendezvous_timeout))}"]  # torchrun's static rendezvous
    return args


def _need(env: Mapping[str, str], name: str) -> str:
    value = env.get(name)
    if not value:
        raise ClusterError(
            f"{name} is not set: run this inside the job (srun in an sbatch script, or the pod's command), "
            "where the scheduler sets it"
        )
    return value


def _int(env: Mapping[str, str], *names: str) -> int:
    name = next((n for n in names if env.get(n)), names[-1])
    value = _need(env, name)
    try:
        return int(value)
    except ValueError:
        raise ClusterError(f"{name}={value!r} is not a whole number") from None


def _slurm_gpus(env: Mapping[str, str]) -> int:
    if env.get("SLURM_GPUS_ON_NODE"):
        return int(env["SLURM_GPUS_ON_NODE"])
    per_node = env.get("SLURM_GPUS_PER_NODE", "")  # "4" or "a100:4"
    if re.fullmatch(r"(\w+:)*\d+", per_node):
        return int(per_node.rsplit(":", 1)[-1])
    listed = env.get("SLURM_JOB_GPUS") or env.get("SLURM_STEP_GPUS")
    return len(listed.split(",")) if listed else _gpus_present()


def _gpus_present() -> int:
    # NVML's count: it leaves CUDA uninitialised in the launcher, whose children use the GPUs.
    import torch
    from accelerate.utils import patch_environment

    with patch_environment(PYTORCH_NVML_BASED_CUDA_CHECK="1"):
        return torch.cuda.device_count() if torch.cuda.is_available() else 0


def launch(
    target: list[str], source: str = "auto", rendezvous_timeout: float = 300, env: Mapping[str, str] | None = None
) -> int:
    """Run ``accelerate launch ARGS TARGET`` for this machine (ARGS from `source`); return the exit code to end with.

    `source` is ``slurm`` (`slurm_launch_args`), ``env`` (`env_launch_args`) or ``auto`` (slurm inside a SLURM
    job). The launcher runs in this process, which passes a SIGUSR1 (and, for one process, a SIGTERM: a pod's
    eviction reaches its first process only) on to the training processes (torchrun starts each in a session of
    its own, out of reach of a signal to this one's process group; it passes SIGTERM on itself). When a training
    process stopped on SIGUSR1 (saved; or killed by it before training began) the code is `REQUEUE_EXIT_CODE`;
    otherwise the failed process's own code (128 + N for signal N), after its own ``error:`` line, printed once
    (`sss.run._rank_errors`; torchrun's logs and traceback show with ``SSS_DEBUG=1`` only). A machine that did
    not meet the others within `rendezvous_timeout` is a `ClusterError` that says what to check. `env` (default
    ``os.environ``) is where the arguments come from.

    Example:
        >>> launch(["-m", "sss", "fit", "x.yaml"], source="env", env={"WORLD_SIZE": "2", "RANK": "0"})
        Traceback (most recent call last):
        ...
        sss.run.cluster.ClusterError: MASTER_ADDR is not set: run this inside the job (srun in an sbatch script, ...
    """
    env = os.environ if env is None else env
    if source == "auto":
        source = "slurm" if env.get("SLURM_JOB_ID") else "env"
    find = slurm_launch_args if source == "slurm" else env_launch_args
    args = find(env, rendezvous_timeout=rendezvous_timeout)
    from accelerate.commands.launch import launch_command_parser
    from torch.distributed import DistError

    print(f"sss: accelerate launch {shlex.join([*args, *target])}", flush=True)
    parsed = launch_command_parser().parse_args([*args, *target])
    if parsed.machine_rank > 0:  # machine 0's launcher serves the rendezvous: wait for it without torch's noise
        unreachable = _unreachable(
            parsed.main_process_ip, parsed.main_process_port, time.monotonic() + rendezvous_timeout
        )
        if unreachable is not None:
            raise ClusterError(_machine_rendezvous_failed(args, rendezvous_timeout, unreachable))
    forwarded = [getattr(signal, name) for name in ("SIGUSR1", "SIGTERM") if hasattr(signal, name)]
    previous = {signum: signal.signal(signum, _forward_to_children) for signum in forwarded}
    debug = env.get("SSS_DEBUG", "") not in ("", "0")
    try:  # a failed process: its own line, once (a signal to the agent: a pod's eviction, scancel, is passed on)
        code, codes = launch_ranks(parsed, debug=debug, rerun=_rerun(target))
    except DistError as exc:  # torchrun's rendezvous of the machines, before any training process started
        raise ClusterError(_machine_rendezvous_failed(args, rendezvous_timeout, exc)) from None
    finally:
        for signum, handler in previous.items():
            signal.signal(signum, handler)
    return _exit_code([code, *codes.values()]) if code else 0


def _rerun(target: list[str]) -> Rerun | None:
    # `-m sss fit ...`: a lost process is reported with the newest checkpoint (its folder comes from the others'
    # records) and how to continue: the job again, with --resume (the job script's `--resume auto`)
    return Rerun(None, None) if target[:3] in (["-m", "sss", "fit"], ["-m", "sss", "pretrain"]) else None


def _forward_to_children(signum: int, frame: Any) -> None:
    import psutil

    for child in psutil.Process().children():
        with contextlib.suppress(psutil.Error):
            child.send_signal(signum)


def _exit_code(codes: list[int]) -> int:
    # The first code (the failed process's own), unless one asks for a requeue; Popen's and torchrun's codes are
    # negative for a process ended by a signal.
    if any(code in (REQUEUE_EXIT_CODE, 128 - REQUEUE_EXIT_CODE) for code in codes):  # saved, or killed by SIGUSR1
        return REQUEUE_EXIT_CODE
    first = next((code for code in codes if code), 1)
    return first if first > 0 else 128 - first


def _machine_rendezvous_failed(args: list[str], timeout: float, exc: BaseException) -> str:
    value = dict(itertools.pairwise(args))  # each flag -> the word after it
    machines, rank = value["--num_machines"], value["--machine_rank"]
    address, port = value["--main_process_ip"], value["--main_process_port"]
    first = (str(exc).strip().splitlines() or [""])[0].rstrip(".")
    return (
        f"machine rendezvous: machine {rank} of {machines} did not meet the others at {address}:{port} within "
        f"{timeout:g} s ({first}). {_CHECK.format(port=port)}; --rendezvous-timeout S sets the wait"
    )


def _ranks(ranks: list[int]) -> str:
    # 0-3,5: short for a thousand ranks
    parts, start = [], None
    for i, rank in enumerate(ranks):
        if start is None:
            start = rank
        if i + 1 == len(ranks) or ranks[i + 1] != rank + 1:
            parts.append(str(start) if start == rank else f"{start}-{rank}")
            start = None
    return ",".join(parts) or "none"


@contextlib.contextmanager
def preflight_rendezvous(timeout: float, env: Mapping[str, str] | None = None) -> Iterator[None]:
    """Every process of a launched run checks in with the master's store before anything is built; else an error.

    A process of a run launched through environment variables (``RANK``, ``WORLD_SIZE`` > 1, ``MASTER_ADDR``,
    ``MASTER_PORT``: torchrun, ``accelerate launch``, a notebook's forks, a scheduler) waits at most `timeout`
    seconds for all the others. Without it, the wait for a missing process happens inside
    ``torch.distributed.init_process_group`` (rank 0's store waits for every client; the others retry their
    connection) under the process group's timeout, 30 minutes, and then ends in a traceback; with NCCL it comes
    later still, at the first collective. A process that misses the deadline raises `RendezvousError`: the ranks
    it saw, the address and port it used, what to check. The check is a key per rank in a ``TCPStore``, the one
    torchrun's agent serves, or else rank 0's own on MASTER_PORT; rank 0's is multi-tenant and kept open for
    the body of the ``with``, so that the process group's rendezvous (in the body) is served by it.

    Example:
        >>> with preflight_rendezvous(5, env={}):  # one process: nothing to wait for
        ...     pass
    """
    env = os.environ if env is None else env
    world = int(env.get("WORLD_SIZE") or 1)
    if world <= 1 or not env.get("RANK") or not env.get("MASTER_ADDR") or not env.get("MASTER_PORT"):
        yield
        return
    import torch.distributed as dist

    if dist.is_available() and dist.is_initialized():
        yield
        return
    store = _check_in(int(env["RANK"]), world, env["MASTER_ADDR"], int(env["MASTER_PORT"]), timeout, env)
    try:
        yield
    finally:
        del store


def _check_in(rank: int, world: int, address: str, port: int, timeout: float, env: Mapping[str, str]) -> Any:
    from torch.distributed import DistError

    who = f"pre-flight rendezvous: rank {rank} of {world}"
    check = _CHECK.format(port=port)
    deadline = time.monotonic() + timeout
    serve = rank == 0 and env.get("TORCHELASTIC_USE_AGENT_STORE") != "True"  # else torchrun's agent serves it
    unreachable = None if serve else _unreachable(address, port, deadline)
    if unreachable is not None:
        raise RendezvousError(
            f"{who} could not reach the master (rank 0) at {address}:{port} within {timeout:g} s "
            f"(trainer.rendezvous_timeout; last: {unreachable}). {check}; rank 0's own error, if it started, says more."
        )
    store = _open_store(who, address, port, serve, deadline)
    prefix = f"sss/preflight/{env.get('TORCHELASTIC_RUN_ID', '')}/{env.get('TORCHELASTIC_RESTART_COUNT', '0')}/"
    verdict, told = f"{prefix}verdict", f"{prefix}told"
    try:
        store.set(f"{prefix}{rank}", socket.gethostname())
        arrived = store.add(f"{prefix}count", 1)
        while arrived < world:
            if store.check([verdict]):  # rank 0 gave up: its view, for every process alike
                seen, missing = store.get(verdict).decode().split(" ")
                store.add(told, 1)
                raise RendezvousError(
                    f"{who}: rank 0 waited its trainer.rendezvous_timeout at {address}:{port} and saw rank(s) {seen}; "
                    f"missing: {missing}. {check}."
                )
            if time.monotonic() >= deadline:
                seen = [r for r in range(world) if store.check([f"{prefix}{r}"])]
                missing = sorted(set(range(world)) - set(seen))
                if rank == 0:  # tell the others, and let them read it before this store may close
                    store.set(verdict, f"{_ranks(seen)} {_ranks(missing)}")
                    until = time.monotonic() + 3
                    while store.add(told, 0) < len(seen) - 1 and time.monotonic() < until:
                        time.sleep(0.05)
                raise RendezvousError(
                    f"{who} waited {timeout:g} s (trainer.rendezvous_timeout) at {address}:{port} and saw rank(s) "
                    f"{_ranks(seen)}; missing: {_ranks(missing)}. {check}; a process that failed before it "
                    "joined printed its own error."
                )
            time.sleep(0.05)
            arrived = store.add(f"{prefix}count", 0)
    except DistError as exc:
        first = (str(exc).strip().splitlines() or [""])[0]
        raise RendezvousError(
            f"{who} lost the master's store at {address}:{port} ({first}): rank 0 failed, and its error says why. "
            f"{check}."
        ) from None
    return store


def _open_store(who: str, address: str, port: int, serve: bool, deadline: float) -> Any:
    # The TCPStore of the check-in: served here (rank 0 without torchrun's agent), else joined at address:port.
    from torch.distributed import DistError, TCPStore

    try:
        return TCPStore(
            address,
            port,
            None,  # no count of clients to wait for: the keys below say who came
            serve,
            timedelta(seconds=max(1.0, deadline - time.monotonic())),
            wait_for_workers=False,
            multi_tenant=True,  # the process group's rendezvous on this port, in this process, shares the server
        )
    except DistError as exc:
        first = (str(exc).strip().splitlines() or [""])[0]
        if serve:
            raise RendezvousError(
                f"{who} could not serve the rendezvous on port {port} ({first}): another program (an earlier "
                "run still going?) holds it; choose another --main_process_port (MASTER_PORT)"
            ) from None
        raise RendezvousError(
            f"{who} could not join the master's store at {address}:{port} ({first}). {_CHECK.format(port=port)}."
        ) from None


def _unreachable(address: str, port: int, deadline: float) -> OSError | None:
    # Why address:port took no connection until the deadline; None once it does. A plain connection:
    # TCPStore's own retries print a C++ stack trace per attempt.
    while True:
        try:
            socket.create_connection((address, port), timeout=1).close()
            return None
        except OSError as exc:
            if time.monotonic() >= deadline:
                return exc
            time.sleep(0.2)


def main(argv: list[str] | None = None) -> int:
    """``python -m sss.run.cluster COMMAND``: what a job script runs (see ``examples/slurm/train.sbatch``).

    Commands: ``slurm-args`` / ``env-args`` print this machine's ``accelerate launch`` arguments; ``launch
    [--source slurm|env|auto] [--rendezvous-timeout S] TARGET...`` runs the launcher (`launch`) and exits with
    its code; ``requeue-code`` prints `REQUEUE_EXIT_CODE`. Errors are one ``error:`` line.

    Example:
        >>> main(["requeue-code"])
        138
        0
    """
    argv = list(sys.argv[1:] if argv is None else argv)
    p = argparse.ArgumentParser(prog="python -m sss.run.cluster", description=main.__doc__)
    sub = p.add_subparsers(dest="command", required=True)
    for name in ("slurm-args", "env-args"):
        sub.add_parser(name).add_argument("--rendezvous-timeout", type=float, default=None)
    run = sub.add_parser("launch", usage="python -m sss.run.cluster launch [options] TARGET... (e.g. -m sss fit X)")
    run.add_argument("--source", choices=["auto", "slurm", "env"], default="auto")
    run.add_argument("--rendezvous-timeout", type=float, default=300)
    sub.add_parser("requeue-code")
    # TARGET starts at the first word that is not one of launch's own options (its `-m` is the launcher's)
    own = 1
    while (
        argv[:1] == ["launch"] and own < len(argv) and argv[own].split("=")[0] in ("--source", "--rendezvous-timeout")
    ):
        own += 1 if "=" in argv[own] else 2
    head, target = (argv[:own], argv[own:]) if argv[:1] == ["launch"] else (argv, [])
    args = p.parse_args(head)
    try:
        if args.command == "requeue-code":
            print(REQUEUE_EXIT_CODE)
            return 0
        if args.command in ("slurm-args", "env-args"):
            find = slurm_launch_args if args.command == "slurm-args" else env_launch_args
            print(shlex.join(find(rendezvous_timeout=args.rendezvous_timeout)))
            return 0
        if not target:
            p.error("launch: name what to run, e.g. -m sss fit CONFIG --resume auto")
        return launch(target, args.source, args.rendezvous_timeout)
    except SSSError as exc:
        print(f"error: {exc}", file=sys.stderr, flush=True)
        return exc.exit_code


if __name__ == "__main__":
    raise SystemExit(main())
