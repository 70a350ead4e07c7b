"""`CrossModalFusion`: bidirectional cross-modal attention between image and audio tokens."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor, nn
from torch.utils.checkpoint import checkpoint

from sss.models.fusion.base import FusionHead, check_tokens
from sss.models.registry import register_fusion

__all__ = ["CrossAttentionBlock", "CrossModalFusion", "CrossModalLayer"]


class CrossAttentionBlock(nn.Module):
    """Pre-norm block: ``x += Attn(LN(x), LN(context))``; ``x += MLP(LN(x))``.

    Queries come from ``x``, keys and values from ``context`` (the other modality).

    Args:
        dim: Token width of both streams.
        heads: Attention heads; must divide ``dim``.
        mlp_ratio: MLP hidden width as a multiple of ``dim``.
        dropout: Dropout on the attention weights and after each residual branch.

    Example:
        >>> import torch
        >>> block = CrossAttentionBlock(dim=8, heads=2)
        >>> block(torch.randn(2, 4, 8), torch.randn(2, 9, 8)).shape  # 4 queries read 9 context tokens
        torch.Size([2, 4, 8])
    """

    def __init__(self, dim: int, heads: int = 4, mlp_ratio: float = 4.0, dropout: float = 0.0) -> None:
        super().__init__()
        if dim % heads:
            raise ValueError(f"dim={dim} must be divisible by heads={heads}")
        self.heads = heads
        self.dropout = dropout
        self.norm_q = nn.LayerNorm(dim)
        self.norm_kv = nn.LayerNorm(dim)
        self.q = nn.Linear(dim, dim)
        self.kv = nn.Linear(dim, 2 * dim)
        self.out = nn.Linear(dim, dim)
        self.norm_mlp = nn.LayerNorm(dim)
        hidden = int(dim * mlp_ratio)
        self.mlp = nn.Sequential(nn.Linear(dim, hidden), nn.GELU(), nn.Linear(hidden, dim))
        self.drop = nn.Dropout(dropout)

    def forward(self, x: Tensor, context: Tensor) -> Tensor:
        """Update ``x`` ``[B, N, D]`` with what it reads from ``context`` ``[B, M, D]``."""
        b, n, d = x.shape
        q = self.q(self.norm_q(x)).view(b, n, self.heads, -1).transpose(1, 2)
        k, v = self.kv(self.norm_kv(context)).view(b, context.shape[1], 2, self.heads, -1).permute(2, 0, 3, 1, 4)
        attn = F.scaled_dot_product_attention(q, k, v, dropout_p=self.dropout if self.training else 0.0)
        x = x + self.drop(self.out(attn.transpose(1, 2).reshape(b, n, d)))
        return x + self.drop(self.mlp(self.norm_mlp(x)))


class CrossModalLayer(nn.Module):
    """One bidirectional step: image reads audio and audio reads image, both from the same inputs.

    Args:
        dim: Token width of both streams.
        heads: Attention heads.
        mlp_ratio: MLP hidden width as a multiple of ``dim``.
        dropout: Dropout of both blocks.

    Example:
        >>> import torch
        >>> image, audio = CrossModalLayer(dim=8, heads=2)(torch.randn(2, 4, 8), torch.randn(2, 9, 8))
        >>> image.shape, audio.shape
        (torch.Size([2, 4, 8]), torch.Size([2, 9, 8]))
    """

    def __init__(self, dim: int, heads: int = 4, mlp_ratio: float = 4.0, dropout: float = 0.0) -> None:
        super().__init__()
        self.image_block = CrossAttentionBlock(dim, heads, mlp_ratio, dropout)
        self.audio_block = CrossAttentionBlock(dim, heads, mlp_ratio, dropout)

    def forward(self, image: Tensor, audio: Tensor) -> tuple[Tensor, Tensor]:
        """Return the updated ``(image, audio)`` token streams."""
        # Both directions read the *input* streams, so the result does not depend on an order.
        return self.image_block(image, audio), self.audio_block(audio, image)


@register_fusion("cross_attention")
class CrossModalFusion(FusionHead):
    """Bidirectional cross-modal attention, then mean pooling of each stream and a linear head.

    ``depth`` layers each let image tokens attend to audio tokens and audio tokens attend to image
    tokens (two pre-norm blocks with MLPs; cost ``O(Ni * Na)`` per layer). Each stream
    is then averaged over its tokens and LayerNormed; the two vectors are concatenated and a Linear
    gives the logits. When one modality is None the cross-attention is skipped (there is nothing to
    attend to) and its half of the pooled vector is zeros, so the head still works from the other.

    Args:
        dim: Token width of both encoders.
        num_classes: Number of output logits.
        depth: Number of bidirectional layers.
        heads: Attention heads; must divide ``dim``.
        mlp_ratio: MLP hidden width as a multiple of ``dim``.
        dropout: Attention, residual and head dropout.

    Example:
        >>> import torch
        >>> fusion = CrossModalFusion(dim=16, heads=2, num_classes=3)
        >>> fusion(torch.randn(2, 4, 16), torch.randn(2, 9, 16)).shape
        torch.Size([2, 3])
        >>> fusion(torch.randn(2, 4, 16), None).shape  # image only
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
    ) -> None:
        super().__init__()
        self.grad_checkpointing = False
        self.layers = nn.ModuleList(CrossModalLayer(dim, heads, mlp_ratio, dropout) for _ in range(depth))
        self.build_head(dim, num_classes, dropout)

    def fuse(self, image: Tensor | None, audio: Tensor | None) -> tuple[Tensor | None, Tensor | None]:
        """The token streams after the cross-attention layers (same shapes; a None stream stays None).

        Frame- and pixel-level heads read these, so they see what the other modality contributed.

        Args:
            image: Image tokens ``[B, Ni, dim]``, or None.
            audio: Audio tokens ``[B, Na, dim]``, or None.

        Returns:
            ``(image, audio)`` updated.

        Example:
            >>> import torch
            >>> image, audio = CrossModalFusion(dim=8, heads=2).fuse(torch.randn(2, 4, 8), None)
            >>> image.shape, audio
            (torch.Size([2, 4, 8]), None)
        """
        check_tokens(image, audio, self.dim)
        if image is not None and audio is not None:
            for layer in self.layers:
                if self.grad_checkpointing and torch.is_grad_enabled():
                    image, audio = checkpoint(layer, image, audio, use_reentrant=False)
                else:
                    image, audio = layer(image, audio)
        return image, audio
