"""One run at a time per folder: the ``.sss.lock`` of OUTPUT_DIR (``sss fit``) and of a checkpoints folder."""

from __future__ import annotations

import contextlib
import fcntl
import json
import multiprocessing
import os
import socket
import subprocess
import sys
import threading
from pathlib import Path

import pytest

from sss.callbacks.stock import add_stock_callbacks
from sss.checkpoint import LOCK, FolderInUseError, complete_checkpoints, folder_holder, lock_folder
from sss.cli import main
from sss.testing import BoringModule, boring_loader
from sss.trainer import SSSTrainer

EXAMPLE = str(Path(__file__).parents[1] / "examples" / "industrial.yaml")
TINY = [
    "model.name=hunter_tiny",
    "data.n_train=16",
    "data.n_val=8",
    "data.n_test=8",
    "data.batch_size=8",
    "trainer.log.progress=false",
    "trainer.max_steps=2",
]


def _hold(folder: str, ready, done) -> None:
    lock = lock_folder(folder)
    ready.set()
    done.wait(60)
    lock.release()
    os._exit(0)


@contextlib.contextmanager
def _held_elsewhere(folder: Path):
    """`folder` locked by another live process (forked: it starts at once) for the duration."""
    context = multiprocessing.get_context("fork")
    ready, done = context.Event(), context.Event()
    holder = context.Process(target=_hold, args=(str(folder), ready, done))
    holder.start()
    try:
        assert ready.wait(30), "the holder did not take the lock"
        yield holder
    finally:
        done.set()
        holder.join(30)


def test_a_second_holder_is_refused_with_the_first_named(tmp_path):
    with _held_elsewhere(tmp_path) as holder:
        with pytest.raises(FolderInUseError) as refused:
            lock_folder(tmp_path)
        assert folder_holder(tmp_path)["pid"] == holder.pid
    message = str(refused.value)
    assert f"is in use by another sss run: pid {holder.pid} on {socket.gethostname()}, started 20" in message
    assert "Wait for it to end, or give this run another folder (trainer.output_dir)" in message
    assert f"delete {tmp_path / LOCK}" in message
    assert folder_holder(tmp_path) is None and not (tmp_path / LOCK).exists()  # released and removed


def test_a_killed_runs_lock_is_taken_over_with_a_notice(tmp_path, capsys):
    # kill -9 leaves the file; the kernel has dropped the flock
    dead = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True)
    body = {"pid": int(dead.stdout), "host": socket.gethostname(), "started": "2025-01-01T00:00:00+00:00"}
    (tmp_path / LOCK).write_text(json.dumps(body))
    assert folder_holder(tmp_path) is None
    with lock_folder(tmp_path):
        assert json.loads((tmp_path / LOCK).read_text())["pid"] == os.getpid()
    out = capsys.readouterr().out
    assert f"taking over the lock of pid {body['pid']} on {body['host']}, started 2025-01-01" in out
    assert "which ended without releasing it" in out and out.count("\n") == 1


def test_a_lock_still_held_by_a_dead_runs_children_is_taken_over(tmp_path, capsys):
    # A killed run's forked children (loader workers) may keep its flock for a while: its pid is gone
    dead = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True)
    context = multiprocessing.get_context("fork")
    ready, done = context.Event(), context.Event()

    def orphan() -> None:
        fd = os.open(tmp_path / LOCK, os.O_RDWR | os.O_CREAT)
        fcntl.flock(fd, fcntl.LOCK_EX)
        os.write(fd, json.dumps({"pid": int(dead.stdout), "host": socket.gethostname()}).encode())
        ready.set()
        done.wait(60)
        os._exit(0)

    child = context.Process(target=orphan)
    child.start()
    try:
        assert ready.wait(30)
        assert folder_holder(tmp_path) is None
        with lock_folder(tmp_path):
            assert folder_holder(tmp_path)["pid"] == os.getpid()
    finally:
        done.set()
        child.join(30)
    assert f"taking over the lock of pid {int(dead.stdout)}" in capsys.readouterr().out


