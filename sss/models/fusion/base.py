"""The `FusionHead` base class every fusion subclasses, and what the fusions share: token checks, pooling."""

from __future__ import annotations

from typing import ClassVar

import torch
from torch import Tensor, nn

from sss.models.missing import MissingTokens


def check_tokens(image: Tensor | None, audio: Tensor | None, dim: int) -> int:
    """Validate the token streams a fusion head receives; returns the batch size."""
    present = [(name, t) for name, t in (("image", image), ("audio", audio)) if t is not None]
    if not present:
        raise ValueError("fusion needs at least one modality, got neither image nor audio tokens (is the batch empty?)")
    for name, tokens in present:
        if tokens.ndim != 3 or tokens.shape[-1] != dim:
            raise ValueError(f"{name} tokens must be [B, N, {dim}], got {tuple(tokens.shape)}")
    # Compared directly, not through a set: under torch.export (ONNX export) a batch size is a
    # symbolic int, which cannot be hashed.
    if image is not None and audio is not None and image.shape[0] != audio.shape[0]:
        raise ValueError(f"image and audio tokens have different batch sizes: {image.shape[0]} vs {audio.shape[0]}")
    return present[0][1].shape[0]


def pool_streams(image: Tensor | None, audio: Tensor | None, norms: nn.ModuleList) -> Tensor:
    """Mean-pool each stream, LayerNorm it, and concatenate ``[image | audio]`` into ``[B, 2D]``.

    Each stream has its own norm, so a missing stream contributes exact zeros (not a norm's bias)
    and the present stream's half looks the same as in a full batch.
    """
    ref = image if image is not None else audio
    assert ref is not None  # check_tokens ran first
    halves = [
        norm(tokens.mean(dim=1)) if tokens is not None else ref.new_zeros(ref.shape[0], ref.shape[-1])
        for norm, tokens in zip(norms, (image, audio), strict=True)
    ]
    return torch.cat(halves, dim=-1)


