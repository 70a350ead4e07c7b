"""kill -9 of a whole 2-process x 2-worker run, twice (mid-epoch, then at the epoch's end), and `--resume auto`:
the run ends bitwise equal to an uninterrupted one for map-style manifests, tar shards and streamed Parquet."""

from __future__ import annotations

import json
import subprocess
import time
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from sss.data.shards import pack
from sss.data.synthetic import make_industrial
from sss.run.launch import launch_command
from sss.testing import hub_parquet, subprocess_env

SCRIPTS = Path(__file__).parents[1] / "scripts"  # fit_pause.py: the Pause callback
EXAMPLE = str(Path(__file__).parents[2] / "examples" / "manifest.yaml")
ENV = subprocess_env(SCRIPTS, MKL_CBWR="AUTO,STRICT", OMP_NUM_THREADS="1")
RUN = [
    "model.name=hunter_tiny",
    "data.num_workers=2",
    "data.batch_size=4",
    "data.shuffle_buffer=5",  # windows of 5 in a reader's 12 samples: a resume lands inside one
    "trainer.max_epochs=2",
    "trainer.checkpoint.every_n_steps=3",
    "trainer.checkpoint.keep_last=4",
    "trainer.log.progress=false",
    "trainer.log.plots=false",
    "trainer.log.trackers=[]",
    "trainer.output_dir=run",
]


@pytest.fixture(scope="module")
def roots(tmp_path_factory) -> dict[str, list[str]]:
    base = tmp_path_factory.mktemp("stream-data")
    src = make_industrial(base / "ind", n_train=48, n_val=8, n_test=0)  # 4 readers x 12 samples
    pack(src, base / "shards", shard_size=8)  # 6 shards for 4 readers: ranges share and span shards
    hub_parquet(src, base / "hub", files=5, row_group=4)  # 15 row groups, files of uneven length
    return {
        "manifest": [f"data.root={src}"],
        "shards": [f"data.root={base / 'shards'}", "data.layout=shards"],
        "hf": [f"data.root={base / 'hub'}", "data.layout=hf", "data.streaming=true"],
    }


def _start(cwd: Path, *words: str) -> subprocess.Popen:
    cwd.mkdir(parents=True, exist_ok=True)
    fit = ["-m", "sss", "fit", EXAMPLE, *RUN, *words, "--resume", "auto"]
    env = {**ENV, "HF_HOME": str(cwd / "hf")}
    log = (cwd / "output.txt").open("ab")
    command = launch_command(2, fit)
    return subprocess.Popen(command, cwd=cwd, env=env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)


def _finish(cwd: Path, *words: str) -> str:
    assert _start(cwd, *words).wait(timeout=300) == 0, (cwd / "output.txt").read_text()[-3000:]
    return (cwd / "output.txt").read_text()


def _kill9_at(cwd: Path, pause: str, *words: str) -> None:
    from test_auto_resume import _kill9  # every process of the launch, its workers included

    paused = cwd / "run" / "paused"
    paused.unlink(missing_ok=True)
    proc = _start(cwd, *words, f'callbacks=[{{_target_: fit_pause.Pause, at: "{pause}"}}]')
    deadline = time.monotonic() + 240
    while not paused.exists():
        assert proc.poll() is None, (cwd / "output.txt").read_text()[-3000:]
        assert time.monotonic() < deadline, "the run did not reach the pause"
        time.sleep(0.05)
    _kill9(proc)


@pytest.mark.slow
@pytest.mark.parametrize("layout", ["manifest", "shards", "hf"])
def test_two_kills_then_resume_auto_end_bitwise_equal_to_the_straight_run(tmp_path, roots, layout, monkeypatch):
    monkeypatch.syspath_prepend(str(Path(__file__).parent))
    words = roots[layout]
    straight, killed = tmp_path / "straight", tmp_path / "killed"
    _finish(straight, *words)
    _kill9_at(killed, "0:4", *words)  # step 5 of an epoch of 6: resumes from step 3, inside a window, worker 1 next
    _kill9_at(killed, "1:0", *words)  # the next epoch's first batch: resumes from step 6, the epoch boundary
    out = _finish(killed, *words)
    assert "using run/checkpoints/step_0000006" in out
    a, b = (load_file(str(d / "run" / "model" / "model.safetensors")) for d in (killed, straight))
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a), "weights differ from the straight run"
    results = json.loads((killed / "run" / "results.json").read_text())
    assert results["global_step"] == 12 and results["num_processes"] == 2
    if layout != "manifest":  # the position of every reader is in the verified marker
        meta = json.loads((killed / "run" / "checkpoints" / "step_0000006" / "trainer_state.json").read_text())
        assert meta["stream"]["processes"] == 2 and len(meta["stream"]["readers"]) == 4
