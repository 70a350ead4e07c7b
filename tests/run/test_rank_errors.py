"""A failed rank of `sss fit --num-processes 2`: its own one line, once, and its exit code, as in a 1-process run.

No launcher traceback (``ChildFailedError``), no torchrun log lines, no duplicate from the other rank; a rank
killed by a signal is named with the signal, the newest checkpoint that verifies and the command that resumes.
"""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import psutil
import pytest
import soundfile as sf

from sss.checkpoint import rng_file, write_marker
from sss.cli import main
from sss.config import ConfigError
from sss.run._rank_errors import ENV, Rerun, choose_line, read_records, record_rank_error
from sss.run.launch import accelerate_config
from sss.testing import subprocess_env

ROOT = Path(__file__).parents[2]
SCRIPTS = ROOT / "tests" / "scripts"  # fit_pause.py: a callback that holds the run at a chosen batch
MANIFEST = str(ROOT / "examples" / "manifest.yaml")
TINY = ["model.name=hunter_tiny", "data.num_workers=0", "data.batch_size=4", "trainer.max_steps=2"]
TINY += ["trainer.log.progress=false", "trainer.log.trackers=[]", "trainer.log.plots=false"]
# What the launcher's noise looks like: torchrun's log lines, Accelerate's traceback and torchrun's banner.
NOISE = re.compile(r"Traceback|ChildFailedError|FAILED|torch/distributed/elastic|closing signal|exitcode")

BORING = """\
name: job
model: {_target_: fit_pause.DropoutBoring}
data: {_target_: sss.testing.BoringDataModule, n_train: 64, n_val: 8, batch_size: 4}
trainer:
  max_steps: 12
  log: {progress: false, trackers: [], plots: false}
  checkpoint: {every_n_steps: 2, keep_last: 2}
"""


# What a resume reads from a checkpoint's marker besides its step (a marker without them is damaged).
RESUMABLE = {"skipped_steps": 0, "resume_epoch": 0, "samples": 0, "metrics": {}, "callbacks": []}


def _manifest(root: Path, bad_row: bool) -> Path:
    # 8 half-second clips of two tones; with `bad_row`, line 3 of train.csv names a file that is no audio
    root.mkdir(parents=True)
    rows = ["audio,label"]
    for i in range(8):
        t = np.arange(8000) / 16000
        sf.write(root / f"c{i}.wav", 0.3 * np.sin(2 * np.pi * (200 + 100 * (i % 2)) * t), 16000, subtype="PCM_16")
        rows.append(f"c{i}.wav,{'ab'[i % 2]}")
    (root / "val.csv").write_text("\n".join(rows) + "\n")
    if bad_row:
        (root / "bad.wav").write_bytes(b"not audio " * 100)
        rows.insert(2, "bad.wav,a")
    (root / "train.csv").write_text("\n".join(rows) + "\n")
    return root


def _sss(cwd: Path, *words: str, **env: str) -> subprocess.CompletedProcess:
    environment = subprocess_env(SCRIPTS, OMP_NUM_THREADS="1", HF_HOME=str(cwd / "hf"), **env)
    for name in ("WORLD_SIZE", "RANK", "LOCAL_RANK", "SSS_LAUNCH_RESOLVED", ENV, "SSS_DEBUG"):
        environment.pop(name, None)
    environment.update(env)
    command = [sys.executable, "-m", "sss", *words]
    return subprocess.run(command, cwd=cwd, env=environment, capture_output=True, text=True, timeout=400)


def _one_error_line(done: subprocess.CompletedProcess) -> str:
    lines = [line for line in done.stderr.splitlines() if line.strip()]
    assert len(lines) == 1 and lines[0].startswith("error: "), done.stderr[-3000:]
    assert not NOISE.search(done.stderr), done.stderr[-3000:]
    assert "sss: launching" in done.stdout  # the ranks ran: the error is theirs, not the launching process's
    return lines[0]


# ---------------------------------------------------------------- fast: the choice of line, the records


def test_the_ranks_own_error_wins_over_the_echo_of_a_lost_peer_and_over_order_of_ranks():
    own = {"rank": 1, "line": "error: train.csv, line 3: bad", "code": 1, "time": 5.0, "peer": False}
    echo = {"rank": 0, "line": "error: [pair.cc:561] Connection closed by peer", "code": 1, "time": 4.0, "peer": True}
    config = {"rank": 0, "line": "error: trainer.optim.param_groups[0]: ...", "code": 2, "time": 6.0, "peer": False}
    assert choose_line({0: echo, 1: own}, {0: 1, 1: 1}, 2) == ("error: train.csv, line 3: bad", 1)
    assert choose_line({0: config, 1: own}, {0: 2, 1: 1}, 2) == ("error: train.csv, line 3: bad", 1)  # the first
    assert choose_line({0: config}, {0: 2, 1: -15}, 2) == ("error: trainer.optim.param_groups[0]: ...", 2)
    assert choose_line({0: echo}, {0: 1}, 2) == (echo["line"], 1)  # nothing better known
    line, code = choose_line({}, {1: 3}, 2)
    assert code == 3 and line.startswith("error: rank 1 of 2 exited with code 3 without an error line of its own")


