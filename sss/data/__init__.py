"""Data: the `DataModule` base class, manifest datasets and the synthetic industrial dataset.

Example:
    >>> from sss.data import DataModule
    >>> DataModule().num_classes
    0
"""

from __future__ import annotations

from sss.data.datamodule import DataModule
from sss.data.manifest import ManifestDataModule, ManifestDataset
from sss.data.synthetic import IndustrialDataModule, make_industrial

__all__ = ["DataModule", "IndustrialDataModule", "ManifestDataModule", "ManifestDataset", "make_industrial"]
