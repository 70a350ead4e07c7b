"""Typed configuration: schema dataclasses merged by OmegaConf (defaults <- YAML <- ``key=value`` overrides).

- `sss.config.schema`: the dataclasses (``trainer:``, ``model:``, ``data:``, ``callbacks:``).
- `sss.config.load`: `load_config` (merging, with the source of each value), `to_yaml`, `field_docs`.
- `sss.config.instantiate`: `instantiate` of ``_target_`` specs, `check_config` without building.
- `sss.config.sharding`: the ``trainer.fsdp`` / ``trainer.deepspeed`` schema.

Nothing here imports the trainer: the config is checked before anything is built.
"""

from __future__ import annotations

from sss.config.errors import ConfigError
from sss.config.instantiate import check_config, check_target, instantiate, resolve_target
from sss.config.load import field_docs, load_config, to_yaml
from sss.config.schema import CheckpointConfig, FinetuneConfig, LogConfig, OptimConfig, SSSConfig, TrainerConfig

__all__ = [
    "CheckpointConfig",
    "ConfigError",
    "FinetuneConfig",
    "LogConfig",
    "OptimConfig",
    "SSSConfig",
    "TrainerConfig",
    "check_config",
    "check_target",
    "field_docs",
    "instantiate",
    "load_config",
    "resolve_target",
    "to_yaml",
]