def test_a_rank_killed_by_a_signal_is_named_with_the_newest_checkpoint_that_verifies_and_the_resume_command(tmp_path):
    run = tmp_path / "runs" / "job"
    for step in (2, 4):
        folder = run / "checkpoints" / f"step_{step:07d}"
        folder.mkdir(parents=True)
        (folder / rng_file(0)).write_bytes(b"rng")
        write_marker(folder, {"global_step": step, **RESUMABLE, "resume_batch": step})
    (run / "checkpoints" / "step_0000006").mkdir()  # an interrupted save: no marker
    echo = {"rank": 0, "line": "error: Connection closed by peer", "code": 1, "time": 1.0, "peer": True}
    rerun = Rerun.of("runs/elsewhere", ["fit", "my config.yaml", "--num-processes", "2"])
    # the surviving rank knows the run's folder (a numbered one, say); the launching process's guess comes second
    line, code = choose_line({0: {**echo, "output_dir": str(run)}}, {1: -9}, 2, rerun)
    assert code == 128 + 9
    assert line == (
        f"error: rank 1 of 2 was killed by SIGKILL (signal 9); the newest checkpoint that verifies is "
        f"{run}/checkpoints/step_0000004: `sss fit 'my config.yaml' --num-processes 2 --resume` continues from it"
    )
    line, _ = choose_line({}, {1: -9}, 2, Rerun.of(str(tmp_path / "fresh"), ["fit", "x.yaml"]))
    assert line.endswith(
        f"{tmp_path}/fresh/checkpoints holds no checkpoint that verifies: run the command again to start over"
    )
    assert (
        choose_line({}, {0: -15}, 2)[0] == "error: rank 0 of 2 was killed by SIGTERM (signal 15); run the command again"
    )


def test_a_launched_rank_records_its_line_instead_of_printing_it(tmp_path, monkeypatch):
    monkeypatch.delenv(ENV, raising=False)
    assert not record_rank_error("error: x", 1)  # not launched by sss: printed by the caller
    monkeypatch.setenv(ENV, str(tmp_path))
    monkeypatch.setenv("RANK", "1")
    assert record_rank_error("error: train.csv, line 3: bad", 1, ValueError("bad"), "runs/x")
    monkeypatch.setenv("RANK", "0")
    lost = RuntimeError("[../gloo/transport/tcp/pair.cc:561] Connection closed by peer [127.0.0.1]:11966")
    assert record_rank_error("error: ...", 1, lost)
    records = read_records(tmp_path)
    assert records[1]["line"] == "error: train.csv, line 3: bad" and records[1]["output_dir"] == "runs/x"
    assert (records[1]["peer"], records[0]["peer"]) == (False, True)


def test_a_launched_rank_records_the_error_main_would_print(tmp_path, monkeypatch, capsys):
    monkeypatch.setenv(ENV, str(tmp_path))
    monkeypatch.setenv("RANK", "1")
    assert main(["fit", str(tmp_path / "missing.yaml")]) == 2
    assert capsys.readouterr().err == ""  # the launcher prints it, once
    record = read_records(tmp_path)[1]
    assert record["code"] == 2 and record["line"].startswith("error: ") and "missing.yaml" in record["line"]


