"""Tests of what only a GPU shows: every test under tests/gpu/ is marked ``gpu`` and skipped without CUDA."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

HERE = Path(__file__).resolve().parent
NO_CUDA = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")


def pytest_collection_modifyitems(config, items):
    for item in items:
        if HERE in Path(str(item.fspath)).resolve().parents:
            item.add_marker(pytest.mark.gpu)
            item.add_marker(NO_CUDA)
