"""Audio-visual contrastive pretraining: both encoders of a Hunter variant learn from the pairing alone.

`ContrastiveModule` builds the image and audio encoders exactly as the `HunterModule` variant it names
(same names, shapes and initial weights), pools each encoder's tokens, projects them with a small MLP per
modality and trains with the symmetric InfoNCE loss of CLIP / Look, Listen and Learn: in a batch of N
pairs, each audio clip must pick its own image among the N images and each image its own clip, at a
learnable temperature. No label is read. ``sss fit ... model.init_from=RUN`` then loads the encoders into
a supervised model of the same variant (`sss.run.init_from`).

Negatives are the pairs of the whole step: with several processes, the embeddings are gathered from
every process *with their gradients* (`gather_with_grad`), so 2 processes with batches of b compute the
loss (and the gradients) of 1 process with a batch of 2b. Under gradient accumulation the negatives
are those of each micro-batch (the loss is the mean of the micro-batches' InfoNCE, as Accelerate's
accumulation averages any loss): a micro-batch of 16 on 4 processes contrasts 64 pairs, whatever the
accumulation. A larger effective batch of negatives needs a larger micro-batch (or more processes).
"""

from __future__ import annotations

import difflib
import inspect
import math
from collections.abc import Mapping
from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from sss.config.constraints import PositiveFloat, PositiveInt
from sss.data.presence import PRESENT_KEYS
from sss.models import _hunter_parts as parts
from sss.models.hunter import VARIANTS, HunterModule
from sss.models.registry import build_encoder, register_model
from sss.trainer.module import LitModule

__all__ = [
    "ENCODER_SETTINGS",
    "ContrastiveModule",
    "contrastive_base",
    "contrastive_small",
    "contrastive_tiny",
    "gather_with_grad",
    "info_nce",
]

ENCODER_SETTINGS = (
    *("dim", "image_encoder", "image_pretrained", "image_strict", "image_channels_last", "image_checkpointing"),
    *("image_kwargs", "audio_encoder", "audio_width", "audio_depth", "audio_stem_stride", "audio_kwargs"),
    *("audio_pretrained", "audio_strict", "n_mels", "sample_rate", "freq_mask", "time_mask", "heads"),
    *("mlp_ratio", "dropout", "modalities"),
)
"""The `HunterModule` arguments that shape its encoders: the ones `ContrastiveModule` takes besides its own."""

MAX_LOGIT_SCALE = 100.0
"""The largest inverse temperature (CLIP's clamp): beyond it the loss rewards sharpening over learning."""


