"""How `SSSTrainer` is set up: the Accelerator from the config, the precision choice, the optimizer."""

from __future__ import annotations

import dataclasses
import inspect
import math
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch
from accelerate import Accelerator

from sss.config import ConfigError, OptimConfig, TrainerConfig, instantiate, resolve_target
from sss.config.instantiate import param_group_problems

if TYPE_CHECKING:
    from sss.trainer.finetune import Finetuning
    from sss.trainer.module import LitModule

__all__ = [
    "CUBLAS_WORKSPACE",
    "apply_deterministic",
    "build_accelerator",
    "build_optimizer",
    "count_total_steps",
    "fast_dev_config",
    "optimizer_and_scheduler",
    "resolve_precision",
    "split_param_groups",
    "use_cpu",
    "with_overrides",
]


def use_cpu(requested: bool) -> bool:
    """Whether Accelerate must be told ``cpu=True``: asked for, or launched as several processes without an accelerator.

    Under a multi-process launch Accelerate forms a gloo group on the CPU only when told
    ``cpu=True``; otherwise, finding no GPU, it silently runs N independent copies. A launch is
    what Accelerate itself counts as one: ``LOCAL_RANK`` set (torchrun), or a group size above 1
    in ``WORLD_SIZE`` or MPI's ``PMI_SIZE``, ``OMPI_COMM_WORLD_SIZE``, ``MV2_COMM_WORLD_SIZE`` (mpirun).

    Example:
        >>> use_cpu(True)
        True
    """
    import os

    if requested:
        return True
    sizes = ("WORLD_SIZE", "PMI_SIZE", "OMPI_COMM_WORLD_SIZE", "MV2_COMM_WORLD_SIZE")
    launched = any(int(os.environ.get(k, "1")) > 1 for k in sizes) or int(os.environ.get("LOCAL_RANK", "-1")) != -1
    probe = getattr(torch, "accelerator", None)
    has_accelerator = probe.is_available() if probe is not None else torch.cuda.is_available()
    return launched and not has_accelerator


def resolve_precision(choice: str, device: torch.device) -> str:
    """The mixed precision ``auto`` stands for on `device`; other choices pass through.

    Example:
        >>> resolve_precision("auto", torch.device("cpu"))
        'no'
    """
    if choice == "fp16" and device.type == "cpu":
        import warnings

        from sss.warnings import SSSWarning

        # Accelerate has no fp16 autocast (and no loss scaling) on a CPU: the run is fp32, so it is recorded as "no".
        warnings.warn(
            "trainer.mixed_precision=fp16 has no effect on a CPU: this run trains in fp32 and records precision 'no' "
            "(bf16 is the CPU's mixed precision)",
            SSSWarning,
            stacklevel=2,
        )
        return "no"
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


CUBLAS_WORKSPACE = ":4096:8"
"""The ``CUBLAS_WORKSPACE_CONFIG`` that makes cuBLAS deterministic (CUDA >= 10.2); read at its first call."""


def apply_deterministic(cfg: TrainerConfig) -> bool:
    """Turn on the deterministic mode of ``trainer.deterministic`` (process-wide); whether it did.

    Sets ``torch.use_deterministic_algorithms(True)`` (an op without a deterministic implementation
    raises), ``torch.backends.cudnn.deterministic = True`` and ``benchmark = False``, and
    ``CUBLAS_WORKSPACE_CONFIG`` when unset (cuBLAS reads it at its first call: ``sss fit`` sets it
    before anything touches CUDA). ``MKL_CBWR`` cannot be set here: MKL read it when torch loaded, so
    an unset one is a warning saying how to set it. ``deterministic=False`` changes nothing, so a
    mode the user turned on themselves stays on.

    Example:
        >>> apply_deterministic(TrainerConfig())
        False
    """
    import os
    import warnings

    from sss.warnings import SSSWarning

    if not cfg.deterministic:
        return False
    os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", CUBLAS_WORKSPACE)
    torch.use_deterministic_algorithms(True)  # not warn_only: a non-deterministic op must not pass unseen
    torch.backends.cudnn.deterministic = True
    torch.backends.cudnn.benchmark = False  # benchmarking picks the fastest kernel per run, not the same one
    if "MKL_CBWR" not in os.environ:
        warnings.warn(
            "trainer.deterministic=true but MKL_CBWR is unset, and MKL read it when torch was imported: another "
            "process may take another floating-point path and train different weights. Set MKL_CBWR=AUTO,STRICT "
            "in the environment before Python starts (or before `import torch`); `sss fit` sets it itself",
            SSSWarning,
            stacklevel=3,
        )
    return True


def build_accelerator(cfg: TrainerConfig) -> Accelerator:
    """The `Accelerator` of `cfg`: device, resolved precision, accumulation, seedable sampler, plugins.

    Trackers are the `MetricsLogger` callback's: it hands them to this Accelerator when a fit starts.
    """
    from accelerate import DataLoaderConfiguration, PartialState
    from accelerate.utils import DistributedDataParallelKwargs, ProjectConfiguration

    from sss.config.sharding import describe
    from sss.trainer.sharding import accelerator_plugins

    apply_deterministic(cfg)  # before anything runs on the device: cuBLAS reads its workspace setting once
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
        # non_blocking: batches from pinned memory (data.pin_memory) copy to a GPU while it computes; elsewhere
        # the copy is synchronous as before (a CPU run does not copy at all)
        dataloader_config=DataLoaderConfiguration(use_seedable_sampler=True, data_seed=cfg.seed, non_blocking=True),
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


