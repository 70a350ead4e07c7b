"""``trainer.fsdp`` / ``trainer.deepspeed`` (checked by `sss.config.sharding`) as Accelerate plugins."""

from __future__ import annotations

import importlib.util
import warnings
from collections.abc import Mapping
from typing import Any

from sss.config.sharding import check_sharding, deepspeed_kwargs, describe, fsdp_kwargs

__all__ = ["accelerator_plugins"]


def accelerator_plugins(
    fsdp: Mapping[str, Any] | None,
    deepspeed: Mapping[str, Any] | None,
    *,
    max_grad_norm: float | None = None,
    cpu: bool = False,
) -> dict[str, Any]:
    """The keyword arguments that add ``trainer.fsdp`` or ``trainer.deepspeed`` to ``Accelerator(...)``.

    Empty when neither is set. `cpu` says the run trains on the CPU (``PartialState().device`` is
    the CPU, whether asked for or for want of a GPU): Accelerate would ignore the plugins there, so
    this warns and returns nothing, and the run trains as plain DDP with the same math. DeepSpeed
    without the ``deepspeed`` package raises `ImportError`; `max_grad_norm` is ``trainer.max_grad_norm``.

    Example:
        >>> plugin = accelerator_plugins({"state_dict_type": "FULL_STATE_DICT"}, None)["fsdp_plugin"]
        >>> plugin.fsdp_version, plugin.state_dict_type.name
        (2, 'FULL_STATE_DICT')
    """
    check_sharding(fsdp, deepspeed)
    if fsdp is None and deepspeed is None:
        return {}
    if cpu:
        which = "trainer.fsdp" if fsdp is not None else "trainer.deepspeed"
        warnings.warn(
            f"{which} is ignored on the CPU ({describe(fsdp, deepspeed)}): training as plain DDP", stacklevel=2
        )
        return {}
    if fsdp is not None:
        from accelerate.utils import FullyShardedDataParallelPlugin

        return {"fsdp_plugin": FullyShardedDataParallelPlugin(**fsdp_kwargs(fsdp))}
    if importlib.util.find_spec("deepspeed") is None:
        raise ImportError(
            "trainer.deepspeed needs the deepspeed package: pip install deepspeed (DeepSpeed needs CUDA GPUs)"
        )
    from accelerate.utils import DeepSpeedPlugin

    return {"deepspeed_plugin": DeepSpeedPlugin(**deepspeed_kwargs(deepspeed or {}, max_grad_norm))}