class ContrastiveModule(LitModule):
    """The encoders of a Hunter variant with projection heads, trained by symmetric InfoNCE on image-audio pairs.

    ``forward`` returns pooled features and unit-norm embeddings; `compute_loss` is the InfoNCE over every pair
    of the step (gathered across processes). Evaluation reports the InfoNCE over the whole split, audio-to-image
    and image-to-audio retrieval R@1/5/10 and, when the split has labels, a linear probe on the frozen pooled
    features (`sss.metrics.retrieval`). Samples without one of the modalities (`sss.data.presence`) pair with
    nothing: they are left out of the loss and the metrics.

    Args:
        variant: The registered Hunter variant whose encoders are built (``hunter_tiny``, ``hunter_small``,
            ``hunter_base``): fine-tune with the same one (``model.init_from``).
        proj_dim: Width of the shared embedding space.
        temperature: Initial temperature of the softmax over pairs (CLIP's 0.07).
        learn_temperature: Learn the temperature (as CLIP, clamped to at least 1/100); False keeps it fixed.
        num_classes: The classes of a labelled split, for the linear probe (``sss fit`` sets it from the data).
        **encoder_settings: `HunterModule` arguments that shape the encoders (`ENCODER_SETTINGS`: ``dim``,
            ``image_encoder``, ``audio_width``, ...); the fine-tuned model must be given the same ones.

    Raises:
        ValueError: An unknown variant or argument, a bad encoder setting, or one modality only.

    Example:
        >>> import torch
        >>> model = ContrastiveModule("hunter_tiny", proj_dim=8, image_encoder="test_resnet")
        >>> batch = {"image": torch.randn(4, 3, 32, 32), "audio": torch.randn(4, 1, 4000)}
        >>> out = model(batch)
        >>> tuple(out["image_embedding"].shape), tuple(out["audio_features"].shape)
        ((4, 8), (4, 32))
        >>> bool(model.compute_loss(out, batch) > 0)
        True
    """

    ablation = False  # the final evaluation has no single-modality pass: retrieval needs both sides

    def __init__(
        self,
        variant: str = "hunter_small",
        proj_dim: PositiveInt = 128,
        temperature: PositiveFloat = 0.07,
        learn_temperature: bool = True,
        num_classes: PositiveInt | None = None,
        **encoder_settings: Any,
    ) -> None:
        super().__init__()
        settings = self.resolve_settings(encoder_settings, variant)
        problems = self.setting_problems(settings)
        if problems:
            raise ValueError(problems[0][1])
        self.variant, self.num_classes = variant, num_classes
        self._kwargs = {key: settings[key] for key in ("image_kwargs", "audio_kwargs")}
        # The Hunter variant's build order and seeded draws: the same seed gives the supervised model's initial
        # encoder weights, so a pretraining run and a fine-tuning run start from comparable points.
        self.image_encoder = build_encoder("image", "timm", parts.image_settings(settings))
        self.audio_encoder = build_encoder("audio", settings["audio_encoder"], parts.audio_settings(settings))
        self.fusion_head = None
        dim = settings["dim"]
        self.image_projection = _projection(dim, proj_dim)
        self.audio_projection = _projection(dim, proj_dim)
        scale = torch.tensor(math.log(1.0 / temperature))
        self.logit_scale = nn.Parameter(scale) if learn_temperature else nn.Buffer(scale)

    @classmethod
    def resolve_settings(cls, overrides: Mapping[str, Any], variant: str | None = None) -> dict[str, Any]:
        """The Hunter variant's settings (`HunterModule.resolve_settings`) with `overrides` over them.

        ``sss check`` reads it with the ``model.name`` of a ``create_model`` spec (``contrastive_small``), or
        with no variant for a ``ContrastiveModule`` spec (its ``variant`` argument, else ``hunter_small``).

        Example:
            >>> ContrastiveModule.resolve_settings({"dim": 48}, "contrastive_tiny")["heads"]
            2
        """
        own = dict(overrides)
        hunter = _hunter_variant(variant, own)
        defaults = HunterModule.resolve_settings({}, hunter if hunter in VARIANTS else None) or {}
        return {**{k: v for k, v in defaults.items() if k in ENCODER_SETTINGS}, **own, "variant": hunter}

    @staticmethod
    def setting_problems(settings: Mapping[str, Any]) -> list[tuple[str, str]]:
        """What the constructor refuses in `settings`, building nothing: `HunterModule`'s checks of the encoders.

        Example:
            >>> ContrastiveModule.setting_problems({"fusion": "late"})[0][1]  # doctest: +ELLIPSIS
            "fusion='late' is no encoder setting; ContrastiveModule trains encoders (it shapes ...)"
        """
        problems: list[tuple[str, str]] = []
        own = set(inspect.signature(ContrastiveModule).parameters) - {"encoder_settings"}
        hunter = set(inspect.signature(HunterModule).parameters)
        for key in settings:
            if key in own or key in ENCODER_SETTINGS:
                continue
            if key in hunter:
                why = "it shapes the supervised model's fusion or heads: give it when fine-tuning"
                problems.append(
                    (key, f"{key}={settings[key]!r} is no encoder setting; ContrastiveModule trains encoders ({why})")
                )
            else:
                close = difflib.get_close_matches(key, [*own, *ENCODER_SETTINGS], 1)
                hint = f" (did you mean {close[0]!r}?)" if close else ""
                problems.append((key, f"unknown argument {key!r} of ContrastiveModule{hint}"))
        variant = settings.get("variant", "hunter_small")
        if variant not in VARIANTS:
            problems.append(
                ("variant", f"variant={variant!r} is no Hunter variant; choose one of {', '.join(VARIANTS)}")
            )
        if sorted(settings.get("modalities", ("image", "audio"))) != ["audio", "image"]:
            why = "contrastive pretraining pairs each image with its audio: give data with both modalities"
            problems.append(("modalities", f"modalities={list(settings['modalities'])}: {why}"))
        hunter_settings = {k: v for k, v in settings.items() if k in hunter}
        checked = HunterModule.setting_problems(hunter_settings)  # its one-modality rule is the one above
        return problems + [p for p in checked if p[0] not in ("modalities", "fusion")]

    def forward(self, batch: dict[str, Any]) -> dict[str, Tensor]:
        """Pooled features (``image_features``/``audio_features`` ``[N, dim]``) and unit-norm embeddings of each pair.

        In training only the samples with both modalities are encoded (the presence masks of
        `sss.data.presence`). In evaluation every sample is, and ``paired`` marks those with both where some
        lack one: an evaluation gathers one row per sample from every process, and a process whose last
        sample lacks a modality would otherwise send none. ``logit_scale`` is the clamped inverse temperature.
        """
        image, audio = batch[self.modality_keys["image"]], batch[self.modality_keys["audio"]]
        both = _both_present(batch, image.shape[0], image.device)  # a device sync, only where a modality is absent
        if both is not None and self.training:
            image, audio = image[both], audio[both]
        image_features = self.image_encoder(image).mean(dim=1)
        audio_features = self.audio_encoder(audio).mean(dim=1)
        return {
            "image_features": image_features,
            "audio_features": audio_features,
            "image_embedding": F.normalize(self.image_projection(image_features).float(), dim=-1),
            "audio_embedding": F.normalize(self.audio_projection(audio_features).float(), dim=-1),
            "logit_scale": self.logit_scale.clamp(max=math.log(MAX_LOGIT_SCALE)).exp().float(),
        } | ({"paired": both} if both is not None and not self.training else {})

    def compute_loss(self, outputs: dict[str, Tensor], batch: dict[str, Any]) -> Tensor:
        """Symmetric InfoNCE over every pair of the step: this process's and the other processes' (with gradients)."""
        image, audio = outputs["image_embedding"], outputs["audio_embedding"]
        if "paired" in outputs:  # evaluation: every sample was encoded; the pairs are the rows to contrast
            image, audio = image[outputs["paired"]], audio[outputs["paired"]]
        return info_nce(gather_with_grad(image), gather_with_grad(audio), outputs["logit_scale"])

    def validation_outputs(self, outputs: dict[str, Tensor], batch: dict[str, Any]) -> dict[str, Tensor]:
        """Per-sample embeddings and pooled features, ``paired`` (both modalities present) and a labelled split's
        class target (for the probe).

        One row per sample, paired or not: the trainer gathers the rows of every process, which must hold as
        many (a process whose last sample lacks a modality would otherwise send none); `compute_metrics`
        keeps the pairs.
        """
        kept = ("image_features", "audio_features", "image_embedding", "audio_embedding")
        result = {key: outputs[key].detach().float() for key in kept}
        size, device = result["image_features"].shape[0], result["image_features"].device
        result["paired"] = outputs.get("paired", torch.ones(size, dtype=torch.bool, device=device))
        for key in ("label", "labels"):
            if isinstance(batch.get(key), Tensor):
                result[key] = batch[key]
        return result

    def compute_metrics(self, outputs: dict[str, Tensor], classes: Any = None) -> dict[str, float]:
        """InfoNCE over the whole split (``loss``), retrieval R@1/5/10 both ways, and the linear probe when labelled.

        Example:
            >>> import torch
            >>> model = ContrastiveModule("hunter_tiny", proj_dim=4, image_encoder="test_resnet")
            >>> e = torch.eye(4)
            >>> out = {"image_embedding": e, "audio_embedding": e, "image_features": e, "audio_features": e}
            >>> metrics = model.compute_metrics(out)
            >>> metrics["retrieval/audio_to_image_r1"], metrics["retrieval/image_to_audio_r1"]
            (1.0, 1.0)
        """
        from sss.metrics.retrieval import linear_probe, retrieval_metrics

        paired = outputs.get("paired")
        if paired is not None:  # the samples without a pair are left out of every metric
            outputs = {key: value[paired] for key, value in outputs.items() if key != "paired"}
        image, audio = outputs["image_embedding"], outputs["audio_embedding"]
        if image.shape[0] == 0:
            return {}
        scale = self.logit_scale.detach().clamp(max=math.log(MAX_LOGIT_SCALE)).exp().float().to(image.device)
        metrics = {"loss": float(info_nce(image, audio, scale, chunk=1024))} | retrieval_metrics(image, audio)
        target = outputs.get("label", outputs.get("labels"))  # class indices, or multi-hot (the probe's mAP)
        if target is not None:
            features = torch.cat([outputs["image_features"], outputs["audio_features"]], dim=1)
            metrics |= linear_probe(features, target, num_classes=self.num_classes)
        return metrics

    def export_settings(self) -> dict[str, Any]:
        """Model arguments a model folder needs to rebuild this model without its pretrained weights."""
        return parts.export_settings(self._kwargs, self.image_encoder, self.audio_encoder)

    def preprocessing(self) -> dict[str, Any]:
        """Input preparation bound to the encoders' weights (a pretrained image encoder's mean and std)."""
        return parts.preprocessing(self.image_encoder, self.audio_encoder)


