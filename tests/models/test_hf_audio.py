"""``model.audio_encoder=hf``: tiny random Hugging Face towers saved offline load into `HFAudioEncoder`, compute what
``from_pretrained`` computes, train inside a `HunterModule`, refuse what does not fit, and rebuild from a model folder
without their source folder."""

from __future__ import annotations

import json
import shutil

import numpy as np
import pytest
import soundfile
import torch
import transformers as T

from sss.config.errors import ConfigError
from sss.models import HunterModule
from sss.models.audio.hf import FAMILIES, HFAudioEncoder, hf_encoder, plain_config
from sss.models.audio.hf_frontend import frontend_for
from sss.models.registry import EncoderSettings

SMALL = {"hidden_size": 32, "num_hidden_layers": 2, "num_attention_heads": 4, "intermediate_size": 37}
W2V = SMALL | {
    "conv_dim": (32, 32),
    "conv_kernel": (10, 3),
    "conv_stride": (5, 2),
    "num_conv_pos_embeddings": 16,
    "num_conv_pos_embedding_groups": 2,
}
RATES = {"clap": 48000}


def _ast() -> tuple:
    return T.ASTModel(T.ASTConfig(**SMALL, num_mel_bins=32, max_length=128)), T.ASTFeatureExtractor(
        num_mel_bins=32, max_length=128
    )


def _whisper() -> tuple:
    config = T.WhisperConfig(
        d_model=32,
        encoder_layers=2,
        encoder_attention_heads=4,
        decoder_layers=1,
        decoder_attention_heads=4,
        encoder_ffn_dim=37,
        decoder_ffn_dim=37,
        num_mel_bins=80,
        max_source_positions=100,  # 200 frames = 2 s at 10 ms
        max_target_positions=20,
        vocab_size=100,
        pad_token_id=0,
        bos_token_id=1,
        eos_token_id=2,
        decoder_start_token_id=1,
    )
    return T.WhisperModel(config), T.WhisperFeatureExtractor(feature_size=80, chunk_length=2)


def _clap() -> tuple:
    audio = {
        "spec_size": 64,
        "freq_ratio": 4,
        "num_mel_bins": 16,
        "patch_size": 4,
        "patch_stride": (4, 4),
        "window_size": 4,
        "hidden_size": 32,
        "depths": [1, 1],
        "num_attention_heads": [2, 2],
        "patch_embeds_hidden_size": 16,
        "enable_fusion": False,
        "projection_dim": 16,
    }
    text = {"vocab_size": 50, "hidden_size": 16, "num_hidden_layers": 1, "num_attention_heads": 2}
    config = T.ClapConfig(audio_config=audio, text_config=text | {"intermediate_size": 16}, projection_dim=16)
    extractor = T.ClapFeatureExtractor(feature_size=16, max_length_s=1, truncation="rand_trunc")
    return T.ClapModel(config), extractor


BUILDERS = {
    "ast": _ast,
    "wav2vec2": lambda: (T.Wav2Vec2Model(T.Wav2Vec2Config(**W2V)), T.Wav2Vec2FeatureExtractor()),
    "hubert": lambda: (T.HubertModel(T.HubertConfig(**W2V)), T.Wav2Vec2FeatureExtractor()),
    "wavlm": lambda: (
        T.WavLMModel(T.WavLMConfig(**W2V, num_buckets=8, max_bucket_distance=16)),
        T.Wav2Vec2FeatureExtractor(),
    ),
    "whisper": _whisper,
    "clap": _clap,
}


@pytest.fixture(scope="module")
def folders(tmp_path_factory: pytest.TempPathFactory) -> dict:
    # One tiny random checkpoint per family, written as save_pretrained writes a downloaded one.
    root, found = tmp_path_factory.mktemp("hf"), {}
    torch.manual_seed(0)
    for name, build in BUILDERS.items():
        model, extractor = build()
        model.save_pretrained(root / name)
        extractor.save_pretrained(root / name)
        found[name] = root / name
    return found


