"""The ``Example:`` blocks of `sss.models` run as doctests."""

from __future__ import annotations

import doctest
import importlib

import pytest

MODULES = [
    "sss.models",
    "sss.models.base",
    "sss.models.hunter",
    "sss.models.image.timm_encoder",
    "sss.models.audio.frontend",
    "sss.models.audio.cnn",
    "sss.models.fusion.cross_attention",
    "sss.models.fusion.late",
]


@pytest.mark.parametrize("name", MODULES)
def test_doctests(name: str) -> None:
    result = doctest.testmod(importlib.import_module(name), optionflags=doctest.ELLIPSIS | doctest.NORMALIZE_WHITESPACE)
    assert result.failed == 0
    assert result.attempted > 0 or name == "sss.models.fusion._pool"
