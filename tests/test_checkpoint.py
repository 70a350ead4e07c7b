"""Checkpoint folders: atomic commit and recovery, the manifest and verification, rotation, the resume
config check, and pickle-free loading."""

from __future__ import annotations

import json
import pickle
import re
import shutil
from pathlib import Path

import pytest
import torch

from sss import Callback, SSSTrainer
from sss.callbacks.stock import add_stock_callbacks
from sss.checkpoint import (
    MARKER,
    DamagedCheckpointError,
    UnsafeCheckpointError,
    check_no_code_on_load,
    commit_folder,
    complete_checkpoints,
    config_differences,
    newest_verified,
    recover_leftovers,
    verify_checkpoint,
    write_marker,
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
    meta["num_processes"] = 2  # what a 2-process save writes: a second RNG file, and the manifest with it
    shutil.copy(ckpt / "random_states_0.pkl", ckpt / "random_states_1.pkl")
    write_marker(ckpt, {k: v for k, v in meta.items() if k != "files"})
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


# ---------------------------------------------------------------------- the manifest and verification
def _truncate(file: Path) -> None:
    file.write_bytes(file.read_bytes()[: file.stat().st_size // 2])


def _flip_a_bit(file: Path) -> None:
    data = bytearray(file.read_bytes())
    data[len(data) // 2] ^= 1
    file.write_bytes(bytes(data))


def _garble(file: Path) -> None:
    file.write_text(file.read_text()[:-40])


# damage: (file, what is done to it, the reason given after the file's path)
DAMAGE = {
    "optimizer deleted": ("optimizer.bin", Path.unlink, r"is missing \(listed in trainer_state\.json\)"),
    "safetensors truncated": ("model.safetensors", _truncate, r"is \d+ bytes but trainer_state\.json recorded \d+"),
    "optimizer truncated": ("optimizer.bin", _truncate, r"is \d+ bytes but trainer_state\.json recorded \d+"),
    "one bit flipped": ("model.safetensors", _flip_a_bit, r"does not match the CRC32 recorded in trainer_state\.json"),
    "marker not JSON": (MARKER, _garble, r"cannot be read as JSON"),
    "rng file deleted": ("random_states_0.pkl", Path.unlink, r"is missing .*the RNG state of process 0"),
}


def test_the_marker_lists_every_file_with_its_size_and_crc32(tmp_path):
    ckpt = _first_run(tmp_path)
    files = json.loads((ckpt / MARKER).read_text())["files"]
    assert set(files) == {p.name for p in ckpt.iterdir()} - {MARKER}
    assert {"model.safetensors", "optimizer.bin", "random_states_0.pkl"} <= set(files)
    for name, entry in files.items():
        assert entry["size"] == (ckpt / name).stat().st_size and re.fullmatch(r"[0-9a-f]{8}", entry["crc32"])
    assert verify_checkpoint(ckpt)["global_step"] == 4


@pytest.mark.parametrize("kind", list(DAMAGE))
def test_a_damaged_checkpoint_is_named_never_loaded_and_never_called_unsafe(kind, tmp_path):
    _first_run(tmp_path)
    older, newest = complete_checkpoints(tmp_path / "checkpoints")[-2:]
    name, damage, reason = DAMAGE[kind]
    damage(newest / name)
    # given explicitly: one error naming the file, not a traceback from deep inside a loader
    with pytest.raises(DamagedCheckpointError, match=re.escape(str(newest / name)) + " " + reason) as raised:
        _trainer(tmp_path, max_steps=6).fit(BoringModule(), train_dataloaders=boring_loader(), ckpt_path=newest)
    assert not isinstance(raised.value, UnsafeCheckpointError)
    # "the newest": the older checkpoint, with why the newest was skipped
    found, damaged = newest_verified(tmp_path / "checkpoints")
    assert found == older and len(damaged) == 1 and re.search(re.escape(name) + " " + reason, damaged[0])
    resumed = _trainer(tmp_path, max_steps=6)
    resumed.fit(BoringModule(), train_dataloaders=boring_loader(), ckpt_path=found)
    assert resumed.state.global_step == 6 and verify_checkpoint(newest)["global_step"] == 4  # saved anew


def test_a_truncated_pickle_is_damage_not_code(tmp_path):
    torch.save({"state": {0: {"exp_avg": torch.ones(1000)}}, "param_groups": [{"lr": 0.1}]}, tmp_path / "optimizer.bin")
    _truncate(tmp_path / "optimizer.bin")
    with pytest.raises(DamagedCheckpointError, match=r"optimizer\.bin cannot be read .*it is damaged"):
        check_no_code_on_load(tmp_path)
    with (tmp_path / "optimizer.bin").open("wb") as f:  # a plain pickle, cut short
        f.write(pickle.dumps({"lr": 0.1, "betas": list(range(100))}, protocol=2)[:50])
    with pytest.raises(DamagedCheckpointError, match=r"optimizer\.bin cannot be read"):
        check_no_code_on_load(tmp_path)


@pytest.mark.parametrize("protocol", [2, 4, 5])
def test_a_whole_pickle_that_needs_code_is_unsafe_whatever_its_protocol(protocol, tmp_path, capsys):
    # protocol 4 and 5 use opcodes torch's safe loader does not parse: still an attack, not damage
    (tmp_path / "optimizer.bin").write_bytes(pickle.dumps({"lr": 0.1, "hook": _Boom()}, protocol=protocol))
    with pytest.raises(UnsafeCheckpointError, match=r"optimizer\.bin would run code when loaded"):
        check_no_code_on_load(tmp_path)
    assert "pwned" not in capsys.readouterr().out


def test_a_marker_without_the_rng_file_of_a_process_does_not_verify(tmp_path):
    ckpt = _first_run(tmp_path)
    (ckpt / "random_states_0.pkl").unlink()
    meta = json.loads((ckpt / MARKER).read_text())
    write_marker(ckpt, {k: v for k, v in meta.items() if k != "files"})  # a manifest that does not list it
    with pytest.raises(DamagedCheckpointError, match=r"random_states_0\.pkl is missing \(the RNG state of process 0"):
        verify_checkpoint(ckpt)


def test_an_rng_state_that_load_state_cannot_restore_is_an_error(tmp_path):
    # Accelerate's load_state logs "Could not load random states" at info level and carries on; the
    # file verifies here (the manifest was written for it), so only the check after loading sees it.
    ckpt = _first_run(tmp_path)
    torch.save({"step": 0}, ckpt / "random_states_0.pkl")
    meta = json.loads((ckpt / MARKER).read_text())
    write_marker(ckpt, {k: v for k, v in meta.items() if k != "files"})
    with pytest.raises(DamagedCheckpointError, match=r"random_states_0\.pkl: the RNG state cannot be read from it"):
        _trainer(tmp_path, max_steps=6).fit(BoringModule(), train_dataloaders=boring_loader(), ckpt_path=ckpt)


def test_a_manifest_naming_files_outside_its_folder_does_not_verify(tmp_path):
    ckpt = _first_run(tmp_path)
    meta = json.loads((ckpt / MARKER).read_text())
    meta["files"]["../../secret"] = {"size": 1, "crc32": "00000000"}
    (ckpt / MARKER).write_text(json.dumps(meta))
    with pytest.raises(DamagedCheckpointError, match=r"its file list is not a manifest of this folder"):
        verify_checkpoint(ckpt)


def test_a_checkpoint_from_before_manifests_is_checked_for_its_model_and_rng_files(tmp_path):
    ckpt = _first_run(tmp_path)
    meta = json.loads((ckpt / MARKER).read_text())
    del meta["files"]
    (ckpt / MARKER).write_text(json.dumps(meta))
    assert verify_checkpoint(ckpt)["global_step"] == 4
    (ckpt / "model.safetensors").unlink()  # what the old rotation order could leave behind
    with pytest.raises(DamagedCheckpointError, match=r"model\.safetensors is missing"):
        verify_checkpoint(ckpt)


# ---------------------------------------------------------------------- rotation
class _Killed(BaseException):
    """The process dies here."""


def test_a_kill_during_rotation_never_leaves_a_complete_looking_checkpoint(tmp_path, monkeypatch):
    real_rmtree = shutil.rmtree

    def dies_after_the_weights(path, *args, **kwargs):  # rmtree's order is the directory's: any file may go first
        if re.fullmatch(r"step_\d+", Path(path).name):
            (Path(path) / "model.safetensors").unlink()
            raise _Killed
        return real_rmtree(path, *args, **kwargs)

    monkeypatch.setattr(shutil, "rmtree", dies_after_the_weights)
    with pytest.raises(_Killed):
        _trainer(tmp_path, checkpoint={"every_n_steps": 1, "keep_last": 2}).fit(
            BoringModule(), train_dataloaders=boring_loader()
        )
    monkeypatch.undo()
    folder = tmp_path / "checkpoints"
    half = folder / "step_0000001"  # the third save rotated the first one out, and died doing it
    assert half.is_dir() and not (half / "model.safetensors").exists()
    assert [p.name for p in complete_checkpoints(folder)] == ["step_0000002", "step_0000003"]
    assert newest_verified(folder) == (folder / "step_0000003", [])
    assert recover_leftovers(folder) == ["finished removing step_0000001 (its rotation was interrupted)"]
    assert not half.exists()


def test_rotation_after_a_fallback_keeps_the_checkpoints_it_just_saved(tmp_path):
    _first_run(tmp_path)  # steps 2 and 4
    folder = tmp_path / "checkpoints"
    (folder / "step_0000004" / "optimizer.bin").unlink()
    found, _ = newest_verified(folder)
    assert found.name == "step_0000002"
    seen = []  # the folder at each save, before that save's rotation: what the previous one kept

    class Look(Callback):
        def on_save_checkpoint(self, trainer, module):
            seen.append([p.name for p in complete_checkpoints(folder)])

    resumed = _trainer(tmp_path, max_steps=5, callbacks=[Look()], checkpoint={"every_n_steps": 3, "keep_last": 1})
    resumed.fit(BoringModule(), train_dataloaders=boring_loader(), ckpt_path=found)
    # the damaged step 4 lay beyond step 3: that rotation kept step 3, not the damaged one
    assert seen == [["step_0000002", "step_0000003", "step_0000004"], ["step_0000003", "step_0000004", "step_0000005"]]
    assert newest_verified(folder) == (folder / "step_0000005", [])


def test_a_setting_added_since_the_checkpoint_is_no_difference_at_its_default():
    from sss.checkpoint import config_differences

    saved = {"trainer": {"seed": 1, "optim": {"optimizer": {"lr": 0.1}}}}
    now = {"trainer": {"seed": 1, "optim": {"optimizer": {"lr": 0.1}, "param_groups": []}}}
    assert config_differences(saved, now) == []
    changed = {"trainer": {"seed": 1, "optim": {"optimizer": {"lr": 0.1}, "param_groups": [{"params": "a.*"}]}}}
    assert config_differences(saved, changed)  # set to something else: a difference


def test_export_and_validate_refuse_a_damaged_checkpoint_naming_the_file(tmp_path):
    # What a resume refuses, sss export / validate / test refuse too (they read the weights the same way).
    from sss.checkpoint import DamagedCheckpointError
    from sss.model_folder import load_trained_weights

    _first_run(tmp_path)
    ckpt = complete_checkpoints(tmp_path / "checkpoints")[-1]
    weights = ckpt / "model.safetensors"
    weights.write_bytes(weights.read_bytes()[:-16])  # truncated
    with pytest.raises(DamagedCheckpointError, match=r"model\.safetensors"):
        load_trained_weights(BoringModule(), ckpt, "hint")
