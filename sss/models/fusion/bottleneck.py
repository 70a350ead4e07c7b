"""`BottleneckFusion`: MBT-style attention bottlenecks (Nagrani et al., NeurIPS 2021)."""

from __future__ import annotations

import torch
from timm.models.vision_transformer import Block
from torch import Tensor, nn
from torch.utils.checkpoint import checkpoint

from sss.models.fusion.base import FusionHead, check_tokens
from sss.models.registry import register_fusion

__all__ = ["BottleneckFusion", "BottleneckLayer"]


class BottleneckLayer(nn.Module):
    """One fused layer: each stream self-attends over ``[own tokens + bottleneck]``; bottlenecks are averaged.

    Each modality has its own transformer block (timm's pre-norm ViT ``Block``), as in MBT. All
    cross-modal information passes through the ``B`` shared bottleneck tokens: a stream's block
    updates its own copy of them, and the copies of the streams present are averaged. A missing
    stream (None) is skipped and does not take part in the average.

    Args:
        dim: Token width.
        heads: Attention heads; must divide ``dim``.
        mlp_ratio: MLP hidden width as a multiple of ``dim``.
        dropout: Dropout on attention weights and after each residual branch.
        streams: Number of token streams (modalities), each with its own block.

    Example:
        >>> import torch
        >>> layer = BottleneckLayer(dim=8, heads=2)
        >>> image, audio, shared = layer(torch.randn(2, 4, 8), torch.randn(2, 9, 8), torch.randn(2, 3, 8))
        >>> image.shape, audio.shape, shared.shape
        (torch.Size([2, 4, 8]), torch.Size([2, 9, 8]), torch.Size([2, 3, 8]))
    """

    def __init__(
        self, dim: int, heads: int = 4, mlp_ratio: float = 4.0, dropout: float = 0.0, streams: int = 2
    ) -> None:
        super().__init__()
        if dim % heads:
            raise ValueError(f"dim={dim} must be divisible by heads={heads}")
        self.blocks = nn.ModuleList(
            Block(dim, heads, mlp_ratio, qkv_bias=True, proj_drop=dropout, attn_drop=dropout) for _ in range(streams)
        )

    def forward(
        self, *args: Tensor | None, present: tuple[Tensor | None, ...] | None = None
    ) -> tuple[Tensor | None, ...]:
        """``(stream_1, ..., stream_n, bottleneck)`` in, the same out, each updated (None stays None).

        `present` holds a bool ``[B]`` mask (or None: all present) per stream: a sample's bottleneck is then
        the average over the streams it has, so an absent modality's stand-in tokens never reach the others.
        """
        *streams, bottleneck = args
        assert bottleneck is not None
        out: list[Tensor | None] = []
        copies = []
        for block, tokens in zip(self.blocks, streams, strict=True):
            if tokens is None:
                out.append(None)
                continue
            joint = block(torch.cat([tokens, bottleneck], dim=1))
            out.append(joint[:, : tokens.shape[1]])
            copies.append(joint[:, tokens.shape[1] :])
        if present is not None and len(copies) == 2:
            copies = _present_copies(copies, present)
        return (*out, torch.stack(copies).mean(dim=0))


def _present_copies(copies: list[Tensor], present: tuple[Tensor | None, ...]) -> list[Tensor]:
    # Where a sample lacks one stream, both copies become the other stream's: their mean is then that copy,
    # exactly. With every sample present the copies come back unchanged, bit for bit.
    first, second = copies
    mask_first, mask_second = (None if m is None else m.view(-1, 1, 1) for m in present)
    return [
        first if mask_first is None else torch.where(mask_first, first, second),
        second if mask_second is None else torch.where(mask_second, second, first),
    ]