def warn_unseedable(accelerator: Accelerator) -> None:
    """Warn when a user-built Accelerator shuffles without a seedable sampler: its resumes cannot replay the order."""
    import warnings

    if not accelerator.dataloader_config.use_seedable_sampler:
        warnings.warn(
            "the given Accelerator shuffles without a seedable sampler, so a resumed run cannot replay the "
            "data order: build it with dataloader_config=DataLoaderConfiguration(use_seedable_sampler=True, "
            "data_seed=SEED) for exact resumes",
            stacklevel=3,
        )


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


def build_optimizer(
    optim: OptimConfig, module: LitModule, total_steps: int, finetuning: Finetuning | None = None
) -> tuple[torch.optim.Optimizer, Any]:
    """The optimizer of ``trainer.optim`` over ``module.parameter_groups(weight_decay)``, and its scheduler (or None).

    The optimizer's ``weight_decay`` applies to the groups `LitModule.parameter_groups` decays;
    ``trainer.optim.param_groups`` splits those groups by parameter name (`split_param_groups`). The
    scheduler's ``_target_`` receives the optimizer and, when it accepts ``total_steps`` and the
    config does not set it, `total_steps`: the optimizer steps of the whole run (what a relative
    schedule such as ``cosine_with_warmup(warmup_ratio=0.05)`` is a fraction of). ``layer_decay`` and
    ``head_lr_scale`` then split the groups by LR multiplier (`sss.trainer.finetune.scale_groups`), and
    `finetuning` moves its frozen parameters to empty groups of their own (`Finetuning.hold_out`).

    Example:
        >>> from sss.testing import BoringModule
        >>> spec = {"_target_": "torch.optim.AdamW", "lr": 0.01, "weight_decay": 0.1}
        >>> sched = {"_target_": "sss.trainer.cosine_with_warmup", "warmup_steps": 2}
        >>> optimizer, scheduler = build_optimizer(OptimConfig(optimizer=spec, scheduler=sched), BoringModule(), 10)
        >>> [group["weight_decay"] for group in optimizer.param_groups], scheduler is not None
        ([0.1, 0.0], True)
    """
    spec = dict(optim.optimizer)
    decay = float(spec.get("weight_decay", 0.0))
    if optim.param_groups:
        problems = param_group_problems(optim)  # torch would keep a misspelled group setting without a word
        if problems:
            raise ConfigError("\n".join(problems))
        groups = split_param_groups(module, optim.param_groups, decay)
    else:  # exactly parameter_groups' groups, as before param_groups existed: bitwise the same training
        groups = module.parameter_groups(decay)
    if optim.layer_decay is not None or optim.head_lr_scale != 1.0 or (finetuning and finetuning.frozen):
        groups = _finetune_groups(optim, module, groups, finetuning)
    optimizer = instantiate(spec, groups)
    if optim.scheduler is None:
        return optimizer, None
    extra: dict[str, Any] = {}
    target = resolve_target(optim.scheduler["_target_"])
    if "total_steps" in inspect.signature(target).parameters and "total_steps" not in optim.scheduler:
        extra["total_steps"] = total_steps
    return optimizer, instantiate(dict(optim.scheduler), optimizer, **extra)


def _finetune_groups(
    optim: OptimConfig, module: LitModule, groups: list[dict[str, Any]], finetuning: Finetuning | None
) -> list[dict[str, Any]]:
    from sss.trainer.finetune import scale_groups

    spec = optim.optimizer
    lr = spec.get("lr", inspect.signature(resolve_target(spec["_target_"])).parameters["lr"].default)
    if optim.layer_decay is not None or optim.head_lr_scale != 1.0:
        groups = scale_groups(module, groups, optim, float(lr))  # after the rules' lr: the scales multiply it
    return finetuning.hold_out(module, groups, float(lr)) if finetuning and finetuning.frozen else groups


def optimizer_and_scheduler(
    cfg: TrainerConfig, module: LitModule, total_steps: int, finetuning: Finetuning
) -> tuple[Any, Any]:
    """The fit's optimizer and scheduler: ``module.configure_optimizers()``, else `build_optimizer`.

    Settings the trainer applies to its own optimizer only (``optim.param_groups``, ``layer_decay``,
    ``head_lr_scale``, ``finetune.freeze``) are an error beside a module that builds its own.

    Example:
        >>> from sss.config import FinetuneConfig
        >>> from sss.testing import BoringModule
        >>> from sss.trainer.finetune import Finetuning
        >>> module = BoringModule()
        >>> plan = Finetuning(module, FinetuneConfig())
        >>> optimizer, scheduler = optimizer_and_scheduler(TrainerConfig(), module, 10, plan)
        >>> type(optimizer).__name__, scheduler
        ('AdamW', None)
    """
    configured = module.configure_optimizers()  # None: trainer.optim over module.parameter_groups
    if configured is None:
        configured = build_optimizer(cfg.optim, module, total_steps, finetuning)
    else:
        optim = cfg.optim
        keys = [("optim.param_groups", optim.param_groups), ("optim.layer_decay", optim.layer_decay is not None)]
        keys += [("optim.head_lr_scale", optim.head_lr_scale != 1.0), ("finetune.freeze", finetuning.frozen)]
        given = [key for key, value in keys if value]
        if given:
            raise ConfigError(
                f"trainer.{given[0]} is set but {type(module).__name__}.configure_optimizers builds its own "
                "optimizer, which would ignore it: remove one of the two"
            )
    return configured if isinstance(configured, tuple) else (configured, None)


