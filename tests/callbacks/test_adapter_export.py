"""model.adapter through ``sss fit``: checkpoints hold the LoRA weights and a stop + ``--resume auto`` is bitwise the
straight run; the run's model folder and ``sss export --format onnx`` merge the adapters into plain weights (no
lora_ keys in the safetensors or the graph, no model.adapter in config.yaml) whose outputs equal the adapted
model's to 1e-5; an EMA run exports its merged average."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
import yaml
from safetensors.torch import load_file

from sss import load_model
from sss.callbacks.ema import load_ema_weights
from sss.cli import main
from sss.config import load_config
from sss.model_folder import load_trained_weights
from sss.models.adapter import adapted_layers, merged_copy
from sss.onnx_export import OnnxRunner
from sss.run.parts import build_parts

# hunter_tiny's audio CNN (Conv2d layers) with LoRA and dropout in it: a resume that restored the RNG or the
# adapter weights wrongly trains other weights.
CONFIG = """\
name: lora
model:
  _target_: sss.models.create_model
  name: hunter_tiny
  num_classes: 4
  dim: 32
  heads: 4
  adapter: {type: lora, r: 2, alpha: 4, dropout: 0.2, target: [audio_encoder]}
data: {_target_: sss.data.IndustrialDataModule, n_train: 32, n_val: 8, n_test: 8, batch_size: 4, image_size: 32,
       clip_seconds: 0.5}
trainer:
  max_steps: 6
  mixed_precision: "no"
  log: {progress: false, trackers: [], plots: false}
  checkpoint: {every_n_steps: 2, keep_last: null, every_epoch: false}
"""
FINAL = "checkpoints/step_0000006"


def _fit(*words: str) -> None:
    assert main(["fit", "run.yaml", *words]) == 0


@pytest.fixture(scope="module")
def straight(tmp_path_factory):
    # One uninterrupted run, shared by the tests of this module; set up as conftest's _isolated does a test.
    import accelerate.commands.config
    from accelerate.state import AcceleratorState, GradientState

    folder = tmp_path_factory.mktemp("straight")
    with pytest.MonkeyPatch.context() as patch:
        patch.chdir(folder)
        patch.setenv("SSS_CACHE", str(folder / "cache"))
        patch.setattr(accelerate.commands.config, "default_config_file", str(folder / "no_accelerate_config.yaml"))
        Path("run.yaml").write_text(CONFIG)
        _fit("trainer.output_dir=straight")
    AcceleratorState._reset_state(reset_partial_state=True)
    GradientState._reset_state()
    return folder / "straight"


def test_a_stop_and_resume_auto_is_bitwise_the_straight_run_and_only_the_adapter_trains(straight, capsys):
    Path("run.yaml").write_text(CONFIG)
    _fit("trainer.output_dir=out", "trainer.max_steps=4", "--resume", "auto")
    _fit("trainer.output_dir=out", "--resume", "auto")
    assert "(resuming out/checkpoints/step_0000004)" in capsys.readouterr().out
    for name in ("model.safetensors", "optimizer.bin"):
        want, got = straight / FINAL / name, Path("out") / FINAL / name
        assert got.read_bytes() == want.read_bytes() if name == "optimizer.bin" else _equal(load_file(got), want)
    first, last = (
        load_file(straight / "checkpoints/step_0000002/model.safetensors"),
        load_file(straight / FINAL / "model.safetensors"),
    )
    lora = [k for k in last if ".lora_" in k]
    assert lora and all(k.startswith("module.audio_encoder.") for k in lora)  # the checkpoint holds the adapters
    for key, value in last.items():
        moved = not torch.equal(value, first[key])
        if key.startswith("module.audio_encoder.") and value.is_floating_point() and "running" not in key:
            assert moved == (".lora_B" in key or ".lora_A" in key), key  # base weights frozen, adapters train
    assert not torch.equal(last["module.fusion_head.head.weight"], first["module.fusion_head.head.weight"])


def _equal(got: dict[str, torch.Tensor], want: Path) -> bool:
    expected = load_file(want)
    assert sorted(got) == sorted(expected)
    return all(torch.equal(got[k], expected[k]) for k in expected)


def _adapted(run: Path) -> torch.nn.Module:
    # The adapted model as the run trained it: its stored config (model.adapter in it) and final checkpoint.
    cfg = load_config(run / "config.yaml")
    module = build_parts(cfg).module
    load_trained_weights(module, run / FINAL, "test")
    assert adapted_layers(module)
    return module.eval()


def _batches(n: int = 4) -> list[dict[str, torch.Tensor]]:
    gen = torch.Generator().manual_seed(7)
    return [
        {"image": torch.randn(b, 3, 32, 32, generator=gen), "audio": 0.1 * torch.randn(b, 1, 8000, generator=gen)}
        for b in (1, 3)[:n]
    ]


def test_sss_export_merges_the_adapters_into_plain_weights_and_onnx(straight):
    out = Path("exported")
    assert main(["export", str(out), "--ckpt", str(straight / FINAL), "--format", "onnx"]) == 0
    weights = load_file(out / "model.safetensors")
    assert not any("lora_" in k or "base_layer" in k for k in weights)
    import onnx

    graph = onnx.load(str(out / "model.onnx"))
    assert not any("lora" in t.name for t in graph.graph.initializer)
    assert "adapter" not in yaml.safe_load((out / "config.yaml").read_text())["model"]
    assert "- weights: LoRA adapters (r=2 on audio_encoder) merged" in (out / "README.md").read_text()
    plain, adapted, runner = load_model(out), _adapted(straight), OnnxRunner(out)
    assert not adapted_layers(plain)
    for batch in _batches():
        with torch.no_grad():
            want = adapted(batch)["logits"]
            torch.testing.assert_close(plain(batch)["logits"], want, atol=1e-5, rtol=1e-5)
        torch.testing.assert_close(runner.predict_step(batch)["logits"], want, atol=1e-4, rtol=1e-4)
    # the run's own model folder holds the same merged weights
    assert _equal(load_file(straight / "model" / "model.safetensors"), out / "model.safetensors")


def test_an_ema_run_exports_its_average_merged(capsys):
    ema = "callbacks=[{_target_: sss.callbacks.EMA, decay: 0.5, export: true, eval: false}]"
    Path("run.yaml").write_text(CONFIG)
    _fit("trainer.output_dir=ema", "trainer.max_steps=2", ema)
    folder = Path("ema/model")
    weights = load_file(folder / "model.safetensors")
    assert not any("lora_" in k for k in weights)
    adapted = _adapted_at(Path("ema"), "checkpoints/step_0000002")
    averaged = merged_copy(adapted, load_ema_weights("ema/checkpoints/step_0000002")).state_dict()
    assert sorted(weights) == sorted(averaged) and all(torch.equal(weights[k], averaged[k]) for k in weights)
    assert (
        "- weights: ema (decay 0.5); LoRA adapters (r=2 on audio_encoder) merged" in (folder / "README.md").read_text()
    )


def _adapted_at(run: Path, ckpt: str) -> torch.nn.Module:
    module = build_parts(load_config(run / "config.yaml")).module
    load_trained_weights(module, run / ckpt, "test")
    return module
