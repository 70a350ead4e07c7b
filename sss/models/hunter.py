"""`HunterModule`: the Shadow & Sound Hunter family (timm image encoder, audio CNN or AST, fusion, task heads)."""

from __future__ import annotations

import copy
import difflib
import inspect
import os
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor

from sss.config.constraints import NonNegativeInt, PositiveFloat, PositiveInt, UnitFloat
from sss.data.presence import PRESENT_KEYS, presence
from sss.metrics.task import task_outputs
from sss.models import _hunter_parts as parts
from sss.models._hunter_checks import LOSS_KEYS, MIN_SAMPLE_RATE, setting_problems
from sss.models.base import TokenEncoder
from sss.models.fusion.base import FusionHead
from sss.models.heads import EventHead, MaskHead, resample_events, resize_mask
from sss.models.missing import (
    UnimodalHeads,
    dense_loss,
    drop_present,
    dropout_rates,
    encode_present,
    head_losses,
    head_outputs,
)
from sss.models.registry import build_encoder, register_model
from sss.trainer.module import LitModule

__all__ = [
    "LOSS_KEYS",
    "MIN_SAMPLE_RATE",
    "VARIANTS",
    "HunterModule",
    "hunter_base",
    "hunter_small",
    "hunter_tiny",
]


class HunterModule(LitModule):
    """Image + audio model: `TimmImageEncoder`, an audio encoder over `LogMelFrontend`, a fusion, task heads.

    ``forward(batch)`` encodes ``batch["image"]`` and ``batch["audio"]`` (either may be absent) to tokens
    of width ``dim``, fuses them, and returns a dict of outputs:

    - ``"logits"`` ``[B, num_classes]``: clip logits, always (softmax for ``"label"``, sigmoid for ``"labels"``);
    - ``"events"`` ``[B, T', num_event_classes]``: frame-level sound-event logits, with ``num_event_classes > 0``
      and audio in the batch (``T'`` = the audio encoder's frames);
    - ``"mask"`` ``[B, 1, h, w]``: shadow-mask logits, with ``mask_head=True`` and an image in the batch.

    `compute_loss` is a weighted sum over the targets the batch holds (see there). Build it by name
    with ``create_model("hunter_small")``.

    Args:
        num_classes: Number of clip classes (logits).
        image_encoder: timm model name of the image backbone.
        image_pretrained: False, True (download timm's weights) or a local ``.safetensors`` path.
        image_channels_last: Run the image backbone in channels-last memory format (faster on CPU).
        image_kwargs: Extra ``timm.create_model`` arguments, e.g. ``{"channels": [16, 32, 64, 128]}``.
        image_checkpointing: What gradient checkpointing recomputes on the image side: ``"backbone"``
            (the whole backbone as one segment, for small CNNs) or ``"stages"`` (timm's per-stage).
        dim: Token width shared by both encoders, the fusion and the heads.
        audio_encoder: ``"cnn"`` (`AudioCNN`), ``"ast"`` (`AudioSpectrogramTransformer`), ``"hf"`` (`HFAudioEncoder`:
            a Hugging Face AST, wav2vec2/HuBERT/WavLM, Whisper encoder or CLAP audio tower over its own front-end)
            or another name registered with `sss.models.registry.register_encoder`.
        audio_width: Channels of the first CNN block (doubled per block); the AST's width is ``dim``.
        audio_depth: CNN blocks (each halves time and frequency), or AST transformer blocks.
        audio_stem_stride: Stride of the first CNN convolution (2 = cheaper, coarser); CNN only.
        audio_kwargs: Extra arguments of the audio encoder class, e.g. ``{"patch_stride": [10, 10]}`` for the AST;
            for ``"hf"``: ``max_frames`` (AST), and ``hf_config``/``feature_extractor`` (filled by ``sss fit``).
        audio_pretrained: Pretrained audio weights: a local Hugging Face model folder for ``audio_encoder="hf"``,
            a ``.safetensors`` file for the PANNs CNNs (``sss convert panns``); None for random init.
        audio_strict: Refuse audio weights that fill fewer than all of the encoder's tensors (False: load what
            fits and report the rest).
        image_strict: The same for ``image_pretrained``.
        n_mels: Mel bins of the audio front-end.
        sample_rate: Sample rate of ``batch["audio"]`` in Hz.
        freq_mask: Largest SpecAugment frequency mask in mel bins (training only; 0 disables).
        time_mask: Largest SpecAugment time mask in 10 ms frames (training only; 0 disables).
        fusion: ``"cross_attention"`` (`CrossModalFusion`), ``"bottleneck"`` (`BottleneckFusion`),
            ``"late"`` (`LateFusion`) or another name registered with `sss.models.registry.register_fusion`.
        fusion_depth: Fusion layers (ignored by ``"late"``).
        heads: Attention heads of the fusion and the AST (must divide ``dim``).
        mlp_ratio: Hidden width of the fusion and AST MLPs as a multiple of ``dim``.
        dropout: Dropout in the fusion (and the AST).
        num_bottlenecks: Shared bottleneck tokens of ``fusion="bottleneck"`` (of any fusion that takes them).
        fusion_kwargs: The fusion's own extra arguments, e.g. ``{"hidden": 64}`` for ``"late"``.
        label_smoothing: Label smoothing of the cross-entropy loss.
        num_event_classes: Classes of the frame-level sound-event head; 0 builds no event head.
        mask_head: Build the shadow-mask head on the image tokens.
        mask_upsample: Mask pixels per image token along each side.
        modality_dropout: In training, the probability that a sample's image is marked absent, and
            (separately, never both) that its audio is: a number for both, or ``{"image": p, "audio": q}``
            with ``p + q <= 1``; 0 disables. An absent modality reads as the learned missing embedding
            (`sss.models.missing`), as a sample without it in the data does.
        unimodal_heads: Add a classifier per modality on its encoder's pooled tokens (outputs
            ``logits_image``/``logits_audio``, losses ``image_head``/``audio_head``, metrics ``image_head/...``).
        loss_weights: Weights of the losses by key (``label``, ``labels``, ``events``, ``mask``, and
            ``image_head``/``audio_head`` of the unimodal heads); unnamed keys weigh 1.
        modalities: The encoders to build: ``("image", "audio")``, or one of them for data with one
            modality (an encoder that never sees data would get no gradient). ``sss fit`` sets it from
            the datamodule's ``modalities``.
        metrics: Evaluation metrics to keep, by name with ``*`` wildcards (``["accuracy*", "event_f1"]``);
            None keeps the task's defaults (docs/metrics.md).
        grad_checkpointing: Recompute activations in the backward pass (every branch, as
            `set_grad_checkpointing`): less activation memory for a second forward pass. From YAML or the CLI:
            ``model.grad_checkpointing=true``.

    Raises:
        ValueError: An unknown fusion or audio encoder name, ``heads`` not dividing ``dim``, an
            unknown ``loss_weights`` key or a ``modality_dropout`` outside [0, 1] (or summing over 1).

    Example:
        >>> import torch
        >>> model = HunterModule(num_classes=3, image_encoder="test_resnet", dim=16, audio_width=4, heads=2,
        ...                      num_event_classes=2, mask_head=True)
        >>> batch = {"image": torch.randn(2, 3, 64, 64), "audio": torch.randn(2, 1, 8000)}
        >>> batch["label"] = torch.tensor([0, 2])
        >>> {key: tuple(value.shape) for key, value in model(batch).items()}
        {'logits': (2, 3), 'events': (2, 7, 2), 'mask': (2, 1, 8, 8)}
        >>> model.training_step(batch, 0).shape
        torch.Size([])
    """

    def __init__(
        self,
        num_classes: int = 4,  # >= 1: sss.config.instantiate.KNOWN_ARGS["model"], for every model
        image_encoder: str = "resnet10t",
        image_pretrained: bool | str | os.PathLike[str] = False,
        image_channels_last: bool = False,
        image_kwargs: dict[str, Any] | None = None,
        image_checkpointing: str = "backbone",
        dim: PositiveInt = 128,
        audio_encoder: str = "cnn",
        audio_width: PositiveInt = 32,
        audio_depth: PositiveInt = 3,
        audio_stem_stride: PositiveInt = 1,
        audio_kwargs: dict[str, Any] | None = None,
        audio_pretrained: str | os.PathLike[str] | None = None,
        audio_strict: bool = True,
        image_strict: bool = True,
        n_mels: PositiveInt = 64,
        sample_rate: int = 16000,
        freq_mask: NonNegativeInt = 8,
        time_mask: NonNegativeInt = 10,
        fusion: str = "cross_attention",
        fusion_depth: NonNegativeInt = 1,
        heads: PositiveInt = 4,
        mlp_ratio: PositiveFloat = 4.0,
        dropout: UnitFloat = 0.0,
        num_bottlenecks: NonNegativeInt = 4,
        fusion_kwargs: dict[str, Any] | None = None,
        label_smoothing: UnitFloat = 0.0,
        num_event_classes: NonNegativeInt = 0,
        mask_head: bool = False,
        mask_upsample: PositiveInt = 4,
        modality_dropout: float | Mapping[str, float] = 0.0,
        unimodal_heads: bool = False,
        loss_weights: Mapping[str, float] | None = None,
        modalities: Sequence[str] = ("image", "audio"),
        metrics: Sequence[str] | None = None,
        grad_checkpointing: bool = False,
    ) -> None:
        super().__init__()
        # Every argument by name (the `super()` cell aside): the checks and the builders read what they need.
        settings = {name: value for name, value in locals().items() if name not in ("self", "__class__")}
        problems = self.setting_problems(settings)
        if problems:
            raise ValueError(problems[0][1])
        self.metrics = list(metrics) if metrics is not None else None
        self.num_classes = num_classes
        self.label_smoothing = label_smoothing
        self.modality_dropout = dropout_rates(modality_dropout)
        self.loss_weights = {key: 1.0 for key in LOSS_KEYS} | {k: float(v) for k, v in (loss_weights or {}).items()}
        self.modalities = tuple(m for m in ("image", "audio") if m in modalities)
        self._kwargs = {key: settings[key] for key in ("image_kwargs", "audio_kwargs")}
        self._build_parts(settings)
        if grad_checkpointing:  # a flag on the parts built above: it changes no weight
            self.set_grad_checkpointing(True)

    def _build_parts(self, settings: dict[str, Any]) -> None:
        # Construction order is part of the defaults: the same seed gives the same initial weights
        # as before the heads existed, because they are built last and only on request.
        self.image_encoder: TokenEncoder | None = build_encoder("image", "timm", parts.image_settings(settings))
        self.audio_encoder: TokenEncoder | None = build_encoder(
            "audio", settings["audio_encoder"], parts.audio_settings(settings)
        )
        # Data with one modality (ESC-50, ISTD, ...): the other encoder would never get a gradient.
        # Built, then dropped, so the weights of the parts kept do not depend on `modalities`.
        if "image" not in self.modalities:
            self.image_encoder = None
        if "audio" not in self.modalities:
            self.audio_encoder = None
        self.fusion_head: FusionHead = parts.fusion(settings)
        if len(self.modalities) == 1:
            self.fusion_head.drop_stream(0 if self.modalities == ("audio",) else 1)
        dim = settings["dim"]
        self.event_head = EventHead(dim, settings["num_event_classes"]) if settings["num_event_classes"] > 0 else None
        self.mask_head = MaskHead(dim, settings["mask_upsample"]) if settings["mask_head"] else None
        heads = UnimodalHeads(dim, settings["num_classes"], self.modalities) if settings["unimodal_heads"] else None
        self.unimodal_heads = heads

    @classmethod
    def resolve_settings(cls, overrides: Mapping[str, Any], variant: str | None = None) -> dict[str, Any] | None:
        """The arguments a build gets: the constructor's defaults, then `variant`'s (`VARIANTS`), then `overrides`.

        None for a variant registered elsewhere (a user's entrypoint): its own defaults are not known here.

        Example:
            >>> settings = HunterModule.resolve_settings({"dim": 48}, variant="hunter_tiny")
            >>> settings["dim"], settings["heads"], settings["fusion"]
            (48, 2, 'cross_attention')
        """
        if variant is not None and variant not in VARIANTS:
            return None
        params = inspect.signature(cls).parameters.values()
        defaults = {p.name: p.default for p in params if p.default is not p.empty}
        return {**defaults, **VARIANTS.get(variant or "", {}), **overrides}

    @staticmethod
    def setting_problems(settings: Mapping[str, Any]) -> list[tuple[str, str]]:
        """What the constructor refuses in `settings` (a missing argument takes its default), building nothing.

        ``sss check`` and the start of ``sss fit`` call it (via `resolve_settings`), so a bad model
        value is refused in the constructor's own words before any data is read. The values must
        already have their annotated types (the check of the signature comes first).

        Returns:
            ``(argument, why)`` pairs, in the constructor's order; empty when it would build.

        Example:
            >>> HunterModule.setting_problems({"fusion": "early", "dim": 30})[1]
            ('dim', 'dim=30 must be divisible by heads=4 (model.dim / model.heads)')
        """
        return setting_problems(settings)

    def forward(self, batch: dict[str, Any]) -> dict[str, Tensor]:
        """Encode the modalities present, mark some absent in training, fuse, and run the heads.

        A sample whose ``image_present``/``audio_present`` is False (`sss.data.presence`) is encoded without
        that modality: its encoder never sees the placeholder, and the fusion reads the learned missing
        embedding in its place (`drop_modalities` marks more absent in training). The effective masks are returned
        beside the
        logits, for the losses and metrics of the heads that need the modality.

        Args:
            batch: Holds ``"image"`` ``[B, 3, H, W]`` and/or ``"audio"`` (waveform ``[B, C, S]`` or log-mel),
                and optionally the presence masks.

        Returns:
            ``{"logits": ...}`` plus ``"events"`` and ``"mask"`` where those heads exist and their
            modality is in the batch (see the class docstring for shapes), ``logits_image``/``logits_audio``
            with ``unimodal_heads``, and the masks ``image_present``/``audio_present`` with two modalities.

        Example:
            >>> import torch
            >>> model = HunterModule(image_encoder="test_resnet", dim=8, audio_width=4, heads=2, mask_head=True)
            >>> sorted(model({"audio": torch.randn(2, 1, 8000)}))  # no image: no mask output
            ['logits']
        """
        image, audio = batch.get("image"), batch.get("audio")
        if image is None and audio is None:
            raise ValueError(
                f"{type(self).__name__} needs batch['image'] and/or batch['audio']; batch has {sorted(batch)}"
            )
        image = image if self.image_encoder is not None else None
        audio = audio if self.audio_encoder is not None else None
        if image is None and audio is None:
            raise ValueError(f"{type(self).__name__} was built for {list(self.modalities)}; batch has {sorted(batch)}")
        # The batch's masks, None where every sample has the modality (a device sync each, for a batch with masks:
        # data without absent rows carries none). With None, every path below is that of a batch without masks.
        sizes = {"image": image, "audio": audio}
        present = {name: _absences(batch, name, value) for name, value in sizes.items()}
        image_tokens = encode_present(self.image_encoder, image, present["image"]) if image is not None else None
        audio_tokens = encode_present(self.audio_encoder, audio, present["audio"]) if audio is not None else None
        masks = tuple(self.drop_modalities(present, image, audio).values())
        if image_tokens is not None and audio_tokens is not None:
            image_tokens, audio_tokens = self.fusion_head.fill_missing(image_tokens, audio_tokens, *masks)
        outputs: dict[str, Tensor] = {}
        if self.unimodal_heads is not None:
            outputs |= self.unimodal_heads({"image": image_tokens, "audio": audio_tokens})
        image_tokens, audio_tokens = self.fusion_head.fuse_masked(image_tokens, audio_tokens, *masks)
        outputs = {"logits": self.fusion_head.classify(image_tokens, audio_tokens), **outputs}
        if self.event_head is not None and audio_tokens is not None:
            outputs["events"] = self.event_head(self.audio_encoder.to_frames(audio_tokens))
        if self.mask_head is not None and image_tokens is not None:
            outputs["mask"] = self.mask_head(self.image_encoder.to_grid(image_tokens))
        for name, mask in zip(PRESENT_KEYS, masks, strict=True):
            if mask is not None and image_tokens is not None and audio_tokens is not None:
                outputs[PRESENT_KEYS[name]] = mask
        return outputs

    def drop_modalities(
        self, present: dict[str, Tensor | None], image: Tensor | None, audio: Tensor | None
    ) -> dict[str, Tensor | None]:
        """Modality dropout: the presence masks ``{"image": [B] or None, "audio": ...}`` with some marked absent.

        In training, one uniform draw per sample (`sss.models.missing.drop_present`): with ``{"image": p,
        "audio": q}``, ``u < p`` drops the image and ``p <= u < p + q`` the audio, never the last modality a
        sample has. A dropped modality reads as the learned missing embedding, as one absent from the data
        does; its encoder still sees the real input (no placeholder: BatchNorm statistics stay true, and no
        device sync is needed). The draws come from the torch RNG (``torch.manual_seed`` reproduces them).
        Nothing is dropped in eval mode, with rate 0, or when the batch lacks a modality altogether. None
        means every sample has the modality.

        Example:
            >>> import torch
            >>> model = HunterModule(image_encoder="test_resnet", dim=8, audio_width=4, heads=2,
            ...                      modality_dropout={"image": 0.3, "audio": 0.3})
            >>> ones = torch.ones(1000, 1)
            >>> masks = model.drop_modalities({"image": None, "audio": None}, ones, ones)
            >>> bool((~masks["image"] & ~masks["audio"]).any()), 250 < int((~masks["image"]).sum()) < 350
            (False, True)
        """
        rates = self.modality_dropout
        if not (self.training and image is not None and audio is not None and any(rates.values())):
            return dict(present)
        size, device = image.shape[0], image.device
        full = [presence({}, name, size, device) if present[name] is None else present[name] for name in PRESENT_KEYS]
        image_present, audio_present = drop_present(*full, rates)
        return {"image": image_present, "audio": audio_present}

    def compute_loss(self, outputs: Tensor | dict[str, Tensor], batch: dict[str, Any]) -> Tensor:
        """Weighted sum of the task losses whose targets are in the batch (`task_losses`).

        Args:
            outputs: `forward`'s dict (or bare clip logits).
            batch: The batch with one or more of ``"label"``, ``"labels"``, ``"events"``, ``"mask"``.

        Returns:
            The scalar loss ``sum(loss_weights[key] * loss[key])``.

        Raises:
            KeyError: The batch has no target this model can use.

        Example:
            >>> import torch
            >>> model = HunterModule(num_classes=2, image_encoder="test_resnet", dim=8, audio_width=4, heads=2)
            >>> float(model.compute_loss(torch.zeros(4, 2), {"label": torch.tensor([0, 1, 1, 0])}))  # ln 2
            0.6931...
        """
        losses = self.task_losses(outputs, batch)
        if not losses:
            raise KeyError(
                f"{type(self).__name__}.compute_loss needs batch['label'] (long [B]) or batch['labels'] "
                f"(multi-hot [B, K]), or 'events'/'mask' targets with their heads on; batch has {sorted(batch)}"
            )
        return sum(self.loss_weights[key] * loss for key, loss in losses.items())  # type: ignore[return-value]

    def task_losses(self, outputs: Tensor | dict[str, Tensor], batch: dict[str, Any]) -> dict[str, Tensor]:
        """The unweighted loss of each head whose target is in the batch, by target key.

        - ``"label"`` long ``[B]``: cross entropy (with ``label_smoothing``) on the clip logits;
        - ``"labels"`` multi-hot float ``[B, num_classes]``: binary cross entropy on the clip logits;
        - ``"events"`` float ``[B, T, K]``: BCE of the event logits against the target resampled to
          the head's frame count by adaptive max pooling (`resample_events`);
        - ``"mask"`` float ``[B, 1, H, W]`` in [0, 1]: BCE of the mask logits against the target
          area-pooled to the head's resolution (`resize_mask`).

        A target without its output (no event/mask head, or its modality missing from the batch)
        is skipped: a data module may carry targets a given model does not train on.

        Args:
            outputs: `forward`'s dict (or bare clip logits).
            batch: The batch.

        Returns:
            ``{key: scalar loss}`` for the targets used.

        Raises:
            ValueError: Both ``"label"`` and ``"labels"``, or a target whose shape does not fit its head.

        Example:
            >>> import torch
            >>> model = HunterModule(num_classes=2, image_encoder="test_resnet", dim=8, audio_width=4, heads=2)
            >>> targets = {"labels": torch.ones(2, 2), "mask": torch.ones(2, 1, 8, 8)}  # no mask head: mask unused
            >>> sorted(model.task_losses(torch.zeros(2, 2), targets))
            ['labels']
        """
        outputs = outputs if isinstance(outputs, dict) else {"logits": outputs}
        logits = outputs["logits"]
        losses: dict[str, Tensor] = {}
        if "label" in batch and "labels" in batch:
            raise ValueError("batch has both 'label' (single-label) and 'labels' (multi-label) targets; keep one")
        if "label" in batch:
            losses["label"] = F.cross_entropy(logits, batch["label"], label_smoothing=self.label_smoothing)
        if "labels" in batch:
            target = batch["labels"]
            if target.shape != logits.shape:
                raise ValueError(
                    f"batch['labels'] must be multi-hot [B, {self.num_classes}], got shape {tuple(target.shape)}"
                )
            losses["labels"] = F.binary_cross_entropy_with_logits(logits, target.to(logits.dtype))
        if "events" in batch and "events" in outputs:
            pred = outputs["events"]
            target = resample_events(batch["events"], pred.shape[1])
            if target.shape[-1] != pred.shape[-1]:
                raise ValueError(
                    f"batch['events'] has {target.shape[-1]} classes, the event head {pred.shape[-1]} "
                    "(model.num_event_classes)"
                )
            losses["events"] = dense_loss(pred, target, outputs.get("audio_present"))
        if "mask" in batch and "mask" in outputs:
            pred = outputs["mask"]
            target = resize_mask(batch["mask"], tuple(pred.shape[-2:]))
            losses["mask"] = dense_loss(pred, target, outputs.get("image_present"))
        return losses | head_losses(outputs, batch, self.label_smoothing)

    def validation_outputs(self, outputs: Tensor | dict[str, Tensor], batch: dict[str, Any]) -> dict[str, Tensor]:
        """`LitModule.validation_outputs` (loss, class scores) plus the sound-event and shadow-mask values.

        The event and mask values come from `sss.metrics.task.task_outputs` where the heads' outputs
        and their targets are present; event values need the clip length (`clip_seconds`).

        Args:
            outputs: `forward`'s dict (or bare clip logits).
            batch: The evaluation batch.

        Returns:
            Per-sample values: ``loss``, ``scores``/``preds``/``target`` (or ``labels``), and
            ``event_probs``/``event_target``/``clip_seconds`` and ``mask_counts`` where they apply.

        Example:
            >>> import torch
            >>> model = HunterModule(num_classes=2, image_encoder="test_resnet", dim=8, audio_width=4, heads=2,
            ...                      mask_head=True).eval()
            >>> batch = {"image": torch.randn(2, 3, 64, 64), "audio": torch.randn(2, 1, 8000)}
            >>> batch |= {"label": torch.tensor([0, 1]), "mask": torch.zeros(2, 1, 64, 64)}
            >>> sorted(model.validation_outputs(model(batch), batch))
            ['loss', 'mask_counts', 'preds', 'scores', 'target']
        """
        result = super().validation_outputs(outputs, batch)
        result |= task_outputs(outputs, batch, clip_seconds=self.clip_seconds(batch))
        return result | head_outputs(outputs, result)

    def clip_seconds(self, batch: dict[str, Any]) -> float | None:
        """Length in seconds of the batch's audio clips, which event metrics need; None when unknown.

        Read from ``batch["clip_seconds"]`` when the data provides it, else from the audio and the
        audio encoder's ``frontend`` (its ``sample_rate``, and ``hop_length`` for log-mel features).

        Example:
            >>> import torch
            >>> model = HunterModule(image_encoder="test_resnet", dim=8, audio_width=4, heads=2)
            >>> model.clip_seconds({"audio": torch.zeros(2, 1, 8000)}), model.clip_seconds({"clip_seconds": 10.0})
            (0.5, 10.0)
        """
        if "clip_seconds" in batch:
            return float(torch.as_tensor(batch["clip_seconds"]).flatten()[0])
        frontend = getattr(self.audio_encoder, "frontend", None)
        audio, rate = batch.get("audio"), getattr(frontend, "sample_rate", None)
        if not isinstance(audio, Tensor) or rate is None:
            return None
        if audio.ndim == 4:  # cached log-mel [B, 1, M, T] of centred frames: T = S // hop + 1
            return (audio.shape[-1] - 1) * frontend.hop_length / rate
        return audio.shape[-1] / rate

    def export_settings(self) -> dict[str, Any]:
        """Model arguments an exported ``config.yaml`` needs to rebuild this model without its pretrained weights.

        Each encoder's `TokenEncoder.export_settings` merged into its ``*_kwargs`` (``sss fit`` merges these into
        ``config.model`` after building, as it does the settings that come from the data).

        Example:
            >>> HunterModule(image_encoder="test_resnet", dim=8, audio_width=4, heads=2).export_settings()
            {}
        """
        return parts.export_settings(self._kwargs, self.image_encoder, self.audio_encoder)

    def preprocessing(self) -> dict[str, Any]:
        """Input preparation bound to the weights (`TokenEncoder.preprocessing` of each encoder), for the model folder.

        Example:
            >>> HunterModule(image_encoder="test_resnet", dim=8, audio_width=4, heads=2).preprocessing()
            {}
        """
        return parts.preprocessing(self.image_encoder, self.audio_encoder)

    def set_grad_checkpointing(self, enabled: bool = True, branches: Iterable[str] | None = None) -> None:
        """Turn activation checkpointing on or off per branch: ``image``, ``audio``, ``fusion`` (None = all).

        Where the memory is decides which branch is worth its recompute: on ``hunter_small`` the
        image backbone's activations are half of a step's and the audio CNN's peak is the front-end's
        transient FFT buffers, which no checkpointing removes (``benchmarks/memory.py`` measures it).

        Args:
            enabled: Turn checkpointing on (True) or off (False).
            branches: The branches to change; the others keep their setting.

        Raises:
            ValueError: An unknown branch name.

        Example:
            >>> model = HunterModule(image_encoder="test_resnet", dim=8, audio_width=4, heads=2)
            >>> model.set_grad_checkpointing(True, branches=["image"])
            >>> model.image_encoder.grad_checkpointing, model.audio_encoder.grad_checkpointing
            (True, False)
        """
        parts = {"image": self.image_encoder, "audio": self.audio_encoder, "fusion": self.fusion_head}
        chosen = list(parts) if branches is None else list(branches)
        unknown = sorted(set(chosen) - set(parts))
        if unknown:
            raise ValueError(f"unknown branch(es) {unknown}; choose from image, audio, fusion")
        for name in chosen:
            if parts[name] is not None and hasattr(parts[name], "set_grad_checkpointing"):
                parts[name].set_grad_checkpointing(enabled)


