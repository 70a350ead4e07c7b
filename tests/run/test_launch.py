"""Launch settings: flag > sss YAML/override > Accelerate config file > default, resolved and printed by `sss fit`."""

from __future__ import annotations

import itertools
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

import sss.run.launch
from sss.cli import main
from sss.config import ConfigError, load_config
from sss.run.launch import accelerate_config, launcher_flags, resolve_launch, single_process_launch
from sss.trainer.trainer import use_cpu

ROOT = Path(__file__).parents[2]
EXAMPLE = str(ROOT / "examples" / "industrial.yaml")
SHORT = ["model.name=hunter_tiny", "data.n_train=32", "data.n_val=8", "data.n_test=8", "data.batch_size=8"]


@pytest.mark.parametrize("flag,yaml,file", list(itertools.product([None, "bf16"], [None, "fp16"], [None, "no"])))
def test_precedence_table(flag, yaml, file):
    settings = resolve_launch(
        {"mixed_precision": flag}, {"mixed_precision": yaml}, {"mixed_precision": file} if file else {}, "cfg.yaml"
    )
    chosen = {s.key: s for s in settings}["mixed_precision"]
    expected = next(
        (v, src)
        for v, src in (
            (flag, "launch flag"),
            (yaml, "sss config"),
            (file, "accelerate config cfg.yaml"),
            ("auto", "default"),
        )
        if v is not None
    )
    assert (chosen.value, chosen.source) == expected


def test_accelerate_config_file_values(tmp_path):
    path = tmp_path / "acc.yaml"
    path.write_text(
        "compute_environment: LOCAL_MACHINE\nnum_processes: 2\nmixed_precision: bf16\n"
        "deepspeed_config:\n  gradient_accumulation_steps: 4\n"
    )
    assert accelerate_config(str(path)) == (
        {"num_processes": 2, "mixed_precision": "bf16", "gradient_accumulation_steps": 4},
        str(path),
    )
    assert accelerate_config(None) == ({}, None)  # conftest points the default file at nothing
    path.write_text("- a list\n")
    with pytest.raises(ConfigError, match=r"acc\.yaml: not an Accelerate config"):
        accelerate_config(str(path))


def test_explicit_keys_come_from_the_yaml_and_the_overrides(tmp_path):
    path = tmp_path / "x.yaml"
    path.write_text("trainer:\n  gradient_accumulation_steps: 2\n")
    sources: dict[str, str] = {}
    load_config(path, ["name=a"], sources)
    assert {"trainer", "trainer.gradient_accumulation_steps", "name"} <= set(sources)
    assert sources["trainer.gradient_accumulation_steps"] == str(path) and sources["name"] == "override"
    assert "trainer.mixed_precision" not in sources  # left at its default


def test_a_user_accelerate_launch_flag_is_told_from_its_config_file(monkeypatch):
    monkeypatch.setenv("ACCELERATE_MIXED_PRECISION", "bf16")
    assert launcher_flags({"mixed_precision": "no"}) == {"mixed_precision": "bf16"}  # differs: a flag
    assert launcher_flags({"mixed_precision": "bf16"}) == {}  # the file's own value: config level
    monkeypatch.setenv("ACCELERATE_MIXED_PRECISION", "no")
    assert launcher_flags({}) == {}  # the launcher's default


def test_sss_fit_resolves_prints_and_applies_the_settings(tmp_path, capsys):
    acc = tmp_path / "acc.yaml"
    acc.write_text("num_processes: 1\nmixed_precision: bf16\ndeepspeed_config:\n  gradient_accumulation_steps: 2\n")
    args = ["fit", EXAMPLE, *SHORT, "trainer.max_steps=2", "trainer.log.progress=false"]
    assert main([*args, "--config-file", str(acc), "--mixed-precision", "no"]) == 0
    out = capsys.readouterr().out
    assert (
        f"sss: num_processes=1 (accelerate config {acc}), mixed_precision=no (launch flag), "
        f"gradient_accumulation_steps=2 (accelerate config {acc})" in out
    )
    saved = Path("runs/industrial/config.yaml").read_text()
    assert "gradient_accumulation_steps: 2" in saved and "mixed_precision: 'no'" in saved
    results = json.loads(Path("runs/industrial/results.json").read_text())
    assert results["global_step"] == 2 and results["train_samples_per_second"] > 0
    # an sss override outranks the Accelerate config file
    assert (
        main([*args, "trainer.gradient_accumulation_steps=1", "--config-file", str(acc), "--mixed-precision=no"]) == 0
    )
    assert "gradient_accumulation_steps=1 (sss config)" in capsys.readouterr().out


