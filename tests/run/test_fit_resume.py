"""`sss fit --resume` takes only checkpoints that verify: the newest that does, or the given one or an error."""

from __future__ import annotations

import json
import re
from pathlib import Path

from sss.cli import main

EXAMPLE = str(Path(__file__).parents[2] / "examples" / "industrial.yaml")
TINY = [
    "model.name=hunter_tiny",
    "data.n_train=16",
    "data.n_val=8",
    "data.n_test=8",
    "data.batch_size=8",
    "trainer.log.progress=false",
    "trainer.checkpoint.keep_last=3",
    "trainer.output_dir=run",
]


def test_resume_falls_back_from_a_damaged_newest_checkpoint_and_says_why(capsys):
    assert main(["fit", EXAMPLE, *TINY, "trainer.max_steps=4"]) == 0  # an epoch is 2 steps: saves at 2 and 4
    weights = Path("run/checkpoints/step_0000004/model.safetensors")
    weights.write_bytes(weights.read_bytes()[:1000])  # a truncated write, say
    capsys.readouterr()
    assert main(["fit", EXAMPLE, *TINY, "trainer.max_steps=6", "--resume"]) == 0
    out = capsys.readouterr().out
    skipped = re.search(r"sss: warning: --resume: skipping a damaged checkpoint: (.*)", out)
    assert skipped and re.fullmatch(
        r"\S*run/checkpoints/step_0000004/model\.safetensors is 1000 bytes but trainer_state\.json recorded \d+ "
        r"\(truncated or rewritten\)",
        skipped.group(1),
    )
    assert "sss: --resume: using run/checkpoints/step_0000002, the newest checkpoint that verifies" in out
    results = json.loads(Path("run/results.json").read_text())
    assert results["global_step"] == 6 and results["checkpoint_dir"].endswith("step_0000006")


def test_a_damaged_checkpoint_given_by_path_is_an_error_naming_the_file(capsys):
    assert main(["fit", EXAMPLE, *TINY, "trainer.max_steps=4"]) == 0
    Path("run/checkpoints/step_0000004/optimizer.bin").unlink()
    capsys.readouterr()  # no silent fallback for a path given by hand
    assert main(["fit", EXAMPLE, *TINY, "trainer.max_steps=6", "--resume", "run/checkpoints/step_0000004"]) == 1
    assert capsys.readouterr().err == (
        "error: --resume run/checkpoints/step_0000004: run/checkpoints/step_0000004/optimizer.bin is missing "
        "(listed in trainer_state.json). Resume another checkpoint (--resume PATH), or the newest one that "
        "verifies (--resume without a path)\n"
    )
    assert not Path("run/checkpoints/step_0000006").exists()


def test_resume_with_no_checkpoint_that_verifies_says_so(capsys):
    assert main(["fit", EXAMPLE, *TINY, "trainer.max_steps=2"]) == 0
    Path("run/checkpoints/step_0000002/trainer_state.json").write_text("{not json")
    capsys.readouterr()
    assert main(["fit", EXAMPLE, *TINY, "trainer.max_steps=4", "--resume"]) == 1
    err = capsys.readouterr().err
    assert err.startswith("error: --resume: no checkpoint in run/checkpoints verifies (newest: "), err