def info_nce(image: Tensor, audio: Tensor, scale: Tensor | float, chunk: int | None = None) -> Tensor:
    """The symmetric InfoNCE of N pairs: the mean of the audio-to-image and image-to-audio cross-entropies.

    Row i of `image` and of `audio` is a pair; every other row is a negative. The logits are
    ``scale * image @ audio.T`` (unit-norm embeddings: cosine similarities) in float32. With `chunk`, the
    N x N logits are never held at once (rows of ``chunk`` at a time): the same value to rounding, for a
    whole evaluation split; without gradients then.

    Example:
        >>> e = torch.eye(3)
        >>> round(float(info_nce(e, e, 1.0)), 4)  # log(e + 2) - 1: each pair's logit 1, the others 0
        0.5514
        >>> round(float(info_nce(e, e, 1.0, chunk=2)), 4)
        0.5514
    """
    image, audio = image.float(), audio.float()
    scale = torch.as_tensor(scale, dtype=torch.float32, device=image.device)
    if image.shape[0] == 0:  # no pair on any process: zero, still a function of the embeddings (for DDP)
        return (image.sum() + audio.sum()) * 0.0
    if chunk is None:
        logits = scale * image @ audio.T
        targets = torch.arange(image.shape[0], device=image.device)
        return (F.cross_entropy(logits, targets) + F.cross_entropy(logits.T, targets)) / 2
    with torch.no_grad():
        return (_chunked_ce(image, audio, scale, chunk) + _chunked_ce(audio, image, scale, chunk)) / 2


