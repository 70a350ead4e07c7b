"""Image preprocessing bound to the weights (issue #25 item 3): timm's pretrained config travels from the
encoder to the data, a local file's ``config.json`` wins over timm's defaults, partial loads need
``model.image_strict=false``, and a fixed-size ViT refuses another ``data.image_size``."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import timm
import torch
from PIL import Image
from safetensors.torch import save_file

from sss.config import ConfigError
from sss.data._decode import normalise_u8
from sss.data.cache import cache_key
from sss.data.folder import ManifestDataModule
from sss.data.manifest import IMAGENET, IMAGENET_MEAN, IMAGENET_STD, ImageNorm, load_image
from sss.models.image.timm_encoder import TimmImageEncoder, timm_encoder
from sss.models.registry import EncoderSettings

HALF = {"image_mean": [0.5, 0.5, 0.5], "image_std": [0.5, 0.5, 0.5]}


def _weights(tmp_path: Path, name: str = "test_resnet", drop: int = 0, **kwargs) -> Path:
    source = timm.create_model(name, **kwargs)  # with its classifier, as published checkpoints are
    state = {k: v.contiguous() for k, v in source.state_dict().items()}
    for key in [k for k in state if k.endswith(".weight") and "fc" not in k][:drop]:
        del state[key]
    path = tmp_path / "w" / f"{name}.safetensors"
    path.parent.mkdir(exist_ok=True)
    save_file(state, str(path))
    return path


def _folder(tmp_path: Path) -> Path:
    root = tmp_path / "data"
    root.mkdir()
    rng = np.random.default_rng(0)
    for i in range(2):  # odd sizes, so the resize filter matters
        Image.fromarray(rng.integers(0, 256, (37, 53, 3), dtype=np.uint8)).save(root / f"{i}.png")
    (root / "train.csv").write_text("image,label\n0.png,a\n1.png,b\n")
    return root


def test_random_init_binds_nothing_and_the_defaults_are_bitwise_todays() -> None:
    assert TimmImageEncoder("test_resnet", dim=8).preprocessing() == {}
    assert ImageNorm.of({}) == IMAGENET
    pixels = torch.randint(0, 256, (2, 3, 5, 5), dtype=torch.uint8)
    # The folded multiply-add as sss computed it before the stats became a parameter.
    scale = torch.tensor([1 / (255 * s) for s in IMAGENET_STD]).view(3, 1, 1)
    shift = torch.tensor([-m / s for m, s in zip(IMAGENET_MEAN, IMAGENET_STD, strict=True)]).view(3, 1, 1)
    assert torch.equal(normalise_u8(pixels), pixels.float().mul_(scale).add_(shift))


def test_local_file_takes_timms_default_config_and_says_so(tmp_path: Path, capsys) -> None:
    enc = TimmImageEncoder("test_resnet", dim=8, pretrained=str(_weights(tmp_path)))
    prep = enc.preprocessing()
    assert prep["image_mean"] == [0.5, 0.5, 0.5] and prep["image_interpolation"] == "bilinear"
    assert prep["image_weights"] == "timm:test_resnet.r160_in1k" and "image_size" not in prep  # a CNN: any size
    line = capsys.readouterr().out
    assert "timm's default config for 'test_resnet'" in line and "0 missing" in line and "2 unexpected" in line
    assert str(tmp_path) not in json.dumps(prep)


def test_config_json_beside_the_file_wins(tmp_path: Path, capsys) -> None:
    path = _weights(tmp_path)
    block = {"mean": [0.1, 0.2, 0.3], "std": [0.3, 0.2, 0.1], "interpolation": "bicubic", "tag": "mine"}
    (path.parent / "config.json").write_text(json.dumps({"architecture": "test_resnet", "pretrained_cfg": block}))
    prep = TimmImageEncoder("test_resnet", dim=8, pretrained=str(path)).preprocessing()
    assert prep["image_mean"] == [0.1, 0.2, 0.3] and prep["image_std"] == [0.3, 0.2, 0.1]
    assert prep["image_interpolation"] == "bicubic" and prep["image_weights"] == "timm:test_resnet.mine"
    assert "preprocessing from config.json beside the weights" in capsys.readouterr().out


def test_partial_file_needs_image_strict_false(tmp_path: Path, capsys) -> None:
    path = _weights(tmp_path, drop=2)
    with pytest.raises(RuntimeError, match=r"2 of the model's \d+ tensors are missing .*model\.image_strict=false"):
        TimmImageEncoder("test_resnet", dim=8, pretrained=str(path))
    enc = timm_encoder(EncoderSettings(dim=8, backbone="test_resnet", pretrained=str(path), strict=False))
    assert "2 missing" in capsys.readouterr().out and enc.preprocessing()["image_mean"] == [0.5] * 3


def test_fixed_size_vit_reports_the_resample_and_refuses_another_data_size(tmp_path: Path, capsys) -> None:
    path = _weights(tmp_path, "test_vit", dynamic_img_size=False)  # a 160 x 160 position table
    kwargs = {"dynamic_img_size": False, "img_size": 64}  # timm resamples the table as it loads
    prep = TimmImageEncoder("test_vit", dim=8, pretrained=str(path), model_kwargs=kwargs).preprocessing()
    assert prep["image_size"] == 64 and prep["image_interpolation"] == "bicubic"
    assert "1 resized by timm (pos_embed)" in capsys.readouterr().out
    dm = ManifestDataModule(str(_folder(tmp_path)), image_size=32)
    with pytest.raises(ConfigError, match=r"data\.image_size=32, .* fixed input size of 64 .*data\.image_size=64"):
        dm.use_model_preprocessing(prep)
    ManifestDataModule(str(tmp_path / "data"), image_size=64).use_model_preprocessing(prep)


@pytest.mark.parametrize("cache", [None, "features"])
def test_data_decodes_with_the_bound_stats_and_filter(tmp_path: Path, cache: str | None) -> None:
    root = _folder(tmp_path)
    dm = ManifestDataModule(str(root), image_size=16, cache=cache, cache_dir=str(tmp_path / "c"), augment=False)
    dm.setup("fit")
    before = dm.datasets["train"][0]["image"]
    key = cache_key(dm.datasets["train"], 64)
    dm.use_model_preprocessing({**HALF, "image_interpolation": "bicubic"})
    image = dm.datasets["train"][0]["image"]
    with Image.open(root / "0.png") as img:
        pixels = np.asarray(img.convert("RGB").resize((16, 16), Image.Resampling.BICUBIC), dtype=np.float32)
    expected = (torch.from_numpy(pixels).permute(2, 0, 1) / 255 - 0.5) / 0.5
    torch.testing.assert_close(image, expected, atol=1e-6, rtol=0)
    assert not torch.allclose(image, before, atol=1e-2)
    assert cache_key(dm.datasets["train"], 64) != key  # a cache of other stats is never reused
    if cache:
        assert dm.datasets["train"].cache.folder.name.endswith(cache_key(dm.datasets["train"], 64))


def test_load_image_takes_a_norm(tmp_path: Path) -> None:
    root = _folder(tmp_path)
    norm = ImageNorm.of(HALF)
    assert torch.equal(load_image(root / "0.png", 8), load_image(root / "0.png", 8, norm=IMAGENET))
    half = load_image(root / "0.png", 8, norm=norm)
    assert half.min() >= -1 and half.max() <= 1 and not torch.equal(half, load_image(root / "0.png", 8))
    with pytest.raises(ValueError, match="image_interpolation must be one of"):
        ImageNorm.of({"image_interpolation": "random"})
