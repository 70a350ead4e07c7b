"""`LateFusion`: the baseline every fusion result should be compared with."""

from __future__ import annotations

from torch import Tensor, nn

from sss.models.fusion.base import FusionHead, check_tokens
from sss.models.missing import MissingTokens
from sss.models.registry import register_fusion

__all__ = ["LateFusion"]


@register_fusion("late")
class LateFusion(FusionHead):
    """Pool each modality's tokens, concatenate, classify with a two-layer MLP.

    No token of one modality ever sees the other; the only interaction is in the MLP head.
    A missing modality (None) contributes a zero half, so the head works from either alone.

    The one fusion that works on one modality alone (``needs_both_modalities = False``): data with
    one modality builds it, and `drop_stream` removes the missing stream's norm.

    Args:
        dim: Token width of both encoders.
        num_classes: Number of output logits.
        depth: Ignored (no fusion layers); the constructor shape every fusion shares.
        heads: Ignored.
        mlp_ratio: Ignored (the MLP head's width is `hidden`).
        dropout: Dropout before each linear layer of the head.
        hidden: Hidden width of the MLP head; None means ``dim``.

    Example:
        >>> import torch
        >>> head = LateFusion(dim=16, num_classes=4)
        >>> head(torch.randn(2, 4, 16), torch.randn(2, 7, 16)).shape
        torch.Size([2, 4])
        >>> head(None, torch.randn(2, 7, 16)).shape  # audio only
        torch.Size([2, 4])
    """

    needs_both_modalities = False

    def __init__(
        self,
        dim: int,
        num_classes: int = 4,
        *,
        depth: int = 1,
        heads: int = 4,
        mlp_ratio: float = 4.0,
        dropout: float = 0.0,
        hidden: int | None = None,
    ) -> None:
        super().__init__()
        self.dim = dim
        self.num_classes = num_classes
        self.norms = nn.ModuleList([nn.LayerNorm(dim), nn.LayerNorm(dim)])
        hidden = hidden or dim
        self.head = nn.Sequential(
            nn.Dropout(dropout),
            nn.Linear(2 * dim, hidden),
            nn.GELU(),
            nn.Dropout(dropout),
            nn.Linear(hidden, num_classes),
        )
        for m in self.head:
            if isinstance(m, nn.Linear):
                nn.init.trunc_normal_(m.weight, std=0.02)
                nn.init.zeros_(m.bias)
        self.missing = MissingTokens(dim)

    def drop_stream(self, index: int) -> None:
        """Remove the norm of stream `index` (0 image, 1 audio) and the missing embeddings, for one-modality data.

        Its parameters would never get a gradient (an error in the trainer, and under DDP).

        Example:
            >>> fusion = LateFusion(dim=8)
            >>> fusion.drop_stream(0)
            >>> sum(p.numel() for p in fusion.norms.parameters()), fusion.missing  # the audio norm's weight and bias
            (16, None)
        """
        self.norms[index] = nn.Identity()
        self.missing = None  # one modality: no sample lacks it, and unused embeddings would get no gradient

    def fuse(self, image: Tensor | None, audio: Tensor | None) -> tuple[Tensor | None, Tensor | None]:
        """Late fusion leaves the token streams as they are (checked, then returned unchanged).

        Args:
            image: Image tokens ``[B, Ni, dim]``, or None.
            audio: Audio tokens ``[B, Na, dim]``, or None.

        Returns:
            ``(image, audio)``, the same tensors.

        Example:
            >>> import torch
            >>> audio = torch.randn(2, 3, 8)
            >>> LateFusion(dim=8).fuse(None, audio)[1] is audio
            True
        """
        check_tokens(image, audio, self.dim)
        return image, audio
