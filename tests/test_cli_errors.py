"""Every error of `sss` ends as one line and an exit code, never a traceback; `sss check` refuses what `fit` would.

The table of bad values runs each case through both ``sss check`` and ``sss fit`` in-process:
exit 2, exactly one ``error:`` line naming the key, and no data set up (the data modules' ``setup``
is recorded, and the manifest cases point at a data root that does not exist, where a fit that
got as far as the data would end with exit 1 and a different message).
"""

from __future__ import annotations

import errno
import json
import os
import signal
import sys
from pathlib import Path

import pytest
import yaml

from sss.cli import main
from sss.run.explain import explain_error

ROOT = Path(__file__).parents[1]
INDUSTRIAL = str(ROOT / "examples" / "industrial.yaml")
MANIFEST = str(ROOT / "examples" / "manifest.yaml")
LR = "trainer.optim.optimizer.lr"
OPT = "trainer.optim.optimizer"
SCHED = "trainer.optim.scheduler"
BORING = {
    "trainer": {"max_steps": 3, "log": {"progress": False, "trackers": []}},
    "model": {"_target_": "sss.testing.BoringModule"},
    "data": {"_target_": "sss.testing.BoringDataModule"},
}

# (case id, example config, overrides, the key the one error line must name)
OVERRIDES = [
    ("batch size 0", INDUSTRIAL, ["data.batch_size=0"], "data.batch_size"),
    ("batch size negative", INDUSTRIAL, ["data.batch_size=-3"], "data.batch_size"),
    ("batch size fraction", INDUSTRIAL, ["data.batch_size=2.5"], "data.batch_size"),
    ("batch size bool", INDUSTRIAL, ["data.batch_size=true"], "data.batch_size"),
    ("workers negative", INDUSTRIAL, ["data.num_workers=-1"], "data.num_workers"),
    ("no training samples", INDUSTRIAL, ["data.n_train=0"], "data.n_train"),
    ("negative val samples", INDUSTRIAL, ["data.n_val=-1"], "data.n_val"),
    ("negative data seed", INDUSTRIAL, ["data.seed=-1"], "data.seed"),
    ("image size 0", INDUSTRIAL, ["data.image_size=0"], "data.image_size"),
    ("sample rate 0", INDUSTRIAL, ["data.sample_rate=0"], "data.sample_rate"),
    ("clip length 0", INDUSTRIAL, ["data.clip_seconds=0"], "data.clip_seconds"),
    ("clip length negative", INDUSTRIAL, ["data.clip_seconds=-1.5"], "data.clip_seconds"),
    ("mel bins 0", INDUSTRIAL, ["data.n_mels=0"], "data.n_mels"),
    ("unknown cache kind", INDUSTRIAL, ["data.cache=disk"], "data.cache"),
    ("on_error on the synthetic data", INDUSTRIAL, ["data.on_error=ignore"], "data.on_error"),
    ("lr negative", INDUSTRIAL, [f"{LR}=-1"], LR),
    ("lr zero", INDUSTRIAL, [f"{LR}=0"], LR),
    ("lr a word", INDUSTRIAL, [f"{LR}=fast"], LR),
    ("lr a list", INDUSTRIAL, [f"{LR}=[0.1,0.2]"], LR),
    ("lr in quotes", INDUSTRIAL, [f"{LR}='1e-3'"], LR),
    ("weight decay negative", INDUSTRIAL, [f"{OPT}.weight_decay=-0.1"], f"{OPT}.weight_decay"),
    ("eps zero", INDUSTRIAL, [f"{OPT}.eps=0"], f"{OPT}.eps"),
    ("beta out of range", INDUSTRIAL, [f"{OPT}.betas=[0.9,1.5]"], f"{OPT}.betas"),
    ("one beta", INDUSTRIAL, [f"{OPT}.betas=[0.9]"], f"{OPT}.betas"),
    ("amsgrad a word", INDUSTRIAL, [f"{OPT}.amsgrad=maybe"], f"{OPT}.amsgrad"),
    ("warm-up negative", INDUSTRIAL, [f"{SCHED}.warmup_steps=-5"], f"{SCHED}.warmup_steps"),
    ("min lr ratio above 1", INDUSTRIAL, [f"{SCHED}.min_lr_ratio=2"], f"{SCHED}.min_lr_ratio"),
    ("model target not callable", INDUSTRIAL, ["model._target_=math.pi"], "model._target_"),
    ("data target not callable", INDUSTRIAL, ["data._target_=math.pi"], "data._target_"),
    ("optimizer target not callable", INDUSTRIAL, [f"{OPT}._target_=math.pi"], f"{OPT}._target_"),
    ("no classes", INDUSTRIAL, ["model.num_classes=0"], "model.num_classes"),
    ("unknown model", INDUSTRIAL, ["model.name=hunter_huge"], "model.name"),
    ("trainer seed negative", INDUSTRIAL, ["trainer.seed=-1"], "trainer.seed"),
    ("unknown tracker", INDUSTRIAL, ["trainer.log.trackers=[csv,foo]"], "trainer.log.trackers[1]"),
    ("trackers not a list", INDUSTRIAL, ["trainer.log.trackers=csv"], "trainer.log.trackers"),
    ("trainer section a number", INDUSTRIAL, ["trainer=5"], "trainer"),
    ("optim section a number", INDUSTRIAL, ["trainer.optim=1"], "trainer.optim"),
    ("callbacks a number", INDUSTRIAL, ["callbacks=5"], "callbacks"),
    ("max steps 0", INDUSTRIAL, ["trainer.max_steps=0"], "trainer.max_steps"),
    ("max epochs a word", INDUSTRIAL, ["trainer.max_epochs=lots"], "trainer.max_epochs"),
    ("precision fp64", INDUSTRIAL, ["trainer.mixed_precision=fp64"], "trainer.mixed_precision"),
    ("accumulation 0", INDUSTRIAL, ["trainer.gradient_accumulation_steps=0"], "trainer.gradient_accumulation_steps"),
    ("keep no checkpoint", INDUSTRIAL, ["trainer.checkpoint.keep_last=0"], "trainer.checkpoint.keep_last"),
    ("checkpoint mode", INDUSTRIAL, ["trainer.checkpoint.mode=up"], "trainer.checkpoint.mode"),
    ("log cadence 0", INDUSTRIAL, ["trainer.log.every_n_steps=0"], "trainer.log.every_n_steps"),
    ("no training batches", INDUSTRIAL, ["trainer.limit_train_batches=0"], "trainer.limit_train_batches"),
    ("clip norm negative", INDUSTRIAL, ["trainer.max_grad_norm=-1"], "trainer.max_grad_norm"),
    ("misspelled trainer key", INDUSTRIAL, ["trainer.max_stepz=3"], "trainer.max_stepz"),
    ("unknown layout", MANIFEST, ["data.layout=audioset"], "data.layout"),
    ("unknown bad-row policy", MANIFEST, ["data.on_error=ignore"], "data.on_error"),
    ("fold 0", MANIFEST, ["data.fold=0"], "data.fold"),
    ("prefetch 0", MANIFEST, ["data.prefetch_factor=0"], "data.prefetch_factor"),
    ("event frame rate 0", MANIFEST, ["data.event_frame_rate=0"], "data.event_frame_rate"),
    ("manifest cache kind", MANIFEST, ["data.cache=mmap"], "data.cache"),
    ("manifest workers negative", MANIFEST, ["data.num_workers=-2"], "data.num_workers"),
]

