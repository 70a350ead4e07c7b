"""PANNs CNN14 / CNN10 / CNN6 (`sss.models.audio.panns`): names, front-end, load report, bound settings."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch
from safetensors.torch import save_file

import sss.models.audio.panns  # noqa: F401  # registers cnn14 / cnn10 / cnn6
from sss.config import ConfigError
from sss.models import HunterModule
from sss.models.audio.panns import PannsEncoder, PannsFrontend, load_panns, panns_filterbank, panns_setting_problems
from sss.models.registry import list_encoders

SMALL = {"widths": [4, 4, 8, 8]}
PANNS = {"sample_rate": 32000, "n_mels": 64}


def _hz_to_mel(f: np.ndarray) -> np.ndarray:  # librosa's Slaney mel scale (htk=False), as PANNs' melW uses
    f_sp, min_log_hz, logstep = 200.0 / 3, 1000.0, np.log(6.4) / 27.0
    return np.where(f >= min_log_hz, min_log_hz / f_sp + np.log(np.maximum(f, 1e-12) / min_log_hz) / logstep, f / f_sp)


def _mel_to_hz(m: np.ndarray) -> np.ndarray:
    f_sp, min_log_hz, logstep = 200.0 / 3, 1000.0, np.log(6.4) / 27.0
    return np.where(m >= min_log_hz / f_sp, min_log_hz * np.exp(logstep * (m - min_log_hz / f_sp)), f_sp * m)


def _librosa_mel(sr: int = 32000, n_fft: int = 1024, n_mels: int = 64, fmin: float = 50.0, fmax: float = 14000.0):
    # librosa.filters.mel(sr, n_fft, n_mels, fmin, fmax) (norm="slaney"), written out in float64.
    fftfreqs = np.linspace(0, sr / 2, 1 + n_fft // 2)
    mel_f = _mel_to_hz(np.linspace(_hz_to_mel(np.array(fmin)), _hz_to_mel(np.array(fmax)), n_mels + 2))
    fdiff, ramps = np.diff(mel_f), np.subtract.outer(mel_f, fftfreqs)
    weights = np.stack(
        [np.maximum(0, np.minimum(-ramps[i] / fdiff[i], ramps[i + 2] / fdiff[i + 1])) for i in range(64)]
    )
    return (weights * (2.0 / (mel_f[2:] - mel_f[:-2]))[:, None]).T  # [513, 64], PANNs' melW


def _clip() -> np.ndarray:
    # 1 s at 32 kHz: a decaying 880 Hz tone, then a noise burst.
    t = np.arange(32000) / 32000
    noise = np.random.default_rng(0).standard_normal(32000) * (t > 0.5)
    return (0.5 * np.sin(2 * np.pi * 880 * t) * np.exp(-3 * t) + 0.05 * noise).astype(np.float32)


def test_registered_and_named_as_panns() -> None:
    assert {"cnn14", "cnn10", "cnn6"} <= set(list_encoders("audio"))
    with torch.device("meta"):
        state = PannsEncoder("cnn14", dim=8).state_dict()
    shapes = {k: tuple(v.shape) for k, v in state.items()}
    assert shapes["bn0.weight"] == (64,) and shapes["conv_block1.conv1.weight"] == (64, 1, 3, 3)
    assert shapes["conv_block6.conv2.weight"] == (2048, 2048, 3, 3) and shapes["fc1.weight"] == (2048, 2048)
    assert not any(k.startswith("frontend.") for k in state)  # the window and filterbank are constants
    with torch.device("meta"):
        cnn6 = PannsEncoder("cnn6", dim=8).state_dict()
    assert tuple(cnn6["conv_block4.conv1.weight"].shape) == (512, 256, 5, 5) and "conv_block1.conv2.weight" not in cnn6


def test_frontend_matches_a_plain_panns_log_mel() -> None:
    melw = _librosa_mel()
    assert np.abs(panns_filterbank().double().numpy() - melw).max() < 1e-5 * melw.max()
    clip, n_fft, hop = _clip(), 1024, 320
    padded = np.pad(clip.astype(np.float64), n_fft // 2, mode="reflect")
    window = 0.5 - 0.5 * np.cos(2 * np.pi * np.arange(n_fft) / n_fft)  # periodic Hann (librosa's "hann")
    frames = np.stack([padded[i * hop : i * hop + n_fft] * window for i in range(1 + len(clip) // hop)])
    want = 10 * np.log10(np.maximum((np.abs(np.fft.rfft(frames, axis=1)) ** 2) @ melw, 1e-10))
    got = PannsFrontend()(torch.from_numpy(clip)[None]).squeeze().double().numpy()
    assert got.shape == want.shape == (101, 64)
    loud = want > want.max() - 60  # float32's range: below that both are rounding noise
    assert np.abs(got - want)[loud].max() < 1e-4 and np.abs(got - want).max() < 0.1


def test_hunter_with_cnn6_trains() -> None:
    model = HunterModule(image_encoder="test_resnet", dim=8, heads=2, audio_encoder="cnn6", audio_kwargs=SMALL, **PANNS)
    batch = {"image": torch.randn(2, 3, 32, 32), "audio": torch.randn(2, 1, 32000), "label": torch.tensor([0, 1])}
    loss = model.compute_loss(model(batch), batch)
    loss.backward()
    assert model.audio_encoder.conv_block1.conv1.weight.grad is not None
    assert model.audio_encoder.bn0.weight.grad is not None  # affine bn0, as PANNs
    assert model.preprocessing()["audio_frontend"]["sample_rate"] == 32000


def test_wrong_sample_rate_and_mels_are_one_clear_error_each() -> None:
    with pytest.raises(ValueError) as exc:  # ConfigError from the builder, ValueError from setting_problems
        HunterModule(image_encoder="test_resnet", dim=8, heads=2, audio_encoder="cnn14", sample_rate=16000)
    assert str(exc.value) == (
        "model.sample_rate=16000 but model.audio_encoder=cnn14 takes 32000 Hz audio (PANNs' front-end is bound to "
        "the weights): set model.sample_rate=32000 data.sample_rate=32000 (files are resampled on load)"
    )
    problems = panns_setting_problems({"audio_encoder": "cnn10", "sample_rate": 32000, "n_mels": 32})
    assert problems == [
        (
            "n_mels",
            "model.n_mels=32 but model.audio_encoder=cnn10 takes PANNs' 64 mel bins (its bn0 and filterbank are "
            "bound to the weights): set model.n_mels=64",
        )
    ]


def _source(arch: str = "cnn6", **kw) -> dict[str, torch.Tensor]:
    torch.manual_seed(1)
    enc = PannsEncoder(arch, dim=4, **{**SMALL, **kw})
    for p in enc.parameters():
        p.data.normal_()
    state = {k: v for k, v in enc.state_dict().items() if not k.startswith("proj.")}
    state["fc_audioset.weight"], state["fc_audioset.bias"] = torch.randn(527, 8), torch.randn(527)
    return state


def test_load_report_and_audioset_head_dropped(tmp_path: Path) -> None:
    state, path = _source(), tmp_path / "w.safetensors"
    save_file(state, str(path), metadata={"sss_source": "panns", "arch": "cnn6"})
    enc = PannsEncoder("cnn6", dim=4, **SMALL)
    report = load_panns(enc, path)
    assert report.missing == report.unexpected == [] and report.unused == [
        "fc_audioset.bias",
        "fc_audioset.weight",
    ]
    assert report.new == ["proj.weight", "proj.bias"] and len(report.loaded) == len(state) - 2
    for key, value in enc.state_dict().items():
        if key in state:
            assert torch.equal(value, state[key]), key


def test_partial_load_refused_unless_not_strict(tmp_path: Path) -> None:
    state, path = _source(), tmp_path / "w.safetensors"
    del state["conv_block2.conv1.weight"]
    save_file(state, str(path))
    with pytest.raises(ConfigError) as exc:
        load_panns(PannsEncoder("cnn6", dim=4, **SMALL), path)
    assert str(exc.value) == (
        f"model.audio_pretrained={path} fits model.audio_encoder=cnn6 only in part: 30 of 31 tensors loaded, "
        "1 missing (e.g. conv_block2.conv1.weight), 0 unexpected: another architecture? model.audio_strict=false "
        "trains the missing ones from scratch"
    )
    enc = PannsEncoder("cnn6", dim=4, **SMALL)
    before = enc.conv_block2.conv1.weight.clone()
    report = load_panns(enc, path, strict=False)
    assert report.missing == ["conv_block2.conv1.weight"] and torch.equal(enc.conv_block2.conv1.weight, before)
    assert torch.equal(enc.conv_block3.conv1.weight, state["conv_block3.conv1.weight"])


def test_wrong_widths_arch_and_pickles_refused(tmp_path: Path) -> None:
    path = tmp_path / "w.safetensors"
    save_file(_source(), str(path), metadata={"sss_source": "panns", "arch": "cnn6"})
    with pytest.raises(ConfigError, match=r"another shape \(e.g. conv_block4.*\) \(model.audio_kwargs.widths\?\)"):
        load_panns(PannsEncoder("cnn6", dim=4, widths=[4, 4, 8, 16]), path)
    with pytest.raises(
        ConfigError, match=r"holds PANNs cnn6 weights but model.audio_encoder=cnn10: set model.audio_encoder=cnn6"
    ):
        load_panns(PannsEncoder("cnn10", dim=4, **SMALL), path)
    with pytest.raises(
        ConfigError, match=r"is a pickle, which sss never loads as weights: convert it first with sss convert panns"
    ):
        load_panns(PannsEncoder("cnn6", dim=4, **SMALL), tmp_path / "Cnn6.pth")


def test_short_clips_and_cached_features_refused() -> None:
    enc = PannsEncoder("cnn14", dim=4, widths=[2] * 6)
    with pytest.raises(ValueError, match=r"needs clips of at least 32 frames \(0.32 s at 32 kHz\), got 11"):
        enc(torch.randn(1, 3200))
    with pytest.raises(ValueError, match=r"data.cache=features stores sss's own log-mel"):
        enc(torch.randn(1, 1, 64, 101))


def test_onnx_export_matches_torch(tmp_path: Path) -> None:
    # The front-end (torch.stft, the filterbank matmul, dB) is inside the graph, so ONNX computes the same inputs.
    from sss.onnx_export import write_onnx

    torch.manual_seed(0)
    model = HunterModule(image_encoder="test_resnet", dim=8, heads=2, audio_encoder="cnn6", audio_kwargs=SMALL, **PANNS)
    found = write_onnx(model, tmp_path, {"image_size": 32, "sample_rate": 32000, "clip_seconds": 1.0})
    assert found["inputs"]["audio"] == ["batch", 1, 32000] and found["max_abs_diff"] < 1e-4
