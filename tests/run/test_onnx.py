"""ONNX export (``sss export ... --format onnx``) and ``sss predict --runtime onnx``: the graph computes as PyTorch."""

from __future__ import annotations

import builtins
import csv
from pathlib import Path

import pytest
import torch

from sss.cli import main
from sss.config import instantiate, load_config
from sss.data import make_industrial
from sss.data.synthetic import CLASSES
from sss.model_folder import add_onnx, export_model
from sss.onnx_export import CHECK_BATCHES, OnnxExportError, OnnxRunner, write_onnx

EXAMPLE = Path(__file__).parents[2] / "examples" / "industrial.yaml"


class _Industrial:  # what export records of the industrial data module: classes and decoding settings
    classes, task, image_size, sample_rate, clip_seconds = list(CLASSES), None, 64, 16000, 1.0


def _model_folder(folder: Path, overrides: list[str]) -> tuple[torch.nn.Module, Path]:
    cfg = load_config(EXAMPLE, overrides)
    torch.manual_seed(0)
    module = instantiate(cfg.model).eval()
    with torch.no_grad():  # BatchNorm statistics away from their init values, as after training
        for name, buf in module.named_buffers():
            if name.endswith("running_mean"):
                buf.normal_(0, 0.5)
            elif name.endswith("running_var"):
                buf.uniform_(0.5, 2.0)
    return module, export_model(module, cfg, {}, folder, _Industrial())


@pytest.fixture(scope="module")
def small(tmp_path_factory):
    # The default model (examples/industrial.yaml: hunter_small), exported once through the CLI for this module.
    root = tmp_path_factory.mktemp("onnx")
    module, folder = _model_folder(root / "model", [])
    assert main(["export", str(folder), str(root / "onnx"), "--format", "onnx"]) == 0
    return module, root / "onnx"


def _assert_matches_torch(module: torch.nn.Module, folder: Path) -> None:
    runner = OnnxRunner(folder)
    gen = torch.Generator().manual_seed(123)
    worst = 0.0
    for i in range(16):  # 16 random batches, sizes 1 and 7 in turn: the batch axis is dynamic
        b = (1, 7)[i % 2]
        batch = {"image": torch.randn(b, 3, 64, 64, generator=gen), "audio": torch.randn(b, 1, 16000, generator=gen)}
        with torch.no_grad():
            want = module(batch)["logits"]
        got = runner.predict_step(batch)["logits"]
        assert got.shape == want.shape == (b, 4)
        worst = max(worst, float((got - want).abs().max()))
    assert worst <= 1e-4, worst


@pytest.mark.slow
def test_default_model_onnx_equals_pytorch_and_the_card_says_how(small):
    module, folder = small
    _assert_matches_torch(module, folder)
    assert sorted(p.name for p in folder.iterdir()) == [
        "README.md",
        "config.yaml",
        "model.onnx",
        "model.safetensors",
        "preprocessing.json",
    ]
    card = (folder / "README.md").read_text()
    import onnxruntime

    assert "- opset 18" in card and f"onnxruntime {onnxruntime.__version__}" in card
    assert "`image` float32 [batch, 3, 64, 64], `audio` float32 [batch, 1, 16000] (the batch axis is dynamic)" in card
    assert f"random batches of sizes {', '.join(map(str, CHECK_BATCHES))}" in card and "max |difference|" in card
    assert card.count("## ONNX") == 1 and "hunter_small" in card  # the model card of the folder, extended


@pytest.mark.slow
def test_the_graph_refuses_a_batch_with_an_absent_modality(small):
    # model.onnx has no presence input: fed a zero placeholder as a real image, it would predict silently wrong.
    _, folder = small
    runner = OnnxRunner(folder)
    batch = {"image": torch.zeros(2, 3, 64, 64), "audio": torch.zeros(2, 1, 16000)}
    assert runner.predict_step({**batch, "image_present": torch.tensor([True, True])})["logits"].shape == (2, 4)
    with pytest.raises(ValueError, match=r"takes no image_present input, and 1 sample\(s\) .* --runtime torch"):
        runner.predict_step({**batch, "image_present": torch.tensor([True, False])})


@pytest.mark.slow
def test_ast_audio_variant_onnx_equals_pytorch(tmp_path):
    module, folder = _model_folder(tmp_path / "ast", ["model.audio_encoder=ast"])
    add_onnx(module, folder)
    _assert_matches_torch(module, folder)


