"""``sss validate --ckpt MODEL_FOLDER`` decodes with the image preprocessing the folder records (issue #25): its
config no longer names the pretrained weights the image side was bound to."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import soundfile as sf
import timm
from PIL import Image
from safetensors.torch import save_file

from sss.config import SSSConfig
from sss.data.folder import ManifestDataModule
from sss.model_folder import export_model, load_folder_config
from sss.run.evaluate import run_evaluate
from sss.run.parts import build_parts


def test_validate_a_model_folder_decodes_with_its_recorded_stats(tmp_path: Path, monkeypatch) -> None:
    (tmp_path / "w").mkdir()
    backbone = timm.create_model("resnet10t", channels=[8, 16, 32, 64], stem_width=8)
    save_file({k: v.contiguous() for k, v in backbone.state_dict().items()}, str(tmp_path / "w" / "model.safetensors"))
    block = {"mean": [0.5] * 3, "std": [0.25] * 3, "interpolation": "bicubic"}
    (tmp_path / "w" / "config.json").write_text(json.dumps({"architecture": "resnet10t", "pretrained_cfg": block}))
    root = tmp_path / "data"
    root.mkdir()
    rng = np.random.default_rng(0)
    for split in ("train", "val"):
        lines = ["image,audio,label"]
        for i in range(4):
            Image.fromarray(rng.integers(0, 256, (40, 50, 3), dtype=np.uint8)).save(root / f"{split}{i}.png")
            sf.write(root / f"{split}{i}.wav", rng.standard_normal(8000).astype(np.float32) * 0.1, 16000)
            lines.append(f"{split}{i}.png,{split}{i}.wav,{'ab'[i % 2]}")
        (root / f"{split}.csv").write_text("\n".join(lines) + "\n")
    spec = {"_target_": "sss.models.create_model", "name": "hunter_tiny"}
    data = {"_target_": "sss.data.ManifestDataModule", "root": str(root), "image_size": 32}
    cfg = SSSConfig(
        name="bound", model={**spec, "image_pretrained": str(tmp_path / "w" / "model.safetensors")}, data=data
    )
    parts = build_parts(cfg)
    folder = export_model(parts.module, cfg, {}, tmp_path / "model", parts.datamodule)
    seen = []
    original = ManifestDataModule.use_model_preprocessing
    monkeypatch.setattr(
        ManifestDataModule, "use_model_preprocessing", lambda self, p: seen.append(p) or original(self, p)
    )
    out = tmp_path / "val.json"
    run_evaluate(load_folder_config(folder, [f"data.root={root}"]), str(folder), "val", str(out), ablation=False)
    assert seen[-1] == {"image_mean": [0.5] * 3, "image_std": [0.25] * 3, "image_interpolation": "bicubic"}
    assert out.is_file()
