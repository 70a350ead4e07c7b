"""The model folder records the preprocessing bound to the weights and their source (issue #25 item 3):
``preprocessing.json`` and the card's Preprocessing section; ``sss predict`` and the ONNX example inputs
decode with it, and a folder exported before it was recorded still loads and decodes as it was trained."""

from __future__ import annotations

import csv
import json
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest
import soundfile as sf
import timm
import torch
from PIL import Image
from safetensors.torch import save_file

import sss
from sss.config import SSSConfig
from sss.data.manifest import ImageNorm, load_image
from sss.model_folder import DamagedModelFolderError, export_model, read_preprocessing, recorded_preprocessing
from sss.models import create_model
from sss.onnx_export import example_inputs
from sss.run.predict import _dataset, predict

TINY = {"_target_": "sss.models.create_model", "name": "hunter_tiny", "num_classes": 2}
BOUND = ImageNorm((0.5, 0.5, 0.5), (0.25, 0.25, 0.25), "bicubic")


def _pretrained(tmp_path: Path) -> Path:
    """hunter_tiny's image backbone saved as a local timm file, with a Hub-style config.json of other stats."""
    folder = tmp_path / "weights"
    folder.mkdir()
    torch.manual_seed(1)
    backbone = timm.create_model("resnet10t", channels=[8, 16, 32, 64], stem_width=8)
    save_file({k: v.contiguous() for k, v in backbone.state_dict().items()}, str(folder / "model.safetensors"))
    block = {"mean": list(BOUND.mean), "std": list(BOUND.std), "interpolation": "bicubic", "tag": "sss_test"}
    (folder / "config.json").write_text(json.dumps({"architecture": "resnet10t", "pretrained_cfg": block}))
    return folder / "model.safetensors"


def _inputs(tmp_path: Path) -> Path:
    root = tmp_path / "inputs"
    root.mkdir()
    rng = np.random.default_rng(0)
    for i in range(2):
        Image.fromarray(rng.integers(0, 256, (45, 61, 3), dtype=np.uint8)).save(root / f"{i}.png")
        sf.write(root / f"{i}.wav", rng.standard_normal(8000).astype(np.float32) * 0.1, 16000)
    (root / "rows.csv").write_text("image,audio\n0.png,0.wav\n1.png,1.wav\n")
    return root / "rows.csv"


def _export(tmp_path: Path) -> Path:
    weights = _pretrained(tmp_path)
    module = create_model("hunter_tiny", num_classes=2, image_pretrained=str(weights))
    data = SimpleNamespace(classes=["a", "b"], task="multiclass", image_size=32, sample_rate=16000, clip_seconds=0.5)
    cfg = SSSConfig(name="bound", model={**TINY, "image_pretrained": str(weights)})
    folder = export_model(module, cfg, {}, tmp_path / "model", data)
    weights.unlink()  # the folder must not need the local file it was trained from
    return folder


def test_folder_records_the_bound_preprocessing_and_predict_decodes_with_it(tmp_path: Path) -> None:
    folder = _export(tmp_path)
    prep = read_preprocessing(folder)
    assert prep["image_mean"] == [0.5] * 3 and prep["image_std"] == [0.25] * 3
    assert prep["image_interpolation"] == "bicubic" and prep["image_weights"] == "timm:resnet10t.sss_test"
    assert prep["image_size"] == 32  # the data's size: a CNN takes any
    bound = {"image_mean": [0.5] * 3, "image_std": [0.25] * 3, "image_interpolation": "bicubic"}
    assert recorded_preprocessing(folder) == bound  # what sss validate --ckpt FOLDER hands the data
    card = (folder / "README.md").read_text()
    assert "## Preprocessing" in card and "| image_mean | [0.5, 0.5, 0.5] |" in card
    assert "| image_interpolation | bicubic |" in card and "image: `timm:resnet10t.sss_test`" in card
    for name in ("preprocessing.json", "README.md", "config.yaml"):
        assert str(tmp_path) not in (folder / name).read_text()
    rows = _inputs(tmp_path)
    decoded = _dataset(rows, prep, {}, tmp_path / "skipped.csv")[0]["image"]
    assert torch.equal(decoded, load_image(rows.parent / "0.png", 32, norm=BOUND))
    assert not torch.allclose(decoded, load_image(rows.parent / "0.png", 32), atol=1e-2)  # not ImageNet's
    out = predict(folder, rows, tmp_path / "preds.csv")
    with out.open() as f:
        assert len(list(csv.DictReader(f))) == 2


def test_an_old_folder_without_the_settings_loads_and_decodes_with_the_defaults(tmp_path: Path) -> None:
    folder = _export(tmp_path)
    prep = {k: v for k, v in read_preprocessing(folder).items() if not k.startswith("image_") or k == "image_size"}
    (folder / "preprocessing.json").write_text(json.dumps(prep))
    rows = _inputs(tmp_path)
    decoded = _dataset(rows, read_preprocessing(folder), {}, tmp_path / "skipped.csv")[0]["image"]
    assert torch.equal(decoded, load_image(rows.parent / "0.png", 32))
    assert recorded_preprocessing(folder) == {}
    sss.load_model(folder)
    assert predict(folder, rows, tmp_path / "preds.csv").is_file()


def test_onnx_example_images_are_pixels_normalised_with_the_recorded_stats() -> None:
    module = create_model("hunter_tiny", num_classes=2)
    old = {"image_size": 8, "sample_rate": 16000, "clip_seconds": 0.1}
    gen = torch.Generator().manual_seed(0)
    assert torch.equal(example_inputs(module, old)["image"], torch.randn(2, 3, 8, 8, generator=gen))  # as before
    image = example_inputs(module, {**old, "image_mean": list(BOUND.mean), "image_std": list(BOUND.std)})["image"]
    pixels = (image * 0.25 + 0.5) * 255
    torch.testing.assert_close(pixels, pixels.round(), atol=1e-3, rtol=0)
    assert image.min() >= -2 and image.max() <= 2 and pixels.max() > 200 and pixels.min() < 50


@pytest.mark.parametrize(
    ("value", "problem"),
    [([0.5, 0.0, 0.5], "std > 0"), ("0.5", "image_std: expected a list of 3 numbers"), ([1, 1], "3 values each")],
)
def test_a_damaged_recorded_std_is_refused(tmp_path: Path, value: object, problem: str) -> None:
    folder = _export(tmp_path)
    prep = read_preprocessing(folder)
    (folder / "preprocessing.json").write_text(json.dumps({**prep, "image_std": value}))
    with pytest.raises(DamagedModelFolderError, match=problem):
        read_preprocessing(folder)


@pytest.mark.slow
def test_onnx_predict_equals_torch_with_the_bound_stats(tmp_path: Path) -> None:
    pytest.importorskip("onnxruntime")
    folder = _export(tmp_path)
    onnx = sss.model_folder.export_onnx(folder, tmp_path / "onnx")
    rows = _inputs(tmp_path)
    preds = {}
    for runtime, source in (("torch", folder), ("onnx", onnx)):
        with predict(source, rows, tmp_path / f"{runtime}.csv", runtime=runtime).open() as f:
            preds[runtime] = [[float(v) for k, v in row.items() if k.startswith("prob_")] for row in csv.DictReader(f)]
    np.testing.assert_allclose(preds["onnx"], preds["torch"], atol=1e-4)
