"""The training loop (`SSSTrainer`), its state and the `LitModule` users subclass."""

from sss.trainer.module import LitModule
from sss.trainer.schedules import cosine_with_warmup
from sss.trainer.state import TrainState
from sss.trainer.trainer import SSSTrainer

__all__ = ["LitModule", "SSSTrainer", "TrainState", "cosine_with_warmup"]
