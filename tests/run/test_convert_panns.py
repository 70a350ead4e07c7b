"""``sss convert panns IN.pth OUT.safetensors``: an official-layout PANNs pickle converted, loaded and fitted on."""

from __future__ import annotations

import json
import os
from pathlib import Path

import numpy as np
import pytest
import torch
from safetensors import safe_open

import sss.models.audio.panns  # noqa: F401  # registers cnn14 / cnn10 / cnn6
from sss.cli import main
from sss.config import check_config, load_config
from sss.models import HunterModule
from sss.models.audio.panns import PannsEncoder, panns_filterbank

ROOT = Path(__file__).parents[2]
EXAMPLE = str(ROOT / "examples" / "industrial.yaml")
SMALL = [4, 4, 8, 8]


def _official(arch: str = "cnn6", widths: list[int] | None = None, seed: int = 0) -> dict[str, torch.Tensor]:
    # A state dict in PANNs' layout: the model's tensors, its AudioSet head and its front-end's fixed tensors.
    torch.manual_seed(seed)
    enc = PannsEncoder(arch, dim=4, widths=widths)
    state = {k: torch.randn_like(v) if v.is_floating_point() else v for k, v in enc.state_dict().items()}
    state |= {k: v.abs() + 0.5 for k, v in state.items() if k.endswith("running_var")}  # a variance is positive
    state = {k: v for k, v in state.items() if not k.startswith("proj.")}
    width = enc.widths[-1]
    state |= {"fc_audioset.weight": torch.randn(527, width), "fc_audioset.bias": torch.randn(527)}
    state["spectrogram_extractor.stft.conv_real.weight"] = torch.randn(513, 1, 1024)
    state["spectrogram_extractor.stft.conv_imag.weight"] = torch.randn(513, 1, 1024)
    state["logmel_extractor.melW"] = panns_filterbank()
    return state


def _save_official(path: Path, state: dict[str, torch.Tensor]) -> Path:
    # As PANNs' training script saves it, with numpy objects beside the state dict.
    torch.save(
        {"iteration": np.int64(600000), "model": state, "sampler": {"indexes": np.arange(4, dtype=np.int64)}}, path
    )
    return path