def _clip(rate: int, seconds: float, seed: int = 0) -> np.ndarray:
    # Real-ish audio: a decaying 440 Hz tone, a noise burst, a low noise floor; written and read back as 16-bit PCM.
    rng, t = np.random.default_rng(seed), np.arange(int(rate * seconds)) / rate
    wave = 0.5 * np.sin(2 * np.pi * 440 * t) * np.exp(-3 * t) + 1e-3 * rng.standard_normal(t.size)
    start = t.size // 3
    wave[start : start + t.size // 10] += 0.3 * rng.standard_normal(t.size // 10)
    return wave.astype(np.float32)


def _real(tmp_path, rate: int, seconds: float, seed: int = 0) -> np.ndarray:
    path = tmp_path / f"clip{seed}.wav"
    soundfile.write(path, _clip(rate, seconds, seed), rate, subtype="PCM_16")
    wave, _ = soundfile.read(path, dtype="float32")
    return wave


def _encoder(folder, name: str, **kwargs) -> HFAudioEncoder:
    settings = {"dim": 16, "pretrained": folder, "sample_rate": RATES.get(name, 16000)} | kwargs
    return hf_encoder(EncoderSettings(**settings))


@pytest.mark.parametrize("name", list(BUILDERS))
def test_front_end_matches_the_saved_feature_extractor(name, folders, tmp_path):
    extractor = T.AutoFeatureExtractor.from_pretrained(folders[name], local_files_only=True)
    rate = extractor.sampling_rate
    batch = np.stack([_real(tmp_path, rate, 0.9, seed) for seed in (0, 1)])
    want = extractor(list(batch), sampling_rate=rate, return_tensors="pt")
    want = want.get("input_values", want.get("input_features")).float()
    got = frontend_for(_model_type(folders[name]), extractor.to_dict())(torch.from_numpy(batch))
    if name == "clap":
        # CLAP's extractor works in float64 and in dB: float32 rounding of the quietest bins shows as ~1e-3 dB
        # (1e-4 of the values); it holds to 1e-4 relative.
        torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-4)
    else:
        assert got.shape == want.shape and float((got - want).abs().max()) < 1e-4


def _model_type(folder) -> str:
    kind = json.loads((folder / "config.json").read_text())["model_type"]
    return "clap_audio_model" if kind == "clap" else kind


def test_front_ends_work_under_autocast_and_in_float32():
    extractor = T.ASTFeatureExtractor(num_mel_bins=32, max_length=128).to_dict()
    frontend = frontend_for("audio-spectrogram-transformer", extractor)
    wave = torch.randn(2, 1, 16000, dtype=torch.bfloat16)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        assert frontend(wave).dtype == torch.float32


@pytest.mark.parametrize("name", list(BUILDERS))
def test_each_family_loads_every_tensor_and_computes_what_from_pretrained_computes(name, folders):
    encoder = _encoder(folders[name], name).eval()
    report = encoder.load_report
    assert report.loaded and not report.missing and not report.unexpected and not report.resized
    assert "/" not in json.dumps(encoder.preprocessing())  # the source is a model type and a file name, not a path
    reference = BUILDERS[name]()[0].__class__.from_pretrained(folders[name], local_files_only=True).eval()
    wave = torch.from_numpy(_clip(RATES.get(name, 16000), 0.9))[None]
    features = encoder.frontend(wave)
    with torch.no_grad():
        if name == "whisper":
            want = reference.encoder(features).last_hidden_state
        elif name == "clap":
            want = reference.audio_model(features).last_hidden_state
        else:
            want = reference(features).last_hidden_state
        got = encoder.tower(features).last_hidden_state
    torch.testing.assert_close(got, want)
    if name in ("wav2vec2", "hubert", "wavlm", "whisper"):
        assert all(getattr(encoder.tower.config, k, 0.0) == 0.0 for k in ("layerdrop", "encoder_layerdrop"))


def test_unused_parts_of_a_bigger_checkpoint_are_reported_not_loaded(folders):
    encoder = _encoder(folders["whisper"], "whisper")
    assert encoder.load_report.unused and all(k.startswith("decoder.") for k in encoder.load_report.unused)


