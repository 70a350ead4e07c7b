"""A checkpoint's marker is data: its values are checked (type, range, the folder's name) before anything uses them.

A marker that fails is a damaged checkpoint: `--resume` skips it with the reason and takes the newest older
one that verifies; `--resume PATH` of it is one error line naming the key.
"""

from __future__ import annotations

import json
import resource
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from sss import SSSTrainer
from sss.callbacks.stock import add_stock_callbacks
from sss.checkpoint import MARKER, DamagedCheckpointError, complete_checkpoints, newest_verified, verify_checkpoint
from sss.cli import main
from sss.testing import BoringModule, boring_loader, subprocess_env

EXAMPLE = str(Path(__file__).parents[1] / "examples" / "industrial.yaml")
TINY = [
    "model.name=hunter_tiny",
    "data.n_train=16",
    "data.n_val=8",
    "data.n_test=8",
    "data.batch_size=8",
    "trainer.log.progress=false",
    "trainer.log.plots=false",
    "trainer.checkpoint.keep_last=3",
]
RESUME = ["fit", EXAMPLE, *TINY, "trainer.output_dir=run"]


def _set(key: str, value: object):
    def damage(ckpt: Path) -> Path:
        meta = json.loads((ckpt / MARKER).read_text())
        meta[key] = value
        (ckpt / MARKER).write_text(json.dumps(meta))  # the marker is not in its own manifest: it still "parses"
        return ckpt

    return damage


def _rename(ckpt: Path) -> Path:
    return ckpt.rename(ckpt.with_name("step_0000099"))  # its marker still says global_step 4


# case: (damage done to the newest checkpoint, step_0000004; the reason the fall-back must give)
CASES = {
    "string processes": (_set("num_processes", "x"), r"num_processes is 'x', not a whole number from 1 to 1048576"),
    "huge processes": (_set("num_processes", 10**9), r"num_processes is 1000000000, not a whole number from 1 to"),
    "negative step": (_set("global_step", -4), r"global_step is -4, not a whole number from 0 to"),
    "string step": (_set("global_step", "4"), r"global_step is '4', not a whole number"),
    "bool processes": (_set("num_processes", True), r"num_processes is True, not a whole number"),
    "callbacks not a list": (_set("callbacks", "x"), r"callbacks is 'x', not a list"),
    "no resume position": (_set("resume_batch", None), r"resume_batch is None, not a whole number"),
    "name and step disagree": (
        _rename,
        r"step_0000099: its name says step 99 but its trainer_state\.json says global_step 4 \(renamed or copied "
        r"by hand\?\): it is not taken for another step; rename it step_0000004 to use it",
    ),
}


@pytest.fixture(scope="module")
def boring_run(tmp_path_factory) -> Path:
    """A 4-step run of the boring model (checkpoints at steps 2 and 4), copied by each test that damages it."""
    out = tmp_path_factory.mktemp("boring") / "run"
    settings = dict(mixed_precision="no", log={"progress": False, "trackers": []}, checkpoint={"every_n_steps": 2})
    add_stock_callbacks(SSSTrainer(max_steps=4, output_dir=str(out), **settings)).fit(
        BoringModule(), train_dataloaders=boring_loader()
    )
    assert [p.name for p in complete_checkpoints(out / "checkpoints")] == ["step_0000002", "step_0000004"]
    return out


@pytest.fixture(scope="module")
def fit_run(tmp_path_factory) -> Path:
    """A 4-step ``sss fit`` run (checkpoints at steps 2 and 4, no results.json yet)."""
    import accelerate.commands.config

    folder = tmp_path_factory.mktemp("fit")
    with pytest.MonkeyPatch.context() as patch:  # what tests/conftest.py does for each test
        patch.chdir(folder)
        patch.setenv("SSS_CACHE", str(folder / "cache"))
        patch.setattr(accelerate.commands.config, "default_config_file", str(folder / "no_accelerate_config.yaml"))
        assert main(["fit", EXAMPLE, *TINY, "trainer.max_steps=4", "trainer.output_dir=run"]) == 0
    out = folder / "run"
    (out / "results.json").unlink()  # a run stopped before its end: --resume continues it
    assert [p.name for p in complete_checkpoints(out / "checkpoints")] == ["step_0000002", "step_0000004"]
    return out


def _copy(run: Path) -> Path:
    shutil.copytree(run, "run", ignore=shutil.ignore_patterns(".sss.lock"))
    return Path("run")