def split_param_groups(module: LitModule, rules: list[dict[str, Any]], weight_decay: float) -> list[dict[str, Any]]:
    """`module`'s optimizer groups split by ``trainer.optim.param_groups``: a parameter takes the first rule it matches.

    A rule's ``params`` globs (`fnmatch`, case-sensitive) match parameter names
    (``module.named_parameters()``); its other keys replace the optimizer's settings for those
    parameters. Decay stays where `LitModule.parameter_groups` puts it: a rule's ``weight_decay``
    goes to the weight matrices it matches, biases and norms keep none. Parameters that no rule
    matches keep the optimizer's settings and come first, so ``train/lr`` stays the optimizer's
    ``lr``. A rule that matches no trainable parameter (or only ones an earlier rule took) is an
    error naming it. A setting given as null keeps the optimizer's.

    Example:
        >>> from sss.testing import BoringModule
        >>> rules = [{"params": "image_encoder.*", "lr": 1e-4, "name": "image"}]
        >>> groups = split_param_groups(BoringModule(), rules, weight_decay=0.1)
        >>> [(len(g["params"]), g.get("lr"), g["weight_decay"], g.get("name")) for g in groups]
        [(2, None, 0.1, None), (2, None, 0.0, None), (1, 0.0001, 0.1, 'image'), (1, 0.0001, 0.0, 'image')]
    """
    names = {id(p): n for n, p in module.named_parameters()}
    trainable = [names[id(p)] for g in module.parameter_groups(weight_decay) for p in g["params"] if id(p) in names]
    taken: dict[str, int] = {}
    for i, rule in enumerate(rules):
        globs = [rule["params"]] if isinstance(rule["params"], str) else list(rule["params"])
        hits = [n for n in trainable if _matches(n, globs)]
        for n in hits:
            taken.setdefault(n, i)
        if not any(taken[n] == i for n in hits):
            raise ConfigError(_no_match(i, globs, hits, taken, trainable, module))
    out: list[dict[str, Any]] = []
    for index in (None, *range(len(rules))):  # the rest first, then each rule in the config's order
        rule = {} if index is None else {k: v for k, v in rules[index].items() if k != "params" and v is not None}
        decay = float(rule.pop("weight_decay", weight_decay))
        for group in module.parameter_groups(decay):  # the module's own decay split, with this rule's decay
            params = [p for p in group["params"] if taken.get(names.get(id(p), "")) == index]
            if params:
                out.append({**group, **rule, "params": params})
    return out


def _matches(name: str, globs: list[str]) -> bool:
    import fnmatch

    return any(fnmatch.fnmatchcase(name, g) for g in globs)


def _no_match(i: int, globs: list[str], hits: list[str], taken: dict[str, int], names: list[str], module: Any) -> str:
    key, pattern = f"trainer.optim.param_groups[{i}].params", ", ".join(repr(g) for g in globs)
    if hits:
        return (
            f"{key}: {pattern} matches only parameters that param_groups[{taken[hits[0]]}] took already (the first "
            "entry that matches a parameter wins): put the narrower pattern first"
        )
    if any(_matches(n, globs) for n, p in module.named_parameters() if not p.requires_grad):
        return f"{key}: {pattern} matches only frozen parameters (requires_grad=False): the optimizer gets none"
    parts = ", ".join(sorted({f"{n.split('.')[0]}." for n in names}))
    example = names[0] if names else "-"
    return (
        f"{key}: {pattern} matches no parameter of {type(module).__name__}; its parameter names start with "
        f"{parts} (e.g. {example}), and a glob matches the whole name: write 'image_encoder.*', not 'image_encoder'"
    )


def count_total_steps(loader: Any, cfg: TrainerConfig, accumulation: int) -> int:
    """Optimizer steps a fit will run: the smaller of ``max_steps`` and the epochs' windows (0: unknown).

    Example:
        >>> count_total_steps(range(10), TrainerConfig(max_epochs=3), accumulation=2)
        15
    """
    batches = len(loader) if hasattr(loader, "__len__") else 0
    if cfg.limit_train_batches:
        batches = min(batches, cfg.limit_train_batches) if batches else cfg.limit_train_batches
    per_epoch = math.ceil(batches / accumulation)
    candidates = [n for n in (cfg.max_steps, per_epoch * (cfg.max_epochs or 0)) if n]
    return min(candidates) if candidates else 0
