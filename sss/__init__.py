"""`sss` — train Shadow & Sound Hunter models (image + audio, cross-modal fusion) on Hugging Face Accelerate.

Names are imported on first use, so ``import sss`` and ``sss --help`` stay fast.

Example:
    >>> import sss
    >>> sss.TrainerConfig(max_steps=10).max_steps
    10
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from sss.callbacks.base import Callback, Event
    from sss.config import SSSConfig, TrainerConfig, instantiate, load_config
    from sss.data.datamodule import DataModule
    from sss.model_folder import load_model
    from sss.models.registry import create_model, register_model
    from sss.run.notebook import notebook_fit
    from sss.trainer.module import LitModule
    from sss.trainer.state import TrainState
    from sss.trainer.trainer import SSSTrainer

__version__ = "0.1.0"
__all__ = [
    "Callback",
    "DataModule",
    "Event",
    "LitModule",
    "SSSConfig",
    "SSSTrainer",
    "TrainState",
    "TrainerConfig",
    "create_model",
    "instantiate",
    "load_config",
    "load_model",
    "notebook_fit",
    "register_model",
]

_WHERE = {
    "Callback": "sss.callbacks.base",
    "Event": "sss.callbacks.base",
    "SSSConfig": "sss.config",
    "TrainerConfig": "sss.config",
    "instantiate": "sss.config",
    "load_config": "sss.config",
    "load_model": "sss.model_folder",
    "DataModule": "sss.data.datamodule",
    "create_model": "sss.models.registry",
    "register_model": "sss.models.registry",
    "notebook_fit": "sss.run.notebook",
    "LitModule": "sss.trainer.module",
    "TrainState": "sss.trainer.state",
    "SSSTrainer": "sss.trainer.trainer",
}


def __getattr__(name: str) -> Any:
    if name in _WHERE:
        return getattr(importlib.import_module(_WHERE[name]), name)
    raise AttributeError(f"module 'sss' has no attribute {name!r}")


def __dir__() -> list[str]:
    return sorted(__all__)
