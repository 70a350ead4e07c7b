"""The one interface every encoder shares: ``encode(x) -> tokens [B, N, D]``.

Image and audio encoders both subclass `TokenEncoder`, so a fusion head only ever sees token
sequences of width ``output_dim`` and never needs to know which modality they came from.
"""

from __future__ import annotations

from typing import Any

from torch import Tensor, nn

__all__ = ["TokenEncoder"]


class TokenEncoder(nn.Module):
    """Base class of the modality encoders: one input tensor in, a token sequence out.

    Subclasses implement `encode`; ``forward`` is `encode`, so ``encoder(x)`` and
    ``encoder.encode(x)`` are the same call (as ``LitModule.forward`` uses the former).

    Attributes:
        output_dim: Width ``D`` of the tokens `encode` returns.
        grad_checkpointing: Whether the encoder recomputes activations in backward to save memory.

    Example:
        >>> import torch
        >>> class MeanTokens(TokenEncoder):
        ...     def __init__(self):
        ...         super().__init__(output_dim=3)
        ...     def encode(self, x):
        ...         return x.flatten(2).transpose(1, 2)  # [B, C, H, W] -> [B, H*W, C]
        >>> MeanTokens()(torch.zeros(2, 3, 4, 4)).shape
        torch.Size([2, 16, 3])
    """

    output_dim: int
    grad_checkpointing: bool

    def __init__(self, output_dim: int) -> None:
        super().__init__()
        self.output_dim = output_dim
        self.grad_checkpointing = False

    def encode(self, x: Tensor) -> Tensor:
        """Map one modality's input batch to tokens ``[B, N, output_dim]``.

        Args:
            x: The modality's batch tensor (e.g. image ``[B, 3, H, W]``, waveform ``[B, C, S]``).

        Returns:
            Tokens ``[B, N, output_dim]``; ``N`` may depend on the input size.

        Example:
            >>> import torch
            >>> TokenEncoder(output_dim=4).encode(torch.zeros(1, 3))
            Traceback (most recent call last):
            ...
            NotImplementedError: TokenEncoder must implement encode(x) -> tokens [B, N, D]
        """
        raise NotImplementedError(f"{type(self).__name__} must implement encode(x) -> tokens [B, N, D]")

    def forward(self, x: Tensor) -> Tensor:
        """Same as `encode`, so ``encoder(x)`` works where a module call is expected.

        Args:
            x: The modality's batch tensor.

        Returns:
            Tokens ``[B, N, output_dim]``.
        """
        return self.encode(x)

    def set_grad_checkpointing(self, enabled: bool = True) -> None:
        """Trade compute for memory: recompute activations during backward instead of storing them.

        Args:
            enabled: Turn checkpointing on (True) or off (False).

        Example:
            >>> encoder = TokenEncoder(output_dim=4)
            >>> encoder.set_grad_checkpointing(True)
            >>> encoder.grad_checkpointing
            True
        """
        self.grad_checkpointing = enabled

    def export_settings(self) -> dict[str, Any]:
        """Encoder arguments (``model.image_kwargs`` / ``model.audio_kwargs``) an exported config must hold to rebuild
        this encoder without its pretrained weights file (e.g. a Hugging Face model's architecture config).

        A model folder drops every pretrained-weight setting (its weights are in ``model.safetensors``), so
        an encoder whose shape came from those weights records the shape here. Default: nothing.

        Example:
            >>> TokenEncoder(output_dim=4).export_settings()
            {}
        """
        return {}

    def preprocessing(self) -> dict[str, Any]:
        """How inputs must be prepared for the weights this encoder holds (e.g. ``image_mean``/``image_std``,
        ``sample_rate``), recorded in a model folder's ``preprocessing.json``. Default: nothing bound.

        Example:
            >>> TokenEncoder(output_dim=4).preprocessing()
            {}
        """
        return {}

    def to_frames(self, tokens: Tensor) -> Tensor:
        """Tokens (as `encode` returned them, possibly updated by a fusion) to one vector per time step.

        A frame-level head (sound-event detection) reads these. The default is the identity, for
        encoders whose tokens already are a time sequence (`AudioCNN`); an encoder whose tokens tile
        time x frequency (`AudioSpectrogramTransformer`) averages the frequency axis away.

        Args:
            tokens: ``[B, N, output_dim]``.

        Returns:
            ``[B, T, output_dim]`` in time order.

        Example:
            >>> import torch
            >>> TokenEncoder(output_dim=4).to_frames(torch.zeros(2, 7, 4)).shape
            torch.Size([2, 7, 4])
        """
        return tokens
