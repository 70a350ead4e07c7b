"""Unit tests of the parts: the encoder interface, the timm encoder, the front-end, the fusion heads."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
import torch
from safetensors.torch import save_file
from torch import nn

from sss.models import (
    AudioCNN,
    AudioSpectrogramTransformer,
    BottleneckFusion,
    CrossModalFusion,
    EventHead,
    LateFusion,
    LogMelFrontend,
    MaskHead,
    TimmImageEncoder,
    TokenEncoder,
    resample_events,
    resize_mask,
)


@pytest.mark.parametrize(
    "encoder, x",
    [
        (TimmImageEncoder("test_resnet", dim=16), torch.randn(2, 3, 64, 64)),
        (TimmImageEncoder("test_vit", dim=16), torch.randn(2, 3, 64, 64)),
        (AudioCNN(16, width=4, depth=2), torch.randn(2, 1, 8000)),
        (AudioSpectrogramTransformer(16, depth=1, heads=2), torch.randn(2, 1, 8000)),
    ],
    ids=["cnn", "vit", "audio_cnn", "audio_ast"],
)
def test_encoders_share_one_interface(encoder: TokenEncoder, x: torch.Tensor) -> None:
    assert isinstance(encoder, TokenEncoder) and encoder.output_dim == 16
    tokens = encoder.encode(x)
    assert tokens.ndim == 3 and tokens.shape[0] == 2 and tokens.shape[2] == 16
    assert torch.equal(encoder.eval()(x), encoder.encode(x))
    encoder.set_grad_checkpointing(True)
    assert encoder.grad_checkpointing


def _conv_input_formats(encoder: TimmImageEncoder, x: torch.Tensor) -> list[bool]:
    """Whether each convolution of the backbone got a channels-last input in one forward pass."""
    seen: list[bool] = []

    def record(_: nn.Module, args: tuple[torch.Tensor, ...]) -> None:
        seen.append(args[0].is_contiguous(memory_format=torch.channels_last))

    convs = [m for m in encoder.model.modules() if isinstance(m, nn.Conv2d)]
    hooks = [c.register_forward_pre_hook(record) for c in convs]
    encoder(x)
    for hook in hooks:
        hook.remove()
    assert len(seen) == len(convs) > 0
    return seen


def test_timm_encoder_without_projection_and_channels_last() -> None:
    enc = TimmImageEncoder("test_resnet", dim=None, channels_last=True).eval()
    assert enc.output_dim == enc.model.num_features
    plain = TimmImageEncoder("test_resnet", dim=None).eval()
    plain.load_state_dict(enc.state_dict())
    x = torch.randn(2, 3, 64, 64)
    torch.testing.assert_close(enc(x), plain(x), rtol=1e-4, atol=1e-5)
    # the memory format really used: every convolution runs on channels-last inputs and weights
    assert all(_conv_input_formats(enc, x)) and not any(_conv_input_formats(plain, x))
    kernels = [p for p in enc.model.parameters() if p.ndim == 4]
    assert kernels and all(p.is_contiguous(memory_format=torch.channels_last) for p in kernels)


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


FUSION_HEADS = [
    CrossModalFusion(16, depth=2, heads=2, num_classes=3),
    BottleneckFusion(16, depth=2, heads=2, num_classes=3),
    LateFusion(16, 3),
]


@pytest.mark.parametrize("fusion", FUSION_HEADS, ids=["cross_attention", "bottleneck", "late"])
def test_fusion_heads(fusion: nn.Module) -> None:
    image, audio = torch.randn(2, 4, 16), torch.randn(2, 9, 16)
    assert fusion(image, audio).shape == (2, 3)
    fused_image, fused_audio = fusion.fuse(image, audio)
    assert fused_image.shape == image.shape and fused_audio.shape == audio.shape
    torch.testing.assert_close(fusion.classify(fused_image, fused_audio), fusion(image, audio))
    assert fusion.fuse(image, None)[1] is None and fusion.fuse(None, audio)[0] is None
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


def test_bottleneck_fusion_mixes_modalities_only_through_the_bottleneck() -> None:
    torch.manual_seed(0)
    fusion = BottleneckFusion(16, depth=2, heads=2, num_classes=3).eval()
    image = torch.randn(2, 4, 16)
    a, b = fusion(image, torch.randn(2, 9, 16)), fusion(image, torch.randn(2, 9, 16))
    assert not torch.allclose(a, b)
    # with one layer the streams exchange nothing in attention; the read-out of the averaged bottleneck still mixes
    one = BottleneckFusion(16, depth=1, heads=2, num_classes=3).eval()
    assert not torch.allclose(one.fuse(image, torch.randn(2, 9, 16))[0], one.fuse(image, torch.randn(2, 9, 16))[0])
    # the bottleneck is the only path: zero bottleneck tokens and no read-out -> image stream ignores audio
    layer = fusion.layers[0]
    audio1, audio2, shared = torch.randn(2, 9, 16), torch.randn(2, 9, 16), torch.randn(2, 3, 16)
    torch.testing.assert_close(layer(image, audio1, shared)[0], layer(image, audio2, shared)[0])
    assert not torch.allclose(layer(image, audio1, shared)[2], layer(image, audio2, shared)[2])


def test_bottleneck_lone_stream_keeps_its_own_copy() -> None:
    layer = BottleneckFusion(8, heads=2).layers[0].eval()
    image, shared = torch.randn(2, 4, 8), torch.randn(2, 3, 8)
    out_image, none, out_shared = layer(image, None, shared)
    joint = layer.blocks[0](torch.cat([image, shared], dim=1))
    assert none is None
    torch.testing.assert_close(out_image, joint[:, :4])
    torch.testing.assert_close(out_shared, joint[:, 4:])
    with pytest.raises(ValueError, match="num_bottlenecks >= 1"):
        BottleneckFusion(8, heads=2, num_bottlenecks=0)


@pytest.mark.parametrize(
    ("samples", "stride", "frames", "cols"), [(16000, None, 101, 7), (16000, (16, 10), 101, 10), (800, None, 6, 1)]
)
def test_ast_patches_cover_every_frame(samples: int, stride: tuple[int, int] | None, frames: int, cols: int) -> None:
    ast = AudioSpectrogramTransformer(8, depth=1, heads=2, patch_stride=stride, frontend=LogMelFrontend(n_mels=32))
    assert ast.frontend(torch.randn(1, samples)).shape[-1] == frames
    tokens = ast.eval()(torch.randn(2, 1, samples))
    assert tokens.shape == (2, ast.freq_rows * cols, 8) and ast.to_frames(tokens).shape == (2, cols, 8)


def test_ast_time_layout_and_long_clips() -> None:
    ast = AudioSpectrogramTransformer(8, depth=1, heads=2, max_frames=64, frontend=nn.Identity()).eval()
    # tokens are frequency-major: to_frames averages rows, so column t is the mean over rows of token f * T' + t
    tokens = torch.arange(2 * 4 * 3, dtype=torch.float).view(1, 12, 2).repeat(1, 1, 4)
    torch.testing.assert_close(ast.to_frames(tokens), tokens.view(1, 4, 3, 8).mean(1))
    with pytest.raises(ValueError, match="do not tile 4 frequency rows"):
        ast.to_frames(torch.zeros(1, 10, 8))
    # longer than the position table: it is interpolated, not an index error
    assert ast(torch.randn(1, 1, 64, 400)).shape == (1, 4 * 25, 8)


def test_ast_bad_configs_are_named() -> None:
    with pytest.raises(ValueError, match="width=10 must be divisible by heads=4"):
        AudioSpectrogramTransformer(10, heads=4)
    with pytest.raises(ValueError, match="patch height 16 is more than the front-end's n_mels=8"):
        AudioSpectrogramTransformer(8, heads=2, frontend=LogMelFrontend(n_mels=8))
    ast = AudioSpectrogramTransformer(8, width=16, heads=2)
    assert isinstance(ast.proj, nn.Linear) and ast.output_dim == 8


def test_event_targets_keep_short_events_when_downsampled() -> None:
    target = torch.zeros(1, 100, 2)
    target[0, 35:37, 0] = 1.0  # a 20 ms knock in 10 ms frames
    target[0, 90:, 1] = 1.0
    down = resample_events(target, 7)
    assert down[0, :, 0].tolist() == [0, 0, 1, 0, 0, 0, 0] and down[0, -1, 1] == 1 and down[0, :-1, 1].sum() == 0
    # nearest sampling would lose the knock: this is why max pooling
    nearest = torch.nn.functional.interpolate(target.transpose(1, 2), size=7, mode="nearest")
    assert nearest[0, 0].sum() == 0
    up = resample_events(torch.tensor([[[0.0], [1.0]]]), 4)
    assert up[0, :, 0].tolist() == [0, 0, 1, 1]


def test_mask_targets_are_area_pooled() -> None:
    mask = torch.zeros(2, 1, 64, 64)
    mask[:, :, :8, :4] = 1.0
    small = resize_mask(mask, (8, 8))
    assert small.shape == (2, 1, 8, 8) and small[0, 0, 0, 0] == 0.5 and small.sum() == 2 * 0.5
    assert resize_mask(mask[:, 0], (8, 8)).shape == (2, 1, 8, 8)  # [B, H, W] gets its channel
    with pytest.raises(ValueError, match=r"\[B, 1, H, W\]"):
        resize_mask(torch.zeros(2, 3, 8, 8), (4, 4))


def test_mask_head_pixel_layout() -> None:
    head = MaskHead(4, upsample=2)
    with torch.no_grad():
        head.norm.weight.fill_(1.0)
        head.out.weight.zero_()
        head.out.bias.copy_(torch.tensor([1.0, 2.0, 3.0, 4.0]))  # the 2 x 2 sub-pixels of every token
    out = head(torch.randn(1, 4, 2, 3))
    assert out.shape == (1, 1, 4, 6)
    assert out[0, 0, :2, :2].tolist() == [[1.0, 2.0], [3.0, 4.0]] and out[0, 0, 2:, 4:].tolist() == [
        [1.0, 2.0],
        [3.0, 4.0],
    ]
    assert EventHead(8, 3)(torch.randn(2, 5, 8)).shape == (2, 5, 3)


def test_timm_grid_follows_the_image() -> None:
    cnn = TimmImageEncoder("test_resnet", dim=8)
    tokens = cnn(torch.randn(1, 3, 64, 128))
    assert cnn.grid == (2, 4) and cnn.to_grid(tokens).shape == (1, 8, 2, 4)
    # token n of the sequence is grid cell (n // w, n % w)
    torch.testing.assert_close(cnn.to_grid(tokens)[0, :, 1, 2], tokens[0, 6])
    vit = TimmImageEncoder("test_vit", dim=8)
    tokens = vit(torch.randn(1, 3, 64, 64))
    torch.testing.assert_close(vit.to_grid(tokens)[0, :, 0, 0], tokens[0, 1])  # CLS dropped
    with pytest.raises(RuntimeError, match="do not fit the last encoded grid"):
        vit.to_grid(tokens[:, :5])
