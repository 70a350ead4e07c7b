"""Checkpoints you can trust: kill -9 anywhere, resume, and get the uninterrupted run bit for bit.

The runs are real processes (tests/scripts/resume_run.py) killed from here with SIGKILL or
SIGTERM; tolerance is zero (Composer's standard for exact resume on a CPU).
"""

from __future__ import annotations

import contextlib
import multiprocessing
import os
import random
import runpy
import shutil
import signal
import subprocess
import sys
import time
import traceback
from pathlib import Path

import pytest
import torch

from sss.callbacks.stock import add_stock_callbacks
from sss.checkpoint import (
    DamagedCheckpointError,
    complete_checkpoints,
    newest_verified,
    recover_leftovers,
    verify_checkpoint,
)
from sss.run.launch import launch_command

SCRIPT = str(Path(__file__).parents[1] / "scripts" / "resume_run.py")
ENV = {**os.environ, "MKL_CBWR": "AUTO,STRICT", "OMP_NUM_THREADS": "1"}

pytestmark = pytest.mark.slow


class _Forked:
    """A one-process run forked from this one: torch is already imported, so it starts at once."""

    def __init__(self, out: Path, args: list[str]) -> None:
        out.mkdir(parents=True, exist_ok=True)
        self.log = out / "output.txt"
        self.process = multiprocessing.get_context("fork").Process(target=_child, args=(out, args, self.log))
        self.process.start()
        self.pid = self.process.pid

    def poll(self) -> int | None:
        return self.process.exitcode

    def wait(self, timeout: float | None = None) -> int | None:
        self.process.join(timeout)
        return self.process.exitcode

    def output(self) -> str:
        return self.log.read_text() if self.log.exists() else ""


class _Launched(subprocess.Popen):
    """A multi-process run through `accelerate launch`, in its own session so one kill reaches all."""

    def __init__(self, out: Path, args: list[str], nproc: int) -> None:
        self.log = out.parent / f"{out.name}.output.txt"
        out.parent.mkdir(parents=True, exist_ok=True)
        cmd = launch_command(nproc, [SCRIPT, str(out), *args])
        with self.log.open("ab") as log:
            super().__init__(cmd, env=ENV, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)

    def output(self) -> str:
        return self.log.read_text()


def _child(out: Path, args: list[str], log: Path) -> None:
    fd = os.open(log, os.O_WRONLY | os.O_CREAT | os.O_APPEND)
    os.dup2(fd, 1)
    os.dup2(fd, 2)
    sys.stdout = sys.stderr = open(fd, "w", buffering=1)  # noqa: SIM115 - pytest had replaced both
    from accelerate.state import AcceleratorState, GradientState

    AcceleratorState._reset_state(reset_partial_state=True)  # the parent's singletons are not this run's
    GradientState._reset_state()
    torch.set_num_threads(1)
    sys.argv = [SCRIPT, str(out), *args]
    code = 0
    try:
        runpy.run_path(SCRIPT, run_name="__main__")
    except SystemExit as stop:
        code = stop.code or 0
    except BaseException:
        traceback.print_exc()
        code = 1
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)  # not pytest's exit handlers


def _start(out: Path, args: list[str], nproc: int = 1):
    return _Forked(out, args) if nproc == 1 else _Launched(out, args, nproc)


def _run(out: Path, args: list[str], nproc: int = 1) -> None:
    proc = _start(out, args, nproc)
    assert proc.wait(timeout=300) == 0, proc.output()[-3000:]


def _wait_for(path: Path, proc, timeout: float = 120) -> None:
    deadline = time.monotonic() + timeout
    while not path.exists():
        if proc.poll() is not None:
            raise AssertionError(f"the run ended before {path.name}: {proc.output()[-3000:]}")
        assert time.monotonic() < deadline, f"timed out waiting for {path}"
        time.sleep(0.01)


def _kill9(proc) -> None:
    if isinstance(proc, _Launched):
        # the launcher and its workers: torchrun starts each worker in a session of its own, so
        # killing the launcher's group alone would leave them training on into the same folder
        workers = _descendants(proc.pid)
        os.killpg(proc.pid, signal.SIGKILL)
        for pid in workers:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        proc.wait(timeout=30)
        deadline = time.monotonic() + 30
        while any(_alive(pid) for pid in workers):  # gone, and their folder locks with them
            assert time.monotonic() < deadline, "the killed workers did not end"
            time.sleep(0.01)
    else:
        os.kill(proc.pid, signal.SIGKILL)
        proc.wait(timeout=30)


