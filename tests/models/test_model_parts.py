"""Unit tests of the parts: the encoder interface, the timm encoder, the front-end, the fusion heads."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
import torch
from safetensors.torch import save_file
from torch import nn

from sss.models import AudioCNN, CrossModalFusion, LateFusion, LogMelFrontend, TimmImageEncoder, TokenEncoder


@pytest.mark.parametrize(
    "encoder, x",
    [
        (TimmImageEncoder("test_resnet", dim=16), torch.randn(2, 3, 64, 64)),
        (TimmImageEncoder("test_vit", dim=16), torch.randn(2, 3, 64, 64)),
        (AudioCNN(16, width=4, depth=2), torch.randn(2, 1, 8000)),
    ],
    ids=["cnn", "vit", "audio"],
)
def test_encoders_share_one_interface(encoder: TokenEncoder, x: torch.Tensor) -> None:
    assert isinstance(encoder, TokenEncoder) and encoder.output_dim == 16
    tokens = encoder.encode(x)
    assert tokens.ndim == 3 and tokens.shape[0] == 2 and tokens.shape[2] == 16
    assert torch.equal(encoder.eval()(x), encoder.encode(x))
    encoder.set_grad_checkpointing(True)
    assert encoder.grad_checkpointing


def test_timm_encoder_without_projection_and_channels_last() -> None:
    enc = TimmImageEncoder("test_resnet", dim=None, channels_last=True).eval()
    assert enc.output_dim == enc.model.num_features
    plain = TimmImageEncoder("test_resnet", dim=None).eval()
    plain.load_state_dict(enc.state_dict())
    x = torch.randn(2, 3, 64, 64)
    torch.testing.assert_close(enc(x), plain(x), rtol=1e-4, atol=1e-5)


def test_timm_model_kwargs_reach_timm() -> None:
    enc = TimmImageEncoder("resnet10t", dim=8, model_kwargs={"channels": [8, 16, 32, 64], "stem_width": 8})
    assert enc.model.num_features == 64


def test_pretrained_true_offline_fails_with_a_clear_message(monkeypatch: pytest.MonkeyPatch) -> None:
    # Offline mode makes the hub refuse at once instead of waiting on the network.
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    try:
        import huggingface_hub.constants as hub_constants

        monkeypatch.setattr(hub_constants, "HF_HUB_OFFLINE", True)  # read at import time
    except ImportError:
        pass
    with pytest.raises(RuntimeError, match=r"pass a local \.safetensors path.*or pretrained=false"):
        TimmImageEncoder("test_resnet", pretrained=True)


def test_pretrained_local_safetensors_roundtrip(tmp_path: Path) -> None:
    import timm

    source = timm.create_model("test_resnet")  # with its classifier, as published checkpoints are
    path = tmp_path / "test_resnet.safetensors"
    save_file({k: v.contiguous() for k, v in source.state_dict().items()}, str(path))
    enc = TimmImageEncoder("test_resnet", dim=8, pretrained=str(path))
    torch.testing.assert_close(enc.model.conv1[0].weight, source.conv1[0].weight)


def test_pretrained_file_of_another_model_is_refused(tmp_path: Path) -> None:
    path = tmp_path / "linear.safetensors"
    save_file({"weight": torch.zeros(2, 2)}, str(path))
    with pytest.raises(RuntimeError, match="does not fit timm model 'test_resnet'"):
        TimmImageEncoder("test_resnet", pretrained=str(path))
    with pytest.raises(FileNotFoundError, match="not found"):
        TimmImageEncoder("test_resnet", pretrained=os.fspath(tmp_path / "nope.safetensors"))


def test_frontend_shapes_and_downmix() -> None:
    frontend = LogMelFrontend(n_mels=32).eval()
    stereo = torch.randn(2, 2, 16000)
    out = frontend(stereo)
    assert out.shape == (2, 1, 32, 101) and out.dtype == torch.float32
    torch.testing.assert_close(out, frontend(stereo.mean(dim=1)))
    torch.testing.assert_close(out, frontend(stereo.mean(dim=1, keepdim=True)))


def test_frontend_takes_cached_features() -> None:
    frontend = LogMelFrontend(n_mels=32).eval()
    wave = torch.randn(2, 1, 8000)
    features = frontend._log_mel(wave)
    torch.testing.assert_close(frontend(features), frontend(wave))
    with pytest.raises(ValueError, match="expected 32 mel bins"):
        frontend(torch.randn(2, 1, 64, 10))


def test_specaugment_only_in_training() -> None:
    frontend = LogMelFrontend(freq_mask=30, time_mask=30)
    wave = torch.randn(8, 1, 16000)
    torch.manual_seed(0)
    trained = frontend.train()(wave)
    masked_bins = (trained == 0).all(dim=-1).sum()
    masked_frames = (trained == 0).all(dim=-2).sum()
    assert masked_bins > 0 and masked_frames > 0
    evaluated = frontend.eval()(wave)
    assert not (evaluated == 0).all(dim=-1).any() and torch.equal(evaluated, frontend(wave))
    off = LogMelFrontend(freq_mask=0, time_mask=0).train()(wave)
    assert not (off == 0).all(dim=-1).any()


def test_frontend_runs_fp32_under_autocast() -> None:
    frontend = LogMelFrontend().eval()
    with torch.autocast("cpu", dtype=torch.bfloat16):
        out = frontend(torch.randn(2, 1, 16000))
    assert torch.isfinite(out).all()


def test_frontend_rejects_f_max_above_nyquist() -> None:
    with pytest.raises(ValueError, match="Nyquist"):
        LogMelFrontend(sample_rate=8000, f_max=8000)


def test_audio_cnn_tokens_follow_time() -> None:
    cnn = AudioCNN(8, width=4, depth=3, frontend=nn.Identity()).eval()
    x = torch.zeros(1, 1, 32, 64)
    x[..., 60:] = 5.0  # something happens at the end of the clip
    tokens = cnn(x)
    assert tokens.shape == (1, 8, 8)
    change = (tokens - tokens[:, :1]).abs().sum(-1)[0]
    # Early tokens (receptive field ~35 frames) cannot see it; the last one must.
    assert change[:4].max() < 1e-5 < change[-1]


@pytest.mark.parametrize("fusion", [CrossModalFusion(16, depth=2, heads=2, num_classes=3), LateFusion(16, 3)])
def test_fusion_heads(fusion: nn.Module) -> None:
    image, audio = torch.randn(2, 4, 16), torch.randn(2, 9, 16)
    assert fusion(image, audio).shape == (2, 3)
    assert fusion(image, None).shape == (2, 3) and fusion(None, audio).shape == (2, 3)
    with pytest.raises(ValueError, match="at least one modality"):
        fusion(None, None)
    with pytest.raises(ValueError, match=r"audio tokens must be \[B, N, 16\]"):
        fusion(image, torch.randn(2, 9, 8))
    with pytest.raises(ValueError, match="different batch sizes"):
        fusion(image, torch.randn(3, 9, 16))


def test_missing_modality_is_a_zero_half() -> None:
    # The present stream's contribution must not depend on whether the other one is there.
    fusion = LateFusion(16, 3).eval()
    image = torch.randn(2, 4, 16)
    zero_audio_logits = fusion.head(torch.cat([fusion.norms[0](image.mean(1)), torch.zeros(2, 16)], -1))
    torch.testing.assert_close(fusion(image, None), zero_audio_logits)


def test_cross_attention_mixes_modalities() -> None:
    fusion = CrossModalFusion(16, heads=2, num_classes=3).eval()
    image = torch.randn(2, 4, 16)
    a, b = fusion(image, torch.randn(2, 9, 16)), fusion(image, torch.randn(2, 9, 16))
    assert not torch.allclose(a, b)


def test_heads_must_divide_dim() -> None:
    with pytest.raises(ValueError, match="divisible by heads"):
        CrossModalFusion(10, heads=4)
