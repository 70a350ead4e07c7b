"""What ran is what is recorded: ``--mixed-precision fp16`` on a CPU trains fp32 (issue #29, item 5)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml

from sss.cli import main
from sss.warnings import SSSWarning

BORING = {
    "trainer": {"max_steps": 2, "log": {"progress": False, "trackers": []}},
    "model": {"_target_": "sss.testing.BoringModule"},
    "data": {"_target_": "sss.testing.BoringDataModule"},
}


def test_fp16_on_a_cpu_is_recorded_as_the_fp32_it_ran(tmp_path, capsys):
    path = tmp_path / "boring.yaml"
    path.write_text(yaml.safe_dump(BORING))
    with pytest.warns(SSSWarning, match="fp16 has no effect on a CPU: this run trains in fp32") as caught:
        assert main(["fit", str(path), "--mixed-precision", "fp16", "trainer.cpu=true"]) == 0
    assert len([w for w in caught if "fp16" in str(w.message)]) == 1  # said once
    assert "sss: mixed precision no" in capsys.readouterr().out
    assert json.loads(Path("runs/boring/results.json").read_text())["mixed_precision"] == "no"
    assert "precision no (fp32) (configured fp16)" in Path("runs/boring/model/README.md").read_text()