def test_sss_fit_debug_runs_two_batches_with_shapes_in_its_own_folder(capsys):
    assert main(["fit", EXAMPLE, *SHORT, "trainer.log.progress=false", "--debug"]) == 0
    out = capsys.readouterr().out
    assert "-> --debug: mixed_precision=no" in out
    assert "sss debug [fit] batch: audio float32 [8, 1, 16000]" in out and "sss debug [val] outputs ->" in out
    results = json.loads(Path("runs/industrial_debug/results.json").read_text())
    assert results["global_step"] == 2 and results["checkpoint_dir"] is None
    assert not Path("runs/industrial").exists()


def test_debug_never_writes_into_a_finished_run(tmp_path, capsys):
    mine = tmp_path / "mine"
    args = ["fit", EXAMPLE, *SHORT, "trainer.log.progress=false", f"trainer.output_dir={mine}"]
    assert main([*args, "trainer.max_steps=1"]) == 0
    before = (mine / "results.json").read_text()
    assert main([*args, "--debug"]) == 0
    assert (mine / "results.json").read_text() == before and (tmp_path / "mine_debug" / "results.json").is_file()
    capsys.readouterr()
    assert main([*args, "trainer.max_steps=1", "trainer.checkpoint.every_epoch=false"]) == 1
    assert "already holds a finished run" in capsys.readouterr().err


LAUNCHED = {"ACCELERATE_MIXED_PRECISION": "no", "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": "29500"}
"""What Accelerate's simple launcher exports to the one process it starts for --num_processes 2 (no WORLD_SIZE)."""


def test_a_single_process_launch_asked_for_several_is_told_with_the_command_that_starts_them():
    launcher = ["/venv/bin/python", "/venv/bin/accelerate", "launch", "--num_processes", "2", "-m", "sss", "fit"]
    message = single_process_launch(LAUNCHED, [*launcher, "x.yaml", "trainer.max_steps=3"])
    assert message == (
        "accelerate launch was asked for 2 processes but started this one alone: without --multi_gpu, on a machine "
        "with fewer than two GPUs, it runs the script once. Run: accelerate launch --multi_gpu --num_processes 2 -m "
        "sss fit x.yaml trainer.max_steps=3 (the same as: sss fit x.yaml trainer.max_steps=3 --num-processes 2); "
        "without GPUs (or with trainer.cpu=true) the processes form a gloo group on the CPU"
    )
    # --cpu runs one process too; the command drops it (sss forms the gloo group itself)
    cpu = single_process_launch(LAUNCHED, ["accelerate", "launch", "--cpu", "--num_processes=2", "-m", "sss", "fit"])
    assert "with --cpu it runs the script once. Run: accelerate launch --multi_gpu --num_processes=2 -m sss fit" in cpu
    # python -m accelerate.commands.launch, and `sss fit --num-processes` given to the script, not the launcher
    module = [sys.executable, "-m", "accelerate.commands.launch", "--num-processes", "3", "-m", "sss", "fit", "a.yaml"]
    assert "Run: accelerate launch --multi_gpu --num-processes 3 -m sss fit a.yaml" in single_process_launch(
        LAUNCHED, module
    )


def test_the_process_count_of_the_launchers_config_file_counts(tmp_path):
    acc = tmp_path / "acc.yaml"
    acc.write_text("distributed_type: NO\nnum_processes: 2\n")
    argv = ["accelerate", "launch", "--config_file", str(acc), "-m", "sss", "fit", "x.yaml"]
    message = single_process_launch(LAUNCHED, argv)
    assert f"Run: accelerate launch --multi_gpu --num_processes 2 --config_file {acc} -m sss fit x.yaml" in message


