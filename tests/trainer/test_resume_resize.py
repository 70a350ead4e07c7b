"""`trainer.resume_resize`: resume a checkpoint on another process count (1 -> 2 and 2 -> 1, real gloo processes).

The weights, optimizer and counters continue exactly and the epoch serves every sample once across
both segments. The runs are one interpreter (tests/scripts/resize_runs.py) whose two-process parts
`notebook_fit` forks, so the four segments cost about one process start.
"""

from __future__ import annotations

import hashlib
import json
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from sss import SSSTrainer
from sss.checkpoint import resized_resume_batch, seed_missing_rng, verify_checkpoint
from sss.config import ConfigError
from sss.testing import subprocess_env
from sss.trainer._resume import check_resumable

SCRIPTS = Path(__file__).parents[1] / "scripts"
CONFIG = """\
name: resize
model: {_target_: resize_runs.SeenBoring}
data: {_target_: sss.testing.BoringDataModule, n_train: 48, n_val: 8, batch_size: 4}
callbacks: [{_target_: resize_runs.Seen}]
trainer:
  max_steps: 4
  log: {progress: false, trackers: [], plots: false}
"""
RESIZED = "the data position is restored by samples seen; the result is not bitwise equal to an uninterrupted run"


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    cwd = tmp_path_factory.mktemp("resize")
    (cwd / "run.yaml").write_text(CONFIG)
    env = subprocess_env(SCRIPTS, OMP_NUM_THREADS="1", HF_HOME=str(cwd / "hf"))  # the checkout's sss, then scripts
    done = subprocess.run(
        [sys.executable, str(SCRIPTS / "resize_runs.py"), "run.yaml"],
        cwd=cwd,
        capture_output=True,
        text=True,
        timeout=300,
        env=env,
    )
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    return cwd, done.stdout, json.loads(done.stdout.split("RESULTS ", 1)[1])


def _seen(folder: Path) -> dict[int, list[dict]]:
    return {
        int(f.name.split(".")[1]): [json.loads(line) for line in f.read_text().splitlines()]
        for f in sorted(folder.glob("seen.*.jsonl"))
    }


def _check_continues(folder: Path, saved_step: int, end_step: int, procs_after: int) -> None:
    seen = _seen(folder)
    # every sample of the epoch exactly once over both segments and all ranks
    served = sorted(i for lines in seen.values() for line in lines if "index" in line for i in line["index"])
    assert served == list(range(48))
    # the resumed segment starts from exactly the saved weights, optimizer state, LR and step on every rank
    ended = next(line for line in seen[0] if line.get("probe") == "end")
    assert ended["step"] == saved_step
    for rank in range(procs_after):
        started = [line for line in seen[rank] if line.get("probe") == "start" and line["step"] == saved_step]
        assert len(started) == 1, f"rank {rank} did not resume at step {saved_step}"
        for key in ("loss", "opt", "lr", "acc_step"):
            assert started[0][key] == ended[key], (rank, key)
    # the step counters continue, and so does the loss curve
    steps = [line for line in seen[0] if "index" in line]
    assert [line["step"] for line in steps] == list(range(1, end_step + 1))  # the saved step, then the next
    before, after = steps[saved_step - 1]["loss"], steps[saved_step]["loss"]
    assert abs(after - before) < 0.5


@pytest.mark.slow  # the four segments: one interpreter, about 10 s
def test_one_process_checkpoint_continues_on_two(runs):
    cwd, out, results = runs
    assert f"sss: resuming step_0000004 written by 1 process on 2 processes (trainer.resume_resize): {RESIZED}" in out
    _check_continues(cwd / "one", saved_step=4, end_step=8, procs_after=2)
    seen = _seen(cwd / "one")
    # rank 1 had no RNG file in the checkpoint: seeded from process 0's saved state and its rank
    torch.manual_seed(0)
    step = seed_missing_rng(cwd / "one" / "checkpoints" / "step_0000004", 1)
    expected = hashlib.sha256(torch.get_rng_state().numpy().tobytes()).hexdigest()
    started = {rank: next(line for line in seen[rank] if line.get("probe") == "start") for rank in (0, 1)}
    assert step == 4 and started[1]["rng"] == expected != started[0]["rng"]
    # the record of the run and of the checkpoints it wrote say from what it was resized
    assert results[1]["resized_from"] == [{"num_processes": 1, "global_step": 4}]
    assert results[1]["num_processes"] == 2 and results[1]["global_step"] == 8 and results[1]["samples_total"] == 48
    meta = verify_checkpoint(cwd / "one" / "checkpoints" / "step_0000008")
    assert meta["num_processes"] == 2 and meta["resized_from"] == [{"num_processes": 1, "global_step": 4}]
    assert results[0]["resized_from"] is None


@pytest.mark.slow  # the four segments: one interpreter, about 10 s
def test_two_process_checkpoint_continues_on_one(runs):
    cwd, out, results = runs
    assert f"sss: resuming step_0000002 written by 2 processes on 1 process (trainer.resume_resize): {RESIZED}" in out
    _check_continues(cwd / "two", saved_step=2, end_step=10, procs_after=1)
    assert results[3]["resized_from"] == [{"num_processes": 2, "global_step": 2}]
    assert results[3]["samples_total"] == 48 and results[3]["global_step"] == 10


@pytest.mark.slow  # the four segments: one interpreter, about 10 s
def test_another_process_count_is_refused_without_the_key(runs):
    cwd = runs[0]
    ckpt = cwd / "two" / "checkpoints" / "step_0000002"
    meta = verify_checkpoint(ckpt)
    trainer = SSSTrainer(max_steps=4, mixed_precision="no")
    with pytest.raises(ConfigError) as refused:
        check_resumable(ckpt, meta, trainer.config, 1, trainer._config_record())
    assert str(refused.value) == (
        f"{ckpt} was written by 2 process(es) and this run has 1: the data shards and RNG streams would differ. "
        "Resume with the same count (sss fit ... --num-processes 2), or set trainer.resume_resize=true to continue "
        "on 1 process(es) (not bitwise equal to an uninterrupted run)."
    )
    trainer.config.resume_resize, trainer.config.fsdp = True, {"sharding_strategy": "FULL_SHARD"}
    with pytest.raises(ConfigError, match=r"under trainer\.fsdp, whose optimizer state is sharded per process"):
        check_resumable(ckpt, meta, trainer.config, 1, trainer._config_record())


def test_the_rounding_of_the_batch_to_resume_at():
    # 1 -> 2 after 3 batches: 3 underlying batches were served, 2 are skipped and batch 2 is served again
    assert [resized_resume_batch(b, 1, 2) for b in range(5)] == [0, 0, 1, 1, 2]
    assert [resized_resume_batch(b, 2, 1) for b in range(3)] == [0, 2, 4]
    assert resized_resume_batch(5, 3, 2) == 7  # 15 served: 7 each (14), one served again
    assert resized_resume_batch(3, 2, 1, split_batches=True) == 3
