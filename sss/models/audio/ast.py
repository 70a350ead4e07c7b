"""`AudioSpectrogramTransformer`: an AST-style ViT over log-mel patches, trained from scratch."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from timm.models.vision_transformer import Block
from torch import Tensor, nn
from torch.utils.checkpoint import checkpoint

from sss.models.audio.frontend import LogMelFrontend
from sss.models.base import TokenEncoder
from sss.models.registry import EncoderSettings, register_encoder

__all__ = ["AudioSpectrogramTransformer", "ast_encoder"]


class AudioSpectrogramTransformer(TokenEncoder):
    """Log-mel front-end, patch embedding over (frequency x time), pre-norm transformer blocks.

    As in AST (Gong et al., 2021) the log-mel ``[B, 1, M, T]`` is cut into
    ``patch_size`` patches (``patch_stride`` < ``patch_size`` overlaps them, AST uses 16x16 at
    stride 10), each linearly embedded; timm's ViT ``Block`` (pre-norm attention + MLP) follows.
    Differences from AST, and why:

    - No CLS token: the fusion pools the tokens itself, and a frame-level head needs the patches.
    - Factorised position embeddings (one per frequency row + one per time column, as PaSST), so a
      clip of any length works: longer than ``max_frames`` interpolates the time table linearly,
      shorter uses its first columns.
    - The time axis is zero-padded (zero = the bin mean after the front-end's normalisation) to
      cover every frame, and up to one patch for very short clips.

    Tokens are frequency-major: token ``f * T' + t`` is frequency row ``f``, time column ``t``;
    `to_frames` averages the rows to one token per time column.

    Args:
        dim: Token width after the output projection (none if ``width == dim``).
        width: Transformer width; None means ``dim``.
        depth: Transformer blocks.
        heads: Attention heads; must divide ``width``.
        patch_size: ``(frequency, time)`` patch size in mel bins and frames.
        patch_stride: ``(frequency, time)`` patch stride; None means ``patch_size`` (no overlap).
        mlp_ratio: MLP hidden width as a multiple of ``width``.
        dropout: Dropout on attention weights and after each residual branch.
        drop_path: Stochastic depth rate of the last block (linearly increasing from 0).
        max_frames: Frames the time position table is sized for (1024 = AST's 10.24 s).
        frontend: Module mapping the batch's ``"audio"`` to a log-mel ``[B, 1, M, T]``; None builds a
            default `LogMelFrontend`. Its ``n_mels`` fixes the number of frequency rows.

    Raises:
        ValueError: ``heads`` does not divide ``width``, or the patch is taller than the mel axis.

    Example:
        >>> import torch
        >>> ast = AudioSpectrogramTransformer(dim=32, depth=2, heads=4, frontend=LogMelFrontend(n_mels=32))
        >>> tokens = ast(torch.randn(2, 1, 16000))  # 101 frames: 2 frequency rows x 7 time columns
        >>> tokens.shape, ast.to_frames(tokens).shape
        (torch.Size([2, 14, 32]), torch.Size([2, 7, 32]))
    """

    def __init__(
        self,
        dim: int = 128,
        *,
        width: int | None = None,
        depth: int = 4,
        heads: int = 4,
        patch_size: tuple[int, int] | list[int] = (16, 16),
        patch_stride: tuple[int, int] | list[int] | None = None,
        mlp_ratio: float = 4.0,
        dropout: float = 0.0,
        drop_path: float = 0.0,
        max_frames: int = 1024,
        frontend: nn.Module | None = None,
    ) -> None:
        super().__init__(output_dim=dim)
        width = width or dim
        if width % heads:
            raise ValueError(f"AudioSpectrogramTransformer: width={width} must be divisible by heads={heads}")
        if depth < 1:
            raise ValueError(f"AudioSpectrogramTransformer needs depth >= 1, got {depth}")
        self.frontend = frontend if frontend is not None else LogMelFrontend()
        n_mels = int(getattr(self.frontend, "n_mels", 64))
        self.patch_size = (int(patch_size[0]), int(patch_size[1]))
        self.patch_stride = (int(patch_stride[0]), int(patch_stride[1])) if patch_stride else self.patch_size
        if self.patch_size[0] > n_mels:
            raise ValueError(f"patch height {self.patch_size[0]} is more than the front-end's n_mels={n_mels}")
        self.freq_rows = (n_mels - self.patch_size[0]) // self.patch_stride[0] + 1
        self.patch_embed = nn.Conv2d(1, width, self.patch_size, stride=self.patch_stride)
        time_cols = max(1, (max_frames - self.patch_size[1]) // self.patch_stride[1] + 1)
        self.freq_pos = nn.Parameter(torch.zeros(1, width, self.freq_rows, 1))
        self.time_pos = nn.Parameter(torch.zeros(1, width, 1, time_cols))
        rates = [drop_path * i / max(depth - 1, 1) for i in range(depth)]
        self.blocks = nn.ModuleList(
            Block(width, heads, mlp_ratio, qkv_bias=True, proj_drop=dropout, attn_drop=dropout, drop_path=rate)
            for rate in rates
        )
        self.norm = nn.LayerNorm(width)
        self.proj: nn.Module = nn.Linear(width, dim) if width != dim else nn.Identity()
        nn.init.trunc_normal_(self.freq_pos, std=0.02)
        nn.init.trunc_normal_(self.time_pos, std=0.02)
        self.apply(_init_weights)

    def encode(self, x: Tensor) -> Tensor:
        """Waveform ``[B, S]`` / ``[B, C, S]`` (or a log-mel ``[B, 1, M, T]``) to tokens ``[B, F' * T', dim]``.

        Args:
            x: The batch's ``"audio"``.

        Returns:
            Patch tokens, frequency-major.

        Example:
            >>> import torch
            >>> ast = AudioSpectrogramTransformer(dim=16, depth=1, heads=2, frontend=LogMelFrontend(n_mels=32))
            >>> ast.encode(torch.randn(1, 4000)).shape  # 26 frames padded to 32: 2 x 2 patches
            torch.Size([1, 4, 16])
        """
        mel = self.frontend(x)
        mel = F.pad(mel, (0, self._time_padding(mel.shape[-1])))
        patches = self.patch_embed(mel)  # [B, W, F', T']
        patches = patches + self.freq_pos + self._time_table(patches.shape[-1])
        tokens = patches.flatten(2).transpose(1, 2)
        for block in self.blocks:
            if self.grad_checkpointing and torch.is_grad_enabled():
                tokens = checkpoint(block, tokens, use_reentrant=False)
            else:
                tokens = block(tokens)
        return self.proj(self.norm(tokens))

    def to_frames(self, tokens: Tensor) -> Tensor:
        """Average the frequency rows: ``[B, F' * T', D]`` to one token per time column ``[B, T', D]``.

        Args:
            tokens: Tokens in `encode`'s layout (a fusion keeps it).

        Returns:
            ``[B, T', D]`` in time order.

        Example:
            >>> import torch
            >>> ast = AudioSpectrogramTransformer(dim=8, depth=1, heads=2, frontend=LogMelFrontend(n_mels=32))
            >>> ast.to_frames(torch.randn(3, 10, 8)).shape  # 2 rows x 5 columns
            torch.Size([3, 5, 8])
        """
        if tokens.shape[1] % self.freq_rows:
            raise ValueError(f"{tokens.shape[1]} tokens do not tile {self.freq_rows} frequency rows")
        return tokens.unflatten(1, (self.freq_rows, -1)).mean(dim=1)

    def _time_padding(self, frames: int) -> int:
        size, stride = self.patch_size[1], self.patch_stride[1]
        if frames <= size:
            return size - frames
        return -(frames - size) % stride  # the last patch ends on the last frame

    def _time_table(self, cols: int) -> Tensor:
        table = self.time_pos
        if cols > table.shape[-1]:
            # Longer than the table was sized for: stretch it (ViT position-embedding resizing).
            return F.interpolate(table, size=(1, cols), mode="bilinear", align_corners=False)
        return table[..., :cols]


def _init_weights(module: nn.Module) -> None:
    # ViT-style init: small truncated-normal weights keep the residual stream near identity.
    if isinstance(module, nn.Linear):
        nn.init.trunc_normal_(module.weight, std=0.02)
        if module.bias is not None:
            nn.init.zeros_(module.bias)
    elif isinstance(module, nn.Conv2d):
        # The patch embedding is a linear map of the flattened patch (as timm's ViT initialises it).
        nn.init.xavier_uniform_(module.weight.view(module.weight.shape[0], -1))
        if module.bias is not None:
            nn.init.zeros_(module.bias)


@register_encoder("audio", "ast")
def ast_encoder(settings: EncoderSettings) -> AudioSpectrogramTransformer:
    """``model.audio_encoder=ast``: an `AudioSpectrogramTransformer` of width ``dim`` over ``frontend``.

    Its ``depth``, ``heads``, ``mlp_ratio`` and ``dropout`` come from the settings (``width`` is a
    CNN's), and ``kwargs`` may override any of them.

    Example:
        >>> ast_encoder(EncoderSettings(dim=8, depth=1, heads=2)).output_dim
        8
    """
    shared = {"depth": settings.depth, "heads": settings.heads, "mlp_ratio": settings.mlp_ratio}
    shared["dropout"] = settings.dropout
    return AudioSpectrogramTransformer(settings.dim, frontend=settings.frontend, **{**shared, **settings.kwargs})