def _chunked_ce(queries: Tensor, keys: Tensor, scale: Tensor, chunk: int) -> Tensor:
    total = torch.zeros((), dtype=torch.float64, device=queries.device)
    for start in range(0, queries.shape[0], chunk):
        logits = scale * queries[start : start + chunk] @ keys.T
        own = logits.diagonal(offset=start) if start == 0 else logits[:, start : start + chunk].diagonal()
        total += (logits.logsumexp(dim=1) - own).double().sum()
    return (total / queries.shape[0]).float()


def gather_with_grad(x: Tensor) -> Tensor:
    """`x` ``[n, ...]`` of every process, concatenated in rank order, with gradients flowing back to each process.

    Sizes may differ between processes (a last batch, samples without a pair): each pads to the largest and the
    padding is cut after the gather. One process (or no process group): `x` itself. Because every process then
    computes the same loss over all the rows, the gather's backward sums each process's gradient from all of
    them and DDP's averaging divides by the process count: the gradient is that of one process over all rows.

    Example:
        >>> gather_with_grad(torch.ones(2, 3)).shape  # no process group: unchanged
        torch.Size([2, 3])
    """
    import torch.distributed as dist

    if not (dist.is_available() and dist.is_initialized()) or dist.get_world_size() == 1:
        return x
    from torch.distributed.nn.functional import all_gather

    size = torch.tensor([x.shape[0]], device=x.device)
    sizes = [torch.zeros_like(size) for _ in range(dist.get_world_size())]
    dist.all_gather(sizes, size)
    counts = [int(s) for s in sizes]  # one host sync per step: the rows each process holds
    padded = F.pad(x, (0, 0) * (x.ndim - 1) + (0, max(counts) - x.shape[0]))
    return torch.cat([part[:count] for part, count in zip(all_gather(padded), counts, strict=True)])


def _projection(dim: int, out: int) -> nn.Module:
    # SimCLR's lesson: a non-linear head in front of the loss keeps the pooled features (what fine-tuning and the
    # linear probe use) more general than the contrastive space itself.
    return nn.Sequential(nn.Linear(dim, dim), nn.GELU(), nn.Linear(dim, out))


def _both_present(batch: dict[str, Any], size: int, device: torch.device) -> Tensor | None:
    flags = [batch[key] for key in PRESENT_KEYS.values() if isinstance(batch.get(key), Tensor)]
    if not flags:
        return None
    both = torch.ones(size, dtype=torch.bool, device=device)
    for flag in flags:
        both &= flag.to(device=device, dtype=torch.bool)
    return None if bool(both.all()) else both


def _hunter_variant(variant: str | None, own: dict[str, Any]) -> str:
    # `create_model("contrastive_small")` names the entrypoint; a plain `ContrastiveModule` spec its argument.
    given = own.pop("variant", None)
    if variant is not None and variant.startswith("contrastive_"):
        return "hunter_" + variant.removeprefix("contrastive_")
    return given or variant or "hunter_small"


def _create(hunter: str, overrides: dict[str, Any]) -> ContrastiveModule:
    if "variant" in overrides:
        raise TypeError(f"contrastive_{hunter.removeprefix('hunter_')}() builds {hunter}'s encoders: drop variant")
    return ContrastiveModule(hunter, **overrides)


@register_model
def contrastive_tiny(**overrides: Any) -> ContrastiveModule:
    """`ContrastiveModule` with ``hunter_tiny``'s encoders (fine-tune with ``model.name=hunter_tiny``)."""
    return _create("hunter_tiny", overrides)


@register_model
def contrastive_small(**overrides: Any) -> ContrastiveModule:
    """`ContrastiveModule` with ``hunter_small``'s encoders (``examples/manifest.yaml``'s model)."""
    return _create("hunter_small", overrides)


@register_model
def contrastive_base(**overrides: Any) -> ContrastiveModule:
    """`ContrastiveModule` with ``hunter_base``'s encoders."""
    return _create("hunter_base", overrides)