def _hunter(folder, **overrides) -> HunterModule:
    settings = {"image_encoder": "test_resnet", "dim": 16, "heads": 2, "audio_encoder": "hf"}
    return HunterModule(**settings | {"audio_pretrained": str(folder)} | overrides)


@pytest.mark.parametrize("name", ["ast", "wav2vec2"])
def test_hunter_forward_and_backward(name, folders):
    # AST with Hugging Face's activation checkpointing on: the same backward, recomputed.
    model = _hunter(folders[name], num_event_classes=2, grad_checkpointing=name == "ast")
    samples = 16000 if name == "ast" else 4000  # wav2vec2's convolutions run at the sample rate: keep it short
    batch = {"image": torch.randn(2, 3, 32, 32), "audio": torch.randn(2, 1, samples), "label": torch.tensor([0, 1])}
    outputs = model(batch)
    assert outputs["logits"].shape == (2, 4) and outputs["events"].shape[0] == 2
    model.training_step(batch, 0).backward()
    assert all(p.grad is not None for p in model.audio_encoder.tower.parameters() if p.requires_grad)


def test_a_partial_load_is_refused_unless_not_strict(folders, tmp_path):
    from safetensors.torch import load_file, save_file

    partial = tmp_path / "partial"
    shutil.copytree(folders["ast"], partial)
    state = load_file(partial / "model.safetensors")
    save_file({k: v for k, v in state.items() if "layer.1." not in k}, partial / "model.safetensors")
    with pytest.raises(
        ConfigError, match=r"only in part: \d+ of 39 tensors loaded, 16 missing .*model.audio_strict=false"
    ):
        _encoder(partial, "ast")
    report = _encoder(partial, "ast", strict=False).load_report
    assert len(report.missing) == 16 and len(report.loaded) == 23


def test_a_pickle_only_folder_and_a_missing_folder_are_refused(folders, tmp_path):
    pickled = tmp_path / "pickled"
    shutil.copytree(folders["ast"], pickled)
    (pickled / "model.safetensors").rename(pickled / "pytorch_model.bin")
    with pytest.raises(ConfigError, match=r"holds a pickle .* sss reads safetensors only"):
        _encoder(pickled, "ast")
    problems = HunterModule.setting_problems({"audio_encoder": "hf", "audio_pretrained": str(tmp_path / "nope")})
    assert problems[0][0] == "audio_pretrained" and str(tmp_path / "nope") in problems[0][1]
    (tmp_path / "empty").mkdir()
    problems = HunterModule.setting_problems({"audio_encoder": "hf", "audio_pretrained": str(tmp_path / "empty")})
    assert "has no config.json" in problems[0][1]
    assert HunterModule.setting_problems({"audio_encoder": "hf"})[0][1].startswith(
        "model.audio_encoder=hf needs model.audio_pretrained=DIR"
    )


def test_a_wrong_sample_rate_is_one_error_naming_both_rates(folders):
    message = "model.sample_rate=32000 but the hf weights were trained on 16000 Hz audio .* model.sample_rate=16000"
    settings = {"audio_encoder": "hf", "audio_pretrained": str(folders["ast"]), "sample_rate": 32000}
    ((key, problem),) = HunterModule.setting_problems(settings)  # sss check: reads the JSON files only
    assert key == "sample_rate" and "data.sample_rate=16000" in problem
    with pytest.raises(ConfigError, match=message):
        _encoder(folders["ast"], "ast", sample_rate=32000)


def test_a_clip_longer_than_the_position_table_is_refused(folders):
    encoder = _encoder(folders["ast"], "ast")
    encoder(torch.randn(1, 16000 + 160 * 20))  # 1.2 s: 118 frames of 128, padded
    with pytest.raises(
        ValueError, match=r"a 1.400 s clip is longer than the 1.295 s .*max_length=128 frames.*data.clip_seconds<=1.295"
    ):
        encoder(torch.randn(1, 22400))