# (case id, YAML merged over BORING, the key)
YAMLS = [
    ("callback target not callable", {"callbacks": [{"_target_": "math.pi"}]}, "callbacks[0]._target_"),
    ("empty output folder", {"trainer": {**BORING["trainer"], "output_dir": ""}}, "trainer.output_dir"),
    ("lr a string in YAML", {"trainer": {**BORING["trainer"], "optim": {"optimizer": {"lr": "fast"}}}}, LR),
    (
        "industrial batch size in YAML",
        {"data": {"_target_": "sss.data.IndustrialDataModule", "batch_size": 0}},
        "data.batch_size",
    ),
]


@pytest.fixture
def no_data(monkeypatch):
    """Records any data module's setup: a case that reaches the data fails the test."""
    import sss.data
    import sss.testing

    calls = []
    for cls in (sss.data.ManifestDataModule, sss.data.IndustrialDataModule, sss.testing.BoringDataModule):
        monkeypatch.setattr(cls, "setup", lambda self, stage, cls=cls: calls.append(cls.__name__))
    return calls


def _one_line_naming(err: str, key: str) -> str:
    lines = err.strip().splitlines()
    assert len(lines) == 1, err
    assert "Traceback" not in err and lines[0].startswith("error: "), err
    assert f"{key}:" in lines[0] or f"{key} must" in lines[0] or f"{key} is" in lines[0], lines[0]
    return lines[0]


