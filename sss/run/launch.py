"""Where ``sss fit``'s process count, precision and accumulation come from, and in which order.

Precedence, highest first: a launch flag (``sss fit --mixed-precision bf16``, or the same flag
given to ``accelerate launch``), the sss YAML or a ``key=value`` override, Accelerate's config
file (``--config-file``, else the one ``accelerate config`` wrote), the sss default.
"""

from __future__ import annotations

import contextlib
import json
import os
import shlex
import sys
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from sss.config import ConfigError
from sss.run._rank_errors import Rerun, launch_ranks, record_rank_error

__all__ = [
    "Rerun",
    "Setting",
    "accelerate_config",
    "apply_launch_settings",
    "child_environment",
    "launch_command",
    "launch_or_run",
    "launcher_argv",
    "launcher_flags",
    "record_rank_error",
    "relaunch",
    "resolve_launch",
    "resolved_overrides",
    "single_process_launch",
]

# sss setting -> (its sss config key, or None when the YAML has none; its key in Accelerate's config file)
KEYS: dict[str, tuple[str | None, str]] = {
    "num_processes": (None, "num_processes"),
    "mixed_precision": ("trainer.mixed_precision", "mixed_precision"),
    "gradient_accumulation_steps": ("trainer.gradient_accumulation_steps", "gradient_accumulation_steps"),
}
DEFAULTS: dict[str, Any] = {"num_processes": 1, "mixed_precision": "auto", "gradient_accumulation_steps": 1}


@dataclass(frozen=True)
class Setting:
    """One resolved launch setting and where its value came from."""

    key: str
    value: Any
    source: str


def accelerate_config(path: str | None = None) -> tuple[dict[str, Any], str | None]:
    """The settings of an Accelerate config file, and its path; ``({}, None)`` when there is none.

    `path` None means Accelerate's default file (``accelerate config`` writes it), used when it
    exists. DeepSpeed's accumulation (``deepspeed_config.gradient_accumulation_steps``) counts as
    the file's accumulation.

    Example:
        >>> accelerate_config("/nonexistent.yaml")  # doctest: +ELLIPSIS
        Traceback (most recent call last):
        ...
        sss.config.errors.ConfigError: --config-file /nonexistent.yaml: no such file (write one with ...)
    """
    given = path is not None
    if path is None:
        from accelerate.commands.config import default_config_file

        if not Path(default_config_file).is_file():
            return {}, None
        path = default_config_file
    elif not Path(path).is_file():
        raise ConfigError(
            f"--config-file {path}: no such file (write one with `accelerate config --config_file {path}`)"
        )
    data = _read_config_file(path, given)
    values = {key: data[key] for key in ("num_processes", "mixed_precision") if data.get(key) is not None}
    deepspeed = data.get("deepspeed_config")
    accumulation = deepspeed.get("gradient_accumulation_steps") if isinstance(deepspeed, dict) else None
    if isinstance(accumulation, int):
        values["gradient_accumulation_steps"] = accumulation
    return values, path


def _read_config_file(path: str, given: bool) -> dict[str, Any]:
    # One line naming the file for anything that is not a mapping of settings: bad YAML or JSON, bytes, a list.
    import yaml

    name = f"--config-file {path}" if given else f"Accelerate's config file {path} (written by `accelerate config`)"
    fix = f"fix it, or write a new one with `accelerate config --config_file {path}`"
    try:
        text = Path(path).read_text(encoding="utf-8")
        data = json.loads(text) if path.endswith(".json") else yaml.safe_load(text)
    except UnicodeDecodeError:
        raise ConfigError(f"{name}: not a text file; {fix}") from None
    except OSError as exc:
        raise ConfigError(f"{name}: cannot be read ({exc.strerror or exc}); {fix}") from None
    except json.JSONDecodeError as exc:
        raise ConfigError(f"{name}: not valid JSON (line {exc.lineno}: {exc.msg}); {fix}") from None
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        where = f"line {mark.line + 1}: " if mark is not None else ""
        problem = getattr(exc, "problem", None) or str(exc).splitlines()[0]
        raise ConfigError(f"{name}: not valid YAML ({where}{problem}); {fix}") from None
    if data is None:
        return {}
    if not isinstance(data, dict):
        raise ConfigError(f"{name}: not an Accelerate config (a mapping of settings, got {type(data).__name__}); {fix}")
    return data


