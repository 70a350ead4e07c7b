"""`DataModule`: the base class a user subclasses to hand data to the trainer."""

from __future__ import annotations

import os
from typing import Any

from torch.utils.data import DataLoader

__all__ = ["DataModule"]


class DataModule:
    """Builds the data loaders of a run, as a Lightning ``LightningDataModule`` does.

    The trainer calls `setup` once per stage (``"fit"``, ``"validate"``, ``"test"`` or
    ``"predict"``) on every process, then asks for the loaders that stage needs. Do downloads,
    generation and file scans in `setup`, not in ``__init__``, so that building a config stays
    cheap. A loader method returning None means "no data for that stage". Batches are dicts
    (``"image"``, ``"audio"``, ``"label"``, ...; see ``docs/data.md``).

    Example:
        >>> import torch
        >>> from torch.utils.data import DataLoader
        >>> class Toy(DataModule):
        ...     def __init__(self):
        ...         super().__init__()
        ...         self.classes = ["no", "yes"]
        ...     def setup(self, stage):
        ...         self.train_set = [{"image": torch.zeros(3, 8, 8), "label": torch.tensor(i % 2)} for i in range(8)]
        ...     def train_dataloader(self):
        ...         return DataLoader(self.train_set, batch_size=4)
        >>> dm = Toy()
        >>> dm.setup("fit")
        >>> batch = next(iter(dm.train_dataloader()))
        >>> dm.num_classes, batch["image"].shape, batch["label"].tolist(), dm.val_dataloader()
        (2, torch.Size([4, 3, 8, 8]), [0, 1, 0, 1], None)
    """

    classes: list[str]
    """Class names; the position of a name is its label index."""

    def __init__(self) -> None:
        self.classes = []

    @property
    def num_classes(self) -> int:
        """How many classes there are: ``len(self.classes)``."""
        return len(self.classes)

    def setup(self, stage: str) -> None:
        """Prepare the data for ``stage`` (``"fit"``, ``"validate"``, ``"test"`` or ``"predict"``); no-op by default.

        Runs on every process; anything that writes shared files must be safe to run concurrently.
        """

    def use_model_preprocessing(self, prep: dict[str, Any]) -> None:
        """Prepare inputs as the model's pretrained weights expect; `prep` is ``module.preprocessing()``.

        Called after the model is built (``image_mean``, ``image_std``, ``image_interpolation``,
        ``image_size``, audio settings: see ``docs/finetune.md``). `ManifestDataModule` decodes with them;
        this default cannot, so it says which settings the weights expect and the data module leaves out.

        Example:
            >>> DataModule().use_model_preprocessing({})  # random init: nothing bound, nothing said
            >>> DataModule().use_model_preprocessing({"image_mean": [0.5, 0.5, 0.5]})
            sss: DataModule does not take the input preparation the weights expect (image_mean=[0.5, 0.5, 0.5]); ...
        """
        told = ("image_weights", "image_input_size")  # what the weights are, not how to prepare inputs
        keys = {k: v for k, v in prep.items() if k.startswith("image_") and k not in told}
        if keys and int(os.environ.get("RANK", "0")) == 0:
            shown = ", ".join(f"{k}={v}" for k, v in keys.items())
            print(
                f"sss: {type(self).__name__} does not take the input preparation the weights expect ({shown}); "
                "normalise its images with these values, or override use_model_preprocessing",
                flush=True,
            )

    def train_dataloader(self) -> DataLoader[Any]:
        """The training loader. Subclasses must implement it."""
        raise NotImplementedError(f"{type(self).__name__} must implement train_dataloader()")

    def val_dataloader(self) -> DataLoader[Any] | None:
        """The validation loader, or None (the default) to skip validation."""
        return None

    def test_dataloader(self) -> DataLoader[Any] | None:
        """The test loader, or None (the default) when there is no test set."""
        return None

    def predict_dataloader(self) -> DataLoader[Any] | None:
        """The loader for prediction: by default the test loader, else the validation loader (None without either)."""
        loader = self.test_dataloader()  # not `or`: bool() would call len(), which iterable datasets lack
        return loader if loader is not None else self.val_dataloader()