@register_fusion("bottleneck")
class BottleneckFusion(FusionHead):
    """MBT attention-bottleneck fusion, then mean pooling of each stream and a linear head.

    ``num_bottlenecks`` learned tokens are shared by the modalities; in each of ``depth`` layers
    each modality self-attends over its own tokens plus the bottleneck (cost
    ``O((Ni + B)^2 + (Na + B)^2)`` per layer instead of cross-attention's ``O(Ni * Na)``, and the
    modalities can only exchange what fits through ``B`` tokens), and the updated bottleneck copies
    are averaged. Pooling and head are those of `CrossModalFusion`, so the two compare fairly.
    Unlike cross-attention, a lone modality still runs the layers (it attends over itself and the
    bottleneck): MBT's fusion layers are also the modalities' own transformer layers.

    In MBT a stream reads the other modality only from the second fused layer on (through the
    bottleneck averaged after the first); MBT fuses the last 4 of 12 layers. Here the fusion sits on
    top of the encoders, so the final averaged bottleneck's mean is also added to every token of
    each stream after the last layer: the heads then see both modalities even with ``depth=1``.

    Args:
        dim: Token width of both encoders.
        num_classes: Number of output logits.
        depth: Number of fused layers.
        heads: Attention heads; must divide ``dim``.
        mlp_ratio: MLP hidden width as a multiple of ``dim``.
        dropout: Attention, residual and head dropout.
        num_bottlenecks: Shared bottleneck tokens ``B`` (MBT's released config uses 4).

    Example:
        >>> import torch
        >>> fusion = BottleneckFusion(dim=16, heads=2, num_classes=3)
        >>> fusion(torch.randn(2, 4, 16), torch.randn(2, 9, 16)).shape
        torch.Size([2, 3])
        >>> fusion(None, torch.randn(2, 9, 16)).shape  # audio only
        torch.Size([2, 3])
    """

    def __init__(
        self,
        dim: int,
        num_classes: int = 4,
        *,
        depth: int = 1,
        heads: int = 4,
        mlp_ratio: float = 4.0,
        dropout: float = 0.0,
        num_bottlenecks: int = 4,
    ) -> None:
        super().__init__()
        if num_bottlenecks < 1:
            raise ValueError(f"BottleneckFusion needs num_bottlenecks >= 1, got {num_bottlenecks}")
        self.grad_checkpointing = False
        self.bottleneck = nn.Parameter(torch.zeros(1, num_bottlenecks, dim))
        self.layers = nn.ModuleList(BottleneckLayer(dim, heads, mlp_ratio, dropout) for _ in range(depth))
        self.build_head(dim, num_classes, dropout)
        nn.init.trunc_normal_(self.bottleneck, std=0.02)

    def fuse(self, image: Tensor | None, audio: Tensor | None) -> tuple[Tensor | None, Tensor | None]:
        """The token streams after the bottleneck layers (same shapes; a None stream stays None).

        Args:
            image: Image tokens ``[B, Ni, dim]``, or None.
            audio: Audio tokens ``[B, Na, dim]``, or None.

        Returns:
            ``(image, audio)`` updated.

        Example:
            >>> import torch
            >>> image, audio = BottleneckFusion(dim=8, heads=2).fuse(torch.randn(2, 4, 8), torch.randn(2, 5, 8))
            >>> image.shape, audio.shape
            (torch.Size([2, 4, 8]), torch.Size([2, 5, 8]))
        """
        return self.fuse_masked(image, audio, None, None)

    def fuse_masked(
        self, image: Tensor | None, audio: Tensor | None, image_present: Tensor | None, audio_present: Tensor | None
    ) -> tuple[Tensor | None, Tensor | None]:
        """`fuse`, where each sample's bottleneck averages only the streams it has (`BottleneckLayer`)."""
        batch = check_tokens(image, audio, self.dim)
        present = None if image_present is None and audio_present is None else (image_present, audio_present)
        # A copy, not an expand() view: under no_grad a view of a parameter claims requires_grad without
        # a grad_fn, which module-level autograd hooks (FlopCounterMode's ModuleTracker) reject.
        shared = self.bottleneck.repeat(batch, 1, 1)
        for layer in self.layers:
            if self.grad_checkpointing and torch.is_grad_enabled():
                image, audio, shared = checkpoint(layer, image, audio, shared, present=present, use_reentrant=False)
            else:
                image, audio, shared = layer(image, audio, shared, present=present)
        # A stream reads the other modality only through the bottleneck of the *previous* layer, so
        # the last average would reach no head (and one layer would be late fusion in disguise):
        # broadcast its mean back to every token of each stream, a parameter-free residual read-out.
        summary = shared.mean(dim=1, keepdim=True)
        return (image + summary if image is not None else None), (audio + summary if audio is not None else None)
