"""`notebook_fit` (sss fit from a notebook, 1 or N processes) and the example notebook."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from sss.config import ConfigError, load_config
from sss.run.notebook import _load, launch_description, notebook_fit

ROOT = Path(__file__).parents[2]
EXAMPLE = str(ROOT / "examples" / "industrial.yaml")
TINY = [
    "model.name=hunter_tiny",
    "data.n_train=16",
    "data.n_val=8",
    "data.n_test=0",
    "data.batch_size=4",
    "data.image_size=32",
    "data.clip_seconds=0.5",
    "trainer.max_steps=2",
    "trainer.log.progress=false",
    "trainer.log.trackers=[]",
    "trainer.checkpoint.every_epoch=false",
]
# One process in the kernel first, then two forked ones: the first must leave no Accelerator behind
# (Accelerate's launcher refuses to fork one), and the forks must not inherit the kernel's one-process state.
SCRIPT = f"""
import json
from accelerate import PartialState
from sss.run.notebook import notebook_fit
one = notebook_fit({EXAMPLE!r}, overrides={TINY!r})
PartialState(cpu=True)
two = notebook_fit({EXAMPLE!r}, num_processes=2, overrides={TINY!r})
print("RESULTS", json.dumps([one, two]))
"""


@pytest.mark.slow
def test_one_then_two_processes_return_the_results(tmp_path):
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": str(ROOT)}
    done = subprocess.run(
        [sys.executable, "-c", SCRIPT], cwd=tmp_path, capture_output=True, text=True, timeout=300, env=env
    )
    assert done.returncode == 0, done.stderr[-4000:]
    one, two = json.loads(done.stdout.split("RESULTS ", 1)[1])
    assert one["global_step"] == two["global_step"] == 2 and 0 <= two["val/accuracy"] <= 1
    assert one["model_dir"] == "runs/industrial/model" and two["model_dir"] == "runs/industrial_1/model"
    assert json.loads((tmp_path / "runs" / "industrial_1" / "results.json").read_text()) == two
    # what was launched, in sss's words; not Accelerate's "Launching training on 2 CUDAs." on this CPU machine
    assert "sss: notebook_fit: launching 2 processes on the CPU: one gloo process group (no GPU here)" in done.stdout
    assert "Launching training on" not in done.stdout
    # one gloo group with one main process, not two independent copies that would each report a run
    assert done.stdout.count("sss: run 'industrial' -> runs/industrial_1") == 1


def test_configs_from_a_dict_an_sssconfig_or_a_path_load_like_sss_fit():
    spec = {
        "name": "nb",
        "model": {"_target_": "sss.testing.BoringModule"},
        "data": {"_target_": "sss.testing.BoringDataset"},
    }
    cfg = _load(spec, ["trainer.max_steps=3"])
    assert cfg.name == "nb" and cfg.trainer.max_steps == 3 and cfg.trainer.output_dir == "runs/nb"
    again = _load(cfg, ["trainer.seed=7"])
    assert again.trainer.max_steps == 3 and again.trainer.seed == 7 and again.name == "nb"
    assert _load(EXAMPLE, ["trainer.max_steps=2"]).name == "industrial"
    with pytest.raises(ConfigError, match=r"notebook config: trainer\.max_stepz"):
        _load({**spec, "trainer": {"max_stepz": 3}}, [])
    with pytest.raises(ConfigError, match=r"notebook config: data: missing"):
        notebook_fit({"model": spec["model"]})


def test_several_processes_after_cuda_was_initialised_say_what_to_do(monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_initialized", lambda: True)
    with pytest.raises(RuntimeError, match=r"CUDA is already initialised.*Restart the kernel and call notebook_fit"):
        notebook_fit(load_config(EXAMPLE, TINY), num_processes=2)


def test_the_example_notebook_is_valid_and_its_code_compiles():
    path = ROOT / "examples" / "notebook.ipynb"
    nb = json.loads(path.read_text())
    assert nb["nbformat"] == 4 and nb["nbformat_minor"] >= 5 and "kernelspec" in nb["metadata"]
    ids = [cell["id"] for cell in nb["cells"]]
    assert len(set(ids)) == len(ids)  # nbformat 4.5 wants unique cell ids
    code = [cell for cell in nb["cells"] if cell["cell_type"] == "code"]
    assert {cell["cell_type"] for cell in nb["cells"]} == {"markdown", "code"} and code
    for cell in code:
        assert cell["outputs"] == [] and cell["execution_count"] is None
        compile("".join(cell["source"]), f"{path.name}:{cell['id']}", "exec")
    assert any(
        "notebook_fit(" in "".join(cell["source"]) and "num_processes=2" in "".join(cell["source"]) for cell in code
    )


def test_two_processes_are_announced_as_what_they_are(monkeypatch, capsys):
    # The launch itself is replaced (it would fork): what is printed before it is what this test is about.
    import torch.distributed.launcher.api as elastic

    launched = []
    monkeypatch.setattr(elastic, "elastic_launch", lambda config, entrypoint: lambda *a: launched.append(config))
    monkeypatch.setattr("accelerate.utils.is_cuda_available", lambda: False)  # a CPU-only machine, also on a GPU one
    with pytest.raises(RuntimeError, match="the main process ended without results"):
        notebook_fit(load_config(EXAMPLE, TINY), num_processes=2)
    out = capsys.readouterr().out
    assert launched and launched[0].nproc_per_node == 2
    assert "sss: notebook_fit: launching 2 processes on the CPU: one gloo process group (no GPU here)" in out
    assert "Launching training on" not in out and "CUDA" not in out  # Accelerate's "on 2 CUDAs." is held back
    import accelerate.launchers

    assert "print" not in vars(accelerate.launchers)  # its print is its own again afterwards


def test_the_launch_description_follows_the_devices(monkeypatch):
    assert launch_description(2, cpu=True).endswith("on the CPU: one gloo process group (trainer.cpu=true)")
    monkeypatch.setattr("accelerate.utils.is_cuda_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 2)
    assert launch_description(2) == "launching 2 processes, one CUDA GPU each (of 2): one nccl process group"
    with pytest.raises(
        ValueError,
        match=r"num_processes=4\) needs one GPU per process and this machine has 2: use "
        r"num_processes=2 or fewer, or add overrides=\['trainer.cpu=true'\]",
    ):
        launch_description(4)