def resolve_launch(
    flags: dict[str, Any],
    explicit: dict[str, Any],
    file_values: dict[str, Any],
    file_name: str | None = None,
) -> list[Setting]:
    """Each launch setting's value by precedence: flag > sss YAML/override > Accelerate config > default.

    Args:
        flags: Launch flags given (None values are "not given").
        explicit: Values the sss YAML or overrides set, by setting name.
        file_values: Accelerate config file values (`accelerate_config`).
        file_name: The config file's path, for the printed source.

    Example:
        >>> for s in resolve_launch(
        ...     {"num_processes": None, "mixed_precision": "bf16"},
        ...     {"mixed_precision": "fp16", "gradient_accumulation_steps": 4},
        ...     {"num_processes": 2, "mixed_precision": "no"}, "default_config.yaml"):
        ...     print(s.key, s.value, s.source)
        num_processes 2 accelerate config default_config.yaml
        mixed_precision bf16 launch flag
        gradient_accumulation_steps 4 sss config
    """
    settings = []
    for key in KEYS:
        if flags.get(key) is not None:
            settings.append(Setting(key, flags[key], "launch flag"))
        elif explicit.get(key) is not None:
            settings.append(Setting(key, explicit[key], "sss config"))
        elif file_values.get(key) is not None:
            settings.append(Setting(key, file_values[key], f"accelerate config {file_name or ''}".strip()))
        else:
            settings.append(Setting(key, DEFAULTS[key], "default"))
    return settings


def launcher_flags(file_values: dict[str, Any]) -> dict[str, Any]:
    """Flags that a user's own ``accelerate launch`` gave this process (read back from its environment).

    The launcher folds its config file and its flags into ``ACCELERATE_MIXED_PRECISION``; a value
    that differs from the config file's (or from "no" without one) can only have come from a flag.

    Example:
        >>> launcher_flags({})  # not launched by accelerate launch
        {}
    """
    flags: dict[str, Any] = {}
    launched = os.environ.get("ACCELERATE_MIXED_PRECISION")
    if launched is not None and launched != str(file_values.get("mixed_precision", "no")):
        flags["mixed_precision"] = launched
    if "WORLD_SIZE" in os.environ and int(os.environ["WORLD_SIZE"]) != file_values.get("num_processes", 1):
        flags["num_processes"] = int(os.environ["WORLD_SIZE"])
    return flags


# Set by launchers that start a process group (torchrun, mpirun, notebook_launcher): this process is one of several.
GROUP_SIZE_VARIABLES = ("WORLD_SIZE", "PMI_SIZE", "OMPI_COMM_WORLD_SIZE", "MV2_COMM_WORLD_SIZE")