def _assert_refused_by_check_and_fit(config, overrides, key, capsys, no_data):
    for command in ("check", "fit"):
        assert main([command, config, *overrides]) == 2, (command, capsys.readouterr())
        line = _one_line_naming(capsys.readouterr().err, key)
        assert line.count(Path(config).name) <= 1, line  # the file is named once
    assert no_data == []


@pytest.mark.parametrize(("case", "config", "overrides", "key"), OVERRIDES, ids=[c[0] for c in OVERRIDES])
def test_a_bad_value_exits_2_from_check_and_fit_naming_its_key(case, config, overrides, key, capsys, no_data):
    extra = ["data.root=no-such-folder"] if config == MANIFEST else []  # a fit that read data would fail there
    _assert_refused_by_check_and_fit(config, [*extra, *overrides], key, capsys, no_data)


@pytest.mark.parametrize(("case", "extra", "key"), YAMLS, ids=[c[0] for c in YAMLS])
def test_a_bad_yaml_value_exits_2_from_check_and_fit_naming_its_key(case, extra, key, tmp_path, capsys, no_data):
    path = tmp_path / "bad.yaml"
    path.write_text(yaml.safe_dump({**BORING, **extra}))
    _assert_refused_by_check_and_fit(str(path), [], key, capsys, no_data)


def test_the_table_is_large_and_its_configs_pass_without_the_bad_value(tmp_path, capsys):
    # Negative control: the configs of the table pass, so each refusal comes from its one bad value.
    assert len(OVERRIDES) + len(YAMLS) >= 40
    assert main(["check", INDUSTRIAL]) == 0
    assert main(["check", MANIFEST, "data.root=no-such-folder"]) == 0
    path = tmp_path / "good.yaml"
    path.write_text(yaml.safe_dump(BORING))
    assert main(["check", str(path)]) == 0
    # ... and a fit that gets as far as the data ends otherwise: exit 1, one line naming the data root
    capsys.readouterr()
    assert main(["fit", MANIFEST, "data.root=no-such-folder", "trainer.log.progress=false"]) == 1
    err = capsys.readouterr().err
    assert "Traceback" not in err and err.strip().splitlines()[-1].startswith("error: ") and "no-such-folder" in err


def test_a_duplicate_yaml_key_is_an_error_naming_file_line_and_key(tmp_path, capsys):
    path = tmp_path / "dup.yaml"
    path.write_text(yaml.safe_dump(BORING) + "trainer:\n  max_steps: 9\n")  # `trainer:` a second time
    for command in ("check", "fit", "config"):
        assert main([command, str(path)]) == 2
        err = capsys.readouterr().err
        assert err.startswith(f"error: {path}: line 10, column 1: duplicate key 'trainer' (first on line 5)"), err
        assert err.count("\n") == 1 and err.count(str(path)) == 1
    nested = tmp_path / "nested.yaml"
    nested.write_text("trainer:\n  max_steps: 3\n  seed: 1\n  max_steps: 4\n")
    assert main(["check", str(nested)]) == 2
    assert "line 4, column 3: duplicate key 'max_steps' (first on line 2)" in capsys.readouterr().err


def test_a_section_given_a_value_names_the_section_not_a_question_mark(capsys):
    assert main(["check", INDUSTRIAL, "trainer=5"]) == 2
    err = capsys.readouterr().err
    assert "override 'trainer=5': trainer: expected a mapping of settings, got int 5" in err and "?" not in err


def test_the_config_file_is_named_once(tmp_path, capsys):
    missing = tmp_path / "missing.yaml"
    assert main(["check", str(missing)]) == 2
    assert capsys.readouterr().err == f"error: {missing}: no such config file\n"
    broken = tmp_path / "broken.yaml"
    broken.write_text("trainer:\n  max_steps: [1,\n")
    assert main(["fit", str(broken)]) == 2
    assert capsys.readouterr().err.count(str(broken)) == 1