def _absences(batch: dict[str, Any], modality: str, inputs: Tensor | None) -> Tensor | None:
    # The batch's presence mask of `modality`, or None when it has none or every sample has the modality.
    if inputs is None or PRESENT_KEYS[modality] not in batch:
        return None
    mask = presence(batch, modality, inputs.shape[0], inputs.device)
    return None if bool(mask.all()) else mask


def _create(variant: str, overrides: dict[str, Any]) -> HunterModule:
    # Name a misspelt override here rather than let Python's message point into HunterModule.__init__.
    accepted = list(inspect.signature(HunterModule).parameters)
    unknown = [key for key in overrides if key not in accepted]
    if unknown:
        hints = [
            repr(key) + "".join(f" (did you mean {m!r}?)" for m in difflib.get_close_matches(key, accepted, 1))
            for key in unknown
        ]
        raise TypeError(
            f"{variant}() got unknown argument(s) {', '.join(hints)}; HunterModule takes {', '.join(accepted)}"
        )
    return HunterModule(**{**copy.deepcopy(VARIANTS[variant]), **overrides})


# --- variants: defaults only; every argument of HunterModule can be overridden -------------------------------

VARIANTS: dict[str, dict[str, Any]] = {
    "hunter_tiny": {
        "image_encoder": "resnet10t",
        "image_kwargs": {"channels": [8, 16, 32, 64], "stem_width": 8},
        "audio_width": 4,
        "audio_depth": 2,
        "audio_stem_stride": 2,
        "n_mels": 32,
        "image_channels_last": True,
        "dim": 32,
        "heads": 2,
        "mlp_ratio": 2.0,
    },
    "hunter_small": {
        "image_encoder": "resnet10t",
        "image_kwargs": {"channels": [16, 32, 64, 128], "stem_width": 8},
        "image_channels_last": True,
        "dim": 64,
        "audio_width": 8,
        "audio_stem_stride": 2,
        "mlp_ratio": 2.0,
    },
    "hunter_base": {
        "image_encoder": "resnet50",
        "image_checkpointing": "stages",
        "dim": 256,
        "heads": 8,
        "fusion_depth": 2,
        "dropout": 0.1,
        # 64 mels, not AST's 128: the 25 ms / 400-point FFT leaves some of 128 mel filters empty below 8 kHz.
        "audio_encoder": "ast",
        "audio_depth": 4,
        "audio_width": 64,  # for a model.audio_encoder=cnn
    },
}
"""The `HunterModule` arguments each registered variant sets; the constructor's defaults give the rest."""


@register_model
def hunter_tiny(**overrides: Any) -> HunterModule:
    """Test scale: a resnet10t of 8-64 channels, 32-d tokens, a 2-block 4-wide audio CNN over 32 mels."""
    return _create("hunter_tiny", overrides)


@register_model
def hunter_small(**overrides: Any) -> HunterModule:
    """CPU scale: a narrow resnet10t in channels-last, 64-d tokens, a 3-block 8-wide strided audio CNN."""
    return _create("hunter_small", overrides)


@register_model
def hunter_base(**overrides: Any) -> HunterModule:
    """GPU scale: resnet50 image side, 256-d tokens, a 4-block AST over 64 mels, two fusion layers."""
    return _create("hunter_base", overrides)