def single_process_launch(env: Mapping[str, str] | None = None, argv: list[str] | None = None) -> str | None:
    """Why this process trains alone although the user's ``accelerate launch`` was asked for several; None if not.

    Accelerate's launcher runs the script once, as a plain process, unless ``--multi_gpu`` (or a
    multi-GPU config file, or more than one GPU found) selects torchrun: ``accelerate launch
    --num_processes 2`` on a CPU machine, or with ``--cpu``, trains one process and says nothing.
    The launcher exports ``ACCELERATE_MIXED_PRECISION`` to what it starts, and torchrun or mpirun
    add the group's size (`GROUP_SIZE_VARIABLES`); the processes asked for are read from the
    launcher's command line (`launcher_argv`: the parent process) and its Accelerate config file.
    The answer names the command that starts them all.

    Args:
        env: The environment to judge (default ``os.environ``).
        argv: The launcher's command line (default `launcher_argv`).

    Example:
        >>> env = {"ACCELERATE_MIXED_PRECISION": "no", "MASTER_PORT": "29500"}
        >>> launcher = ["/venv/bin/accelerate", "launch", "--num_processes", "2", "-m", "sss", "fit", "x.yaml"]
        >>> message = single_process_launch(env, launcher)
        >>> message.split(":")[0]
        'accelerate launch was asked for 2 processes but started this one alone'
        >>> message.split("Run: ")[1].split(" (")[0]
        'accelerate launch --multi_gpu --num_processes 2 -m sss fit x.yaml'
        >>> single_process_launch({**env, "WORLD_SIZE": "2"}, launcher) is None  # torchrun started the group
        True
    """
    env = os.environ if env is None else env
    if "ACCELERATE_MIXED_PRECISION" not in env or any(name in env for name in GROUP_SIZE_VARIABLES):
        return None  # not started by `accelerate launch`, or started as one of a group
    tokens = _launch_arguments(launcher_argv() if argv is None else argv)
    if tokens is None:
        return None  # not known what was asked for: the parent is not Accelerate's launcher, or unreadable
    from accelerate.commands.launch import launch_command_parser

    try:
        args, _ = launch_command_parser().parse_known_args(tokens)
    except (SystemExit, ValueError):
        return None
    processes = args.num_processes
    if processes is None:
        processes = accelerate_config(args.config_file)[0].get("num_processes", 1)
    if int(processes) <= 1:
        return None
    return _started_alone(args, tokens, processes)


def _started_alone(args: Any, tokens: list[str], processes: Any) -> str:
    # The message of `single_process_launch`: why, the command that starts them all, and where they would run.
    flags = tokens[: tokens.index(args.training_script)] if args.training_script in tokens else []
    kept = [t for t in flags if t not in ("--cpu", "--multi_gpu", "--multi-gpu")]
    given = any(t.split("=")[0] in ("--num_processes", "--num-processes") for t in kept)
    command = ["accelerate", "launch", "--multi_gpu", *([] if given else ["--num_processes", str(processes)]), *kept]
    command += tokens[len(flags) :]
    why = "with --cpu" if args.cpu else "without --multi_gpu, on a machine with fewer than two GPUs,"
    alternative = ""
    if args.module and args.training_script == "sss":
        sss_args = [*args.training_script_args, "--num-processes", str(processes)]
        alternative = f" (the same as: {shlex.join(['sss', *sss_args])})"
    gpus = _cuda_devices()
    where = (
        f"; this machine has {gpus} GPU(s): add trainer.cpu=true to run the {processes} processes on the CPU"
        if 0 < gpus < int(processes)
        else "; without GPUs (or with trainer.cpu=true) the processes form a gloo group on the CPU"
    )
    return (
        f"accelerate launch was asked for {processes} processes but started this one alone: {why} it runs the "
        f"script once. Run: {shlex.join(command)}{alternative}{where}"
    )


def _cuda_devices() -> int:
    # NVML's count: it leaves CUDA uninitialised (Accelerate's own check does the same).
    import torch
    from accelerate.utils import patch_environment

    with patch_environment(PYTORCH_NVML_BASED_CUDA_CHECK="1"):
        return torch.cuda.device_count() if torch.cuda.is_available() else 0


def launcher_argv() -> list[str] | None:
    """The command line of the process that started this one (Linux ``/proc``); None where it cannot be read.

    Example:
        >>> isinstance(launcher_argv(), (list, type(None)))
        True
    """
    try:
        raw = Path(f"/proc/{os.getppid()}/cmdline").read_bytes()
    except OSError:
        return None
    return [part.decode(errors="replace") for part in raw.split(b"\0") if part]


