"""Checkpoint folders: atomic commit and recovery, the resume config check, and pickle-free loading."""

from __future__ import annotations

import json
import pickle

import pytest
import torch

from sss import SSSTrainer
from sss.callbacks.stock import add_stock_callbacks
from sss.checkpoint import (
    MARKER,
    UnsafeCheckpointError,
    check_no_code_on_load,
    commit_folder,
    complete_checkpoints,
    config_differences,
    recover_leftovers,
)
from sss.config import ConfigError
from sss.testing import BoringModule, boring_loader


def _trainer(tmp_path, **overrides):
    settings = dict(
        max_steps=4,
        mixed_precision="no",
        output_dir=str(tmp_path),
        log={"progress": False, "trackers": []},
        checkpoint={"every_n_steps": 2},
    )
    settings.update(overrides)
    return add_stock_callbacks(SSSTrainer(**settings))


def _first_run(tmp_path):
    _trainer(tmp_path).fit(BoringModule(), train_dataloaders=boring_loader())
    return complete_checkpoints(tmp_path / "checkpoints")[-1]


def test_meta_records_config_hash_and_processes(tmp_path):
    meta = json.loads((_first_run(tmp_path) / MARKER).read_text())
    assert meta["num_processes"] == 1 and len(meta["config_hash"]) == 16
    assert meta["config"]["trainer"]["max_steps"] == 4


def test_resume_refuses_a_math_change_naming_the_field(tmp_path):
    ckpt = _first_run(tmp_path)
    lr = {"optimizer": {"_target_": "torch.optim.AdamW", "lr": 0.5}}
    with pytest.raises(ConfigError, match=r"trainer\.optim\.optimizer\.lr: 0\.001 in the checkpoint, 0\.5 now"):
        _trainer(tmp_path, max_steps=8, optim=lr).fit(BoringModule(), train_dataloaders=boring_loader(), ckpt_path=ckpt)
    with pytest.raises(ConfigError, match=r"trainer\.max_steps: 4 in the checkpoint, 3 now \(it may only grow\)"):
        _trainer(tmp_path, max_steps=3).fit(BoringModule(), train_dataloaders=boring_loader(), ckpt_path=ckpt)
    # neutral fields and growth are fine
    resumed = _trainer(tmp_path, max_steps=6, log={"progress": False, "trackers": [], "every_n_steps": 3})
    resumed.fit(BoringModule(), train_dataloaders=boring_loader(), ckpt_path=ckpt)
    assert resumed.state.global_step == 6


def test_resume_refuses_another_process_count(tmp_path):
    ckpt = _first_run(tmp_path)
    meta = json.loads((ckpt / MARKER).read_text())
    meta["num_processes"] = 2
    (ckpt / MARKER).write_text(json.dumps(meta))
    with pytest.raises(ConfigError, match=r"written by 2 process\(es\) and this run has 1.*--num-processes 2"):
        _trainer(tmp_path, max_steps=6).fit(BoringModule(), train_dataloaders=boring_loader(), ckpt_path=ckpt)


class _Boom:
    def __reduce__(self):
        return (print, ("pwned",))


def test_a_pickle_that_runs_code_is_refused_before_loading(tmp_path, capsys):
    ckpt = _first_run(tmp_path)
    scheduler_file = next(ckpt.glob("*.bin"))  # optimizer.bin, loaded by Accelerate
    with (ckpt / "custom_checkpoint_0.pkl").open("wb") as f:
        pickle.dump({"lr": 0.1, "hook": _Boom()}, f, protocol=2)
    with pytest.raises(UnsafeCheckpointError, match=r"custom_checkpoint_0\.pkl would run code when loaded"):
        _trainer(tmp_path, max_steps=6).fit(BoringModule(), train_dataloaders=boring_loader(), ckpt_path=ckpt)
    assert "pwned" not in capsys.readouterr().out
    assert scheduler_file.exists()


def test_plain_states_pass_the_safety_check(tmp_path):
    torch.save({"state": {0: {"exp_avg": torch.ones(3)}}, "param_groups": [{"lr": 0.1}]}, tmp_path / "optimizer.bin")
    torch.save(torch.get_rng_state(), tmp_path / "rng.pt")
    check_no_code_on_load(tmp_path)


def test_commit_replaces_the_same_step_keeping_a_copy_until_done(tmp_path):
    final, tmp = tmp_path / "step_0000004", tmp_path / "step_0000004.tmp"
    for folder, text in ((final, "old"), (tmp, "new")):
        folder.mkdir()
        (folder / MARKER).write_text(text)
    commit_folder(tmp, final)
    assert (final / MARKER).read_text() == "new" and sorted(p.name for p in tmp_path.iterdir()) == [final.name]


def test_recovery_after_a_kill_between_the_two_renames(tmp_path):
    # commit_folder moved the old copy aside and was killed before renaming the new one in
    old, tmp = tmp_path / "step_0000004.old", tmp_path / "step_0000004.tmp"
    for folder in (old, tmp):
        folder.mkdir()
        (folder / MARKER).write_text("{}")
    lines = recover_leftovers(tmp_path)
    assert [p.name for p in complete_checkpoints(tmp_path)] == ["step_0000004"]
    assert lines == ["restored step_0000004 from step_0000004.old", "removed the incomplete save step_0000004.tmp"]


def test_config_differences_ignore_neutral_fields():
    saved = {"name": "a", "trainer": {"seed": 1, "log": {"every_n_steps": 5}, "max_epochs": 3}, "model": {"x": 1}}
    new = {"name": "b", "trainer": {"seed": 1, "log": {"every_n_steps": 9}, "max_epochs": 5}, "model": {"x": 2}}
    assert config_differences(saved, new) == ["model.x: 1 in the checkpoint, 2 now"]
