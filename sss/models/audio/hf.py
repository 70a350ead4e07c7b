"""``model.audio_encoder=hf``: a Hugging Face audio model from a local folder as an sss `TokenEncoder`.

`HFAudioEncoder` wraps AST (``ASTModel``), wav2vec2 / HuBERT / WavLM (their base models), Whisper's encoder
(``WhisperEncoder``) and CLAP's audio tower (``ClapAudioModel``, unfused checkpoints). The checkpoint's
``preprocessor_config.json`` becomes the on-device front-end (`sss.models.audio.hf_frontend`), so fit, predict and
ONNX compute the same inputs. Weights are read with safetensors from the folder (or a model already in the local
Hugging Face cache); nothing is downloaded and no checkpoint code is run. ``transformers`` is imported lazily:
it is the ``hf`` extra.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from torch import Tensor, nn

from sss.config.errors import ConfigError
from sss.models.audio.hf_frontend import HFFrontend, frontend_for
from sss.models.base import TokenEncoder
from sss.models.loading import LoadReport
from sss.models.registry import EncoderSettings, register_encoder

__all__ = ["FAMILIES", "HFAudioEncoder", "hf_encoder", "hf_setting_problems", "load_hf_weights"]

_LOG = logging.getLogger(__name__)
EXTRA = "pip install 'shadow-sound-hunter[hf]'"
KWARGS = ("hf_config", "feature_extractor", "max_frames")
"""The keys ``model.audio_kwargs`` takes for ``audio_encoder=hf``."""


@dataclass(frozen=True)
class _Family:
    model_class: str
    prefixes: tuple[str, ...]  # where the tower's tensors sit in a checkpoint of a bigger model
    unused: tuple[str, ...]  # the parts of such checkpoints sss does not use (heads, decoders, other towers)


_W2V_HEADS = ("lm_head.", "classifier.", "projector.", "quantizer.", "project_hid.", "project_q.", "label_embeddings")
FAMILIES: dict[str, _Family] = {
    "audio-spectrogram-transformer": _Family("ASTModel", ("audio_spectrogram_transformer.",), ("classifier.",)),
    "wav2vec2": _Family("Wav2Vec2Model", ("wav2vec2.",), _W2V_HEADS),
    "hubert": _Family("HubertModel", ("hubert.",), _W2V_HEADS),
    "wavlm": _Family("WavLMModel", ("wavlm.",), _W2V_HEADS),
    "whisper": _Family(
        "models.whisper.modeling_whisper.WhisperEncoder",
        ("model.encoder.", "encoder."),
        ("model.decoder.", "decoder.", "proj_out."),
    ),
    "clap_audio_model": _Family(
        "ClapAudioModel",
        ("audio_model.",),
        ("text_model.", "text_projection.", "audio_projection.", "logit_scale_a", "logit_scale_t"),
    ),
}
"""The model types sss wraps (``config.json`` ``model_type``; a CLAP checkpoint's tower is ``clap_audio_model``)."""
_DROPPED_CONFIG = ("_name_or_path", "auto_map", "transformers_version", "architectures", "dtype", "torch_dtype")
_DROPPED_CONFIG += ("id2label", "label2id", "mel_filters", "mel_filters_slaney", "window")  # unused, and 527+ values
_FILE_WORDS = ("path", "file", "filename", "dir", "url", "uri")


class HFAudioEncoder(TokenEncoder):
    """A Hugging Face audio tower over its own front-end, returning tokens ``[B, N, dim]``.

    Built with random weights from `hf_config` (a ``config.json`` as a dict) and `feature_extractor` (a
    ``preprocessor_config.json`` as a dict); `load_hf_weights` fills it from a folder. A ``Linear`` maps the
    tower's width to `dim` when they differ (new, trained from scratch). LayerDrop is switched off
    (``layerdrop=0``): a layer skipped at random leaves parameters without a gradient, which DDP refuses
    (speechbrain #2340). Tokens: AST's patch tokens (frequency-major, its CLS and distillation tokens dropped),
    the frames of wav2vec2 / HuBERT / WavLM / Whisper, CLAP's final-stage tokens.

    Args:
        hf_config: The checkpoint's ``config.json``; ``model_type`` picks the tower (`FAMILIES`).
        feature_extractor: The checkpoint's ``preprocessor_config.json`` (``{}``: the class defaults).
        dim: Token width.
        max_frames: AST only: the frames every clip is padded to, at most the position table's ``max_length``;
            fewer cut the table's time columns (AST's and SSAST's recipe for shorter clips; SSAST #11).

    Example:
        >>> from transformers import Wav2Vec2Config
        >>> config = Wav2Vec2Config(hidden_size=16, num_hidden_layers=1, num_attention_heads=2, intermediate_size=8,
        ...     conv_dim=(8, 8), conv_kernel=(10, 3), conv_stride=(5, 2), num_conv_pos_embeddings=4,
        ...     num_conv_pos_embedding_groups=2).to_dict()
        >>> encoder = HFAudioEncoder(config, {"sampling_rate": 16000}, dim=8)
        >>> encoder(torch.randn(2, 1, 1600)).shape
        torch.Size([2, 159, 8])
    """

    def __init__(
        self,
        hf_config: Mapping[str, Any],
        feature_extractor: Mapping[str, Any] | None = None,
        dim: int = 128,
        *,
        max_frames: int | None = None,
    ) -> None:
        super().__init__(output_dim=dim)
        config = _config_object(hf_config)
        self.model_type = config.model_type
        _cut_ast_table(config, max_frames)
        extractor = {**(feature_extractor or {}), **({"max_length": max_frames} if max_frames else {})}
        self.hf_config = plain_config(config.to_dict())
        self.feature_extractor = plain_config(extractor)
        self.frontend: HFFrontend = frontend_for(self.model_type, extractor)
        _check_whisper_length(config, self.frontend)
        self.tower = _tower_class(self.model_type)(config)
        hidden = int(getattr(config, "hidden_size", None) or config.d_model)
        self.proj: nn.Module = nn.Linear(hidden, dim) if hidden != dim else nn.Identity()
        self.freq_rows = _freq_rows(config)
        self.load_report: LoadReport | None = None

    def encode(self, x: Tensor) -> Tensor:
        """Waveform ``[B, S]`` / ``[B, C, S]`` to tokens ``[B, N, dim]``.

        Example:
            >>> from transformers import Wav2Vec2Config
            >>> config = Wav2Vec2Config(hidden_size=8, num_hidden_layers=1, num_attention_heads=2,
            ...     intermediate_size=8, conv_dim=(8,), conv_kernel=(10,), conv_stride=(5,), num_conv_pos_embeddings=4,
            ...     num_conv_pos_embedding_groups=2).to_dict()
            >>> HFAudioEncoder(config, {}, dim=8).encode(torch.randn(1, 100)).shape
            torch.Size([1, 19, 8])
        """
        features = self.frontend(x)
        hidden = self.tower(features).last_hidden_state
        if self.model_type == "audio-spectrogram-transformer":
            hidden = hidden[:, 2:]  # drop the CLS and distillation tokens: the fusion pools, a frame head needs patches
        elif hidden.ndim == 4:  # a tower that returns a [B, H, F, T] map: tokens in frequency-major order
            hidden = hidden.flatten(2).transpose(1, 2)
        return self.proj(hidden)

    def to_frames(self, tokens: Tensor) -> Tensor:
        """One token per time step: AST's frequency rows averaged; the other towers' tokens are frames already.

        Example:
            >>> from transformers import ASTConfig
            >>> config = ASTConfig(hidden_size=8, num_hidden_layers=1, num_attention_heads=2, intermediate_size=8,
            ...                    num_mel_bins=32, max_length=40).to_dict()
            >>> encoder = HFAudioEncoder(config, {"num_mel_bins": 32, "max_length": 40}, dim=8)
            >>> encoder.to_frames(torch.zeros(2, 6, 8)).shape
            torch.Size([2, 3, 8])
        """
        if self.freq_rows <= 1:
            return tokens
        return tokens.unflatten(1, (self.freq_rows, -1)).mean(dim=1)

    def set_grad_checkpointing(self, enabled: bool = True) -> None:
        """Hugging Face's per-layer checkpointing (non-reentrant) on the tower.

        Example:
            >>> from transformers import ASTConfig
            >>> config = ASTConfig(hidden_size=8, num_hidden_layers=1, num_attention_heads=2, intermediate_size=8,
            ...                    num_mel_bins=32, max_length=40).to_dict()
            >>> encoder = HFAudioEncoder(config, {"num_mel_bins": 32, "max_length": 40}, dim=8)
            >>> encoder.set_grad_checkpointing(True)
            >>> encoder.grad_checkpointing, any(getattr(m, "gradient_checkpointing", False) for m in encoder.modules())
            (True, True)
        """
        super().set_grad_checkpointing(enabled)
        tower = self.tower  # transformers 5 renamed gradient_checkpointing_* to activation_checkpointing_*
        if enabled:
            on = getattr(tower, "activation_checkpointing_enable", None) or tower.gradient_checkpointing_enable
            on({"use_reentrant": False})
        else:
            (getattr(tower, "activation_checkpointing_disable", None) or tower.gradient_checkpointing_disable)()

    def export_settings(self) -> dict[str, Any]:
        """The architecture and front-end as plain values (no paths): ``audio_kwargs`` that rebuild this encoder
        with random weights, over which a model folder loads its ``model.safetensors``.

        Example:
            >>> from transformers import ASTConfig
            >>> config = ASTConfig(hidden_size=8, num_hidden_layers=1, num_attention_heads=2, intermediate_size=8,
            ...                    num_mel_bins=32, max_length=40).to_dict()
            >>> settings = HFAudioEncoder(config, {"num_mel_bins": 32, "max_length": 40}, dim=8).export_settings()
            >>> sorted(settings), settings["hf_config"]["model_type"]
            (['feature_extractor', 'hf_config'], 'audio-spectrogram-transformer')
        """
        return {"hf_config": dict(self.hf_config), "feature_extractor": dict(self.feature_extractor)}

    def preprocessing(self) -> dict[str, Any]:
        """The input settings bound to the weights (``audio_frontend``) and their source (``audio_weights``: the
        model type, the file name and sha256 when loaded; never a path).

        Example:
            >>> from transformers import ASTConfig
            >>> config = ASTConfig(hidden_size=8, num_hidden_layers=1, num_attention_heads=2, intermediate_size=8,
            ...                    num_mel_bins=32, max_length=40).to_dict()
            >>> HFAudioEncoder(config, {"num_mel_bins": 32, "max_length": 40}, dim=8).preprocessing()["audio_frontend"]
            {'kind': 'hf', 'feature': 'kaldi_fbank', 'sample_rate': 16000, 'num_mel_bins': 32, 'max_frames': 40, ...
        """
        found: dict[str, Any] = {"audio_frontend": {"kind": "hf", **self.frontend.settings()}}
        source = self.load_report.source if self.load_report is not None else {}
        found["audio_weights"] = {"kind": "hf", "model_type": self.model_type, **source}
        return found


def _config_object(hf_config: Mapping[str, Any]) -> Any:
    # The architecture from plain values: sss's own table of model types, never a checkpoint's code (auto_map).
    transformers = _transformers()
    values = {k: v for k, v in hf_config.items() if k not in ("auto_map", "_name_or_path")}
    model_type = values.get("model_type")
    if model_type == "clap":  # a whole CLAP checkpoint: its audio tower
        values = {**dict(values.get("audio_config") or {}), "model_type": "clap_audio_model"}
        model_type = "clap_audio_model"
    if model_type not in FAMILIES:
        wrapped = ", ".join(sorted(FAMILIES))
        raise ConfigError(
            f"config.json: model_type {model_type!r} is not one model.audio_encoder=hf wraps ({wrapped}, clap)"
        )
    config = transformers.CONFIG_MAPPING[model_type].from_dict(values)
    if model_type == "clap_audio_model" and getattr(config, "enable_fusion", False):
        raise ConfigError(
            "config.json: enable_fusion=true: a fused CLAP checkpoint takes random crops of long clips (is_longer); "
            "sss wraps unfused CLAP checkpoints only (e.g. clap-htsat-unfused)"
        )
    for key in ("layerdrop", "encoder_layerdrop"):  # DDP needs every parameter every step (speechbrain #2340)
        if hasattr(config, key):
            setattr(config, key, 0.0)
    return config


def _cut_ast_table(config: Any, max_frames: int | None) -> None:
    if max_frames is None:
        return
    if config.model_type != "audio-spectrogram-transformer":
        raise ConfigError(f"model.audio_kwargs.max_frames applies to AST only, not to {config.model_type}: remove it")
    if not 0 < int(max_frames) <= config.max_length:
        raise ConfigError(
            f"model.audio_kwargs.max_frames={max_frames}: the weights' position table holds {config.max_length} frames "
            f"(config.json max_length); sss cuts it but never stretches it (SSAST #11): give 1..{config.max_length}"
        )
    config.max_length = int(max_frames)


def _check_whisper_length(config: Any, frontend: HFFrontend) -> None:
    # Whisper's encoder takes exactly 2 * max_source_positions frames (its conv2 has stride 2): say so at build.
    frames = getattr(frontend, "chunk_samples", 0) // frontend.hop_length
    if config.model_type == "whisper" and frames != 2 * config.max_source_positions:
        raise ConfigError(
            f"preprocessor_config.json chunk_length gives {frames} frames but config.json max_source_positions="
            f"{config.max_source_positions} takes {2 * config.max_source_positions}: are they one checkpoint's files?"
        )


def _freq_rows(config: Any) -> int:
    if config.model_type != "audio-spectrogram-transformer":
        return 1
    return (config.num_mel_bins - config.patch_size) // config.frequency_stride + 1


def _tower_class(model_type: str) -> type:
    import importlib

    module, _, name = f"transformers.{FAMILIES[model_type].model_class}".rpartition(".")
    _transformers()
    return getattr(importlib.import_module(module), name)


def _renamer(tower: nn.Module) -> Any:
    # transformers 5 renames some checkpoint keys on load (AST: encoder.layer.N.attention.attention.key ->
    # layers.N.attention.k_proj) and back on save; apply the same renames, so both spellings load.
    try:
        from transformers.conversion_mapping import get_model_conversion_mapping
        from transformers.core_model_loading import WeightRenaming, apply_renamings
    except ImportError:  # transformers 4: checkpoint keys are the module names
        return lambda key: key
    renames = [t for t in get_model_conversion_mapping(tower) if isinstance(t, WeightRenaming)]
    return lambda key: apply_renamings(key, renames) if renames else key


def _transformers() -> Any:
    try:
        import transformers
    except ImportError as exc:
        raise ConfigError(
            f"model.audio_encoder=hf needs the hf extra (transformers is not installed): {EXTRA}"
        ) from exc
    return transformers


def plain_config(values: Mapping[str, Any]) -> dict[str, Any]:
    """`values` without the keys and values that name files (``_name_or_path``, ``*_dir``, absolute paths, URLs), so a
    model folder's ``config.yaml`` may hold it (its loader refuses any value that names a file).

    Example:
        >>> plain_config({"_name_or_path": "/home/me/ast", "hidden_size": 8, "sub": {"cache_dir": "x", "n": 1}})
        {'hidden_size': 8, 'sub': {'n': 1}}
    """
    kept: dict[str, Any] = {}
    for key, value in values.items():
        name = str(key)
        if name in _DROPPED_CONFIG or "pretrained" in name or name.rsplit("_", 1)[-1].lower() in _FILE_WORDS:
            continue
        if isinstance(value, Mapping):
            value = plain_config(value)
        elif isinstance(value, str) and (value.startswith(("/", "~", "\\")) or "://" in value or ":\\" in value):
            continue
        kept[name] = value
    return kept


def read_hf_folder(pretrained: str | os.PathLike[str]) -> tuple[Path, dict[str, Any], dict[str, Any]]:
    """The folder `pretrained` names (a local folder, or a model id already in the local Hugging Face cache), its
    ``config.json`` and its ``preprocessor_config.json`` (``{}`` when it has none: the class defaults apply).

    Raises:
        ConfigError: No such folder or cached model, or no ``config.json``; one line naming ``model.audio_pretrained``.

    Example:
        >>> read_hf_folder("/no/such/dir")
        Traceback (most recent call last):
        ...
        sss.config.errors.ConfigError: model.audio_pretrained=/no/such/dir: no such folder...
    """
    folder = _resolve(pretrained)
    config_file = folder / "config.json"
    if not config_file.is_file():
        raise ConfigError(
            f"model.audio_pretrained={pretrained}: {folder} has no config.json: give a folder written by "
            "save_pretrained (config.json, model.safetensors, preprocessor_config.json)"
        )
    extractor_file = folder / "preprocessor_config.json"
    try:
        config = json.loads(config_file.read_text())
        extractor = json.loads(extractor_file.read_text()) if extractor_file.is_file() else {}
    except (OSError, ValueError) as exc:
        raise ConfigError(f"model.audio_pretrained={pretrained}: cannot read its JSON files ({exc})") from exc
    return folder, config, extractor


def _resolve(pretrained: str | os.PathLike[str]) -> Path:
    path = Path(pretrained).expanduser()
    if path.is_dir():
        return path
    text = str(pretrained)
    if text.count("/") == 1 and not text.startswith((".", "/", "~")):  # ORG/NAME: the local cache only
        try:
            from huggingface_hub import snapshot_download

            return Path(snapshot_download(text, local_files_only=True))
        except Exception:  # not cached (or no hub client): said below, nothing is downloaded
            pass
    raise ConfigError(
        f"model.audio_pretrained={pretrained}: no such folder, nor a model in the local Hugging Face cache "
        "(sss downloads nothing): give a folder with config.json and model.safetensors (hf download ORG/NAME "
        "--local-dir DIR)"
    )


def load_hf_weights(encoder: HFAudioEncoder, folder: str | os.PathLike[str], strict: bool = True) -> LoadReport:
    """Load the folder's safetensors weights into `encoder`'s tower; return the report (also ``encoder.load_report``).

    A checkpoint of a bigger model (a classifier, ``WhisperModel``, ``ClapModel``) is read from its tower's prefix;
    its other parts are reported ``unused``. AST's position table is cut to the encoder's table (``resized``).

    Raises:
        ConfigError: No ``model.safetensors`` (a pickle is never read), or, with `strict`, a tensor of the tower
            the file does not fill (the message names the first few and ``model.audio_strict=false``).

    Example:
        >>> import tempfile
        >>> from transformers import ASTConfig
        >>> config = ASTConfig(hidden_size=8, num_hidden_layers=1, num_attention_heads=2, intermediate_size=8,
        ...                    num_mel_bins=32, max_length=40)
        >>> folder = tempfile.mkdtemp()
        >>> _tower_class(config.model_type)(config).save_pretrained(folder)
        >>> encoder = HFAudioEncoder(config.to_dict(), {"num_mel_bins": 32, "max_length": 40}, dim=8)
        >>> load_hf_weights(encoder, folder).summary()
        'audio hf (audio-spectrogram-transformer) from model.safetensors: 23 tensors loaded, 0 missing, 0 unexpected'
    """
    files = _weight_files(Path(folder))
    state: dict[str, Tensor] = {}
    for file in files:
        state.update(_read_safetensors(file))
    source = {"file": files[0].name if len(files) == 1 else f"{len(files)} shards", "sha256": _sha256(files)}
    report = LoadReport(f"audio hf ({encoder.model_type})", {"model_type": encoder.model_type, **source})
    own = encoder.tower.state_dict()
    fits = _match(encoder, state, own, report)
    report.missing = sorted(k for k in own if k not in fits)
    if strict and report.missing:
        raise ConfigError(_partial_message(folder, encoder.model_type, report, len(own)))
    encoder.tower.load_state_dict(fits, strict=False)
    encoder.load_report = report
    _LOG.info("%s", report.summary())
    return report


def _match(
    encoder: HFAudioEncoder, state: Mapping[str, Tensor], own: Mapping[str, Tensor], report: LoadReport
) -> dict[str, Tensor]:
    family, fits, rename = FAMILIES[encoder.model_type], {}, _renamer(encoder.tower)
    for key, value in state.items():
        if key.startswith(family.unused):
            report.unused.append(key)
            continue
        name = rename(next((key.removeprefix(p) for p in family.prefixes if key.startswith(p)), key))
        if name not in own:
            report.unexpected.append(key)
        elif value.shape == own[name].shape:
            fits[name] = value
        elif name == "embeddings.position_embeddings" and _cut_table(value, own[name], encoder.freq_rows) is not None:
            fits[name] = _cut_table(value, own[name], encoder.freq_rows)
            report.resized.append(f"{name} {tuple(value.shape)} -> {tuple(own[name].shape)} (time columns cut)")
        else:
            report.unexpected.append(f"{key} {tuple(value.shape)} (the encoder's is {tuple(own[name].shape)})")
    report.loaded = sorted(fits)
    return fits


def _cut_table(table: Tensor, target: Tensor, rows: int) -> Tensor | None:
    # AST's table is [1, 2 + F' * T', H], frequency-major: keep the first T'' time columns of every row.
    tokens, wanted = table.shape[1] - 2, target.shape[1] - 2
    if not rows or tokens % rows or wanted % rows or wanted > tokens or table.shape[2] != target.shape[2]:
        return None
    grid = table[:, 2:].unflatten(1, (rows, tokens // rows))[:, :, : wanted // rows]
    return torch.cat([table[:, :2], grid.flatten(1, 2)], dim=1)


def _weight_files(folder: Path) -> list[Path]:
    if (folder / "model.safetensors").is_file():
        return [folder / "model.safetensors"]
    index = folder / "model.safetensors.index.json"
    if index.is_file():
        shards = sorted(set(json.loads(index.read_text())["weight_map"].values()))
        return [folder / Path(name).name for name in shards]  # a shard name is a file of this folder, nothing else
    if any((folder / name).is_file() for name in ("pytorch_model.bin", "model.pt", "model.pth")):
        raise ConfigError(
            f"model.audio_pretrained={folder} holds a pickle (pytorch_model.bin) but no model.safetensors: sss reads "
            "safetensors only (a pickle can run code): re-save it with save_pretrained(DIR, safe_serialization=True)"
        )
    raise ConfigError(
        f"model.audio_pretrained={folder} has no model.safetensors: give a folder written by save_pretrained"
    )


def _read_safetensors(file: Path) -> dict[str, Tensor]:
    from safetensors import SafetensorError
    from safetensors.torch import load_file

    try:
        return load_file(str(file))
    except (SafetensorError, OSError) as exc:
        raise ConfigError(f"model.audio_pretrained: {file} is not a readable safetensors file ({exc})") from exc


def _sha256(files: list[Path]) -> str:
    digest = hashlib.sha256()
    for file in files:
        with file.open("rb") as handle:
            for block in iter(lambda: handle.read(1 << 20), b""):
                digest.update(block)
    return digest.hexdigest()


def _partial_message(folder: Any, model_type: str, report: LoadReport, total: int) -> str:
    unexpected = f", {len(report.unexpected)} unexpected (e.g. {', '.join(report.unexpected[:3])})"
    return (
        f"model.audio_pretrained={folder} fits the hf ({model_type}) encoder only in part: {len(report.loaded)} of "
        f"{total} tensors loaded, {len(report.missing)} missing (e.g. {', '.join(report.missing[:3])})"
        f"{unexpected if report.unexpected else ''}: another architecture? model.audio_strict=false trains the "
        "missing ones from scratch"
    )


@register_encoder("audio", "hf")
def hf_encoder(settings: EncoderSettings) -> HFAudioEncoder:
    """``model.audio_encoder=hf``: `HFAudioEncoder` from ``model.audio_pretrained`` (weights loaded, checked), or from
    ``model.audio_kwargs.hf_config`` alone (random weights: how a model folder rebuilds it before its own weights).

    ``model.sample_rate`` must be the rate the weights were trained on (``preprocessor_config.json``
    ``sampling_rate``): sss resamples audio files once when it decodes them (``data.sample_rate``), which is
    cheaper than resampling every batch on the device, so a different rate is an error, not a silent resample.

    Example:
        >>> from transformers import ASTConfig
        >>> config = ASTConfig(hidden_size=8, num_hidden_layers=1, num_attention_heads=2, intermediate_size=8,
        ...                    num_mel_bins=32, max_length=40).to_dict()
        >>> kwargs = {"hf_config": config, "feature_extractor": {"num_mel_bins": 32, "max_length": 40}}
        >>> hf_encoder(EncoderSettings(dim=8, kwargs=kwargs)).output_dim
        8
    """
    kwargs = dict(settings.kwargs)
    unknown = sorted(set(kwargs) - set(KWARGS))
    if unknown:
        raise ConfigError(f"model.audio_kwargs: {unknown} unknown for audio_encoder=hf; it takes {', '.join(KWARGS)}")
    folder, config, extractor = None, kwargs.get("hf_config"), kwargs.get("feature_extractor") or {}
    if settings.pretrained:
        folder, config, extractor = read_hf_folder(settings.pretrained)
    if not config:
        raise ConfigError(_NEEDS_FOLDER)
    encoder = HFAudioEncoder(config, extractor, settings.dim, max_frames=kwargs.get("max_frames"))
    if encoder.frontend.sample_rate != settings.sample_rate:
        raise ConfigError(_rate_message(settings.sample_rate, encoder.frontend.sample_rate))
    if folder is not None:
        load_hf_weights(encoder, folder, settings.strict)
    return encoder


_NEEDS_FOLDER = (
    "model.audio_encoder=hf needs model.audio_pretrained=DIR: a folder with config.json and model.safetensors "
    "(save_pretrained, or hf download ORG/NAME --local-dir DIR)"
)


def _rate_message(rate: Any, want: Any) -> str:
    return (
        f"model.sample_rate={rate} but the hf weights were trained on {want} Hz audio (preprocessor_config.json "
        f"sampling_rate): set model.sample_rate={want} data.sample_rate={want} (files are resampled on load)"
    )


def hf_setting_problems(settings: Mapping[str, Any]) -> list[tuple[str, str]]:
    """What ``sss check`` refuses for ``model.audio_encoder=hf``, reading only the folder's JSON files.

    Example:
        >>> hf_setting_problems({"audio_encoder": "hf"})[0][1][:60]
        'model.audio_encoder=hf needs model.audio_pretrained=DIR: a f'
        >>> hf_setting_problems({"audio_encoder": "cnn"})
        []
    """
    if settings.get("audio_encoder") != "hf" or "audio" not in settings.get("modalities", ("image", "audio")):
        return []
    pretrained, kwargs = settings.get("audio_pretrained"), settings.get("audio_kwargs") or {}
    if not pretrained:
        return [] if kwargs.get("hf_config") else [("audio_pretrained", _NEEDS_FOLDER)]
    try:
        _, config, extractor = read_hf_folder(pretrained)
    except ConfigError as exc:
        return [("audio_pretrained", str(exc))]
    model_type = "clap_audio_model" if config.get("model_type") == "clap" else config.get("model_type")
    if model_type not in FAMILIES:
        return [("audio_pretrained", f"model.audio_pretrained={pretrained}: model_type {model_type!r} is not wrapped")]
    want, rate = frontend_for(model_type, extractor).sample_rate, settings.get("sample_rate", 16000)
    return [] if want == rate else [("sample_rate", _rate_message(rate, want))]