def test_fewer_frames_cut_the_position_table_and_say_so(folders):
    encoder = _encoder(folders["ast"], "ast", kwargs={"max_frames": 108})
    (resized,) = encoder.load_report.resized
    assert resized.startswith("embeddings.position_embeddings (1, 26, 32) -> (1, 22, 32)")
    reference = T.ASTModel.from_pretrained(folders["ast"], local_files_only=True)
    table, cut = reference.embeddings.position_embeddings, encoder.tower.embeddings.position_embeddings
    torch.testing.assert_close(cut[:, 2:].unflatten(1, (2, 10)), table[:, 2:].unflatten(1, (2, 12))[:, :, :10])
    assert encoder(torch.randn(2, 16000)).shape == (2, 20, 16)
    with pytest.raises(ConfigError, match="max_frames=200: the weights' position table holds 128 frames"):
        _encoder(folders["ast"], "ast", kwargs={"max_frames": 200})


def test_the_exported_config_is_plain_values_that_rebuild_the_encoder(folders):
    encoder = _encoder(folders["whisper"], "whisper")
    settings = encoder.export_settings()
    assert "_name_or_path" not in settings["hf_config"] and str(folders["whisper"]) not in json.dumps(settings)
    rebuilt = hf_encoder(EncoderSettings(dim=16, kwargs=settings))
    assert {k: v.shape for k, v in rebuilt.state_dict().items()} == {
        k: v.shape for k, v in encoder.state_dict().items()
    }
    assert plain_config({"a": {"cache_dir": "x", "url": "https://x", "b": "/abs"}}) == {"a": {}}
    assert set(FAMILIES) >= {"audio-spectrogram-transformer", "wav2vec2", "hubert", "wavlm", "whisper"}


def test_export_and_load_model_work_without_the_source_folder(folders, tmp_path):
    from sss.config import SSSConfig
    from sss.model_folder import export_model, load_model

    source = tmp_path / "ast_copy"
    shutil.copytree(folders["ast"], source)
    model = _hunter(source, num_classes=3).eval()
    cfg = SSSConfig()
    cfg.model = {
        "_target_": "sss.models.HunterModule",
        "num_classes": 3,
        "image_encoder": "test_resnet",
        "dim": 16,
        "heads": 2,
        "audio_encoder": "hf",
        "audio_pretrained": str(source),
        **model.export_settings(),
    }
    folder = export_model(model, cfg, {}, tmp_path / "exported")
    shutil.rmtree(source)
    loaded = load_model(folder).eval()
    batch = {"image": torch.randn(2, 3, 32, 32), "audio": torch.randn(2, 1, 16000)}
    with torch.no_grad():
        torch.testing.assert_close(loaded(batch)["logits"], model(batch)["logits"])


def test_a_model_id_is_read_from_the_local_cache_only(folders, tmp_path, monkeypatch):
    import huggingface_hub

    # The cache layout huggingface_hub writes: models--ORG--NAME/{refs/main, snapshots/REV/...}.
    revision = "0" * 40
    repo = tmp_path / "cache" / "models--org--tiny-ast"
    shutil.copytree(folders["ast"], repo / "snapshots" / revision)
    (repo / "refs").mkdir()
    (repo / "refs" / "main").write_text(revision)
    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_CACHE", str(tmp_path / "cache"))
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    assert not _encoder("org/tiny-ast", "ast").load_report.missing
    with pytest.raises(ConfigError, match="org/not-cached: no such folder, nor a model in the local Hugging Face"):
        _encoder("org/not-cached", "ast")


def test_the_onnx_graph_holds_the_kaldi_front_end(folders, tmp_path):
    from sss.onnx_export import write_onnx

    model = _hunter(folders["ast"], modalities=["audio"], fusion="late").eval()
    found = write_onnx(model, tmp_path, {"sample_rate": 16000, "clip_seconds": 1.0})
    assert found["inputs"] == {"audio": ["batch", 1, 16000]} and found["max_abs_diff"] < 1e-4


def test_whisper_files_that_disagree_on_the_input_length_are_refused(folders):
    config = json.loads((folders["whisper"] / "config.json").read_text())
    with pytest.raises(ConfigError, match=r"chunk_length gives 300 frames but config\.json max_source_positions=100"):
        HFAudioEncoder(config, {"chunk_length": 3, "feature_size": 80}, dim=16)
