"""Helpers for tests and examples: a tiny `BoringModule`, its data, and an `EventRecorder` callback."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from sss.callbacks.base import Callback, Event
from sss.data.datamodule import DataModule
from sss.trainer.module import LitModule

if TYPE_CHECKING:
    from sss.trainer.trainer import SSSTrainer

__all__ = ["BoringDataModule", "BoringDataset", "BoringModule", "EventRecorder", "boring_loader"]


class _Add(nn.Module):
    """Fusion of the boring model: pooled image + audio features -> logits."""

    def __init__(self, dim: int, num_classes: int) -> None:
        super().__init__()
        self.head = nn.Linear(dim, num_classes)

    def forward(self, image: Tensor | None, audio: Tensor | None) -> Tensor:
        parts = [t for t in (image, audio) if t is not None]
        return self.head(torch.stack(parts).sum(0))


class BoringModule(LitModule):
    """A tiny two-modality classifier (4x4 images, 16-sample audio) for tests.

    Example:
        >>> batch = next(iter(boring_loader(n=4, batch_size=4)))
        >>> BoringModule()(batch).shape
        torch.Size([4, 2])
    """

    def __init__(self, dim: int = 8, num_classes: int = 2) -> None:
        super().__init__()
        self.num_classes = num_classes
        self.image_encoder = nn.Sequential(nn.Flatten(), nn.Linear(3 * 4 * 4, dim))
        self.audio_encoder = nn.Sequential(nn.Flatten(), nn.Linear(16, dim))
        self.fusion_head = _Add(dim, num_classes)

    def compute_loss(self, outputs: Tensor, batch: dict[str, Any]) -> Tensor:
        return F.cross_entropy(outputs, batch["label"])


class BoringDataset(torch.utils.data.Dataset):
    """`n` deterministic samples in the batch format of `sss` (image [3,4,4], audio [1,16], label).

    Example:
        >>> sorted(BoringDataset(2)[0])
        ['audio', 'image', 'index', 'label']
    """

    def __init__(self, n: int = 64, seed: int = 0, num_classes: int = 2) -> None:
        g = torch.Generator().manual_seed(seed)
        self.image = torch.randn(n, 3, 4, 4, generator=g)
        self.audio = torch.randn(n, 1, 16, generator=g)
        # a learnable label: the sign of a fixed direction in the inputs
        self.label = ((self.image.flatten(1)[:, 0] + self.audio.flatten(1)[:, 0]) > 0).long() % num_classes

    def __len__(self) -> int:
        return len(self.label)

    def __getitem__(self, i: int) -> dict[str, Any]:
        return {"image": self.image[i], "audio": self.audio[i], "label": self.label[i], "index": i}


def boring_loader(
    n: int = 64, batch_size: int = 8, shuffle: bool = False, seed: int = 0
) -> torch.utils.data.DataLoader:
    """A DataLoader over `BoringDataset`.

    Example:
        >>> len(boring_loader(n=10, batch_size=4))
        3
    """
    return torch.utils.data.DataLoader(BoringDataset(n, seed), batch_size=batch_size, shuffle=shuffle)


class BoringDataModule(DataModule):
    """`BoringDataset` train and validation splits as a `DataModule` (classes ``a``, ``b``), for run-layer tests.

    Example:
        >>> dm = BoringDataModule(n_train=16, batch_size=8)
        >>> dm.setup("fit"); len(dm.train_dataloader()), dm.classes
        (2, ['a', 'b'])
    """

    def __init__(self, n_train: int = 64, n_val: int = 16, batch_size: int = 8, seed: int = 0) -> None:
        super().__init__()
        self.classes = ["a", "b"]
        self.n_train, self.n_val, self.batch_size, self.seed = n_train, n_val, batch_size, seed

    def train_dataloader(self) -> torch.utils.data.DataLoader:
        return boring_loader(self.n_train, self.batch_size, shuffle=True, seed=self.seed)

    def val_dataloader(self) -> torch.utils.data.DataLoader:
        return boring_loader(self.n_val, self.batch_size, seed=self.seed + 1)


class EventRecorder(Callback):
    """Records every event fired, in order, as ``Event`` members in `events`.

    Example:
        >>> rec = EventRecorder()
        >>> rec.on_fit_start(None, None); rec.events
        [<Event.FIT_START: 'on_fit_start'>]
    """

    def __init__(self) -> None:
        self.events: list[Event] = []

    def _record(self, event: Event) -> None:
        self.events.append(event)


def _recorder(event: Event) -> Any:
    def method(self: EventRecorder, trainer: SSSTrainer, module: LitModule) -> None:
        self._record(event)

    method.__name__ = event.value
    return method


for _event in Event:  # one recording method per event, so a new event is recorded without edits here
    setattr(EventRecorder, _event.value, _recorder(_event))
