"""``sss export`` builds the model ``sss fit`` trained: the head size comes from the data, as in training.

Before `build_parts`, ``sss export examples/manifest.yaml`` built the model without the data's
class count (manifest.yaml leaves ``num_classes`` out), so a 3-class checkpoint did not load.
"""

from __future__ import annotations

import csv
from pathlib import Path

import numpy as np
import soundfile as sf
from PIL import Image

import sss
from sss.checkpoint import complete_checkpoints
from sss.cli import main

EXAMPLE = Path(__file__).parents[2] / "examples" / "manifest.yaml"
CLASSES = ["knock", "hiss", "clank"]  # three, where the default model has four


def _folder(root: Path) -> Path:
    root.mkdir(parents=True)
    rng = np.random.default_rng(0)
    rows = []
    for i in range(12):
        label = CLASSES[i % 3]
        Image.fromarray(rng.integers(0, 255, (32, 32, 3), dtype=np.uint8)).save(root / f"im{i}.png")
        wave = 0.1 * rng.standard_normal(4000) + 0.3 * np.sin(
            2 * np.pi * (200 + 300 * (i % 3)) * np.arange(4000) / 8000
        )
        sf.write(root / f"au{i}.wav", wave, 8000, subtype="PCM_16")
        rows.append((f"im{i}.png", f"au{i}.wav", label))
    for split, part in (("train", rows), ("val", rows[:6]), ("test", rows[6:])):
        with (root / f"{split}.csv").open("w", newline="") as f:
            writer = csv.writer(f)
            writer.writerow(["image", "audio", "label"])
            writer.writerows(part)
    (root / "classes.txt").write_text("\n".join(CLASSES) + "\n")
    return root


def test_export_of_a_three_class_manifest_checkpoint_loads_and_predicts(tmp_path, capsys):
    data = _folder(tmp_path / "data")
    settings = [
        f"data.root={data}",
        "data.num_workers=0",
        "data.batch_size=4",
        "data.image_size=32",
        "data.sample_rate=8000",
        "model.name=hunter_tiny",
        "model.sample_rate=8000",
        "trainer.max_steps=2",
        "trainer.log.progress=false",
        "trainer.log.trackers=[]",
        f"trainer.output_dir={tmp_path / 'run'}",
    ]
    assert main(["fit", str(EXAMPLE), *settings]) == 0
    ckpt = complete_checkpoints(tmp_path / "run" / "checkpoints")[-1]
    out = tmp_path / "exported"
    assert main(["export", str(EXAMPLE), str(out), *settings, "--ckpt", str(ckpt)]) == 0, capsys.readouterr().err
    module = sss.load_model(out)
    assert module.num_classes == 3
    preds = tmp_path / "preds.csv"
    assert main(["predict", str(out), "--input", str(data / "test.csv"), "--output", str(preds)]) == 0
    with preds.open() as f:
        table = list(csv.DictReader(f))
    assert len(table) == 6 and {r["prediction"] for r in table} <= set(CLASSES)
    assert [k for k in table[0] if k.startswith("prob_")] == [f"prob_{c}" for c in CLASSES]
