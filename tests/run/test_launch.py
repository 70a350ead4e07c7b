"""Launch settings: flag > sss YAML/override > Accelerate config file > default, resolved and printed by `sss fit`."""

from __future__ import annotations

import itertools
import json
from pathlib import Path

import pytest

from sss.cli import main
from sss.config import ConfigError, load_config
from sss.run.launch import accelerate_config, launcher_flags, resolve_launch

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
