"""Shared fixtures: keep runs deterministic and off the user's folders."""

from __future__ import annotations

import os

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
