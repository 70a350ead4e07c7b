"""Data: the `DataModule` base class, manifest datasets, public layouts, the feature cache and the synthetic dataset.

Example:
    >>> from sss.data import DataModule
    >>> DataModule().num_classes
    0
"""

from __future__ import annotations

from sss.data.datamodule import DataModule
from sss.data.errors import DataError
from sss.data.folder import ManifestDataModule
from sss.data.layouts import LAYOUTS
from sss.data.manifest import ManifestDataset, SkipLog
from sss.data.synthetic import IndustrialDataModule, make_industrial

__all__ = [
    "LAYOUTS",
    "DataError",
    "DataModule",
    "IndustrialDataModule",
    "ManifestDataModule",
    "ManifestDataset",
    "SkipLog",
    "make_industrial",
]