@pytest.mark.slow
def test_predict_runtime_onnx_writes_the_torch_rows(small, tmp_path, capsys):
    _, folder = small
    data = make_industrial(tmp_path / "data", n_train=1, n_val=0, n_test=8, seed=3)
    tables = {}
    for runtime in ("torch", "onnx"):
        out = tmp_path / f"{runtime}.csv"
        args = ["predict", str(folder), "--input", str(data / "test.csv"), "--output", str(out), "--batch-size", "3"]
        assert main([*args, "--runtime", runtime]) == 0, capsys.readouterr().err
        with out.open() as f:
            tables[runtime] = list(csv.DictReader(f))
    assert len(tables["onnx"]) == len(tables["torch"]) == 8
    for t, o in zip(tables["torch"], tables["onnx"], strict=True):
        assert {k: v for k, v in t.items() if not k.startswith("prob_")} == {
            k: v for k, v in o.items() if not k.startswith("prob_")
        }
        probs = [k for k in t if k.startswith("prob_")]
        assert len(probs) == 4 and all(abs(float(t[k]) - float(o[k])) <= 1e-4 for k in probs)
    refused = tmp_path / "refused.csv"
    args = ["predict", str(folder), "--input", str(data / "test.csv"), "--output", str(refused), "--runtime", "onnx"]
    assert main([*args, "model.dropout=0.5"]) == 2
    assert "model.* overrides: use --runtime torch" in capsys.readouterr().err and not refused.exists()


class _Branchy(torch.nn.Module):  # data-dependent control flow: no static graph to export
    modalities = ("image",)

    def forward(self, batch):
        image = batch["image"].flatten(1)
        return image if image.sum() > 0 else -image


def test_a_model_that_does_not_export_names_its_module_and_leaves_nothing(tmp_path):
    message = r"_Branchy did not export to ONNX: module _Branchy .*--format safetensors"
    with pytest.raises(OnnxExportError, match=message):
        write_onnx(_Branchy(), tmp_path, {"image_size": 4})
    assert not (tmp_path / "model.onnx").exists()
    with pytest.raises(OnnxExportError, match=r"preprocessing.json records no image_size"):
        write_onnx(_Branchy(), tmp_path, {})


def test_missing_extra_and_cli_misuse_are_one_line(tmp_path, monkeypatch, capsys):
    _, folder = _model_folder(tmp_path / "model", ["model.name=hunter_tiny"])
    real_import = builtins.__import__

    def without_onnxscript(name, *args, **kwargs):
        if name.split(".")[0] == "onnxscript":
            raise ImportError(f"No module named {name!r}")
        return real_import(name, *args, **kwargs)

    monkeypatch.setattr(builtins, "__import__", without_onnxscript)
    out = tmp_path / "onnx"
    assert main(["export", str(folder), str(out), "--format", "onnx"]) == 1
    err = capsys.readouterr().err.strip()
    assert err.count("\n") == 0 and "onnxscript is not installed" in err
    assert "pip install 'shadow-sound-hunter[onnx]'" in err and not out.exists()
    monkeypatch.setattr(builtins, "__import__", real_import)
    assert main(["export", str(folder), str(out)]) == 2  # a model folder without --format onnx
    assert "needs --ckpt PATH" in capsys.readouterr().err
    preds = tmp_path / "preds.csv"
    assert main(["predict", str(folder), "--input", "x.csv", "--output", str(preds), "--runtime", "onnx"]) == 1
    assert "holds no model.onnx: write one with sss export ... --format onnx" in capsys.readouterr().err


class _Drifting(torch.nn.Module):  # exports its first call's constant; PyTorch's later calls add others
    modalities = ("image",)

    def __init__(self) -> None:
        super().__init__()
        self.calls = 0

    def forward(self, batch):
        self.calls += 1
        return batch["image"].flatten(1)[:, :4] + 0.01 * self.calls


def test_a_graph_that_differs_from_pytorch_beyond_the_tolerance_is_refused_and_not_kept(tmp_path):
    # The check is the export's promise ("checked against PyTorch"): a graph off by 0.01 or more must not pass.
    refused = r"model\.onnx: the ONNX graph of _Drifting differs from PyTorch by .*--format safetensors"
    with pytest.raises(OnnxExportError, match=refused):
        write_onnx(_Drifting(), tmp_path, {"image_size": 4})
    assert not (tmp_path / "model.onnx").exists()
