"""Where ``sss fit``'s process count, precision and accumulation come from, and in which order.

Precedence, highest first: a launch flag (``sss fit --mixed-precision bf16``, or the same flag
given to ``accelerate launch``), the sss YAML or a ``key=value`` override, Accelerate's config
file (``--config-file``, else the one ``accelerate config`` wrote), the sss default.
"""

from __future__ import annotations

import json
import os
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from sss.config import ConfigError

__all__ = [
    "Setting",
    "accelerate_config",
    "apply_launch_settings",
    "launch_command",
    "launcher_flags",
    "relaunch",
    "resolve_launch",
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
    import yaml

    if path is None:
        from accelerate.commands.config import default_config_file

        if not Path(default_config_file).is_file():
            return {}, None
        path = default_config_file
    elif not Path(path).is_file():
        raise ConfigError(
            f"--config-file {path}: no such file (write one with `accelerate config --config_file {path}`)"
        )
    text = Path(path).read_text(encoding="utf-8")
    data = (json.loads(text) if path.endswith(".json") else yaml.safe_load(text)) or {}
    if not isinstance(data, dict):
        raise ConfigError(f"--config-file {path}: not an Accelerate config (a mapping of settings)")
    values = {key: data[key] for key in ("num_processes", "mixed_precision") if data.get(key) is not None}
    accumulation = (data.get("deepspeed_config") or {}).get("gradient_accumulation_steps")
    if isinstance(accumulation, int):
        values["gradient_accumulation_steps"] = accumulation
    return values, path


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


def relaunch(num_processes: int, args: list[str]) -> int:
    """Run ``sss ARGS`` in `num_processes` processes through Accelerate's launcher; its exit code.

    The same as ``accelerate launch -m sss ARGS``; the launched processes skip resolving the
    launch settings again (they get them as overrides).
    """
    import subprocess

    cmd = launch_command(num_processes, ["-m", "sss", *args])
    print("sss: launching", " ".join(cmd), flush=True)
    return subprocess.call(cmd, env={**os.environ, "SSS_LAUNCH_RESOLVED": "1"})


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