@pytest.mark.parametrize("case", list(CASES))
def test_a_damaged_marker_is_skipped_with_its_reason(case, boring_run):
    damage, reason = CASES[case]
    run = _copy(boring_run)
    bad = damage(run / "checkpoints" / "step_0000004")
    with pytest.raises(DamagedCheckpointError, match=reason):
        verify_checkpoint(bad, resume=True)
    found, damaged = newest_verified(run / "checkpoints")
    assert found == run / "checkpoints" / "step_0000002"
    assert len(damaged) == 1 and damaged[0].startswith(str(bad)), damaged
    assert json.loads((found / MARKER).read_text())["global_step"] == 2


@pytest.mark.slow
@pytest.mark.parametrize("case", ["string processes", "name and step disagree"])
def test_sss_fit_resume_falls_back_past_a_damaged_marker_and_says_why(case, fit_run, capsys):
    damage = CASES[case][0]
    run = _copy(fit_run)
    damage(run / "checkpoints" / "step_0000004")
    capsys.readouterr()
    assert main([*RESUME, "trainer.max_steps=6", "--resume"]) == 0
    out = capsys.readouterr().out
    warnings = [line for line in out.splitlines() if line.startswith("sss: warning: --resume: skipping")]
    assert len(warnings) == 1, out
    assert "sss: warning: --resume: skipping a damaged checkpoint: run/checkpoints/step_0000" in warnings[0]
    assert json.loads(Path("run/results.json").read_text())["resumed_from"] == "run/checkpoints/step_0000002"
    assert "sss: --resume: using run/checkpoints/step_0000002, the newest checkpoint that verifies" in out
    if case == "name and step disagree":  # never resumed as step 99, nor silently as step 4
        assert "step_0000099" in warnings[0] and "says global_step 4" in warnings[0]


def test_resume_of_a_given_checkpoint_with_a_bad_marker_is_one_error_naming_the_key(boring_run, capsys):
    run = _copy(boring_run)  # refused before the config is compared or anything is built
    _set("num_processes", "x")(run / "checkpoints" / "step_0000004")
    capsys.readouterr()  # no silent fallback for a path given by hand
    assert main([*RESUME, "trainer.max_steps=6", "--resume", str(run / "checkpoints" / "step_0000004")]) == 1
    assert capsys.readouterr().err == (
        "error: --resume run/checkpoints/step_0000004: run/checkpoints/step_0000004/trainer_state.json: "
        "num_processes is 'x', not a whole number from 1 to 1048576: the marker is damaged (edited, or garbled on "
        "disk) and nothing is read from it. Resume another checkpoint (--resume PATH), or the newest one that "
        "verifies (--resume without a path)\n"
    )
    assert not Path("run/checkpoints/step_0000006").exists()


def _limit_memory() -> None:
    four_gb = 4 << 30
    resource.setrlimit(resource.RLIMIT_DATA, (four_gb, four_gb))


def test_a_huge_process_count_is_refused_without_sizing_anything_from_it(boring_run):
    # 10**9 RNG file names would take ~60 GB: the child may use 4 GB, and must answer at once.
    run = _copy(boring_run)
    _set("num_processes", 10**9)(run / "checkpoints" / "step_0000004")
    code = (
        "import sys; from sss.checkpoint import verify_checkpoint\n"
        "try:\n    verify_checkpoint(sys.argv[1])\n"
        "except Exception as exc:\n    print(type(exc).__name__, exc)\n"
    )
    child = subprocess.run(
        [sys.executable, "-c", code, str(run / "checkpoints" / "step_0000004")],
        env=subprocess_env(),
        capture_output=True,
        text=True,
        timeout=120,
        preexec_fn=_limit_memory,
    )
    assert child.returncode == 0, child.stderr[-2000:]
    assert child.stdout.startswith("DamagedCheckpointError "), child.stdout + child.stderr[-2000:]
    assert "num_processes is 1000000000, not a whole number from 1 to 1048576" in child.stdout


def test_a_marker_within_the_schema_still_verifies(boring_run):
    run = _copy(boring_run)
    ckpt = run / "checkpoints" / "step_0000004"
    meta = verify_checkpoint(ckpt, resume=True)
    assert meta["global_step"] == 4 and meta["num_processes"] == 1
    del meta["files"]  # a checkpoint from before manifests: the schema checks what is there
    (ckpt / MARKER).write_text(json.dumps(meta))
    assert verify_checkpoint(ckpt, resume=True)["global_step"] == 4
