"""trainer.compile: regional compiles each repeated block in place (one graph per block class), names unchanged."""

from __future__ import annotations

import pytest
import torch
from safetensors.torch import load_file
from torch import nn
from torch.utils.data import DataLoader

from sss import SSSTrainer
from sss.models import create_model
from sss.testing import RandomClips
from sss.trainer._compile import compile_module, repeated_blocks


def _ast_hunter(**overrides):
    # hunter_tiny with the transformer audio encoder: 4 AST blocks, 2 cross-attention fusion layers
    torch.manual_seed(0)
    settings = {"audio_encoder": "ast", "audio_depth": 4, "audio_width": 32, "fusion_depth": 2}
    return create_model("hunter_tiny", num_classes=4, **{**settings, **overrides})


def _batch(n: int = 2) -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(1)
    return {"image": torch.randn(n, 3, 64, 64, generator=g), "audio": torch.randn(n, 1, 8000, generator=g) * 0.1}


class Graphs:
    """A torch.compile backend that counts the graphs it is given and runs them eagerly."""

    def __init__(self) -> None:
        self.count = 0

    def __call__(self, gm: torch.fx.GraphModule, example_inputs: list) -> object:
        self.count += 1
        return gm.forward


def test_repeated_blocks_are_the_transformer_layers_of_sss_timm_and_hugging_face() -> None:
    assert repeated_blocks(_ast_hunter()) == ["audio_encoder.blocks", "fusion_head.layers"]
    # hunter_tiny's audio CNN is a list of conv blocks, and its LayerNorm pairs are not blocks
    assert repeated_blocks(create_model("hunter_tiny", num_classes=4)) == ["audio_encoder.blocks"]
    timm = pytest.importorskip("timm")
    vit = timm.create_model("vit_tiny_patch16_224", depth=2, embed_dim=32, num_heads=2, img_size=32)
    assert repeated_blocks(vit) == ["blocks"]  # an nn.Sequential
    transformers = pytest.importorskip("transformers")
    config = transformers.ASTConfig(
        hidden_size=32, num_hidden_layers=2, num_attention_heads=4, intermediate_size=64, num_mel_bins=16, max_length=32
    )
    hf = transformers.ASTModel(config)
    names = repeated_blocks(hf)
    assert len(names) == 1 and len(hf.get_submodule(names[0])) == 2


def test_regional_compiles_each_block_in_place_once_per_block_class_and_keeps_the_names() -> None:
    eager, model = _ast_hunter(), _ast_hunter()
    keys = list(model.state_dict())
    graphs = Graphs()
    torch._dynamo.reset()
    names = compile_module(model, "regional", backend=graphs)
    assert names == [*(f"audio_encoder.blocks.{i}" for i in range(4)), "fusion_head.layers.0", "fusion_head.layers.1"]
    assert list(model.state_dict()) == keys  # checkpoints portable: no _orig_mod. in the names
    assert model._compiled_call_impl is None and model.audio_encoder._compiled_call_impl is None  # the rest eager
    assert all(model.get_submodule(name)._compiled_call_impl is not None for name in names)
    for _ in range(2):
        for m in (model, eager):  # the same training forwards (BatchNorm statistics, SpecAugment draws) for both
            torch.manual_seed(2)
            m(_batch())
        assert graphs.count == 2  # 6 blocks of 2 classes: 2 graphs (the compiler's cache serves the other blocks)
    out, expected = model.eval()(_batch()), eager.eval()(_batch())
    torch.testing.assert_close(out, expected)
    assert graphs.count == 4  # eval mode: one more graph per class


def test_regional_without_repeated_blocks_warns_and_compiles_the_whole_module() -> None:
    model = nn.Sequential(nn.Linear(4, 8), nn.GELU(), nn.Linear(8, 2))
    with pytest.warns(UserWarning, match=r"regional found no repeated blocks .* in Sequential: compiling the whole"):
        assert compile_module(model, "regional", backend=Graphs()) == [""]
    assert model._compiled_call_impl is not None
    plain = nn.Linear(2, 2)
    assert compile_module(plain, False) == [] and plain._compiled_call_impl is None
    assert compile_module(plain, "full", backend=Graphs()) == [""] and plain._compiled_call_impl is not None


def _fit(model, tmp_path, **settings):
    trainer = SSSTrainer(
        max_steps=3,
        seed=0,
        mixed_precision="no",
        output_dir=str(tmp_path),
        log={"progress": False, "trackers": []},
        checkpoint={"every_epoch": False},
        **settings,
    )
    trainer.fit(model, train_dataloaders=DataLoader(RandomClips(6), batch_size=2))
    return trainer


@pytest.mark.slow
def test_a_regional_fit_trains_like_eager_and_writes_the_checkpoint_an_eager_fit_writes(tmp_path) -> None:
    # the trainer's own path: inductor (CPU: needs a C compiler), 2 AST blocks and 1 fusion layer
    eager, compiled = _ast_hunter(audio_depth=2, fusion_depth=1), _ast_hunter(audio_depth=2, fusion_depth=1)
    eager_run = _fit(eager, tmp_path / "eager")
    torch._dynamo.reset()
    trainer = _fit(compiled, tmp_path / "regional", compile="regional")
    assert compiled._compiled_call_impl is None and compiled.audio_encoder.blocks[0]._compiled_call_impl is not None
    # inductor's fused kernels round differently; Adam's normalised steps make that at most ~lr per step
    torch.testing.assert_close(compiled.state_dict(), eager.state_dict(), rtol=1e-3, atol=1e-3)
    saved = [run.save_checkpoint(tmp_path / f"ckpt-{i}") for i, run in enumerate((eager_run, trainer))]
    weights = [load_file(next(path.glob("model*.safetensors"))) for path in saved]
    assert sorted(weights[1]) == sorted(weights[0])  # the checkpoint an eager run writes: it loads either way