def _launch_arguments(argv: list[str] | None) -> list[str] | None:
    # `accelerate launch ARGS`, `accelerate-launch ARGS` or `python -m accelerate.commands.launch ARGS`: ARGS.
    for i, token in enumerate(argv or []):
        name = Path(token).name
        if name == "accelerate-launch" or token == "accelerate.commands.launch":
            return argv[i + 1 :]
        if token == "launch" and i > 0 and Path(argv[i - 1]).name == "accelerate":
            return argv[i + 1 :]
    return None


def apply_launch_settings(
    cfg: Any, sources: dict[str, str], flags: dict[str, Any], config_file: str | None, debug: bool
) -> int:
    """Resolve ``sss fit``'s processes, precision and accumulation into `cfg`; print the sources, return the processes.

    `sources` says which keys the YAML or an override set (`sss.config.load_config` fills it).
    Processes that ``sss fit`` launched itself got the resolved values as overrides and only
    apply `debug` (a few batches in fp32 with shapes and anomaly detection, in a folder of its own).
    """
    import dataclasses

    settings = []
    if os.environ.get("SSS_LAUNCH_RESOLVED") != "1":
        problem = single_process_launch()
        if problem is not None:
            raise ConfigError(problem)
        file_values, file_name = accelerate_config(config_file)
        if "ACCELERATE_MIXED_PRECISION" in os.environ:  # started by the user's own `accelerate launch`
            flags = {**launcher_flags(file_values), **{k: v for k, v in flags.items() if v is not None}}
        explicit = {
            "mixed_precision": cfg.trainer.mixed_precision if "trainer.mixed_precision" in sources else None,
            "gradient_accumulation_steps": (
                cfg.trainer.gradient_accumulation_steps if "trainer.gradient_accumulation_steps" in sources else None
            ),
        }
        settings = resolve_launch(flags, explicit, file_values, file_name)
        values = {s.key: s for s in settings}
        try:  # runs TrainerConfig's checks on the new values; a bad one is named with its source
            cfg.trainer = dataclasses.replace(
                cfg.trainer,
                mixed_precision=str(values["mixed_precision"].value),
                gradient_accumulation_steps=int(values["gradient_accumulation_steps"].value),
            )
        except ConfigError as exc:
            sources = "; ".join(f"{s.key} from {s.source}" for s in settings if s.source != "default")
            raise ConfigError(f"{exc} ({sources})") from None
    if debug:
        cfg.trainer = dataclasses.replace(cfg.trainer, fast_dev_run=2, mixed_precision="no")
        cfg.callbacks = [*cfg.callbacks, {"_target_": "sss.callbacks.DebugShapes"}]
        # A folder of its own: runs/<name>_debug (numbered on when taken), or <output_dir>_debug.
        default = cfg.trainer.output_dir == f"runs/{cfg.name}"
        cfg.name = f"{cfg.name}_debug"
        cfg.trainer.output_dir = f"runs/{cfg.name}" if default else f"{cfg.trainer.output_dir}_debug"
    if settings and int(os.environ.get("RANK", "0")) == 0:
        shown = ", ".join(f"{s.key}={s.value} ({s.source})" for s in settings)
        print(f"sss: {shown}" + (" -> --debug: mixed_precision=no" if debug else ""), flush=True)
    return int(next((s.value for s in settings if s.key == "num_processes"), 1))


def resolved_overrides(cfg: Any) -> list[str]:
    """The precision and accumulation `apply_launch_settings` resolved into `cfg`, as overrides for launched ranks.

    Example:
        >>> from sss.config import load_config
        >>> resolved_overrides(load_config(None, ["trainer.gradient_accumulation_steps=4"]))
        ['trainer.mixed_precision=auto', 'trainer.gradient_accumulation_steps=4']
    """
    return [
        f"trainer.mixed_precision={cfg.trainer.mixed_precision}",
        f"trainer.gradient_accumulation_steps={cfg.trainer.gradient_accumulation_steps}",
    ]


