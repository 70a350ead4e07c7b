"""`build_parts` hands the model's bound preprocessing to the data (issue #25 item 3): the run decodes images with
the pretrained weights' own mean/std/filter, and refuses a data.image_size a fixed-size ViT cannot take."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import soundfile as sf
import timm
import torch
from PIL import Image
from safetensors.torch import save_file

from sss.config import ConfigError, SSSConfig
from sss.data.manifest import ImageNorm, load_image
from sss.run.parts import build_parts


def _weights(tmp_path: Path, name: str, block: dict | None = None, **kwargs) -> Path:
    (tmp_path / "w").mkdir()
    model = timm.create_model(name, **kwargs)
    save_file({k: v.contiguous() for k, v in model.state_dict().items()}, str(tmp_path / "w" / "model.safetensors"))
    if block:
        (tmp_path / "w" / "config.json").write_text(json.dumps({"architecture": name, "pretrained_cfg": block}))
    return tmp_path / "w" / "model.safetensors"


def _data(tmp_path: Path) -> Path:
    root = tmp_path / "data"
    root.mkdir()
    rng = np.random.default_rng(0)
    lines = ["image,audio,label"]
    for i in range(4):
        Image.fromarray(rng.integers(0, 256, (40, 50, 3), dtype=np.uint8)).save(root / f"{i}.png")
        sf.write(root / f"{i}.wav", rng.standard_normal(8000).astype(np.float32) * 0.1, 16000)
        lines.append(f"{i}.png,{i}.wav,{'ab'[i % 2]}")
    (root / "train.csv").write_text("\n".join(lines) + "\n")
    return root


def _cfg(root: Path, **model) -> SSSConfig:
    data = {"_target_": "sss.data.ManifestDataModule", "root": str(root), "image_size": 32, "augment": False}
    return SSSConfig(
        name="bound", model={"_target_": "sss.models.create_model", "name": "hunter_tiny", **model}, data=data
    )


def test_the_run_decodes_with_the_weights_own_stats(tmp_path: Path) -> None:
    block = {"mean": [0.5] * 3, "std": [0.25] * 3, "interpolation": "bicubic"}
    weights = _weights(tmp_path, "resnet10t", block, channels=[8, 16, 32, 64], stem_width=8)
    root = _data(tmp_path)
    parts = build_parts(_cfg(root, image_pretrained=str(weights)))
    bound = ImageNorm((0.5,) * 3, (0.25,) * 3, "bicubic")
    assert parts.datamodule.image_norm == bound
    assert torch.equal(parts.datamodule.datasets["train"][0]["image"], load_image(root / "0.png", 32, norm=bound))
    plain = build_parts(_cfg(root))  # random init: the data keeps ImageNet's, bilinear
    assert torch.equal(plain.datamodule.datasets["train"][0]["image"], load_image(root / "0.png", 32))


def test_a_data_size_a_fixed_vit_cannot_take_is_one_clear_error(tmp_path: Path) -> None:
    weights = _weights(tmp_path, "test_vit", dynamic_img_size=False)
    kwargs = {"dynamic_img_size": False, "img_size": 64}
    cfg = _cfg(_data(tmp_path), image_encoder="test_vit", image_kwargs=kwargs, image_pretrained=str(weights))
    with pytest.raises(ConfigError, match=r"data\.image_size=32, .*fixed input size of 64.*set data\.image_size=64"):
        build_parts(cfg)
