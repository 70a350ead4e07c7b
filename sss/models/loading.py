"""`LoadReport`: what a pretrained checkpoint filled in an encoder, one shape for every loader (HF, PANNs)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

__all__ = ["LoadReport"]

_COUNTS = ("missing", "unexpected", "resized", "mismatched", "unused", "new")


@dataclass
class LoadReport:
    """Tensor names a checkpoint loaded into an encoder, and those it did not.

    ``missing``: the encoder's tensors the file lacks; ``unexpected``: the file's tensors the encoder lacks;
    ``resized``: cut to fit (AST's position table for a shorter clip); ``mismatched``: of another shape, not
    loaded; ``unused``: the checkpoint's parts left out on purpose (a classifier head, Whisper's decoder, CLAP's
    text tower, PANNs' AudioSet classifier); ``new``: sss's own tensors no checkpoint has (the projection to
    ``model.dim``). ``sss fit`` prints `summary` at start for every encoder that loaded weights.

    Example:
        >>> LoadReport("audio cnn6", {"file": "w.safetensors"}, ["bn0.weight"], unused=["fc_audioset.bias"]).summary()
        'audio cnn6 from w.safetensors: 1 tensors loaded, 0 missing, 0 unexpected, 1 unused'
    """

    label: str
    """What was loaded, e.g. ``audio hf (wav2vec2)`` or ``audio cnn14``."""
    source: dict[str, Any]
    """Where from: ``file`` (a name, never a path), ``sha256`` and the loader's own keys."""
    loaded: list[str] = field(default_factory=list)
    missing: list[str] = field(default_factory=list)
    unexpected: list[str] = field(default_factory=list)
    resized: list[str] = field(default_factory=list)
    mismatched: list[str] = field(default_factory=list)
    unused: list[str] = field(default_factory=list)
    new: list[str] = field(default_factory=list)

    def summary(self) -> str:
        """One line: the loaded count, then missing and unexpected always, the other counts where not zero.

        Example:
            >>> LoadReport("audio hf (ast)", {"file": "model.safetensors"}, ["a", "b"], resized=["pos"]).summary()
            'audio hf (ast) from model.safetensors: 2 tensors loaded, 0 missing, 0 unexpected, 1 resized'
        """
        counts = [f"{len(getattr(self, k))} {k}" for k in _COUNTS if k in ("missing", "unexpected") or getattr(self, k)]
        return (
            f"{self.label} from {self.source.get('file', '?')}: {len(self.loaded)} tensors loaded, {', '.join(counts)}"
        )