def test_convert_then_load_every_tensor_equal(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    source = _official(widths=SMALL)
    src, out = _save_official(tmp_path / "Cnn6_mAP=0.343.pth", source), tmp_path / "cnn6.safetensors"
    assert main(["convert", "panns", str(src), str(out)]) == 0
    printed = capsys.readouterr().out
    assert f"{src}: PANNs cnn6 (block widths {SMALL})" in printed
    assert f"wrote {out}: {len(source) - 3} tensors; use it with model.audio_encoder=cnn6" in printed
    assert not list(tmp_path.glob("*.partial"))
    with safe_open(str(out), framework="pt") as f:
        assert f.metadata()["arch"] == "cnn6" and f.metadata()["sample_rate"] == "32000"
    model = HunterModule(
        image_encoder="test_resnet",
        dim=8,
        heads=2,
        audio_encoder="cnn6",
        audio_pretrained=str(out),
        audio_kwargs={"widths": SMALL},
        sample_rate=32000,
    )
    encoder = model.audio_encoder
    for key, value in encoder.state_dict().items():
        if not key.startswith("proj."):
            assert torch.equal(value, source[key]), key
    assert encoder.load_report.unused == ["fc_audioset.bias", "fc_audioset.weight"]
    assert encoder.load_report.missing == [] and encoder.load_report.source["file"] == "cnn6.safetensors"


def test_a_pickle_naming_os_system_is_refused_and_not_run(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    marker = tmp_path / "pwned"

    class Evil:
        def __reduce__(self):
            return (os.system, (f"touch {marker}",))

    src, out = tmp_path / "evil.pth", tmp_path / "out.safetensors"
    torch.save({"model": _official(widths=SMALL), "x": Evil()}, src)
    assert main(["convert", "panns", str(src), str(out)]) == 2
    err = capsys.readouterr().err.strip()
    assert err == (
        f"error: {src} needs the pickle global 'posix.system', which sss never loads (only numpy arrays and scalars): "
        "not an official PANNs checkpoint"
    )
    assert not marker.exists() and not out.exists()


def test_out_is_never_overwritten(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    src, out = _save_official(tmp_path / "c.pth", _official(widths=SMALL)), tmp_path / "out.safetensors"
    out.write_text("mine")
    assert main(["convert", "panns", str(src), str(out)]) == 2
    assert "exists; sss never overwrites a file: choose another name" in capsys.readouterr().err
    assert out.read_text() == "mine"


def test_other_panns_models_refused(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    wavegram = _official(widths=SMALL) | {"pre_conv0.weight": torch.randn(4, 1, 11)}
    src = _save_official(tmp_path / "wavegram.pth", wavegram)
    assert main(["convert", "panns", str(src), str(tmp_path / "a.safetensors")]) == 2
    assert "holds tensors no PANNs cnn6 has (1, e.g. pre_conv0.weight)" in capsys.readouterr().err
    sixteen = _official(widths=SMALL) | {"logmel_extractor.melW": torch.rand(257, 64)}
    src = _save_official(tmp_path / "Cnn14_16k.pth", sixteen)
    assert main(["convert", "panns", str(src), str(tmp_path / "b.safetensors")]) == 2
    assert (
        "its mel filterbank (logmel_extractor.melW, shape [257, 64]) is not PANNs' 32000 Hz" in capsys.readouterr().err
    )


def test_cnn14_shapes(tmp_path: Path) -> None:
    # Full-size Cnn14 (80M parameters) on shapes only: recognised, written, and every shape PANNs' own.
    with torch.device("meta"):
        names = PannsEncoder("cnn14", dim=4).state_dict()
    state = {k: torch.zeros(v.shape, dtype=v.dtype) for k, v in names.items() if not k.startswith("proj.")}
    src, out = _save_official(tmp_path / "Cnn14_mAP=0.431.pth", state), tmp_path / "cnn14.safetensors"
    assert main(["convert", "panns", str(src), str(out)]) == 0
    with safe_open(str(out), framework="pt") as f:
        shapes = {k: tuple(f.get_slice(k).get_shape()) for k in f.keys()}  # noqa: SIM118  # safe_open is no mapping
        assert f.metadata()["widths"] == "64,128,256,512,1024,2048"
    assert shapes["conv_block6.conv2.weight"] == (2048, 2048, 3, 3) and shapes["fc1.weight"] == (2048, 2048)
    assert sum(int(np.prod(s)) for k, s in shapes.items() if "num_batches" not in k) > 79_000_000


def test_sss_check_gives_the_sample_rate_message(tmp_path: Path) -> None:
    cfg = load_config(EXAMPLE, ["model.audio_encoder=cnn14"])
    problems = check_config(cfg)
    assert (
        "model.sample_rate: model.sample_rate=16000 but model.audio_encoder=cnn14 takes 32000 Hz audio (PANNs' "
        "front-end is bound to the weights): set model.sample_rate=32000 data.sample_rate=32000 (files are "
        "resampled on load)"
    ) in problems


def test_fit_on_converted_weights(tmp_path: Path) -> None:
    src = _save_official(tmp_path / "Cnn6.pth", _official(widths=SMALL))
    out = tmp_path / "cnn6.safetensors"
    assert main(["convert", "panns", str(src), str(out)]) == 0
    panns = ["model.audio_encoder=cnn6", f"model.audio_pretrained={out}", "model.audio_kwargs={widths: [4, 4, 8, 8]}"]
    rate = ["model.sample_rate=32000", "data.sample_rate=32000"]
    short = ["data.n_train=16", "data.n_val=8", "data.n_test=8", "data.batch_size=8", "trainer.max_steps=2"]
    assert main(["fit", EXAMPLE, *panns, *rate, *short, "trainer.log.progress=false"]) == 0
    results = json.loads(Path("runs/industrial/results.json").read_text())
    assert results["global_step"] == 2
