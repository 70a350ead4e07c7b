"""`sss fit` exports the full state dict: gathered through Accelerate on every process, written by the main one."""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from sss.config import SSSConfig, instantiate
from sss.model_folder import WEIGHTS, export_model
from sss.run.launch import launch_command

SCRIPT = Path(__file__).parents[1] / "scripts" / "export_ddp.py"


def test_export_model_writes_the_given_state_dict_not_the_modules_own(tmp_path):
    cfg = SSSConfig(name="demo", model={"_target_": "sss.testing.BoringModule"})
    module = instantiate(cfg.model)
    # what a process of a sharded run holds vs what the gather returns: they differ, the gathered one is written
    gathered = {k: torch.full_like(v, 7.0) for k, v in module.state_dict().items()}
    export_model(module, cfg, {}, tmp_path / "m", state_dict=gathered)
    written = load_file(str(tmp_path / "m" / WEIGHTS))
    assert written.keys() == gathered.keys() and all(torch.equal(written[k], gathered[k]) for k in gathered)
    with pytest.raises(ValueError, match=r"state_dict is empty.*get_state_dict"):
        export_model(module, cfg, {}, tmp_path / "empty", state_dict={})


@pytest.mark.slow
def test_two_process_fit_gathers_the_weights_on_every_process_and_exports_them(tmp_path):
    out = tmp_path / "run"
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    command = launch_command(2, [str(SCRIPT), str(out)])
    done = subprocess.run(command, capture_output=True, text=True, timeout=300, env=env)
    assert done.returncode == 0, done.stderr[-3000:]
    for rank in (0, 1):  # the export's gather (sss fit's export_run_model) ran on both processes, not on the main one
        callers = json.loads((out / f"calls.{rank}").read_text())
        assert any(c.endswith("sss/callbacks/export.py") for c in callers), (rank, callers)
    # the exported weights are the trained ones (the last checkpoint's, saved by Accelerate with the wrapper prefix)
    exported = load_file(str(out / "model" / WEIGHTS))
    last = sorted((out / "checkpoints").glob("step_*"))[-1]
    trained = {k.removeprefix("module."): v for k, v in load_file(str(last / WEIGHTS)).items()}
    assert exported.keys() == trained.keys()
    for name, value in trained.items():
        assert torch.equal(exported[name], value), name
