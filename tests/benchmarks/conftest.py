"""The benchmark scripts under benchmarks/ load as modules for their tests (`benchmark_script`)."""

from __future__ import annotations

import importlib.util
import sys
from collections.abc import Callable
from pathlib import Path
from types import ModuleType

import pytest

BENCHMARKS = Path(__file__).resolve().parents[2] / "benchmarks"


@pytest.fixture(scope="session")
def benchmark_script() -> Callable[[str], ModuleType]:
    """``benchmark_script("pretrain")``: benchmarks/pretrain.py as the module ``sss_benchmark_pretrain``."""

    def load(name: str) -> ModuleType:
        spec = importlib.util.spec_from_file_location(f"sss_benchmark_{name}", BENCHMARKS / f"{name}.py")
        module = importlib.util.module_from_spec(spec)
        sys.modules[spec.name] = module  # its dataclasses look their module up there
        spec.loader.exec_module(module)
        return module

    return load
