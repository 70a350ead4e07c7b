"""How `SSSTrainer` is set up: the Accelerator from the config, the precision choice, the optimizer."""

from __future__ import annotations

import dataclasses
import inspect
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch
from accelerate import Accelerator

from sss.config import ConfigError, OptimConfig, TrainerConfig, instantiate, resolve_target

if TYPE_CHECKING:
    from sss.trainer.module import LitModule

__all__ = [
    "build_accelerator",
    "build_optimizer",
    "fast_dev_config",
    "resolve_precision",
    "use_cpu",
    "with_overrides",
]


def use_cpu(requested: bool) -> bool:
    """Whether Accelerate must be told ``cpu=True``: asked for, or launched as several processes without an accelerator.

    Under a multi-process launch Accelerate forms a gloo group on the CPU only when told
    ``cpu=True``; otherwise, finding no GPU, it silently runs N independent copies.

    Example:
        >>> use_cpu(True)
        True
    """
    import os

    if requested:
        return True
    launched = int(os.environ.get("WORLD_SIZE", "1")) > 1 or int(os.environ.get("LOCAL_RANK", "-1")) != -1
    probe = getattr(torch, "accelerator", None)
    has_accelerator = probe.is_available() if probe is not None else torch.cuda.is_available()
    return launched and not has_accelerator


def resolve_precision(choice: str, device: torch.device) -> str:
    """The mixed precision ``auto`` stands for on `device`; other choices pass through.

    Example:
        >>> resolve_precision("auto", torch.device("cpu"))
        'no'
    """
    if choice != "auto":
        return choice
    if device.type != "cuda":
        return "no"
    return "bf16" if torch.cuda.is_bf16_supported() else "fp16"


def with_overrides(config: TrainerConfig, overrides: dict[str, Any]) -> TrainerConfig:
    """`config` with `SSSTrainer`'s keyword overrides applied (nested sections as dicts); unknown keys are named.

    Example:
        >>> with_overrides(TrainerConfig(), {"max_steps": 3, "log": {"progress": False}}).log.progress
        False
    """
    names = {f.name: f for f in dataclasses.fields(TrainerConfig)}
    for key, value in overrides.items():
        if key not in names:
            raise ConfigError(f"SSSTrainer got an unknown setting {key!r}; valid: {', '.join(names)}")
        if isinstance(value, dict) and dataclasses.is_dataclass(getattr(config, key)):
            overrides[key] = dataclasses.replace(getattr(config, key), **value)
    return dataclasses.replace(config, **overrides)


def build_accelerator(cfg: TrainerConfig) -> Accelerator:
    """The `Accelerator` of `cfg`: device, resolved precision, accumulation, seedable sampler, plugins.

    Trackers are the `MetricsLogger` callback's: it hands them to this Accelerator when a fit starts.
    """
    from accelerate import DataLoaderConfiguration, PartialState
    from accelerate.utils import DistributedDataParallelKwargs, ProjectConfiguration

    from sss.config.sharding import describe
    from sss.trainer.sharding import accelerator_plugins

    cpu = use_cpu(cfg.cpu)
    device = PartialState(cpu=cpu).device
    precision = resolve_precision(cfg.mixed_precision, device)
    # "cpu" here means the device is the CPU (where Accelerate ignores FSDP), not use_cpu()'s
    # answer, which is False for a one-process CPU run.
    plugins = accelerator_plugins(cfg.fsdp, cfg.deepspeed, max_grad_norm=cfg.max_grad_norm, cpu=device.type == "cpu")
    out = Path(cfg.output_dir or "runs/run")
    accelerator = Accelerator(
        cpu=cpu,
        mixed_precision=precision,
        gradient_accumulation_steps=cfg.gradient_accumulation_steps,
        dataloader_config=DataLoaderConfiguration(use_seedable_sampler=True, data_seed=cfg.seed),
        project_config=ProjectConfiguration(project_dir=str(out), logging_dir=str(out / "logs")),
        kwargs_handlers=[DistributedDataParallelKwargs(find_unused_parameters=cfg.find_unused_parameters)],
        step_scheduler_with_optimizer=False,
        **plugins,
    )
    how = f" (auto on {accelerator.device.type})" if cfg.mixed_precision == "auto" else ""
    accelerator.print(f"sss: mixed precision {precision}{how}")
    if plugins:
        accelerator.print(f"sss: {describe(cfg.fsdp, cfg.deepspeed)}")
    return accelerator


def fast_dev_config(cfg: TrainerConfig) -> TrainerConfig:
    """`cfg` as ``trainer.fast_dev_run=N`` means it: N batches of training and validation, one epoch, nothing kept.

    Example:
        >>> fast = fast_dev_config(TrainerConfig(fast_dev_run=2))
        >>> fast.limit_train_batches, fast.max_epochs, fast.checkpoint.every_epoch, fast.log.trackers
        (2, 1, False, [])
    """
    n = cfg.fast_dev_run
    if not n:
        return cfg
    return dataclasses.replace(
        cfg,
        limit_train_batches=n,
        limit_val_batches=n,
        max_epochs=1,
        max_steps=None,
        checkpoint=dataclasses.replace(cfg.checkpoint, every_epoch=False, every_n_steps=None),
        log=dataclasses.replace(cfg.log, trackers=[]),
    )


def build_optimizer(optim: OptimConfig, module: LitModule, total_steps: int) -> tuple[torch.optim.Optimizer, Any]:
    """The optimizer of ``trainer.optim`` over ``module.parameter_groups(weight_decay)``, and its scheduler (or None).

    The optimizer's ``weight_decay`` applies to the groups `LitModule.parameter_groups` decays. The
    scheduler's ``_target_`` receives the optimizer and, when it accepts ``total_steps`` and the
    config does not set it, `total_steps`: the optimizer steps of the whole run.

    Example:
        >>> from sss.testing import BoringModule
        >>> spec = {"_target_": "torch.optim.AdamW", "lr": 0.01, "weight_decay": 0.1}
        >>> sched = {"_target_": "sss.trainer.cosine_with_warmup", "warmup_steps": 2}
        >>> optimizer, scheduler = build_optimizer(OptimConfig(optimizer=spec, scheduler=sched), BoringModule(), 10)
        >>> [group["weight_decay"] for group in optimizer.param_groups], scheduler is not None
        ([0.1, 0.0], True)
    """
    spec = dict(optim.optimizer)
    optimizer = instantiate(spec, module.parameter_groups(float(spec.get("weight_decay", 0.0))))
    if optim.scheduler is None:
        return optimizer, None
    extra: dict[str, Any] = {}
    target = resolve_target(optim.scheduler["_target_"])
    if "total_steps" in inspect.signature(target).parameters and "total_steps" not in optim.scheduler:
        extra["total_steps"] = total_steps
    return optimizer, instantiate(dict(optim.scheduler), optimizer, **extra)
