"""`AudioCNN`: a PANNs-style CNN over the log-mel that keeps time as the token axis."""

from __future__ import annotations

import torch
from torch import Tensor, nn
from torch.utils.checkpoint import checkpoint

from sss.models.audio.frontend import LogMelFrontend
from sss.models.base import TokenEncoder
from sss.models.registry import EncoderSettings, register_encoder

__all__ = ["AudioCNN", "ConvBlock", "cnn_encoder"]


class ConvBlock(nn.Module):
    """PANNs' ``ConvBlock``: (3x3 conv - BN - ReLU) x 2, then a 2x2 average pool.

    Args:
        in_channels: Input channels.
        out_channels: Output channels of both convolutions.
        stride: Stride of the first convolution (2 computes the block at half resolution).

    Example:
        >>> import torch
        >>> ConvBlock(1, 8)(torch.randn(2, 1, 32, 101)).shape  # odd lengths round up
        torch.Size([2, 8, 16, 51])
    """

    def __init__(self, in_channels: int, out_channels: int, stride: int = 1) -> None:
        super().__init__()
        self.conv1 = nn.Conv2d(in_channels, out_channels, 3, stride=stride, padding=1, bias=False)
        self.bn1 = nn.BatchNorm2d(out_channels)
        self.conv2 = nn.Conv2d(out_channels, out_channels, 3, padding=1, bias=False)
        self.bn2 = nn.BatchNorm2d(out_channels)
        self.pool = nn.AvgPool2d(2, ceil_mode=True)  # ceil: an odd frame count keeps its last frame
        for conv in (self.conv1, self.conv2):
            nn.init.kaiming_normal_(conv.weight, nonlinearity="relu")

    def forward(self, x: Tensor) -> Tensor:
        """``[B, C_in, F, T]`` to ``[B, C_out, F', T']`` (halved, or quartered with ``stride=2``)."""
        x = torch.relu(self.bn1(self.conv1(x)))
        x = torch.relu(self.bn2(self.conv2(x)))
        return self.pool(x)


class AudioCNN(TokenEncoder):
    """Waveform to time tokens: log-mel front-end, PANNs conv blocks, frequency pooling, projection.

    Block ``i`` has ``width * 2**i`` channels and halves both the mel and the time axis (CNN6/CNN10
    style). After the last block the frequency axis is averaged away and each remaining time step
    becomes one token, so ``N = ceil(T / 2**depth)`` (``T / 2**(depth + 1)`` with ``stem_stride=2``).

    Args:
        dim: Token width after the projection.
        width: Channels of the first block (doubled in each next block).
        depth: Number of conv blocks.
        stem_stride: Stride of the very first convolution. 2 computes the first, full-resolution
            block at a quarter of the cost, which dominates the CNN's run time on CPU.
        frontend: Module mapping the batch's ``"audio"`` to a log-mel ``[B, 1, M, T]``; None builds a
            default `LogMelFrontend`. Pass ``nn.Identity()`` when the batch already holds normalised features.

    Example:
        >>> import torch
        >>> cnn = AudioCNN(dim=32, width=8, depth=3)
        >>> cnn(torch.randn(2, 1, 16000)).shape  # 101 frames -> ceil(101 / 8) = 13 tokens
        torch.Size([2, 13, 32])
    """

    def __init__(
        self,
        dim: int = 128,
        *,
        width: int = 32,
        depth: int = 3,
        stem_stride: int = 1,
        frontend: nn.Module | None = None,
    ) -> None:
        super().__init__(output_dim=dim)
        if depth < 1:
            raise ValueError(f"AudioCNN needs depth >= 1, got {depth}")
        self.frontend = frontend if frontend is not None else LogMelFrontend()
        channels = [width * 2**i for i in range(depth)]
        self.blocks = nn.ModuleList(
            ConvBlock(c_in, c_out, stride=stem_stride if i == 0 else 1)
            for i, (c_in, c_out) in enumerate(zip([1, *channels[:-1]], channels, strict=True))
        )
        self.proj = nn.Linear(channels[-1], dim)
        nn.init.xavier_uniform_(self.proj.weight)
        nn.init.zeros_(self.proj.bias)

    def encode(self, x: Tensor) -> Tensor:
        """Waveform ``[B, S]`` / ``[B, C, S]`` (or what the front-end takes) to tokens ``[B, N, dim]``.

        Args:
            x: The batch's ``"audio"``.

        Returns:
            One token per remaining time step, in time order.

        Example:
            >>> import torch
            >>> AudioCNN(dim=16, width=4, depth=2).encode(torch.randn(2, 8000)).shape  # 51 frames -> 13 tokens
            torch.Size([2, 13, 16])
        """
        x = self.frontend(x)
        for block in self.blocks:
            if self.grad_checkpointing and torch.is_grad_enabled():
                x = checkpoint(block, x, use_reentrant=False)
            else:
                x = block(x)
        return self.proj(x.mean(dim=2).transpose(1, 2))  # [B, C, F, T] -> [B, T, C] -> [B, T, dim]


@register_encoder("audio", "cnn")
def cnn_encoder(settings: EncoderSettings) -> AudioCNN:
    """``model.audio_encoder=cnn``: an `AudioCNN` of ``width``, ``depth`` and ``stem_stride`` over ``frontend``.

    Example:
        >>> cnn_encoder(EncoderSettings(dim=8, width=4, depth=1)).output_dim
        8
    """
    shape = {"width": settings.width, "depth": settings.depth, "stem_stride": settings.stem_stride}
    return AudioCNN(settings.dim, frontend=settings.frontend, **shape, **settings.kwargs)
