"""Shared fixtures: keep runs deterministic and off the user's folders."""

from __future__ import annotations

import importlib.util
import os
import sys
from collections.abc import Callable
from pathlib import Path
from types import ModuleType

# Pin MKL's floating-point path before torch loads it (a fresh process may take another one), as `sss` does.
# In-process tests can therefore never see the CLI set it: test_subprocess_env.py checks that in a child without it.
os.environ.setdefault("MKL_CBWR", "AUTO,STRICT")

import pytest
import torch

from sss.testing import subprocess_env

# Every child process a test starts imports this process's sss (the checkout under test), not an installed
# copy: children that inherit os.environ get it here; those given their own PYTHONPATH use subprocess_env().
os.environ["PYTHONPATH"] = subprocess_env()["PYTHONPATH"]

# tests/scripts/ holds programs the tests launch in subprocesses (some run at import): not test modules.
collect_ignore = ["scripts"]


@pytest.fixture(autouse=True)
def _isolated(tmp_path, monkeypatch):
    """Each test runs in its own folder with a private data cache and 2 threads."""
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("SSS_CACHE", str(tmp_path / "cache"))
    # `sss fit` reads Accelerate's default config file; a developer's own must not change the tests.
    import accelerate.commands.config

    monkeypatch.setattr(accelerate.commands.config, "default_config_file", str(tmp_path / "no_accelerate_config.yaml"))
    torch.set_num_threads(2)
    yield
    # Accelerate keeps process-wide singletons; each test starts from a fresh one.
    from accelerate.state import AcceleratorState, GradientState

    AcceleratorState._reset_state(reset_partial_state=True)
    GradientState._reset_state()


@pytest.fixture(scope="session")
def benchmark_script() -> Callable[[str], ModuleType]:
    """``benchmark_script("pretrain")``: benchmarks/pretrain.py as the module ``sss_benchmark_pretrain``."""
    benchmarks = Path(__file__).resolve().parents[1] / "benchmarks"

    def load(name: str) -> ModuleType:
        spec = importlib.util.spec_from_file_location(f"sss_benchmark_{name}", benchmarks / f"{name}.py")
        module = importlib.util.module_from_spec(spec)
        sys.modules[spec.name] = module  # its dataclasses look their module up there
        spec.loader.exec_module(module)
        return module

    return load
