"""Missing modalities inside the model: learned stand-in tokens, encoding the present samples, modality dropout.

A sample whose batch says ``image_present=False`` (or ``audio_present``; `sss.data.presence`) has a
placeholder input. `encode_present` runs an encoder on the present samples only, so neither its output
nor its BatchNorm statistics see a placeholder; `MissingTokens.fill` then puts a learned "missing"
embedding where the tokens of an absent sample would be. Everything after (every fusion, every head)
reads the embedding, never the placeholder, so the output does not depend on the placeholder's values.
With every sample present both are the identity (the same values, bit for bit), and the embedding
stays in the graph (a zero gradient) so DDP and the first-step gradient check see every parameter used.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor, nn

__all__ = [
    "MissingTokens",
    "UnimodalHeads",
    "dense_loss",
    "drop_present",
    "dropout_rates",
    "encode_present",
    "head_losses",
    "head_outputs",
    "masked_mean",
]


class MissingTokens(nn.Module):
    """One learned ``[1, 1, dim]`` embedding per modality that stands in for the tokens of an absent sample.

    Initialised from a private generator (truncated normal, std 0.02, as the fusions' tokens), so building
    it draws nothing from the global RNG: the other weights of a seeded model are as without it.

    Args:
        dim: Token width.
        modalities: The modalities to hold an embedding for.

    Example:
        >>> missing = MissingTokens(dim=4)
        >>> tokens = torch.ones(2, 3, 4)
        >>> out = missing.fill("audio", tokens, torch.tensor([True, False]))
        >>> bool((out[0] == 1).all()), bool((out[1] == missing.tokens["audio"]).all())
        (True, True)
    """

    def __init__(self, dim: int, modalities: Sequence[str] = ("image", "audio")) -> None:
        super().__init__()
        generator = torch.Generator().manual_seed(0)
        self.tokens = nn.ParameterDict()
        for name in modalities:
            weight = torch.empty(1, 1, dim)
            nn.init.trunc_normal_(weight, std=0.02, generator=generator)
            self.tokens[name] = nn.Parameter(weight)

    def fill(self, modality: str, tokens: Tensor | None, present: Tensor | None) -> Tensor | None:
        """`tokens` ``[B, N, dim]`` with every absent sample's tokens replaced by the modality's embedding.

        `present` None means every sample has the modality: `tokens` then come back with the same values
        (an added ``0 * embedding``, which keeps the embedding in the graph for DDP, with a zero gradient).
        """
        if tokens is None:
            return tokens
        if present is None:
            return tokens + self.tokens[modality].sum().to(tokens.dtype) * 0
        stand_in = self.tokens[modality].to(tokens.dtype).expand_as(tokens)
        return torch.where(present.view(-1, 1, 1), tokens, stand_in)


def encode_present(encoder: nn.Module, inputs: Tensor, present: Tensor | None) -> Tensor:
    """``encoder(inputs)`` computed on the present samples only, scattered back to ``[B, ...]``.

    The rows of absent samples are zeros (`MissingTokens.fill` replaces them). `present` None (every
    sample has the modality: pass None rather than an all-True mask) is ``encoder(inputs)`` itself.
    With no sample present, the encoder still runs on one placeholder row (its output discarded), which
    keeps its parameters in the graph: DDP expects every parameter on every process to get a gradient.
    Selecting the rows (``nonzero``) waits for the device once.

    Example:
        >>> encoder = nn.Linear(2, 3)
        >>> out = encode_present(encoder, torch.ones(3, 2), torch.tensor([True, False, True]))
        >>> out.shape, bool((out[1] == 0).all())
        (torch.Size([3, 3]), True)
    """
    if present is None:
        return encoder(inputs)
    keep = present.nonzero().squeeze(1)
    if keep.numel() == 0:
        # Zeroed here too: the rows are all absent, and the fill must not see a placeholder's tokens.
        one = encoder(inputs[:1])
        return (one * 0).expand(inputs.shape[0], *one.shape[1:])
    tokens = encoder(inputs[keep])
    return tokens.new_zeros((inputs.shape[0], *tokens.shape[1:])).index_copy(0, keep, tokens)


def dropout_rates(value: float | Mapping[str, float] | None) -> dict[str, float]:
    """``model.modality_dropout`` as ``{"image": p, "audio": q}``: a number is the rate of each modality.

    Example:
        >>> dropout_rates(0.2), dropout_rates({"audio": 0.3})
        ({'image': 0.2, 'audio': 0.2}, {'image': 0.0, 'audio': 0.3})
    """
    if value is None:
        return {"image": 0.0, "audio": 0.0}
    if isinstance(value, Mapping):
        return {"image": float(value.get("image", 0.0)), "audio": float(value.get("audio", 0.0))}
    return {"image": float(value), "audio": float(value)}


def drop_present(image: Tensor, audio: Tensor, rates: Mapping[str, float]) -> tuple[Tensor, Tensor]:
    """Modality dropout: mark a sample's image absent with probability p, else its audio with q, never both.

    One uniform draw per sample from the torch RNG: ``u < p`` drops the image, ``p <= u < p + q`` the
    audio. A sample that already lacks one modality keeps the other.

    Example:
        >>> ones = torch.ones(10_000, dtype=torch.bool)
        >>> image, audio = drop_present(ones, ones, {"image": 0.3, "audio": 0.2})
        >>> rates = [round(float((~mask).float().mean()), 1) for mask in (image, audio)]
        >>> bool((~image & ~audio).any()), rates
        (False, [0.3, 0.2])
    """
    p, q = rates["image"], rates["audio"]
    u = torch.rand(image.shape[0], device=image.device)
    drop_image = (u < p) & audio
    drop_audio = (u >= p) & (u < p + q) & image
    return image & ~drop_image, audio & ~drop_audio


def masked_mean(values: Tensor, present: Tensor) -> Tensor:
    """The mean of per-sample `values` ``[B]`` over the present samples (0, still in the graph, when none is).

    Example:
        >>> masked_mean(torch.tensor([1.0, 5.0, 3.0]), torch.tensor([True, False, True]))
        tensor(2.)
    """
    weight = present.to(values.dtype)
    return (values * weight).sum() / weight.sum().clamp(min=1.0)


class UnimodalHeads(nn.Module):
    """A classifier per modality on its encoder's pooled tokens (``model.unimodal_heads``), beside the fused one.

    Each is LayerNorm + Linear over the mean of the modality's tokens before fusion. Their losses
    (weighted by ``loss_weights["image_head"]``/``["audio_head"]``) let unimodal-assistance and boosting
    methods be written as configs or callbacks; their metrics are reported as ``image_head/accuracy``, ...

    Example:
        >>> heads = UnimodalHeads(dim=4, num_classes=3)
        >>> sorted(heads({"image": torch.randn(2, 5, 4), "audio": torch.randn(2, 7, 4)}).items())[0][1].shape
        torch.Size([2, 3])
    """

    def __init__(self, dim: int, num_classes: int, modalities: Sequence[str] = ("image", "audio")) -> None:
        super().__init__()
        self.heads = nn.ModuleDict(
            {name: nn.Sequential(nn.LayerNorm(dim), nn.Linear(dim, num_classes)) for name in modalities}
        )
        generator = torch.Generator().manual_seed(1)  # no draw from the global RNG (see `MissingTokens`)
        for head in self.heads.values():
            nn.init.trunc_normal_(head[1].weight, std=0.02, generator=generator)
            nn.init.zeros_(head[1].bias)

    def forward(self, tokens: Mapping[str, Tensor | None]) -> dict[str, Tensor]:
        """``{"logits_image": [B, K], "logits_audio": [B, K]}`` for the modalities whose tokens are given."""
        found = {name: tokens.get(name) for name in self.heads}
        return {f"logits_{name}": self.heads[name](t.mean(dim=1)) for name, t in found.items() if t is not None}


def head_losses(
    outputs: Mapping[str, Tensor], batch: Mapping[str, Any], label_smoothing: float = 0.0
) -> dict[str, Tensor]:
    """The loss of each unimodal head over the samples that have its modality (``image_head``, ``audio_head``).

    Example:
        >>> out = {"logits_audio": torch.zeros(2, 2), "audio_present": torch.tensor([True, False])}
        >>> head_losses(out, {"label": torch.tensor([0, 1])})  # ln 2, from the first sample only
        {'audio_head': tensor(0.6931)}
    """
    losses = {}
    for name in ("image", "audio"):
        logits = outputs.get(f"logits_{name}")
        if logits is None:
            continue
        present = outputs.get(f"{name}_present")
        present = torch.ones(logits.shape[0], dtype=torch.bool, device=logits.device) if present is None else present
        if "label" in batch:
            each = F.cross_entropy(logits, batch["label"], label_smoothing=label_smoothing, reduction="none")
        elif "labels" in batch:
            target = batch["labels"].to(logits.dtype)
            each = F.binary_cross_entropy_with_logits(logits, target, reduction="none").mean(dim=-1)
        else:
            continue
        losses[f"{name}_head"] = masked_mean(each, present)
    return losses


def dense_loss(pred: Tensor, target: Tensor, present: Tensor | None) -> Tensor:
    """The BCE of a dense head (events, mask) over the samples that have its modality.

    With no mask, or every sample present, it is the plain mean over all elements (the same value, bit
    for bit); otherwise the mean over the present samples' elements (0, in the graph, when none is).

    Example:
        >>> pred, target = torch.zeros(2, 3), torch.tensor([[1.0, 1, 1], [0, 0, 0]])
        >>> round(float(dense_loss(pred, target, torch.tensor([True, False]))), 4)  # ln 2
        0.6931
    """
    target = target.to(pred.dtype)
    if present is None or bool(present.all()):
        return F.binary_cross_entropy_with_logits(pred, target)
    each = F.binary_cross_entropy_with_logits(pred, target, reduction="none").flatten(1).mean(dim=1)
    return masked_mean(each, present)


def head_outputs(outputs: Mapping[str, Tensor], result: Mapping[str, Tensor]) -> dict[str, Tensor]:
    """The evaluation values of the presence masks and unimodal heads, beside `result` (the clip values).

    - ``mask_counts`` of samples without an image, and the event values of samples without audio, are
      left out of the metrics: the counts are zeroed, the events get ``event_present`` (in every batch);
    - each unimodal head gives ``<modality>_head_scores`` ``[B, K]`` and ``<modality>_head_present`` ``[B]``,
      which `sss.metrics.task.task_metrics` scores as ``<modality>_head/<metric>`` over the present samples.

    Example:
        >>> out = {"logits_audio": torch.zeros(2, 3), "audio_present": torch.tensor([True, False])}
        >>> sorted(head_outputs(out, {"scores": torch.zeros(2, 3)}))
        ['audio_head_present', 'audio_head_scores']
    """
    found: dict[str, Tensor] = {}
    image, audio = outputs.get("image_present"), outputs.get("audio_present")
    if image is not None and "mask_counts" in result:
        found["mask_counts"] = result["mask_counts"] * image.view(-1, 1).to(result["mask_counts"].dtype)
    if "event_probs" in result:  # in every batch of a pass, all True without a mask: the gathered keys must agree
        probs = result["event_probs"]
        found["event_present"] = audio if audio is not None else probs.new_ones(probs.shape[0], dtype=torch.bool)
    for name, present in (("image", image), ("audio", audio)):
        logits = outputs.get(f"logits_{name}")
        if logits is not None and "scores" in result:
            size = logits.shape[0]
            found[f"{name}_head_scores"] = logits.float()
            ones = logits.new_ones(size, dtype=torch.bool)
            found[f"{name}_head_present"] = present if present is not None else ones
    return found