def _descendants(pid: int) -> list[int]:
    parents = {}
    for stat in Path("/proc").glob("[0-9]*/stat"):
        with contextlib.suppress(OSError):
            fields = stat.read_text().rsplit(")", 1)[1].split()
            parents[int(stat.parent.name)] = int(fields[1])
    found, frontier = [], [pid]
    while frontier:
        children = [child for child, parent in parents.items() if parent in frontier]
        found += children
        frontier = children
    return found


def _alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except OSError:
        return False
    return state not in ("Z", "X")  # a zombie has closed its files


_STRAIGHT: dict[tuple, Path] = {}


def _straight(tmp_path_factory, args: list[str], nproc: int = 1) -> Path:
    """The uninterrupted run; checkpoint cadence does not change the math, so runs share it."""
    math = [a for i, a in enumerate(args) if a != "--every" and (i == 0 or args[i - 1] != "--every")]
    math = [a for a in math if a != "--no-epoch-save"]
    key = (*math, nproc)
    if key not in _STRAIGHT:
        out = tmp_path_factory.mktemp("straight")
        _run(out, args, nproc)
        _STRAIGHT[key] = out
    return _STRAIGHT[key]


def _losses(out: Path) -> dict[tuple[int, int], str]:
    rows = [line.split() for line in (out / "losses.txt").read_text().splitlines()]
    return {(int(e), int(b)): loss for e, b, _, loss in rows}


def _assert_same_run(resumed: Path, straight: Path) -> None:
    a, b = torch.load(resumed / "final.pt"), torch.load(straight / "final.pt")
    assert a["global_step"] == b["global_step"] and a["skipped_steps"] == b["skipped_steps"]
    for x, y in zip(a["params"], b["params"], strict=True):
        assert torch.equal(x, y), "final parameters differ from the uninterrupted run"
    for key in ("state", "param_groups"):
        assert _flat(a["optimizer"][key]) == _flat(b["optimizer"][key]), f"optimizer {key} differs"
    assert a["scaler"] == b["scaler"]
    # every micro-batch logged by the killed run and the resumed run has the uninterrupted loss
    assert _losses(resumed) == _losses(straight)


def _flat(tree):
    if isinstance(tree, torch.Tensor):
        return tree.tolist()
    if isinstance(tree, dict):
        return {k: _flat(v) for k, v in tree.items()}
    if isinstance(tree, (list, tuple)):
        return [_flat(v) for v in tree]
    return tree


CASES = {
    # name: (script args, where to kill: epoch:batch, processes)
    "end_of_epoch": (["--steps", "24"], "1:3", 1),  # only epoch-end checkpoints: resumes at epoch 1's start
    "mid_epoch": (["--steps", "24", "--every", "3"], "1:7", 1),  # resumes after step 15 (epoch 1, batch 5)
    "after_last_batch": (["--steps", "24", "--every", "5", "--no-epoch-save"], "1:3", 1),  # resumes at (0, 10)
    "mid_accumulation_window": (["--steps", "10", "--accum", "3", "--every", "2"], "1:1", 1),
    "after_skipped_fp16_step": (["--steps", "12", "--every", "1", "--fp16-poison", "4"], "0:4", 1),
    "two_processes": (["--steps", "16", "--every", "3"], "1:2", 2),
}


@pytest.mark.parametrize("case", list(CASES))
def test_kill9_then_resume_is_bitwise_equal(case, tmp_path, tmp_path_factory):
    args, pause, nproc = CASES[case]
    straight, killed = _straight(tmp_path_factory, args, nproc), tmp_path / "killed"
    proc = _start(killed, [*args, "--pause-at", pause], nproc)
    _wait_for(killed / "paused", proc)
    _kill9(proc)
    assert complete_checkpoints(killed / "checkpoints"), "no checkpoint before the kill"
    _run(killed, [*args, "--resume"], nproc)
    _assert_same_run(killed, straight)
    if case == "after_skipped_fp16_step":
        assert torch.load(straight / "final.pt")["skipped_steps"] == 1
    if case == "mid_epoch":  # negative control: forgetting the data position changes the result
        control = tmp_path / "control"
        proc = _start(control, [*args, "--pause-at", pause])
        _wait_for(control / "paused", proc)
        _kill9(proc)
        _run(control, [*args, "--resume", "--forget-position"])
        params = zip(
            torch.load(control / "final.pt")["params"], torch.load(straight / "final.pt")["params"], strict=True
        )
        assert not all(torch.equal(x, y) for x, y in params), "the negative control did not differ"