class FusionHead(nn.Module):
    """Base of the fusion heads: ``forward(image, audio) = classify(*fuse(image, audio))``.

    A subclass sets ``dim``, ``norms`` (one LayerNorm per stream), ``head`` and defines `fuse`; the
    default `classify` pools each stream, normalises, concatenates and applies ``head_drop`` then
    ``head``. Frame- and pixel-level heads read `fuse`'s streams, clip heads `classify`'s logits.
    A new fusion is one module: a subclass with the shared constructor shape, registered with
    `sss.models.registry.register_fusion` (docs/models.md, "A fusion of your own").
    """

    head_drop: nn.Module = nn.Identity()
    grad_checkpointing: bool = False
    needs_both_modalities: ClassVar[bool] = True
    """False for a fusion that also works on one modality's tokens: data with one modality may use it,
    and `drop_stream` then removes the parameters of the stream it never gets."""

    def build_head(self, dim: int, num_classes: int, dropout: float) -> None:
        """Per-stream LayerNorms, dropout and the Linear head over ``[image | audio]``; then init every Linear.

        Called last in a subclass's ``__init__``: its layers are built first, which fixes the order
        in which the seed is consumed (and so the initial weights).
        """
        self.dim, self.num_classes = dim, num_classes
        self.norms = nn.ModuleList([nn.LayerNorm(dim), nn.LayerNorm(dim)])
        self.head_drop = nn.Dropout(dropout)
        self.head = nn.Linear(2 * dim, num_classes)
        self.apply(init_linear)
        self.missing = MissingTokens(dim)  # from its own generator: the weights above are as before it existed

    def fill_missing(
        self, image: Tensor | None, audio: Tensor | None, image_present: Tensor | None, audio_present: Tensor | None
    ) -> tuple[Tensor | None, Tensor | None]:
        """Replace the tokens of absent samples (a False in ``*_present`` ``[B]``) by the learned missing embedding.

        Every fusion layer and head then reads the embedding, never the placeholder the data put there,
        so the output does not depend on the placeholder's values. No mask (None) means all present.

        Example:
            >>> import torch
            >>> from sss.models.fusion.late import LateFusion
            >>> fusion = LateFusion(dim=8)
            >>> image, audio = torch.randn(2, 4, 8), torch.randn(2, 5, 8)
            >>> a = fusion(image, audio, audio_present=torch.tensor([True, False]))
            >>> b = fusion(image, audio * 100, audio_present=torch.tensor([True, False]))
            >>> bool(torch.equal(a[1], b[1]))  # the absent audio's values do not matter
            True
        """
        # Not a class attribute: nn.Module keeps submodules in _modules, which a class default would shadow.
        missing: MissingTokens | None = getattr(self, "missing", None)
        if missing is None:
            for name, present in (("image", image_present), ("audio", audio_present)):
                if present is not None and not bool(present.all()):
                    raise ValueError(
                        f"{type(self).__name__} has no missing-modality embeddings and a sample has no {name}: "
                        "call self.build_head(...) in its __init__, or set self.missing = MissingTokens(dim)"
                    )
            return image, audio
        return missing.fill("image", image, image_present), missing.fill("audio", audio, audio_present)

    def fuse(self, image: Tensor | None, audio: Tensor | None) -> tuple[Tensor | None, Tensor | None]:
        """The token streams after fusion (same shapes; a None stream stays None)."""
        raise NotImplementedError(f"{type(self).__name__} must implement fuse(image, audio)")

    def drop_stream(self, index: int) -> None:
        """Remove the parameters of stream `index` (0 image, 1 audio), for data that never has that stream.

        Only a fusion with ``needs_both_modalities = False`` is asked to; it defines this.
        """
        raise NotImplementedError(f"{type(self).__name__} fuses two modalities and cannot drop stream {index}")

    def forward(
        self,
        image: Tensor | None,
        audio: Tensor | None,
        image_present: Tensor | None = None,
        audio_present: Tensor | None = None,
    ) -> Tensor:
        """Logits ``[B, num_classes]`` from image tokens ``[B, Ni, dim]`` and/or audio tokens ``[B, Na, dim]``.

        Args:
            image: Image tokens, or None when the batch has no image.
            audio: Audio tokens, or None when the batch has no audio.
            image_present: Bool ``[B]``, False for a sample without an image (`fill_missing`); None: all present.
            audio_present: The same for audio.

        Returns:
            Class logits.
        """
        image, audio = self.fill_missing(image, audio, image_present, audio_present)
        return self.classify(*self.fuse_masked(image, audio, image_present, audio_present))

    def fuse_masked(
        self, image: Tensor | None, audio: Tensor | None, image_present: Tensor | None, audio_present: Tensor | None
    ) -> tuple[Tensor | None, Tensor | None]:
        """`fuse` told which samples lack a modality (tokens already filled); a fusion that mixes per-sample
        state across streams (the bottleneck's average) overrides it to leave the absent stream out."""
        return self.fuse(image, audio)

    def classify(self, image: Tensor | None, audio: Tensor | None) -> Tensor:
        """Clip logits ``[B, num_classes]`` from (fused) token streams: pool, normalise, concatenate, head.

        Args:
            image: Image tokens, or None.
            audio: Audio tokens, or None.

        Returns:
            Class logits.
        """
        return self.head(self.head_drop(pool_streams(image, audio, self.norms)))

    def set_grad_checkpointing(self, enabled: bool = True) -> None:
        """Recompute each fusion layer's activations in backward instead of storing them.

        Args:
            enabled: Turn checkpointing on (True) or off (False).
        """
        self.grad_checkpointing = enabled


def init_linear(module: nn.Module) -> None:
    """Init for ``module.apply``: small truncated-normal Linear weights (ViT) keep residual streams near identity."""
    if isinstance(module, nn.Linear):
        nn.init.trunc_normal_(module.weight, std=0.02)
        if module.bias is not None:
            nn.init.zeros_(module.bias)