@pytest.mark.parametrize(
    ("text", "problem"),
    [
        ("num_processes: 2\n  mixed_precision: [bf16\n", r"not valid YAML \(line 2: "),
        ("- num_processes\n- 2\n", r"not an Accelerate config \(a mapping of settings, got list\)"),
        ("just words\n", r"not an Accelerate config \(a mapping of settings, got str\)"),
        (b"\xff\xfe\x00bytes", r"not a text file"),
    ],
)
def test_a_malformed_accelerate_config_file_is_one_line_naming_it(tmp_path, text, problem, capsys):
    path = tmp_path / "acc.yaml"
    path.write_bytes(text if isinstance(text, bytes) else text.encode())
    with pytest.raises(ConfigError, match=rf"^--config-file {re.escape(str(path))}: {problem}.*accelerate config"):
        accelerate_config(str(path))
    (tmp_path / "run.yaml").write_text(BORING.replace("fit_pause.DropoutBoring", "sss.testing.BoringModule"))
    assert main(["fit", "run.yaml", "--config-file", str(path)]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith(f"error: --config-file {path}: "), err
    assert not Path("runs").exists()


# ---------------------------------------------------------------- slow: two real processes (gloo on the CPU)


@pytest.mark.slow
def test_a_data_error_in_two_processes_is_the_one_line_and_exit_code_of_one_process(tmp_path, capsys):
    root = _manifest(tmp_path / "data", bad_row=True)
    words = ["fit", MANIFEST, f"data.root={root}", *TINY]
    assert main(words) == 1  # one process, for the reference
    alone = [line for line in capsys.readouterr().err.splitlines() if line.startswith("error:")]
    assert len(alone) == 1 and "train.csv, line 3: " in alone[0]
    done = _sss(tmp_path, *words, "--num-processes", "2")
    assert done.returncode == 1
    assert _one_error_line(done) == alone[0]


@pytest.mark.slow
def test_a_config_error_in_two_processes_is_one_line_with_exit_code_2_and_debug_shows_the_traceback(tmp_path):
    # a parameter-group rule that matches nothing is found when the model is built, in the ranks
    (tmp_path / "run.yaml").write_text(BORING)
    words = ["fit", "run.yaml", 'trainer.optim.param_groups=[{params: "nomatch.*", lr: 0.1}]']
    alone = _sss(tmp_path, *words)
    assert alone.returncode == 2 and alone.stderr.startswith("error: trainer.optim.param_groups[0].params: ")
    done = _sss(tmp_path, *words, "--num-processes", "2")
    assert done.returncode == 2
    assert _one_error_line(done) == alone.stderr.strip()
    # --traceback (or SSS_DEBUG=1) reaches the ranks: their tracebacks and the launcher's report show
    debug = _sss(tmp_path, "--traceback", *words, "--num-processes", "2")
    assert debug.returncode != 0
    assert debug.stderr.count("Traceback") >= 2 and "ChildFailedError" in debug.stderr
    assert debug.stderr.count("[rank 1] uncaught ConfigError in rank 1 of 2") == 1


@pytest.mark.slow
def test_an_exit_with_a_message_in_two_processes_is_one_line_too(tmp_path):
    # `--resume` with no checkpoint: each rank ends in sys.exit("error: ..."), which Python would print per rank
    (tmp_path / "run.yaml").write_text(BORING)
    done = _sss(tmp_path, "fit", "run.yaml", "--resume", "--num-processes", "2")
    assert done.returncode == 1
    assert _one_error_line(done) == (
        "error: --resume: no complete checkpoint in runs/job/checkpoints; train without --resume first"
    )


def _rank_pid(launcher: psutil.Process, rank: int, deadline: float) -> int:
    while time.monotonic() < deadline:
        for child in launcher.children(recursive=True):
            try:
                if child.environ().get("RANK") == str(rank) and "sss" in child.cmdline():
                    return child.pid
            except psutil.Error:
                continue
        time.sleep(0.1)
    raise AssertionError(f"rank {rank} did not start")


@pytest.mark.slow
def test_kill_9_of_a_rank_is_one_line_with_the_newest_checkpoint_and_the_resume_command(tmp_path):
    (tmp_path / "run.yaml").write_text(BORING)
    env = subprocess_env(SCRIPTS, OMP_NUM_THREADS="1", HF_HOME=str(tmp_path / "hf"))
    for name in ("WORLD_SIZE", "RANK", "LOCAL_RANK", "SSS_LAUNCH_RESOLVED", ENV, "SSS_DEBUG"):
        env.pop(name, None)
    pause = 'callbacks=[{_target_: fit_pause.Pause, at: "0:6"}]'  # held in step 7: steps 2, 4, 6 saved
    command = [sys.executable, "-m", "sss", "fit", "run.yaml", pause, "--num-processes", "2"]
    proc = subprocess.Popen(command, cwd=tmp_path, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        deadline = time.monotonic() + 300
        while not (tmp_path / "runs" / "job" / "paused").exists():
            assert proc.poll() is None and time.monotonic() < deadline, proc.communicate()
            time.sleep(0.05)
        os.kill(_rank_pid(psutil.Process(proc.pid), 1, deadline), signal.SIGKILL)
        err = proc.communicate(timeout=180)[1]
    finally:
        proc.kill()
    assert proc.returncode == 128 + signal.SIGKILL, err
    lines = [line for line in err.splitlines() if line.strip()]
    assert len(lines) == 1 and not NOISE.search(err), err
    newest = json.loads((tmp_path / "runs/job/checkpoints/step_0000006/trainer_state.json").read_text())
    assert newest["global_step"] == 6
    assert lines[0] == (
        "error: rank 1 of 2 was killed by SIGKILL (signal 9); the newest checkpoint that verifies is "
        "runs/job/checkpoints/step_0000006: `sss fit run.yaml 'callbacks=[{_target_: fit_pause.Pause, at: \"0:6\"}]' "
        "--num-processes 2 --resume` continues from it"
    )
