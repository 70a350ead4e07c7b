"""``sss fit examples/industrial.yaml`` with each fusion and each audio encoder picked by a ``key=value`` override."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml

from sss.cli import main

ROOT = Path(__file__).parents[2]
EXAMPLE = str(ROOT / "examples" / "industrial.yaml")
# The example's own model (hunter_small) on a shortened run: 4 optimizer steps on 32 samples.
SHORT = [
    "data.n_train=32",
    "data.n_val=16",
    "data.n_test=8",
    "data.batch_size=8",
    "trainer.max_steps=4",
    "trainer.log.progress=false",
]


# Three runs cover every fusion and every audio encoder, each set explicitly on the command line.
@pytest.mark.slow
@pytest.mark.parametrize(
    ("fusion", "audio_encoder"), [("cross_attention", "ast"), ("bottleneck", "cnn"), ("late", "ast")]
)
def test_fit_with_fusion_and_audio_encoder_overrides(fusion: str, audio_encoder: str) -> None:
    overrides = [f"model.fusion={fusion}", f"model.audio_encoder={audio_encoder}"]
    assert main(["fit", EXAMPLE, *SHORT, *overrides]) == 0
    results = json.loads(Path("runs/industrial/results.json").read_text())
    assert results["global_step"] == 4 and 0.0 <= results["val/accuracy"] <= 1.0
    model = yaml.safe_load(Path("runs/industrial/config.yaml").read_text())["model"]
    assert (model["name"], model["fusion"], model["audio_encoder"]) == ("hunter_small", fusion, audio_encoder)