@pytest.mark.parametrize(
    "env,argv",
    [
        ({**LAUNCHED, "WORLD_SIZE": "2"}, None),  # torchrun (--multi_gpu) started the group
        ({**LAUNCHED, "OMPI_COMM_WORLD_SIZE": "2"}, None),  # mpirun did
        ({"MASTER_PORT": "29500"}, None),  # not started by accelerate launch
        (LAUNCHED, ["accelerate", "launch", "--num_processes", "1", "-m", "sss", "fit", "x.yaml"]),  # one asked for
        (LAUNCHED, ["accelerate", "launch", "-m", "sss", "fit", "x.yaml"]),  # no count, no config file: 1
        (LAUNCHED, ["/bin/bash", "-c", "sss fit x.yaml --num_processes 2"]),  # the parent is not the launcher
        (LAUNCHED, []),  # the parent's command line could not be read
    ],
)
def test_no_complaint_where_nothing_is_missing(env, argv):
    launcher = argv if argv is not None else ["accelerate", "launch", "--num_processes", "2", "-m", "sss", "fit", "x"]
    assert single_process_launch(env, launcher) is None


def test_sss_fit_refuses_a_single_process_launch_asked_for_two(monkeypatch, capsys):
    for name, value in LAUNCHED.items():
        monkeypatch.setenv(name, value)
    for name in ("WORLD_SIZE", "LOCAL_RANK", "RANK", "SSS_LAUNCH_RESOLVED"):
        monkeypatch.delenv(name, raising=False)
    argv = ["/venv/bin/accelerate", "launch", "--num_processes", "2", "-m", "sss", "fit", EXAMPLE]
    monkeypatch.setattr(sss.run.launch, "launcher_argv", lambda: argv)
    assert main(["fit", EXAMPLE, *SHORT]) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: accelerate launch was asked for 2 processes but started this one alone")
    assert f"Run: accelerate launch --multi_gpu --num_processes 2 -m sss fit {EXAMPLE}" in err
    assert not Path("runs").exists()  # refused before anything was built or written


def test_an_mpi_launch_on_the_cpu_forms_a_gloo_group(monkeypatch):
    # mpirun (accelerate launch --cpu --mpirun_hostfile) sets the MPI world size, not WORLD_SIZE
    monkeypatch.setattr(torch.accelerator, "is_available", lambda: False)
    for name in ("WORLD_SIZE", "LOCAL_RANK", "PMI_SIZE", "MV2_COMM_WORLD_SIZE"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("OMPI_COMM_WORLD_SIZE", "2")
    assert use_cpu(False)
    monkeypatch.setenv("OMPI_COMM_WORLD_SIZE", "1")
    assert not use_cpu(False)


@pytest.mark.slow
def test_a_real_accelerate_launch_of_two_processes_without_multi_gpu_is_refused(tmp_path):
    env = {**os.environ, "OMP_NUM_THREADS": "1", "HF_HOME": str(tmp_path / "hf")}  # no accelerate config of the user's
    for name in ("WORLD_SIZE", "LOCAL_RANK", "RANK", "SSS_LAUNCH_RESOLVED", "ACCELERATE_MIXED_PRECISION"):
        env.pop(name, None)
    accelerate = Path(sys.executable).with_name("accelerate")
    cmd = [str(accelerate), "launch", "--num_processes", "2", "-m", "sss", "fit", EXAMPLE, *SHORT]
    done = subprocess.run(cmd, cwd=tmp_path, capture_output=True, text=True, timeout=120, env=env)
    assert done.returncode != 0
    assert "error: accelerate launch was asked for 2 processes but started this one alone" in done.stderr
    assert f"Run: accelerate launch --multi_gpu --num_processes 2 -m sss fit {EXAMPLE}" in done.stderr
    assert not (tmp_path / "runs").exists()


def test_one_helper_decides_to_launch_or_run_here(monkeypatch):
    # fit, tune, validate and test all go through launch_or_run: N > 1 launches, unless this is a launched rank.
    launched = []
    monkeypatch.setattr(sss.run.launch, "relaunch", lambda n, args, *rest: launched.append((n, args, rest)) or 7)
    monkeypatch.delenv("LOCAL_RANK", raising=False)
    assert sss.run.launch.launch_or_run(2, ["test", "--ckpt", "c"], True) == 7
    assert launched == [(2, ["test", "--ckpt", "c"], (True, None))]
    assert sss.run.launch.launch_or_run(1, ["fit", "x.yaml"]) is None
    assert sss.run.launch.launch_or_run(None, ["validate", "--ckpt", "c"]) is None
    monkeypatch.setenv("LOCAL_RANK", "0")  # a rank of the launched group runs the command itself
    assert sss.run.launch.launch_or_run(2, ["fit", "x.yaml"]) is None
    assert len(launched) == 1