def test_resume_followed_by_an_override_takes_it_as_an_override(tmp_path, capsys):
    path = tmp_path / "boring.yaml"
    path.write_text(yaml.safe_dump(BORING))
    assert main(["fit", str(path)]) == 0
    # before the fix, "trainer.max_steps=6" was the checkpoint PATH to resume
    assert main(["fit", str(path), "--resume", "trainer.max_steps=6", "trainer.log.every_n_steps=2"]) == 0
    results = json.loads(Path("runs/boring/results.json").read_text())
    assert results["global_step"] == 6 and results["checkpoint_dir"].endswith("step_0000006")
    assert (
        "log:\n    progress: false\n    summary: true\n    every_n_steps: 2"
        in Path("runs/boring/config_resumed_step_0000003.yaml").read_text()
    )


@pytest.mark.parametrize("flag", ["0", "-2"])
def test_a_process_count_below_1_is_an_error(flag, capsys):
    for command in (["fit", INDUSTRIAL], ["validate", INDUSTRIAL, "--ckpt", "x"], ["test", INDUSTRIAL, "--ckpt", "x"]):
        assert main([*command, "--num-processes", flag]) == 2
        assert capsys.readouterr().err == f"error: --num-processes must be >= 1, got {flag}\n"


def test_traceback_flag_and_sss_debug_show_the_traceback(monkeypatch, capsys):
    from sss.config import ConfigError

    assert main(["config", INDUSTRIAL, "trainer=5"]) == 2
    with pytest.raises(ConfigError, match="trainer: expected a mapping"):
        main(["--traceback", "config", INDUSTRIAL, "trainer=5"])
    monkeypatch.setenv("SSS_DEBUG", "1")
    with pytest.raises(ConfigError):
        main(["config", INDUSTRIAL, "trainer=5"])