def test_a_run_that_is_just_ending_is_waited_for(tmp_path):
    # kill -9 and an immediate restart: the killed process lets its flock go only once it is gone
    context = multiprocessing.get_context("fork")
    ready, done = context.Event(), context.Event()
    holder = context.Process(target=_hold, args=(str(tmp_path), ready, done))
    holder.start()
    assert ready.wait(30)
    threading.Timer(0.3, done.set).start()
    with lock_folder(tmp_path):
        assert folder_holder(tmp_path)["pid"] == os.getpid()
    holder.join(30)


def test_the_same_process_may_take_its_folder_twice(tmp_path):
    outer = lock_folder(tmp_path)
    inner = lock_folder(".")  # the same folder, named another way (the tests run in tmp_path)
    inner.release()
    assert folder_holder(tmp_path)["pid"] == os.getpid()  # still held by the outer one
    outer.release()
    assert not (tmp_path / LOCK).exists()


def _trainer(out: Path) -> SSSTrainer:
    return add_stock_callbacks(
        SSSTrainer(
            max_steps=2,
            mixed_precision="no",
            output_dir=str(out),
            log={"progress": False, "trackers": []},
            checkpoint={"every_n_steps": 1},
        )
    )


def test_a_python_fit_refuses_a_checkpoints_folder_a_live_run_holds(tmp_path):
    with _held_elsewhere(tmp_path / "checkpoints") as holder, pytest.raises(FolderInUseError) as refused:
        _trainer(tmp_path).fit(BoringModule(), train_dataloaders=boring_loader())
    assert f"checkpoints is in use by another sss run: pid {holder.pid}" in str(refused.value)
    assert complete_checkpoints(tmp_path / "checkpoints") == []
    trainer = _trainer(tmp_path)
    trainer.fit(BoringModule(), train_dataloaders=boring_loader())
    assert trainer.state.global_step == 2 and not (tmp_path / "checkpoints" / LOCK).exists()


def test_a_second_sss_fit_on_a_folder_in_use_fails_at_once(tmp_path, capsys):
    out = tmp_path / "shared"
    with _held_elsewhere(out) as holder:
        assert main(["fit", EXAMPLE, *TINY, f"trainer.output_dir={out}"]) == 1
    err = capsys.readouterr().err
    assert f"error: {out} is in use by another sss run: pid {holder.pid} on {socket.gethostname()}" in err
    assert not (out / "config.yaml").exists() and not (out / "checkpoints").exists()  # nothing written
    assert main(["fit", EXAMPLE, *TINY, f"trainer.output_dir={out}"]) == 0  # once it is free
    assert (out / "results.json").is_file() and not (out / LOCK).exists()


def test_sss_fit_holds_its_folder_while_it_runs(tmp_path, monkeypatch):
    import sss.run.fit as fit

    seen = []
    real = fit.build_parts

    def looking(cfg, **kwargs):  # inside the run, after the folder was taken
        seen.append(folder_holder(cfg.trainer.output_dir))
        return real(cfg, **kwargs)

    monkeypatch.setattr(fit, "build_parts", looking)
    assert main(["fit", EXAMPLE, *TINY, f"trainer.output_dir={tmp_path / 'mine'}"]) == 0
    assert seen[0]["pid"] == os.getpid() and set(seen[0]) == {"pid", "host", "started", "command"}
    assert folder_holder(tmp_path / "mine") is None


def test_the_default_run_folder_moves_on_from_one_in_use(tmp_path, capsys):
    Path("runs/industrial").mkdir(parents=True)
    with _held_elsewhere(Path("runs/industrial")):
        assert main(["fit", EXAMPLE, *TINY]) == 0
        assert Path("runs/industrial_1/results.json").is_file()
        with _held_elsewhere(Path("runs/industrial_1")) as holder:  # resuming a run that is still going: refused
            assert main(["fit", EXAMPLE, *TINY, "trainer.max_steps=4", "--resume"]) == 1
    assert f"runs/industrial_1 is in use by another sss run: pid {holder.pid}" in capsys.readouterr().err
    assert not any(Path("runs/industrial").iterdir())  # the live run's folder was never touched
