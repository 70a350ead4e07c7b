"""`TimmImageEncoder`: any timm backbone as an image token encoder."""

from __future__ import annotations

import difflib
import json
import os
from pathlib import Path
from typing import Any

import timm
import torch
from torch import Tensor, nn
from torch.utils.checkpoint import checkpoint

from sss.models.base import TokenEncoder
from sss.models.registry import EncoderSettings, register_encoder

__all__ = ["TimmImageEncoder", "bound_preprocessing", "timm_encoder"]


class TimmImageEncoder(TokenEncoder):
    """A timm backbone whose last feature map (or ViT token sequence) becomes the image tokens.

    The model is built with ``num_classes=0, global_pool=""`` so `timm`'s ``forward_features``
    returns the unpooled features: a CNN map ``[B, C, h, w]`` is flattened to ``h * w`` tokens,
    a transformer's ``[B, N, C]`` sequence is kept as it is. A linear layer projects ``C`` to ``dim``.

    Args:
        name: A timm model name (``timm.list_models()``), e.g. ``"resnet10t"`` or ``"test_resnet"``.
        dim: Token width after the projection; None keeps the backbone width (no projection).
        pretrained: False for random init; a path to a local ``.safetensors`` (or ``.pth``) file of
            the timm model's weights; True to download timm's default weights (needs network).
        channels_last: Run the backbone in channels-last memory format (often ~1.5-2x faster for
            small CNNs on CPU with oneDNN, and for AMP on GPU).
        model_kwargs: Extra keyword arguments for ``timm.create_model`` (e.g. ``{"channels":
            [16, 32, 64, 128], "stem_width": 16}`` for a narrow ResNet, ``{"drop_path_rate": 0.1}``).
        strict: Refuse a local weights file that fills fewer than all of the backbone's tensors
            (``model.image_strict``); False loads what fits and reports the rest as missing.
        checkpointing: What `set_grad_checkpointing` recomputes. ``"backbone"``: the whole
            ``forward_features`` as one segment (only the image is kept; one extra forward in
            backward). Small CNNs keep most of their activations in the stem, which timm's own
            checkpointing leaves out, so this is the one that saves memory for them. ``"stages"``:
            timm's per-stage checkpointing; for deep backbones at high resolution, where recomputing
            the whole backbone at once would hold all its activations again.

    Raises:
        ValueError: Unknown timm model name.
        FileNotFoundError: ``pretrained`` is a path that does not exist.
        RuntimeError: Pretrained weights could not be loaded (offline, or a file that does not fit).

    With weights (``pretrained`` True or a file) the input preparation they were trained with is bound to
    them: `preprocessing` returns timm's pretrained config of the weights (mean, std, interpolation, input
    size), which the data side decodes with. A local file's config is the ``pretrained_cfg`` block of a
    ``config.json`` beside it (timm's Hugging Face Hub layout) when there is one, else timm's default
    config for ``name``; the load line printed at build time says which.

    Example:
        >>> import torch
        >>> enc = TimmImageEncoder("test_resnet", dim=16)
        >>> enc(torch.randn(2, 3, 64, 64)).shape  # a 2 x 2 map at stride 32 -> 4 tokens
        torch.Size([2, 4, 16])
        >>> enc.output_dim
        16
    """

    def __init__(
        self,
        name: str = "resnet10t",
        *,
        dim: int | None = 128,
        pretrained: bool | str | os.PathLike[str] = False,
        channels_last: bool = False,
        model_kwargs: dict[str, Any] | None = None,
        checkpointing: str = "backbone",
        strict: bool = True,
    ) -> None:
        if checkpointing not in ("backbone", "stages"):
            raise ValueError(f"checkpointing must be 'backbone' or 'stages', got {checkpointing!r}")
        kwargs = {"num_classes": 0, "global_pool": "", **(model_kwargs or {})}
        model, self._preprocessing = _create_timm(name, pretrained, kwargs, strict)
        width = int(model.num_features)
        super().__init__(output_dim=dim if dim is not None else width)
        self.name = name
        self.channels_last = channels_last
        self.checkpointing = checkpointing
        # Some timm families (e.g. Swin) return NHWC maps; everything else is NCHW.
        self._nhwc = getattr(model, "output_fmt", "NCHW") == "NHWC"
        self.model = model.to(memory_format=torch.channels_last) if channels_last else model
        self.proj: nn.Module = nn.Linear(width, dim) if dim is not None else nn.Identity()
        # ViTs put CLS/register tokens first; `to_grid` drops them to lay the patches out again.
        self.num_prefix_tokens = int(getattr(model, "num_prefix_tokens", 0))
        self.grid: tuple[int, int] | None = None
        """The ``(h, w)`` token grid of the last `encode` call (it depends on the image size)."""
        if isinstance(self.proj, nn.Linear):
            nn.init.xavier_uniform_(self.proj.weight)
            nn.init.zeros_(self.proj.bias)

    def preprocessing(self) -> dict[str, Any]:
        """The input preparation bound to the loaded weights; ``{}`` for random init (the data's defaults apply).

        Keys: ``image_mean`` / ``image_std`` (of [0, 1] pixels), ``image_interpolation`` (the resize filter),
        ``image_input_size`` (``[C, H, W]`` the weights were trained at), ``image_weights`` (``timm:NAME.TAG``,
        never a path) and, for a backbone that takes one fixed size only (a ViT with a fixed position table),
        ``image_size``, which the data's ``data.image_size`` must equal.

        Example:
            >>> TimmImageEncoder("test_resnet", dim=8).preprocessing()
            {}
        """
        return dict(self._preprocessing)

    def encode(self, x: Tensor) -> Tensor:
        """Image ``[B, 3, H, W]`` to tokens ``[B, N, output_dim]``.

        Args:
            x: Normalised RGB batch.

        Returns:
            ``N = h * w`` tokens for a CNN (the final feature map), the model's tokens for a ViT.

        Example:
            >>> import torch
            >>> TimmImageEncoder("test_vit", dim=8).encode(torch.randn(1, 3, 64, 64)).shape  # 16 patches + CLS
            torch.Size([1, 17, 8])
        """
        if self.channels_last:
            x = x.contiguous(memory_format=torch.channels_last)
        if self.grad_checkpointing and self.checkpointing == "backbone" and torch.is_grad_enabled():
            feats = checkpoint(self.model.forward_features, x, use_reentrant=False)
        else:
            feats = self.model.forward_features(x)
        if feats.ndim == 4:
            self.grid = tuple(feats.shape[1:3]) if self._nhwc else tuple(feats.shape[2:4])
            feats = feats.flatten(1, 2) if self._nhwc else feats.flatten(2).transpose(1, 2)
        elif feats.ndim == 3:
            self.grid = self._patch_grid(x.shape[-2:], feats.shape[1] - self.num_prefix_tokens)
        else:
            raise RuntimeError(f"timm model {self.name!r} returned features of shape {tuple(feats.shape)}")
        return self.proj(feats)

    def to_grid(self, tokens: Tensor) -> Tensor:
        """Tokens of the last `encode` call (possibly updated by a fusion) as a map ``[B, D, h, w]``.

        A pixel-level head (the shadow mask) reads this. Prefix tokens (a ViT's CLS) are dropped.

        Args:
            tokens: ``[B, N, D]`` in `encode`'s layout.

        Returns:
            ``[B, D, h, w]``.

        Raises:
            RuntimeError: No grid is known (`encode` not called yet, or patches that do not tile a grid).

        Example:
            >>> import torch
            >>> enc = TimmImageEncoder("test_vit", dim=8)
            >>> enc.to_grid(enc(torch.randn(2, 3, 64, 96))).shape  # 4 x 6 patches of 16 px, CLS dropped
            torch.Size([2, 8, 4, 6])
        """
        if self.grid is None:
            raise RuntimeError(f"{self.name}: no token grid known; call encode() first (or the tokens do not tile)")
        patches = tokens[:, self.num_prefix_tokens :]
        if patches.shape[1] != self.grid[0] * self.grid[1]:
            raise RuntimeError(f"{patches.shape[1]} tokens do not fit the last encoded grid {self.grid}")
        return patches.transpose(1, 2).unflatten(2, self.grid)

    def _patch_grid(self, image_hw: torch.Size, patches: int) -> tuple[int, int] | None:
        embed = getattr(self.model, "patch_embed", None)
        size = getattr(embed, "patch_size", None)
        if size is not None:
            # timm's PatchEmbed (static or dynamic size) floors H / patch and W / patch.
            hw = (image_hw[0] // size[0], image_hw[1] // size[1])
            if hw[0] * hw[1] == patches:
                return hw
        side = round(patches**0.5)
        return (side, side) if side * side == patches else None

    def set_grad_checkpointing(self, enabled: bool = True) -> None:
        """Turn activation checkpointing of the backbone on or off (as chosen by ``checkpointing``).

        Args:
            enabled: Turn checkpointing on (True) or off (False).

        Example:
            >>> encoder = TimmImageEncoder("test_resnet", dim=8, checkpointing="stages")
            >>> encoder.set_grad_checkpointing()
            >>> encoder.model.grad_checkpointing  # timm's own, per stage
            True
        """
        super().set_grad_checkpointing(enabled)
        self.model.set_grad_checkpointing(enabled and self.checkpointing == "stages")


def _create_timm(
    name: str, pretrained: bool | str | os.PathLike[str], kwargs: dict[str, Any], strict: bool = True
) -> tuple[nn.Module, dict[str, Any]]:
    """The timm model and the preprocessing its weights are bound to (``{}`` for random init)."""
    if not timm.is_model(name):
        close = difflib.get_close_matches(name, timm.list_models(), n=3)
        hint = f" Did you mean {', '.join(close)}?" if close else ""
        raise ValueError(f"unknown timm model {name!r}.{hint} See timm.list_models() for the names.")
    if pretrained is False or pretrained is None or pretrained == "":
        return timm.create_model(name, pretrained=False, **kwargs), {}
    if pretrained is True:
        try:
            model = timm.create_model(name, pretrained=True, **kwargs)
        except Exception as err:  # hub/URL errors come in many types (OSError, HTTP, offline-mode...)
            raise RuntimeError(
                f"could not download pretrained weights for timm model {name!r} ({type(err).__name__}: {err}). "
                "Without network access, pass a local .safetensors path instead of True "
                "(e.g. image_pretrained: /path/to/model.safetensors in YAML) or pretrained=false for random init."
            ) from err
        prep = bound_preprocessing(model, dict(model.pretrained_cfg))
        _say(f"image encoder timm {name!r}: timm's pretrained weights; preprocessing from their config: {_shown(prep)}")
        return model, prep
    path = Path(pretrained).expanduser()
    if not path.is_file():
        raise FileNotFoundError(f"pretrained weights file not found: {str(path)!r} (timm model {name!r})")
    try:
        # Through timm's pretrained machinery, so its per-model filters (e.g. ViT position-embedding
        # resizing) and classifier dropping apply exactly as for downloaded weights.
        model = timm.create_model(name, pretrained=True, pretrained_cfg_overlay={"file": str(path)}, **kwargs)
    except Exception as err:
        raise RuntimeError(f"could not load {str(path)!r} into timm model {name!r}: {err}") from err
    report = _load_report(model, path, name, strict)
    cfg, source = _file_config(model, path, name)
    prep = bound_preprocessing(model, cfg)
    _say(f"image encoder timm {name!r} from {path.name}: {report}; preprocessing from {source}: {_shown(prep)}")
    return model, prep


def _load_report(model: nn.Module, path: Path, name: str, strict: bool) -> str:
    """Compare the file's tensors with the model's: loaded / missing / unexpected / resized (timm's filters)."""
    # timm loads non-strictly once the classifier is dropped, so a file of another architecture
    # would load *nothing* without a word: every backbone tensor must be in the file unless the
    # user said model.image_strict=false, and a file that fills none is refused even then.
    found = _weights_only(timm.models.load_state_dict(str(path)))
    own = _weights_only(model.state_dict())
    missing = [key for key in own if key not in found]
    unexpected = [key for key in found if key not in own]
    resized = [key for key in own if key in found and tuple(found[key].shape) != tuple(own[key].shape)]
    loaded = len(own) - len(missing)
    if missing and (strict or loaded == 0):
        hint = " (model.image_strict=false accepts a partial load)" if loaded and strict else ""
        raise RuntimeError(
            f"{str(path)!r} does not fit timm model {name!r}: {len(missing)} of the model's {len(own)} tensors are "
            f"missing from it (e.g. {', '.join(missing[:3])}){hint}. Was it saved from another architecture or "
            "other model_kwargs?"
        )
    report = f"{loaded} of {len(own)} tensors loaded, {len(missing)} missing, {len(unexpected)} unexpected"
    report += f" (e.g. {', '.join(unexpected[:2])})" if unexpected else ""
    report += f", {len(resized)} resized by timm ({', '.join(resized[:3])})" if resized else ", 0 resized"
    return report + (f"; missing, left at random init: {', '.join(missing[:3])}" if missing else "")


def _weights_only(state: dict[str, Any]) -> dict[str, Any]:
    return {k: v for k, v in state.items() if not k.endswith("num_batches_tracked")}  # BN step counters


def _file_config(model: nn.Module, path: Path, name: str) -> tuple[dict[str, Any], str]:
    """A local file's pretrained config: a ``config.json`` beside it with a ``pretrained_cfg`` block wins over
    timm's default config for ``name`` (the Hub's timm layout writes exactly that file next to the weights)."""
    beside = path.parent / "config.json"
    default = dict(model.pretrained_cfg)
    if not beside.is_file():
        return default, f"timm's default config for {name!r} (no config.json beside the weights)"
    try:
        data = json.loads(beside.read_text(encoding="utf-8"))
    except (ValueError, OSError) as err:
        raise RuntimeError(f"{beside}: not readable JSON ({err}); fix it or remove it to use timm's defaults") from None
    block = data.get("pretrained_cfg") if isinstance(data, dict) else None
    if not isinstance(block, dict):
        return default, f"timm's default config for {name!r} (config.json beside the weights has no pretrained_cfg)"
    arch = data.get("architecture")
    return {**default, **block, "architecture": arch or name}, "config.json beside the weights"


def bound_preprocessing(model: nn.Module, cfg: dict[str, Any]) -> dict[str, Any]:
    """The ``preprocessing()`` keys of a timm model with loaded weights, from their pretrained config `cfg`.

    Example:
        >>> model = timm.create_model("test_resnet", num_classes=0)
        >>> prep = bound_preprocessing(model, dict(model.pretrained_cfg))
        >>> prep["image_mean"], prep["image_interpolation"], prep["image_weights"]
        ([0.5, 0.5, 0.5], 'bilinear', 'timm:test_resnet.r160_in1k')
    """
    resolved = timm.data.resolve_data_config(pretrained_cfg=cfg)
    mean, std = (list(map(float, resolved[k])) for k in ("mean", "std"))
    tag = cfg.get("tag")
    prep: dict[str, Any] = {
        "image_mean": mean * 3 if len(mean) == 1 else mean,  # a one-value config (grey models) is per channel
        "image_std": std * 3 if len(std) == 1 else std,
        "image_interpolation": str(resolved.get("interpolation") or "bilinear"),
        "image_input_size": [int(v) for v in resolved["input_size"]],
        "image_weights": f"timm:{cfg.get('architecture')}" + (f".{tag}" if tag else ""),
    }
    fixed = _fixed_size(model)
    if fixed is not None:
        prep["image_size"] = fixed
    return prep


def _fixed_size(model: nn.Module) -> int | list[int] | None:
    # A ViT built with strict_img_size and no dynamic_img_size refuses any other input size (its
    # position table has one grid): the data must decode to exactly this size.
    embed = getattr(model, "patch_embed", None)
    size = getattr(embed, "img_size", None)
    if size is None or not getattr(embed, "strict_img_size", False) or getattr(model, "dynamic_img_size", False):
        return None
    h, w = int(size[0]), int(size[1])
    return h if h == w else [h, w]


def _shown(prep: dict[str, Any]) -> str:
    size = prep.get("image_size")
    fixed = f", fixed input size {size}" if size is not None else ""
    return (
        f"mean {prep['image_mean']}, std {prep['image_std']}, interpolation {prep['image_interpolation']}"
        f", trained at {'x'.join(map(str, prep['image_input_size'][1:]))}{fixed}"
    )


def _say(line: str) -> None:
    if int(os.environ.get("RANK", "0")) == 0:  # every process builds the model; one line is enough
        print(f"sss: {line}", flush=True)


@register_encoder("image", "timm")
def timm_encoder(settings: EncoderSettings) -> TimmImageEncoder:
    """The image encoder: a `TimmImageEncoder` of the timm model ``backbone`` (``model.image_encoder``).

    Example:
        >>> timm_encoder(EncoderSettings(dim=8, backbone="test_resnet")).output_dim
        8
    """
    return TimmImageEncoder(
        settings.backbone,
        dim=settings.dim,
        pretrained=settings.pretrained,
        channels_last=settings.channels_last,
        model_kwargs=dict(settings.kwargs),
        checkpointing=settings.checkpointing,
        strict=settings.strict,
    )