def test_a_refused_resume_is_one_error_exit_2(tmp_path, capsys):
    path = tmp_path / "boring.yaml"
    path.write_text(yaml.safe_dump(BORING))
    assert main(["fit", str(path)]) == 0
    capsys.readouterr()
    assert main(["fit", str(path), "trainer.seed=3", "trainer.max_steps=6", "--resume"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: cannot resume runs/boring/checkpoints/step_0000003") and "trainer.seed" in err
    assert "Traceback" not in err


def test_a_full_disk_names_the_folder_and_its_free_space(tmp_path, capsys):
    # A real ENOSPC: the run's config.yaml is a link to /dev/full, which refuses every write so.
    if not Path("/dev/full").exists():
        pytest.skip("needs /dev/full")
    out = tmp_path / "run"
    out.mkdir()
    (out / "config.yaml").symlink_to("/dev/full")
    path = tmp_path / "boring.yaml"
    path.write_text(yaml.safe_dump(BORING))
    assert main(["fit", str(path), f"trainer.output_dir={out}"]) == 1
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith(f"error: disk full at {out}, ") and " MB free; " in err[0], err
    assert "no checkpoint was saved yet" in err[0] and "intact" not in err[0]  # the run failed before its first


def test_a_checkpoint_write_that_torch_reports_as_unexpected_pos_is_a_full_disk(tmp_path, monkeypatch, capsys):
    # torch.save on a full disk says only "unexpected pos"; the free space of the output folder tells.
    import torch

    import sss.run.explain

    def full(obj, f, *args, **kwargs):
        raise RuntimeError("[enforce fail at inline_container.cc:672] . unexpected pos 4352 vs 4240")

    monkeypatch.setattr(torch, "save", full)
    path = tmp_path / "boring.yaml"
    path.write_text(yaml.safe_dump(BORING))
    out = tmp_path / "run"
    assert main(["fit", str(path), f"trainer.output_dir={out}"]) == 1
    line = capsys.readouterr().err.strip()
    assert line.startswith(f"error: writing to {out} failed ([enforce fail") and " MB free there" in line, line
    monkeypatch.setattr(sss.run.explain, "LOW_DISK", 1 << 62)  # the same failure on a disk with less room than that
    assert main(["fit", str(path), f"trainer.output_dir={tmp_path / 'run2'}"]) == 1
    line = capsys.readouterr().err.strip()
    assert line.startswith(f"error: disk full at {tmp_path / 'run2'}, ") and "no checkpoint was saved yet" in line


def test_a_folder_that_cannot_be_written_is_named_with_the_fix(capsys):
    # Root may write anywhere but into sysfs: mkdir there fails with EPERM (EROFS where it is mounted read-only).
    target = Path("/sys/sss-test-run")
    if not Path("/sys").is_dir() or os.name != "posix":
        pytest.skip("needs Linux sysfs")
    path = Path("boring.yaml")
    path.write_text(yaml.safe_dump(BORING))
    assert main(["fit", str(path), f"trainer.output_dir={target}"]) == 1
    err = capsys.readouterr().err.strip()
    assert not target.exists()
    assert err.startswith("error: ") and str(target) in err and "Traceback" not in err
    assert "choose a writable output folder (trainer.output_dir=PATH)" in err, err


@pytest.mark.parametrize(
    ("code", "expected"),
    [
        (errno.EROFS, "error: /mnt/ro/runs/x is on a read-only file system; make it readable and writable"),
        (errno.EACCES, "error: permission denied: /mnt/ro/runs/x; make it readable and writable"),
    ],
)
def test_read_only_and_permission_errors_name_the_path(code, expected):
    message, exit_code = explain_error(OSError(code, os.strerror(code), "/mnt/ro/runs/x"))
    assert message.startswith(expected) and exit_code == 1


def test_unsafe_and_damaged_checkpoint_errors_are_one_line(tmp_path):
    import torch

    import sss.checkpoint

    class Payload:
        def __reduce__(self):
            return (print, ("this ran",))

    folder = tmp_path / "step_0000001"
    folder.mkdir()
    torch.save({"x": Payload()}, folder / "custom_checkpoint_0.pkl")
    with pytest.raises(sss.checkpoint.UnsafeCheckpointError) as info:
        sss.checkpoint.check_no_code_on_load(folder)
    message, code = explain_error(info.value)
    assert message.startswith("error: ") and "would run code when loaded" in message and code == 1
    damaged = getattr(sss.checkpoint, "DamagedCheckpointError", None)
    if damaged is not None:  # added by the checkpoint verification; any error of sss.checkpoint is one line
        assert explain_error(damaged(f"{folder}: model.safetensors is truncated")) == (
            f"error: {folder}: model.safetensors is truncated",
            1,
        )


def test_the_error_table_works_without_the_command_line(tmp_path):
    # explain_error on its own (no parser, no main): the running config says which folder a message names.
    from types import SimpleNamespace

    run = SimpleNamespace(trainer=SimpleNamespace(output_dir=str(tmp_path / "run")))
    assert explain_error(KeyboardInterrupt()) == ("sss: interrupted (Ctrl-C)", 130)  # no config loaded yet
    before = "sss: interrupted (Ctrl-C), before any checkpoint was saved"
    assert explain_error(KeyboardInterrupt(), run) == (before, 130)
    (tmp_path / "run" / "checkpoints" / "step_0000004").mkdir(parents=True)
    message, code = explain_error(KeyboardInterrupt(), run)
    assert code == 130 and f"the checkpoints in {tmp_path / 'run' / 'checkpoints'} are intact" in message, message
    message, code = explain_error(OSError(errno.ENOSPC, "No space left on device"), run)  # an error naming no path
    assert code == 1 and message.startswith(f"error: disk full at {tmp_path / 'run'}, "), message


def test_a_second_ctrl_c_stops_at_once_with_one_line_and_130(tmp_path, monkeypatch, capsys):
    import sss.testing

    step = sss.testing.BoringModule.training_step
    calls = []

    def pressed_twice(self, batch, *args):
        calls.append(1)
        if len(calls) == 2:
            os.kill(os.getpid(), signal.SIGINT)  # the first: finish the step, save, stop
            os.kill(os.getpid(), signal.SIGINT)  # the second: stop at once
        return step(self, batch, *args)

    monkeypatch.setattr(sss.testing.BoringModule, "training_step", pressed_twice)
    path = tmp_path / "boring.yaml"
    path.write_text(yaml.safe_dump({**BORING, "trainer": {**BORING["trainer"], "max_steps": 20}}))
    previous = signal.getsignal(signal.SIGINT)
    assert main(["fit", str(path)]) == 130
    out, err = capsys.readouterr()
    assert "finishing this step, then saving a checkpoint" in out
    assert err.strip().splitlines() == ["sss: interrupted (Ctrl-C), before any checkpoint was saved"]
    assert signal.getsignal(signal.SIGINT) is previous  # the run's handlers are gone


def test_a_failed_hub_push_after_a_finished_run_still_writes_and_shows_the_results(tmp_path, monkeypatch, capsys):
    sys.path.insert(0, str(Path(__file__).parent / "callbacks"))
    from test_hub import TOKEN, FakeHub  # the local Hub API server of the HubPush tests

    hub = FakeHub()
    hub.commit_status = 403  # every upload is refused
    import threading

    threading.Thread(target=hub.serve_forever, daemon=True).start()
    monkeypatch.setenv("HF_TOKEN", TOKEN)
    monkeypatch.delenv("HF_HUB_OFFLINE", raising=False)
    try:
        config = {**BORING, "callbacks": [{"_target_": "sss.callbacks.HubPush", "repo_id": "tester/boring"}]}
        config["callbacks"][0].update(endpoint=hub.url, retries=1)
        path = tmp_path / "boring.yaml"
        path.write_text(yaml.safe_dump(config))
        assert main(["fit", str(path)]) == 1
    finally:
        hub.shutdown()
        hub.server_close()
    out, err = capsys.readouterr()
    results = json.loads(Path("runs/boring/results.json").read_text())
    assert results["global_step"] == 3
    assert "sss fit boring: results" in out and "written to runs/boring/results.json" in out
    lines = err.strip().splitlines()
    assert lines[-1].startswith("error: HubPush: 1 push(es) to tester/boring failed: model after global_step 3")
    assert "(from runs/boring/model)" in lines[-1] and "hf upload tester/boring" in lines[-1]
    assert "runs/boring/results.json and runs/boring/model exist" in lines[-1]
    assert "Traceback" not in err


def test_the_console_command_exits_with_the_code_and_one_line(tmp_path):
    import subprocess

    done = subprocess.run(
        [sys.executable, "-m", "sss", "fit", INDUSTRIAL, f"{LR}=fast"], capture_output=True, text=True, cwd=tmp_path
    )
    assert done.returncode == 2 and done.stdout == ""
    assert done.stderr == f"error: {INDUSTRIAL}: {LR}: expected a number, got str 'fast'\n"


def test_a_bad_value_in_the_accelerate_config_file_is_a_config_error(tmp_path, capsys, no_data):
    acc = tmp_path / "acc.yaml"
    acc.write_text("num_processes: two\n")
    assert main(["fit", INDUSTRIAL, "--config-file", str(acc)]) == 2
    err = capsys.readouterr().err
    assert err.startswith(f"error: {acc}: invalid literal for int()") and err.count("\n") == 1 and no_data == []


def test_a_full_disk_after_a_checkpoint_names_the_checkpoint_that_is_intact(tmp_path, monkeypatch, capsys):
    import torch

    import sss.run.explain

    path = tmp_path / "boring.yaml"
    path.write_text(yaml.safe_dump(BORING))
    out = tmp_path / "run"
    assert main(["fit", str(path), f"trainer.output_dir={out}"]) == 0  # saves step_0000003
    capsys.readouterr()

    def full(obj, f, *args, **kwargs):
        raise RuntimeError("[enforce fail at inline_container.cc:672] . unexpected pos 4352 vs 4240")

    monkeypatch.setattr(torch, "save", full)
    monkeypatch.setattr(sss.run.explain, "LOW_DISK", 1 << 62)
    assert main(["fit", str(path), f"trainer.output_dir={out}", "trainer.max_steps=6", "--resume"]) == 1
    line = capsys.readouterr().err.strip()
    assert line.startswith(f"error: disk full at {out}, ") and "Traceback" not in line, line
    assert f"the checkpoint {out / 'checkpoints' / 'step_0000003'} is intact" in line and "--resume" in line


@pytest.mark.parametrize("output_dir", ["/dev/null", "/dev/null/run"])
def test_an_output_dir_that_is_a_file_is_named_with_its_key(output_dir, tmp_path, capsys):
    if not Path("/dev/null").exists():
        pytest.skip("needs /dev/null")
    path = tmp_path / "boring.yaml"
    path.write_text(yaml.safe_dump(BORING))
    assert main(["fit", str(path), f"trainer.output_dir={output_dir}"]) == 1
    err = capsys.readouterr().err.strip().splitlines()
    assert err == [
        f"error: trainer.output_dir={output_dir}: /dev/null exists and is not a folder; choose a folder path"
    ]


@pytest.mark.parametrize(
    ("flags", "named"),
    [(["--n", "0"], "--n 0: must be at least 1"), (["--n", "8", "--n-test", "-1"], "--n-test -1: must be 0 or more")],
)
def test_data_make_refuses_a_count_naming_its_flag(flags, named, tmp_path, capsys):
    assert main(["data", "make", "industrial", str(tmp_path / "d"), *flags]) == 2
    err = capsys.readouterr().err.strip()
    assert err == f"error: sss data make {named}" and not (tmp_path / "d").exists()
