"""The schema of ``trainer.fsdp`` and ``trainer.deepspeed``: checks and Accelerate's plugin arguments.

The sss keys are Accelerate's constructor arguments, minus the ones sss sets itself (precision,
clipping, accumulation come from ``trainer.*``, so each has one place) and the ones that cannot
work with how sss builds a run. Both need CUDA GPUs: Accelerate applies FSDP only in a launched
multi-GPU run (on the CPU it ignores the plugin) and DeepSpeed needs ``pip install deepspeed``.
Validation is plain Python, so ``sss check`` and CPU-only tests run it without a GPU.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from sss.config.errors import ConfigError

__all__ = ["check_sharding", "deepspeed_kwargs", "describe", "fsdp_kwargs"]

FSDP1_STRATEGIES = ("FULL_SHARD", "SHARD_GRAD_OP", "NO_SHARD", "HYBRID_SHARD", "HYBRID_SHARD_ZERO2")
# A key maps to its choices (a tuple) or to the type its value must have.
FSDP_KEYS: dict[str, tuple[Any, ...] | type] = {
    "fsdp_version": (1, 2),
    "sharding_strategy": FSDP1_STRATEGIES,
    "auto_wrap_policy": ("transformer_based_wrap", "size_based_wrap", "no_wrap"),
    "transformer_cls_names_to_wrap": list,
    "min_num_params": int,
    "cpu_offload": bool,
    "activation_checkpointing": bool,
    "state_dict_type": ("SHARDED_STATE_DICT", "FULL_STATE_DICT"),
    "backward_prefetch": ("BACKWARD_PRE", "BACKWARD_POST", "NO_PREFETCH"),
    "forward_prefetch": bool,
}
DEEPSPEED_KEYS: dict[str, tuple[Any, ...] | type] = {
    "zero_stage": (0, 1, 2, 3),
    "offload_optimizer_device": ("none", "cpu", "nvme"),
    "offload_param_device": ("none", "cpu", "nvme"),
    "offload_optimizer_nvme_path": str,
    "offload_param_nvme_path": str,
}
# Accelerate arguments sss does not take, with what to do instead.
REFUSED = {
    "fsdp.mixed_precision_policy": "set trainer.mixed_precision; Accelerate derives FSDP's policy from it",
    "fsdp.reshard_after_forward": "set sharding_strategy (fsdp_version 2: FULL_SHARD = true, SHARD_GRAD_OP = false)",
    "fsdp.use_orig_params": "always true: sss builds the optimizer before Accelerate wraps the model, and FSDP1 "
    "without the original parameters would leave that optimizer updating tensors the model no longer uses",
    "fsdp.sync_module_states": "not needed: every process builds the same initial weights from trainer.seed",
    "deepspeed.gradient_clipping": "set trainer.max_grad_norm; sss hands it to DeepSpeed, which clips in its step",
    "deepspeed.gradient_accumulation_steps": "set trainer.gradient_accumulation_steps",
    "deepspeed.zero3_init_flag": "sss builds the model before the Accelerator, so deepspeed.zero.Init could not "
    "partition it while it is built",
    "deepspeed.zero3_save_16bit_model": "always true with zero_stage 3: the exported model needs the gathered weights",
}
GPU_NOTE = "needs CUDA GPUs"
KINDS = {bool: "true or false", int: "an integer", str: "a string"}


def fsdp_kwargs(fsdp: Mapping[str, Any]) -> dict[str, Any]:
    """Check ``trainer.fsdp`` and return the keyword arguments of Accelerate's `FullyShardedDataParallelPlugin`.

    Defaults: ``fsdp_version`` 2 (Accelerate re-points an optimizer built before the wrap to the
    sharded parameters, as sss needs), ``sharding_strategy`` FULL_SHARD, ``auto_wrap_policy`` no_wrap,
    ``min_num_params`` 1e8 (torch's) with size_based_wrap, and ``state_dict_type`` SHARDED_STATE_DICT:
    every checkpoint is a resume point, and sharded saves let each process write its own shard of
    the model and optimizer, where FULL_STATE_DICT first gathers all of it (Adam: three times the
    parameters) into rank 0's memory and makes every process wait for that at each save.

    Example:
        >>> kwargs = fsdp_kwargs({"auto_wrap_policy": "size_based_wrap", "min_num_params": 10**6})
        >>> kwargs["fsdp_version"], kwargs["reshard_after_forward"], kwargs["state_dict_type"]
        (2, True, 'SHARDED_STATE_DICT')
    """
    given = _checked("fsdp", fsdp, FSDP_KEYS)
    version = given.get("fsdp_version", 2)
    strategy = given.get("sharding_strategy", "FULL_SHARD")
    policy = given.get("auto_wrap_policy", "no_wrap")
    kwargs: dict[str, Any] = {
        "fsdp_version": version,
        "auto_wrap_policy": policy,
        "cpu_offload": given.get("cpu_offload", False),
        "activation_checkpointing": given.get("activation_checkpointing", False),
        "state_dict_type": given.get("state_dict_type", "SHARDED_STATE_DICT"),
    }
    if version == 1:
        # Not reshard_after_forward, Accelerate's newer name: with FSDP1 its default sharding_strategy
        # (FULL_SHARD) takes precedence over it when the model is wrapped.
        kwargs.update(sharding_strategy=strategy, use_orig_params=True)
        kwargs.update({k: given[k] for k in ("backward_prefetch", "forward_prefetch") if k in given})
    else:
        _require(
            strategy in ("FULL_SHARD", "SHARD_GRAD_OP"),
            "fsdp.sharding_strategy",
            strategy,
            "FULL_SHARD, SHARD_GRAD_OP (fsdp_version 2)",
        )
        kwargs["reshard_after_forward"] = strategy == "FULL_SHARD"
        for key in ("backward_prefetch", "forward_prefetch"):
            _require(key not in given, f"fsdp.{key}", given.get(key), "only with fsdp_version 1")
    kwargs.update(_wrap_kwargs(given, policy))
    return kwargs


def _wrap_kwargs(given: Mapping[str, Any], policy: str) -> dict[str, Any]:
    # Each auto-wrap policy takes its own setting, and only that one.
    kwargs: dict[str, Any] = {}
    names = given.get("transformer_cls_names_to_wrap")
    _require(
        (names is not None) == (policy == "transformer_based_wrap"),
        "fsdp.transformer_cls_names_to_wrap",
        names,
        "a list of layer class names, given exactly when auto_wrap_policy is transformer_based_wrap",
    )
    if names is not None:
        kwargs["transformer_cls_names_to_wrap"] = list(names)
    min_params = given.get("min_num_params")
    _require(
        min_params is None or policy == "size_based_wrap",
        "fsdp.min_num_params",
        min_params,
        "only with auto_wrap_policy size_based_wrap",
    )
    _require(min_params is None or min_params >= 1, "fsdp.min_num_params", min_params, "an integer >= 1")
    if policy == "size_based_wrap":
        kwargs["min_num_params"] = min_params if min_params is not None else 10**8
    return kwargs


def deepspeed_kwargs(deepspeed: Mapping[str, Any], max_grad_norm: float | None = None) -> dict[str, Any]:
    """Check ``trainer.deepspeed`` and return the keyword arguments of Accelerate's `DeepSpeedPlugin`.

    `max_grad_norm` is ``trainer.max_grad_norm``: DeepSpeed clips inside its own step, so sss hands
    it over (null becomes DeepSpeed's 0: no clipping). ``zero_stage`` defaults to 2, as in Accelerate.

    Example:
        >>> kwargs = deepspeed_kwargs({"zero_stage": 2, "offload_optimizer_device": "cpu"}, max_grad_norm=1.0)
        >>> kwargs["gradient_clipping"], kwargs["offload_optimizer_device"]
        (1.0, 'cpu')
    """
    given = _checked("deepspeed", deepspeed, DEEPSPEED_KEYS)
    stage = given.get("zero_stage", 2)
    kwargs: dict[str, Any] = {
        "zero_stage": stage,
        "gradient_clipping": float(max_grad_norm) if max_grad_norm else 0.0,
        "zero3_init_flag": False,
        "zero3_save_16bit_model": stage == 3,
    }
    for what, lowest in (("optimizer", 2), ("param", 3)):
        device, path = given.get(f"offload_{what}_device", "none"), given.get(f"offload_{what}_nvme_path")
        _require(
            device == "none" or stage >= lowest,
            f"deepspeed.offload_{what}_device",
            device,
            f"none below zero_stage {lowest}",
        )
        _require(
            (path is not None) == (device == "nvme"),
            f"deepspeed.offload_{what}_nvme_path",
            path,
            "a folder, given exactly when the device is nvme",
        )
        kwargs[f"offload_{what}_device"] = device
        if path is not None:
            kwargs[f"offload_{what}_nvme_path"] = path
    return kwargs


def check_sharding(fsdp: Mapping[str, Any] | None, deepspeed: Mapping[str, Any] | None) -> None:
    """Raise `ConfigError` naming the key when ``trainer.fsdp`` / ``trainer.deepspeed`` is wrong; builds nothing.

    Example:
        >>> check_sharding({"sharding_strategy": "FULL_SHARD"}, None)
        >>> check_sharding({"cpu_offload": "yes"}, None)
        Traceback (most recent call last):
        ...
        sss.config.errors.ConfigError: trainer.fsdp.cpu_offload: 'yes' is not valid; valid: true or false
    """
    if fsdp is not None and deepspeed is not None:
        raise ConfigError(
            "trainer.fsdp and trainer.deepspeed are both set: Accelerate runs one of them, remove the other"
        )
    if fsdp is not None:
        fsdp_kwargs(fsdp)
    if deepspeed is not None:
        deepspeed_kwargs(deepspeed)


def describe(fsdp: Mapping[str, Any] | None, deepspeed: Mapping[str, Any] | None) -> str:
    """One line for the log: what shards the run and what that needs.

    Example:
        >>> describe({"sharding_strategy": "SHARD_GRAD_OP"}, None)
        'FSDP2 SHARD_GRAD_OP, no_wrap, SHARDED_STATE_DICT: needs CUDA GPUs and a launched run (--num-processes N)'
        >>> describe(None, {"zero_stage": 3, "offload_param_device": "cpu"})
        'DeepSpeed ZeRO-3, offload optimizer none, params cpu: needs CUDA GPUs and pip install deepspeed'
        >>> describe(None, None)
        'DDP (no sharding)'
    """
    if fsdp is not None:
        k = fsdp_kwargs(fsdp)
        strategy = fsdp.get("sharding_strategy", "FULL_SHARD").upper()
        parts = [f"FSDP{k['fsdp_version']} {strategy}", k["auto_wrap_policy"], k["state_dict_type"]]
        parts += [name for name in ("cpu_offload", "activation_checkpointing") if k[name]]
        return ", ".join(parts) + f": {GPU_NOTE} and a launched run (--num-processes N)"
    if deepspeed is not None:
        k = deepspeed_kwargs(deepspeed)
        offload = f"offload optimizer {k['offload_optimizer_device']}, params {k['offload_param_device']}"
        return f"DeepSpeed ZeRO-{k['zero_stage']}, {offload}: {GPU_NOTE} and pip install deepspeed"
    return "DDP (no sharding)"


def _checked(section: str, given: Mapping[str, Any], table: Mapping[str, tuple[Any, ...] | type]) -> dict[str, Any]:
    # Each value is checked against the table and brought to Accelerate's spelling (choices ignore case).
    if not isinstance(given, Mapping):
        raise ConfigError(f"trainer.{section} must be a mapping of settings (or null), got {given!r}")
    out: dict[str, Any] = {}
    for key, value in given.items():
        where = f"{section}.{key}"
        if where in REFUSED:
            raise ConfigError(f"trainer.{where} is not an sss setting: {REFUSED[where]}")
        if key not in table:
            raise ConfigError(f"trainer.{where}: unknown key; valid keys: {', '.join(table)}")
        rule = table[key]
        if isinstance(rule, tuple):
            match = [c for c in rule if str(c).lower() == str(value).lower() and type(c) is type(value)]
            _require(bool(match), where, value, ", ".join(map(str, rule)))
            out[key] = match[0]
        elif rule is list:
            ok = isinstance(value, (list, tuple)) and bool(value) and all(isinstance(v, str) for v in value)
            _require(ok, where, value, "a non-empty list of class names")
            out[key] = list(value)
        else:
            ok = isinstance(value, rule) and not (rule is int and isinstance(value, bool))
            _require(ok, where, value, KINDS[rule])
            out[key] = value
    return out


def _require(ok: bool, where: str, value: Any, valid: str) -> None:
    if not ok:
        raise ConfigError(f"trainer.{where}: {value!r} is not valid; valid: {valid}")