def launch_or_run(
    num_processes: int | None, args: list[str], traceback: bool = False, rerun: Rerun | None = None
) -> int | None:
    """Launch or run here: `relaunch` ``sss ARGS`` in N processes and return its exit code; None to run in this process.

    ``sss fit``, ``tune``, ``validate`` and ``test`` relaunch themselves when more than one process is
    asked for and this process is not already one of a launched group (``LOCAL_RANK`` set).

    Example:
        >>> launch_or_run(1, ["fit", "x.yaml"]) is None  # one process: this one runs the command
        True
        >>> launch_or_run(None, ["validate", "--ckpt", "x"]) is None
        True
    """
    if not num_processes or num_processes <= 1 or "LOCAL_RANK" in os.environ:
        return None
    return relaunch(num_processes, args, traceback, rerun)


def relaunch(num_processes: int, args: list[str], traceback: bool = False, rerun: Rerun | None = None) -> int:
    """Run ``sss ARGS`` in `num_processes` processes through Accelerate's launcher, in this process; the exit code.

    The same as ``accelerate launch -m sss ARGS``; the launched processes skip resolving the launch
    settings again (they get them as overrides). A failed rank ends the run with its own line, printed
    once, and its exit code; a rank killed by a signal is named with the newest checkpoint that verifies
    and `rerun`'s command (`sss.run._rank_errors`). With `traceback` (``sss --traceback``, ``SSS_DEBUG=1``)
    the ranks and the launcher show their tracebacks and logs instead.
    """
    from accelerate.commands.launch import launch_command_parser

    cmd = launch_command(num_processes, ["-m", "sss", *args])
    print("sss: launching", " ".join(cmd), flush=True)
    parsed = launch_command_parser().parse_args(cmd[3:])  # after `python -m accelerate.commands.launch`
    env = child_environment()
    if traceback:
        env["SSS_DEBUG"] = "1"
    with _environment(env):  # the launcher gives the processes a copy of this one's
        return launch_ranks(parsed, debug=traceback, rerun=rerun)[0]


@contextlib.contextmanager
def _environment(env: Mapping[str, str]) -> Iterator[None]:
    before = dict(os.environ)
    os.environ.update(env)
    try:
        yield
    finally:
        os.environ.clear()
        os.environ.update(before)


def child_environment(env: Mapping[str, str] | None = None) -> dict[str, str]:
    """The environment of the processes `relaunch` starts: this one's, with the settings they must have at start.

    ``MKL_CBWR`` (MKL reads it when torch loads: one floating-point path in every process) defaults
    to ``AUTO,STRICT``; ``CUBLAS_WORKSPACE_CONFIG`` (``trainer.deterministic``) passes on as it is.

    Example:
        >>> child_environment({"PATH": "/bin"})
        {'PATH': '/bin', 'MKL_CBWR': 'AUTO,STRICT', 'SSS_LAUNCH_RESOLVED': '1'}
        >>> child_environment({"MKL_CBWR": "COMPATIBLE"})["MKL_CBWR"]  # the user's own choice stays
        'COMPATIBLE'
    """
    out = dict(os.environ if env is None else env)
    out.setdefault("MKL_CBWR", "AUTO,STRICT")
    out["SSS_LAUNCH_RESOLVED"] = "1"
    return out


def launch_command(num_processes: int, target: list[str]) -> list[str]:
    """The ``accelerate launch`` command line that runs `target` (a script, or ``-m module``) in N processes.

    Example:
        >>> launch_command(2, ["-m", "sss", "fit", "x.yaml"])[3:6]
        ['--multi_gpu', '--num_processes', '2']
    """
    # --multi_gpu selects torchrun; without GPUs (or with trainer.cpu=true) the processes form a
    # gloo group on the CPU. Accelerate's own --cpu flag would start a single process.
    multi = ["--multi_gpu"] if num_processes > 1 else ["--cpu"]
    common = ["--num_machines", "1", "--mixed_precision", "no", "--dynamo_backend", "no", "--main_process_port", "0"]
    return [
        sys.executable,
        "-m",
        "accelerate.commands.launch",
        *multi,
        "--num_processes",
        str(num_processes),
        *common,
        *target,
    ]