def test_sigterm_mid_epoch_saves_and_the_resume_matches(tmp_path, tmp_path_factory):
    args = ["--steps", "24"]  # no step checkpoints: only the preemption save is mid-epoch
    straight, stopped = _straight(tmp_path_factory, args), tmp_path / "stopped"
    proc = _start(stopped, [*args, "--pause-at", "1:6"])
    _wait_for(stopped / "paused", proc)
    os.kill(proc.pid, signal.SIGTERM)
    assert proc.wait(timeout=60) == 128 + signal.SIGTERM, proc.output()[-2000:]
    assert "stopped by SIGTERM after step 17" in proc.output() and "--resume" in proc.output()
    assert complete_checkpoints(stopped / "checkpoints")[-1].name == "step_0000017"
    _run(stopped, [*args, "--resume"])
    _assert_same_run(stopped, straight)


# Damage done to the newest checkpoint between two rounds, as a disk or a person might: (what, file)
DAMAGE = [
    ("delete", "optimizer.bin"),
    ("truncate", "model.safetensors"),
    ("garble", "trainer_state.json"),
    ("truncate", "optimizer.bin"),
    ("delete", "random_states_0.pkl"),
    ("flip", "model.safetensors"),
]


def _damage(checkpoint: Path, how: str, name: str) -> None:
    file = checkpoint / name
    if how == "delete":
        file.unlink()
    elif how == "truncate":
        file.write_bytes(file.read_bytes()[: file.stat().st_size // 2])
    elif how == "garble":
        file.write_text(file.read_text()[:-40])
    else:  # one bit, the size unchanged: only the checksum sees it
        data = bytearray(file.read_bytes())
        data[len(data) // 2] ^= 1
        file.write_bytes(bytes(data))


def _what_a_resume_would_take(run: Path, scratch: Path) -> tuple[str, int]:
    # The same clean-up and choice on a copy, so that the run's own resume still does them itself
    shutil.rmtree(scratch, ignore_errors=True)
    shutil.copytree(run / "checkpoints", scratch)
    recover_leftovers(scratch)
    found, damaged = newest_verified(scratch)
    assert found is not None, f"no checkpoint verifies: {damaged}"
    return found.name, len(damaged)


def test_kill9_in_saves_and_rotations_20_times_resumes_only_verified_checkpoints(tmp_path, tmp_path_factory):
    # 200 steps, a save and a rotation (keep_last=2) after every one: 20 rounds never reach the end.
    # Each round is killed with SIGKILL at a random moment of a save (from here), or kills itself in
    # the middle of a rotation's deletion; some rounds then damage the newest checkpoint. The next
    # round's resume must take exactly the newest checkpoint that verifies, and every micro-batch
    # of every round must have the uninterrupted run's loss.
    args = ["--big", "--steps", "200", "--every", "1"]
    straight, run = _straight(tmp_path_factory, args), tmp_path / "run"
    rng = random.Random(0)
    rotation_rounds = set(rng.sample(range(1, 20), 6))
    in_save = in_rotation = damaged_rounds = 0
    expected: tuple[str, int] | None = None
    for attempt in range(20):
        before = _newest(run)
        rotation = attempt in rotation_rounds
        extra = ["--resume"] if attempt else []
        if rotation:
            extra += ["--die-in-rotation", str(rng.randrange(10**6))]
        proc = _start(run, [*args, *extra])
        if rotation:
            assert proc.wait(timeout=120) == -signal.SIGKILL, proc.output()[-3000:]
            in_rotation += 1
        else:
            # wait until this run has completed a save of its own and is writing the next one, then
            # kill at a random moment around it
            deadline = time.monotonic() + 120
            while not (_newest(run) > before and _saving(run)):
                assert proc.poll() is None, proc.output()[-3000:]
                assert time.monotonic() < deadline
                time.sleep(0.002)
            time.sleep(rng.uniform(0, 0.01))  # a save takes tens of ms: most kills land inside it, under load too
            _kill9(proc)
            in_save += _saving(run)  # an unfinished save of this round was left behind
        if expected is not None:
            taken = (run / "resumed_from.txt").read_text().splitlines()
            assert len(taken) == attempt, f"round {attempt} did not resume: {proc.output()[-3000:]}"
            name, skipped = taken[-1].split()
            assert (name, int(skipped)) == expected, f"round {attempt} resumed {taken[-1]}, not {expected}"
        # what rotation left is never taken for a checkpoint: every complete one verifies
        for ckpt in complete_checkpoints(run / "checkpoints"):
            verify_checkpoint(ckpt)
        expected = _what_a_resume_would_take(run, tmp_path / "scratch")
        damage = attempt % 3 == 2 and _verified_count(tmp_path) >= 2  # in turn, each kind in DAMAGE
        if damage and (run / "checkpoints" / expected[0]).is_dir():
            how, name = DAMAGE[damaged_rounds % len(DAMAGE)]
            _damage(run / "checkpoints" / expected[0], how, name)
            damaged_rounds += 1
            expected = _what_a_resume_would_take(run, tmp_path / "scratch")
            assert expected[1] == 1, "the damaged checkpoint was not skipped"
    assert in_save >= 5, f"only {in_save} of 20 kills interrupted a save; the test did not test"
    assert in_rotation == 6 and damaged_rounds >= 4, (in_rotation, damaged_rounds)
    _run(run, [*args, "--resume"])  # cleans the leftovers, resumes the newest verified checkpoint, finishes
    assert (run / "resumed_from.txt").read_text().splitlines()[-1].split() == [expected[0], str(expected[1])]
    assert not list((run / "checkpoints").glob("*.tmp")) and not list((run / "checkpoints").glob("*.old"))
    _assert_same_run(run, straight)
    truth = {(e, b): (g, loss) for e, b, g, loss in _lines(straight)}
    for e, b, g, loss in _lines(run):  # every round, not only the last one to log a batch
        assert truth[(e, b)] == (g, loss), f"epoch {e} batch {b} differs from the uninterrupted run"


def _verified_count(tmp_path: Path) -> int:
    count = 0
    for ckpt in complete_checkpoints(tmp_path / "scratch"):
        with contextlib.suppress(DamagedCheckpointError):
            verify_checkpoint(ckpt)
            count += 1
    return count


def _lines(out: Path) -> list[list[str]]:
    return [line.split() for line in (out / "losses.txt").read_text().splitlines()]


def _newest(run: Path) -> int:
    found = complete_checkpoints(run / "checkpoints")
    return int(found[-1].name.removeprefix("step_")) if found else -1


def _saving(run: Path) -> bool:
    folder = run / "checkpoints"
    return folder.is_dir() and any(p.suffix in (".tmp", ".old") for p in folder.iterdir())


def test_rotation_keeps_last_and_best_across_resumes(tmp_path):
    from sss import Callback, SSSTrainer
    from sss.testing import BoringModule, boring_loader

    history = {}  # every checkpoint ever saved: name -> (validated at that step, val/accuracy)

    class History(Callback):
        def on_validation_end(self, trainer, module):
            self.validated = trainer.state.global_step

        def on_save_checkpoint(self, trainer, module):
            s = trainer.state
            history[Path(s.last_checkpoint).name] = (getattr(self, "validated", -1) == s.global_step, dict(s.metrics))

    def trainer(max_epochs):
        return add_stock_callbacks(
            SSSTrainer(
                max_epochs=max_epochs,
                callbacks=[History()],
                mixed_precision="no",
                output_dir=str(tmp_path),
                log={"progress": False, "trackers": []},
                optim={"optimizer": {"_target_": "torch.optim.SGD", "lr": 0.3}},
                checkpoint={
                    "every_n_steps": 3,
                    "keep_last": 2,
                    "keep_best": 1,
                    "monitor": "val/accuracy",
                    "mode": "max",
                },
            )
        )

    def expected():
        ranked = [(m["val/accuracy"], -int(n[5:]), n) for n, (validated, m) in history.items() if validated]
        return {max(ranked)[2]} | set(sorted(history)[-2:])

    def kept():
        return {p.name for p in complete_checkpoints(tmp_path / "checkpoints")}

    data = {"train_dataloaders": boring_loader(n=32), "val_dataloaders": boring_loader(n=16, seed=1)}
    trainer(3).fit(BoringModule(), **data)
    assert len(history) == 6 and kept() == expected()  # steps 3, 4, 6, 8, 9, 12 (4, 8, 12 validated)
    second = trainer(6)
    second.fit(BoringModule(), **data, ckpt_path=complete_checkpoints(tmp_path / "checkpoints")[-1])
    assert second.state.global_step == 24 and max(kept()) == "step_0000024"
    assert kept() == expected()
